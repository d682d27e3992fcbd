#!/usr/bin/env bash
# strata-prepare --inspect: the text dump of tinycoder F16 against facts about
# the file (its size, the fixture README, gguf-py's offsets in ref/dequant).
. "$(dirname "$0")/lib.sh"
P="$STRATA_BIN/strata-prepare"
M="$STRATA_FIXTURES/models/tinycoder-moe-F16.gguf"

"$P" --inspect "$M" >"$T/out" 2>"$T/err"; rc=$?
check "--inspect exits 0" test $rc -eq 0
check "nothing on stderr" test ! -s "$T/err"
check "header: version 3" grep -qx 'version: 3' "$T/out"
check "header: 51 tensors" grep -qx 'tensors: 51' "$T/out"
check "general.architecture = qwen3moe" grep -qx "  general.architecture: string = 'qwen3moe'" "$T/out"
check "qwen3moe.expert_count = 16" grep -qx '  qwen3moe.expert_count: u32 = 16' "$T/out"
check "qwen3moe.expert_used_count = 4" grep -qx '  qwen3moe.expert_used_count: u32 = 4' "$T/out"
check "long arrays summarised" \
    grep -q "^  tokenizer.ggml.tokens: array\[string; 4096\] = \['<|endoftext|>', .*\.\.\. (4088 more)\]$" "$T/out"

# tensor lines: "  I: NAME TYPE [ne...] BYTES bytes @ OFFSET (shard S)"
grep -E '^  [0-9]+: ' "$T/out" | grep ' bytes @ ' >"$T/tensors"
check "51 tensor lines" test "$(wc -l <"$T/tensors")" -eq 51
for l in 0 1 2 3; do
    check "layer $l has 12 tensors" test "$(grep -c ": blk\.$l\." "$T/tensors")" -eq 12
done
check "blk.0.ffn_down_exps.weight F16 [256, 256, 16]" \
    grep -q ': blk\.0\.ffn_down_exps\.weight F16 \[256, 256, 16\] 2097152 bytes @ ' "$T/tensors"
check "token_embd.weight F16 [256, 4096] (hidden 256, vocab 4096)" \
    grep -q ': token_embd\.weight F16 \[256, 4096\] 2097152 bytes' "$T/tensors"
check "attn_k [256, 64] (2 kv heads of 32)" \
    grep -q ': blk\.2\.attn_k\.weight F16 \[256, 64\] 32768 bytes' "$T/tensors"
check "ffn_gate_inp F32 [256, 16] (16 experts)" \
    grep -q ': blk\.3\.ffn_gate_inp\.weight F32 \[256, 16\] 16384 bytes' "$T/tensors"

# bytes = elements x element size; offsets aligned, disjoint, data ending at EOF
size=$(stat -c %s "$M")
awk -v size="$size" '
    { name = $2; type = $3; shape = $0; sub(/^[^[]*\[/, "", shape); sub(/\].*/, "", shape)
      n = split(shape, ne, ", "); el = 1; for (i = 1; i <= n; i++) el *= ne[i]
      for (i = 1; i <= NF; i++) if ($i == "bytes") { bytes = $(i - 1); off = $(i + 2) }
      es = type == "F16" ? 2 : type == "F32" ? 4 : 0
      if (es == 0 || bytes != el * es) { print "bad size " name; bad = 1 }
      if (off % 32) { print "unaligned " name; bad = 1 }
      print off, off + bytes > "/dev/stderr" }
    END { exit bad }' "$T/tensors" 2>"$T/spans" >"$T/awk"; rc=$?
check "byte sizes from types and shapes, offsets aligned" test $rc -eq 0
sort -n "$T/spans" | awk -v size="$size" '
    NR > 1 && $1 < prev_end { bad = 1 } { prev_end = $2 }
    END { exit bad || prev_end != size }'
check "tensors disjoint, the last ends at the file size $size" test $? -eq 0

# gguf-py's data offset of output.weight in this file (ref/dequant/index.json)
want=$(perl -MJSON::PP -e '
    local $/; open my $f, "<", $ARGV[0] or die; my $j = decode_json(<$f>);
    for (@{$j->{cases}}) { print $_->{tensor_data_offset_in_file}, "\n"
        if $_->{model} =~ /tinycoder-moe-F16/ && $_->{tensor} eq "output.weight" }' \
    "$STRATA_FIXTURES/ref/dequant/index.json")
check "output.weight offset $want as gguf-py reads it" \
    grep -q ": output\.weight F16 \[256, 4096\] 2097152 bytes @ $want (shard 0)$" "$T/tensors"

# every fixture model and vocabulary inspects cleanly
for f in "$STRATA_FIXTURES"/models/*.gguf "$STRATA_FIXTURES"/vocab/*.gguf; do
    "$P" --inspect "$f" >"$T/o" 2>&1
    check "inspect $(basename "$f")" grep -q '^tensors: ' "$T/o"
done

# the models shipped in the repository (tests/data, see its NOTICE)
for f in "$STRATA_ROOT"/tests/data/*.gguf; do
    [ -e "$f" ] || continue
    "$P" --inspect "$f" >"$T/o" 2>&1
    check "shipped $(basename "$f") inspects" grep -qE '^tensors: [1-9][0-9]*$' "$T/o"
done
done_testing
