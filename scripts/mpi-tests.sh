#!/usr/bin/env bash
# Multi-rank programs (mpi_tests/src/bin) under Debian's Open MPI mpirun
# with 2, 4 and 8 ranks (coll_all also 3 and 5; oversubscribed: the
# machine may have 2 cores), and under shmfab's own launcher. Each run has a timeout; afterwards no region
# of this user may be left in /dev/shm.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh peers
cargo build --release --quiet -p shmfab-mpi-tests -p shmfab-tools --bins
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI may not find a network interface in a sandbox; shmfab needs none.
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
progs="ring alltoall barrier_storm staggered_exit"
regions() { ls /dev/shm | grep -c "^shmfab\.$(id -u)\." || true; }
before=$(regions)
pass=0; fail=0
run_one() {
  local what="$1"; shift
  if out=$(timeout 180 "$@" 2>&1); then
    pass=$((pass + 1)); echo "ok   $what: $(echo "$out" | tail -1)"
  else
    fail=$((fail + 1)); echo "FAIL $what"; echo "$out" | tail -20 | sed 's/^/     /'
  fi
}
for np in 2 4 8; do
  for p in $progs; do
    run_one "mpirun -np $np $p" mpirun -np "$np" --oversubscribe "target/release/$p"
    run_one "shmfab run -n $np $p" target/release/shmfab run -n "$np" -- "target/release/$p"
  done
done
# Every collective (shmfab::coll) against a serial reference, also on 3
# and 5 ranks (odd groups: no power of two); under a second each.
for np in 2 3 4 5 8; do
  run_one "mpirun -np $np coll_all" mpirun -np "$np" --oversubscribe target/release/coll_all
  run_one "shmfab run -n $np coll_all" target/release/shmfab run -n "$np" -- target/release/coll_all
done
# Shared receive queues: 8 ranks all to all, each receive model (every
# message checked for sender and per-connection order).
for mode in a b c; do
  run_one "mpirun -np 8 srq_alltoall $mode" env SHMFAB_MAX_EPS=12 \
    mpirun -np 8 --oversubscribe -x SHMFAB_MAX_EPS target/release/srq_alltoall "$mode" 2000
  run_one "shmfab run -n 8 srq_alltoall $mode" env SHMFAB_MAX_EPS=12 \
    target/release/shmfab run -n 8 -- target/release/srq_alltoall "$mode" 2000
done
# shmfab's benchmark on a launcher's two ranks instead of its own.
run_one "mpirun -np 2 shmfab bench" mpirun -np 2 target/release/shmfab bench all --sizes 8,64k,1m
run_one "shmfab run -n 2 shmfab bench" target/release/shmfab run -n 2 --bind core -- target/release/shmfab bench pingpong --sizes 8,4k
# Open MPI's one-sided MPI (osc rdma) over shmfab's libfabric provider
# through its btl ofi (mpi_tests/osc_fi.c: MPI_Win_create windows, every
# put, get and fetch-add checked; with named regions each rank checks that
# shmfab registered its window, so no other path can pass for it).
fidir=$(scripts/fi-build.sh)
mkdir -p mpi_tests/bin
mpicc -O2 -Wall -o mpi_tests/bin/osc_fi mpi_tests/osc_fi.c
for np in 2 4; do
  run_one "mpirun -np $np osc_fi (osc rdma, btl ofi, shmfab provider)" env SHMFAB_REGIONS=named \
    SHMFAB_JOB_ID="osc-fi-$$-$np" mpirun -np "$np" --oversubscribe --mca pml ob1 --mca btl ofi,vader,self \
    --mca osc rdma --mca osc_rdma_btls ofi --mca btl_ofi_provider_include shmfab \
    -x FI_PROVIDER=shmfab -x FI_PROVIDER_PATH="$fidir" -x SHMFAB_REGIONS -x SHMFAB_JOB_ID mpi_tests/bin/osc_fi
done
# Open MPI's two-sided MPI over the provider: with `btl ofi,self` the only
# way between two ranks is btl ofi over shmfab (its sends ask
# FI_DELIVERY_COMPLETE); mpi_tests/p2p_fi.c checks every byte.
mpicc -O2 -Wall -o mpi_tests/bin/p2p_fi mpi_tests/p2p_fi.c
for np in 2 4; do
  run_one "mpirun -np $np p2p_fi (pml ob1, btl ofi only, shmfab provider)" mpirun -np "$np" --oversubscribe \
    --mca pml ob1 --mca btl ofi,self --mca btl_ofi_mode 2 --mca btl_ofi_provider_include shmfab \
    -x FI_PROVIDER=shmfab -x FI_PROVIDER_PATH="$fidir" mpi_tests/bin/p2p_fi
done
after=$(regions)
if [ "$after" -gt "$before" ]; then
  fail=$((fail + 1)); echo "FAIL regions left in /dev/shm:"; ls -l /dev/shm | grep "shmfab\.$(id -u)\."
fi
echo "mpi-tests: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
