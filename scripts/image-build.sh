#!/usr/bin/env bash
# The container image's build steps (deploy/Containerfile runs them; so does CI, through
# tests/deploy/test_image.py, so the steps are tested on machines with no container engine):
#
#   scripts/image-build.sh wheels SRC OUT      # build stage: every wheel llmtrio needs, in OUT
#   scripts/image-build.sh install OUT PREFIX  # runtime stage: a venv at PREFIX from OUT alone
#
# BACKEND=cpu (the default) or cuda chooses llama.cpp's build:
# - cpu: the x86-64-v3 baseline (scripts/cmake-args.sh --baseline: AVX2, FMA, F16C; no
#   AVX-512, no AMX), never the build host's CPU: an image built on an AVX-512 host must not die
#   with SIGILL on an AVX2 node. (llama.cpp's runtime CPU variants, GGML_CPU_ALL_VARIANTS with
#   GGML_BACKEND_DL, would pick the best per node, but llama-cpp-python 0.3.36 does not load
#   dynamic backends: it has no binding for ggml_backend_load_all, and a model then finds no
#   backend at all.)
# - cuda: the same CPU baseline plus GGML_CUDA for CUDA_ARCHITECTURES (default: Ampere to
#   Hopper, 80;86;89;90); every layer goes to the GPU (llama.cpp's default, n_gpu_layers -1).
#
# The wheels step needs a compiler (and nvcc for cuda); the install step needs none, and no
# network: pip installs from OUT only.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python3}"
BACKEND="${BACKEND:-cpu}"

flags() {
    local args
    args="$("$here/cmake-args.sh" --baseline)"
    case "$BACKEND" in
        cpu) ;;
        cuda) args+=" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES:-80;86;89;90}" ;;
        *) echo "BACKEND is cpu or cuda, not $BACKEND" >&2; exit 2 ;;
    esac
    printf '%s\n' "$args"
}

wheels() {
    local src="$1" out="$2" build
    mkdir -p "$out"
    build="$(mktemp -d)"
    trap 'rm -rf "$build"' RETURN
    "$PYTHON" -m venv "$build/venv"
    "$build/venv/bin/python" -m pip install -q --upgrade pip
    local wheel
    wheel="$(CMAKE_ARGS="$(flags)" "$here/llama-wheel.sh" "$build/venv/bin/python")"
    cp "$wheel" "$out/"
    # llmtrio and every dependency as wheels; llama-cpp-python is the one just built.
    "$build/venv/bin/python" -m pip wheel -q --find-links "$out" -w "$out" "$src"
    echo "wheels for BACKEND=$BACKEND in $out:" >&2
    ls "$out" >&2
}

install() {
    local out="$1" prefix="$2"
    "$PYTHON" -m venv "$prefix"
    "$prefix/bin/python" -m pip install -q --no-index --find-links "$out" llmtrio
    "$prefix/bin/llmtrio" --help >/dev/null
    "$prefix/bin/python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
}

case "${1:-}" in
    flags) flags ;;
    wheels) wheels "${2:?SRC}" "${3:?OUT}" ;;
    install) install "${2:?OUT}" "${3:?PREFIX}" ;;
    *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
