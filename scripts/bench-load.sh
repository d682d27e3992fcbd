#!/usr/bin/env bash
# bench-load.sh - engine start with and without a resident image, and
# strata-load's throughput against the disk's sequential read speed.
# Usage: scripts/bench-load.sh BENCH_LOAD STRATA_LOAD [N_LAYER] [DIR]
# The pack's file is dropped from the page cache (dd iflag=nocache) before
# each cold timing, which needs no privileges.
set -eu
bench=$1 load=$2 layers=${3:-12} dir=${4:-${TMPDIR:-/tmp}/strata-bench-load}
pack=$dir/synth.strata
[ -s "$pack/pack.json" ] || "$bench" make "$dir" "$layers" >/dev/null
g=$dir/synth.gguf
size=$(stat -c %s "$g")
drop() { dd if="$g" iflag=nocache count=0 status=none; }
secs() { local s e; s=$(date +%s%N); "$@" >/dev/null 2>&1; e=$(date +%s%N); echo $(((e - s) / 1000000)); }
name=
cleanup() { [ -n "$name" ] && "$load" --unload "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT
echo "synthetic pack: $(awk "BEGIN{printf \"%.2f\", $size/2^30}") GiB ($layers layers of qwen3-30b-a3b, Q4_K_M)"
for _ in $(seq "${BENCH_LOAD_ITERS:-3}"); do
    drop; rd=$(secs dd if="$g" of=/dev/null bs=16M)
    di=$(secs dd if="$g" of=/dev/null bs=16M iflag=direct)
    awk -v s="$size" -v a="$rd" -v b="$di" \
        'BEGIN { printf "disk: buffered %.2f GiB/s, O_DIRECT %.2f GiB/s\n", s / 2^30 / (a / 1000), s / 2^30 / (b / 1000) }'
    drop; STRATA_NO_RESIDENT=1 "$bench" start "$pack" | sed 's/^/cold   /'
    STRATA_NO_RESIDENT=1 "$bench" start "$pack" | sed 's/^/cached /'
    drop
    name=$("$load" --detach "$pack" 2>"$dir/load.err")
    grep 'ready' "$dir/load.err" | sed 's/^/  /'
    drop; "$bench" start "$pack" | sed 's/^/image  /'
    "$load" --unload "$name" >/dev/null 2>&1; name=
    drop
    name=$("$load" --no-direct --detach "$pack" 2>"$dir/load.err")
    grep 'ready' "$dir/load.err" | sed 's/^/  (buffered) /'
    "$load" --unload "$name" >/dev/null 2>&1; name=
done
openssl speed -evp sha256 -bytes 16777216 -seconds 2 2>/dev/null | awk '/^sha256/ { printf "sha256 (one core): %.2f GiB/s\n", $2 * 1000 / 2^30 }' || true
echo "$(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); load $(cut -d' ' -f1 /proc/loadavg)"
