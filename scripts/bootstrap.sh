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

wheel="$(scripts/llama-wheel.sh .venv/bin/python)"  # built once per flag set, then cached
key="$(basename "$(dirname "$wheel")")"
key="${key#*-}"  # the hash of the version and the flags
if [ "$(cat .venv/.llama-build-key 2>/dev/null)" != "$key" ]; then
    .venv/bin/python -m pip install -q --force-reinstall --no-deps "$wheel"
    echo "$key" > .venv/.llama-build-key
fi
.venv/bin/python -m pip install -q -e ".${extras}"
