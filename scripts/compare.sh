#!/usr/bin/env bash
# Side by side, in one run: shmfab, the raw shared-page floor, Open MPI's
# shared-memory BTL (osu-style program built here with mpicc), UCX's
# shared-memory transports (the same program under Open MPI's pml ucx,
# UCX_TLS=sm,self), libfabric's shm provider (fi_pingpong) and fi_pingpong
# over shmfab's own libfabric provider (built by scripts/fi-build.sh,
# when the checkout has it). Prints the
# tables with shmfab's ratio to each; a peer that cannot run is left out
# with the reason ("ucx: unavailable (...)").
# Then the one-sided part: put and get latency and bandwidth by size
# (shmfab's shared heap and single copy) and fetch-add on one word with 2
# ranks, against Open MPI's MPI_Put/MPI_Get/MPI_Fetch_and_op on a window
# from MPI_Win_allocate (mpi_tests/osu_rma.c), with the osc component Open
# MPI picks (osc rdma here) and with osc sm. --only p2p skips it, --only
# rma runs it alone (about 40 s a round).
# Then the collectives part (about 5 s a round; --only coll runs it alone):
# barrier and allreduce (8 B, 1 KiB, 1 MiB) latency on 2, 4 and 8 ranks,
# shmfab (examples/coll_bench under shmfab run) against Open MPI's
# MPI_Barrier / MPI_Allreduce (mpi_tests/osu_coll.c under mpirun).
# Usage: scripts/compare.sh [--sizes 8,64,...] [--rounds N] [--only p2p|rma|coll] [--json FILE] [--plot FILE.svg]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh peers
cargo build --release --quiet -p shmfab-tools --bin shmfab
cargo build --release --quiet --example coll_bench
mkdir -p mpi_tests/bin
mpicc -O2 -o mpi_tests/bin/osu_style mpi_tests/osu_style.c
mpicc -O2 -o mpi_tests/bin/osu_rma mpi_tests/osu_rma.c
mpicc -O2 -o mpi_tests/bin/osu_coll mpi_tests/osu_coll.c
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi=()
if [ -x scripts/fi-build.sh ]; then
  fi=(--fi-provider "$(scripts/fi-build.sh)")
fi
exec target/release/shmfab compare --osu mpi_tests/bin/osu_style --osu-rma mpi_tests/bin/osu_rma \
  --osu-coll mpi_tests/bin/osu_coll "${fi[@]}" "$@"
