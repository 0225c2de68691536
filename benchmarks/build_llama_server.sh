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
# and the build is skipped when it is there. An interrupted build resumes from its build
# folder (<version>-<hash>.build, removed once the binary is in place). A benchmark setup step,
# never part of CI. No network beyond PyPI (the sdist): no curl, no OpenSSL, no web UI download.
set -euo pipefail

main() {
    cd "$(dirname "$0")/.."
    local py=.venv/bin/python version cmake_args server_args key cache dest work src
    version=$("$py" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')
    cmake_args="${CMAKE_ARGS:-$(scripts/cmake-args.sh)}"
    # Server-only settings: a static, self-contained binary with no network features.
    server_args="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON"
    server_args+=" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF"
    server_args+=" -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF"

    key=$(printf '%s|%s|%s' "$version" "$cmake_args" "$server_args" | sha256sum | cut -c1-16)
    cache="${LLMTRIO_LLAMA_SERVER_CACHE:-$HOME/.cache/llmtrio/llama-server}"
    dest="$cache/$version-$key"
    if [ -x "$dest/llama-server" ]; then
        echo "$dest/llama-server"
        return 0
    elif [ "${1:-}" = "--print-path" ]; then
        echo "llama-server is not built for these flags: run $0" >&2
        return 1
    fi

    work="$dest.build"
    src="$work/llama_cpp_python-$version/vendor/llama.cpp"
    echo "building llama-server from llama-cpp-python $version's llama.cpp in $work" >&2
    echo "CMAKE_ARGS=$cmake_args $server_args" >&2
    mkdir -p "$work"
    if [ ! -f "$src/CMakeLists.txt" ]; then
        "$py" -m pip download -q --no-deps --no-binary :all: -d "$work" \
            "llama-cpp-python==$version" >&2
        tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
    fi
    # shellcheck disable=SC2086  # the flag strings are lists of words
    cmake -S "$src" -B "$work/build" -G Ninja $cmake_args $server_args >&2
    cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2
    "$work/build/bin/llama-server" --version >&2

    rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
    cp "$work/build/bin/llama-server" "$dest.tmp/llama-server"
    printf '%s %s\n' "$cmake_args" "$server_args" > "$dest.tmp/flags"
    rm -rf "$dest" && mv "$dest.tmp" "$dest"
    rm -rf "$work"
    echo "$dest/llama-server"
}

main "$@"
