#!/usr/bin/env bash
# The whole test suite: unit tests, multi-process integration tests and
# doctests (cargo test), the loom models of the ring, the doorbell and the
# pool free list, the core tests again with debug assertions, then the multi-rank programs under mpirun and shmfab run,
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
echo "== debug assertions on the unchecked paths (release, debug_assert! kept)"
# The hot path indexes tables without bounds checks where their own
# invariants make the checks redundant; each such place has a
# debug_assert! of its invariant, which a plain release build drops.
CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true CARGO_TARGET_DIR=target/debug-assert timeout 1200 \
  cargo test --release -p shmfab --lib --test objects --test progress --test semantics --test srq \
  --test delivery --test dead_peers --test multi_recv --test pool_runs
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
