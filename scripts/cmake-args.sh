#!/usr/bin/env bash
# Prints the portable CMake flags llama.cpp is built with here (llama-cpp-python by
# scripts/bootstrap.sh, llama-server by benchmarks/build_llama_server.sh), on one line.
#
# No -march=native, never AMX (a VM may advertise AMX and still fault on it), and each AVX-512
# extension only where this CPU reports it (an AMD EPYC here has AVX2 only).
#
#   scripts/cmake-args.sh --baseline   # what a container image is built with instead
#
# --baseline ignores this CPU: an image runs on other nodes than the one it was built on, so
# it gets what every x86-64 node of its class runs, x86-64-v3 (AVX2, FMA, F16C; no AVX-512,
# no AVX-VNNI, no AMX). On an AVX2-only machine that is the same line as without it (and so
# the same cached wheel).
set -euo pipefail

cpu_has() { grep -q -w "$1" /proc/cpuinfo 2>/dev/null; }
args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
if [ "${1:-}" = "--baseline" ]; then
    args+=" -DGGML_AVX512=OFF"
elif cpu_has avx512f; then
    args+=" -DGGML_AVX512=ON"
    if cpu_has avx512vbmi; then args+=" -DGGML_AVX512_VBMI=ON"; fi
    if cpu_has avx512_vnni; then args+=" -DGGML_AVX512_VNNI=ON"; fi
    if cpu_has avx512_bf16; then args+=" -DGGML_AVX512_BF16=ON"; fi
else
    args+=" -DGGML_AVX512=OFF"
fi
if [ "${1:-}" != "--baseline" ] && cpu_has avx_vnni; then args+=" -DGGML_AVX_VNNI=ON"; fi
args+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
printf '%s\n' "$args"
