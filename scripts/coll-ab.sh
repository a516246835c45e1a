#!/usr/bin/env bash
# Paired A/B of collective builds (examples/coll_bench copied aside per
# build): each round probes the raw 8 B shared-page floor (the placement),
# then runs every build once on 2 ranks (`shmfab run --bind core`), in
# alternating order, and takes each build's barrier and 8 B allreduce
# figures (the median call, and the mean as compare reports it). Prints,
# per build, the median over rounds of each and the median of its paired
# differences to the first build, for the near rounds (raw floor under
# 0.1 us) and for all of them.
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
# Field `$2` (name=value) of coll_bench's line for op `$1` in `$res`.
fig() {
  awk -v op="$1" -v f="$2" '$1 == op { for (i = 2; i <= NF; i++) if (index($i, f "=") == 1) { sub(/.*=/, "", $i); print $i } }' <<<"$res"
}
for ((r = 1; r <= rounds; r++)); do
  raw=nan
  for _ in 1 2 3; do
    raw=$("$exe" compare --sizes 8 --rounds 1 --only p2p 2>/dev/null | awk '/^raw floor/ { print $3 }') || true
    [[ $raw =~ ^[0-9.]+$ ]] && break
    raw=nan
  done
  vals=()
  for ((k = 0; k < n; k++)); do
    j=$((r % 2 ? k : n - 1 - k))
    res=$(timeout 300 "$exe" run -n "$ranks" --bind core -- "${bins[$j]}" --iters "$iters" --sizes 8 --no-overlap 2>&1)
    b=$(fig barrier median_us) a=$(fig allreduce median_us) bm=$(fig barrier latency_us) am=$(fig allreduce latency_us)
    [[ $b =~ ^[0-9.]+$ && $a =~ ^[0-9.]+$ && $bm =~ ^[0-9.]+$ && $am =~ ^[0-9.]+$ ]] ||
      { echo "coll-ab: ${bins[$j]} gave no figure: $res" >&2; exit 1; }
    vals[j]="$b $a $bm $am"
  done
  echo "$raw ${vals[*]}" | tee -a "$out"
done
echo "$ranks ranks, $rounds paired rounds of $iters iterations; per call in us (lower is better), paired differences to the first build in brackets"
for sel in near all; do
  for ((j = 0; j < n; j++)); do
    awk -v j=$j -v sel=$sel -v name="${bins[$j]}" '
      function median(a, m,   i, k, t, b) {
        for (i = 1; i <= m; i++) b[i] = a[i]
        for (i = 2; i <= m; i++) { t = b[i]; for (k = i - 1; k > 0 && b[k] > t; k--) b[k + 1] = b[k]; b[k + 1] = t }
        return m % 2 ? b[(m + 1) / 2] : (b[m / 2] + b[m / 2 + 1]) / 2
      }
      sel == "all" || ($1 != "nan" && $1 < 0.1) {
        m++
        if ($1 != "nan") { nr++; raw[nr] = $1 }
        for (f = 0; f < 4; f++) { v[f, m] = $(2 + 4 * j + f); d[f, m] = v[f, m] - $(2 + f) }
      }
      END {
        if (!m) { printf "%-4s %-24s no rounds\n", sel, name; exit }
        for (f = 0; f < 4; f++) {
          for (i = 1; i <= m; i++) { x[i] = v[f, i]; y[i] = d[f, i] }
          med[f] = median(x, m); dif[f] = median(y, m)
        }
        printf "%-4s %-24s %2d rounds, raw %.3f | median call: barrier %.3f [%+.3f], allreduce 8 B %.3f [%+.3f] | mean: barrier %.3f [%+.3f], allreduce 8 B %.3f [%+.3f]\n",
          sel, name, m, nr ? median(raw, nr) : -1, med[0], dif[0], med[1], dif[1], med[2], dif[2], med[3], dif[3]
      }' "$out"
  done
done
