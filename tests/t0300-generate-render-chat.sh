#!/usr/bin/env bash
# strata-generate --render-chat: chat requests through the model's own template (and
# --chat-template), against the HF reference renderings in the fixtures.
. "$(dirname "$0")/lib.sh"
G="$STRATA_BIN/strata-generate"
M="$STRATA_FIXTURES/models/tinycoder-moe-F16.gguf"
TPL="$STRATA_FIXTURES/templates"

perl_json() { # FILE PERL-EXPR: evaluate over the decoded document, print raw UTF-8
    perl -MJSON::PP -e 'local $/; open my $f, "<", $ARGV[0] or die; $_ = decode_json(<$f>);
        binmode STDOUT, ":utf8"; print eval($ARGV[1])' "$1" "$2"
}

# 1. the model's own template (tokenizer.chat_template), as transformers rendered it
printf '%s' '{"messages": [{"role": "system", "content": "You are a coder."},
  {"role": "user", "content": "Write a loop."}]}' >"$T/chat.json"
perl_json "$STRATA_FIXTURES/ref/tinycoder-hf-reference.json" '$_->{chat}' >"$T/want"
"$G" -m "$M" --render-chat "$T/chat.json" >"$T/out" 2>"$T/err"; rc=$?
check "tinycoder: exit 0" test $rc -eq 0
check "tinycoder: nothing on stderr" test ! -s "$T/err"
check "tinycoder: prompt equals the HF rendering" cmp -s "$T/want" "$T/out"
"$G" -m "$M" --render-chat - <"$T/chat.json" >"$T/out2" 2>/dev/null
check "request from stdin" cmp -s "$T/want" "$T/out2"

# 2. --chat-template, bos/eos from chat_template_kwargs (conversations whose rendering
#    does not depend on JSON key order: perl does not keep it)
for tpl in Qwen3-Coder.jinja openai-gpt-oss-120b.jinja GLM-4.6.jinja; do
    for conv in reasoning no-gen-prompt unicode; do
        perl_json "$TPL/reference.json" '
            my $c = $_->{conversations}{"'$conv'"}; $c->{chat_template_kwargs} = $_->{variables};
            JSON::PP->new->utf8(0)->encode($c)' >"$T/req.json"
        perl_json "$TPL/reference.json" '$_->{templates}{"'$tpl'"}{"'$conv'"}{expected}' >"$T/want"
        SOURCE_DATE_EPOCH=1796040000 TZ=UTC "$G" -m "$M" --chat-template "$TPL/$tpl" \
            --render-chat "$T/req.json" >"$T/out" 2>"$T/err"
        check "$tpl / $conv equals jinja2's rendering" cmp -s "$T/want" "$T/out"
    done
done
"$G" --chat-template "$TPL/Qwen3-Coder.jinja" --render-chat "$T/chat.json" --json >"$T/j" 2>&1
check "--json names the tool-call format" test "$(perl_json "$T/j" '$_->{format}')" = qwen3-coder
check "--json prompt" test "$(perl_json "$T/j" '$_->{prompt}')" = "$(printf '<|im_start|>system\nYou are a coder.<|im_end|>\n<|im_start|>user\nWrite a loop.<|im_end|>\n<|im_start|>assistant\n')"

# 3. the template refuses a conversation: its own message, exit 3
perl_json "$TPL/reference.json" 'JSON::PP->new->utf8(0)->encode($_->{conversations}{"tools-call"})' \
    >"$T/tc.json"
"$G" --chat-template "$TPL/Mistral-Small-3.2-24B-Instruct-2506.jinja" --render-chat "$T/tc.json" \
    >"$T/out" 2>"$T/err"; rc=$?
check "raise_exception: exit 3" test $rc -eq 3
check "raise_exception: the template's message" \
    grep -q 'chat template error: Tool call IDs should be alphanumeric strings with length 9!' "$T/err"
check "raise_exception: nothing on stdout" test ! -s "$T/out"

# 4. hostile and broken templates: bounded, with line and column
printf '%s\n' '{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}' \
    >"$T/loop.jinja"
timeout 60 "$G" --chat-template "$T/loop.jinja" --render-chat "$T/chat.json" >/dev/null 2>"$T/err"
rc=$?
check "endless loop: fails (not killed)" test $rc -ne 0 -a $rc -ne 124
check "endless loop: says which limit, where" grep -q "line 1 column .*iterations" "$T/err"
printf 'line one\n{%% if messages %%}\nunclosed\n' >"$T/open.jinja"
"$G" --chat-template "$T/open.jinja" --render-chat "$T/chat.json" >/dev/null 2>"$T/err"; rc=$?
check "unclosed block: exit 3" test $rc -eq 3
check "unclosed block: expected 'endif'" grep -q "expected 'endif'" "$T/err"

# 5. usage and input errors
"$G" --render-chat "$T/chat.json" >/dev/null 2>"$T/err"; rc=$?
check "no model and no template: exit 2" test $rc -eq 2
printf '{"messages": ' >"$T/bad.json"
"$G" -m "$M" --render-chat "$T/bad.json" >/dev/null 2>"$T/err"; rc=$?
check "truncated JSON: exit 3" test $rc -eq 3
check "truncated JSON: names the file" grep -q "bad.json" "$T/err"
printf '{"prompt": "x"}' >"$T/nomsg.json"
"$G" -m "$M" --render-chat "$T/nomsg.json" >/dev/null 2>"$T/err"; rc=$?
check "no messages: refused, naming the field" grep -q "'messages'" "$T/err"
"$G" -m "$M" --render-chat "$T/missing.json" >/dev/null 2>"$T/err"; rc=$?
check "missing request file: fails naming it" grep -q "missing.json" "$T/err"
done_testing
