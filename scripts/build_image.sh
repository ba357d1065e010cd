#!/usr/bin/env bash
# Builds drover:local for docker-compose.yml from local material only:
#   1. a Debian bookworm rootfs with python3 and venv (debootstrap, from the Debian mirror),
#      imported as drover-base:bookworm, and one with a C compiler and Python's headers too,
#      drover-build:bookworm, where the Dockerfile's first stage compiles the planner;
#   2. wheels of Drover and everything it needs (pip, from PyPI / this machine's torch file),
#      and of Cython;
#   3. docker/Dockerfile on top.
# Needs root, debootstrap and a running Docker engine (Debian: apt-get install debootstrap docker.io).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build/image
mkdir -p "$BUILD"
base_image() {  # name, debootstrap's extra packages
    if ! docker image inspect "$1" >/dev/null 2>&1; then
        rm -rf "$BUILD/rootfs"
        debootstrap --variant=minbase --include="python3,python3-venv,ca-certificates$2" bookworm "$BUILD/rootfs"
        tar -C "$BUILD/rootfs" -c . | docker import - "$1"
        rm -rf "$BUILD/rootfs"
    fi
}
base_image drover-base:bookworm ""
base_image drover-build:bookworm ",gcc,libc6-dev,python3-dev"
rm -rf "$BUILD/context" && mkdir -p "$BUILD/context/wheels"
# torch pinned to the CPU build here: pyproject allows a range, which would pull a CUDA build.
python3 -m pip wheel --quiet --wheel-dir "$BUILD/context/wheels" torch==2.13.0 ".[compiled]"
cp docker/Dockerfile "$BUILD/context/Dockerfile"
docker build -t drover:local "$BUILD/context"
# Prometheus for the compose file's `metrics` profile (docs/operations.md).
docker build -t drover-prometheus:local -f docker/prometheus.Dockerfile docker
