#!/usr/bin/env bash
# strata-generate: options, --json events, -n 0/1, stop strings, bad input and
# its exit codes (2 usage, 3 bad input).
. "$(dirname "$0")/lib.sh"
G="$STRATA_BIN/strata-generate"
M="$STRATA_FIXTURES/models/stories260K.gguf"

out=$("$G" --help); rc=$?
check "--help exits 0" test $rc -eq 0
check "--help shows usage" grep -q '^usage: strata-generate' <<<"$out"
"$G" --bogus >/dev/null 2>"$T/err"; rc=$?
check "unknown option exits 2" test $rc -eq 2
"$G" -p hi >/dev/null 2>"$T/err"; rc=$?
check "no model: exit 2" test $rc -eq 2
check "no model: says so" grep -q 'no model given' "$T/err"
"$G" -m "$M" -p hi --top-p x >/dev/null 2>"$T/err"; rc=$?
check "bad --top-p: exit 2, named" bash -c "test $rc -eq 2 && grep -q \"invalid --top-p 'x'\" '$T/err'"

# -n 0 and -n 1 in --json: exactly 0 and 1 token events
"$G" -m "$M" -p "Once upon a time" -n 0 --json -t 2 >"$T/j0"; rc=$?
check "-n 0: exit 0" test $rc -eq 0
check "-n 0: no token events" test "$(grep -c '"id"' "$T/j0")" -eq 0
check "-n 0: summary n_gen 0" grep -q '"n_gen":0' "$T/j0"
"$G" -m "$M" -p "Once upon a time" -n 1 --json -t 2 --temp 0 --logprobs >"$T/j1"; rc=$?
check "-n 1: exactly one token event" test "$(grep -c '"id"' "$T/j1")" -eq 1
check "-n 1 --logprobs: token has text and logprob" grep -q '"id":[0-9]*,"text":".*","logprob":-\?[0-9]' "$T/j1"
"$G" -m "$M" -p "Once upon a time" -n 1 --json -t 2 --temp 0 >"$T/j1n"
check "-n 1 without --logprobs: token has text, no logprob" \
    bash -c "grep -q '\"id\":[0-9]*,\"text\":' '$T/j1n' && ! grep -q logprob '$T/j1n'"
check "-n 1: summary" grep -q '"done":true.*"n_gen":1.*"stop_reason":"length"' "$T/j1"
check "summary has prefill and decode tok/s" grep -q '"prefill_tps":.*"decode_tps":' "$T/j1"

# the engine protocol: token events carry "logprob" only when the request asks
coproc ENG { "$G" -m "$M" -t 2 --serve-stdio --no-selftest 2>/dev/null; }
echo '{"type":"generate","id":"a","prompt":"Once","max_tokens":2,"temperature":0}' >&"${ENG[1]}"
echo '{"type":"generate","id":"b","prompt":"Once","max_tokens":2,"temperature":0,"logprobs":true}' >&"${ENG[1]}"
echo '{"type":"generate","id":"c","prompt":"Once","max_tokens":1,"temperature":0,"top_logprobs":1e10}' >&"${ENG[1]}"
: >"$T/ev"
while IFS= read -r -t 60 line <&"${ENG[0]}"; do
    echo "$line" >>"$T/ev"
    case $line in *'"type":"done","id":"c"'*) break ;; esac
done
echo '{"type":"shutdown"}' >&"${ENG[1]}"
wait "$ENG_PID" 2>/dev/null
check "engine protocol: 2 token events without logprob when not asked" \
    test "$(grep '"type":"token","id":"a"' "$T/ev" | grep -vc logprob)" -eq 2
check "engine protocol: 2 token events with a logprob when asked (\"logprobs\":true)" \
    test "$(grep '"type":"token","id":"b"' "$T/ev" | grep -c '"logprob":-')" -eq 2
check "engine protocol: top_logprobs 1e10 is taken as 20 (a logprob and 20 alternatives)" \
    test "$(grep '"type":"token","id":"c"' "$T/ev" | grep '"logprob":-' | grep -o '"tok":' | wc -l)" -eq 21

# stop string: the text stops before it, the reason says so
"$G" -m "$M" -p "Once upon a time" -n 64 --temp 0 --stop "little g" -t 2 >"$T/s" 2>/dev/null
check "stop: text ends before the stop string" test "$(cat "$T/s")" = ", there was a "
"$G" -m "$M" -p "Once upon a time" -n 64 --temp 0 --stop "little g" --json -t 2 >"$T/sj"
check "stop: reason stop" grep -q '"stop_reason":"stop"' "$T/sj"

# seeds reproduce sampled text; another seed differs
"$G" -m "$M" -p "Once" -n 24 --temp 1 --seed 5 -t 2 >"$T/a" 2>/dev/null
"$G" -m "$M" -p "Once" -n 24 --temp 1 --seed 5 -t 2 >"$T/b" 2>/dev/null
"$G" -m "$M" -p "Once" -n 24 --temp 1 --seed 6 -t 2 >"$T/c" 2>/dev/null
check "same seed, same text" cmp "$T/a" "$T/b"
check "other seed, other text" bash -c "! cmp -s '$T/a' '$T/c'"

# prompt on stdin
echo -n "Once upon a time" | "$G" -m "$M" -n 4 --temp 0 -t 2 >"$T/in"
check "prompt from stdin" test "$(cat "$T/in")" = ", there was a"

# bad input: exit 3 with a clear message
"$G" -m "$M" -p "" -n 4 >/dev/null 2>"$T/err"; rc=$?
check "empty prompt: exit 3" test $rc -eq 3
check "empty prompt: message" grep -q 'empty prompt' "$T/err"
"$G" -m "$M" -p "Once upon a time there was a little girl" --ctx 4 -n 4 >/dev/null 2>"$T/err"; rc=$?
check "prompt longer than --ctx: exit 3" test $rc -eq 3
check "prompt longer than --ctx: message" grep -q 'does not fit the context of 4 tokens' "$T/err"
"$G" -m "$T/nonexistent.gguf" -p hi >/dev/null 2>"$T/err"; rc=$?
check "missing model file: exit 1, named" bash -c "test $rc -eq 1 && grep -q nonexistent.gguf '$T/err'"
perl -0777 -pe 's/blk\.0\.ffn_up\.weight/blk.0.ffn_xx.weight/' "$M" >"$T/notensor.gguf"
"$G" -m "$T/notensor.gguf" -p hi >/dev/null 2>"$T/err"; rc=$?
check "missing tensor: exit 3" test $rc -eq 3
check "missing tensor: named" grep -q "required tensor 'blk.0.ffn_up.weight' not found" "$T/err"
perl -0777 -pe 's/llama\.embedding_length/llama.embedding_lengtX/' "$M" >"$T/nokey.gguf"
"$G" -m "$T/nokey.gguf" -p hi >/dev/null 2>"$T/err"; rc=$?
check "missing key: exit 3" test $rc -eq 3
check "missing key: named" grep -q "required key 'llama.embedding_length' not found" "$T/err"
"$G" -m "$M" -p hi --backend cuda >/dev/null 2>"$T/err"; rc=$?
check "--backend cuda on a cpu build: exit 3, says so" bash -c "test $rc -eq 3 && grep -q \"backend 'cuda'\" '$T/err'"

# --chat: the prompt goes through the model's chat template (ChatML here)
C="$STRATA_ROOT/tests/data/tinycoder-moe-Q4_K_M.gguf"
"$G" -m "$C" --chat --system "Be brief." -p "hi" -n 0 --echo -t 2 >"$T/chat"; rc=$?
check "--chat: exit 0" test $rc -eq 0
check "--chat: system and user turns rendered" bash -c "grep -qx 'system' '$T/chat' && grep -qx 'Be brief.' '$T/chat' && grep -qx 'user' '$T/chat' && grep -qx 'assistant' '$T/chat'"
np_chat=$("$G" -m "$C" --chat -p "hi" -n 0 --json | grep -o '"n_prompt":[0-9]*' | cut -d: -f2)
np_raw=$("$G" -m "$C" -p "hi" -n 0 --json | grep -o '"n_prompt":[0-9]*' | cut -d: -f2)
check "--chat: the rendered prompt is longer ($np_chat > $np_raw tokens)" test "${np_chat:-0}" -gt "${np_raw:-0}"

# --dump-logits: n_prompt x n_vocab float32
"$G" -m "$M" -p "Once upon a time" --dump-logits "$T/l.f32" -t 2; rc=$?
n=$("$G" -m "$M" -p "Once upon a time" -n 0 --json | grep -o '"n_prompt":[0-9]*' | cut -d: -f2)
check "--dump-logits writes n_prompt x 512 floats" test "$(stat -c %s "$T/l.f32")" -eq $((n * 512 * 4))
# output that cannot be written is a failure, not a silent success
"$G" -m "$M" -p "Once upon a time" -n 4 -t 2 >/dev/full 2>"$T/full.err"; rc=$?
check "generation to a full device: exit 1" test $rc -eq 1
check "generation to a full device: said" grep -q 'cannot write the output' "$T/full.err"
"$G" -m "$M" --tokenize hello >/dev/full 2>/dev/null; rc=$?
check "--tokenize to a full device: exit 1" test $rc -eq 1
"$G" -m "$M" --backend foo -p hi 2>"$T/be.err" >/dev/null; rc=$?
check "--backend foo: usage error, exit 2" test $rc -eq 2
check "--backend foo: named" grep -q "invalid --backend 'foo'" "$T/be.err"
done_testing
