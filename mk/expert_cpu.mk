# expert_cpu.mk - the ISA flags of the CPU experts' SIMD rows (lib/expert_cpu_avx2.c,
# lib/expert_cpu_avx512.c), and their benchmark.
CFLAGS_expert_cpu_avx2   := -mavx2 -mfma -mf16c
CFLAGS_expert_cpu_avx512 := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq \
                            -mavx512vnni
# every SIMD level must give the scalar rows' bits: no fused operations but the
# written ones
CFLAGS_expert_cpu        := -ffp-contract=off
CFLAGS_expert_cpu_avx2   += -ffp-contract=off
CFLAGS_expert_cpu_avx512 += -ffp-contract=off

# make bench-expert-cpu: GB/s of expert weights of the 8-bit rows per type and SIMD
# level on one thread, and of whole decode-token experts on the pool (docs/performance.md,
# "Expert cache (GPU)").  BENCH_EXPERT_CPU_ARGS passes options (-t THREADS -r REPS).
.PHONY: bench-expert-cpu
bench: bench-expert-cpu
bench-expert-cpu: $(B)/bench/bench_expert_cpu
	$(B)/bench/bench_expert_cpu $(BENCH_EXPERT_CPU_ARGS)
$(B)/bench/bench_expert_cpu: tests/bench/bench_expert_cpu.c tests/unit/quant_testutil.h \
                             $(B)/rel/libstrata.a
	@mkdir -p $(B)/bench
	$(CC) $(REL_CFLAGS) -Itests $< -o $@ $(B)/rel/libstrata.a $(LIBS)
