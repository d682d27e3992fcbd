#!/bin/bash
# gpu-profile.sh - where the GPU's time goes, on a GPU machine:
#
#   scripts/gpu-profile.sh pack BUILD [DIR]   here: bench_gpu and bench_offload of BUILD (a
#                                             `make B=BUILD CUDA_ARCHS=90 gpu-tests`) into DIR
#                                             (default devrun-p)
#   scripts/gpu-profile.sh run [DIR] [WHAT]   there: WHAT is any of bench, ncu, offload,
#                                             check, ab, offmem (default bench ncu offload)
#
# bench: bench_gpu --tg 128 --reps 3 (decode and prefill, all in VRAM).  ncu: the time each
# kernel of a few decode steps runs once scheduled (Nsight Compute, graph nodes profiled
# one by one, clocks left alone), as CSV for scripts/ncu-summary.py.  offload:
# bench_offload with the synthetic model written to a file and mapped (host memory
# against the experts' bytes), 25% and 50% of the experts in VRAM, the model's routing.
# check: test_kernels and test_golden (with the fixtures packed into DIR/fixtures, if
# any).  ab: bench_gpu --ab over $AB.  offmem: bench_offload from memory.
# Logs go to $OUT (or /tmp/strata-prof).
set -u
case ${1:-} in
pack)
    set -e
    d=${3:-devrun-p}
    rm -rf "$d" && mkdir -p "$d/lib"
    for f in bench_gpu bench_offload test_kernels test_golden; do
        strip -o "$d/$f" "$2/gpu-tests/$f"
    done
    # fixtures named in $FIXTURES (paths under the fixtures folder)
    fx=${STRATA_FIXTURES:-$(pwd)/../shared/fixtures}
    for f in ${FIXTURES:-}; do
        mkdir -p "$d/fixtures/$(dirname "$f")" && cp -r "$fx/$f" "$d/fixtures/$f"
    done
    # their libraries that a bare machine may lack
    for f in "$d"/bench_* "$d"/test_*; do ldd "$f" 2>/dev/null; done | awk '$3 ~ /^\// {print $3}' |
        sort -u | grep -v -E 'lib(c|m|dl|rt|pthread|stdc\+\+|gcc_s)\.so' |
        while read -r l; do cp -L "$l" "$d/lib/"; done
    # the programs and their libraries travel compressed (the transfer is limited)
    tar -C "$d" -cJf "$d/bin.tar.xz" $(cd "$d" && ls -d bench_* test_* lib)
    (cd "$d" && rm -rf bench_* test_* lib)
    du -sh "$d"
    exit 0 ;;
run) ;;
*) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
d=${2:-devrun-p}
what=${3:-bench ncu offload}
out=${OUT:-/tmp/strata-prof}
[ -f "$d/bin.tar.xz" ] && tar -C "$d" -xJf "$d/bin.tar.xz"
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
        timeout 400 ncu --graph-profiling node --clock-control none \
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
        timeout 200 "$d/bench_gpu" --tg 128 --reps 3 --ab "${AB:-STRATA_NO_FASTQ}" 2>&1 | tee "$out/bench_ab.log" ;;
    offmem)
        timeout 300 stdbuf -oL "$d/bench_offload" --budget ${BUDGETS:-25,50} --route model \
            --pcie-frac ${FRACS:-1,auto} --pp ${PP:-2048} --tg 128 2>&1 | tee "$out/offmem.log" ;;
    offload)
        df -h /tmp /dev/shm 2>&1 | tee "$out/offload.log"
        timeout ${TOF:-500} stdbuf -oL "$d/bench_offload" --file /tmp/strata-syn.gguf \
            --budget ${BUDGETS:-25,50} --route model --pcie-frac ${FRACS:-1,auto} \
            --pp ${PP:-2048} --tg 128 2>&1 | tee -a "$out/offload.log"
        echo "bench_offload: exit ${PIPESTATUS[0]}" | tee -a "$out/offload.log"
        rm -f /tmp/strata-syn.gguf ;;
    esac
done
