#!/usr/bin/env bash
# strata-serve: the OpenAI protocol against a scripted engine (tests/serve-fake-engine.js:
# tokens are bytes, the output is a fixed sentence in 3-byte tokens).
. "$(dirname "$0")/serve-lib.sh"

OUT='Hello world. This is STOP a test of the emergency broadcast system.'

# the scripted engine's ChatML template, plus a refusal as real templates have
cat >"$TMP/tmpl.jinja" <<'EOF'
{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('role bad is not allowed here') }}{% endif %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}
EOF
start_server --engine "$FAKE" -m "$TMP/tiny-model.gguf" --chat-template "$TMP/tmpl.jinja"
ok $? "server starts on a free port with a scripted engine"

r=$(curl -s "$URL/health")
is "$(echo "$r" | jget 'o.status + " " + o.models[0].id + " " + o.models[0].engine')" \
    "ok tiny-model ready" "/health: status, model id from the file name, engine state"
r=$(curl -s "$URL/v1/models")
is "$(echo "$r" | jget 'o.object + " " + o.data.map(m => m.id).join(",")')" "list tiny-model" \
    "/v1/models lists the model"

# completions: text, usage, finish_reason for max_tokens 0, 1, 2 and unlimited
for n in 0 1 2; do
    r=$(post /v1/completions "{\"prompt\":\"hello\",\"max_tokens\":$n}")
    want=${OUT:0:$((3 * n))}
    is "$(echo "$r" | jget 'JSON.stringify([o.choices[0].text, o.usage.prompt_tokens, o.usage.completion_tokens, o.usage.total_tokens, o.choices[0].finish_reason])')" \
        "$(printf '["%s",5,%d,%d,"length"]' "$want" "$n" $((5 + n)))" \
        "max_tokens $n: exactly $n tokens, exact usage"
done
r=$(post /v1/completions '{"prompt":"hello"}')
is "$(echo "$r" | jget 'o.choices[0].text + "|" + o.choices[0].finish_reason + "|" + o.usage.completion_tokens')" \
    "$OUT|stop|23" "no max_tokens: the whole output, finish_reason stop at end of generation"

# chat: the prompt is the model's template; usage counts its tokens (bytes here)
prompt=$'<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n'
r=$(post /v1/chat/completions '{"model":"tiny-model","messages":[{"role":"user","content":"hi there"}],"max_tokens":4}')
is "$(echo "$r" | jget 'JSON.stringify([o.object, o.choices[0].message.role, o.choices[0].message.content, o.usage.prompt_tokens, o.usage.completion_tokens])')" \
    "[\"chat.completion\",\"assistant\",\"Hello world.\",${#prompt},4]" \
    "chat completion: content, prompt tokens of the rendered template, completion tokens"
r2=$(post /v1/chat/completions '{"messages":[{"role":"user","content":[{"type":"text","text":"hi there"}]}],"max_tokens":4}')
is "$(echo "$r2" | jget 'o.choices[0].message.content + "|" + o.usage.prompt_tokens')" \
    "Hello world.|${#prompt}" "a content-part array renders like the string"

# logprobs
r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"max_tokens":6,"logprobs":true,"top_logprobs":1}')
is "$(echo "$r" | jget 'const c = o.choices[0].logprobs.content; c.length + " " + c.every(e => typeof e.logprob === "number" && e.logprob <= 0 && e.top_logprobs.length <= 1) + " " + c.map(e => e.token).join("")')" \
    "6 true Hello world. This " "chat logprobs: one entry per token, all <= 0, tokens spell the text"
r=$(post /v1/completions '{"prompt":"x","max_tokens":3,"logprobs":2}')
is "$(echo "$r" | jget 'const l = o.choices[0].logprobs; l.tokens.join("") + " " + l.token_logprobs.every(x => x <= 0) + " " + l.text_offset.join(",")')" \
    "Hello wor true 0,3,6" "completion logprobs: tokens, token_logprobs <= 0, text offsets"

# SSE framing and streamed == non-streamed, with stop strings
sse_ok() {
    node -e '
const fs = require("fs");
const t = fs.readFileSync(process.argv[1], "utf8");
const ev = t.split("\n\n");
if (ev.pop() !== "") throw new Error("stream does not end with a blank line");
if (ev[ev.length - 1] !== "data: [DONE]") throw new Error("last event is not [DONE]");
for (const e of ev.slice(0, -1)) {
  if (!e.startsWith("data: ") || e.includes("\n")) throw new Error("bad event: " + e);
  JSON.parse(e.slice(6));
}
' "$1"
}
for stop in '"or"' '"world. This"' '["zzz","m.X"]' '"STOP"'; do
    body="{\"prompt\":\"p\",\"stop\":$stop"
    r=$(post /v1/completions "$body}")
    plain=$(echo "$r" | jget 'o.choices[0].text')
    post /v1/completions "$body,\"stream\":true}" >"$TMP/sse"
    sse_ok "$TMP/sse"
    ok $? "stop $stop: SSE framing (data: lines, blank-line separated, data: [DONE])"
    is "$(sse_text "$TMP/sse")" "$plain" "stop $stop: streamed text equals the non-streamed text"
    case $stop in
    '"or"') want='Hello w' ;;
    '"world. This"') want='Hello ' ;;
    '"STOP"') want='Hello world. This is ' ;;
    *) want=$OUT ;;
    esac
    is "$plain" "$want" "stop $stop: text cut before the stop string (or kept whole)"
    if grep -q '"text":"[^"]*o"' "$TMP/sse" && [ "$stop" = '"world. This"' ]; then
        ok 1 "no chunk carries part of a stop string"
    fi
done
r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"stop":["test"],"stream":true,"stream_options":{"include_usage":true}}' >"$TMP/sse")
sse_ok "$TMP/sse"
ok $? "chat stream: SSE framing"
is "$(sse_text "$TMP/sse")" "Hello world. This is STOP a " "chat stream: deltas spell the text up to the stop string"
is "$(grep '^data: {' "$TMP/sse" | tail -1 | sed 's/^data: //' | jget 'JSON.stringify([o.choices.length, o.usage.completion_tokens, o.object])')" \
    '[0,11,"chat.completion.chunk"]' "include_usage: a last chunk with empty choices and the usage"
is "$(grep '^data: {' "$TMP/sse" | head -1 | sed 's/^data: //' | jget 'o.choices[0].delta.role')" \
    "assistant" "the first chunk carries the role"
is "$(grep -c '"finish_reason":"stop"' "$TMP/sse")" "1" "exactly one chunk has finish_reason stop"

# bad requests: OpenAI error objects naming the field
r=$(post /v1/chat/completions '{"messages":[]}')
is "$(status) $(echo "$r" | jget 'o.error.type + " " + o.error.param')" \
    "400 invalid_request_error messages" "empty messages -> 400 naming 'messages'"
r=$(post /v1/chat/completions '{"messages":[{"role":"bad","content":"x"}]}')
is "$(status) $(echo "$r" | jget 'o.error.param + ": " + o.error.message')" \
    "400 messages: role bad is not allowed here" "a template's raise_exception -> 400 with its message"
r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}')
is "$(status) $(echo "$r" | jget 'o.error.type')" "400 invalid_request_error" "malformed JSON -> 400"
r=$(post /v1/chat/completions '{"model":"nope","messages":[{"role":"user","content":"x"}]}')
is "$(status) $(echo "$r" | jget 'o.error.code + " " + o.error.param')" "404 model_not_found model" \
    "unknown model -> 404 model_not_found"
r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"n":2}')
is "$(status) $(echo "$r" | jget 'o.error.param')" "400 n" "n = 2 -> 400 naming 'n'"
r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"top_p":7}')
is "$(status) $(echo "$r" | jget 'o.error.param')" "400 top_p" "top_p out of range -> 400 naming it"
r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}')
is "$(status) $(echo "$r" | jget 'o.error.param')" "400 max_tokens" "negative max_tokens -> 400"
r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"stop":[1]}')
is "$(status) $(echo "$r" | jget 'o.error.param')" "400 stop" "stop of numbers -> 400 naming 'stop'"
r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,"}}]}]}')
is "$(status) $(echo "$r" | jget 'o.error.param')" "400 messages[0].content[0]" \
    "an image part -> 400 naming the part"
r=$(post /v1/completions '{"prompt":5}')
is "$(status) $(echo "$r" | jget 'o.error.param')" "400 prompt" "a prompt that is a number -> 400"
head -c $((10 * 1024 * 1024 + 1)) /dev/zero | tr '\0' 'a' >"$TMP/big"
code=$(curl -s -o "$TMP/body" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data-binary @"$TMP/big" "$URL/v1/completions")
is "$code $(jget 'o.error.code' <"$TMP/body")" "413 request_too_large" "a body over 10 MB -> 413"
code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v2/nothing")
is "$code" "404" "unknown endpoint -> 404"
code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/chat/completions")
is "$code" "405" "GET on a POST endpoint -> 405"

# tokenize / detokenize
r=$(post /tokenize '{"content":"héllo"}')
is "$r" '{"tokens":[104,195,169,108,108,111]}' "/tokenize returns the engine's ids"
r=$(post /detokenize '{"tokens":[104,195,169,108,108,111]}')
is "$r" '{"content":"héllo"}' "/detokenize returns the text"

# metrics
curl -s "$URL/metrics" >"$TMP/metrics"
grep -q '^strata_requests_total [1-9]' "$TMP/metrics" && grep -q '^strata_queue_length 0' "$TMP/metrics" &&
    grep -q '^# TYPE strata_tokens_generated_total counter' "$TMP/metrics"
ok $? "/metrics: Prometheus text with requests, tokens, queue length"
grep -q 'done: 2 tokens in .* s (.* tok/s) (length, cancel=no)' "$TMP/server.log"
ok $? "a log line per request: done: N tokens in T s (R tok/s) (reason, cancel=...)"

stop_server
is "$SERVER_RC" 0 "SIGTERM: clean exit (engines shut down, nothing leaked)"

# usage
"$BIN/strata-serve" --help >"$TMP/help" 2>&1
is "$? $(head -c 19 "$TMP/help")" "0 usage: strata-serve" "--help: usage on stdout, status 0"
"$BIN/strata-serve" >/dev/null 2>"$TMP/err"
is "$? $(head -1 "$TMP/err")" "2 strata-serve: no model given (-m MODEL)" "no model: usage error, status 2"
"$BIN/strata-serve" -m x --port 70000 >/dev/null 2>"$TMP/err"
is "$? $(head -1 "$TMP/err")" "2 strata-serve: --port must be an integer in 0..65535, not '70000'" \
    "a bad --port: status 2 naming it"
"$BIN/strata-serve" -m x --engine /nonexistent/engine --port 0 >/dev/null 2>"$TMP/err"
rc=$?
[ $rc != 0 ] && grep -q "engine for model 'x' exited with status 127 before it was ready" "$TMP/err"
ok $? "an engine program that cannot run: the server exits saying so (status $rc)"
done_testing
