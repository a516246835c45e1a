#!/usr/bin/env bash
# Installs what shmfab's scripts need, with apt-get, only when missing:
# always the build's C libraries (hwloc, for the shmfab command in tools/;
# libfabric's headers and libclang, for the libfabric provider in fi/,
# whose bindings bindgen generates at build time) and libfabric's tools
# (fi_info, fi_pingpong: the provider's tests run them);
# with "peers" also Open MPI, UCX and libfabric's tools, for the multi-rank
# tests and the comparison; with "profile" valgrind, for scripts/profile.sh.
# Usage: scripts/deps.sh [peers|profile]
set -euo pipefail
need=()
have() { command -v "$1" >/dev/null 2>&1; }
pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
have cc || need+=(gcc)
have pkg-config || need+=(pkg-config)
# hwloc 2.x for the shmfab command's topology (tools/: hwlocality links it
# through pkg-config).
pkg_installed libhwloc-dev || need+=(libhwloc-dev)
pkg_installed libudev-dev || need+=(libudev-dev)
# The provider (fi/): bindgen reads rdma/fabric.h and
# rdma/providers/fi_prov.h through libclang; its tests run fi_info and
# fi_pingpong against it.
pkg_installed libfabric-dev || need+=(libfabric-dev)
pkg_installed libclang-dev || need+=(libclang-dev)
have fi_pingpong || need+=(libfabric-bin)
if [ "${1:-}" = peers ]; then
  have mpirun || need+=(openmpi-bin)
  have mpicc || need+=(libopenmpi-dev)
  # UCX for the comparison: Open MPI's pml ucx component
  # (mca_pml_ucx.so, shipped in Open MPI's library package, libopenmpi3 on
  # Debian 12, which openmpi-bin pulls in) loads libucp from libucx0, whose
  # libuct has the shared-memory transports (posix, sysv; cma beside it).
  pkg_installed libucx0 || need+=(libucx0)
  have taskset || need+=(util-linux)
fi
if [ "${1:-}" = profile ]; then
  have valgrind || need+=(valgrind)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
