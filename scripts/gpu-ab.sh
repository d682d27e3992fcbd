#!/bin/bash
# gpu-ab.sh - settings side by side on a GPU machine, each in its own process, the
# settings alternating round by round (machines and processes differ by a few per cent,
# so only the figures of one call compare):
#
#   scripts/gpu-ab.sh DIR ROUNDS SETTING...   a SETTING is VAR=VALUE[,VAR=VALUE...], or -
#                                             for none; an item starting with -- is an
#                                             option of bench_gpu (e.g. --argmax), @NAME
#                                             runs DIR/NAME instead of DIR/bench_gpu
#                                             (another build); it runs with $AB_ARGS too
#                                             (default --tg 128 --reps 3)
#
# Prints one line per process (round, setting, the benchmark's pp and tg lines), then
# each setting's median tg.
set -u
d=$1 rounds=$2
shift 2
out=${OUT:-/tmp/strata-ab}
mkdir -p "$out"
: > "$out/ab.txt"
for r in $(seq "$rounds"); do
    for v in "$@"; do
        line=$(
            opts=() bin=bench_gpu
            [ "$v" != - ] && for e in ${v//,/ }; do
                case $e in --*) opts+=("$e") ;; @*) bin=${e#@} ;; *) export "$e" ;; esac
            done
            # shellcheck disable=SC2086
            timeout 200 "$d/$bin" ${AB_ARGS:---tg 128 --reps 3} ${opts[@]+"${opts[@]}"} 2>&1 |
                grep -E '^(pp|tg)[0-9]' | sed -e 's/ (argmax)//' -e 's/ (copy)//' -e 's| tok/s.*| tok/s|' | tr '\n' ' ')
        echo "$r $v $line" | tee -a "$out/ab.txt"
    done
done
echo "median tg by setting:"
for v in "$@"; do
    awk -v v="$v" '$2 == v { for (i = 3; i <= NF; i++) if ($i ~ /^tg/) print $(i + 1) }' "$out/ab.txt" |
        sort -n | awk -v v="$v" '{ a[NR] = $1 } END { if (NR) printf "%-60s %s (n=%d, %s..%s)\n", v, a[int((NR + 1) / 2)], NR, a[1], a[NR] }'
done
