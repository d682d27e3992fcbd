# mk/engine.mk - the engine's release-build test program (perplexity runs
# against the optimised build inside `make check`: under ASan it would take
# minutes), exported to the shell tests as STRATA_REL_BIN.
ENGINE_REL_BIN := $(B)/rel/bin
export STRATA_REL_BIN := $(abspath $(ENGINE_REL_BIN))

$(ENGINE_REL_BIN):
	mkdir -p $@
$(ENGINE_REL_BIN)/strata-generate: cmd/strata-generate.c $(B)/rel/libstrata.a | $(ENGINE_REL_BIN)
	$(CC) $(REL_CFLAGS) $< -o $@ $(B)/rel/libstrata.a $(LIBS)

check: $(ENGINE_REL_BIN)/strata-generate
