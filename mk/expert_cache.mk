# mk/expert_cache.mk - the expert cache's replay benchmark (docs/performance.md,
# "Expert cache (simulated)").  Record a routing trace once on the CPU engine:
#   $(B)/bench/bench_ec_replay --record /tmp/ec-trace.txt --tokens 384
# then `make bench-ec-replay EC_TRACE=/tmp/ec-trace.txt` replays it through the cache
# per policy, budget and pcie_frac.  BENCH_EC_REPLAY_ARGS passes options.
EC_TRACE ?= /tmp/ec-trace.txt
.PHONY: bench-ec-replay
bench-ec-replay: $(B)/bench/bench_ec_replay
	$(B)/bench/bench_ec_replay $(BENCH_EC_REPLAY_ARGS) $(EC_TRACE)
$(B)/bench/bench_ec_replay: tests/bench/bench_ec_replay.c $(B)/rel/libstrata.a
	@mkdir -p $(B)/bench
	$(CC) $(REL_CFLAGS) $< -o $@ $(B)/rel/libstrata.a $(LIBS)
