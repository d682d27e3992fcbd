# mk/spec.mk - `make bench-spec` (part of `make bench`): speculative decoding on
# a code-editing prompt, --spec 0, 2, 4, 8 with n-gram and draft-model drafts,
# and on a prompt with little repetition (the back-off).
bench: bench-spec
bench-spec: deps-quiet $(BINDIR)/strata-generate
	@scripts/bench-spec.sh $(BINDIR)/strata-generate \
	    $(STRATA_FIXTURES)/models/tinycoder-moe-Q4_K_M.gguf \
	    $(STRATA_FIXTURES)/models/tinydraft-qwen3-F16.gguf $(BENCH_THREADS)
.PHONY: bench-spec
