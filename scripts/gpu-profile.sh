#!/bin/bash
# gpu-profile.sh - where the GPU's time goes, on a GPU machine:
#
#   scripts/gpu-profile.sh pack BUILD [DIR]   here: bench_gpu and bench_offload of BUILD (a
#                                             `make B=BUILD CUDA_ARCHS=90 gpu-tests`) into DIR
#                                             (default devrun-p)
#   scripts/gpu-profile.sh run [DIR] [WHAT]   there: WHAT is any of bench, ncu, offload,
#                                             check, ab, offmem, offtest, prof, spec, xcpu,
#                                             diag, ncupp, ncudec, gpushell, specgpu, e2e, pcie,
#                                             spectrace (default
#                                             bench ncu offload)
#
# bench: bench_gpu --tg 128 --reps 3 (decode and prefill, all in VRAM).  ncu: the time each
# kernel of a few decode steps runs once scheduled (Nsight Compute, graph nodes profiled
# one by one, clocks left alone, caches flushed unless NCU_CACHE=none), as CSV for
# scripts/ncu-summary.py.  offload:
# bench_offload with the synthetic model written to a file and mapped (host memory
# against the experts' bytes), 25% and 50% of the experts in VRAM, the model's routing.
# check: test_kernels and test_golden (with the fixtures packed into DIR/fixtures, if
# any).  ab: bench_gpu --ab over $AB.  offmem: bench_offload from memory, once per
# setting of $OFFENV (space-separated settings, each VAR=VALUE[,VAR=VALUE...], "-"
# for none; more options in $OFFARGS, e.g. --reps 3; ROUTE=uniform for uniform
# routing).  offtest: test_expert_offload.  prof: per-operation times
# (STRATA_GPU_PROFILE=1).  spec:
# scripts/bench-spec.sh on the host's CPU (all its threads, or $SPEC_THREADS; more
# options in $SPEC_ARGS).  ncupp: Nsight Compute's full report of a few prefill kernels;
# ncudec: the same for a few decode kernels.  gpushell: the GPU shell tests
# (tests/gpu/t0610, t0612, t0900) on the packed programs and fixtures.  specgpu:
# scripts/bench-spec.sh on the GPU (-F 512; more in $SPEC_ARGS).
# The fixtures do not fit one transfer: pack the F16 models in one run and the
# quantised ones (Q8_0, IQ*) in another.
# specloop: --spec 0 against the draft model at T=2, 4 and 8, and against the loop without
# windows (STRATA_SPEC_PLAIN=1, "P" rows) with the draft model and the n-gram, interleaved
# rounds ($SPEC_REPS, default 15) of 512 tokens at temperature 1 on tinycoder Q4_K_M.
# xcpu: bench_expert_cpu.  pcie: bench_pcie (host-to-device bandwidth, copy engine and
# kernel reads of mapped memory).  spectrace: the draft model's back-off at T=2 and 8
# on the GPU, six runs each alternating with --spec 0, with STRATA_SPEC_TRACE=1 summed.
# e2e: strata-generate end to end on the synthetic 12-layer Qwen3-30B-A3B Q4_K_M (written
# there by strata-prepare --synth; its vocabulary has the real size): 256 tokens greedy,
# greedy with --logprobs, and at temperature 1, three runs each in turn ($E2E_MODES: other
# option sets, separated by ';'; $E2E_BINS: other programs of DIR/bin, run in turn;
# $E2E_ARGS adds options to every run, e.g. --vram-budget-mib N).
# diag: bench_offload mapping a freshly written file on the disk, with the process's
# kernel stacks and the host's dirty and writeback memory sampled while it opens.
# Logs go to $OUT (or /tmp/strata-prof).
set -u
case ${1:-} in
pack)
    set -e
    d=${3:-devrun-p}
    rm -rf "$d" && mkdir -p "$d/lib"
    for f in bench_gpu bench_offload bench_pcie test_kernels test_golden test_expert_offload bench_spec; do
        strip -o "$d/$f" "$2/gpu-tests/$f"
    done
    [ -x "$2/bench/bench_expert_cpu" ] && strip -o "$d/bench_expert_cpu" "$2/bench/bench_expert_cpu"
    mkdir -p "$d/bin" && strip -o "$d/bin/strata-generate" "$2/bin/cuda/strata-generate"
    [ -x "$2/bin/cuda/strata-prepare" ] && strip -o "$d/bin/strata-prepare" "$2/bin/cuda/strata-prepare"
    # fixtures named in $FIXTURES (paths under the fixtures folder)
    fx=${STRATA_FIXTURES:-$(pwd)/../shared/fixtures}
    for f in ${FIXTURES:-}; do
        mkdir -p "$d/fixtures/$(dirname "$f")" && cp -r "$fx/$f" "$d/fixtures/$f"
    done
    # their libraries that a bare machine may lack
    for f in "$d"/bench_* "$d"/test_* "$d"/bin/*; do ldd "$f" 2>/dev/null; done | awk '$3 ~ /^\// {print $3}' |
        sort -u | grep -v -E 'lib(c|m|dl|rt|pthread|stdc\+\+|gcc_s)\.so' |
        while read -r l; do cp -L "$l" "$d/lib/"; done
    # the programs and their libraries travel compressed (the transfer is limited)
    tar -C "$d" -cJf "$d/bin.tar.xz" $(cd "$d" && ls -d bench_* test_* lib bin)
    (cd "$d" && rm -rf bench_* test_* lib bin)
    du -sh "$d"
    exit 0 ;;
run) ;;
*) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
d=${2:-devrun-p}
what=${3:-bench ncu offload}
out=${OUT:-/tmp/strata-prof}
[ -f "$d/bin.tar.xz" ] && [ ! -x "$d/bench_gpu" ] && tar -C "$d" -xJf "$d/bin.tar.xz"
# the fixtures the repository ships
[ -d "$d/fixtures/models" ] && cp tests/data/*.gguf "$d/fixtures/models/"
export LD_LIBRARY_PATH=$(cd "$d" && pwd)/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$out"
(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; lscpu | head -20;
 free -g) > "$out/machine.txt" 2>&1
for w in $what; do
    case $w in
    bench)
        timeout 300 "$d/bench_gpu" --tg 128 --reps 3 2>&1 | tee "$out/bench_gpu.log" ;;
    ncu)
        timeout 400 ncu --graph-profiling node --clock-control none --cache-control ${NCU_CACHE:-all} \
            --metrics gpu__time_duration.sum --csv --page raw \
            "$d/bench_gpu" --pp 16 --tg 6 --reps 1 > "$out/ncu.csv" 2> "$out/ncu.err"
        echo "ncu: exit $?, $(wc -l < "$out/ncu.csv") lines"; tail -3 "$out/ncu.err" ;;
    check)
        timeout 120 "$d/test_kernels" 2>&1 | tee "$out/test_kernels.log" | grep -E "^not ok|^1\.\." 
        echo "test_kernels: $(grep -c '^ok' "$out/test_kernels.log") ok, $(grep -c '^not ok' "$out/test_kernels.log") not ok"
        STRATA_FIXTURES=$(cd "$d" && pwd)/fixtures timeout 200 "$d/test_golden" > "$out/test_golden.log" 2>&1
        grep -E "^not ok" "$out/test_golden.log" | head -30
        echo "test_golden: $(grep -c '^ok' "$out/test_golden.log") ok, $(grep -c '^not ok' "$out/test_golden.log") not ok" ;;
    ab)
        timeout 200 "$d/bench_gpu" --tg 128 --reps 3 --ab "${AB:-STRATA_NO_FUSE_ROUTE}" 2>&1 | tee "$out/bench_ab.log" ;;
    offmem)
        for e in ${OFFENV:--}; do
            echo "== bench_offload ${e#-}" | tee -a "$out/offmem.log"
            ( [ "$e" != - ] && for v in ${e//,/ }; do export "$v"; done
              timeout 300 stdbuf -oL "$d/bench_offload" --budget ${BUDGETS:-25,50} \
                  --route ${ROUTE:-model} --pcie-frac ${FRACS:-1,auto} --pp ${PP:-2048} --tg 128 \
                  ${OFFARGS:-} ) 2>&1 |
                tee -a "$out/offmem.log"
        done ;;
    offtest)
        STRATA_FIXTURES=$(cd "$d" && pwd)/fixtures timeout 300 "$d/test_expert_offload" \
            > "$out/offtest.log" 2>&1
        grep -E "^not ok" "$out/offtest.log" | head -20
        echo "test_expert_offload: $(grep -c '^ok' "$out/offtest.log") ok, $(grep -c '^not ok' "$out/offtest.log") not ok" ;;
    prof)
        STRATA_GPU_PROFILE=1 timeout 120 "$d/bench_gpu" --tg 16 --reps 1 > "$out/prof.log" 2>&1
        tail -60 "$out/prof.log" ;;
    spec)
        STRATA_FIXTURES=$(cd "$d" && pwd)/fixtures timeout 300 scripts/bench-spec.sh \
            -b "$d/bin" -x "$d/bench_spec" -B cpu -t "${SPEC_THREADS:-$(nproc)}" \
            -r ${SPEC_REPS:-3} -S -a --no-selftest ${SPEC_ARGS:-} 2>&1 | tee -a "$out/spec.log" ;;
    ncupp)
        # the prefill kernels in detail (stall reasons, throughput): $NCU_KERNELS, a regex
        timeout 400 ncu --kernel-name "regex:${NCU_KERNELS:-mm_kernel|attn}" --launch-skip 24 \
            --launch-count ${NCU_COUNT:-6} --set full --page details \
            "$d/bench_gpu" --pp 512 --tg 2 --reps 1 > "$out/ncupp.txt" 2> "$out/ncupp.err"
        echo "ncupp: exit $?, $(wc -l < "$out/ncupp.txt") lines"; tail -3 "$out/ncupp.err" ;;
    ncudec)
        # decode kernels in detail (stall reasons, throughput): $NCU_KERNELS, a regex;
        # $NCU_SKIP matching launches skipped (past the prompt's), $NCU_COUNT profiled
        timeout 400 ncu --graph-profiling node --clock-control none --cache-control none \
            --kernel-name "regex:${NCU_KERNELS:-mvq_kernel|moe_router|attn_kernel|qkv_post}" \
            --launch-skip ${NCU_SKIP:-300} --launch-count ${NCU_COUNT:-14} --set full \
            --page details "$d/bench_gpu" --pp 16 --tg 6 --reps 1 > "$out/ncudec.txt" 2> "$out/ncudec.err"
        echo "ncudec: exit $?, $(wc -l < "$out/ncudec.txt") lines"; tail -3 "$out/ncudec.err" ;;
    gpushell)
        for t in t0610-gpu-stories t0612-gpu-perplexity t0900-gpu-spec; do
            STRATA_BIN=$(cd "$d" && pwd)/bin STRATA_ROOT=$(pwd) \
                STRATA_FIXTURES=$(cd "$d" && pwd)/fixtures timeout 300 \
                bash "tests/gpu/$t.sh" > "$out/$t.log" 2>&1
            echo "$t: exit $?, $(grep -c '^ok' "$out/$t.log") ok, $(grep -c '^not ok' "$out/$t.log") not ok"
            grep '^not ok' "$out/$t.log" | head -10
        done ;;
    specgpu)
        STRATA_FIXTURES=$(cd "$d" && pwd)/fixtures timeout 400 scripts/bench-spec.sh \
            -b "$d/bin" -x "$d/bench_spec" -B cuda -r ${SPEC_REPS:-5} -F 512 \
            -a --no-selftest ${SPEC_ARGS:-} 2>&1 | tee -a "$out/specgpu.log" ;;
    e2e)
        g=${TMPDIR:-/tmp}/strata-q3-12.gguf
        [ -s "$g" ] || "$d/bin/strata-prepare" --synth qwen3-30b-a3b:12:Q4_K_M "$g" >/dev/null ||
            { echo "e2e: strata-prepare --synth failed"; continue; }
        IFS=';' read -r -a modes <<<"${E2E_MODES:---temp 0;--temp 0 --logprobs;--temp 1 --seed 1}"
        for r in 1 2 3; do
            for b in ${E2E_BINS:-strata-generate}; do
                for a in "${modes[@]}"; do
                    # shellcheck disable=SC2086
                    t=$(timeout 120 "$d/bin/$b" -m "$g" -p hello -n 256 --ignore-eos \
                        --backend cuda --json --no-selftest $a ${E2E_ARGS:-} 2>/dev/null |
                        tail -1 | grep -o '"decode_tps":[0-9.]*')
                    echo "e2e $b [$a] #$r: ${t:-failed}"
                done
            done
        done | tee "$out/e2e.log" ;;
    pcie)
        timeout 120 "$d/bench_pcie" 2>&1 | tee "$out/pcie.log" ;;
    spectrace)
        # the draft model's back-off at T=2 and T=8, alternating: what its windows,
        # catch-ups and plain steps cost (STRATA_SPEC_TRACE=1), and tokens/s
        f=$(cd "$d" && pwd)/fixtures/models
        for r in 1 2 3 4 5 6; do for t in 0 2 8; do
            STRATA_SPEC_TRACE=1 "$d/bin/strata-generate" -m "$f/tinycoder-moe-Q4_K_M.gguf" \
                --draft "$f/tinydraft-qwen3-F16.gguf" -p import -n 512 --temp 1 --seed 1 \
                --ignore-eos --backend cuda --json --spec $t > "$out/st.out" 2> "$out/st.err"
            tps=$(tail -1 "$out/st.out" | sed -n 's/.*"decode_tps":\([0-9.]*\).*/\1/p')
            awk -v t=$t -v tps="$tps" '$1 == "spec-trace" {
                    if ($3 > 0) { nw++; wms += $7; a += $5 } else { np++; pms += $7 }
                    cu += $9 }
                END { printf "T %d tok/s %s plain %d steps %.4f ms mean, windows %d (%.3f ms, %d accepted), catch-up %.3f ms\n",
                      t, tps, np, np ? pms / np : 0, nw, wms, a, cu }' "$out/st.err"
        done; done 2>&1 | tee "$out/spectrace.log" ;;
    specloop)
        # what speculation costs apart from its windows: rows run interleaved (each
        # round starting one row later), 512 tokens at temperature 1; per row the
        # median tokens/s and the median of each round's ratio to its --spec 0 run
        cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>&1 |
            sed 's/^/clocksource: /' | tee "$out/specloop.log"
        f=$(cd "$d" && pwd)/fixtures/models
        D=$f/tinydraft-qwen3-F16.gguf
        rows=("--spec 0" "--spec 0" "--spec 8 --draft $D" "P --spec 8 --draft $D"
              "P --spec 8" "--spec 2 --draft $D" "--spec 4 --draft $D")
        n=${#rows[@]}
        : > "$out/specloop.tsv"
        for r in $(seq ${SPEC_REPS:-15}); do for j in $(seq 0 $((n - 1))); do
            i=$(((j + r) % n)); a=${rows[i]}; pl=0
            [ "${a#P }" != "$a" ] && pl=1 a=${a#P }
            # shellcheck disable=SC2086
            tps=$(STRATA_SPEC_PLAIN=$pl timeout 60 "$d/bin/strata-generate" \
                -m "$f/tinycoder-moe-Q4_K_M.gguf" -p import -n 512 --temp 1 --seed 1 \
                --ignore-eos --backend cuda --json --no-selftest $a 2>/dev/null |
                tail -1 | sed -n 's/.*"decode_tps":\([0-9.]*\).*/\1/p')
            printf "%s\t%s\t%s\n" "$r" "$i" "${tps:-0}" >> "$out/specloop.tsv"
        done; done
        for i in $(seq 0 $((n - 1))); do
            I=$i L="${rows[i]//$D/D}" perl -ne '
                my ($r, $i, $t) = split /\t/; chomp $t;
                $b{$r} = $t if $i == 0; $v{$r} = $t if $i == $ENV{I};
                END { my @r = sort keys %v; my @t = sort { $a <=> $b } map { $v{$_} } @r;
                      my @x = sort { $a <=> $b } map { $b{$_} ? $v{$_} / $b{$_} : 0 } @r;
                      my $m = int($#t / 2);
                      printf "%-34s tok/s %8.1f  x T0 %.3f  (%d rounds)\n", $ENV{L}, $t[$m],
                          $x[$m], scalar @t }' "$out/specloop.tsv"
        done | tee -a "$out/specloop.log" ;;
    xcpu)
        timeout 120 "$d/bench_expert_cpu" -t "$(nproc)" 2>&1 | tee "$out/xcpu.log" ;;
    diag)
        ( timeout ${TDIAG:-45} stdbuf -oL "$d/bench_offload" --file /tmp/strata-diag.gguf \
              --budget 25 --route model --pcie-frac 1 --pp 512 --tg 16 > "$out/diag.log" 2>&1 & 
          sleep 15
          for i in 1 2 3; do
              p=$(pgrep -x bench_offload | head -1)
              { date +%T; grep -E "^(Dirty|Writeback):" /proc/meminfo
                [ -n "$p" ] && for t in /proc/$p/task/*; do
                    echo "$t $(cat $t/wchan 2>/dev/null) $(head -c 300 $t/stack 2>/dev/null | tr '\n' ' ')"
                done | sort -k2 | uniq -c -f1 | head -8; } >> "$out/diag.log"
              sleep 8
          done
          wait )
        rm -f /tmp/strata-diag.gguf; tail -40 "$out/diag.log" ;;
    offload)
        df -h /tmp /dev/shm 2>&1 | tee "$out/offload.log"
        timeout ${TOF:-500} stdbuf -oL "$d/bench_offload" --file ${OFFFILE:-/tmp/strata-syn.gguf} \
            --budget ${BUDGETS:-25,50} --route model --pcie-frac ${FRACS:-1,auto} \
            --pp ${PP:-2048} --tg 128 2>&1 | tee -a "$out/offload.log"
        echo "bench_offload: exit ${PIPESTATUS[0]}" | tee -a "$out/offload.log"
        rm -f ${OFFFILE:-/tmp/strata-syn.gguf} ;;
    esac
done
