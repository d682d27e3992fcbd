#!/usr/bin/env bash
# strata-prepare --synth: a synthetic model written whole (or not at all), of the
# shape, layers and type asked, that strata-prepare inspects and strata-generate runs;
# bad specifications and an existing file refused.
. "$(dirname "$0")/lib.sh"
P="$STRATA_BIN/strata-prepare"
G="$STRATA_BIN/strata-generate"

"$P" --synth qwen3-moe-tiny:2:Q8_0 "$T/s.gguf" >"$T/out" 2>"$T/err"; rc=$?
check "--synth qwen3-moe-tiny:2:Q8_0: exit 0" test $rc -eq 0
check "it says what it wrote" grep -q 'synthetic qwen3-moe-tiny, 2 layers, Q8_0' "$T/out"
check "no .part left" test ! -e "$T/s.gguf.part"
"$P" --inspect "$T/s.gguf" >"$T/insp" 2>&1
check "the file: qwen3moe, 2 layers" \
    bash -c "grep -qx \"  general.architecture: string = 'qwen3moe'\" '$T/insp' &&
             grep -qx '  qwen3moe.block_count: u32 = 2' '$T/insp'"
check "the file: Q8_0 weights and a 512-token vocabulary" \
    bash -c "grep -q ': blk\.0\.attn_q\.weight Q8_0 ' '$T/insp' &&
             grep -q 'tokenizer.ggml.tokens: array\[string; 512\]' '$T/insp'"
"$G" -m "$T/s.gguf" -p "hello" -n 4 --temp 0 --json -t 2 >"$T/gen" 2>"$T/generr"; rc=$?
check "strata-generate runs it: exit 0, 4 tokens" \
    bash -c "test $rc -eq 0 && grep -q '\"n_gen\":4' '$T/gen'"

"$P" --synth qwen3-moe-tiny:2:Q8_0 "$T/s.gguf" >/dev/null 2>"$T/err"; rc=$?
check "an existing file: exit 2, named" bash -c "test $rc -eq 2 && grep -q \"'$T/s.gguf' exists\" '$T/err'"
"$P" --synth llama-tiny:1 --force "$T/s.gguf" >/dev/null 2>&1; rc=$?
"$P" --inspect "$T/s.gguf" >"$T/insp2" 2>&1
check "--force replaces it (llama, 1 layer, Q4_K_M's Q4_K)" \
    bash -c "test $rc -eq 0 && grep -qx '  llama.block_count: u32 = 1' '$T/insp2' &&
             grep -q ': blk\.0\.attn_q\.weight Q4_K ' '$T/insp2'"
for bad in "nope" "qwen3-moe-tiny:0" "qwen3-moe-tiny:2:Q9_X" "qwen3-moe-tiny:2:" ":3" "qwen3-moe-tiny:x"; do
    "$P" --synth "$bad" "$T/b.gguf" >/dev/null 2>"$T/err"; rc=$?
    check "--synth '$bad': exit 2 with a message, no file" \
        bash -c "test $rc -eq 2 && test -s '$T/err' && test ! -e '$T/b.gguf' && test ! -e '$T/b.gguf.part'"
done
"$P" --synth qwen3-30b-a3b:1000 "$T/big.gguf" >/dev/null 2>"$T/err"; rc=$?
check "a model larger than the RAM available (1,000 layers, about 350 GiB): refused, no file" \
    bash -c "test $rc -eq 2 && grep -q 'GiB of RAM is available' '$T/err' && test ! -e '$T/big.gguf' &&
             test ! -e '$T/big.gguf.part'"
"$P" --synth qwen3-moe-tiny >/dev/null 2>"$T/err"; rc=$?
check "--synth without a file: exit 2" test $rc -eq 2
"$P" --synth qwen3-moe-tiny "$T/c.gguf" "$T/d.gguf" >/dev/null 2>"$T/err"; rc=$?
check "--synth with two files: exit 2" test $rc -eq 2
"$P" --synth qwen3-moe-tiny "$T/nodir/x.gguf" >/dev/null 2>"$T/err"; rc=$?
check "--synth into a missing directory: an error naming the path, no file" \
    bash -c "test $rc -ne 0 && grep -q 'nodir' '$T/err' && test ! -e '$T/nodir'"
done_testing
