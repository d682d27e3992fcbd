#!/bin/bash
# gpu-run-cache.sh - the expert cache's GPU checks: the correctness matrix
# (tests/gpu/test_expert_offload.c) and the offload benchmark (tests/gpu/bench_offload.c).
#
#   scripts/gpu-run-cache.sh pack BUILD_DIR GPU_BIN_DIR   on the build machine: programs,
#       their shared libraries and the fixtures the checks read into devrun-cache/
#       (git-ignored), as scripts/gpu-devrun.sh does for devrun/
#   scripts/gpu-run-cache.sh run [BENCH_ARGS...]          on the GPU machine: logs under
#       $OUT (default ./gpu-out), a summary on stdout; exit 1 when a check failed
#
# e.g. make B=/tmp/b BINDIR=/tmp/b/bin CUDA_ARCHS=90 cuda \
#        /tmp/b/gpu-tests/test_expert_offload /tmp/b/gpu-tests/bench_offload &&
#      scripts/gpu-run-cache.sh pack /tmp/b /tmp/b/bin/cuda
#   then on the GPU machine (carry devrun-cache):
#      scripts/gpu-run-cache.sh run --budget 25,50,5 --pcie-frac 1,auto --tg 128
set -u
d=devrun-cache
case "${1:-}" in
pack)
    set -e
    b=$2 bindir=$3
    fx=${STRATA_FIXTURES:-../shared/fixtures}
    rm -rf "$d"
    mkdir -p "$d/stage/bin" "$d/stage/lib" "$d/fixtures/models" "$d/fixtures/ref"
    for f in "$bindir/strata-generate" "$b/gpu-tests/test_expert_offload" \
             "$b/gpu-tests/bench_offload"; do
        strip -o "$d/stage/bin/$(basename "$f")" "$f"
    done
    for f in "$d"/stage/bin/*; do
        ldd "$f" | awk '$3 ~ /^\// {print $3}'
    done | sort -u | grep -v -E 'lib(c|m|dl|rt|pthread|stdc\+\+|gcc_s)\.so' |
        while read -r l; do cp -L "$l" "$d/stage/lib/"; done
    tar -C "$d/stage" -cJf "$d/bin.tar.xz" bin lib
    rm -rf "$d/stage"
    for f in models/tinycoder-moe-F16.gguf models/tinycoder-moe-Q4_K_M.gguf ref/heldout.py.txt; do
        cp "$fx/$f" "$d/fixtures/$f"
    done
    du -sh "$d"
    ;;
run)
    shift
    root=$(pwd)
    out=${OUT:-$root/gpu-out}
    mkdir -p "$out"
    st=/tmp/strata-cache
    rm -rf "$st" && mkdir -p "$st" && tar -C "$st" -xJf "$d/bin.tar.xz" || exit 1
    export LD_LIBRARY_PATH=$st/lib:/usr/local/cuda/lib64
    export STRATA_FIXTURES=$root/$d/fixtures STRATA_BACKEND=${STRATA_BACKEND:-cuda}
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
    rc=0
    timeout 75 "$st/bin/test_expert_offload" > "$out/expert-offload.tap" 2> "$out/expert-offload.err" || rc=1
    echo "test_expert_offload: $(grep -c '^ok' "$out/expert-offload.tap") ok," \
         "$(grep -c '^not ok' "$out/expert-offload.tap") not ok"
    grep -E '^not ok|^# ' "$out/expert-offload.tap" | head -40
    tail -5 "$out/expert-offload.err"
    # the engine's own lines: memory plan, progress, statistics (a budget that holds
    # part of tinycoder's experts)
    for mib in 96; do
        echo "== strata-generate --vram-budget-mib $mib"
        timeout 10 "$st/bin/strata-generate" -m "$STRATA_FIXTURES/models/tinycoder-moe-Q4_K_M.gguf" \
            --backend cuda -c 512 -n 32 -p "def fibonacci(n):" --no-selftest --stats \
            --vram-budget-mib $mib > "$out/generate-$mib.txt" 2>&1 ||
            echo "strata-generate: exit $?"
        grep -v -E '^(strata-generate: )?memory plan:   (dense|kv|scratch|staging|unused)' \
            "$out/generate-$mib.txt" | head -24
    done
    timeout 120 "$st/bin/bench_offload" "$@" > "$out/bench-offload.txt" \
        2> "$out/bench-offload.err" || echo "bench_offload: exit $?"
    cat "$out/bench-offload.txt"
    grep -E 'PCIe probe|expert time|expert copies|  all ' "$out/bench-offload.err" | head -24
    exit $rc
    ;;
*)
    echo "usage: scripts/gpu-run-cache.sh pack BUILD_DIR GPU_BIN_DIR | run [BENCH_ARGS...]" >&2
    exit 2
    ;;
esac
