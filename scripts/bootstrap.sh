#!/usr/bin/env bash
# Creates .venv and installs llmtrio into it, building llama-cpp-python from source.
#
# llama-cpp-python is always built here, never taken from a prebuilt or cached native wheel:
# a default (-DGGML_NATIVE=ON) build enables AMX on CPUs that advertise it, and dies with SIGILL
# on VMs that do not allow it. The portable flags below are used unless CMAKE_ARGS is set:
#
#   CMAKE_ARGS="-DGGML_NATIVE=ON" ./scripts/test      # a machine that may use its own CPU's features
#
# The wheel built is kept in ~/.cache/llmtrio/wheels/<version>-<hash of CMAKE_ARGS>/, so the
# ~8 minute build runs once per flag set; other flags never reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON_VERSION=0.3.36
PORTABLE_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
-DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
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
    mkdir -p "$wheels.tmp"
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" .venv/bin/python -m pip wheel -q --no-deps \
        --no-cache-dir --no-binary llama-cpp-python -w "$wheels.tmp" \
        "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    rm -rf "$wheels" && mv "$wheels.tmp" "$wheels"
fi
.venv/bin/python -m pip install -q --no-index --find-links "$wheels" \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" --no-deps
.venv/bin/python -m pip install -q "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" \
    --find-links "$wheels" --no-index 2>/dev/null || true
.venv/bin/python -m pip install -q -e ".${extras}"
