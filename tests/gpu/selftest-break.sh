#!/usr/bin/env bash
# A kernel broken on purpose is reported as failed, with its name, within 5 s, and
# strata-generate refuses the device (GPU machine; builds three test variants):
#   tests/gpu/selftest-break.sh [KERNEL]       (default rms_norm)
# Each build goes to its own directory, so the normal build is untouched.
# STRATA_BREAK_BUILT=DIR uses variants built beforehand instead (DIR/KERNEL-MODE/bin/cuda/,
# as `make B=DIR/KERNEL-MODE BINDIR=DIR/KERNEL-MODE/bin STRATA_BREAK_KERNEL=.. cuda` makes
# them), so a GPU machine need not compile.
set -u
K=${1:-rms_norm}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
M=${STRATA_FIXTURES:-$ROOT/../shared/fixtures}/models/stories260K.gguf
n=0 bad=0
check() { n=$((n + 1)); local d=$1; shift; if "$@"; then echo "ok $n - $d"; else echo "not ok $n - $d"; bad=1; fi; }
for mode in wrong fault hang; do
    if [ -n "${STRATA_BREAK_BUILT:-}" ]; then
        B=$STRATA_BREAK_BUILT/$K-$mode
        [ -x "$B/bin/cuda/strata-probe" ] || { echo "Bail out! no $B/bin/cuda/strata-probe"; exit 1; }
    else
        B=/tmp/strata-break-$K-$mode
        make -C "$ROOT" -s B="$B" BINDIR="$B/bin" STRATA_BREAK_KERNEL="$K" STRATA_BREAK_MODE="$mode" \
            "$B/bin/cuda/strata-probe" "$B/bin/cuda/strata-generate" >"$B.log" 2>&1 ||
            { echo "Bail out! build of $mode failed (see $B.log)"; exit 1; }
    fi
    t0=$(date +%s.%N)
    "$B/bin/cuda/strata-probe" --quick --json --selftest-timeout 2000 >"$B.json" 2>&1; rc=$?
    t1=$(date +%s.%N)
    s=$(python3 -c "print(round($t1 - $t0, 2))")
    check "$mode: probe exits 4" test $rc -eq 4
    check "$mode: $K reported failed" python3 -c "
import json,sys
j=json.load(open('$B.json'))
d=j['devices'][0]
f=[k for k in d['selftest'] if not k['pass']]
print('#', d['status'], d['reason'][:200], file=sys.stderr)
sys.exit(0 if f and all(k['kernel'].startswith('$K') for k in f) and d['status']=='failed' else 1)"
    echo "# $mode: probe took $s s"
    check "$mode: reported within 5 s (probe with --quick: $s s)" \
        python3 -c "import sys; sys.exit(0 if $s < 5 else 1)"
    "$B/bin/cuda/strata-generate" -m "$M" --backend cuda -p hi -n 2 >/dev/null 2>"$B.gen"; rc=$?
    check "$mode: strata-generate refuses the device (exit 4, names $K)" \
        bash -c "test $rc -eq 4 && grep -q 'self-test failed.*$K' '$B.gen'"
    echo '{"type":"shutdown"}' | "$B/bin/cuda/strata-generate" -m "$M" --backend cuda \
        --serve-stdio >"$B.ev" 2>/dev/null
    check "$mode: --serve-stdio sends an error event" grep -q '"type":"error","code":"gpu"' "$B.ev"
    "$B/bin/cuda/strata-generate" -m "$M" --backend cuda -p hi -n 2 --no-selftest \
        >/dev/null 2>&1; rc=$?
    check "$mode: --no-selftest skips it (the break is in the self-test only)" test $rc -eq 0
done
echo "1..$n"
exit $bad
