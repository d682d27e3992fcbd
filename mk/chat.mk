# chat.mk - the chat-template benchmark.
# make bench-chat: render the Qwen3-Coder template with 20 tools and 50 messages
# (docs/performance.md).  BENCH_CHAT_ARGS: [TEMPLATE.jinja [N_TOOLS [N_MESSAGES]]].
.PHONY: bench-chat
bench: bench-chat
bench-chat: $(B)/bench/bench_chat
	$(B)/bench/bench_chat $(BENCH_CHAT_ARGS)
$(B)/bench/bench_chat: tests/bench/bench_chat.c $(B)/rel/libstrata.a
	@mkdir -p $(B)/bench
	$(CC) $(REL_CFLAGS) $< -o $@ $(B)/rel/libstrata.a $(LIBS)
