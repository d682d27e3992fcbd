#!/usr/bin/env bash
# bench-spec.sh - speculative decoding, --spec T = 0, 2, 4, 8, as one compact table.
#
#   scripts/bench-spec.sh [-b BINDIR] [-B BACKEND] [-t THREADS] [-m MODEL] [-d DRAFT]
#                         [-s SHAPE[:LAYERS[:FTYPE]] | -S] [-x BENCH_SPEC] [-r REPS]
#                         [-T "2 4 8"] [-a "GENERATE-ARGS"] [-g TOKENS] [-R REPS]
#                         [-P "edit free"] [-F TOKENS] [-c OTHER_BINDIR]
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
#   -r REPS     runs per row, the median is shown (default 3); part 1's rows run
#               interleaved, REPS rounds of every row once
#   -P PARTS    part 1's prompts to run: edit, free (default both)
#   -c DIR      compare: part 1's rows run with DIR's strata-generate too, in the same
#               rounds (its rows marked "B", its ratios against its own T 0)
#   -F TOKENS   tokens of the little-repetition prompt's runs (default 128)
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
BS= XA= SGEN=128 SREPS= PARTS="edit free" CMP= FREE_N=128
while getopts "b:B:t:m:d:s:Sx:r:T:a:g:R:P:F:c:h" o; do
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
    P) PARTS=$OPTARG ;;
    F) FREE_N=$OPTARG ;;
    c) CMP=$OPTARG ;;
    h) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    esac
done
G=$BIN/strata-generate
[ -x "$G" ] || { echo "bench-spec: no strata-generate in $BIN" >&2; exit 2; }
[ -z "$CMP" ] || [ -x "$CMP/strata-generate" ] ||
    { echo "bench-spec: no strata-generate in $CMP" >&2; exit 2; }

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
HDR=$(printf "%-28s %-5s %3s  %-17s %2s  %8s %6s %7s %8s %8s %4s" model backend thr draft T \
    tok/s "x T0" accept tok/step ms/step same)

# The rows of a part run interleaved: REPS rounds, each running every row once (each
# round starting one row later, so no row is always first), so a change in the
# machine's load (a shared machine) falls on all rows alike.  tok/s is the median over
# the rounds; "x T0" the median of each round's ratio to that round's T 0 run.  "same"
# compares the first round's text with T 0's.
# row LABEL T PROMPT ARGS...: add a row to the current part
NROW=0
row() {
    local b
    for b in A ${CMP:+B}; do
        ROW_LABEL[NROW]=$1 ROW_T[NROW]=$2 ROW_P[NROW]=$3 ROW_B[NROW]=$b
        [ "$2" = 0 ] && [ -z "${REF[$b]:-}" ] && REF[$b]=$NROW
        ROW_REF[NROW]=${REF[$b]}
        ROW_ARGS[NROW]=$(printf '%q ' "${@:4}")
        NROW=$((NROW + 1))
    done
}
declare -A REF
# part KEY TITLE: run the rows added since the last part, print the table
part() {
    local key=$1 title=$2 i r
    echo "# $title"
    echo "$HDR"
    for i in $(seq 0 $((NROW - 1))); do : >"$TMP/rows.$i"; : >"$TMP/fail.$i"; done
    for r in $(seq "$REPS"); do
        for j in $(seq 0 $((NROW - 1))); do
            i=$(((j + r - 1) % NROW)) # each round starts one row later
            [ -s "$TMP/fail.$i" ] && continue
            eval "set -- ${ROW_ARGS[i]}"
            g=$G
            [ "${ROW_B[i]}" = B ] && g=$CMP/strata-generate
            if "$g" -m "$M" -p "${ROW_P[i]}" -t "$TH" --backend "$BE" --json $XA "$@" \
                >"$TMP/out" 2>"$TMP/err"; then
                echo "$r $(tail -1 "$TMP/out")" >>"$TMP/rows.$i"
                [ "$r" = 1 ] && head -n -1 "$TMP/out" >"$TMP/text.$i"
            else
                tail -1 "$TMP/err" >"$TMP/fail.$i"
            fi
        done
    done
    for i in $(seq 0 $((NROW - 1))); do
        if [ -s "$TMP/fail.$i" ]; then
            echo "# ${ROW_LABEL[i]} T ${ROW_T[i]}: failed: $(cat "$TMP/fail.$i")"
            continue
        fi
        same=yes
        cmp -s "$TMP/text.$i" "$TMP/text.0" || same=no
        label=${ROW_LABEL[i]}
        [ -n "$CMP" ] && label="${ROW_B[i]} $label"
        LABEL=$label T=${ROW_T[i]} SAME=$same NAME=$NAME BE=$BE TH=$TH \
            R0=$TMP/rows.${ROW_REF[i]} perl -MJSON::PP -e '
            sub med { my @v = sort { $a <=> $b } @_; @v ? $v[int(@v / 2)] : 0 }
            sub rd { my %h; for (@_) { my ($n, $j) = split / /, $_, 2; $h{$n} = decode_json($j) } %h }
            open(my $f, "<", $ENV{R0}) or die; my %b = rd(<$f>); my %g = rd(<STDIN>);
            my @x = map { $b{$_} && $b{$_}{decode_tps} ? $g{$_}{decode_tps} / $b{$_}{decode_tps} : () }
                sort keys %g;
            my @r = map { $g{$_} } sort keys %g;
            my $tps = med(map { $_->{decode_tps} } @r);
            my @s = sort { $a->{decode_tps} <=> $b->{decode_tps} } @r;
            my $j = $s[int(@s / 2)]; my $s = $j->{spec} || {};
            printf "%-28s %-5s %3d  %-17s %2d  %8.1f %6.2f %7s %8.2f %8s %4s\n",
                $ENV{NAME}, $ENV{BE}, $ENV{TH}, $ENV{LABEL}, $ENV{T}, $tps, med(@x),
                $s->{drafted} ? sprintf("%.1f%%", 100 * $s->{acceptance}) : "-",
                $s->{tokens_per_step} || 1, $s->{steps} ? sprintf("%.3f", $s->{ms_per_step}) : "-",
                $ENV{SAME}' <"$TMP/rows.$i"
    done
    NROW=0
    REF=()
}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/bench-spec.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

ED=(-n 160 --temp 0 --ignore-eos)
row "none (plain)" 0 "$EDIT" "${ED[@]}" --spec 0
for t in $TS; do
    row "ngram fixed" "$t" "$EDIT" "${ED[@]}" --spec "$t" --spec-mode ngram --spec-fixed
    row "ngram back-off" "$t" "$EDIT" "${ED[@]}" --spec "$t" --spec-mode ngram
    [ -f "$D" ] || continue
    row "draft fixed" "$t" "$EDIT" "${ED[@]}" --spec "$t" --draft "$D" --spec-fixed
    row "draft back-off" "$t" "$EDIT" "${ED[@]}" --spec "$t" --draft "$D"
done
case " $PARTS " in *" edit "*)
    part edit "code-editing prompt (reproduce a function with one change), greedy, 160 tokens" ;;
*) NROW=0 REF=() ;; esac
FR=(-n "$FREE_N" --temp 1 --seed 1 --ignore-eos)
row "none (plain)" 0 "import" "${FR[@]}" --spec 0
# the same plain run again: its "x T0" is the table's own run-to-run spread
row "none (again)" 0 "import" "${FR[@]}" --spec 0
for t in $TS; do
    row "ngram fixed" "$t" "import" "${FR[@]}" --spec "$t" --spec-fixed
    row "ngram back-off" "$t" "import" "${FR[@]}" --spec "$t"
    [ -f "$D" ] || continue
    row "draft back-off" "$t" "import" "${FR[@]}" --spec "$t" --draft "$D"
done
case " $PARTS " in *" free "*)
    part free "little repetition: temperature 1, seed 1, $FREE_N tokens (same seed: same text)" ;;
*) NROW=0 ;; esac

[ -n "$SYN" ] || exit 0
[ -n "$BS" ] || BS=$BIN/bench_spec
[ -x "$BS" ] || { echo "# no bench_spec program ($BS; make bench-spec builds it)"; exit 0; }
IFS=: read -r shape layers ftype <<<"$SYN"
echo "# synthetic $shape, ${layers:-12} layers, ${ftype:-Q4_K_M}: 64 prompt ids, $SGEN tokens"
"$BS" --synth "$shape" --layers "${layers:-12}" --ftype "${ftype:-Q4_K_M}" --backend "$BE" \
    -t "$TH" --reps "${SREPS:-$REPS}" --gen "$SGEN" --spec "$TS"
