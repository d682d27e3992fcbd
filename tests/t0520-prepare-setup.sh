#!/usr/bin/env bash
# scripts/setup.sh with the tiny preset, offline, without building: the pack
# and the run script; then the same greedy text from the GGUF, from a native
# pack and from a repacked pack (GGUF, split set and the run script).
. "$(dirname "$0")/lib.sh"
P="$STRATA_BIN/strata-prepare"
G="$STRATA_BIN/strata-generate"
TOOL="$STRATA_BIN/../helpers/packtool"
M="$STRATA_FIXTURES/models/tinycoder-moe-F16.gguf"
export STRATA_PRESETS="$STRATA_ROOT/packs"

S="$STRATA_ROOT/scripts/setup.sh"
"$S" --backend cpu --family tiny --model F16 --context 256 --offline --no-build \
    --out "$T/packs" --run-dir "$T" >"$T/o1" 2>"$T/e1"; rc=$?
check "setup.sh: exit 0" test $rc -eq 0
check "setup.sh: pack made" test -s "$T/packs/tiny-F16.strata/pack.json"
check "setup.sh: CPU gets a native pack" test ! -e "$T/packs/tiny-F16.strata/experts.bin"
check "setup.sh: run script written and executable" test -x "$T/run-tiny-F16.sh"
check "run script starts a program on the pack with the backend and context" \
    grep -q "\"-m\" \"$T/packs/tiny-F16.strata\" --backend cpu --ctx 256\|-m \"$T/packs/tiny-F16.strata\" --backend cpu --ctx 256" "$T/run-tiny-F16.sh"
"$S" --backend vulkan --family tiny --model F16 --no-build >/dev/null 2>"$T/e2"; rc=$?
check "setup.sh: unknown backend refused: exit 2" sh -c "test $rc -eq 2 && grep -q 'cpu, cuda or hip' '$T/e2'"
"$S" --backend cuda --family tiny --model F16 --context 256 --offline --no-build \
    --out "$T/packs2" --run-dir "$T" >/dev/null 2>&1; rc=$?
check "setup.sh --backend cuda: repacked pack (the expert cache reads records)" \
    sh -c "test $rc -eq 0 && test -s '$T/packs2/tiny-F16.strata/experts.bin'"

# --- same greedy text from the GGUF and from packs -------------------------------
"$P" --out "$T/p" --name nat "$M" >/dev/null 2>&1
"$P" --out "$T/p" --name rep --repack "$M" >/dev/null 2>&1
mkdir -p "$T/split"
"$TOOL" split "$M" 3 "$T/split/tc" && "$P" --out "$T/p" --repack "$T/split/tc-00001-of-00003.gguf" >/dev/null 2>&1
gen() { "$G" -m "$1" -p "def fibonacci(n):" -n 24 --temp 0 -t 2 --ctx 256 2>"$T/gen.err"; }
gen "$M" >"$T/ref"
check "reference text from the GGUF" test -s "$T/ref"
todo=""
gen "$T/p/nat.strata" >"$T/nat" || todo=" # TODO strata-generate does not open packs yet"
for p in nat rep tc; do
    gen "$T/p/$p.strata" >"$T/$p" 2>/dev/null
    if cmp -s "$T/ref" "$T/$p"; then
        _tap_n=$((_tap_n + 1)); echo "ok $_tap_n - same greedy text from the $p pack$todo"
    else
        _tap_n=$((_tap_n + 1)); echo "not ok $_tap_n - same greedy text from the $p pack$todo"
        [ -z "$todo" ] && _tap_failed=$((_tap_failed + 1))
    fi
done
"$T/run-tiny-F16.sh" -p "def fibonacci(n):" -n 24 --temp 0 -t 2 >"$T/run" 2>/dev/null
if cmp -s "$T/ref" "$T/run"; then
    _tap_n=$((_tap_n + 1)); echo "ok $_tap_n - the run script generates the same text$todo"
else
    _tap_n=$((_tap_n + 1)); echo "not ok $_tap_n - the run script generates the same text$todo"
    [ -z "$todo" ] && _tap_failed=$((_tap_failed + 1))
fi

done_testing
