# mk/bench.mk - `make bench`: CPU engine throughput, llama-bench style
# (prompt 256 / generate 64, 2 threads), next to the floor: the time to read
# the active weights once at the measured memory bandwidth.
BENCH_THREADS ?= 2
BENCH_MODELS  ?= tinycoder-moe-Q4_K_M tinycoder-moe-F16 tinycoder-moe-IQ2_XS stories260K

bench: bench-engine
bench-engine: deps-quiet $(BINDIR)/strata-generate
	@for m in $(BENCH_MODELS); do \
	    $(BINDIR)/strata-generate -m $(STRATA_FIXTURES)/models/$$m.gguf \
	        --bench 256,64 -t $(BENCH_THREADS) || exit 1; \
	done
.PHONY: bench-engine
