#!/usr/bin/env bash
# strata-serve with the official `openai` npm client (installed here with npm
# into an ignored directory): chat, streamed chat with usage, completion, and a
# tools round trip through the model's chat template.  Results equal
# strata-generate's greedy output on the tinycoder model.
. "$(dirname "$0")/serve-lib.sh"

M=$FIX/models/tinycoder-moe-Q4_K_M.gguf
TEMPLATE=$FIX/templates/Qwen-Qwen3-0.6B.jinja
NPM_DIR=${STRATA_NPM_DIR:-$ROOT/build/npm-openai}
OPENAI_VERSION=5.23.2
if [ ! -f "$M" ] || [ ! -f "$TEMPLATE" ]; then
    echo "1..0 # SKIP fixtures not found"
    exit 0
fi
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
    echo "1..0 # SKIP node/npm not installed"
    exit 0
fi
if [ ! -f "$NPM_DIR/node_modules/openai/package.json" ] ||
    ! grep -q "\"version\": \"$OPENAI_VERSION\"" "$NPM_DIR/node_modules/openai/package.json"; then
    mkdir -p "$NPM_DIR"
    if ! npm install --prefix "$NPM_DIR" --no-audit --no-fund --no-save --loglevel=error \
        "openai@$OPENAI_VERSION" >"$TMP/npm.log" 2>&1; then
        echo "1..0 # SKIP npm install openai@$OPENAI_VERSION failed: $(tail -1 "$TMP/npm.log")"
        exit 0
    fi
fi

: >"$TMP/force"
STRATA_TEST_FORCE_OUTPUT_FILE=$TMP/force start_server -m "$M" --threads 2 --api-key test-key \
    --chat-template "$TEMPLATE"
ok $? "server starts with an API key and the Qwen3 (hermes tool-call) template"
ID=tinycoder-moe-Q4_K_M

node "$ROOT/tests/serve-openai-client.js" "$NPM_DIR/node_modules/openai" "$URL/v1" test-key "$ID" \
    "$TMP/force" >"$TMP/res.json"
ok $? "the openai client ran every call without an exception"
grep -q '"error"' "$TMP/res.json" && sed 's/^/# /' "$TMP/res.json" | head -20
r() { jget "$1" <"$TMP/res.json"; }

gen() { "$BIN/strata-generate" -m "$M" --threads 2 --temp 0 "$@"; }
want_chat=$(gen --chat --chat-template "$TEMPLATE" -p 'write a function' -n 16)
is "$(r 'o.chat.content')" "$want_chat" "chat completion equals strata-generate's greedy output"
is "$(r 'o.chat.usage.completion_tokens + " " + o.chat.finish')" "16 length" "chat usage and finish_reason"
is "$(r 'o.stream.content')" "$want_chat" "streamed chat completion equals it too"
is "$(r 'JSON.stringify([o.stream.usage.prompt_tokens, o.stream.usage.completion_tokens, o.stream.finish])')" \
    "$(r 'JSON.stringify([o.chat.usage.prompt_tokens, 16, "length"])')" "stream usage (include_usage) is exact"
is "$(r 'o.completion.text')" "$(gen -p 'def quicksort(arr):' -n 24)" \
    "completion equals strata-generate's greedy output"
is "$(r 'o.models.join(",")')" "$ID" "models.list()"
is "$(r 'JSON.stringify(o.tool_call)')" \
    '{"finish":"tool_calls","name":"get_weather","arguments":{"city":"Paris"},"id":"call_0"}' \
    "tools: the scripted tool call comes back as tool_calls"
is "$(r 'JSON.stringify(o.tool_stream)')" \
    '{"finish":"tool_calls","calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}' \
    "tools, streamed: tool_calls deltas"
is "$(r 'JSON.stringify(o.tool_content)')" '{"stream":"I will look it up.","whole":"I will look it up.","calls":1}' \
    "tools: content before a call, streamed and whole alike"
is "$(r 'JSON.stringify(o.tool_answer)')" '{"content":"It is sunny in Paris.","finish":"stop"}' \
    "tools: the tool result goes back through the template and the answer is content"
is "$(r 'JSON.stringify(o.not_found)')" '{"status":404,"code":"model_not_found"}' "unknown model -> NotFoundError"
is "$(r 'JSON.stringify(o.bad_key)')" '{"status":401}' "wrong key -> AuthenticationError"
stop_server
is "$SERVER_RC" 0 "clean exit"
done_testing
