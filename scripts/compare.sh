#!/usr/bin/env bash
# Side by side, in one run: shmfab, the raw shared-page floor, Open MPI's
# shared-memory BTL (osu-style program built here with mpicc) and libfabric's
# shm provider (fi_pingpong). Prints one table with shmfab's ratio to each.
# Usage: scripts/compare.sh [--sizes 8,64,...] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh peers
cargo build --release --quiet -p shmfab-tools --bin shmfab
mkdir -p mpi_tests/bin
mpicc -O2 -o mpi_tests/bin/osu_style mpi_tests/osu_style.c
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec target/release/shmfab compare --osu mpi_tests/bin/osu_style "$@"
