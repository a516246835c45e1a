#!/usr/bin/env bash
# shmfab's main job: ping-pong and streaming bandwidth (and the 8-byte
# message rate) between two processes that shmfab starts itself.
# Usage: scripts/run.sh [bench arguments, e.g. --sizes 8,4k,1m --json out.json]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cargo build --release --quiet -p shmfab-tools --bin shmfab
exec target/release/shmfab bench all "$@"
