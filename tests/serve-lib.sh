# serve-lib.sh - shared helpers of strata-serve's shell tests (sourced).
#
# start_server ARGS...   start strata-serve on a free loopback port (--port 0),
#                        wait for "listening on", set $PORT and $URL
# stop_server            SIGTERM it and wait; $SERVER_RC gets its exit status
# ok COND NAME           one TAP test point: COND is a shell status (0 = pass)
# is GOT WANT NAME       TAP equality
# jget EXPR < JSON       evaluate a JavaScript expression over the parsed JSON `o`
# The server is always killed on exit.
set -u

BIN=${STRATA_BIN:?STRATA_BIN must name the directory of the programs}
ROOT=${STRATA_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
FIX=${STRATA_FIXTURES:-$ROOT/../shared/fixtures}
FAKE=$ROOT/tests/serve-fake-engine.js
TMP=$(mktemp -d "${TMPDIR:-/tmp}/strata-serve-test.XXXXXX")
SERVER_PID=
SERVER_RC=
PORT=
URL=
tap_n=0
tap_fail=0

cleanup() {
    # a background job killed before it exec'ed can run this trap: only the test itself may
    [ "$BASHPID" = "$$" ] || return 0
    if [ -n "$SERVER_PID" ]; then
        kill -9 "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT

ok() {
    tap_n=$((tap_n + 1))
    if [ "$1" = 0 ]; then
        echo "ok $tap_n - $2"
    else
        echo "not ok $tap_n - $2"
        tap_fail=$((tap_fail + 1))
    fi
}

is() {
    tap_n=$((tap_n + 1))
    if [ "$1" = "$2" ]; then
        echo "ok $tap_n - $3"
    else
        echo "not ok $tap_n - $3"
        echo "#   got:  '$1'"
        echo "#   want: '$2'"
        tap_fail=$((tap_fail + 1))
    fi
}

done_testing() {
    echo "1..$tap_n"
    [ "$tap_fail" = 0 ]
    exit $?
}

jget() {
    node -e '
const fs = require("fs");
let t = fs.readFileSync(0, "utf8"), o;
try { o = JSON.parse(t); } catch (e) { process.stdout.write("<not json: " + t.slice(0, 200) + ">"); process.exit(0); }
let r;
try { r = eval(process.argv[1]); } catch (e) { r = "<" + e.message + ">"; }
process.stdout.write(typeof r === "string" ? r : r === undefined ? "undefined" : JSON.stringify(r));
' "$1"
}

# start_server ARGS... ; log in $TMP/server.log
start_server() {
    : >"$TMP/server.log"
    "$BIN/strata-serve" --port 0 "$@" >"$TMP/server.log" 2>&1 &
    SERVER_PID=$!
    local i=0
    while [ $i -lt 600 ]; do
        # the server's own line: the helpers it relays log "listening on" too
        if grep -q '^strata-serve: listening on http' "$TMP/server.log"; then
            PORT=$(sed -n 's/^strata-serve: listening on http:\/\/[^ ]*:\([0-9][0-9]*\) .*/\1/p' "$TMP/server.log" | head -1)
            URL=http://127.0.0.1:$PORT
            return 0
        fi
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            wait "$SERVER_PID"
            SERVER_RC=$?
            SERVER_PID=
            return 1
        fi
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

stop_server() {
    if [ -n "$SERVER_PID" ]; then
        kill -TERM "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID"
        SERVER_RC=$?
        SERVER_PID=
    fi
}

# wait_health: until /health says ok (an engine restart finished)
wait_health() {
    local i=0
    while [ $i -lt 300 ]; do
        if curl -sf "$URL/health" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# post PATH JSON [curl args...]: body on stdout, status in $TMP/status
post() {
    local path=$1 body=$2
    shift 2
    curl -s -o "$TMP/body" -w '%{http_code}' -H 'Content-Type: application/json' \
        --data-binary "$body" "$@" "$URL$path" >"$TMP/status"
    cat "$TMP/body"
}

status() { cat "$TMP/status"; }

# data_lines FILE: number of SSE data lines in FILE so far (0 before it exists)
data_lines() {
    local n
    n=$(grep -c '^data: ' "$1" 2>/dev/null)
    echo "${n:-0}"
}

# sse_text FILE: concatenated content deltas (chat) or text (completions) of an SSE stream
sse_text() {
    node -e '
const fs = require("fs");
let out = "";
for (const l of fs.readFileSync(process.argv[1], "utf8").split("\n")) {
  if (!l.startsWith("data: ") || l === "data: [DONE]") continue;
  const o = JSON.parse(l.slice(6));
  for (const c of o.choices || []) out += (c.delta ? (c.delta.content || "") : (c.text || ""));
}
process.stdout.write(out);
' "$1"
}
