#!/bin/bash
# gpu-run.sh - run what gpu-devrun.sh packed into devrun/ on a GPU machine: the kernel
# tests, the golden tests (HF logits, llama.cpp text and perplexities), and the
# synthetic-model benchmark, with a per-operation profile.  Logs go under $OUT
# (default ./gpu-out); a summary goes to stdout.
set -u
root=$(pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
st=/tmp/strata-dev
rm -rf "$st" && mkdir -p "$st" && tar -C "$st" -xJf "${DEVRUN:-devrun}/bin.tar.xz" || exit 1
# cuBLAS is loaded at run time: the toolkit's, else the one a Python install carries
cb=$(python3 -c 'import nvidia.cublas,os;print(os.path.dirname(nvidia.cublas.__file__)+"/lib")' 2>/dev/null)
export LD_LIBRARY_PATH=$st/lib:/usr/local/cuda/lib64${cb:+:$cb}
export STRATA_BIN=$st/bin STRATA_ROOT=$root STRATA_FIXTURES=$root/${DEVRUN:-devrun}/fixtures
export STRATA_BACKEND=${STRATA_BACKEND:-cuda}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
rc=0
for t in kernels golden; do
    "$st/bin/test_$t" > "$out/$t.tap" 2>&1 || rc=1
    echo "test_$t: $(grep -c '^ok' "$out/$t.tap") ok, $(grep -c '^not ok' "$out/$t.tap") not ok"
    grep -E '^not ok|^Bail|^# .*gpu vs|^#   at' "$out/$t.tap" | head -12
done
for t in tests/gpu/t*.sh; do
    bash "$t" > "$out/$(basename "$t" .sh).tap" 2>&1 || rc=1
    grep -E '^not ok|^# .*PPL' "$out/$(basename "$t" .sh).tap"
    echo "$(basename "$t"): $(grep -c '^ok' "$out/$(basename "$t" .sh).tap") ok, $(grep -c '^not ok' "$out/$(basename "$t" .sh).tap") not ok"
done
STRATA_GPU_PROFILE=1 "$st/bin/bench_gpu" --reps 1 > "$out/profile.txt" 2>&1
grep -E 'profile (decode|batch) ' "$out/profile.txt" | head -16
# decode without the attention merge/8-bit output, the pinned input copy and the staged
# output projection (as before them), with the fused norm epilogues and routing
# (STRATA_FUSE=1), then the default
"$st/bin/bench_gpu" --reps 3 --ab STRATA_NO_ATTQ+STRATA_NO_PIN_IN+STRATA_NO_MVQ_STAGE,STRATA_FUSE \
    2>&1 | grep -E 'tg|pp|floor' | tee "$out/bench.txt"
"$st/bin/bench_gpu" --reps 3 --pp 2048 --tg 32 2>&1 | tail -2 | tee -a "$out/bench.txt"
exit $rc
