#!/usr/bin/env bash
# strata-embed: options, payload, errors, and the loopback helper.
. "$(dirname "$0")/lib.sh"
E="$STRATA_BIN/strata-embed"
M="$STRATA_FIXTURES/models/mmproj-tinyvl-F16.gguf"
IMG="$STRATA_FIXTURES/images/img-astronaut.png"

out=$("$E" --help); rc=$?
check "--help exits 0" test $rc -eq 0
check "--help shows usage" grep -q '^usage: strata-embed -m MMPROJ' <<<"$out"
"$E" "$IMG" 2>"$T/err"; rc=$?
check "missing -m: exit 2" test $rc -eq 2
check "missing -m: named" grep -q 'missing -m MMPROJ' "$T/err"
"$E" -m "$M" --max-pixels 10 --min-pixels 20 "$IMG" 2>"$T/err"; rc=$?
check "min above max: exit 2" test $rc -eq 2

# backends (the programs under test are a CPU build; the GPU path is tests/gpu/)
"$E" -m "$M" --backend bogus "$IMG" >/dev/null 2>"$T/err"; rc=$?
check "--backend bogus: exit 2" test $rc -eq 2
check "--backend bogus: names the choices" \
    grep -q "invalid --backend 'bogus' (cpu, auto, cuda, hip)" "$T/err"
for b in cuda hip; do
    "$E" -m "$M" --backend $b --json "$IMG" >"$T/out" 2>"$T/err"; rc=$?
    check "--backend $b in a CPU build: exit 4" test $rc -eq 4
    check "--backend $b in a CPU build: explained" \
        grep -q "backend '$b' is not in this build (built for the cpu only" "$T/err"
    check "--backend $b in a CPU build: nothing on stdout" test ! -s "$T/out"
done
"$E" -m "$M" --backend cpu --json --max-pixels 50000 "$IMG" >"$T/json" 2>/dev/null; rc=$?
check "--backend cpu: exit 0, json names the backend" grep -q '"backend":"cpu"' "$T/json"
"$E" -m "$M" --backend auto --device 3 --json --max-pixels 50000 "$IMG" >"$T/json" 2>/dev/null
check "--backend auto without a GPU build: the cpu" grep -q '"backend":"cpu"' "$T/json"

# the payload from the PNG: header fields and size
"$E" -m "$M" --json --max-pixels 200704 "$IMG" >"$T/json" 2>/dev/null; rc=$?
check "--json exit 0" test $rc -eq 0
check "--json: 256 tokens" grep -q '"n_tokens":256' "$T/json"
check "--json: grid 16x16" grep -q '"grid_h":16,"grid_w":16' "$T/json"
"$E" -m "$M" --max-pixels 50000 -o "$T/a.emb" "$IMG" 2>"$T/err"; rc=$?
check "-o writes the payload" test $rc -eq 0
check "payload size = 40 + 49*256*4" test "$(stat -c %s "$T/a.emb")" -eq $((40 + 49 * 256 * 4))
check "payload magic" test "$(head -c 8 "$T/a.emb")" = STRATAEB
check "log line names tokens and grid" grep -q '49 tokens (grid 7x7)' "$T/err"
"$E" -m "$M" --max-pixels 50000 "$IMG" >"$T/b.emb" 2>/dev/null
check "stdout payload equals -o payload" cmp -s "$T/a.emb" "$T/b.emb"

# the reference patches give the same payload size
"$E" -m "$M" --pixel-values "$STRATA_FIXTURES/ref/tinyvl-astronaut-pixel_values.f32" \
    --grid 32x32 --json >"$T/json" 2>/dev/null; rc=$?
check "--pixel-values: 256 tokens" grep -q '"n_tokens":256' "$T/json"
"$E" -m "$M" --pixel-values "$STRATA_FIXTURES/ref/tinyvl-astronaut-pixel_values.f32" \
    --grid 16x16 --json >/dev/null 2>"$T/err"; rc=$?
check "--pixel-values with a wrong grid: exit 3" test $rc -eq 3
check "--pixel-values with a wrong grid: explained" grep -q 'a 16x16 grid needs' "$T/err"

# bad inputs
printf 'not an image\n' >"$T/x.png"
"$E" -m "$M" "$T/x.png" >/dev/null 2>"$T/err"; rc=$?
check "non-image: exit 3" test $rc -eq 3
check "non-image: named" grep -q "'$T/x.png' is not a readable image" "$T/err"
head -c 20000 "$IMG" >"$T/trunc.png"
"$E" -m "$M" "$T/trunc.png" >/dev/null 2>"$T/err"; rc=$?
check "truncated PNG: exit 3" test $rc -eq 3
"$E" -m "$IMG" "$IMG" >/dev/null 2>"$T/err"; rc=$?
check "image given as the model: exit 3" test $rc -eq 3
"$E" -m "$M" "$T/missing.png" >/dev/null 2>"$T/err"; rc=$?
check "missing image: exit 1 and named" grep -q "cannot open '$T/missing.png'" "$T/err"
mkdir -p "$T/dir.png"
"$E" -m "$M" "$T/dir.png" >/dev/null 2>"$T/err"; rc=$?
check "directory as the image: exit 1" test $rc -eq 1
check "directory as the image: named" grep -q "cannot read image '$T/dir.png': Is a directory" "$T/err"
"$E" -m "$M" --max-pixels 50000 -o "$T/dir.png" "$IMG" >/dev/null 2>"$T/err"; rc=$?
check "-o a directory: exit 1" test $rc -eq 1
check "-o a directory: the reason" grep -q "cannot create '$T/dir.png': Is a directory" "$T/err"

# the helper: health, embed, a bad image, a too-large body, and still serving
"$E" -m "$M" --serve --port 0 --max-pixels 50000 2>"$T/serve.log" &
pid=$!
port=
for _ in $(seq 1 100); do
    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$T/serve.log")
    [ -n "$port" ] && break
    sleep 0.1
done
check "helper listens" test -n "$port"
U="http://127.0.0.1:$port"
curl -s "$U/health" >"$T/h.json"
check "GET /health ok" grep -q '"status":"ok","loaded":true,"images":true' "$T/h.json"
check "GET /health names the backend" grep -q '"backend":"cpu"' "$T/h.json"
code=$(curl -s -o "$T/c.emb" -w '%{http_code}' --data-binary @"$IMG" "$U/embed")
check "POST /embed: 200" test "$code" = 200
check "POST /embed: payload of 49 tokens" test "$(stat -c %s "$T/c.emb")" -eq $((40 + 49 * 256 * 4))
code=$(curl -s -o "$T/e.json" -w '%{http_code}' --data-binary @"$T/x.png" "$U/embed")
check "POST /embed non-image: 400" test "$code" = 400
check "POST /embed non-image: message" grep -q 'not a readable image' "$T/e.json"
head -c $((65 * 1024 * 1024)) /dev/zero >"$T/big"
code=$(curl -s -o /dev/null -w '%{http_code}' --data-binary @"$T/big" "$U/embed")
check "POST /embed 65 MiB: 413" test "$code" = 413
code=$(curl -s -o /dev/null -w '%{http_code}' "$U/nope")
check "unknown path: 404" test "$code" = 404
code=$(curl -s -o /dev/null -w '%{http_code}' "$U/health")
check "still serving after bad requests" test "$code" = 200
kill $pid
wait $pid; rc=$?
check "helper exits cleanly on SIGTERM" test $rc -eq 0
done_testing
