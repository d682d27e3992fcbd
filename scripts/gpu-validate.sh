#!/bin/bash
# gpu-validate.sh - the whole GPU validation of a build, in two stages that share one
# GPU machine (the fixtures do not fit into one transfer):
#
#   scripts/gpu-validate.sh pack-a BUILD    here: programs, GPU tests and the first half
#                                           of the fixtures into devrun-a/
#   scripts/gpu-validate.sh pack-b          here: the second half into devrun-b/
#   scripts/gpu-validate.sh a               there (carry devrun-a): stash both halves in
#       /tmp/strata-fx; the probe (--quick, JSON), strata-serve on the GPU, the kernel
#       self-test and kernel tests, the vision encoder (scripts/gpu-run-vision.sh)
#   scripts/gpu-validate.sh b               there, on the same machine (carry devrun-b):
#       golden tests, stories text, perplexities, speculative decoding, the expert cache's
#       correctness matrix, and the benchmarks (decode/prefill, offload, speculation)
#   scripts/gpu-validate.sh c               the server with a good and with broken engines,
#                                           and the vision checks (pack-c BUILD BREAK_DIR)
#   scripts/gpu-validate.sh d1, then d2     a re-check after changes (pack-d BUILD): kernel,
#       self-test, golden and GPU speculation tests, the speculation benchmark on the GPU
#       and on the host's CPU, the offload benchmark with the model's own routing
#
# BUILD is a build directory of `make B=BUILD BINDIR=BUILD/bin CUDA_ARCHS=90 cuda
# gpu-tests`.  Logs go to /tmp/strata-val/STAGE and come back as $OUT/STAGE.tar.gz with
# a summary on stdout.
set -u
stage=${1:-}
root=$(pwd)
fx=${STRATA_FIXTURES:-$root/../shared/fixtures}
case $stage in
pack-a)
    set -e
    DEVRUN=devrun-a STRATA_FIXTURES=$fx scripts/gpu-devrun.sh "$2" "$2/bin/cuda" \
        models/tinycoder-moe-Q8_0.gguf models/tinydraft-qwen3-F16.gguf \
        models/mmproj-tinyvl-F16.gguf images/img-astronaut.png
    cp -r "$fx/ref" devrun-a/fixtures/
    du -sh devrun-a
    exit 0 ;;
pack-b)
    set -e
    rm -rf devrun-b && mkdir -p devrun-b/fixtures/models
    for q in F16 IQ4_XS IQ2_XS IQ1_M; do
        cp "$fx/models/tinycoder-moe-$q.gguf" devrun-b/fixtures/models/
    done
    du -sh devrun-b
    exit 0 ;;
pack-c)
    # the server and vision checks again, and the server with a broken engine: programs,
    # the broken variants (BREAK_DIR as tests/gpu/selftest-break.sh's STRATA_BREAK_BUILT)
    set -e
    DEVRUN=devrun-c STRATA_FIXTURES=$fx scripts/gpu-devrun.sh "$2" "$2/bin/cuda" \
        models/mmproj-tinyvl-F16.gguf images/img-astronaut.png ref/tinyvl-hf-reference.json \
        ref/tinyvl-astronaut-pixel_values.f32 ref/tinyvl-astronaut-embd.f32
    tar -C "$3" -cJf devrun-c/break.tar.xz .
    du -sh devrun-c
    exit 0 ;;
pack-d)
    # a re-check after changes, in two calls: d1 carries the programs, F16 and the draft
    # model and stashes them; d2 carries the other quants and runs
    set -e
    DEVRUN=devrun-d1 STRATA_FIXTURES=$fx scripts/gpu-devrun.sh "$2" "$2/bin/cuda" \
        models/tinycoder-moe-F16.gguf models/tinydraft-qwen3-F16.gguf
    rm -rf devrun-d2 && mkdir -p devrun-d2/fixtures/models devrun-d2/fixtures/ref
    for q in Q8_0 IQ4_XS IQ2_XS IQ1_M; do
        cp "$fx/models/tinycoder-moe-$q.gguf" devrun-d2/fixtures/models/
    done
    find "$fx/ref" -maxdepth 1 -type f ! -name 'tinyvl-*' -exec cp {} devrun-d2/fixtures/ref/ \;
    du -sh devrun-d1 devrun-d2
    exit 0 ;;
d1)
    rm -rf /tmp/strata-fx && mkdir -p /tmp/strata-fx && cp -r devrun-d1/. /tmp/strata-fx/ &&
        cp tests/data/stories260K.gguf tests/data/tinycoder-moe-Q4_K_M.gguf \
            /tmp/strata-fx/fixtures/models/ && echo "stashed" && ls /tmp/strata-fx/fixtures/models
    exit $? ;;
a | b | c | d2) ;;
*) echo "usage: scripts/gpu-validate.sh pack-a BUILD | pack-b | pack-c BUILD BREAK_DIR | pack-d BUILD |" \
        "a | b | c | d1 | d2" >&2
   exit 2 ;;
esac

F=/tmp/strata-fx
st=/tmp/strata-dev
log=/tmp/strata-val/$stage
rm -rf "$log" && mkdir -p "$log"
if [ "$stage" = a ] || [ "$stage" = c ]; then
    rm -rf "$F" && mkdir -p "$F" && cp -r "devrun-$stage/." "$F/" &&
        cp tests/data/stories260K.gguf tests/data/tinycoder-moe-Q4_K_M.gguf "$F/fixtures/models/"
elif [ "$stage" = b ]; then
    [ -f "$F/bin.tar.xz" ] || { echo "stage b needs stage a on this machine first"; exit 1; }
    cp devrun-b/fixtures/models/* "$F/fixtures/models/"
else
    [ -f "$F/bin.tar.xz" ] || { echo "stage d2 needs stage d1 on this machine first"; exit 1; }
    mkdir -p "$F/fixtures/ref" && cp -r devrun-d2/fixtures/. "$F/fixtures/"
fi
rm -rf "$st" && mkdir -p "$st" && tar -C "$st" -xJf "$F/bin.tar.xz" || exit 1
cb=$(python3 -c 'import nvidia.cublas,os;print(os.path.dirname(nvidia.cublas.__file__)+"/lib")' 2>/dev/null)
export LD_LIBRARY_PATH=$st/lib:/usr/local/cuda/lib64${cb:+:$cb}
# the system's curl, not against the libraries packed for our programs
curl() { env -u LD_LIBRARY_PATH curl "$@"; }
export STRATA_BIN=$st/bin STRATA_ROOT=$root STRATA_FIXTURES=$F/fixtures STRATA_BACKEND=cuda
rm -rf devrun && ln -s "$F" devrun # the scripts that read devrun/
rc=0
save() { mkdir -p "${OUT:-$root/gpu-out}" && tar -C /tmp/strata-val -czf "${OUT:-$root/gpu-out}/$stage.tar.gz" "$stage"; }
tap() { # name timeout command... : TAP to $log/name.tap, a count line, the failures
    local name=$1 to=$2 s=$SECONDS
    shift 2
    timeout "$to" "$@" >"$log/$name.tap" 2>&1 || rc=1
    echo "$name: $(grep -c '^ok' "$log/$name.tap") ok, $(grep -c '^not ok' "$log/$name.tap") not ok" \
        "($((SECONDS - s)) s)"
    grep -E '^not ok|^Bail' "$log/$name.tap" | head -12
}

# serve_check ENGINE: strata-serve with that engine on the GPU (which runs the kernel
# self-test before it reports ready); a completion when it starts
serve_check() {
    local sp port= slog=$log/serve-$(basename "$(dirname "$(dirname "$(dirname "$1")")")").log
    "$st/bin/strata-serve" -m "$F/fixtures/models/stories260K.gguf" --port 0 --backend cuda \
        --engine "$1" >"$slog" 2>&1 &
    sp=$!
    for _ in $(seq 150); do
        port=$(sed -n 's/.*listening on [^ ]*:\([0-9][0-9]*\).*/\1/p' "$slog" | head -1)
        [ -n "$port" ] && break
        kill -0 $sp 2>/dev/null || break
        sleep 0.2
    done
    if [ -n "$port" ]; then
        curl -s "http://127.0.0.1:$port/health" >"$log/health.json"
        curl -s -H 'Content-Type: application/json' "http://127.0.0.1:$port/v1/completions" \
            -d '{"model":"stories260K","prompt":"Once upon a time","max_tokens":16,"temperature":0}' \
            >"$log/completion.json"
        kill $sp 2>/dev/null
    fi
    wait $sp 2>/dev/null
    serve_rc=$?
    echo "strata-serve --engine $1: port ${port:-none}, exit $serve_rc"
    [ -n "$port" ] && echo "  health $(head -c 100 "$log/health.json")" &&
        echo "  completion: $(head -c 300 "$log/completion.json")"
    [ -n "$port" ] || tail -3 "$slog"
}

if [ "$stage" = d2 ]; then
    if [ "${VALIDATE_KERNELS:-1}" = 1 ]; then
        tap test_kernels 300 "$st/bin/test_kernels"
        tap test_selftest 120 "$st/bin/test_selftest"
    fi
    tap test_golden 300 "$st/bin/test_golden"
    save
    tap t0900-gpu-spec 360 bash tests/gpu/t0900-gpu-spec.sh
    save
    timeout 150 scripts/bench-spec.sh -b "$st/bin" -x "$st/bin/bench_spec" -B cuda -t 16 -r 3 \
        -g 64 -R 1 -a --no-selftest >"$log/bench-spec-gpu.txt" 2>&1 || rc=1
    cat "$log/bench-spec-gpu.txt"
    save
    timeout 150 scripts/bench-spec.sh -b "$st/bin" -x "$st/bin/bench_spec" -B cpu -t 16 -r 3 \
        -g 32 -R 1 >"$log/bench-spec-cpu.txt" 2>&1 || rc=1
    cat "$log/bench-spec-cpu.txt"
    save
    if [ "${VALIDATE_OFFLOAD:-1}" = 1 ]; then
        timeout 150 "$st/bin/bench_offload" --budget 25,50 --pcie-frac 1,auto --route model \
            --pp 512,2048 --prefill 2048 --tg 128 >"$log/bench_offload.txt" \
            2>"$log/bench_offload.err" || rc=1
        cat "$log/bench_offload.txt"
    fi
elif [ "$stage" = c ]; then
    serve_check "$st/bin/strata-generate"
    grep -q '"text"' "$log/completion.json" 2>/dev/null || rc=1
    mkdir -p /tmp/strata-break && tar -C /tmp/strata-break -xJf "$F/break.tar.xz"
    for mode in wrong fault hang; do
        rm -f "$log/completion.json"
        serve_check /tmp/strata-break/rms_norm-$mode/bin/cuda/strata-generate
        # refused: the server does not start, and says why
        [ "$serve_rc" -ne 0 ] && grep -q 'self-test failed.*rms_norm' "$log"/serve-rms_norm-$mode.log ||
            { rc=1; echo "  not refused as expected"; }
    done
    OUT=$log/vision timeout 200 bash scripts/gpu-run-vision.sh >"$log/vision.txt" 2>&1 || rc=1
    echo "vision: $(grep -c '^ok' "$log/vision.txt") ok, $(grep -c '^not ok' "$log/vision.txt") not ok"
    grep -E '^not ok' "$log/vision.txt" | head -16
elif [ "$stage" = a ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$st/bin/strata-probe" --quick >"$log/probe.txt" 2>&1
    echo "probe --quick: exit $?"
    grep -E 'status|selftest|usable|this build' "$log/probe.txt"
    # the server starts an engine on the GPU, which runs the self-test first
    "$st/bin/strata-serve" -m "$F/fixtures/models/stories260K.gguf" --port 0 --backend cuda \
        --engine "$st/bin/strata-generate" -v >"$log/serve.log" 2>&1 &
    sp=$! port=
    for _ in $(seq 150); do
        port=$(sed -n 's/.*listening on [^ ]*:\([0-9][0-9]*\).*/\1/p' "$log/serve.log" | head -1)
        [ -n "$port" ] && break
        kill -0 $sp 2>/dev/null || break
        sleep 0.2
    done
    curl -s "http://127.0.0.1:$port/health" >"$log/health.json"
    curl -s -H 'Content-Type: application/json' "http://127.0.0.1:$port/v1/completions" \
        -d '{"model":"stories260K","prompt":"Once upon a time","max_tokens":16,"temperature":0}' \
        >"$log/completion.json"
    kill $sp 2>/dev/null
    wait $sp 2>/dev/null
    echo "strata-serve --backend cuda: port ${port:-none}; health $(head -c 120 "$log/health.json")"
    echo "  completion: $(head -c 300 "$log/completion.json")"
    grep -q '"text"' "$log/completion.json" || { rc=1; tail -4 "$log/serve.log"; }
    grep -i 'self-test' "$log/serve.log" | head -2
    tap test_selftest 120 "$st/bin/test_selftest"
    tap test_kernels 300 "$st/bin/test_kernels"
    OUT=$log/vision timeout 200 bash scripts/gpu-run-vision.sh >"$log/vision.txt" 2>&1 || rc=1
    echo "vision: $(grep -c '^ok' "$log/vision.txt") ok, $(grep -c '^not ok' "$log/vision.txt") not ok"
    grep -E '^not ok|^# time|cosine|^test_vision' "$log/vision.txt" | head -16
else
    # most important first: what is cut by the call's time limit is the least needed
    tap test_golden 300 "$st/bin/test_golden"
    save
    tap t0900-gpu-spec 360 bash tests/gpu/t0900-gpu-spec.sh
    save
    tap test_expert_offload 200 "$st/bin/test_expert_offload"
    grep -E '^# .*hit' "$log/test_expert_offload.tap" | head -6
    save
    tap t0610-gpu-stories 120 bash tests/gpu/t0610-gpu-stories.sh
    tap t0612-gpu-perplexity 300 bash tests/gpu/t0612-gpu-perplexity.sh
    grep '# .*PPL' "$log/t0612-gpu-perplexity.tap"
    # prompt chunks of 2,048 tokens give the perplexity that chunks of 512 give
    for pf in 512 2048; do
        timeout 60 "$st/bin/strata-generate" -m "$F/fixtures/models/tinycoder-moe-Q4_K_M.gguf" \
            --backend cuda --perplexity "$F/fixtures/ref/heldout.py.txt" --ctx 2048 --chunks 2 \
            --prefill $pf >"$log/ppl-prefill$pf.txt" 2>&1
        echo "perplexity, ctx 2048, --prefill $pf: $(grep '^PPL' "$log/ppl-prefill$pf.txt" | tail -1)"
    done
    save
    timeout 150 "$st/bin/bench_gpu" --reps 2 >"$log/bench_gpu.txt" 2>&1 || rc=1
    tail -3 "$log/bench_gpu.txt"
    save
    timeout 150 scripts/bench-spec.sh -b "$st/bin" -x "$st/bin/bench_spec" -B cuda -t 16 -r 1 \
        -g 64 -R 1 -a --no-selftest >"$log/bench-spec-gpu.txt" 2>&1 || rc=1
    tail -24 "$log/bench-spec-gpu.txt"
    save
    timeout 200 "$st/bin/bench_offload" ${BENCH_OFFLOAD_ARGS:---budget 25,50 --pcie-frac 1,auto \
        --route model,uniform --pp 512,2048 --prefill 2048 --tg 128} \
        >"$log/bench_offload.txt" 2>"$log/bench_offload.err" || rc=1
    tail -40 "$log/bench_offload.txt"
fi
save
echo "stage $stage: exit $rc"
exit $rc
