#!/bin/bash
# gpu-run.sh - run the GPU tests and benchmarks packed by gpu-devrun.sh on a GPU
# machine; logs go under $OUT (default ./gpu-out), a summary to stdout.
#   scripts/gpu-run.sh [tests] [golden] [bench] [bench-args...]
set -u
root=$(pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
st=/tmp/strata-dev
rm -rf "$st" && mkdir -p "$st" && tar -C "$st" -xJf devrun/bin.tar.xz || exit 1
export LD_LIBRARY_PATH=$st/lib STRATA_BIN=$st/bin STRATA_ROOT=$root
export STRATA_FIXTURES=$root/devrun/fixtures STRATA_BACKEND=${STRATA_BACKEND:-cuda}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>&1
what=${1:-all}
rc=0
tap() { # name command...
    local n=$1
    shift
    local s=$SECONDS
    "$@" > "$out/$n.tap" 2>&1
    local r=$?
    grep -E '^not ok|^Bail|^# ' "$out/$n.tap" | head -30
    echo "== $n: $(grep -c '^ok' "$out/$n.tap") ok, $(grep -c '^not ok' "$out/$n.tap") not ok, exit $r, $((SECONDS - s)) s"
    [ $r = 0 ] || rc=1
}
case " $* " in *" tests "*|" all ") tap kernels "$st/bin/test_kernels" ;; esac
case " $* " in *" golden "*|" all ")
    tap golden "$st/bin/test_golden"
    for t in tests/gpu/t*.sh; do tap "$(basename "$t" .sh)" bash "$t"; done ;;
esac
case " $* " in *" bench "*|" all ")
    shift_args=$(echo " $* " | sed 's/ tests / /; s/ golden / /; s/ bench / /; s/ all / /')
    # shellcheck disable=SC2086
    "$st/bin/bench_gpu" $shift_args 2>&1 | tee "$out/bench.txt" | tail -8 ;;
esac
exit $rc
