# mk/pack.mk - packs: the test helper (split sets, synthetic GGUF, loopback
# HTTP server with fault injection) used by tests/t05xx-prepare-*.sh.
PACKTOOL := $(B)/asan/helpers/packtool
PACKTOOL_REL := $(B)/rel/helpers/packtool

$(B)/asan/helpers $(B)/rel/helpers:
	mkdir -p $@
$(PACKTOOL): tests/helpers/packtool.c $(B)/asan/libstrata.a | $(B)/asan/helpers
	$(CC) $(ASAN_CFLAGS) $< -o $@ $(B)/asan/libstrata.a $(LIBS)
$(PACKTOOL_REL): tests/helpers/packtool.c $(B)/rel/libstrata.a | $(B)/rel/helpers
	$(CC) $(REL_CFLAGS) $< -o $@ $(B)/rel/libstrata.a $(LIBS)

check: $(PACKTOOL)

# make bench-pack: strata-prepare --repack of a synthetic 1 GiB GGUF against
# the disk's sequential read speed (docs/performance.md, Packs).
.PHONY: bench-pack
bench-pack: $(PACKTOOL_REL) $(BINDIR)/strata-prepare
	scripts/bench-pack.sh $(PACKTOOL_REL) $(BINDIR)/strata-prepare
