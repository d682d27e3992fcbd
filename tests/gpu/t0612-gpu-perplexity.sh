#!/usr/bin/env bash
# GPU backend: perplexity of every tinycoder quant present on heldout.py.txt within 0.5%
# of llama-perplexity's value (context 256, first 64 chunks).
. "$(dirname "$0")/../lib.sh"
G="$STRATA_BIN/strata-generate"
REF="$STRATA_FIXTURES/ref/tinycoder-llamacpp-reference.json"
TXT="$STRATA_FIXTURES/ref/heldout.py.txt"
BE=${STRATA_BACKEND:-cuda}
for q in F16 Q8_0 Q4_K_M IQ4_XS IQ2_XS IQ1_M; do
    M="$STRATA_FIXTURES/models/tinycoder-moe-$q.gguf"
    [ -f "$M" ] || { echo "# $q: not present, skipped"; continue; }
    want=$(perl -MJSON::PP -e 'local $/; open my $f, "<", $ARGV[0] or die;
        print decode_json(<$f>)->{perplexity}{$ARGV[1]}{ppl}' "$REF" "$q")
    s=$SECONDS
    "$G" -m "$M" --perplexity "$TXT" --ctx 256 --chunks 64 --backend "$BE" >"$T/$q" 2>"$T/$q.err"
    check "$q ($BE): exit 0" test $? -eq 0
    got=$(sed -n 's/^PPL = \([0-9.]*\) +\/- [0-9.]*$/\1/p' "$T/$q" | tail -1)
    echo "# $q: PPL $got on $BE (llama.cpp $want), $((SECONDS - s)) s"
    [ -n "$got" ] || tail -3 "$T/$q.err" | sed 's/^/#   /'
    check "$q ($BE): within 0.5% of $want" perl -e 'exit !(abs($ARGV[0] / $ARGV[1] - 1) <= 0.005)' \
        "${got:-0}" "$want"
done
done_testing
