#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the llama.cpp sources vendored in the installed
# llama-cpp-python's source distribution, with the same CPU flags as scripts/bootstrap.sh
# (scripts/cmake-args.sh, or CMAKE_ARGS when set), so benchmarks/compare.py compares servers on
# one llama.cpp build. Prints the binary's path on stdout; everything else goes to stderr.
#
#   ./benchmarks/build_llama_server.sh               # about 15 minutes on 2 cores, once
#   ./benchmarks/build_llama_server.sh --print-path  # the cached binary, or exit 1; never builds
#
# The binary is cached in ~/.cache/llmtrio/llama-server/<version>-<hash of flags>/llama-server
# and the build is skipped when it is there. A benchmark setup step, never part of CI.
# No network beyond PyPI (the sdist): no curl, no OpenSSL, no web UI download.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
version=$("$PY" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')
CMAKE_ARGS="${CMAKE_ARGS:-$(scripts/cmake-args.sh)}"
# Server-only settings: a static, self-contained binary with no network features.
SERVER_ARGS="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON"
SERVER_ARGS+=" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF"
SERVER_ARGS+=" -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF"

key=$(printf '%s|%s|%s' "$version" "$CMAKE_ARGS" "$SERVER_ARGS" | sha256sum | cut -c1-16)
dest="${LLMTRIO_LLAMA_SERVER_CACHE:-$HOME/.cache/llmtrio/llama-server}/$version-$key"
if [ -x "$dest/llama-server" ]; then
    echo "$dest/llama-server"
    exit 0
elif [ "${1:-}" = "--print-path" ]; then
    echo "llama-server is not built for these flags: run $0" >&2
    exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "building llama-server from llama-cpp-python $version's llama.cpp in $work" >&2
echo "CMAKE_ARGS=$CMAKE_ARGS $SERVER_ARGS" >&2
"$PY" -m pip download -q --no-deps --no-binary :all: -d "$work" \
    "llama-cpp-python==$version" >&2
tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
# shellcheck disable=SC2086  # the flag strings are lists of words
cmake -S "$src" -B "$work/build" -G Ninja $CMAKE_ARGS $SERVER_ARGS >&2
cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2
"$work/build/bin/llama-server" --version >&2

mkdir -p "$dest.tmp"
cp "$work/build/bin/llama-server" "$dest.tmp/llama-server"
printf '%s %s\n' "$CMAKE_ARGS" "$SERVER_ARGS" > "$dest.tmp/flags"
rm -rf "$dest" && mv "$dest.tmp" "$dest"
echo "$dest/llama-server"
