#!/bin/bash
# gpu-run-spec.sh - speculative decoding on a GPU machine, from what gpu-devrun.sh packed
# into devrun/ (run from the repository root):
#   1. test_golden: verify windows of 2, 8, 16, 17 tokens bitwise equal to one-token
#      decodes for every fixture model, with and without graphs (and the HF goldens)
#   2. tests/gpu/t0900-gpu-spec.sh: greedy --spec T == --spec 0 with the GPU backend,
#      17-token windows, graphs off / sync debug, offloaded experts
#   3. scripts/bench-spec.sh on the host's CPU (16 threads) and on the GPU: T = 0, 2, 4,
#      8, tinycoder and the synthetic model
#   scripts/gpu-run-spec.sh [tests|bench|all]   (default all; each of tests and bench
#   takes about 5 minutes on an H200 host)
# Logs go to $OUT (default ./gpu-out; at most 6 files), a summary to stdout.
#
# Packing, on the build machine:
#   make B=/tmp/b CUDA_ARCHS=90 CUDA_BINDIR=/tmp/b/bin-cuda /tmp/b/bin-cuda/strata-generate \
#       /tmp/b/gpu-tests/test_golden /tmp/b/gpu-tests/bench_spec
#   scripts/gpu-devrun.sh /tmp/b /tmp/b/bin-cuda $(scripts/gpu-run-spec.sh --fixtures)
set -u
FIXTURES="models/tinycoder-moe-F16.gguf models/tinycoder-moe-Q8_0.gguf
models/tinycoder-moe-Q4_K_M.gguf models/tinycoder-moe-IQ4_XS.gguf
models/tinycoder-moe-IQ2_XS.gguf models/tinycoder-moe-IQ1_M.gguf
models/tinydraft-qwen3-F16.gguf models/stories260K.gguf
ref/tinycoder-hf-reference.json ref/tinycoder-logits-p0.f32 ref/tinycoder-logits-p1.f32
ref/tinycoder-logits-p2.f32 ref/tinycoder-logits-p3.f32
ref/tinydraft-hf-reference.json ref/tinydraft-logits-p0.f32 ref/tinydraft-logits-p1.f32
ref/tinydraft-logits-p2.f32 ref/tinydraft-logits-p3.f32"
stage=${1:-all}
case $stage in
--fixtures) echo $FIXTURES; exit 0 ;;
tests | bench | all) ;;
*) echo "usage: scripts/gpu-run-spec.sh [tests|bench|all|--fixtures]" >&2; exit 2 ;;
esac
root=$(pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
st=/tmp/strata-dev
rm -rf "$st" && mkdir -p "$st" && tar -C "$st" -xJf devrun/bin.tar.xz || exit 1
cb=$(python3 -c 'import nvidia.cublas,os;print(os.path.dirname(nvidia.cublas.__file__)+"/lib")' \
    2>/dev/null)
export LD_LIBRARY_PATH=$st/lib:/usr/local/cuda/lib64${cb:+:$cb}
export STRATA_BIN=$st/bin STRATA_ROOT=$root STRATA_FIXTURES=$root/devrun/fixtures
export STRATA_BACKEND=${STRATA_BACKEND:-cuda}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
    tee "$out/summary.txt"
rc=0
summ() { # name file
    echo "$1: $(grep -c '^ok' "$2") ok, $(grep -c '^not ok' "$2") not ok" | tee -a "$out/summary.txt"
    grep -E '^not ok|^# .*differs|^#   ' "$2" | head -16 | tee -a "$out/summary.txt"
}

if [ "$stage" != bench ]; then
    timeout 200 "$st/bin/test_golden" >"$out/golden.tap" 2>&1 || rc=1
    summ test_golden "$out/golden.tap"
    timeout 360 bash tests/gpu/t0900-gpu-spec.sh >"$out/t0900-gpu-spec.tap" 2>&1 || rc=1
    summ t0900-gpu-spec "$out/t0900-gpu-spec.tap"
fi
if [ "$stage" != tests ]; then
    th=${BENCH_THREADS:-16}
    syn=${BENCH_SPEC_SYNTH:-qwen3-30b-a3b:12:Q4_K_M}
    timeout 300 scripts/bench-spec.sh -b "$st/bin" -x "$st/bin/bench_spec" -B cpu -t "$th" \
        -s "$syn" -g 48 -R 1 >"$out/bench-spec-cpu.txt" 2>&1 || rc=1
    timeout 260 scripts/bench-spec.sh -b "$st/bin" -x "$st/bin/bench_spec" \
        -B "$STRATA_BACKEND" -t "$th" -s "$syn" -a --no-selftest >"$out/bench-spec-gpu.txt" 2>&1 ||
        rc=1
    cat "$out/bench-spec-cpu.txt" "$out/bench-spec-gpu.txt" | tee -a "$out/summary.txt"
fi
echo "exit $rc" | tee -a "$out/summary.txt"
exit $rc
