#!/usr/bin/env bash
# strata-prepare --inspect --json: parses as JSON (perl's JSON::PP), agrees
# line for line with the text dump, keeps integers exact.
. "$(dirname "$0")/lib.sh"
P="$STRATA_BIN/strata-prepare"
M="$STRATA_FIXTURES/models/tinycoder-moe-F16.gguf"

"$P" --inspect "$M" --json >"$T/json" 2>"$T/err"; rc=$?
check "--json exits 0" test $rc -eq 0
"$P" --inspect "$M" >"$T/text"

# Re-render the JSON as the text dump's tensor and scalar lines; must match.
perl -MJSON::PP -e '
    local $/; my $j = decode_json(<STDIN>);
    printf "tensors: %d\n", scalar @{$j->{tensors}};
    my $i = 0;
    for my $t (@{$j->{tensors}}) {
        printf "  %d: %s %s [%s] %s bytes @ %s (shard %d)\n", $i++, $t->{name}, $t->{type},
            join(", ", @{$t->{shape}}), $t->{n_bytes}, $t->{offset}, $t->{shard};
    }
    for my $kv (@{$j->{metadata}}) {
        next if $kv->{type} =~ /^(array|string|f32|f64)$/;
        printf "  %s: %s = %s\n", $kv->{key}, $kv->{type}, $kv->{value};
    }' <"$T/json" >"$T/from-json" 2>"$T/perl-err"
check "JSON parses" test ! -s "$T/perl-err"
grep -E '^tensors: |^  [0-9]+: ' "$T/text" >"$T/t1"
grep -E '^tensors: |^  [0-9]+: ' "$T/from-json" >"$T/t2"
check "tensor list equals the text dump's" cmp -s "$T/t1" "$T/t2"
check "51 tensors in JSON" grep -qx 'tensors: 51' "$T/from-json"
grep -E '^  [a-z0-9_.]+: (u|i)[0-9]+ = ' "$T/from-json" >"$T/s2"
grep -E '^  [a-z0-9_.]+: (u|i)[0-9]+ = ' "$T/text" >"$T/s1"
check "integer keys equal the text dump's" cmp -s "$T/s1" "$T/s2"
check "integer keys present" test "$(wc -l <"$T/s2")" -ge 10

jq_like() { # FILE PERL-EXPR: print the expression's value over the decoded document
    perl -MJSON::PP -e 'local $/; open my $f, "<", $ARGV[0] or die; $_ = decode_json(<$f>);
        print eval($ARGV[1]), "\n"' "$1" "$2"
}
check "architecture qwen3moe" test "$(jq_like "$T/json" \
    '(grep { $_->{key} eq "general.architecture" } @{$_->{metadata}})[0]{value}')" = qwen3moe
check "tokens array: n 4096, first item, truncated" test "$(jq_like "$T/json" \
    'my $k = (grep { $_->{key} eq "tokenizer.ggml.tokens" } @{$_->{metadata}})[0];
     "$k->{elem_type} $k->{n} $k->{value}[0] " . ($k->{truncated} ? 1 : 0)')" = \
    "string 4096 <|endoftext|> 1"
check "file size in shards" test "$(jq_like "$T/json" '$_->{shards}[0]{size}')" = "$(stat -c %s "$M")"

# u32 0xffffffff stays exact (stories260K's tokenizer.ggml.seperator_token_id)
"$P" --inspect "$STRATA_FIXTURES/models/stories260K.gguf" --json >"$T/s.json"
check "u32 4294967295 exact" test "$(jq_like "$T/s.json" \
    '(grep { $_->{key} eq "tokenizer.ggml.seperator_token_id" } @{$_->{metadata}})[0]{value}')" \
    = 4294967295

# every vocabulary (byte-level tokens included) gives valid JSON
for f in "$STRATA_FIXTURES"/vocab/*.gguf "$STRATA_FIXTURES"/models/mmproj-tinyvl-F16.gguf; do
    "$P" --inspect "$f" --json >"$T/v.json" 2>/dev/null
    check "$(basename "$f"): valid JSON" perl -MJSON::PP -e \
        'local $/; open my $f, "<", $ARGV[0] or die; decode_json(<$f>)' "$T/v.json"
done
done_testing
