#!/usr/bin/env bash
# GPU backend: greedy text of stories260K equals llama.cpp's for the 3 reference
# prompts ($STRATA_BACKEND, default cuda).
. "$(dirname "$0")/../lib.sh"
G="$STRATA_BIN/strata-generate"
M="$STRATA_FIXTURES/models/stories260K.gguf"
REF="$STRATA_FIXTURES/ref/stories260K-llamacpp-reference.json"
BE=${STRATA_BACKEND:-cuda}
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
    "$G" -m "$M" -f "$T/prompt$i" -n 64 --temp 0 --echo --backend "$BE" >"$T/out$i" 2>"$T/err$i"
    check "stories260K case $i ($BE): exit 0" test $? -eq 0
    check "stories260K case $i ($BE): text equals llama.cpp's" cmp "$T/expect$i" "$T/out$i"
    cmp -s "$T/expect$i" "$T/out$i" || { echo "# got:"; sed 's/^/#   /' "$T/out$i" "$T/err$i" | head -8; }
done
done_testing
