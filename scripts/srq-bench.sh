#!/usr/bin/env bash
# Shared receive queue benchmark: message rate and memory per rank of N
# ranks all to all (8-byte messages into 4 KiB buffers) by receive model:
#   a: one receive endpoint per rank with an SRQ of 128 buffers,
#   b: one receive endpoint per peer, each with its own 64 buffers,
#   c: one receive endpoint per peer, all sharing an SRQ of 128 buffers.
# Rates at N=8 (three runs each, interleaved); memory measured at N=2, 4,
# 8, 16 and computed for N=2, 8, 64, 256 (shmfab info).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cargo build --release --quiet -p shmfab-mpi-tests -p shmfab-tools --bins
run() { SHMFAB_MAX_EPS=$(( $1 + 4 )) timeout 300 target/release/shmfab run -n "$1" -- target/release/srq_alltoall "$2" "$3"; }
echo "== rate, N=8, 20000 messages per peer =="
for i in 1 2 3; do for m in a b c; do run 8 "$m" 20000; done; done
echo "== memory per rank, measured =="
for n in 2 4 8 16; do for m in a b c; do run "$n" "$m" 500; done; done
echo "== memory per rank, computed =="
target/release/shmfab info --ranks 2,8,64,256 | sed -n '/^memory per rank/,$p'
