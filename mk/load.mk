# mk/load.mk - strata-load.  make bench-load: engine start with and without a
# resident image of a synthetic pack of several GB (BENCH_LOAD_LAYERS layers of
# the qwen3-30b-a3b shape), and the load throughput against the disk's
# sequential read speed (docs/performance.md, Resident images).  Not part of
# `make bench`: it writes ~5 GB to $TMPDIR.
BENCH_LOAD_LAYERS ?= 12

.PHONY: bench-load
bench-load: $(B)/bench/bench_load $(BINDIR)/strata-load
	scripts/bench-load.sh $(B)/bench/bench_load $(BINDIR)/strata-load $(BENCH_LOAD_LAYERS)
$(B)/bench/bench_load: tests/bench/bench_load.c $(B)/rel/libstrata.a
	@mkdir -p $(B)/bench
	$(CC) $(REL_CFLAGS) $< -o $@ $(B)/rel/libstrata.a $(LIBS)
