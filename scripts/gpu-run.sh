#!/bin/sh
# gpu-run.sh - run the prebuilt GPU tests and benchmarks in DIR (default devrun/) on a
# GPU machine, writing logs under $OUT (default ./gpu-out).  Used to batch a whole
# device session into one command: builds happen elsewhere, this only runs.
#   scripts/gpu-run.sh [DIR] [what...]   what: tests bench golden (default: all present)
set -u
dir=${1:-devrun}
[ $# -gt 0 ] && shift
out=${OUT:-./gpu-out}
mkdir -p "$out"
what=${*:-tests bench golden}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv \
    > "$out/nvidia-smi.txt" 2>&1 || true
cat "$out/nvidia-smi.txt"
rc=0
for w in $what; do
    case $w in
    tests)
        for t in "$dir"/test_*; do
            [ -x "$t" ] || continue
            echo "== $t"
            STRATA_FIXTURES=$dir/fixtures "$t" > "$out/$(basename "$t").tap" 2>&1
            r=$?
            grep -E '^not ok|^Bail|^# ' "$out/$(basename "$t").tap" | head -40
            echo "$(grep -c '^ok' "$out/$(basename "$t").tap") ok, $(grep -c '^not ok' "$out/$(basename "$t").tap") not ok, exit $r"
            [ $r = 0 ] || rc=1
        done ;;
    bench)
        for b in "$dir"/bench_*; do
            [ -x "$b" ] || continue
            echo "== $b"
            "$b" "$dir" > "$out/$(basename "$b").txt" 2>&1 || rc=1
            tail -40 "$out/$(basename "$b").txt"
        done ;;
    golden)
        [ -x "$dir/golden.sh" ] && { "$dir/golden.sh" "$dir" > "$out/golden.txt" 2>&1 || rc=1; tail -40 "$out/golden.txt"; } ;;
    esac
done
exit $rc
