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
    --out "$T/packs2" --run-dir "$T/cuda" >/dev/null 2>&1; rc=$?
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
for p in nat rep tc; do
    gen "$T/p/$p.strata" >"$T/$p"
    check "same greedy text from the $p pack" cmp -s "$T/ref" "$T/$p"
done
# mixed block types (the IQ1_M file also holds IQ2_XXS, Q2_K, Q4_K ... experts)
Q="$STRATA_FIXTURES/models/tinycoder-moe-IQ1_M.gguf"
"$P" --out "$T/p" --name iq --repack "$Q" >/dev/null 2>&1
gen "$Q" >"$T/iqref"
gen "$T/p/iq.strata" >"$T/iq"
check "same greedy text from a repacked IQ1_M pack (mixed types)" \
    sh -c "test -s '$T/iqref' && cmp -s '$T/iqref' '$T/iq'"
# the repacked pack really reads experts.bin: zeroed experts change the text
cp -r "$T/p/rep.strata" "$T/p/zero.strata"
n=$(stat -c %s "$T/p/zero.strata/experts.bin")
truncate -s 0 "$T/p/zero.strata/experts.bin" && truncate -s "$n" "$T/p/zero.strata/experts.bin"
gen "$T/p/zero.strata" >"$T/zero"
check "a repacked pack computes with experts.bin's bytes" sh -c "! cmp -s '$T/ref' '$T/zero'"
# the run script starts strata-serve (or, unbuilt, strata-generate) on its pack
runpack=$(sed -n 's/^exec "[^"]*" -m "\([^"]*\)".*/\1/p' "$T/run-tiny-F16.sh")
check "run script names its pack by absolute path" test "$runpack" = "$T/packs/tiny-F16.strata"
gen "$runpack" >"$T/run"
check "the run script's pack generates the same text" cmp -s "$T/ref" "$T/run"

done_testing
