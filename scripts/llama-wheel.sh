#!/usr/bin/env bash
# Prints the path of a llama-cpp-python wheel built with $CMAKE_ARGS, building it from source
# first (about 8 minutes on 2 cores) unless the cache has one for exactly these flags:
# ${LLMTRIO_WHEEL_CACHE:-~/.cache/llmtrio/wheels}/<version>-<hash of version and CMAKE_ARGS>/.
# Used by scripts/bootstrap.sh (this CPU's flags) and scripts/image-build.sh (an image's).
#
#   CMAKE_ARGS="$(scripts/cmake-args.sh)" scripts/llama-wheel.sh .venv/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON_VERSION=0.3.36
PYTHON="${1:?usage: CMAKE_ARGS=... $0 PYTHON}"
: "${CMAKE_ARGS:?set CMAKE_ARGS: scripts/cmake-args.sh prints the flags for this CPU}"
export CMAKE_ARGS

key=$(printf '%s|%s' "$LLAMA_CPP_PYTHON_VERSION" "$CMAKE_ARGS" | sha256sum | cut -c1-16)
wheels="${LLMTRIO_WHEEL_CACHE:-$HOME/.cache/llmtrio/wheels}/$LLAMA_CPP_PYTHON_VERSION-$key"
if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION from source (about 8 minutes)" >&2
    echo "CMAKE_ARGS=$CMAKE_ARGS" >&2
    rm -rf "$wheels.tmp" && mkdir -p "$wheels.tmp"
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" "$PYTHON" -m pip wheel -q \
        --no-deps --no-cache-dir --no-binary llama-cpp-python -w "$wheels.tmp" \
        "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2
    rm -rf "$wheels" && mv "$wheels.tmp" "$wheels"
fi
ls "$wheels"/llama_cpp_python-*.whl | head -n 1
