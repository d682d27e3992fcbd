#!/usr/bin/env bash
# strata-generate --perplexity: every tinycoder quant on heldout.py.txt within
# 0.5% of llama-perplexity's value (context 256, first 64 chunks).  Runs the
# release build ($STRATA_REL_BIN): under ASan this would take minutes.
. "$(dirname "$0")/lib.sh"
G="${STRATA_REL_BIN:-$STRATA_ROOT/bin}/strata-generate"
REF="$STRATA_FIXTURES/ref/tinycoder-llamacpp-reference.json"
TXT="$STRATA_FIXTURES/ref/heldout.py.txt"
check "release strata-generate exists" test -x "$G"

for q in F16 Q8_0 Q4_K_M IQ4_XS IQ2_XS IQ1_M; do
    want=$(perl -MJSON::PP -e 'local $/; open my $f, "<", $ARGV[0] or die;
        print decode_json(<$f>)->{perplexity}{$ARGV[1]}{ppl}' "$REF" "$q")
    "$G" -m "$STRATA_FIXTURES/models/tinycoder-moe-$q.gguf" --perplexity "$TXT" \
        --ctx 256 --chunks 64 -t 2 >"$T/$q" 2>"$T/$q.err"
    check "$q: exit 0" test $? -eq 0
    got=$(sed -n 's/^PPL = \([0-9.]*\) +\/- [0-9.]*$/\1/p' "$T/$q" | tail -1)
    echo "# $q: PPL $got (llama.cpp $want)"
    check "$q: last line is 'PPL = X +/- Y'" test -n "$got"
    check "$q: within 0.5% of $want" perl -e 'exit !(abs($ARGV[0] / $ARGV[1] - 1) <= 0.005)' \
        "${got:-0}" "$want"
done
done_testing
