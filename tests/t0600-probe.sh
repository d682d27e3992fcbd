#!/usr/bin/env bash
# strata-probe: options, the no-GPU report, exit codes on injected faults.
. "$(dirname "$0")/lib.sh"
P="$STRATA_BIN/strata-probe"

out=$("$P" --help); rc=$?
check "--help exits 0" test $rc -eq 0
check "--help shows usage" grep -q '^usage: strata-probe' <<<"$out"

"$P" --bogus >/dev/null 2>"$T/err"; rc=$?
check "unknown option exits 2" test $rc -eq 2
check "unknown option: usage on stderr" grep -q 'usage:' "$T/err"

"$P" --timeout abc >/dev/null 2>"$T/err"; rc=$?
check "bad --timeout exits 2" test $rc -eq 2
check "bad --timeout named" grep -q "invalid --timeout 'abc'" "$T/err"

STRATA_PROBE_INJECT=no-runtime "$P" --quick >"$T/out" 2>&1; rc=$?
check "no GPU runtime: exit 0 (CPU backend)" test $rc -eq 0
check "no GPU runtime: CPU section" grep -q '^CPU' "$T/out"
check "no GPU runtime: simd line" grep -q '  simd:' "$T/out"
check "no GPU runtime: verdict says CPU backend" grep -q 'CPU backend will be used' "$T/out"

STRATA_PROBE_INJECT=no-runtime "$P" --quick --json >"$T/json" 2>&1; rc=$?
check "--json exit 0" test $rc -eq 0
check "--json schema" grep -q '"schema":[[:space:]]*"strata-probe/1"' "$T/json"
check "--json backend cpu" grep -q '"backend":[[:space:]]*"cpu"' "$T/json"

STRATA_PROBE_INJECT=fake-cuda "$P" --quick >"$T/out" 2>&1; rc=$?
check "GPU present, no kernels in this build: exit 4" test $rc -eq 4
check "unsupported device explained" grep -q "unsupported: this build has no CUDA kernels" "$T/out"

STRATA_PROBE_INJECT=hang timeout 30 "$P" --quick --timeout 1000 >"$T/out" 2>&1; rc=$?
check "hung runtime: no hang, exit 4" test $rc -eq 4
check "hung runtime: watchdog message" grep -q 'did not finish within 1000 ms' "$T/out"

STRATA_PROBE_INJECT=crash timeout 30 "$P" --quick >"$T/out" 2>&1; rc=$?
check "crashing runtime: exit 4" test $rc -eq 4
check "crashing runtime reported" grep -q 'GPU runtime query crashed' "$T/out"

"$P" --selftest-timeout 0 >/dev/null 2>"$T/err"; rc=$?
check "bad --selftest-timeout exits 2" test $rc -eq 2
check "bad --selftest-timeout named" grep -q "invalid --selftest-timeout '0'" "$T/err"

STRATA_PROBE_INJECT=no-runtime "$P" --quick --no-selftest --json >"$T/json" 2>&1; rc=$?
check "--no-selftest accepted: exit 0" test $rc -eq 0
check "--no-selftest: JSON says skipped" grep -q '"reason":[[:space:]]*"skipped (--no-selftest)"' "$T/json"
STRATA_PROBE_INJECT=no-runtime "$P" --quick --json >"$T/json" 2>&1
if grep -q '"backends":[[:space:]]*"cpu"' "$T/json"; then
    check "CPU build: JSON says the self-test was not run and why" \
        grep -q '"reason":[[:space:]]*"this build has no GPU kernels' "$T/json"
fi
STRATA_PROBE_INJECT=fake-cuda,selftest-fail "$P" --quick >"$T/out" 2>&1; rc=$?
check "fake device without kernels: self-test not run, exit 4" test $rc -eq 4
check "report has a selftest line" grep -q '    selftest: not run' "$T/out"

"$P" --quick >"$T/out" 2>&1; rc=$?
check "real run on this machine does not fail" test $rc -eq 0 -o $rc -eq 4
done_testing
