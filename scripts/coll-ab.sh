#!/usr/bin/env bash
# Paired A/B of collective builds (examples/coll_bench copied aside per
# build): each round probes the raw 8 B shared-page floor (the placement),
# then runs every build once on 2 ranks (`shmfab run --bind core`), in
# alternating order, and takes each build's barrier and 8 B allreduce
# medians. Prints, per build, the median over rounds and the median of
# its paired differences to the first build, for the near rounds (raw
# floor under 0.1 us) and for all of them.
#
# Usage: scripts/coll-ab.sh [-n ROUNDS] [-i ITERS] [-r RANKS] BASE OTHER...
#   BASE, OTHER: coll_bench binaries. The shmfab command is
#   target/release/shmfab (SHMFAB_BIN overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=10 iters=20000 ranks=2
while getopts "n:i:r:" o; do
  case $o in
    n) rounds=$OPTARG ;;
    i) iters=$OPTARG ;;
    r) ranks=$OPTARG ;;
    *) sed -n '2,13p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [[ $# -lt 2 ]]; then
  sed -n '2,13p' "$0"
  exit 2
fi
exe=${SHMFAB_BIN:-target/release/shmfab}
bins=("$@")
n=${#bins[@]}
out=$(mktemp /tmp/shmfab-coll-ab.XXXXXX)
trap 'rm -f "$out"' EXIT
for ((r = 1; r <= rounds; r++)); do
  raw=nan
  for _ in 1 2 3; do
    raw=$("$exe" compare --sizes 8 --rounds 1 --only p2p 2>/dev/null | awk '/^raw floor/ { print $3 }') || true
    [[ $raw =~ ^[0-9.]+$ ]] && break
    raw=nan
  done
  row="$raw"
  vals=()
  for ((k = 0; k < n; k++)); do
    j=$((r % 2 ? k : n - 1 - k))
    res=$(timeout 300 "$exe" run -n "$ranks" --bind core -- "${bins[$j]}" --iters "$iters" --sizes 8 --no-overlap 2>&1)
    b=$(awk '/^barrier/ { for (i = 1; i <= NF; i++) if ($i ~ /^median_us=/) { sub(/median_us=/, "", $i); print $i } }' <<<"$res")
    a=$(awk '/^allreduce/ { for (i = 1; i <= NF; i++) if ($i ~ /^median_us=/) { sub(/median_us=/, "", $i); print $i } }' <<<"$res")
    [[ $b =~ ^[0-9.]+$ && $a =~ ^[0-9.]+$ ]] || { echo "coll-ab: ${bins[$j]} gave no figure: $res" >&2; exit 1; }
    vals[j]="$b $a"
  done
  row="$row ${vals[*]}"
  echo "$row" | tee -a "$out"
done
echo "$ranks ranks, $rounds paired rounds of $iters iterations; medians per call in us (lower is better)"
for sel in near all; do
  for ((j = 0; j < n; j++)); do
    awk -v j=$j -v sel=$sel -v name="${bins[$j]}" '
      function median(a, m,   i, k, t, b) {
        for (i = 1; i <= m; i++) b[i] = a[i]
        for (i = 2; i <= m; i++) { t = b[i]; for (k = i - 1; k > 0 && b[k] > t; k--) b[k + 1] = b[k]; b[k + 1] = t }
        return m % 2 ? b[(m + 1) / 2] : (b[m / 2] + b[m / 2 + 1]) / 2
      }
      sel == "all" || ($1 != "nan" && $1 < 0.1) {
        m++; if ($1 != "nan") { nr++; raw[nr] = $1 } b[m] = $(2 + 2 * j); a[m] = $(3 + 2 * j); db[m] = b[m] - $2; da[m] = a[m] - $3
      }
      END {
        if (!m) { printf "%-4s %-28s no rounds\n", sel, name; exit }
        printf "%-4s %-28s %2d rounds (raw median %.3f): barrier %.3f (paired diff %+.3f), allreduce 8 B %.3f (paired diff %+.3f)\n",
          sel, name, m, nr ? median(raw, nr) : -1, median(b, m), median(db, m), median(a, m), median(da, m)
      }' "$out"
  done
done
