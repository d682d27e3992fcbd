#!/usr/bin/env bash
# strata-generate: the expert cache's memory plan (--plan-only with a VRAM
# budget), its option errors, and --save-profile's routing counts.
. "$(dirname "$0")/lib.sh"
G="$STRATA_BIN/strata-generate"
M="$STRATA_FIXTURES/models/tinycoder-moe-Q4_K_M.gguf"

"$G" -m "$M" --plan-only --vram-budget-mib 128 -c 512 >"$T/out" 2>"$T/err"; rc=$?
check "plan: exit 0" test $rc -eq 0
check "plan: nothing on stdout" test ! -s "$T/out"
check "plan: dense, kv, cache lines" \
    bash -c "grep -q 'dense weights' '$T/err' && grep -q 'kv cache' '$T/err' && grep -q 'expert cache' '$T/err'"
check "plan: 128 MiB holds every expert" grep -q 'expert cache .*(\([0-9]*\) of \1 experts' "$T/err"
check "plan: fill line" grep -q "filling the GPU's expert cache ([0-9]* experts" "$T/err"
"$G" -m "$M" --plan-only --vram-budget-mib 84 -c 512 2>"$T/err6"; rc=$?
check "plan: 84 MiB holds only part of the experts" \
    bash -c "test $rc -eq 0 && ! grep -q 'expert cache .*(\([0-9]*\) of \1 experts' '$T/err6'"
"$G" -m "$M" --plan-only --vram-budget-mib 1 -c 512 2>"$T/err1"; rc=$?
check "plan: 1 MiB too small, fails naming the shortfall" \
    bash -c "test $rc -ne 0 && grep -q 'MiB short' '$T/err1'"
"$G" -m "$M" --plan-only 2>"$T/errn"; rc=$?
check "plan without a budget in a CPU build: usage error" \
    bash -c "test $rc -eq 2 && grep -q 'vram-budget-mib' '$T/errn'"
"$G" -m "$M" --pcie-frac 1.5 -p x -n 1 2>"$T/errf" >/dev/null; rc=$?
check "--pcie-frac 1.5: exit 2, named" bash -c "test $rc -eq 2 && grep -q \"pcie-frac '1.5'\" '$T/errf'"
"$G" -m "$M" --adapt-every -1 -p x -n 1 2>/dev/null >/dev/null; rc=$?
check "--adapt-every -1: exit 2" test $rc -eq 2

# the flags are accepted by the CPU engine; the profile counts the routing
"$G" -m "$M" -p "def add(a, b):" -n 4 --temp 0 -t 2 --pcie-frac auto --adapt-every 8 \
    --pool-workers 2 --vram-reserve-mib 100 --save-profile "$T/prof.json" >"$T/txt" 2>"$T/errp"
rc=$?
check "--save-profile run: exit 0" test $rc -eq 0
check "profile: format and shape" \
    bash -c "grep -q '\"format\":\"strata-routing-profile\"' '$T/prof.json' && grep -q '\"n_expert\":' '$T/prof.json'"
check "profile: counts are not all zero" grep -q '"counts":\[\[[0-9,]*[1-9]' "$T/prof.json"
"$G" -m "$M" -p "def add(a, b):" -n 4 --temp 0 -t 2 >"$T/txt0" 2>/dev/null
check "the flags do not change the CPU output" cmp "$T/txt" "$T/txt0"
done_testing
