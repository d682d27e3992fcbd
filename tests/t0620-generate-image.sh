#!/usr/bin/env bash
# strata-generate --image / --image-embd: image embeddings spliced into the prompt.
. "$(dirname "$0")/lib.sh"
G="$STRATA_BIN/strata-generate"
E="$STRATA_BIN/strata-embed"
M="$STRATA_FIXTURES/models/tinycoder-moe-F16.gguf"
D="$STRATA_FIXTURES/models/tinydraft-qwen3-F16.gguf"
P="$STRATA_FIXTURES/models/mmproj-tinyvl-F16.gguf"
IMG="$STRATA_FIXTURES/images/img-astronaut.png"
gen() { "$G" -m "$M" -t 2 --temp 0 -n 8 "$@"; }
text() { sed -n 's/.*"text":"\(.*\)"}$/\1/p' "$1" | tail -1; }

# rows equal to the tokens' own embedding rows give the tokens' output: the
# prompt "Hello world" with "el" "lo" replaced by their rows
gen -p "Hello world" --json >"$T/ref" 2>/dev/null
check "reference generation" test -s "$T/ref"
ids=$("$G" -m "$M" --tokenize "Hello world")
check "'Hello world' is H el lo \" w\" orld" test "$ids" = "42 430 311 327 3937"
"$G" -m "$M" --token-embd 430,311 >"$T/rows.emb"; rc=$?
check "--token-embd writes a payload" test $rc -eq 0 -a "$(stat -c %s "$T/rows.emb")" -eq $((40 + 2 * 256 * 4))
gen -p "H<x> world" --image-embd "$T/rows.emb" --image-marker "<x>" --json >"$T/got" 2>"$T/err"
check "token rows spliced from a file: exit 0" test -s "$T/got"
check "token rows spliced: same n_prompt" grep -q '"n_prompt":5,' "$T/got"
check "token rows spliced: same text as the tokens" test "$(text "$T/got")" = "$(text "$T/ref")"
gen -p "H<x> world" --image-embd - --image-marker "<x>" --json <"$T/rows.emb" >"$T/got" 2>/dev/null
check "token rows from a pipe: same text" test "$(text "$T/got")" = "$(text "$T/ref")"
# different rows give a different prompt (the splice is not ignored)
"$G" -m "$M" --token-embd 311,430 >"$T/swap.emb"
gen -p "H<x> world" --image-embd "$T/swap.emb" --image-marker "<x>" --json >"$T/got" 2>/dev/null
gen --prompt-ids 42,311,430,327,3937 --json >"$T/ref3" 2>/dev/null
check "swapped rows: the swapped tokens' text" test "$(text "$T/got")" = "$(text "$T/ref3")"
check "swapped rows: not the unswapped text" test "$(text "$T/ref3")" != "$(text "$T/ref")"

# an image through the projector, and its payload through a pipe: same text
gen -p "<image>def add(a, b):" --image "$IMG" --mmproj "$P" --image-marker "<image>" \
    --image-max-pixels 12544 --json >"$T/img" 2>"$T/err"; rc=$?
check "--image: exit 0" test $rc -eq 0
check "--image: 16 image tokens + the text" grep -q '"n_prompt":2[0-9],' "$T/img"
"$E" -m "$P" --max-pixels 12544 "$IMG" 2>/dev/null |
    gen -p "<image>def add(a, b):" --image-embd - --image-marker "<image>" --json >"$T/pipe" 2>/dev/null
check "strata-embed | --image-embd -: same text as --image" test "$(text "$T/pipe")" = "$(text "$T/img")"
gen -p "def add(a, b):" --image "$IMG" --mmproj "$P" --image-marker "<image>" \
    --image-max-pixels 12544 --json >"$T/front" 2>/dev/null
check "no marker: the image goes first (same text)" test "$(text "$T/front")" = "$(text "$T/img")"

# errors
gen -p "hi" --image "$IMG" --mmproj "$P" 2>"$T/err"; rc=$?
check "no placeholder token: exit 3" test $rc -eq 3
check "no placeholder token: explained" grep -q 'no image placeholder token (<|image_pad|>' "$T/err"
"$G" -m "$D" -t 2 -n 2 -p "a<x>b" --image-embd "$T/rows.emb" --image-marker "<x>" 2>"$T/err"; rc=$?
check "n_embd mismatch: exit 3" test $rc -eq 3
check "n_embd mismatch: names both" grep -q 'n_embd 256 but the model.s n_embd is 128' "$T/err"
printf 'STRATAEB\001\000\000\000junk' >"$T/bad.emb"
gen -p "a<x>b" --image-embd "$T/bad.emb" --image-marker "<x>" 2>"$T/err"; rc=$?
check "truncated payload: exit 3" test $rc -eq 3
check "truncated payload: named" grep -q "bad.emb" "$T/err"
gen -p "a<x>b" --image-embd "$IMG" --image-marker "<x>" 2>"$T/err"; rc=$?
check "a PNG as payload: exit 3" test $rc -eq 3
gen -p "a<x>b" --image-embd "$T/none.emb" --image-marker "<x>" 2>"$T/err"; rc=$?
check "missing payload: exit 1 and named" test $rc -eq 1 -a -n "$(grep "cannot open --image-embd '$T/none.emb'" "$T/err")"
gen -p "a<x>b" --image "$T/none.png" --mmproj "$P" --image-marker "<x>" 2>"$T/err"; rc=$?
check "missing image: exit 1 and named" test $rc -eq 1 -a -n "$(grep "$T/none.png" "$T/err")"
gen -p "a<x>b<x>" --image-embd "$T/rows.emb" --image-marker "<x>" 2>"$T/err"; rc=$?
check "two markers, one image: exit 3" test $rc -eq 3
check "two markers, one image: explained" grep -q "2 image markers ('<x>') but 1 image was given" "$T/err"
gen -p "a" --image "$IMG" 2>"$T/err"; rc=$?
check "--image without --mmproj: exit 2" test $rc -eq 2
check "--image without --mmproj: explained" grep -q -- '--image needs --mmproj' "$T/err"
gen -p "a<x>" --image "$IMG" --mmproj "$M" --image-marker "<x>" 2>"$T/err"; rc=$?
check "a language model as --mmproj: exit 3" test $rc -eq 3
check "a language model as --mmproj: named" grep -q -- "--mmproj '$M'" "$T/err"

# the engine protocol: "images" (base64 payloads) and "image_marker"
PL=$(base64 -w0 "$T/rows.emb")
{
    printf '{"type":"generate","id":"a","prompt":"H<x> world","image_marker":"<x>","images":["%s"],"max_tokens":8,"temperature":0}\n' "$PL"
    printf '{"type":"generate","id":"b","prompt":"H<x> world","images":["%s"],"max_tokens":8}\n' "$PL"
    printf '{"type":"generate","id":"c","prompt":"H<x> world","image_marker":"<x>","images":["!!"]}\n'
    printf '{"type":"generate","id":"d","prompt":"H<x> world","image_marker":"<x>","images":["%s"]}\n' "$(base64 -w0 "$T/swap.emb" | head -c 100)"
    printf '{"type":"generate","id":"e","prompt":"Hello world","max_tokens":8,"temperature":0}\n'
    sleep 5
} | "$G" -m "$M" -t 2 --serve-stdio >"$T/ev" 2>/dev/null
ptext() { grep "\"id\":\"$1\"" "$T/ev" | grep '"type":"token"' | sed 's/.*"text":"\([^"]*\)".*/\1/' | tr -d '\n'; }
check "protocol: spliced request done" grep -q '"type":"done","id":"a","reason":"length","n_prompt":5' "$T/ev"
check "protocol: spliced text equals the tokens' text" test "$(ptext a)" = "$(ptext e)" -a -n "$(ptext e)"
check "protocol: same text as the CLI" test "$(ptext a)" = "$(text "$T/ref")"
check "protocol: no marker token: invalid" grep -q '"id":"b","code":"invalid","msg":"the model has no image placeholder' "$T/ev"
check "protocol: bad base64: invalid, named" grep -q "\"id\":\"c\",\"code\":\"invalid\",\"msg\":\"'images\[0\]' is not a base64 payload" "$T/ev"
check "protocol: truncated payload: invalid, named" grep -q "\"id\":\"d\",\"code\":\"invalid\",\"msg\":\"'images\[0\]': truncated" "$T/ev"
done_testing
