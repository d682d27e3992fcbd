# vocab.mk - the tokenizer benchmark.
# make bench-tok: tokenize >= 1 MiB of Python source with the qwen2 vocabulary
# on one thread (docs/performance.md).  BENCH_TOK_ARGS: [VOCAB.gguf [TEXT [MIB]]].
.PHONY: bench-tok
bench: bench-tok
bench-tok: $(B)/bench/bench_tok
	$(B)/bench/bench_tok $(BENCH_TOK_ARGS)
$(B)/bench/bench_tok: tests/bench/bench_tok.c $(B)/rel/libstrata.a
	@mkdir -p $(B)/bench
	$(CC) $(REL_CFLAGS) $< -o $@ $(B)/rel/libstrata.a $(LIBS)
