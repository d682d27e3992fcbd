#!/usr/bin/env bash
# strata-serve with the real engine (strata-generate --serve-stdio) on the
# tinycoder model: greedy results equal strata-generate's, stop strings cut
# inside one token and across several, exact usage and logprobs, restart.
. "$(dirname "$0")/serve-lib.sh"

M=$FIX/models/tinycoder-moe-Q4_K_M.gguf
if [ ! -f "$M" ]; then
    echo "1..0 # SKIP $M not found"
    exit 0
fi
PROMPT='def quicksort(arr):'
gen() { "$BIN/strata-generate" -m "$M" --threads 2 --temp 0 "$@"; }

start_server -m "$M" --threads 2
ok $? "server starts with the tinycoder engine"
grep -q "engine 0 ready" "$TMP/server.log"
ok $? "the engine's ready is logged before the port opens"

# greedy completion == strata-generate
want=$(gen -p "$PROMPT" -n 24)
r=$(post /v1/completions "{\"prompt\":\"$PROMPT\",\"max_tokens\":24,\"temperature\":0,\"logprobs\":1}")
echo "$r" >"$TMP/greedy.json"
is "$(echo "$r" | jget 'o.choices[0].text')" "$want" "greedy completion equals strata-generate -n 24 --temp 0"
ntok=$(post /tokenize "{\"content\":\"$PROMPT\"}" | jget 'o.tokens.length')
is "$(echo "$r" | jget 'o.usage.prompt_tokens + " " + o.usage.completion_tokens + " " + o.choices[0].logprobs.tokens.length')" \
    "$ntok 24 24" "usage: prompt tokens equal /tokenize's count, completion tokens equal the tokens produced"
is "$(echo "$r" | jget 'o.choices[0].logprobs.token_logprobs.every(x => x <= 0) && o.choices[0].logprobs.token_logprobs.some(x => x < 0) && o.choices[0].logprobs.tokens.join("") === o.choices[0].text')" \
    "true" "logprobs present (the engine computed them: some below 0), <= 0, one per token"
is "$(post /detokenize "{\"tokens\":$(post /tokenize "{\"content\":\"$PROMPT\"}" | jget 'JSON.stringify(o.tokens)')}" | jget 'o.content')" \
    "$PROMPT" "/tokenize then /detokenize round-trips"

# streamed == non-streamed
post /v1/completions "{\"prompt\":\"$PROMPT\",\"max_tokens\":24,\"temperature\":0,\"stream\":true}" >"$TMP/sse"
is "$(sse_text "$TMP/sse")" "$want" "streamed greedy completion equals the non-streamed one"

# max_tokens 0, 1, 2
for n in 0 1 2; do
    r=$(post /v1/completions "{\"prompt\":\"$PROMPT\",\"max_tokens\":$n,\"temperature\":0,\"logprobs\":0}")
    is "$(echo "$r" | jget 'o.usage.completion_tokens + " " + o.choices[0].logprobs.tokens.length + " " + o.choices[0].finish_reason')" \
        "$n $n length" "max_tokens $n: $n tokens"
done

# stop strings from the greedy tokens: one inside a token, one across three
node -e '
const o = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
const lp = o.choices[0].logprobs, text = o.choices[0].text;
let inside = null, across = null;
for (let i = 0; i < lp.tokens.length; i++) {
  const t = lp.tokens[i], off = lp.text_offset[i];
  if (!inside && t.length >= 3) {
    const s = t.slice(1, t.length - 1);
    if (text.indexOf(s) === off + 1) inside = [s, text.slice(0, off + 1)];
  }
  if (!across && i + 2 < lp.tokens.length && t.length >= 2 && lp.tokens[i + 2].length >= 2 &&
      lp.tokens[i + 1].length >= 1) {
    const s = t.slice(-1) + lp.tokens[i + 1] + lp.tokens[i + 2].slice(0, 1);
    if (text.indexOf(s) === off + t.length - 1) across = [s, text.slice(0, off + t.length - 1)];
  }
}
require("fs").writeFileSync(process.argv[2], JSON.stringify({inside, across}));
' "$TMP/greedy.json" "$TMP/stops.json"
for kind in inside across; do
    stop=$(jget "JSON.stringify(o.$kind[0])" <"$TMP/stops.json")
    wantc=$(jget "o.$kind[1]" <"$TMP/stops.json")
    body="{\"prompt\":\"$PROMPT\",\"max_tokens\":24,\"temperature\":0,\"stop\":[$stop]"
    r=$(post /v1/completions "$body}")
    is "$(echo "$r" | jget 'o.choices[0].text')" "$wantc" "stop string $kind a token ($stop): text cut before it"
    is "$(echo "$r" | jget 'o.choices[0].finish_reason')" "stop" "stop string $kind a token: finish_reason stop"
    post /v1/completions "$body,\"stream\":true}" >"$TMP/sse"
    is "$(sse_text "$TMP/sse")" "$wantc" "stop string $kind a token: streamed text identical"
done

# chat: the model's template rendered, then the same greedy continuation
want=$(gen --chat -p 'write a function' -n 16)
r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"write a function"}],"max_tokens":16,"temperature":0}')
is "$(echo "$r" | jget 'o.choices[0].message.content')" "$want" \
    "chat completion equals strata-generate --chat"

# a long generation (until the context is full) that the client abandons:
# cancelled, and the engine serves the next request
LONG="{\"prompt\":\"$PROMPT\",\"temperature\":0,\"ignore_eos\":true,\"stream\":true}"
curl -s -N -H 'Content-Type: application/json' -d "$LONG" "$URL/v1/completions" >"$TMP/long" &
cpid=$!
i=0
while [ "$(data_lines "$TMP/long")" -lt 3 ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i + 1)); done
kill "$cpid"
wait "$cpid" 2>/dev/null
i=0
while ! grep -q 'cancel=client' "$TMP/server.log" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
grep 'cancel=client' "$TMP/server.log" | grep -q 'done: [0-9]* tokens in .*(cancelled, cancel=client)'
ok $? "a client that disconnects mid-stream: its generation is cancelled"
n=$(sed -n 's/.*done: \([0-9]*\) tokens.*cancel=client.*/\1/p' "$TMP/server.log" | head -1)
[ -n "$n" ] && [ "$n" -lt 4000 ]
ok $? "... long before the context was full ($n tokens)"

# the engine is killed mid-generation: that request fails, saying so
curl -s -N -H 'Content-Type: application/json' -d "$LONG" "$URL/v1/completions" >"$TMP/long" &
cpid=$!
i=0
while [ "$(data_lines "$TMP/long")" -lt 3 ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i + 1)); done
kill -9 "$(curl -s "$URL/health" | jget 'o.models[0].pids[0]')"
wait "$cpid"
grep -q '^data: {"error":{"message":"the engine for model .tinycoder-moe-Q4_K_M. was killed by signal 9' "$TMP/long" &&
    tail -2 "$TMP/long" | grep -q '^data: \[DONE\]$'
ok $? "engine killed mid-stream: the stream ends with an error naming the signal, then [DONE]"
wait_health
r=$(post /v1/completions "{\"prompt\":\"$PROMPT\",\"max_tokens\":24,\"temperature\":0}")
is "$(echo "$r" | jget 'o.choices[0].text')" "$(gen -p "$PROMPT" -n 24)" \
    "the next request succeeds after the restart"

# the engine is killed while idle: the next request is served after the restart
pid=$(curl -s "$URL/health" | jget 'o.models[0].pids[0]')
kill -9 "$pid"
i=0
while curl -s "$URL/health" | jget "o.models[0].pids[0]" | grep -qx "$pid" && [ $i -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
done
wait_health
r=$(post /v1/completions "{\"prompt\":\"$PROMPT\",\"max_tokens\":24,\"temperature\":0}")
is "$(echo "$r" | jget 'o.choices[0].text')" "$(gen -p "$PROMPT" -n 24)" \
    "after the engine was killed, the restarted engine serves the same greedy text"
grep -q "engine 0 was killed by signal 9.*restarting in" "$TMP/server.log"
ok $? "the death is logged with the signal and the restart"

stop_server
is "$SERVER_RC" 0 "clean exit"
done_testing
