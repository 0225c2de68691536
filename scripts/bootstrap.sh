#!/usr/bin/env bash
# Creates .venv and installs llmtrio into it, building llama-cpp-python from source.
#
# llama-cpp-python is always built here, never taken from a prebuilt or cached native wheel:
# a default (-DGGML_NATIVE=ON) build enables AMX on CPUs that advertise it, and dies with SIGILL
# on VMs that do not allow it, and a wheel built for one CPU can fault on another. The flags
# below (chosen from this CPU's features, AMX always off) are used unless CMAKE_ARGS is set:
#
#   CMAKE_ARGS="-DGGML_NATIVE=ON" ./scripts/test      # a machine that may use its own CPU's features
#
# The wheel built is kept in ~/.cache/llmtrio/wheels/<version>-<hash of CMAKE_ARGS>/, so the
# ~8 minute build runs once per flag set; other flags (another CPU) never reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON_VERSION=0.3.36
# Portable flags (scripts/cmake-args.sh): no -march=native, never AMX (a VM may advertise AMX
# and still fault on it), and each AVX-512 extension only where this CPU reports it.
PORTABLE_CMAKE_ARGS="$(scripts/cmake-args.sh)"
export CMAKE_ARGS="${CMAKE_ARGS:-$PORTABLE_CMAKE_ARGS}"
PYTHON="${PYTHON:-python3}"
extras="${1:-}"

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
fi

key=$(printf '%s|%s' "$LLAMA_CPP_PYTHON_VERSION" "$CMAKE_ARGS" | sha256sum | cut -c1-16)
wheels="${LLMTRIO_WHEEL_CACHE:-$HOME/.cache/llmtrio/wheels}/$LLAMA_CPP_PYTHON_VERSION-$key"
if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION from source (about 8 minutes)" >&2
    echo "CMAKE_ARGS=$CMAKE_ARGS" >&2
    rm -rf "$wheels.tmp" && mkdir -p "$wheels.tmp"
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" .venv/bin/python -m pip wheel -q --no-deps \
        --no-cache-dir --no-binary llama-cpp-python -w "$wheels.tmp" \
        "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    rm -rf "$wheels" && mv "$wheels.tmp" "$wheels"
fi
if [ "$(cat .venv/.llama-build-key 2>/dev/null)" != "$key" ]; then
    .venv/bin/python -m pip install -q --force-reinstall --no-deps "$(ls "$wheels"/llama_cpp_python-*.whl | head -n 1)"
    echo "$key" > .venv/.llama-build-key
fi
.venv/bin/python -m pip install -q -e ".${extras}"
