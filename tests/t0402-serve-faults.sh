#!/usr/bin/env bash
# strata-serve: engine faults, client disconnects, concurrency and the API key,
# against the scripted engine (tests/serve-fake-engine.js).
. "$(dirname "$0")/serve-lib.sh"

OUT='Hello world. This is STOP a test of the emergency broadcast system.'
CHAT='{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}'

# an engine that cannot load: the server refuses to start and says why
FAKE_FAIL_LOAD=1 start_server --engine "$FAKE" -m "$TMP/broken.gguf"
ok $((! $?)) "an engine that fails to load: the server does not open its port"
is "$SERVER_RC" 3 "... exits with the bad-input status"
grep -q "exited with status 3 before it was ready; last log lines: .*bad magic" "$TMP/server.log"
ok $? "... and reports the engine's exit status and last log lines"

# the engine crashes after 3 tokens of every generation
FAKE_EXIT_AFTER=3 FAKE_HOLD_READY=$TMP/hold start_server --engine "$FAKE" -m "$TMP/m.gguf"
ok $? "server with a crashing engine starts"
r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}]}')
is "$(status)" 500 "engine dies mid-generation -> the request fails (500)"
echo "$r" | jget 'o.error.message' | grep -q "exited with status 3 during this request; last log lines: .*simulated crash"
ok $? "... with the engine's exit status and last log lines"
wait_health
r=$(post /v1/chat/completions "$CHAT")
is "$(status) $(echo "$r" | jget 'o.choices[0].message.content')" "200 Hello " \
    "the next request succeeds after the restart"
curl -s "$URL/metrics" | grep -q '^strata_engine_restarts_total 1$'
ok $? "/metrics counts the restart"
post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"stream":true}' >"$TMP/sse"
grep -q '^data: {"error":{"message":"the engine for model .m. exited with status 3' "$TMP/sse" &&
    tail -2 "$TMP/sse" | grep -q '^data: \[DONE\]$'
ok $? "a stream whose engine dies ends with an error event and [DONE]"
wait_health
touch "$TMP/hold" # the next incarnation stays loading until this file goes
post /v1/completions '{"prompt":"x"}' >/dev/null
is "$(status)" 500 "the engine dies again"
code=$(curl -s -o "$TMP/h" -w '%{http_code}' "$URL/health")
is "$code $(jget 'o.status + " " + o.models[0].engine' <"$TMP/h")" "503 loading restarting" \
    "/health while the engine restarts: 503, engine restarting"
r=$(post /v1/chat/completions "$CHAT")
is "$(status) $(echo "$r" | jget 'o.error.type')" "503 server_error" \
    "a request while the model's engine is loading -> 503"
rm -f "$TMP/hold"
wait_health
r=$(post /v1/chat/completions "$CHAT")
is "$(status)" 200 "served once the engine is ready again"
stop_server
is "$SERVER_RC" 0 "clean exit after restarts"

# an engine that goes silent: the watchdog kills and restarts it
FAKE_HANG_AFTER=2 start_server --engine "$FAKE" -m "$TMP/m.gguf" --watchdog 1
r=$(post /v1/completions '{"prompt":"hi"}')
is "$(status)" 500 "a silent engine -> the request fails"
echo "$r" | jget 'o.error.message' | grep -q "killed by signal 9.*silent for [0-9]* s (watchdog)"
ok $? "... saying the watchdog killed it"
wait_health
r=$(post /v1/completions '{"prompt":"hi","max_tokens":1}')
is "$(status) $(echo "$r" | jget 'o.choices[0].text')" "200 Hel" "served again after the restart"
stop_server

# slow tokens: a client that disconnects mid-stream cancels its generation;
# another client on the other engine is unaffected
FAKE_DELAY_MS=100 start_server --engine "$FAKE" -m "$TMP/m.gguf" --parallel 2
curl -s -N --max-time 0.6 -H 'Content-Type: application/json' \
    -d '{"prompt":"a","stream":true}' "$URL/v1/completions" >"$TMP/cut" 2>/dev/null &
cpid=$!
r=$(post /v1/completions '{"prompt":"b","max_tokens":8}')
wait $cpid
is "$(status) $(echo "$r" | jget 'o.choices[0].text')" "200 Hello world. This is STO" \
    "the other client completes while one disconnects"
grep -q '^data: ' "$TMP/cut"
ok $? "the disconnecting client had received tokens"
i=0
while ! grep -q 'cancel=client' "$TMP/server.log" && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
line=$(grep 'cancel=client' "$TMP/server.log" | head -1)
echo "# $line"
n=$(echo "$line" | sed -n 's/.*done: \([0-9]*\) tokens.*/\1/p')
echo "$line" | grep -q '(cancelled, cancel=client)' && [ -n "$n" ] && [ "$n" -lt 23 ]
ok $? "the disconnected stream's generation was cancelled before its end"
curl -s "$URL/metrics" | grep -q '^strata_requests_cancelled_total 1$'
ok $? "/metrics counts the cancelled request"
stop_server

# 32 concurrent clients, 2 engines: all complete, none lost
start_server --engine "$FAKE" -m "$TMP/m.gguf" --parallel 2
pids=
for i in $(seq 1 32); do
    if [ $((i % 2)) = 0 ]; then
        curl -s -H 'Content-Type: application/json' -d "{\"prompt\":\"$i\",\"max_tokens\":$((i % 5 + 1))}" \
            "$URL/v1/completions" >"$TMP/c$i" &
    else
        curl -s -N -H 'Content-Type: application/json' \
            -d "{\"prompt\":\"$i\",\"max_tokens\":$((i % 5 + 1)),\"stream\":true}" \
            "$URL/v1/completions" >"$TMP/c$i" &
    fi
    pids="$pids $!"
done
wait $pids
good=$(node -e '
const fs = require("fs");
const [dir, out] = process.argv.slice(1);
let good = 0;
for (let i = 1; i <= 32; i++) {
  const want = out.slice(0, 3 * (i % 5 + 1));
  const t = fs.readFileSync(dir + "/c" + i, "utf8");
  let got = "";
  try {
    if (i % 2 === 0) got = JSON.parse(t).choices[0].text;
    else if (t.endsWith("data: [DONE]\n\n"))
      for (const l of t.split("\n"))
        if (l.startsWith("data: {")) got += JSON.parse(l.slice(6)).choices[0]?.text ?? "";
  } catch (e) { got = "<" + e.message + ">"; }
  if (got === want) good++; else console.error("# client " + i + ": " + JSON.stringify(got));
}
process.stdout.write(String(good));
' "$TMP" "$OUT")
is "$good" 32 "32 concurrent clients all get their complete answer"
stop_server
is "$SERVER_RC" 0 "clean exit after the concurrent load"

# two models: requests go to the one they name; a request without a model is refused
start_server --engine "$FAKE" -m "$TMP/alpha.gguf" -m "$TMP/beta.strata/"
is "$(curl -s "$URL/v1/models" | jget 'o.data.map(m => m.id).join(",")')" "alpha,beta" \
    "two models listed, ids from the file names"
r=$(post /v1/completions '{"model":"beta","prompt":"x","max_tokens":1}')
is "$(status) $(echo "$r" | jget 'o.model + " " + o.choices[0].text')" "200 beta Hel" "a request for beta"
r=$(post /v1/completions '{"prompt":"x","max_tokens":1}')
is "$(status) $(echo "$r" | jget 'o.error.param')" "400 model" "no model with two models -> 400 naming 'model'"
r=$(post /v1/completions "{\"model\":\"alpha\",\"prompt\":\"$(head -c 5000 /dev/zero | tr '\0' x)\"}")
is "$(status) $(echo "$r" | jget 'o.error.param + ": " + o.error.message')" \
    "400 prompt: prompt of 5000 tokens does not fit the context of 4096" \
    "a prompt longer than the context -> 400 with the engine's message"
stop_server

# --api-key: missing or wrong key -> 401 and nothing generated
start_server --engine "$FAKE" -m "$TMP/m.gguf" --api-key s3cret
r=$(post /v1/chat/completions "$CHAT")
is "$(status) $(echo "$r" | jget 'o.error.code')" "401 invalid_api_key" "no key -> 401"
r=$(post /v1/chat/completions "$CHAT" -H 'Authorization: Bearer s3cre')
is "$(status)" 401 "a wrong key -> 401"
r=$(post /v1/models "$CHAT" -H 'Authorization: Bearer s3cret!')
is "$(status)" 401 "a longer key -> 401"
curl -s "$URL/metrics" -H 'Authorization: Bearer s3cret' | grep -q '^strata_tokens_generated_total 0$'
ok $? "nothing was generated for the refused requests"
r=$(post /v1/chat/completions "$CHAT" -H 'Authorization: Bearer s3cret')
is "$(status) $(echo "$r" | jget 'o.choices[0].message.content')" "200 Hello " "the right key -> 200"
is "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" 200 "/health needs no key"
stop_server
done_testing
