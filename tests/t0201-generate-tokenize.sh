#!/usr/bin/env bash
# strata-generate --tokenize / --detokenize: ids equal to the Hugging Face
# tokenizer's (tinycoder reference), vocabulary-only GGUFs, stdin read
# verbatim, specials on and off, --json pieces, round trips, BOS, errors.
. "$(dirname "$0")/lib.sh"
G="$STRATA_BIN/strata-generate"
TC="$STRATA_FIXTURES/models/tinycoder-moe-F16.gguf"
Q="$STRATA_FIXTURES/vocab/ggml-vocab-qwen2.gguf"
S="$STRATA_FIXTURES/models/stories260K.gguf"

# stdin verbatim, trailing newline included (ref/tinycoder-hf-reference.json)
printf 'def f(x):\n    return x*2\n' >"$T/code"
"$G" -m "$TC" --tokenize - <"$T/code" >"$T/out" 2>"$T/err"; rc=$?
check "--tokenize - exits 0" test $rc -eq 0
check "stdin text gives the reference ids" \
    test "$(cat "$T/out")" = "328 287 562 324 261 365 412 12 20 201"
check "nothing on stderr" test ! -s "$T/err"

check "digits one by one, as the reference" \
    test "$("$G" -m "$TC" --tokenize '3.14159 12345678')" = \
         "21 16 19 22 19 23 27 223 19 20 21 22 23 24 25 26"

# a vocabulary-only GGUF (no tensors)
check "vocabulary-only GGUF: 'Hello world'" test "$("$G" -m "$Q" --tokenize 'Hello world')" = "9707 1879"

# specials parsed by default, plain text with --no-special
"$G" -m "$Q" --tokenize '<|im_start|>user' >"$T/on"
"$G" -m "$Q" --tokenize '<|im_start|>user' --no-special >"$T/off"
check "specials on: <|im_start|> is 151644" test "$(cat "$T/on")" = "151644 872"
check "specials off: no 151644" bash -c "! grep -qw 151644 '$T/off'"
check "specials off: more tokens" test "$(wc -w <"$T/off")" -gt 2

# --json: ids with raw pieces and decoded text
"$G" -m "$Q" --tokenize 'Hello world' --json >"$T/json"
check "--json has the ids" grep -q '"ids":\[9707,1879\]' "$T/json"
check "--json has the byte-level piece" grep -q '"piece":"Ġworld"' "$T/json"
check "--json has the decoded text" grep -q '"text":" world"' "$T/json"

# round trip through --detokenize (exact bytes, no newline added)
printf 'héllo wörld — ünïcode ✅ 🦙\n\tx  = [1, 2]\n' >"$T/text"
ids=$("$G" -m "$Q" --tokenize - <"$T/text")
"$G" -m "$Q" --detokenize "$ids" >"$T/back"
check "--detokenize gives back the text" cmp "$T/text" "$T/back"
check "--detokenize renders specials" test "$("$G" -m "$Q" --detokenize '151644 872')" = "<|im_start|>user"

# BOS only when asked, and only when the vocabulary has one
check "--add-bos on an SPM vocabulary prepends 1" bash -c "'$G' -m '$S' --tokenize 'Once' --add-bos | grep -q '^1 '"
check "no BOS without --add-bos" bash -c "! '$G' -m '$S' --tokenize 'Once' | grep -q '^1 '"
check "--add-bos on qwen2 (no BOS) adds nothing" \
    test "$("$G" -m "$Q" --tokenize 'Hello world' --add-bos)" = "9707 1879"

# invalid UTF-8 is replaced by U+FFFD; the empty text gives an empty line
printf 'a\377b' | "$G" -m "$Q" --tokenize - >"$T/bad"; rc=$?
check "invalid UTF-8 on stdin exits 0" test $rc -eq 0
check "invalid UTF-8 byte becomes one U+FFFD token" \
    test "$(cat "$T/bad")" = "$("$G" -m "$Q" --tokenize $'a\xef\xbf\xbdb')"
: | "$G" -m "$Q" --tokenize - >"$T/empty"; rc=$?
check "empty text: exit 0, empty line" bash -c "test $rc -eq 0 && test \"\$(cat '$T/empty')\" = ''"

# errors
"$G" -m "$Q" --detokenize '1 x' >/dev/null 2>"$T/err"; rc=$?
check "a malformed id is a usage error (2)" test $rc -eq 2
check "... naming the option" grep -q 'detokenize' "$T/err"
"$G" -m "$Q" --detokenize '9999999' >/dev/null 2>"$T/err"; rc=$?
check "an id out of range fails" test $rc -ne 0
check "... naming the id" grep -q '9999999' "$T/err"
"$G" -m "$T/missing.gguf" --tokenize x >/dev/null 2>"$T/err"; rc=$?
check "a missing model fails" test $rc -ne 0
check "... quoting the path" grep -q 'missing.gguf' "$T/err"
check "--help lists --tokenize" bash -c "'$G' --help | grep -q -- '--tokenize'"

done_testing
