#!/usr/bin/env bash
# Instructions per 8-byte half round trip, by function, counted by
# callgrind on examples/halftrip.rs (two endpoints in one process: the
# software of a ping-pong without the cache-line transfers), and per empty
# CQ read (halftrip --empty: the poll loop's iteration, whose length
# delays the finding of a message that lands during it). Counts are exact
# and repeatable, unlike times on a shared VM: compare them before and
# after a change to the hot path.
# Usage: scripts/profile.sh [rounds]   (default 2000)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh profile
rounds=${1:-2000}
cargo build --release --quiet --example halftrip
out=$(mktemp /tmp/shmfab-callgrind.XXXXXX)
trap 'rm -f "$out"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$out" target/release/examples/halftrip "$rounds" 2>/dev/null
trips=$((rounds * 128))
callgrind_annotate --threshold=99 --show-percs=no "$out" 2>/dev/null | awk -v n="$trips" '
  /PROGRAM TOTALS/ { gsub(",", "", $1); printf "%.0f instructions per half round trip (%d half trips, setup included)\n\nself instructions per half trip, by function:\n", $1 / n, n; next }
  /^ *[0-9,]+ .*:/ && seen { c = $1; gsub(",", "", c); if (c / n >= 1) { $1 = ""; sub(/ \[[^]]*\]$/, ""); printf "%8.1f %s\n", c / n, $0 } }
  /file:function/ { seen = 1 }'
reads=$((rounds * 500))
valgrind --tool=callgrind --callgrind-out-file="$out" target/release/examples/halftrip --empty "$reads" >/dev/null 2>&1
callgrind_annotate --threshold=99 --show-percs=no "$out" 2>/dev/null | awk -v n="$reads" '
  /PROGRAM TOTALS/ { gsub(",", "", $1); printf "\n%.0f instructions per empty CQ read (%d reads, setup included)\n", $1 / n, n }'
