#!/usr/bin/env bash
# strata-generate: greedy text of stories260K equals llama.cpp's for the 3
# reference prompts (BOS added, the prompt echoed as llama.cpp prints it).
. "$(dirname "$0")/lib.sh"
G="$STRATA_BIN/strata-generate"
M="$STRATA_FIXTURES/models/stories260K.gguf"
REF="$STRATA_FIXTURES/ref/stories260K-llamacpp-reference.json"

# cases as prompt<TAB>expected lines, via cJSON-free perl (JSON strings only)
perl -MJSON::PP -e '
    local $/; open my $f, "<", $ARGV[0] or die; my $d = decode_json(<$f>);
    my $i = 0;
    for my $c (@{$d->{cases}}) {
        open my $p, ">:raw", "$ARGV[1]/prompt$i" or die; print $p $c->{prompt}; close $p;
        my $o = $c->{llama_cpp_output}; utf8::encode($o);
        open my $e, ">:raw", "$ARGV[1]/expect$i" or die; print $e $o; close $e;
        $i++;
    }' "$REF" "$T"
check "reference has 3 cases" test -f "$T/expect2"

for i in 0 1 2; do
    "$G" -m "$M" -f "$T/prompt$i" -n 64 --temp 0 --echo -t 2 >"$T/out$i" 2>"$T/err$i"
    check "stories260K case $i: exit 0" test $? -eq 0
    check "stories260K case $i: text equals llama.cpp's" cmp "$T/expect$i" "$T/out$i"
done
done_testing
