#!/usr/bin/env bash
# strata-prepare --inspect on a split set (made by the pack test helper):
# opened through any shard, the same tensors as the single file; a missing
# shard is named.
. "$(dirname "$0")/lib.sh"
P="$STRATA_BIN/strata-prepare"
TOOL="$STRATA_BIN/../helpers/packtool"
M="$STRATA_FIXTURES/models/tinycoder-moe-F16.gguf"

check "3-shard split set made" "$TOOL" split "$M" 3 "$T/tc"
# name type shape of each tensor line, without offsets and shard numbers
tensors() { grep -E '^  [0-9]+: .* bytes @ ' "$1" | sed 's/ @ .*//'; }
"$P" --inspect "$M" >"$T/single"
tensors "$T/single" >"$T/want"
for k in 1 2 3; do
    "$P" --inspect "$T/tc-0000$k-of-00003.gguf" >"$T/out$k" 2>"$T/err"; rc=$?
    check "through shard $k: exit 0" test $rc -eq 0
    check "through shard $k: 3 shards" grep -qx 'shards: 3' "$T/out$k"
    tensors "$T/out$k" >"$T/got"
    check "through shard $k: the single file's 51 tensors" cmp -s "$T/want" "$T/got"
done
check "file: is the first shard" grep -qx "file: $T/tc-00001-of-00003.gguf" "$T/out3"
check "tensors of the last shard say so" grep -q ': output_norm\.weight .* (shard 2)$' "$T/out1"
check "metadata of the first shard" grep -qx "  general.architecture: string = 'qwen3moe'" "$T/out2"
"$P" --inspect "$T/tc-00001-of-00003.gguf" --json >"$T/json"
check "--json: 3 shards, 51 tensors" perl -MJSON::PP -e '
    local $/; open my $f, "<", $ARGV[0] or die; my $j = decode_json(<$f>);
    exit !(@{$j->{shards}} == 3 && @{$j->{tensors}} == 51)' "$T/json"

rm "$T/tc-00002-of-00003.gguf"
"$P" --inspect "$T/tc-00001-of-00003.gguf" >"$T/out" 2>"$T/err"; rc=$?
check "missing shard: exit 3" test $rc -eq 3
check "missing shard: named" grep -qF "shard 2 of 3 '$T/tc-00002-of-00003.gguf' is missing" "$T/err"
cp "$T/tc-00001-of-00003.gguf" "$T/tc-00002-of-00003.gguf"
"$P" --inspect "$T/tc-00003-of-00003.gguf" >"$T/out" 2>"$T/err"; rc=$?
check "duplicated shard: exit 3" test $rc -eq 3
check "duplicated shard: named" \
    grep -qF "shard '$T/tc-00002-of-00003.gguf' has split.no 0, expected 1" "$T/err"
done_testing
