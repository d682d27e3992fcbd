#!/bin/bash
# gpu-run-probe.sh - strata-probe's checks on a GPU machine: the report (readable, with
# the bandwidth measurements, and --quick --json), a kernel broken on purpose
# (tests/gpu/selftest-break.sh on variants built beforehand), and the self-test that
# strata-generate and strata-serve run at start, with and without --no-selftest.
#
# Run from the repository root after
#   scripts/gpu-devrun.sh BUILD BUILD/bin/cuda models/stories260K.gguf
# and, for the broken variants (each `make B=DIR/rms_norm-MODE BINDIR=DIR/rms_norm-MODE/bin
# STRATA_BREAK_KERNEL=rms_norm STRATA_BREAK_MODE=MODE cuda`), their strata-probe and
# strata-generate packed as devrun/break.tar.xz (KERNEL-MODE/bin/cuda/...).
# Logs go under $OUT (default ./gpu-out); a summary goes to stdout.
set -u
root=$(pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
tmp=$(mktemp -d)   # what is not worth bringing back ($OUT takes only a few files)
st=/tmp/strata-dev
if [ ! -x "$st/bin/strata-probe" ]; then
    rm -rf "$st" && mkdir -p "$st" && tar -C "$st" -xJf "${DEVRUN:-devrun}/bin.tar.xz" || exit 1
fi
cb=$(python3 -c 'import nvidia.cublas,os;print(os.path.dirname(nvidia.cublas.__file__)+"/lib")' 2>/dev/null)
export LD_LIBRARY_PATH=$st/lib:/usr/local/cuda/lib64${cb:+:$cb}
# the system's curl, not against the libraries packed for our programs
curl() { env -u LD_LIBRARY_PATH curl "$@"; }
export STRATA_FIXTURES=$root/${DEVRUN:-devrun}/fixtures
M=$STRATA_FIXTURES/models/stories260K.gguf
P=$st/bin/strata-probe
rc=0
secs() { python3 -c "import sys; print('%.2f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$@"; }

t0=$(date +%s.%N); "$P" --quick >"$tmp/probe-quick.txt" 2>&1; r=$?; t1=$(date +%s.%N)
echo "probe --quick: exit $r in $(secs "$t0" "$t1") s"
grep -E 'status|supported|self-test|selftest|verdict|pcie' -i "$tmp/probe-quick.txt" | head -20
[ $r -eq 0 ] || rc=1
"$P" --quick --json >"$out/probe-quick.json" 2>&1 || rc=1
python3 - "$out/probe-quick.json" <<'EOF' || rc=1
import json, sys
j = json.load(open(sys.argv[1]))
d = j['devices'][0]
bad = [k['kernel'] for k in d['selftest'] if not k['pass']]
print('json: schema %s, device %s %s, status %s, %d self-test kernels, failed %s' % (
    j.get('schema'), d.get('name'), d.get('arch'), d.get('status'), len(d['selftest']), bad))
sys.exit(0 if d.get('status') == 'supported' and not bad else 1)
EOF
t0=$(date +%s.%N); "$P" >"$out/probe-full.txt" 2>&1; r=$?; t1=$(date +%s.%N)
echo "probe (full): exit $r in $(secs "$t0" "$t1") s"
grep -i -E 'GB/s|pcie|link|bandwidth' "$out/probe-full.txt" | head -20
[ $r -eq 0 ] || rc=1

if [ -f "${DEVRUN:-devrun}/break.tar.xz" ]; then
    mkdir -p /tmp/strata-break && tar -C /tmp/strata-break -xJf "${DEVRUN:-devrun}/break.tar.xz"
    STRATA_BREAK_BUILT=/tmp/strata-break bash tests/gpu/selftest-break.sh rms_norm \
        >"$out/break.tap" 2>&1 || rc=1
    echo "selftest-break: $(grep -c '^ok' "$out/break.tap") ok, $(grep -c '^not ok' "$out/break.tap") not ok"
    grep -E '^not ok|^Bail|probe took' "$out/break.tap"
fi

G=$st/bin/strata-generate
for flag in "" --no-selftest; do
    t0=$(date +%s.%N)
    "$G" -m "$M" --backend cuda -p "Once upon a time" -n 16 --temp 0 -v $flag \
        >"$tmp/gen$flag.txt" 2>"$tmp/gen$flag.err"; r=$?
    t1=$(date +%s.%N)
    echo "strata-generate --backend cuda ${flag:-(self-test)}: exit $r, $(secs "$t0" "$t1") s," \
        "$(grep -i "self-test" "$tmp/gen$flag.err" | head -1)"
    [ $r -eq 0 ] || rc=1
done
cmp -s "$tmp/gen.txt" "$tmp/gen--no-selftest.txt" && echo "same text with and without the self-test" ||
    { echo "text differs with --no-selftest"; rc=1; }

# the server's engine runs the same self-test before it reports ready
S=$st/bin/strata-serve
"$S" -m "$M" --port 0 --backend cuda --engine "$G" >"$out/serve.log" 2>&1 &
sp=$!
port=
for _ in $(seq 100); do
    port=$(sed -n 's/.*listening on [^ ]*:\([0-9][0-9]*\).*/\1/p' "$out/serve.log" | head -1)
    [ -n "$port" ] && break
    sleep 0.2
done
ready=
for _ in $(seq 150); do
    curl -s "http://127.0.0.1:$port/health" | grep -q '"ok"' && { ready=1; break; }
    sleep 0.2
done
body='{"model":"stories260K","prompt":"Once upon a time","max_tokens":16,"temperature":0}'
curl -s -H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$port/v1/completions" \
    >"$tmp/serve-completion.json"
kill $sp 2>/dev/null; wait $sp 2>/dev/null
echo "strata-serve --backend cuda: port ${port:-none}, ready ${ready:-no}," \
    "completion: $(head -c 300 "$tmp/serve-completion.json")"
[ -n "$ready" ] || rc=1
exit $rc
