#!/bin/bash
# gpu-run-vision.sh - check the GPU vision encoder on a GPU machine, from what
# gpu-devrun.sh packed into devrun/: test_vision_gpu (GPU against CPU embeddings, time
# per image), then strata-embed --backend cuda on the fixture image, a non-square image
# and the reference patches, compared with --backend cpu, the loopback helper on the
# GPU, and the error paths (no device, a device that does not exist).
# Logs go under $OUT (default ./gpu-out); a summary goes to stdout; exit 1 if a check
# failed.  The programs are unpacked into $STRATA_DEV (default /tmp/strata-dev, as
# gpu-run.sh does).  Pack it with:
#   make B=BUILD cuda gpu-tests CUDA_ARCHS=90
#   scripts/gpu-devrun.sh BUILD bin/cuda models/mmproj-tinyvl-F16.gguf \
#       images/img-astronaut.png ref/tinyvl-hf-reference.json \
#       ref/tinyvl-astronaut-pixel_values.f32 ref/tinyvl-astronaut-embd.f32
set -u
root=$(pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
st=${STRATA_DEV:-/tmp/strata-dev}
rm -rf "$st" && mkdir -p "$st" && tar -C "$st" -xJf devrun/bin.tar.xz || exit 1
export LD_LIBRARY_PATH=$st/lib:/usr/local/cuda/lib64
# the system's curl, not against the libraries packed for our programs
curl() { env -u LD_LIBRARY_PATH curl "$@"; }
export STRATA_FIXTURES=$root/devrun/fixtures
export STRATA_BACKEND=${STRATA_BACKEND:-cuda}
B=$STRATA_BACKEND
fx=$STRATA_FIXTURES
E=$st/bin/strata-embed
M=$fx/models/mmproj-tinyvl-F16.gguf
IMG=$fx/images/img-astronaut.png
PV=$fx/ref/tinyvl-astronaut-pixel_values.f32
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
rc=0
n=0
check() { # name, command...
    local name=$1
    shift
    n=$((n + 1))
    if "$@" >/dev/null 2>&1; then
        echo "ok $n - $name"
    else
        echo "not ok $n - $name"
        rc=1
    fi
}

# 1. the C test: GPU vs CPU, errors, time per image (built for CUDA only)
if [ "$B" = cuda ]; then
    "$st/bin/test_vision_gpu" >"$out/vision_gpu.tap" 2>&1
    trc=$?
    echo "test_vision_gpu: $(grep -c '^ok' "$out/vision_gpu.tap") ok," \
        "$(grep -c '^not ok' "$out/vision_gpu.tap") not ok (exit $trc)"
    grep -E '^not ok|^# time|^Bail' "$out/vision_gpu.tap"
    [ $trc -eq 0 ] || rc=1
else
    echo "test_vision_gpu: skipped (built for cuda; backend $B)"
fi

# min row cosine of two payloads (header 40 bytes, then float32 rows); needs python3
cosine() {
    python3 - "$1" "$2" <<'EOF'
import math, struct, sys
def rd(p):
    b = open(p, 'rb').read()
    n, d = struct.unpack_from('<II', b, 12)
    return n, d, struct.unpack_from('<%df' % (n * d), b, 40)
na, da, a = rd(sys.argv[1])
nb, db, b = rd(sys.argv[2])
assert (na, da) == (nb, db), 'shapes differ'
w = 1.0
for r in range(na):
    x, y = a[r * da:(r + 1) * da], b[r * da:(r + 1) * da]
    dot = sum(p * q for p, q in zip(x, y))
    c = dot / math.sqrt(sum(p * p for p in x) * sum(q * q for q in y) + 1e-30)
    w = min(w, c)
print('%.7f' % w)
EOF
}

# 2. strata-embed on both backends
for what in astronaut pv; do
    for b in "$B" cpu; do
        if [ $what = pv ]; then
            args=(--pixel-values "$PV" --grid 32x32)
        else
            args=(--max-pixels 200704 "$IMG")
        fi
        "$E" -m "$M" --backend "$b" -o "$out/$what-$b.emb" "${args[@]}" 2>"$out/embed-$what-$b.log"
        check "strata-embed --backend $b ($what): exit 0" test $? -eq 0
        "$E" -m "$M" --backend "$b" --json "${args[@]}" >"$out/embed-$what-$b.json" \
            2>>"$out/embed-$what-$b.log"
        check "strata-embed --backend $b ($what): json names the backend" \
            grep -q "\"backend\":\"$b\"" "$out/embed-$what-$b.json"
        echo "# $what on $b: $(cat "$out/embed-$what-$b.json")"
    done
    check "$what: same payload header on $B and cpu" \
        cmp -n 40 "$out/$what-$B.emb" "$out/$what-cpu.emb"
    if command -v python3 >/dev/null; then
        c=$(cosine "$out/$what-$B.emb" "$out/$what-cpu.emb" 2>"$out/cosine-$what.err")
        echo "# $what: $B vs cpu min row cosine $c"
        check "$what: $B vs cpu min row cosine $c >= 0.9999" \
            python3 -c "import sys; sys.exit(0 if float('$c') >= 0.9999 else 1)"
    fi
done

# a non-square image of another size: a PNG written with python3's zlib
if python3 - "$out/wide.png" <<'EOF'
import struct, sys, zlib
w, h = 333, 190
raw = b''.join(b'\0' + bytes(v for x in range(w)
                             for v in (x * 255 // w, y * 255 // h, (x ^ y) & 255))
               for y in range(h))
def chunk(t, d):
    return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))
open(sys.argv[1], 'wb').write(b'\x89PNG\r\n\x1a\n' +
    chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0)) +
    chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))
EOF
then
    for b in "$B" cpu; do
        "$E" -m "$M" --backend "$b" -o "$out/wide-$b.emb" "$out/wide.png" 2>"$out/embed-wide-$b.log"
        check "strata-embed --backend $b (333x190): exit 0" test $? -eq 0
    done
    check "333x190: same payload header" cmp -n 40 "$out/wide-$B.emb" "$out/wide-cpu.emb"
    c=$(cosine "$out/wide-$B.emb" "$out/wide-cpu.emb" 2>"$out/cosine-wide.err")
    echo "# 333x190: $B vs cpu min row cosine $c"
    check "333x190: min row cosine $c >= 0.9999" \
        python3 -c "import sys; sys.exit(0 if float('$c') >= 0.9999 else 1)"
fi

# 3. the loopback helper on the GPU: its payload equals the command line's bit for bit
if command -v curl >/dev/null; then
    "$E" -m "$M" --backend "$B" --serve --port 0 --warmup --max-pixels 200704 \
        2>"$out/serve.log" &
    pid=$!
    port=
    for _ in $(seq 1 300); do
        port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$out/serve.log")
        [ -n "$port" ] && break
        sleep 0.1
    done
    check "helper on $B listens" test -n "$port"
    curl -s "http://127.0.0.1:$port/health" >"$out/health.json"
    check "helper /health ok" grep -q '"status":"ok"' "$out/health.json"
    curl -s -o "$out/served.emb" --data-binary @"$IMG" "http://127.0.0.1:$port/embed"
    check "helper POST /embed equals strata-embed -o (bitwise)" \
        cmp "$out/served.emb" "$out/astronaut-$B.emb"
    kill $pid
    wait $pid
    check "helper exits cleanly" test $? -eq 0
fi

# 4. errors: a device that does not exist, no visible device, auto without a device
"$E" -m "$M" --backend "$B" --device 7 --json "$IMG" >/dev/null 2>"$out/err-device.log"
check "--device 7: exit 4" test $? -eq 4
check "--device 7: explained" grep -q 'device 7 does not exist' "$out/err-device.log"
CUDA_VISIBLE_DEVICES= HIP_VISIBLE_DEVICES= "$E" -m "$M" --backend "$B" --json "$IMG" \
    >/dev/null 2>"$out/err-nodev.log"
check "no visible device: exit 4" test $? -eq 4
check "no visible device: explained" grep -q "no $B device available" "$out/err-nodev.log"
CUDA_VISIBLE_DEVICES= HIP_VISIBLE_DEVICES= "$E" -m "$M" --backend auto --json \
    --max-pixels 50000 "$IMG" >"$out/auto-nodev.json" 2>"$out/auto-nodev.log"
check "auto without a device: the cpu" grep -q '"backend":"cpu"' "$out/auto-nodev.json"
"$E" -m "$M" --backend auto --json --max-pixels 50000 "$IMG" >"$out/auto.json" 2>/dev/null
check "auto with a device: $B" grep -q "\"backend\":\"$B\"" "$out/auto.json"
for f in "$out"/err-*.log; do echo "# $(basename "$f"): $(tail -1 "$f")"; done
echo "gpu-run-vision: $n checks, exit $rc"
exit $rc
