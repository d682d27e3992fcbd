# quant.mk - per-file ISA flags of the SIMD kernels, and the quant benchmark.
CFLAGS_quant_avx2   := -mavx2 -mfma -mf16c
CFLAGS_quant_avx512 := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq \
                       -mavx512vnni
# the kernels' float results must not depend on how the compiler fuses operations
CFLAGS_quant_dot    := -ffp-contract=off
CFLAGS_quant_avx2   += -ffp-contract=off
CFLAGS_quant_avx512 += -ffp-contract=off

# make bench-quant: matvec GB/s of every block type next to streaming-read
# bandwidth (docs/quant-bench.md).  BENCH_QUANT_ARGS passes options.
.PHONY: bench-quant
bench: bench-quant
bench-quant: $(B)/bench/bench_quant
	$(B)/bench/bench_quant $(BENCH_QUANT_ARGS)
$(B)/bench/bench_quant: tests/bench/bench_quant.c tests/unit/quant_testutil.h $(B)/rel/libstrata.a
	@mkdir -p $(B)/bench
	$(CC) $(REL_CFLAGS) -Itests $< -o $@ $(B)/rel/libstrata.a $(LIBS)
