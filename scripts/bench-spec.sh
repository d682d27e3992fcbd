#!/usr/bin/env bash
# bench-spec.sh - speculative decoding on a code-editing prompt: the model
# reproduces a long function with one change, so prompt lookup finds most
# of the output in the prompt.  Prints decode tokens/s, acceptance, tokens
# and time per verify step for --spec T = 0, 2, 4, 8 (n-gram and draft-model
# drafts), then the same on a prompt with little repetition (sampling at
# temperature 1) to show the back-off.
#   usage: scripts/bench-spec.sh [GENERATE] [MODEL] [DRAFT] [THREADS]
set -u
G=${1:-bin/strata-generate}
F=${STRATA_FIXTURES:-../shared/fixtures}
M=${2:-$F/models/tinycoder-moe-Q4_K_M.gguf}
D=${3:-$F/models/tinydraft-qwen3-F16.gguf}
TH=${4:-2}
EXTRA=${BENCH_SPEC_ARGS:-}

# (a long function, then its copy with one change, begun; the fixture coder
# models are too small to copy it faithfully, so the measured acceptance is
# what prompt lookup gets on their actual output)
read -r -d '' FUNC <<'PY'
def count_words(path, min_length=3):
    counts = {}
    with open(path) as f:
        for line in f:
            for word in line.split():
                word = word.strip(".,;:!?").lower()
                if len(word) < min_length:
                    continue
                counts[word] = counts.get(word, 0) + 1
    items = sorted(counts.items(), key=lambda kv: kv[1], reverse=True)
    return items
PY
EDIT="$FUNC


def count_words(path, min_length=4):
    counts = {}
    with open(path) as f:
"

run() { # label prompt args...
    local label=$1 p=$2
    shift 2
    "$G" -m "$M" -p "$p" -t "$TH" --json $EXTRA "$@" 2>/dev/null | tail -1 |
        LABEL=$label perl -MJSON::PP -ne '
            my $j = decode_json($_); my $s = $j->{spec} || {};
            printf "%-24s %4d tokens %8.1f tok/s  acceptance %5.1f%%  %5.2f tokens/step  %6.3f ms/step\n",
                $ENV{LABEL}, $j->{n_gen}, $j->{decode_tps}, 100 * ($s->{acceptance} || 0),
                $s->{tokens_per_step} || 1, $s->{ms_per_step} || 0'
}

echo "model $(basename "$M"), $TH threads, code-editing prompt (greedy, 160 tokens)"
run "T 0 (plain decoding)" "$EDIT" -n 160 --temp 0 --ignore-eos --spec 0
for t in 2 4 8; do
    run "ngram T $t fixed" "$EDIT" -n 160 --temp 0 --ignore-eos --spec $t --spec-mode ngram \
        --spec-fixed
    run "ngram T $t back-off" "$EDIT" -n 160 --temp 0 --ignore-eos --spec $t --spec-mode ngram
done
for t in 2 4 8; do
    run "draft T $t fixed" "$EDIT" -n 160 --temp 0 --ignore-eos --spec $t --draft "$D" \
        --spec-fixed
    run "draft T $t back-off" "$EDIT" -n 160 --temp 0 --ignore-eos --spec $t --draft "$D"
done
echo "little repetition (temperature 1, seed 1, 128 tokens)"
run "T 0 (plain decoding)" "import" -n 128 --temp 1 --seed 1 --ignore-eos --spec 0
for t in 4 8; do
    run "ngram T $t fixed" "import" -n 128 --temp 1 --seed 1 --ignore-eos --spec $t --spec-fixed
    run "ngram T $t back-off" "import" -n 128 --temp 1 --seed 1 --ignore-eos --spec $t
    run "draft T $t back-off" "import" -n 128 --temp 1 --seed 1 --ignore-eos --spec $t \
        --draft "$D"
done
