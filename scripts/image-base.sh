#!/usr/bin/env bash
# deploy/Containerfile built with podman on a machine that reaches Debian's mirror and PyPI but
# no registry of images (CI: tests/deploy/test_container.py runs this). Users build with the plain
# `podman build` line in the Containerfile's header, from the public python:3.11-slim-bookworm.
#
#   scripts/image-base.sh             # the two base images; prints their tags
#   scripts/image-base.sh build TAG   # those, then deploy/Containerfile as TAG
#
# The base images, from Debian's own packages (an image already tagged is kept; REBUILD=1
# makes them again; MIRROR chooses Debian's mirror, default deb.debian.org):
#   localhost/llmtrio-base:bookworm-runtime   debootstrap --variant=minbase bookworm, plus
#                                             python3, python3-venv, libgomp1
#   localhost/llmtrio-base:bookworm-build     the same plus build-essential and python3-dev
# Both are Python 3.11 on glibc 2.36 (Debian 12), as python:3.11-slim-bookworm is, and hold what
# the Containerfile's stages would apt-get, so the stages install nothing.
#
# `build` reuses the llama-cpp-python wheel tests/deploy/test_image.py builds on this machine (through
# scripts/llama-wheel.sh's cache: built here first if missing, once for both) instead of
# compiling llama.cpp again in the container: the cache is mounted read-only at the build
# stage's /wheel-cache. That wheel is this machine's Python's, so the script first checks that
# $PYTHON (default python3) is the image's CPython version and this glibc no newer than the
# image's; where not, the container builds its own wheel (and says so). Needs root, podman,
# debootstrap and runc.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
SUITE=bookworm
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
RUNTIME_TAG="localhost/llmtrio-base:$SUITE-runtime"
BUILD_TAG="localhost/llmtrio-base:$SUITE-build"
PYTHON="${PYTHON:-python3}"
# Only for CI machines, not users: crun (podman's default where installed) refuses these
# kernels' hybrid cgroups (v1 controllers with a v2 mount), so runc and cgroupfs.
PODMAN=(podman --runtime runc --cgroup-manager=cgroupfs)
# Only for CI machines: podman's default nofile limit (1048576) is over this machine's hard
# limit (20000), and a container then fails to start.
ULIMITS=(--ulimit nofile=1024:20000 --ulimit nproc=1024:1024)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

exists() { podman image exists "$1" && [ -z "${REBUILD:-}" ]; }

# A root filesystem as one image layer; apt's package lists and caches left out.
import() { # rootfs, tag
    rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/cache/apt/archives/*.deb
    tar -C "$1" --numeric-owner -c . | podman import -q \
        --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$2" >/dev/null
    echo "$2: $(podman image inspect --format '{{.Size}}' "$2") bytes" >&2
}

bases() {
    if exists "$RUNTIME_TAG" && exists "$BUILD_TAG"; then
        return
    fi
    local rootfs="$work/rootfs" started=$SECONDS
    debootstrap --variant=minbase --include=python3,python3-venv,libgomp1 \
        "$SUITE" "$rootfs" "$MIRROR" >&2
    echo "debootstrap: $((SECONDS - started)) s" >&2
    import "$rootfs" "$RUNTIME_TAG"
    # The build stage's compiler, in the same tree (apt needs its lists back for it).
    started=$SECONDS
    chroot "$rootfs" apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive chroot "$rootfs" \
        apt-get install -y -qq --no-install-recommends build-essential python3-dev >&2
    echo "build-essential: $((SECONDS - started)) s" >&2
    import "$rootfs" "$BUILD_TAG"
}

# Prints podman build's arguments for mounting the wheel cache, or nothing (and why, on
# stderr) where this machine's wheel would not run in the image.
wheel_cache() {
    local host image flags
    host="$("$PYTHON" -c 'import sys; print(sys.implementation.cache_tag)') $(getconf GNU_LIBC_VERSION)"
    image="$("${PODMAN[@]}" run --rm "${ULIMITS[@]}" --network none "$BUILD_TAG" sh -c \
        'python3 -c "import sys; print(sys.implementation.cache_tag)"; getconf GNU_LIBC_VERSION' |
        tr '\n' ' ')"
    read -r host_python _ host_glibc <<<"$host"
    read -r image_python _ image_glibc <<<"$image"
    if [ "$host_python" != "$image_python" ] ||
        [ "$(printf '%s\n%s\n' "$host_glibc" "$image_glibc" | sort -V | tail -n 1)" != "$image_glibc" ]; then
        echo "this machine has $host_python on glibc $host_glibc, the image $image_python on" \
            "glibc $image_glibc: the container builds llama.cpp itself" >&2
        return
    fi
    echo "this machine's $host_python on glibc $host_glibc runs in the image ($image_python," \
        "glibc $image_glibc): reusing its llama-cpp-python wheel" >&2
    flags="$(BACKEND=cpu "$root/scripts/image-build.sh" flags)"
    CMAKE_ARGS="$flags" "$root/scripts/llama-wheel.sh" "$PYTHON" >&2
    printf '%s\n' -v "${LLMTRIO_WHEEL_CACHE:-$HOME/.cache/llmtrio/wheels}:/wheel-cache:ro"
}

build() { # tag
    local tag="$1" started cache ca conf="$work/pip.conf"
    bases
    mapfile -t cache < <(wheel_cache)
    # Only for CI machines: pip in the build stage reaches PyPI through this machine's network
    # (--network host), whose TLS is signed by a CA only this machine's bundle holds; a pip.conf
    # mounted where pip reads it names that bundle (an ENV would stay in the image).
    ca=/etc/ssl/certs/ca-certificates.crt
    printf '[global]\ncert = /etc/ssl/certs/host-ca.crt\n' >"$conf"
    started=$SECONDS
    "${PODMAN[@]}" build "${ULIMITS[@]}" --network host \
        -v "$ca:/etc/ssl/certs/host-ca.crt:ro" -v "$conf:/etc/pip.conf:ro" "${cache[@]}" \
        --build-arg BUILD_IMAGE="$BUILD_TAG" --build-arg RUNTIME_IMAGE="$RUNTIME_TAG" \
        -f "$root/deploy/Containerfile" -t "$tag" "$root" >&2
    echo "built $tag in $((SECONDS - started)) s;" \
        "$(podman image inspect --format '{{.Size}}' "$tag") bytes" >&2
}

case "${1:-bases}" in
    bases) bases && printf '%s\n%s\n' "$RUNTIME_TAG" "$BUILD_TAG" ;;
    build) build "${2:?usage: $0 build TAG}" ;;
    *) sed -n '2,23p' "$0" >&2; exit 2 ;;
esac
