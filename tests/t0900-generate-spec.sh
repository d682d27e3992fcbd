#!/usr/bin/env bash
# strata-generate --spec T: greedy text byte-identical to --spec 0 for every
# fixture model, several prompts, n-gram and draft-model drafts, T = 1..8;
# the --json summary's statistics; option errors.  Runs the release build
# ($STRATA_REL_BIN) to stay fast; the ASan build checks the same loop in
# tests/unit/test_spec.c.  STRATA_SPEC_ARGS adds options to every run (e.g.
# "--backend cuda" on a GPU machine, with STRATA_REL_BIN naming a GPU build).
. "$(dirname "$0")/lib.sh"
G="${STRATA_REL_BIN:-$STRATA_ROOT/bin}/strata-generate"
M="$STRATA_FIXTURES/models"
check "release strata-generate exists" test -x "$G"

P1='def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


def '
P2='import os
import sys


class Config:
    def __init__(self, path):
        self.path = path
'
P3='Once upon a time, there was a little girl named Lily. She'

# gen MODEL PROMPT N OUT [ARGS...]
gen() {
    local m=$1 p=$2 n=$3 out=$4
    shift 4
    "$G" -m "$M/$m" -p "$p" -n "$n" --temp 0 --ignore-eos -t 2 ${STRATA_SPEC_ARGS:-} "$@" \
        >"$out" 2>"$out.err"
}

same_for() { # name model prompt n Ts [args...]
    local name=$1 m=$2 p=$3 n=$4 ts=$5 bad=""
    shift 5
    gen "$m" "$p" "$n" "$T/ref" --spec 0
    for t in $ts; do
        gen "$m" "$p" "$n" "$T/out" --spec "$t" --spec-fixed "$@" || bad="$bad $t(exit)"
        cmp -s "$T/ref" "$T/out" || bad="$bad $t"
    done
    [ -n "$bad" ] && echo "# $name: differs at T$bad"
    check "$name: greedy --spec $(echo $ts | tr ' ' ,) == --spec 0 (byte-identical)" \
        test -z "$bad" -a -s "$T/ref"
}

same_for "tinycoder Q4_K_M p1 ngram" tinycoder-moe-Q4_K_M.gguf "$P1" 40 "1 2 3 4 5 6 7 8"
same_for "tinycoder Q4_K_M p2 ngram" tinycoder-moe-Q4_K_M.gguf "$P2" 40 "1 2 3 4 5 6 7 8"
same_for "tinycoder Q4_K_M p1 draft" tinycoder-moe-Q4_K_M.gguf "$P1" 40 "1 2 3 4 5 6 7 8" \
    --draft "$M/tinydraft-qwen3-F16.gguf"
same_for "tinycoder Q4_K_M p2 draft" tinycoder-moe-Q4_K_M.gguf "$P2" 32 "2 5 8" \
    --draft "$M/tinydraft-qwen3-F16.gguf" --spec-mode draft
for q in F16 Q8_0 IQ4_XS IQ2_XS IQ1_M; do
    same_for "tinycoder $q p1 ngram" tinycoder-moe-$q.gguf "$P1" 32 "3 8"
done
same_for "tinycoder IQ2_XS p2 draft" tinycoder-moe-IQ2_XS.gguf "$P2" 32 "4" \
    --draft "$M/tinydraft-qwen3-F16.gguf"
same_for "tinydraft p1 ngram" tinydraft-qwen3-F16.gguf "$P1" 40 "1 2 4 8"
same_for "stories260K p3 ngram" stories260K.gguf "$P3" 64 "1 2 3 4 5 6 7 8"
same_for "stories260K p1 ngram" stories260K.gguf "$P1" 48 "2 8"

# sampling with a seed: the same text (deterministic drafts keep the draw)
gen tinycoder-moe-Q4_K_M.gguf "$P1" 40 "$T/s0" --temp 1 --seed 7 --spec 0
gen tinycoder-moe-Q4_K_M.gguf "$P1" 40 "$T/s4" --temp 1 --seed 7 --spec 4 --spec-fixed
check "temperature 1, seed 7: --spec 4 == --spec 0" cmp -s "$T/s0" "$T/s4"
gen tinycoder-moe-Q4_K_M.gguf "$P2" 40 "$T/s5" --temp 0 --spec 0
gen tinycoder-moe-Q4_K_M.gguf "$P2" 40 "$T/s6" --temp 0 --spec 8
check "with the back-off (no --spec-fixed): --spec 8 == --spec 0" cmp -s "$T/s5" "$T/s6"

# --json: the summary's statistics
gen tinycoder-moe-Q4_K_M.gguf "$P1" 40 "$T/j" --spec 4 --spec-fixed --json
check "--json summary has spec statistics" perl -MJSON::PP -e '
    my @l = <STDIN>; my $j = decode_json($l[-1]); my $s = $j->{spec} or exit 1;
    exit !($s->{n_max} == 4 && $s->{draft} eq "ngram" && $s->{steps} > 0 &&
           $s->{steps} < $j->{n_gen} && $s->{accepted} <= $s->{drafted} &&
           $s->{acceptance} > 0 && $s->{acceptance} <= 1 && $s->{tokens_per_step} > 1 &&
           $s->{ms_per_step} > 0)' <"$T/j"
gen tinycoder-moe-Q4_K_M.gguf "$P1" 8 "$T/st" --spec 2 --stats
check "--stats prints acceptance and time per step" \
    grep -q "spec T 2, draft ngram: .* accepted (.*%), .* tokens/step, .* ms/step" "$T/st.err"

# errors
"$G" -m "$M/stories260K.gguf" -p x -n 1 --spec 17 >/dev/null 2>"$T/e1"
check "--spec 17: usage error (exit 2)" test $? -eq 2
"$G" -m "$M/stories260K.gguf" -p x -n 1 --spec 2 --spec-mode nope >/dev/null 2>"$T/e2"
check "--spec-mode nope: usage error (exit 2)" test $? -eq 2
"$G" -m "$M/tinycoder-moe-Q4_K_M.gguf" -p x -n 1 --spec 2 --spec-mode mtp >/dev/null 2>"$T/e3"
rc=$?
check "--spec-mode mtp without nextn layers: an error naming the key" \
    test $rc -ne 0 -a $rc -ne 2 && grep -q "nextn_predict_layers" "$T/e3"
"$G" -m "$M/tinycoder-moe-Q4_K_M.gguf" -p x -n 1 --spec 2 --draft "$M/stories260K.gguf" \
    >/dev/null 2>"$T/e4"
check "--draft with another vocabulary: refused" test $? -ne 0 && grep -q "vocabulary" "$T/e4"
"$G" -m "$M/tinycoder-moe-Q4_K_M.gguf" -p x -n 1 --spec 2 --draft "$T/missing.gguf" \
    >/dev/null 2>"$T/e5"
check "--draft with a missing file: an error naming it" grep -q "missing.gguf" "$T/e5"
"$G" -m "$M/stories260K.gguf" -p x -n 2 --spec 0 --draft "$T/missing.gguf" >/dev/null 2>&1
check "--spec 0 is always accepted (the draft is not opened)" test $? -eq 0
done_testing
