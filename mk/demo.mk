# make demo: run Strata on the model shipped in tests/data/ (see its NOTICE):
# the tinycoder Qwen3-MoE model writes Python from a prompt, greedily.
DEMO_MODEL  := tests/data/tinycoder-moe-Q4_K_M.gguf
DEMO_PROMPT := class Config:\n    def __init__(self

demo: all
	@$(BINDIR)/strata-generate -m $(DEMO_MODEL) -p "$$(printf '$(DEMO_PROMPT)')" \
	    -n 64 --temp 0 --echo
	@echo
