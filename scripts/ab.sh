#!/usr/bin/env bash
# Paired A/B of shmfab builds: each round runs `BIN bench pingpong|msgrate|bw`
# once per build, in alternating order, and the differences to the first
# build are taken round by round (these shared VMs drift by more between
# minutes than most hot-path changes are worth, so unpaired medians mislead).
# Prints each build's median, the median and mean of its paired differences
# and how many rounds it beat the base in. On the 2-vCPU development VM,
# differences of 2 ns and under needed 30-40 rounds to tell from noise; 16
# rounds once showed a 7 ns gain that 16 more did not reproduce.
# Each round is framed by two probes of the raw floor (`bench raw`, from the
# first build that has it): where the probes split in two placements (as
# `shmfab compare` splits them), the rounds whose two probes fall on one side
# are also summed up per placement, and the others counted as mixed.
#
# Usage: scripts/ab.sh [-w pingpong|msgrate|bw] [-s SIZE] [-n ROUNDS] BASE OTHER...
#   BASE, OTHER: shmfab binaries (copy target/release/shmfab aside per build).
set -euo pipefail
what=pingpong size=8 rounds=30
while getopts "w:s:n:" o; do
  case $o in
    w) what=$OPTARG ;;
    s) size=$OPTARG ;;
    n) rounds=$OPTARG ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [[ $# -lt 2 || ( $what != pingpong && $what != msgrate && $what != bw ) ]]; then
  sed -n '2,16p' "$0"
  exit 2
fi
bins=("$@")
n=${#bins[@]}
out=$(mktemp /tmp/shmfab-ab.XXXXXX)
trap 'rm -f "$out"' EXIT
# The raw floor's probe: "0" when no build has `bench raw` (older builds).
prober=""
for b in "${bins[@]}"; do
  if "$b" bench raw >/dev/null 2>&1; then prober=$b; break; fi
done
probe() {
  if [[ -n $prober ]]; then
    "$prober" bench raw 2>/dev/null | awk '/^raw/ { print $(NF - 1) }'
  else
    echo 0
  fi
}
for ((r = 1; r <= rounds; r++)); do
  vals=()
  before=$(probe)
  for ((k = 0; k < n; k++)); do
    # Odd rounds run the builds in order, even rounds in reverse.
    j=$(( r % 2 ? k : n - 1 - k ))
    # The last line is the size's row: half round trip in column 2,
    # bandwidth in 3, rate last.
    v=$("${bins[$j]}" bench "$what" --sizes "$size" 2>&1 | tail -1 |
      awk -v w="$what" '{ print (w == "pingpong") ? $2 : (w == "bw") ? $3 : $NF }')
    [[ $v =~ ^[0-9.]+$ ]] || { echo "ab: ${bins[$j]} gave no figure" >&2; exit 1; }
    vals[j]=$v
  done
  # Columns: probe before, probe after, then each build's figure.
  echo "${before:-0} $(probe) ${vals[*]}" >>"$out"
done
case $what in
  pingpong) unit="us (half round trip; lower is better)" ;;
  bw) unit="GB/s (streaming bandwidth; higher is better)" ;;
  *) unit="Mmsg/s (higher is better)" ;;
esac
# Where the probes split, as `shmfab compare` splits its 8 B probes: at
# the widest gap between two probes next to each other in order
# (geometric mean of the two), when it is 1.5x or more and leaves one
# probe in twenty (one at least) on either side; else 0: one placement.
# (The lowest against the highest, 1.8x apart, took close probes, about
# 0.030 us, and near ones, up to 0.054, for two placements.)
split=$(awk '{ for (i = 1; i <= 2; i++) if ($i > 0) v[++n] = $i }
  END {
    for (i = 2; i <= n; i++) { t = v[i]; for (k = i - 1; k > 0 && v[k] > t; k--) v[k + 1] = v[k]; v[k + 1] = t }
    side = int(n / 20); if (side < 1) side = 1
    best = 0; cut = 0
    for (i = side + 1; i <= n - side + 1 && i <= n; i++) {
      if (i < 2) continue
      r = v[i] / v[i - 1]
      if (r > best) { best = r; cut = sqrt(v[i] * v[i - 1]) }
    }
    print (best >= 1.5) ? cut : 0
  }' "$out")
probes=$(awk '{ for (i = 1; i <= 2; i++) if ($i > 0) { if (!lo || $i < lo) lo = $i; if ($i > hi) hi = $i } }
  END { if (lo) printf "raw 8 B probes %.3f-%.3f us", lo, hi; else printf "no raw probes" }' "$out")
summary() { # $1: near, far or all
  echo "$what, $size B, $1: $2 paired rounds, in $unit"
  for ((j = 0; j < n; j++)); do
    awk -v j=$((j + 3)) -v name="${bins[$j]}" -v lower=$([[ $what == pingpong ]] && echo 1 || echo 0) \
      -v cut="$split" -v want="$1" '
      {
        p = (cut == 0) ? "all" : ($1 < cut && $2 < cut) ? "near" : ($1 >= cut && $2 >= cut) ? "far" : "mixed"
        if (want != "all" && p != want) next
        m++; v[m] = $j; d[m] = $j - $3; s += $j - $3; if (lower ? $j < $3 : $j > $3) w++
      }
      function median(a, m,   i, k, t, b) {
        for (i = 1; i <= m; i++) b[i] = a[i]
        for (i = 2; i <= m; i++) { t = b[i]; for (k = i - 1; k > 0 && b[k] > t; k--) b[k + 1] = b[k]; b[k + 1] = t }
        return m % 2 ? b[(m + 1) / 2] : (b[m / 2] + b[m / 2 + 1]) / 2
      }
      END {
        if (!m) exit
        if (j == 3) { printf "%-36s median %.4f (base)\n", name, median(v, m); exit }
        printf "%-36s median %.4f, paired difference median %+.4f, mean %+.4f, better in %d of %d\n",
          name, median(v, m), median(d, m), s / m, w, m
      }' "$out"
  done
}
count() { # rounds of placement $1
  awk -v cut="$split" -v want="$1" '{
    p = ($1 < cut && $2 < cut) ? "near" : ($1 >= cut && $2 >= cut) ? "far" : "mixed"
    if (p == want) c++ } END { print c + 0 }' "$out"
}
summary all "$rounds"
echo "($probes)"
if [[ $split != 0 ]]; then
  for p in near far; do
    c=$(count $p)
    [[ $c -gt 0 ]] && summary $p "$c"
  done
  echo "(two placements, split at $split us; $(count mixed) rounds mixed)"
fi
