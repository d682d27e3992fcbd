# Strata - one Makefile.
#
#   make            release build: build/rel/libstrata.a and bin/strata-*
#   make check      deps, ASan+UBSan build, every test that needs no GPU,
#                   and a compile of the CUDA and HIP kernels
#   make demo       runs strata on the model shipped in tests/data/
#   make fuzz       libFuzzer targets for a bounded time
#   make bench      CPU benchmarks
#   make cuda/hip   GPU builds
#
# Modules add their own rules in mk/*.mk.

CC       ?= cc
# Parallel by default: CI and the README's commands run plain `make check`.
NPROC    := $(shell nproc 2>/dev/null || echo 2)
MAKEFLAGS += -j$(NPROC)

# B: build directory (separate ones let builds run side by side); BINDIR: release programs
B        ?= build
BINDIR   ?= bin
PROVE    ?= prove
FIXTURES ?= $(abspath ../shared/fixtures)
export STRATA_FIXTURES ?= $(FIXTURES)

WARN     := -Wall -Wextra -Werror
CSTD     := -std=c11 -D_GNU_SOURCE
INCS     := -Ilib -I$(B)/gen
LIBS     := -lstb -lcjson -lpcre2-8 -lutf8proc -lcurl -lmicrohttpd -lcrypto -lz -lpthread -lm -ldl

REL_CFLAGS  := $(CSTD) $(WARN) -O2 -g $(INCS)
ASAN_CFLAGS := $(CSTD) $(WARN) -O1 -g -fno-omit-frame-pointer \
               -fsanitize=address,undefined -fno-sanitize-recover=all $(INCS)

LIB_SRCS  := $(sort $(wildcard lib/*.c))
CMD_SRCS  := $(sort $(wildcard cmd/strata-*.c))
UNIT_SRCS := $(sort $(wildcard tests/unit/test_*.c))
PROGS     := $(patsubst cmd/%.c,%,$(CMD_SRCS))
GEN_HDRS  :=

REL_OBJS  := $(patsubst lib/%.c,$(B)/rel/lib/%.o,$(LIB_SRCS))
ASAN_OBJS := $(patsubst lib/%.c,$(B)/asan/lib/%.o,$(LIB_SRCS))

.PHONY: all check demo fuzz bench cuda hip clean deps test-unit test-shell check-kernels
all: deps-quiet $(B)/rel/libstrata.a $(addprefix $(BINDIR)/,$(PROGS))

-include mk/*.mk

deps:
	@scripts/deps.sh

deps-quiet:
	@scripts/deps.sh --quiet

$(B)/rel/lib/%.o: lib/%.c $(GEN_HDRS) | $(B)/rel/lib
	$(CC) $(REL_CFLAGS) $(CFLAGS_$(notdir $*)) -MMD -MP -c $< -o $@
$(B)/asan/lib/%.o: lib/%.c $(GEN_HDRS) | $(B)/asan/lib
	$(CC) $(ASAN_CFLAGS) $(CFLAGS_$(notdir $*)) -MMD -MP -c $< -o $@

$(B)/rel/libstrata.a: $(REL_OBJS)
	rm -f $@ && ar rcs $@ $^
$(B)/asan/libstrata.a: $(ASAN_OBJS)
	rm -f $@ && ar rcs $@ $^

$(BINDIR)/%: cmd/%.c $(B)/rel/libstrata.a | $(BINDIR)
	$(CC) $(REL_CFLAGS) $< -o $@ $(B)/rel/libstrata.a $(LIBS)
$(B)/asan/bin/%: cmd/%.c $(B)/asan/libstrata.a | $(B)/asan/bin
	$(CC) $(ASAN_CFLAGS) $< -o $@ $(B)/asan/libstrata.a $(LIBS)
$(B)/asan/tests/%: tests/unit/%.c tests/tap.h $(B)/asan/libstrata.a | $(B)/asan/tests
	$(CC) $(ASAN_CFLAGS) -Itests $< -o $@ $(B)/asan/libstrata.a $(LIBS)

$(B)/rel/lib $(B)/asan/lib $(B)/asan/bin $(B)/asan/tests $(B)/gen $(BINDIR):
	mkdir -p $@

UNIT_BINS := $(patsubst tests/unit/%.c,$(B)/asan/tests/%,$(UNIT_SRCS))
ASAN_PROGS := $(addprefix $(B)/asan/bin/,$(PROGS))

# Every test: unit tests (TAP executables) and shell tests (tests/t*.sh),
# run by prove against the sanitized build.
export ASAN_OPTIONS := detect_leaks=1:abort_on_error=0:allocator_may_return_null=1
export UBSAN_OPTIONS := print_stacktrace=1
check: deps $(B)/asan/libstrata.a $(UNIT_BINS) $(ASAN_PROGS) check-kernels
	STRATA_BIN=$(abspath $(B)/asan/bin) STRATA_ROOT=$(CURDIR) \
	    $(PROVE) -j2 $(UNIT_BINS) $(sort $(wildcard tests/t[0-9]*.sh))

check-kernels::

clean:
	rm -rf build bin

-include $(REL_OBJS:.o=.d) $(ASAN_OBJS:.o=.d)
