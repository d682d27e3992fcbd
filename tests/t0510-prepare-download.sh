#!/usr/bin/env bash
# strata-prepare from a loopback HTTP server (tests/helpers/packtool serve):
# a URL and an hf: source (HF_ENDPOINT), the server's published SHA-256, a
# download cut halfway that resumes with Range (within a run and across
# runs), and a wrong checksum, a 404, a stalling server, a wrong --sha256 and
# --offline each refused with a clear message and no usable-looking pack.
. "$(dirname "$0")/lib.sh"
P="$STRATA_BIN/strata-prepare"
TOOL="$STRATA_BIN/../helpers/packtool"
M="$STRATA_FIXTURES/models/tinycoder-moe-IQ1_M.gguf"
O="$T/out"
SHA=$(sha256sum "$M" | cut -c1-64)
mkdir -p "$T/www/sub"
cp "$M" "$T/www/sub/tc.gguf"
SRV=""
trap '[ -n "$SRV" ] && kill $SRV 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT

# start a server with the given packtool options; sets PORT and SRV
serve() {
    stop
    rm -f "$T/port" "$T/log"
    "$TOOL" serve "$T/www" --port-file "$T/port" --log "$T/log" --max-s 60 "$@" &
    SRV=$!
    for _ in $(seq 100); do [ -s "$T/port" ] && break; sleep 0.05; done
    PORT=$(cat "$T/port" 2>/dev/null)
}
stop() {
    if [ -n "$SRV" ]; then kill "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null; SRV=""; fi
}
fast="--retries 0 --stall-timeout 2"

# --- plain URL ------------------------------------------------------------------
serve
check "server started" test -n "$PORT"
"$P" --out "$O" $fast "http://127.0.0.1:$PORT/sub/tc.gguf" >"$T/o1" 2>"$T/e1"; rc=$?
check "pack from a loopback URL: exit 0" test $rc -eq 0
check "plan lists the fetch with its size" grep -q "fetch    http://127.0.0.1:$PORT/sub/tc.gguf (4.0 MiB)" "$T/o1"
check "downloaded file inside the pack" cmp -s "$M" "$O/tc.strata/tc.gguf"
check "its url and sha256 recorded" \
    sh -c "grep -q '\"url\":[[:space:]]*\"http://127.0.0.1:$PORT/sub/tc.gguf\"' '$O/tc.strata/pack.json' && grep -q '$SHA' '$O/tc.strata/pack.json'"
check "no .part file left" sh -c "! ls '$O'/tc.strata/*.part 2>/dev/null"
check "URL pack verifies" "$P" --verify "$O/tc.strata"
check "progress lines on stderr (not a terminal)" grep -q 'tc.gguf: .*(100%).*done' "$T/e1"

# --force rebuilds (here as repacked) from the files the pack already holds
lines=$(wc -l <"$T/log")
"$P" --out "$O" --force --repack $fast "http://127.0.0.1:$PORT/sub/tc.gguf" >/dev/null 2>&1; rc=$?
check "--force --repack over a downloaded pack: exit 0" test $rc -eq 0
check "... without fetching the file again" sh -c "! tail -n +$((lines + 1)) '$T/log' | grep -q '^GET'"
check "... and the new pack is repacked and verifies" \
    sh -c "test -s '$O/tc.strata/experts.bin' && '$P' --verify '$O/tc.strata'"

# --- hf: through HF_ENDPOINT, repacked ------------------------------------------------
HF_ENDPOINT="http://127.0.0.1:$PORT" "$P" --out "$O" --name hf --repack $fast \
    hf:someone/tiny-GGUF/sub/tc.gguf >/dev/null 2>"$T/e2"; rc=$?
check "hf: source resolves to OWNER/REPO/resolve/main/PATH: exit 0" test $rc -eq 0
check "server saw the resolve URL" grep -q '^GET /sub/tc.gguf' "$T/log"
check "hf pack verifies" "$P" --verify "$O/hf.strata"
check "no token sent without HF_TOKEN" sh -c "! grep -q 'auth=' '$T/log'"
HF_TOKEN=hf_secret HF_ENDPOINT="http://127.0.0.1:$PORT" "$P" --out "$O" --name tok $fast \
    hf:someone/tiny-GGUF/sub/tc.gguf >/dev/null 2>&1; rc=$?
check "HF_TOKEN sent as a bearer token to the Hub" \
    sh -c "test $rc -eq 0 && grep -q '^GET /sub/tc.gguf - auth=Bearer hf_secret$' '$T/log'"
HF_TOKEN=hf_secret "$P" --out "$O" --name tok2 $fast "http://127.0.0.1:$PORT/sub/tc.gguf" \
    >/dev/null 2>&1
check "HF_TOKEN not sent to other hosts" sh -c "! tail -n 1 '$T/log' | grep -q auth="
HF_ENDPOINT="http://127.0.0.1:$PORT" "$P" --out "$O" --name hfbad hf:someone/tc.gguf \
    >"$T/o2b" 2>"$T/e2b"; rc=$?
check "malformed hf: source: exit 2" sh -c "test $rc -eq 2 && grep -q 'expected hf:OWNER/REPO/PATH' '$T/e2b'"
check "malformed hf: source: refused before the plan" sh -c "! grep -q '^plan for' '$T/o2b'"

# --- cut halfway: resumes with Range in the same run -----------------------------------
serve --fault cut --fault-count 1
"$P" --out "$O" --name cut --retries 2 --retry-delay 50 --stall-timeout 2 \
    "http://127.0.0.1:$PORT/sub/tc.gguf" >/dev/null 2>"$T/e3"; rc=$?
check "cut transfer retried and completed: exit 0" test $rc -eq 0
check "the retry asked for the rest with Range" grep -q '^GET /sub/tc.gguf bytes=[1-9][0-9]*-$' "$T/log"
check "resumed file is intact" cmp -s "$M" "$O/cut.strata/tc.gguf"
check "the retry was announced" grep -q 'retrying in' "$T/e3"

# --- HTTP 500 twice: retried with back-off ------------------------------------------------
serve --fault 500 --fault-count 2
"$P" --out "$O" --name five --retries 3 --retry-delay 20 --stall-timeout 2 \
    "http://127.0.0.1:$PORT/sub/tc.gguf" >/dev/null 2>"$T/e3b"; rc=$?
check "two HTTP 500s then success: exit 0" test $rc -eq 0
check "three GETs reached the server" test "$(grep -c '^GET /sub/tc.gguf' "$T/log")" -eq 3
check "each retry announced with its delay" test "$(grep -c 'HTTP 500; retrying in' "$T/e3b")" -eq 2

# --- cut with no retries: the run fails, the next run resumes --------------------------
serve --fault cut --fault-count 1
"$P" --out "$O" --name again $fast "http://127.0.0.1:$PORT/sub/tc.gguf" >/dev/null 2>"$T/e4"
rc=$?
check "interrupted run: exit 1" test $rc -eq 1
check "interrupted run: says where the bytes are kept" grep -q "downloads kept in '.*again.strata.partial'" "$T/e4"
check "interrupted run: no pack, no pack.json" \
    sh -c "test ! -e '$O/again.strata' && test ! -e '$O/again.strata.partial/pack.json'"
part=$(stat -c %s "$O/again.strata.partial/tc.gguf.part" 2>/dev/null || echo 0)
check "half the file kept in tc.gguf.part ($part bytes)" test "$part" -gt 0
"$P" --out "$O" --name again $fast "http://127.0.0.1:$PORT/sub/tc.gguf" >"$T/o5" 2>"$T/e5"; rc=$?
check "second run: exit 0" test $rc -eq 0
check "second run's plan says it resumes" grep -q 'resuming after' "$T/o5"
check "second run asked for bytes=$part-" grep -q "^GET /sub/tc.gguf bytes=$part-\$" "$T/log"
check "resumed pack verifies" "$P" --verify "$O/again.strata"

# --- wrong content: the published hash catches it ----------------------------------------
serve --fault corrupt
"$P" --out "$O" --name bad $fast "http://127.0.0.1:$PORT/sub/tc.gguf" >/dev/null 2>"$T/e6"; rc=$?
check "corrupt download: exit 3" test $rc -eq 3
check "corrupt download: message names the URL and the hashes" \
    grep -q "sub/tc.gguf': sha256 [0-9a-f]* does not match the expected $SHA (published by the server)" "$T/e6"
check "corrupt download: no pack, no file, no part" \
    sh -c "test ! -e '$O/bad.strata' && ! ls '$O'/bad.strata.partial/tc.gguf* 2>/dev/null"

# --- --sha256 given by the user --------------------------------------------------------
serve --no-etag
"$P" --out "$O" --name us --sha256 "$(echo "$SHA" | tr 0-9a-f 1-9a-f0)" $fast \
    "http://127.0.0.1:$PORT/sub/tc.gguf" >/dev/null 2>"$T/e7"; rc=$?
check "wrong --sha256: exit 3" sh -c "test $rc -eq 3 && grep -q 'does not match the expected' '$T/e7'"
"$P" --out "$O" --name us --sha256 "$SHA" $fast "http://127.0.0.1:$PORT/sub/tc.gguf" \
    >/dev/null 2>&1; rc=$?
check "right --sha256: exit 0" test $rc -eq 0

# --- a full disk while downloading ----------------------------------------------------
STRATA_FAULT_ENOSPC_AT=1000000 "$P" --out "$O" --name fd $fast "http://127.0.0.1:$PORT/sub/tc.gguf" \
    >/dev/null 2>"$T/e7b"; rc=$?
check "full disk while downloading: exit 1" test $rc -eq 1
check "full disk while downloading: message names the file" \
    grep -q "tc.gguf.part': No space left on device" "$T/e7b"
check "full disk while downloading: no pack" \
    sh -c "test ! -e '$O/fd.strata' && test ! -e '$O/fd.strata.partial/pack.json'"

# --- 404 ----------------------------------------------------------------------------------
serve
"$P" --out "$O" --name nf $fast "http://127.0.0.1:$PORT/sub/missing.gguf" >/dev/null 2>"$T/e8"
rc=$?
check "404: exit 3" test $rc -eq 3
check "404: message" grep -q "missing.gguf': HTTP 404 not found" "$T/e8"
check "404: nothing left" test ! -e "$O/nf.strata" -a ! -e "$O/nf.strata.partial"

# --- a server that stalls -----------------------------------------------------------------
# (the server would close the connection after 30 s, which curl would report
# as a cut transfer: "stalled" shows the client's own timeout fired first)
serve --fault stall --stall-s 30
"$P" --out "$O" --name st --retries 0 --stall-timeout 1 "http://127.0.0.1:$PORT/sub/tc.gguf" \
    >/dev/null 2>"$T/e9"; rc=$?
check "stall: exit 1" test $rc -eq 1
check "stall: message says stalled" grep -q "sub/tc.gguf': stalled: no data for 1 s" "$T/e9"
check "stall: no pack" test ! -e "$O/st.strata" -a ! -e "$O/st.strata.partial/pack.json"

# --- offline -----------------------------------------------------------------------------
stop
"$P" --out "$O" --name off --offline "http://127.0.0.1:1/sub/tc.gguf" >/dev/null 2>"$T/e10"; rc=$?
check "offline without the file: exit 3" sh -c "test $rc -eq 3 && grep -q 'offline: .* is not downloaded yet' '$T/e10'"
check "offline: no pack" test ! -e "$O/off.strata"
# the interrupted-and-resumed download of 'again' can be re-packed offline from its files
mkdir -p "$O/re.strata.partial" && cp "$O/again.strata/tc.gguf" "$O/re.strata.partial/"
"$P" --out "$O" --name re --offline "http://127.0.0.1:1/sub/tc.gguf" >/dev/null 2>"$T/e11"; rc=$?
check "offline with the file already downloaded: exit 0" test $rc -eq 0

done_testing
