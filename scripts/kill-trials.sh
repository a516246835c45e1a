#!/usr/bin/env bash
# kill -9 trials: a 2-rank all-to-all (every protocol's size) is started
# under Open MPI's mpirun, and with no launcher (each rank started by hand
# with SHMFAB_RANK/SHMFAB_SIZE/SHMFAB_JOB_ID); after a random delay (0 to
# 400 ms: from boot to full traffic) one rank, chosen at random, gets
# SIGKILL. Then the same while the job starts: rank 1 comes 2 s late
# (mpirun) or never (no launcher), and rank 0 is killed while it waits. The survivor must end by itself (no hang: 60 s limit), and once
# every process of the job is gone nothing may be left: `shmfab inspect JOB`
# must find no region of the job (no file in /dev/shm, no region held by
# any process).
#   scripts/kill-trials.sh [TRIALS per case, default 100]
set -euo pipefail
cd "$(dirname "$0")/.."
trials="${1:-100}"
scripts/deps.sh peers
cargo build --release --quiet -p shmfab-mpi-tests -p shmfab-tools --bins
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
# A rank killed before it arrives is named after this many seconds.
export SHMFAB_BOOT_TIMEOUT=5
prog="$PWD/target/release/alltoall"
hangs=0; leaks=0; total=0
trial() { # $1 = launcher, $2 = trial number
  local pids=() job="kill-trial-$$-$1-$2" victim=$((RANDOM % 2))
  local delay; delay=$(printf '0.%03d' $((RANDOM % 400)))
  if [ "$1" = mpirun-boot ]; then
    SHMFAB_JOB_ID="$job" mpirun -np 2 --oversubscribe -x SHMFAB_BOOT_TIMEOUT -x SHMFAB_JOB_ID \
      sh -c '[ "$OMPI_COMM_WORLD_RANK" = 1 ] && sleep 2; exec "$0" 1000000' "$prog" >/dev/null 2>&1 &
    local launcher=$! t=0 v=""
    while [ -z "$v" ] && [ $t -lt 1000 ]; do
      sleep 0.01; t=$((t + 1)); v=$(pgrep -f "^$prog 1000000" | head -1 || true)
    done
    sleep "$delay"
    [ -n "$v" ] && kill -9 "$v" 2>/dev/null || true
    pids=("$launcher")
  elif [ "$1" = none-boot ]; then
    SHMFAB_RANK=0 SHMFAB_SIZE=2 SHMFAB_JOB_ID="$job" "$prog" 1000000 >/dev/null 2>&1 &
    pids=($!)
    sleep "$delay"
    kill -9 "${pids[0]}" 2>/dev/null || true
  elif [ "$1" = mpirun ]; then
    SHMFAB_JOB_ID="$job" mpirun -np 2 --oversubscribe -x SHMFAB_BOOT_TIMEOUT -x SHMFAB_JOB_ID \
      "$prog" 1000000 >/dev/null 2>&1 &
    local launcher=$! ranks="" t=0
    # The delay counts from the ranks' start (mpirun takes a while).
    while [ "$(echo "$ranks" | grep -c .)" -lt 2 ] && [ $t -lt 1000 ]; do
      sleep 0.01; t=$((t + 1)); ranks=$(pgrep -f "^$prog 1000000" || true)
    done
    sleep "$delay"
    local v; v=$(echo "$ranks" | sed -n "$((victim + 1))p")
    [ -n "$v" ] && kill -9 "$v" 2>/dev/null || true
    pids=("$launcher")
  else
    for r in 0 1; do
      SHMFAB_RANK=$r SHMFAB_SIZE=2 SHMFAB_JOB_ID="$job" "$prog" 1000000 >/dev/null 2>&1 &
      pids+=($!)
    done
    sleep "$delay"
    kill -9 "${pids[$victim]}" 2>/dev/null || true
  fi
  local t0=$SECONDS
  for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null; do
      if [ $((SECONDS - t0)) -gt 60 ]; then
        hangs=$((hangs + 1)); echo "HANG $1 trial $2"; pkill -9 -f "^$prog" || true; break
      fi
      sleep 0.02
    done
    wait "$p" 2>/dev/null || true
  done
  # Ranks mpirun started may outlive it for an instant.
  while pgrep -f "^$prog" >/dev/null; do sleep 0.02; done
  total=$((total + 1))
  if left=$(target/release/shmfab inspect "$job" 2>&1); then
    leaks=$((leaks + 1)); echo "LEAK $1 trial $2:"; echo "$left" | sed 's/^/     /'
    target/release/shmfab clean >/dev/null
  fi
}
for launcher in mpirun none mpirun-boot none-boot; do
  for i in $(seq "$trials"); do trial "$launcher" "$i"; done
  echo "$launcher: $trials trials done"
done
echo "kill-trials: $total trials, $hangs hangs, $leaks left something behind"
[ "$hangs" -eq 0 ] && [ "$leaks" -eq 0 ]
