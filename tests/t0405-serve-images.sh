#!/usr/bin/env bash
# strata-serve with a vision projector: OpenAI image_url parts go through the
# model's strata-embed --serve helper to the engine; the answer equals
# strata-generate --image's greedy output.  Bad images, a model without an
# mmproj, http URLs without --allow-image-urls, and a helper killed while it
# encodes (that request fails, the next succeeds).
. "$(dirname "$0")/serve-lib.sh"

M=$FIX/models/tinycoder-moe-F16.gguf
M2=$FIX/models/tinydraft-qwen3-F16.gguf
P=$FIX/models/mmproj-tinyvl-F16.gguf
BIG=$FIX/images/img-astronaut.png
if ! command -v node >/dev/null; then
    echo "1..0 # SKIP node not installed"
    exit 0
fi
# a small PNG (64x48 gradient: 4 image tokens) written with node's zlib
node -e '
const zlib = require("zlib"), fs = require("fs");
const w = 64, h = 48, raw = Buffer.alloc((w * 3 + 1) * h);
for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) {
  const o = y * (w * 3 + 1) + 1 + x * 3;
  raw[o] = x * 4; raw[o + 1] = y * 5; raw[o + 2] = (x * y) & 255;
}
const crcT = []; for (let n = 0; n < 256; n++) { let c = n; for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1; crcT[n] = c >>> 0; }
const crc = b => { let c = 0xffffffff; for (const x of b) c = crcT[(c ^ x) & 255] ^ (c >>> 8); return (c ^ 0xffffffff) >>> 0; };
const chunk = (t, d) => { const l = Buffer.alloc(4); l.writeUInt32BE(d.length); const td = Buffer.concat([Buffer.from(t), d]); const c = Buffer.alloc(4); c.writeUInt32BE(crc(td)); return Buffer.concat([l, td, c]); };
const ih = Buffer.alloc(13); ih.writeUInt32BE(w, 0); ih.writeUInt32BE(h, 4); ih[8] = 8; ih[9] = 2;
fs.writeFileSync(process.argv[1], Buffer.concat([Buffer.from([137,80,78,71,13,10,26,10]), chunk("IHDR", ih), chunk("IDAT", zlib.deflateSync(raw)), chunk("IEND", Buffer.alloc(0))]));
' "$TMP/small.png"
ok $? "a small test PNG"

start_server -m "$M" --mmproj "$P" -m "$M2" --threads 2
ok $? "server starts with an mmproj for the first model"
ID=tinycoder-moe-F16
for _ in $(seq 1 300); do
    [ "$(curl -s "$URL/health" | jget o.images)" = true ] && break
    sleep 0.1
done
is "$(curl -s "$URL/health" | jget o.images)" true "/health: images true once the helper answers"
is "$(curl -s "$URL/health" | jget 'o.models[1].images')" undefined "/health: no helper for the model without mmproj"

durl() { printf 'data:image/png;base64,%s' "$(base64 -w0 "$1")"; }
chat() { # MODEL URL TEXT
    printf '{"model":"%s","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"%s"}},{"type":"text","text":"%s"}]}],"temperature":0,"max_tokens":8}' "$1" "$2" "$3"
}
post /v1/chat/completions "$(chat "$ID" "$(durl "$TMP/small.png")" "What is this?")" >"$TMP/r1"
is "$(status)" 200 "image_url data: URL: 200"
got=$(jget 'o.choices[0].message.content' <"$TMP/r1")
# the same prompt through strata-generate --image
printf '{"messages":[{"role":"user","content":"<|strata-image|>\\nWhat is this?"}],"add_generation_prompt":true}' >"$TMP/req.json"
"$BIN/strata-generate" -m "$M" --render-chat "$TMP/req.json" >"$TMP/prompt"
"$BIN/strata-generate" -m "$M" -t 2 -f "$TMP/prompt" --image "$TMP/small.png" --mmproj "$P" \
    --image-marker '<|strata-image|>' --temp 0 -n 8 --json 2>/dev/null | tail -1 >"$TMP/cli"
want=$(jget o.text <"$TMP/cli")
ok "$([ -n "$want" ] && echo 0 || echo 1)" "strata-generate --image gives text"
is "$got" "$want" "the server's answer equals strata-generate --image (greedy)"
is "$(jget o.usage.prompt_tokens <"$TMP/r1")" "$(jget o.n_prompt <"$TMP/cli")" "usage counts the image tokens"

post /v1/chat/completions "$(chat "$ID" "data:image/png;base64,$(printf 'not an image' | base64 -w0)" "x")" >"$TMP/r2"
is "$(status)" 400 "a bad image: 400"
ok "$(grep -q "messages\[0\].content\[0\]" "$TMP/r2"; echo $?)" "a bad image: the error names the part"
post /v1/chat/completions "$(chat "$ID" "data:image/png;base64,@@@" "x")" >"$TMP/r3"
is "$(status)" 400 "bad base64: 400"
post /v1/chat/completions "$(chat "$ID" "http://127.0.0.1:1/x.png" "x")" >"$TMP/r4"
is "$(status)" 400 "an http URL without --allow-image-urls: 400"
ok "$(grep -q 'allow-image-urls' "$TMP/r4"; echo $?)" "an http URL: the error names the flag"
post /v1/chat/completions "$(chat tinydraft-qwen3-F16 "$(durl "$TMP/small.png")" "x")" >"$TMP/r5"
is "$(status)" 400 "a model without mmproj: 400"
ok "$(grep -q 'image input is not supported by this model' "$TMP/r5"; echo $?)" "a model without mmproj: explained"

# the helper killed while it encodes a large image: that request fails, the next succeeds
HELPER=$(pgrep -P "$SERVER_PID" -x strata-embed | head -1)
ok "$([ -n "$HELPER" ] && echo 0 || echo 1)" "the helper runs as the server's child"
chat "$ID" "$(durl "$BIG")" "x" >"$TMP/big.json"
post /v1/chat/completions "@$TMP/big.json" >"$TMP/r6" &
CPID=$!
sleep 1
kill -9 "$HELPER"
wait "$CPID"
is "$(status)" 500 "helper killed mid-request: 500"
ok "$(grep -q 'vision helper of model' "$TMP/r6"; echo $?)" "helper killed: the error says so"
post /v1/chat/completions "$(chat "$ID" "$(durl "$TMP/small.png")" "What is this?")" >"$TMP/r7"
is "$(status)" 200 "the next image request succeeds after the restart"
is "$(jget 'o.choices[0].message.content' <"$TMP/r7")" "$want" "same answer after the restart"
ok "$(grep -q 'vision helper killed by signal 9' "$TMP/server.log"; echo $?)" "the restart is logged"
stop_server
is "$SERVER_RC" 0 "server exits 0"

# --allow-image-urls: an http URL is fetched (a local node server); a 404 is a 400
node -e '
const http = require("http"), fs = require("fs");
const png = fs.readFileSync(process.argv[1]);
const s = http.createServer((q, r) => {
  if (q.url === "/small.png") { r.writeHead(200, {"Content-Type": "image/png"}); r.end(png); }
  else { r.writeHead(404); r.end("no"); }
});
s.listen(0, "127.0.0.1", () => fs.writeFileSync(process.argv[2], String(s.address().port)));
setTimeout(() => process.exit(0), 600000); // killed below; only a leftover guard
' "$TMP/small.png" "$TMP/http.port" &
HTTP_PID=$!
for _ in $(seq 1 100); do [ -s "$TMP/http.port" ] && break; sleep 0.1; done
start_server -m "$M" --mmproj "$P" --threads 2 --allow-image-urls
ok $? "server starts with --allow-image-urls"
for _ in $(seq 1 300); do # the vision helper warms up after the server listens
    [ "$(curl -s "$URL/health" | jget o.images)" = true ] && break
    sleep 0.1
done
post /v1/chat/completions "$(chat "$ID" "http://127.0.0.1:$(cat "$TMP/http.port")/small.png" "What is this?")" >"$TMP/r9"
is "$(status)" 200 "an http image URL: 200"
is "$(jget 'o.choices[0].message.content' <"$TMP/r9")" "$want" "an http image URL: the same answer as the data: URL"
post /v1/chat/completions "$(chat "$ID" "http://127.0.0.1:$(cat "$TMP/http.port")/none.png" "x")" >"$TMP/r10"
is "$(status)" 400 "an http URL that answers 404: 400"
ok "$(grep -q 'cannot fetch the image' "$TMP/r10"; echo $?)" "an http URL that fails: explained"
stop_server
kill "$HTTP_PID" 2>/dev/null
wait "$HTTP_PID" 2>/dev/null

# a pack that records its mmproj gets the helper without --mmproj
STRATA_PRESETS="$ROOT/packs" "$BIN/strata-prepare" --family tiny --model Q4_K_M --vision yes \
    --name tv --offline --out "$TMP/packs" >/dev/null 2>&1
ok $? "a tiny pack with the vision projector"
start_server -m "$TMP/packs/tv.strata" --threads 2
ok $? "server starts with the pack"
for _ in $(seq 1 300); do
    [ "$(curl -s "$URL/health" | jget o.images)" = true ] && break
    sleep 0.1
done
is "$(curl -s "$URL/health" | jget o.images)" true "pack: /health images true"
post /v1/chat/completions "$(chat tv "$(durl "$TMP/small.png")" "What is this?")" >"$TMP/r8"
is "$(status)" 200 "pack: an image request succeeds"
ok "$(grep -q "vision helper for .*/mmproj-tinyvl-F16.gguf$" "$TMP/server.log"; echo $?)" \
    "pack: the log names the pack's projector"
stop_server

# a projector that cannot load stops the server at start, naming it
printf 'not a gguf\n' >"$TMP/bad-mmproj.gguf"
start_server -m "$M" --mmproj "$TMP/bad-mmproj.gguf" --threads 2
is "$?/$SERVER_RC" "1/3" "a non-GGUF --mmproj: exit 3 at start"
ok "$(grep -q "model 'tinycoder-moe-F16': vision projector: '$TMP/bad-mmproj.gguf': not a gguf" \
    "$TMP/server.log"; echo $?)" "a non-GGUF --mmproj: named"
start_server -m "$M" --mmproj "$M" --threads 2
is "$?/$SERVER_RC" "1/3" "a language model as --mmproj: exit 3 at start"
ok "$(grep -q "clip.projector_type" "$TMP/server.log"; echo $?)" \
    "a language model as --mmproj: the missing key named"
done_testing
