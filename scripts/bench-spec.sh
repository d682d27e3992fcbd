#!/usr/bin/env bash
# bench-spec.sh - speculative decoding, --spec T = 0, 2, 4, 8, as one compact table.
#
#   scripts/bench-spec.sh [-b BINDIR] [-B BACKEND] [-t THREADS] [-m MODEL] [-d DRAFT]
#                         [-s SHAPE[:LAYERS[:FTYPE]] | -S] [-x BENCH_SPEC] [-r REPS]
#                         [-T "2 4 8"] [-a "GENERATE-ARGS"] [-g TOKENS] [-R REPS]
#
#   -b BINDIR   where strata-generate is, and bench_spec unless -x (default bin)
#   -x PROGRAM  the bench_spec program (tests/bench/bench_spec.c; make bench-spec and
#               make gpu-tests build it)
#   -B BACKEND  cpu (default), cuda, hip, auto
#   -t THREADS  worker threads (default 2)
#   -m MODEL    the text model (default the fixtures' tinycoder-moe-Q4_K_M.gguf)
#   -d DRAFT    its draft model (default tinydraft-qwen3-F16.gguf)
#   -s SHAPE    the synthetic model (lib/synth.h; default qwen3-30b-a3b:12:Q4_K_M):
#               built in memory by bench_spec, no file is written
#   -S          skip the synthetic model
#   -r REPS     runs per row, the median is shown (default 3)
#   -g TOKENS   tokens per synthetic-model run (default 128); -R REPS its runs per row
#               (default -r's)
#   -a ARGS     more options for every strata-generate run (e.g. --no-selftest)
#
# Part 1 (strata-generate, MODEL): a code-editing prompt - the model reproduces a
# function with one change, so prompt lookup finds most of the output in the prompt -
# greedy, 160 tokens, n-gram and draft-model drafts, with the back-off and without
# (fixed); then a prompt with little repetition (temperature 1), where the back-off must
# keep speculation at --spec 0's speed.  Part 2 (bench_spec, the synthetic model, token
# ids): drafts of known quality - an oracle (every draft accepted: the most windows can
# give), prompt lookup, and an always-wrong draft with and without the back-off.
# Columns: decode tokens/s, the ratio to T 0, acceptance, tokens and milliseconds per
# verify step.  "same" says the text equals T 0's (greedy runs must).
set -u
BIN=bin BE=cpu TH=2 REPS=3 TS="2 4 8" SYN=qwen3-30b-a3b:12:Q4_K_M
F=${STRATA_FIXTURES:-$(dirname "$0")/../../shared/fixtures}
M=$F/models/tinycoder-moe-Q4_K_M.gguf
D=$F/models/tinydraft-qwen3-F16.gguf
# the old positional form: GENERATE [MODEL] [DRAFT] [THREADS]
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    BIN=$(dirname "$1") M=${2:-$M} D=${3:-$D} TH=${4:-$TH}
    set --
fi
BS= XA= SGEN=128 SREPS=
while getopts "b:B:t:m:d:s:Sx:r:T:a:g:R:h" o; do
    case $o in
    b) BIN=$OPTARG ;;
    B) BE=$OPTARG ;;
    t) TH=$OPTARG ;;
    m) M=$OPTARG ;;
    d) D=$OPTARG ;;
    s) SYN=$OPTARG ;;
    S) SYN= ;;
    x) BS=$OPTARG ;;
    r) REPS=$OPTARG ;;
    a) XA=$OPTARG ;;
    g) SGEN=$OPTARG ;;
    R) SREPS=$OPTARG ;;
    T) TS=$OPTARG ;;
    h) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    esac
done
G=$BIN/strata-generate
[ -x "$G" ] || { echo "bench-spec: no strata-generate in $BIN" >&2; exit 2; }

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
NAME=$(basename "$M" .gguf)
HDR=$(printf "%-28s %-5s %3s  %-15s %2s  %8s %6s %7s %8s %8s %4s" model backend thr draft T \
    tok/s "x T0" accept tok/step ms/step same)

# row LABEL T PROMPT ARGS...: the median of REPS runs; "same" against $T/ref.$KEY
TPS0=
run() {
    local label=$1 t=$2 p=$3 i out line
    shift 3
    : >"$TMP/rows"
    for i in $(seq "$REPS"); do
        "$G" -m "$M" -p "$p" -t "$TH" --backend "$BE" --json $XA "$@" >"$TMP/out" 2>"$TMP/err" ||
            { echo "# $label T $t: failed: $(tail -1 "$TMP/err")"; return; }
        tail -1 "$TMP/out" >>"$TMP/rows"
        head -n -1 "$TMP/out" >"$TMP/text.$i"
    done
    if [ "$t" = 0 ]; then cp "$TMP/text.1" "$TMP/ref.$KEY"; fi
    same=yes
    cmp -s "$TMP/text.1" "$TMP/ref.$KEY" || same=no
    line=$(LABEL=$label T=$t SAME=$same NAME=$NAME BE=$BE TH=$TH TPS0=${TPS0:-0} perl -MJSON::PP -e '
        my @r = map { decode_json($_) } <STDIN>;
        @r = sort { $a->{decode_tps} <=> $b->{decode_tps} } @r;
        my $j = $r[int(@r / 2)]; my $s = $j->{spec} || {};
        my $t0 = $ENV{TPS0} > 0 ? $ENV{TPS0} : $j->{decode_tps};
        printf "%-28s %-5s %3d  %-15s %2d  %8.1f %6.2f %7s %8.2f %8s %4s\n",
            $ENV{NAME}, $ENV{BE}, $ENV{TH}, $ENV{LABEL}, $ENV{T}, $j->{decode_tps},
            $j->{decode_tps} / ($t0 || 1),
            $s->{drafted} ? sprintf("%.1f%%", 100 * $s->{acceptance}) : "-",
            $s->{tokens_per_step} || 1, $s->{steps} ? sprintf("%.3f", $s->{ms_per_step}) : "-",
            $ENV{SAME}' <"$TMP/rows")
    echo "$line"
    [ "$t" = 0 ] && TPS0=$(echo "$line" | awk '{print $(NF-5)}')
}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/bench-spec.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

echo "# code-editing prompt (reproduce a function with one change), greedy, 160 tokens"
echo "$HDR"
KEY=edit TPS0=
run "none (plain)" 0 "$EDIT" -n 160 --temp 0 --ignore-eos --spec 0
for t in $TS; do
    run "ngram fixed" "$t" "$EDIT" -n 160 --temp 0 --ignore-eos --spec "$t" --spec-mode ngram \
        --spec-fixed
    run "ngram back-off" "$t" "$EDIT" -n 160 --temp 0 --ignore-eos --spec "$t" --spec-mode ngram
    [ -f "$D" ] || continue
    run "draft fixed" "$t" "$EDIT" -n 160 --temp 0 --ignore-eos --spec "$t" --draft "$D" \
        --spec-fixed
    run "draft back-off" "$t" "$EDIT" -n 160 --temp 0 --ignore-eos --spec "$t" --draft "$D"
done
echo "# little repetition: temperature 1, seed 1, 128 tokens (same seed: same text)"
echo "$HDR"
KEY=free TPS0=
run "none (plain)" 0 "import" -n 128 --temp 1 --seed 1 --ignore-eos --spec 0
for t in $TS; do
    run "ngram fixed" "$t" "import" -n 128 --temp 1 --seed 1 --ignore-eos --spec "$t" \
        --spec-fixed
    run "ngram back-off" "$t" "import" -n 128 --temp 1 --seed 1 --ignore-eos --spec "$t"
    [ -f "$D" ] || continue
    run "draft back-off" "$t" "import" -n 128 --temp 1 --seed 1 --ignore-eos --spec "$t" \
        --draft "$D"
done

[ -n "$SYN" ] || exit 0
[ -n "$BS" ] || BS=$BIN/bench_spec
[ -x "$BS" ] || { echo "# no bench_spec program ($BS; make bench-spec builds it)"; exit 0; }
IFS=: read -r shape layers ftype <<<"$SYN"
echo "# synthetic $shape, ${layers:-12} layers, ${ftype:-Q4_K_M}: 64 prompt ids, $SGEN tokens"
"$BS" --synth "$shape" --layers "${layers:-12}" --ftype "${ftype:-Q4_K_M}" --backend "$BE" \
    -t "$TH" --reps "${SREPS:-$REPS}" --gen "$SGEN" --spec "$TS"
