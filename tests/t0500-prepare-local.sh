#!/usr/bin/env bash
# strata-prepare from local files: the tinycoder F16 GGUF (native and
# repacked), a 3-shard split set of it, the tiny preset offline; --verify
# naming a flipped byte; a missing shard, a full disk, a too small disk and
# an existing pack each refused with no usable-looking pack left.
. "$(dirname "$0")/lib.sh"
P="$STRATA_BIN/strata-prepare"
TOOL="$STRATA_BIN/../helpers/packtool"
M="$STRATA_FIXTURES/models/tinycoder-moe-F16.gguf"
export STRATA_PRESETS="$STRATA_ROOT/packs"
O="$T/out"

# flip one bit of byte OFF of FILE
flip() {
    local b
    b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
    printf "$(printf '\\%03o' $((b ^ 1)))" |
        dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}
json_num() { sed -n "s/^[[:space:]]*\"$2\":[[:space:]]*\([0-9.]*\),\{0,1\}$/\1/p" "$1" | head -1; }

# --- native from the F16 file ------------------------------------------------
"$P" --out "$O" --context 2048 "$M" >"$T/o1" 2>"$T/e1"; rc=$?
check "native pack from the F16 GGUF: exit 0" test $rc -eq 0
check "pack.json in tinycoder-moe-F16.strata" test -s "$O/tinycoder-moe-F16.strata/pack.json"
check "no partial directory left" test ! -e "$O/tinycoder-moe-F16.strata.partial"
check "native: no experts.bin" test ! -e "$O/tinycoder-moe-F16.strata/experts.bin"
check "plan printed before the work" grep -q '^plan for .*tinycoder-moe-F16.strata (native)' "$T/o1"
check "plan shows free disk" grep -q 'free disk in ' "$T/o1"
check "plan shows the kv cache at the chosen context" grep -q 'kv cache at context 2048' "$T/o1"
check "plan shows VRAM and RAM" grep -q '^  VRAM: at least' "$T/o1"
check "source recorded with its sha256" \
    grep -q "\"sha256\":[[:space:]]*\"$(sha256sum "$M" | cut -c1-64)\"" \
    "$O/tinycoder-moe-F16.strata/pack.json"
check "--verify passes" "$P" --verify "$O/tinycoder-moe-F16.strata"

# --- repacked, JSON summary ----------------------------------------------------
"$P" --out "$O" --name rp --repack --json "$M" >"$T/o2" 2>"$T/e2"; rc=$?
check "repacked pack: exit 0" test $rc -eq 0
check "experts.bin written" test -s "$O/rp.strata/experts.bin"
check "JSON summary names the pack" grep -q "\"pack\":[[:space:]]*\"$O/rp.strata\"" "$T/o2"
check "JSON summary says repacked" grep -q '"mode":[[:space:]]*"repacked"' "$T/o2"
eb=$(json_num "$T/o2" expert_bytes)
check "experts.bin holds every expert (>= expert_bytes $eb)" \
    test "$(stat -c %s "$O/rp.strata/experts.bin")" -ge "${eb:-999999999999}"
check "records are 4096-aligned" test $(($(stat -c %s "$O/rp.strata/experts.bin") % 4096)) -eq 0
check "--verify passes (repacked)" "$P" --verify "$O/rp.strata"
"$P" --verify "$O/rp.strata" --json >"$T/v" 2>/dev/null
check "--verify --json ok" grep -q '"ok":[[:space:]]*true' "$T/v"

# --- verify names the file with a flipped byte --------------------------------
flip "$O/rp.strata/experts.bin" 1000000
"$P" --verify "$O/rp.strata" >/dev/null 2>"$T/e3"; rc=$?
check "flipped byte in experts.bin: exit 3" test $rc -eq 3
check "message names experts.bin" grep -q "experts.bin': sha256 .* does not match" "$T/e3"
flip "$O/rp.strata/experts.bin" 1000000
check "--verify passes again once restored" "$P" --verify "$O/rp.strata"
cp "$O/rp.strata/pack.json" "$T/pack.json.bak"
sed -i '0,/"offset":[[:space:]]*[0-9]*/s//"offset": 7/' "$O/rp.strata/pack.json"
"$P" --verify "$O/rp.strata" >/dev/null 2>"$T/e4"; rc=$?
check "an index entry that does not match the GGUF: exit 3, tensor named" \
    sh -c "test $rc -eq 3 && grep -q \"index entry of tensor '.*' does not match\" '$T/e4'"
cp "$T/pack.json.bak" "$O/rp.strata/pack.json"
sed -i '0,/"record_size":[[:space:]]*[0-9]*/s//"record_size": 4096/' "$O/rp.strata/pack.json"
"$P" --verify "$O/rp.strata" >/dev/null 2>"$T/e4b"; rc=$?
check "a tampered expert record size: exit 3, layer named" \
    sh -c "test $rc -eq 3 && grep -q 'expert index of layer 0 does not match' '$T/e4b'"
cp "$T/pack.json.bak" "$O/rp.strata/pack.json"
echo '{"format": "strata-pack", "version": 1,' >"$O/rp.strata/pack.json"
"$P" --verify "$O/rp.strata" >/dev/null 2>"$T/e4c"; rc=$?
check "a pack.json that is not JSON: exit 3" \
    sh -c "test $rc -eq 3 && grep -q 'pack.json. is not a strata pack description' '$T/e4c'"
cp "$T/pack.json.bak" "$O/rp.strata/pack.json"
mv "$O/rp.strata/experts.bin" "$T/eb"
"$P" --verify "$O/rp.strata" >/dev/null 2>"$T/e4d"; rc=$?
check "a missing experts.bin: exit 3, named" \
    sh -c "test $rc -eq 3 && grep -q \"missing file '.*rp.strata/experts.bin'\" '$T/e4d'"
mv "$T/eb" "$O/rp.strata/experts.bin"
check "--verify passes once everything is back" "$P" --verify "$O/rp.strata"

# --- 3-shard split set -------------------------------------------------------------
mkdir -p "$T/split"
check "3-shard split set made" "$TOOL" split "$M" 3 "$T/split/tc"
"$P" --out "$O" --repack "$T/split/tc-00001-of-00003.gguf" >"$T/o5" 2>"$T/e5"; rc=$?
check "pack from the split set: exit 0" test $rc -eq 0
check "named after the set" test -s "$O/tc.strata/pack.json"
check "three model sources recorded" test "$(grep -c '"role":[[:space:]]*"model"' "$O/tc.strata/pack.json")" -eq 3
check "split pack verifies" "$P" --verify "$O/tc.strata"
flip "$T/split/tc-00002-of-00003.gguf" 4000000
"$P" --verify "$O/tc.strata" >/dev/null 2>"$T/e6"; rc=$?
check "flipped byte in shard 2: exit 3" test $rc -eq 3
check "message names shard 2" grep -q "tc-00002-of-00003.gguf': sha256" "$T/e6"
flip "$T/split/tc-00002-of-00003.gguf" 4000000

mv "$T/split/tc-00003-of-00003.gguf" "$T/shard3"
"$P" --out "$O" --name nosh "$T/split/tc-00001-of-00003.gguf" >/dev/null 2>"$T/e7"; rc=$?
check "missing shard: exit 3" test $rc -eq 3
check "message names the missing shard" grep -q 'tc-00003-of-00003.gguf' "$T/e7"
check "missing shard: no pack, no partial" test ! -e "$O/nosh.strata" -a ! -e "$O/nosh.strata.partial"
"$P" --verify "$O/tc.strata" >/dev/null 2>"$T/e8"; rc=$?
check "verify of a pack with a missing shard fails and names it" \
    sh -c "test $rc -ne 0 && grep -q 'tc-00003-of-00003.gguf' '$T/e8'"
mv "$T/shard3" "$T/split/tc-00003-of-00003.gguf"

# --- existing pack, --force ----------------------------------------------------
before=$(stat -c %Y "$O/rp.strata/pack.json")
"$P" --out "$O" --name rp "$M" >/dev/null 2>"$T/e9"; rc=$?
check "existing pack without --force: exit 2" test $rc -eq 2
check "message says it exists" grep -q "rp.strata' already exists (use --force" "$T/e9"
check "existing pack untouched" test -e "$O/rp.strata/experts.bin"
"$P" --out "$O" --name rp --force "$M" >/dev/null 2>&1; rc=$?
check "--force replaces it (now native)" sh -c "test $rc -eq 0 && test ! -e '$O/rp.strata/experts.bin'"

# --- full disk while writing experts.bin (injected ENOSPC) -----------------------
STRATA_FAULT_ENOSPC_AT=2000000 "$P" --out "$O" --name full --repack "$M" >/dev/null 2>"$T/e10"
rc=$?
check "full disk: exit 1" test $rc -eq 1
check "full disk: message" grep -q 'experts.bin.tmp.: No space left on device' "$T/e10"
check "full disk: no pack, no pack.json anywhere" \
    sh -c "test ! -e '$O/full.strata' && ! ls '$O'/full.strata.partial/pack.json 2>/dev/null"

# --- disk too small for the plan ------------------------------------------------------
STRATA_TEST_FREE_BYTES=1000000 "$P" --out "$O" --name small --repack "$M" >"$T/o11" 2>"$T/e11"
rc=$?
check "small disk refused: exit 1" test $rc -eq 1
check "refusal gives the numbers" grep -q 'not enough disk space in .*: the pack needs .* bytes), .* (1000000 bytes) free' "$T/e11"
check "small disk: nothing created" test ! -e "$O/small.strata" -a ! -e "$O/small.strata.partial"

# --- --plan only ------------------------------------------------------------------------
"$P" --out "$O" --name planonly --repack --context 8192 --plan "$M" >"$T/o11b" 2>&1; rc=$?
check "--plan: exit 0, plan printed" sh -c "test $rc -eq 0 && grep -q 'kv cache at context 8192' '$T/o11b'"
check "--plan: nothing created" test ! -e "$O/planonly.strata" -a ! -e "$O/planonly.strata.partial"

# --- presets offline ---------------------------------------------------------------
"$P" --list >"$T/o12" 2>&1; rc=$?
check "--list: exit 0" test $rc -eq 0
for fam in coder-30b coder-480b qwen3-30b qwen3-235b deepseek-v3.1 glm-4.5-air gpt-oss-120b tiny; do
    check "--list shows $fam" grep -q "^$fam " "$T/o12"
done
"$P" --list --json >"$T/o13" 2>&1
check "--list --json lists tiny Q4_K_M" grep -q '"model":[[:space:]]*"Q4_K_M"' "$T/o13"
"$P" --family tiny --model Q4_K_M --offline --out "$O" >"$T/o14" 2>"$T/e14"; rc=$?
check "--family tiny --model Q4_K_M --offline: exit 0" test $rc -eq 0
check "tiny pack verifies" "$P" --verify "$O/tiny-Q4_K_M.strata"
"$P" --family tiny --model Q4_K_M --vision yes --name tv --offline --out "$O" >/dev/null 2>&1
check "--vision yes records the mmproj" grep -q '"role":[[:space:]]*"mmproj"' "$O/tv.strata/pack.json"
"$P" --family tiny --model Q5_X --offline --out "$O" >/dev/null 2>"$T/e15"; rc=$?
check "unknown model: exit 2, lists the available ones" \
    sh -c "test $rc -eq 2 && grep -q 'available: F16, Q8_0, Q4_K_M' '$T/e15'"
"$P" --family nope --out "$O" >/dev/null 2>"$T/e16"; rc=$?
check "unknown family: exit 2" sh -c "test $rc -eq 2 && grep -q \"no preset for family 'nope'\" '$T/e16'"
"$P" --model Q4_K_M "$M" >/dev/null 2>"$T/e17"; rc=$?
check "--model without --family: exit 2" sh -c "test $rc -eq 2 && grep -q 'needs --family' '$T/e17'"
"$P" --context abc "$M" >/dev/null 2>&1; rc=$?
check "bad --context: exit 2" test $rc -eq 2
"$P" --low-ram maybe "$M" >/dev/null 2>&1; rc=$?
check "bad --low-ram: exit 2" test $rc -eq 2

done_testing
