#!/bin/bash
# strata-load: a resident image of the tinycoder pack; two engines attach to it
# (same greedy ids as reading the files), --status lists both, the loader is
# killed with SIGKILL and --unload removes the image while the engines keep
# generating from their mappings.
. "$(dirname "$0")/lib.sh"

LOAD=$STRATA_BIN/strata-load
GEN=$STRATA_BIN/strata-generate
PREP=$STRATA_BIN/strata-prepare
NAME=

cleanup() {
    exec 7>&- 8>&- 2>/dev/null
    [ -n "$LPID" ] && kill -9 "$LPID" 2>/dev/null
    [ -n "$E1" ] && kill "$E1" 2>/dev/null
    [ -n "$E2" ] && kill "$E2" 2>/dev/null
    [ -n "$NAME" ] && rm -f /dev/shm/"$NAME".meta /dev/shm/"$NAME".data /dev/shm/"$NAME".pid
    rm -rf "$T"
}
trap cleanup EXIT

# a model of its own (trailing bytes the GGUF reader ignores): the image name
# follows the content, and other test runs on this machine load the fixture
mkdir -p "$T/src"
cp "$STRATA_FIXTURES/models/tinycoder-moe-Q4_K_M.gguf" "$T/src/tiny.gguf"
head -c 64 /dev/urandom >>"$T/src/tiny.gguf"
"$PREP" --out "$T" --name tiny "$T/src/tiny.gguf" >/dev/null 2>&1
P=$T/tiny.strata
check "pack prepared" test -f "$P/pack.json"

REQ='{"type":"generate","id":"g","prompt":"def fib(n):","max_tokens":24,"temperature":0}'
ids() { jq -c 'select(.type=="token") | .tok' "$1" | tr '\n' ' '; }

# the reference: greedy text and ids read from the files
STRATA_NO_RESIDENT=1 "$GEN" -m "$P" -p "def fib(n):" -n 24 --temp 0 >"$T/base.txt" 2>"$T/base.err"
# (stdin stays open until "done": end of input cancels a generation)
{
    echo "$REQ"
    for _ in $(seq 300); do grep -q '"done"' "$T/base.jsonl" 2>/dev/null && break; sleep 0.1; done
    echo '{"type":"shutdown"}'
} | STRATA_NO_RESIDENT=1 "$GEN" -m "$P" --serve-stdio >"$T/base.jsonl" 2>/dev/null
check "reference generated" test -s "$T/base.txt" -a "$(ids "$T/base.jsonl" | wc -w)" -gt 8
check "no image, no attach message" bash -c "! grep -q 'resident image' '$T/base.err'"

# load in the foreground (a background job of this shell)
"$LOAD" "$P" >"$T/name" 2>"$T/load.err" &
LPID=$!
for _ in $(seq 300); do [ -s "$T/name" ] && break; sleep 0.1; done
NAME=$(cat "$T/name")
check "loader printed the image name" grep -qx 'strata-[0-9a-f]\{16\}' "$T/name"
check "progress and summary on stderr" grep -q 'GiB at .* GiB/s' "$T/load.err"
check "summary says ready and verified" grep -q "$NAME ready: .*sha256 verified" "$T/load.err"
check "objects in /dev/shm" test -s "/dev/shm/$NAME.data" -a -s "/dev/shm/$NAME.meta"

# two one-shot engines: attached, same text as from the files
"$GEN" -m "$P" -p "def fib(n):" -n 24 --temp 0 >"$T/a1.txt" 2>"$T/a1.err"
"$GEN" -m "$T/tiny.strata/pack.json" -p "def fib(n):" -n 24 --temp 0 >"$T/a2.txt" 2>"$T/a2.err"
check "engine 1 says it attached" grep -q "attached to resident image $NAME" "$T/a1.err"
check "engine 2 says it attached" grep -q "attached to resident image $NAME" "$T/a2.err"
check "engine 1 text = reading the files" cmp "$T/base.txt" "$T/a1.txt"
check "engine 2 text = reading the files" cmp "$T/base.txt" "$T/a2.txt"

# two waiting engines (--serve-stdio on fifos)
mkfifo "$T/in1" "$T/in2"
"$GEN" -m "$P" --serve-stdio <"$T/in1" >"$T/out1" 2>"$T/err1" &
E1=$!
exec 7>"$T/in1"
"$GEN" -m "$P" --serve-stdio <"$T/in2" >"$T/out2" 2>"$T/err2" &
E2=$!
exec 8>"$T/in2"
for _ in $(seq 600); do
    grep -q '"ready"' "$T/out1" 2>/dev/null && grep -q '"ready"' "$T/out2" 2>/dev/null && break
    sleep 0.1
done
check "both engines ready" grep -q '"ready"' "$T/out1" "$T/out2"
check "server engine 1 attached" grep -q "attached to resident image $NAME" "$T/err1"

"$LOAD" --status >"$T/status.txt"
"$LOAD" --status --json >"$T/status.json"
check "--status names the image, ready, loader running" \
    grep -q "^$NAME  *ready .* $LPID running  *2 " "$T/status.txt"
check "--status lists the pack" grep -q "tiny.strata" "$T/status.txt"
check "--status --json: both engines attached" \
    jq -e --arg n "$NAME" --argjson a "$E1" --argjson b "$E2" \
    '.[] | select(.name == $n) | (.attached | index($a) != null and index($b) != null)
     and .n_attached == 2 and .loader_alive and .state == "ready"' "$T/status.json"

# SIGKILL of the loader: the engines keep their mappings
kill -9 "$LPID"
wait "$LPID" 2>/dev/null
LPID=
echo "$REQ" >&7
for _ in $(seq 300); do grep -q '"done"' "$T/out1" && break; sleep 0.1; done
check "engine 1 generates after the loader was killed" grep -q '"done"' "$T/out1"
check "engine 1 ids = reading the files" test "$(ids "$T/out1")" = "$(ids "$T/base.jsonl")"
"$LOAD" --status --json >"$T/status2.json"
check "--status: loader gone, image still there" \
    jq -e --arg n "$NAME" '.[] | select(.name == $n) | .loader_alive == false' "$T/status2.json"

# --unload: nothing left in /dev/shm; engine 2 still generates
check "--unload NAME" "$LOAD" --unload "$NAME"
check "nothing left in /dev/shm" bash -c "! ls /dev/shm/$NAME.* 2>/dev/null"
echo "$REQ" >&8
for _ in $(seq 300); do grep -q '"done"' "$T/out2" && break; sleep 0.1; done
check "engine 2 generates after --unload" grep -q '"done"' "$T/out2"
check "engine 2 ids = reading the files" test "$(ids "$T/out2")" = "$(ids "$T/base.jsonl")"
check "--status: no image left" bash -c "! '$LOAD' --status | grep -q '$NAME'"
check "--unload of a missing image fails" bash -c "! '$LOAD' --unload '$NAME'"

# a new engine reads the files again, without a message
"$GEN" -m "$P" -p "def fib(n):" -n 24 --temp 0 >"$T/c.txt" 2>"$T/c.err"
check "after unload: same text, no attach" \
    bash -c "cmp -s '$T/base.txt' '$T/c.txt' && ! grep -q 'resident image' '$T/c.err'"

echo '{"type":"shutdown"}' >&7
echo '{"type":"shutdown"}' >&8
exec 7>&- 8>&-
wait "$E1" "$E2" 2>/dev/null
E1= E2=
done_testing
