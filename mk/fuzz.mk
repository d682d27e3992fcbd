# make fuzz: the GGUF reader under libFuzzer (clang), for FUZZ_SECONDS.
# Seeds: the crafted defect files and a valid file written by
# test_gguf_defects, the metadata of the stories260K fixture, and the saved
# regressions in tests/data/gguf-fuzz/.
# A crash leaves its input in $(B)/fuzz/; copy it to tests/data/gguf-fuzz/.
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_DIR     := $(B)/fuzz
FUZZ_SRCS    := lib/gguf.c lib/gguf_dump.c lib/err.c lib/ggml_types.c lib/log.c
FUZZ_REGRESS := $(wildcard tests/data/gguf-fuzz)

.PHONY: fuzz-deps
fuzz-deps:
	@scripts/deps.sh --fuzz

$(FUZZ_DIR)/fuzz_gguf: tests/fuzz/fuzz_gguf.c $(FUZZ_SRCS) | fuzz-deps $(FUZZ_DIR)
	$(FUZZ_CC) $(CSTD) $(WARN) -g -O1 -fsanitize=fuzzer,address,undefined \
	    -fno-sanitize-recover=all -Ilib $(filter %.c,$^) -o $@ -lcjson -lm

$(FUZZ_DIR):
	mkdir -p $@

fuzz: $(FUZZ_DIR)/fuzz_gguf $(B)/asan/tests/test_gguf_defects
	mkdir -p $(FUZZ_DIR)/corpus $(FUZZ_DIR)/seeds
	$(B)/asan/tests/test_gguf_defects $(FUZZ_DIR)/seeds >/dev/null
	head -c 16384 $(FIXTURES)/models/stories260K.gguf >$(FUZZ_DIR)/seeds/stories-head.gguf
	$(FUZZ_DIR)/fuzz_gguf -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -timeout=10 \
	    -rss_limit_mb=2048 -dict=tests/fuzz/gguf.dict -artifact_prefix=$(FUZZ_DIR)/ \
	    $(FUZZ_DIR)/corpus $(FUZZ_DIR)/seeds $(FUZZ_REGRESS)
