# mk/spec.mk - `make bench-spec` (part of `make bench`): speculative decoding,
# --spec 0, 2, 4, 8 as one table (scripts/bench-spec.sh): tinycoder on a
# code-editing prompt and on a prompt with little repetition (the back-off),
# n-gram and draft-model drafts; the synthetic model (BENCH_SPEC_SYNTH, lib/synth.h)
# with drafts of known quality through bench_spec.  BENCH_SPEC_ARGS adds options
# (e.g. -B cuda -t 16, or -S to skip the synthetic model).
BENCH_SPEC_SYNTH ?= qwen3-30b-a3b:12:Q4_K_M
BENCH_SPEC_ARGS  ?=
bench: bench-spec
bench-spec: deps-quiet $(BINDIR)/strata-generate $(B)/bench/bench_spec
	@scripts/bench-spec.sh -b $(BINDIR) -t $(BENCH_THREADS) \
	    -m $(STRATA_FIXTURES)/models/tinycoder-moe-Q4_K_M.gguf \
	    -d $(STRATA_FIXTURES)/models/tinydraft-qwen3-F16.gguf -s $(BENCH_SPEC_SYNTH) \
	    -x $(B)/bench/bench_spec $(BENCH_SPEC_ARGS)
.PHONY: bench-spec

$(B)/bench/bench_spec: tests/bench/bench_spec.c $(B)/rel/libstrata.a
	@mkdir -p $(@D)
	$(CC) $(REL_CFLAGS) $< -o $@ $(B)/rel/libstrata.a $(LIBS)

# the GPU build's copy (make gpu-tests; scripts/gpu-devrun.sh packs it with the tests)
gpu-tests: $(B)/gpu-tests/bench_spec
$(B)/gpu-tests/bench_spec: tests/bench/bench_spec.c $(B)/cuda/libstrata.a
	@mkdir -p $(@D)
	$(CC) $(REL_CFLAGS) -DSTRATA_WITH_GPU $< -o $@ $(B)/cuda/libstrata.a \
	    -L$(CUDA_LIBDIR) -lcudart_static -ldl $(GPU_LIBS)
