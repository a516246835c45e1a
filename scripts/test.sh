#!/usr/bin/env bash
# The whole test suite: unit tests, multi-process integration tests and
# doctests (cargo test), the loom models of the ring, the doorbell and the
# pool free list, then the multi-rank programs under mpirun and shmfab run,
# and kill -9 trials (a rank of a running job killed: nothing left behind).
# Fails if any test leaves a region in /dev/shm.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh peers
before=$(ls /dev/shm | grep -c "^shmfab\.$(id -u)\." || true)
timeout 1500 cargo test --workspace --all-targets --release
timeout 600 cargo test --workspace --doc --release
echo "== loom models"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom timeout 900 \
  cargo test --release -p shmfab --lib loom
echo "== multi-rank programs"
scripts/mpi-tests.sh
echo "== kill -9 trials (10 per case)"
scripts/kill-trials.sh 10
after=$(ls /dev/shm | grep -c "^shmfab\.$(id -u)\." || true)
if [ "$after" -gt "$before" ]; then
  echo "tests left $((after - before)) region(s) in /dev/shm:" >&2
  ls -l /dev/shm | grep "shmfab\.$(id -u)\." >&2
  exit 1
fi
echo "== no /dev/shm region left behind"
