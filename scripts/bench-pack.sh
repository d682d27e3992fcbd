#!/usr/bin/env bash
# bench-pack.sh - time strata-prepare --repack on a synthetic GGUF against the
# disk's sequential read speed.  Usage: scripts/bench-pack.sh PACKTOOL PREPARE
# [MIB] [DIR].  Caches are dropped before each timing when run as root.
set -eu
tool=$1 prep=$2 mib=${3:-1024} dir=${4:-${TMPDIR:-/tmp}/strata-bench-pack}
mkdir -p "$dir"
g="$dir/synth.gguf"
[ -s "$g" ] || "$tool" synth "$g" "$mib"
cold() { sync; if [ "$(id -u)" = 0 ]; then echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; fi; }
secs() { local s e; s=$(date +%s%N); "$@" >/dev/null 2>&1; e=$(date +%s%N); echo $(((e - s) / 1000000)); }
size=$(stat -c %s "$g")
printf '%-8s %10s %10s %10s %10s  %s\n' run "read ms" "(direct)" "repack ms" "native ms" "ratio repack/read"
for i in 1 2 3; do
    cold; rd=$(secs dd if="$g" of=/dev/null bs=16M)
    cold; di=$(secs dd if="$g" of=/dev/null bs=16M iflag=direct)
    rm -rf "$dir/out"; cold; rp=$(secs "$prep" --out "$dir/out" --repack "$g")
    rm -rf "$dir/out"; cold; nt=$(secs "$prep" --out "$dir/out" "$g")
    printf '%-8s %10s %10s %10s %10s  %.2f (%.2f of direct)   load %s\n' "$i" "$rd" "$di" "$rp" "$nt" \
        "$(echo "$rd / $rp" | bc -l)" "$(echo "$di / $rp" | bc -l)" "$(cut -d' ' -f1 /proc/loadavg)"
done
echo "file: $size bytes; $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
rm -rf "$dir/out"
