#!/usr/bin/env bash
# Paired A/B of shmfab builds: each round runs `BIN bench pingpong|msgrate|bw`
# once per build, in alternating order, and the differences to the first
# build are taken round by round (these shared VMs drift by more between
# minutes than most hot-path changes are worth, so unpaired medians mislead).
# Prints each build's median, the median and mean of its paired differences
# and how many rounds it beat the base in. On the 2-vCPU development VM,
# differences of 2 ns and under needed 30-40 rounds to tell from noise; 16
# rounds once showed a 7 ns gain that 16 more did not reproduce.
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
    *) sed -n '2,12p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [[ $# -lt 2 || ( $what != pingpong && $what != msgrate && $what != bw ) ]]; then
  sed -n '2,12p' "$0"
  exit 2
fi
bins=("$@")
n=${#bins[@]}
out=$(mktemp /tmp/shmfab-ab.XXXXXX)
trap 'rm -f "$out"' EXIT
for ((r = 1; r <= rounds; r++)); do
  vals=()
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
  echo "${vals[*]}" >>"$out"
done
case $what in
  pingpong) unit="us (half round trip; lower is better)" ;;
  bw) unit="GB/s (streaming bandwidth; higher is better)" ;;
  *) unit="Mmsg/s (higher is better)" ;;
esac
echo "$what, $size B, $rounds paired rounds, in $unit"
for ((j = 0; j < n; j++)); do
  awk -v j=$((j + 1)) -v name="${bins[$j]}" -v lower=$([[ $what == pingpong ]] && echo 1 || echo 0) '
    { v[NR] = $j; d[NR] = $j - $1; s += $j - $1; if (lower ? $j < $1 : $j > $1) w++ }
    function median(a, m,   i, k, t, b) {
      for (i = 1; i <= m; i++) b[i] = a[i]
      for (i = 2; i <= m; i++) { t = b[i]; for (k = i - 1; k > 0 && b[k] > t; k--) b[k + 1] = b[k]; b[k + 1] = t }
      return m % 2 ? b[(m + 1) / 2] : (b[m / 2] + b[m / 2 + 1]) / 2
    }
    END {
      if (j == 1) { printf "%-36s median %.4f (base)\n", name, median(v, NR); exit }
      printf "%-36s median %.4f, paired difference median %+.4f, mean %+.4f, better in %d of %d\n",
        name, median(v, NR), median(d, NR), s / NR, w, NR
    }' "$out"
done
