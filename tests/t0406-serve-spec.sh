#!/usr/bin/env bash
# strata-serve with speculative decoding in its engines (--spec, --spec-mode, --draft,
# --spec-fixed passed to strata-generate --serve-stdio): greedy and seeded texts equal
# those of a server without speculation (completions, chat, streamed), the speculation
# counters in /metrics, option errors.
. "$(dirname "$0")/serve-lib.sh"

M=$FIX/models/tinycoder-moe-Q4_K_M.gguf
D=$FIX/models/tinydraft-qwen3-F16.gguf
if [ ! -f "$M" ] || [ ! -f "$D" ]; then
    echo "1..0 # SKIP fixture models not found"
    exit 0
fi
# JSON string bodies: a function to continue (prompt lookup finds repeats), a class
P1='def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\ndef fib_memo(n, memo={}):\n    if n < 2:\n        return n\n'
P2='import os\nimport sys\n\n\nclass Config:\n    def __init__(self, path):\n        self.path = path\n'

# requests NAME: the texts of every request into $TMP/NAME.*
requests() {
    local k=$1 i=0 p
    for p in "$P1" "$P2"; do
        post /v1/completions "{\"prompt\":\"$p\",\"max_tokens\":48,\"temperature\":0}" |
            jget 'o.choices[0].text' >"$TMP/$k.greedy$i"
        post /v1/completions "{\"prompt\":\"$p\",\"max_tokens\":32,\"temperature\":1,\"seed\":5}" |
            jget 'o.choices[0].text' >"$TMP/$k.seeded$i"
        i=$((i + 1))
    done
    post /v1/chat/completions '{"messages":[{"role":"user","content":"Write a Python function that adds two numbers."}],"max_tokens":40,"temperature":0}' |
        jget 'o.choices[0].message.content' >"$TMP/$k.chat"
    post /v1/completions "{\"prompt\":\"$P1\",\"max_tokens\":48,\"temperature\":0,\"stream\":true}" \
        >"$TMP/$k.sse"
    sse_text "$TMP/$k.sse" >"$TMP/$k.stream"
    curl -s "$URL/metrics" >"$TMP/$k.metrics"
}

# metric NAME FILE: its value
metric() { sed -n "s/^$1 //p" "$2"; }

same_as_plain() { # name
    local f bad=
    for f in greedy0 greedy1 seeded0 seeded1 chat stream; do
        cmp -s "$TMP/plain.$f" "$TMP/$1.$f" || bad="$bad $f"
    done
    [ -z "$bad" ] || echo "# $1: differs from the server without speculation:$bad"
    [ -z "$bad" ]
}

start_server -m "$M" --threads 2
ok $? "server without speculation starts"
requests plain
test -s "$TMP/plain.greedy0" -a -s "$TMP/plain.chat" -a -s "$TMP/plain.seeded1"
ok $? "plain: completions, seeded completions and a chat answer are not empty"
is "$(metric strata_spec_steps_total "$TMP/plain.metrics")" "0" "plain: no verify windows in /metrics"
stop_server

start_server -m "$M" --threads 2 --spec 4 --spec-fixed
ok $? "server with --spec 4 --spec-fixed (n-gram drafts) starts"
requests ngram
same_as_plain ngram
ok $? "--spec 4 (n-gram): greedy, seeded, chat and streamed texts equal the plain server's"
cmp -s "$TMP/ngram.stream" "$TMP/ngram.greedy0"
ok $? "--spec 4: streamed text equals the non-streamed one"
n=$(metric strata_spec_steps_total "$TMP/ngram.metrics")
dr=$(metric strata_spec_drafted_tokens_total "$TMP/ngram.metrics")
ac=$(metric strata_spec_accepted_tokens_total "$TMP/ngram.metrics")
ok "$(awk -v n="${n:-0}" -v d="${dr:-0}" -v a="${ac:-0}" 'BEGIN{exit !(n > 0 && d > 0 && a > 0 && a <= d)}'; echo $?)" \
    "--spec 4: /metrics counts steps ($n), drafted ($dr) and accepted ($ac) tokens"
r=$(metric strata_spec_acceptance_ratio "$TMP/ngram.metrics")
tps=$(metric strata_spec_tokens_per_step "$TMP/ngram.metrics")
sec=$(metric strata_spec_step_seconds "$TMP/ngram.metrics")
ok "$(awk -v r="${r:-0}" -v a="${ac:-0}" -v d="${dr:-1}" -v t="${tps:-0}" -v s="${sec:-0}" \
    'BEGIN{exit !(r > 0 && r <= 1 && (r - a / d) ^ 2 < 1e-6 && t > 1 && t <= 5 && s > 0)}'; echo $?)" \
    "--spec 4: acceptance ratio ($r) = accepted/drafted, tokens per step ($tps) in (1, 5], step time ($sec s) > 0"
stop_server

start_server -m "$M" --threads 2 --spec 3 --draft "$D"
ok $? "server with --spec 3 --draft tinydraft starts"
requests draft
same_as_plain draft
ok $? "--spec 3 --draft: greedy, seeded, chat and streamed texts equal the plain server's"
n=$(metric strata_spec_steps_total "$TMP/draft.metrics")
ok "$(awk -v n="${n:-0}" 'BEGIN{exit !(n > 0)}'; echo $?)" "--draft: /metrics counts verify windows ($n)"
stop_server

"$BIN/strata-serve" -m "$M" --spec 17 >"$TMP/e1" 2>&1
is "$?" "2" "--spec 17: usage error (exit 2)"
grep -q -- "--spec must be an integer in 0..16" "$TMP/e1"
ok $? "--spec 17: the message names the option and range"
"$BIN/strata-serve" -m "$M" --spec 2 --spec-mode nope >"$TMP/e2" 2>&1
is "$?" "2" "--spec-mode nope: usage error (exit 2)"
start_server -m "$M" --threads 2 --spec 2 --draft "$TMP/missing.gguf" --load-timeout 20
rc=$?
[ $rc -ne 0 ] && grep -q "missing.gguf" "$TMP/server.log"
ok $? "--draft with a missing file: the server stops at start, naming the file"
stop_server
done_testing
