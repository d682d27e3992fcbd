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

# make fuzz-jinja (part of make fuzz): the template interpreter under libFuzzer for
# FUZZ_SECONDS, seeded with the fixture templates.  A crash leaves its input in
# $(B)/fuzz/jinja-*.
$(B)/fuzz/fuzz_jinja: tests/fuzz/fuzz_jinja.c lib/jinja.c lib/err.c | fuzz-deps
	@mkdir -p $(B)/fuzz
	$(FUZZ_CC) $(CSTD) $(WARN) -g -O1 -fsanitize=fuzzer,address,undefined \
	    -fno-sanitize-recover=all -Ilib $(filter %.c,$^) -o $@ -lcjson -lutf8proc -lm
.PHONY: fuzz-jinja
fuzz: fuzz-jinja
fuzz-jinja: $(B)/fuzz/fuzz_jinja
	mkdir -p $(B)/fuzz/jinja-corpus
	$(B)/fuzz/fuzz_jinja -max_total_time=$(FUZZ_SECONDS) -max_len=16384 -timeout=10 \
	    -rss_limit_mb=2048 -dict=tests/fuzz/jinja.dict -artifact_prefix=$(B)/fuzz/jinja- \
	    $(B)/fuzz/jinja-corpus $(FIXTURES)/templates

# make fuzz-chat-parse (part of make fuzz): the reply parser of every tool-call format.
$(B)/fuzz/fuzz_chat_parse: tests/fuzz/fuzz_chat_parse.c lib/chat.c lib/jinja.c lib/err.c \
                           lib/gguf.c lib/ggml_types.c lib/log.c | fuzz-deps
	@mkdir -p $(B)/fuzz
	$(FUZZ_CC) $(CSTD) $(WARN) -g -O1 -fsanitize=fuzzer,address,undefined \
	    -fno-sanitize-recover=all -Ilib $(filter %.c,$^) -o $@ -lcjson -lutf8proc -lm
.PHONY: fuzz-chat-parse
fuzz: fuzz-chat-parse
fuzz-chat-parse: $(B)/fuzz/fuzz_chat_parse
	mkdir -p $(B)/fuzz/chat-parse-corpus
	$(B)/fuzz/fuzz_chat_parse -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -timeout=10 \
	    -dict=tests/fuzz/chat_parse.dict -artifact_prefix=$(B)/fuzz/chat-parse- \
	    $(B)/fuzz/chat-parse-corpus
