# make demo: run Strata on the model shipped in tests/data/ (see its NOTICE).
DEMO_MODEL := tests/data/stories260K.gguf

demo: deps-quiet $(BINDIR)/strata-prepare
	$(BINDIR)/strata-prepare --inspect $(DEMO_MODEL)
