#!/usr/bin/env bash
# The GPU kernel self-test at start-up: --no-selftest is accepted everywhere (a CPU
# build has nothing to test, so it changes nothing), strata-serve passes it to its
# engines, and the CPU backend never runs the self-test.  The refusal of a failing
# device is tested on a GPU machine (tests/gpu, make check-gpu).
. "$(dirname "$0")/lib.sh"
G="$STRATA_BIN/strata-generate"
M="$STRATA_FIXTURES/models/stories260K.gguf"

check "--help lists --no-selftest" grep -q -- '--no-selftest' <<<"$("$G" --help)"
"$G" -m "$M" -p "Once upon a time" -n 4 --temp 0 -t 2 >"$T/a" 2>"$T/ea"; rc1=$?
"$G" -m "$M" -p "Once upon a time" -n 4 --temp 0 -t 2 --no-selftest >"$T/b" 2>"$T/eb"; rc2=$?
check "--no-selftest accepted: exit 0" test $rc1 -eq 0 -a $rc2 -eq 0
check "--no-selftest: same text" cmp -s "$T/a" "$T/b"
check "CPU backend: no self-test message" bash -c "! grep -q 'self-test' '$T/ea'"
"$G" -m "$M" -p "Once" -n 2 --temp 0 -t 2 --backend auto --no-selftest >"$T/c" 2>"$T/ec"; rc=$?
check "--backend auto --no-selftest: exit 0" test $rc -eq 0

echo '{"type":"shutdown"}' | "$G" -m "$M" --serve-stdio --no-selftest -t 2 >"$T/ev" 2>"$T/es"
rc=$?
check "--serve-stdio --no-selftest: exit 0" test $rc -eq 0
check "--serve-stdio --no-selftest: ready" grep -q '"type":"ready"' "$T/ev"
check "--serve-stdio: no error event" bash -c "! grep -q '\"type\":\"error\"' '$T/ev'"

check "strata-serve --help lists --no-selftest" \
    grep -q -- '--no-selftest' <<<"$("$STRATA_BIN/strata-serve" --help)"
done_testing
