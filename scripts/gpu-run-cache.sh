#!/bin/bash
# gpu-run-cache.sh - the expert cache's GPU checks: the correctness matrix
# (tests/gpu/test_expert_offload.c) and the offload benchmark (tests/gpu/bench_offload.c).
#
#   scripts/gpu-run-cache.sh pack BUILD_DIR GPU_BIN_DIR   on the build machine: programs,
#       their shared libraries and the fixtures the checks read into devrun-cache/
#       (git-ignored), as scripts/gpu-devrun.sh does for devrun/
#   scripts/gpu-run-cache.sh run [BENCH_ARGS...]          on the GPU machine: logs under
#       $OUT (default ./gpu-out), a summary on stdout; exit 1 when a check failed.
#       Without BENCH_ARGS the benchmark runs budgets 25% and 50%, pcie_frac 1 and auto,
#       the model's routing and uniform routing, pp512, pp2048 (--prefill 2048), tg128,
#       random token ids.  About 3 minutes in all on an H200 host.
#
# e.g. make B=/tmp/b BINDIR=/tmp/b/bin CUDA_ARCHS=90 cuda \
#        /tmp/b/gpu-tests/test_expert_offload /tmp/b/gpu-tests/bench_offload &&
#      scripts/gpu-run-cache.sh pack /tmp/b /tmp/b/bin/cuda
#   then on the GPU machine (carry devrun-cache):
#      scripts/gpu-run-cache.sh run
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
    timeout 85 "$st/bin/test_expert_offload" > "$out/expert-offload.tap" 2> "$out/expert-offload.err" || rc=1
    echo "test_expert_offload: $(grep -c '^ok' "$out/expert-offload.tap") ok," \
         "$(grep -c '^not ok' "$out/expert-offload.tap") not ok"
    grep -E '^not ok|^# ' "$out/expert-offload.tap" | head -40
    # the largest logit difference, PCIe-only placements and those with CPU experts
    awk '/max \|logit diff\|/ { k = /pcie_frac 1\.0/ ? "PCIe only" : "CPU experts";
         for (i = 1; i <= NF; i++) if ($i == "diff|" && $(i + 1) + 0 >= m[k]) {
             m[k] = $(i + 1) + 0; w[k] = $0 } }
         END { for (k in m) print "largest logit difference, " k ": " m[k] "\n  " w[k] }' \
        "$out/expert-offload.tap"
    tail -5 "$out/expert-offload.err"
    # the engine's own lines: memory plan, progress, statistics (a budget that holds
    # part of tinycoder's experts: 80 MiB of scratch, 1.8 of dense weights, 7.8 of experts)
    for mib in 86; do
        echo "== strata-generate --vram-budget-mib $mib"
        timeout 10 "$st/bin/strata-generate" -m "$STRATA_FIXTURES/models/tinycoder-moe-Q4_K_M.gguf" \
            --backend cuda -c 512 -n 32 -p "def fibonacci(n):" --no-selftest --stats --json \
            --vram-budget-mib $mib --pcie-frac 0.5 > "$out/generate-$mib.txt" \
            2> "$out/generate-$mib.err" || echo "strata-generate: exit $?"
        grep -v -E '^(strata-generate: )?memory plan:   (dense|kv|scratch|staging|unused)' \
            "$out/generate-$mib.err" | head -24
        # the --json summary's expert statistics
        tail -1 "$out/generate-$mib.txt" | grep -o '"experts":.*' | cut -c1-700
    done
    [ $# -gt 0 ] || set -- --budget 25,50 --pcie-frac 1,auto --route model,uniform \
        --pp 512,2048 --prefill 2048 --tg 128
    timeout 130 "$st/bin/bench_offload" "$@" > "$out/bench-offload.txt" \
        2> "$out/bench-offload.err" || echo "bench_offload: exit $?"
    cat "$out/bench-offload.txt"
    grep -E 'PCIe probe|cannot pin|error' "$out/bench-offload.err" | sort | uniq -c | head -12
    exit $rc
    ;;
*)
    echo "usage: scripts/gpu-run-cache.sh pack BUILD_DIR GPU_BIN_DIR | run [BENCH_ARGS...]" >&2
    exit 2
    ;;
esac
