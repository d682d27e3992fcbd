# mk/gpu.mk - the GPU builds.
#
#   make cuda        bin/cuda/: every program with the CUDA backend (SASS for
#                    CUDA_ARCHS plus PTX of the newest, so later GPUs JIT it) and
#                    BUILD.json; nvcc from PATH or /usr/local/cuda/bin
#   make hip         bin/hip/: the same with hipcc for HIP_ARCH (comma-separated
#                    gfx targets; default: the set the installed ROCm supports)
#   make check-gpu   on a GPU machine: every kernel against the CPU reference, then
#                    the golden tests again with --backend cuda
#   make check       (check-kernels) compiles every kernel with nvcc for sm_90 and
#                    with hipcc for one gfx target, warnings as errors
#
# The CPU build never needs a GPU header: kernels/ and the backend are compiled
# only here, and the library objects of a GPU build (with -DSTRATA_WITH_GPU) live in
# their own directory.

NVCC        ?= $(or $(shell command -v nvcc 2>/dev/null),/usr/local/cuda/bin/nvcc)
HIPCC       ?= $(or $(shell command -v hipcc 2>/dev/null),/opt/rocm/bin/hipcc)
CUDA_ARCHS  ?= 80 86 89 90
HIP_VERSION := $(shell $(HIPCC) --version 2>/dev/null | sed -n 's/^HIP version: \([0-9]*\)\..*/\1/p')
# ROCm 6 and later build gfx11/gfx12; Debian's ROCm 5.x builds up to gfx1030/gfx90a.
HIP_ARCH    ?= $(if $(filter-out 0 1 2 3 4 5,$(HIP_VERSION)),gfx90a$(,)gfx942$(,)gfx1030$(,)gfx1100$(,)gfx1101$(,)gfx1102$(,)gfx1200$(,)gfx1201,gfx90a$(,)gfx1030)
, := ,

GPU_SRCS    := $(sort $(wildcard kernels/*.cu))
GPU_HDRS    := $(wildcard kernels/*.h kernels/*.cuh lib/*.h)
GPU_CXXFLAGS_COMMON := -O3 -std=c++17 -Ilib -Ikernels
NVCC_FLAGS  := $(GPU_CXXFLAGS_COMMON) -Xcompiler -Wall,-Wextra,-fPIC -Werror all-warnings
HIPCC_FLAGS := $(GPU_CXXFLAGS_COMMON) -x hip -Wall -Wextra -Werror -fPIC
# Test builds only: `make B=dir cuda STRATA_BREAK_KERNEL=rms_norm [STRATA_BREAK_MODE=wrong|
# fault|hang]` breaks that kernel's self-test case on purpose (kernels/selftest.cu).
ifneq ($(STRATA_BREAK_KERNEL),)
ST_BREAK    := -DSTRATA_BREAK_KERNEL='"$(STRATA_BREAK_KERNEL)"' \
               $(if $(STRATA_BREAK_MODE),-DSTRATA_BREAK_MODE='"$(STRATA_BREAK_MODE)"')
NVCC_FLAGS  += $(ST_BREAK)
HIPCC_FLAGS += $(ST_BREAK)
endif
# Measurement builds only: `make B=dir gpu-tests STRATA_TIMELINE=1` records when each
# kernel's wait for the one before ends (kernels/gpu.h); never for a release, and into a
# B of its own (the objects do not record the flag: a later plain build would reuse them).
ifneq ($(STRATA_TIMELINE),)
NVCC_FLAGS  += -DSTRATA_TIMELINE
endif
CUDA_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
                -gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS))
HIP_OFFLOAD := $(foreach a,$(subst $(,), ,$(HIP_ARCH)),--offload-arch=$(a))
# The targets compiled in, as the program reports them (strata-probe's "this build")
CUDA_ARCH_LIST := $(foreach a,$(CUDA_ARCHS),sm_$(a)) compute_$(lastword $(CUDA_ARCHS))
HIP_ARCH_LIST  := $(subst $(,), ,$(HIP_ARCH))

.PHONY: cuda hip check-gpu

# ---- make check: compile every kernel for one target of each vendor ----
KCHECK_CUDA := $(patsubst kernels/%.cu,$(B)/kcheck/cuda/%.o,$(GPU_SRCS))
KCHECK_HIP  := $(patsubst kernels/%.cu,$(B)/kcheck/hip/%.o,$(GPU_SRCS))

check-kernels:: $(B)/kcheck/deps.stamp $(KCHECK_CUDA) $(KCHECK_HIP)

# hipcc and the HIP headers are Debian packages (scripts/deps.sh --gpu).
$(B)/kcheck/deps.stamp:
	@mkdir -p $(@D)
	scripts/deps.sh --gpu --quiet
	@touch $@

$(B)/kcheck/cuda/%.o: kernels/%.cu $(GPU_HDRS) | $(B)/kcheck/deps.stamp
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) -gencode arch=compute_90,code=sm_90 -c $< -o $@

$(B)/kcheck/hip/%.o: kernels/%.cu $(GPU_HDRS) | $(B)/kcheck/deps.stamp
	@mkdir -p $(@D)
	$(HIPCC) $(HIPCC_FLAGS) --offload-arch=gfx1030 -c $< -o $@

# ---- make cuda / make hip ----
CUDA_BINDIR ?= $(BINDIR)/cuda
HIP_BINDIR  ?= $(BINDIR)/hip
GPU_LIBS    := $(LIBS) -lstdc++ -lrt

define gpu_build
# $(1) = cuda|hip, $(2) = compiler and flags, $(3) = bin dir, $(4) = runtime link flags
$(B)/$(1)/lib/%.o: lib/%.c $(GEN_HDRS)
	@mkdir -p $$(@D)
	$(CC) $(REL_CFLAGS) -DSTRATA_WITH_GPU $$(CFLAGS_$$(notdir $$*)) -MMD -MP -c $$< -o $$@
$(B)/$(1)/k/%.o: kernels/%.cu $(GPU_HDRS)
	@mkdir -p $$(@D)
	$(2) -c $$< -o $$@
$(B)/$(1)/libstrata.a: $(patsubst lib/%.c,$(B)/$(1)/lib/%.o,$(LIB_SRCS)) \
                       $(patsubst kernels/%.cu,$(B)/$(1)/k/%.o,$(GPU_SRCS))
	rm -f $$@ && ar rcs $$@ $$^
$(3)/%: cmd/%.c $(B)/$(1)/libstrata.a
	@mkdir -p $$(@D)
	$(CC) $(REL_CFLAGS) -DSTRATA_WITH_GPU $$< -o $$@ $(B)/$(1)/libstrata.a $(4) $(GPU_LIBS)
endef

CUDA_LIBDIR := $(patsubst %/bin/nvcc,%,$(NVCC))/lib64
HIP_LIBDIR  := $(or $(wildcard /opt/rocm/lib),/usr/lib/x86_64-linux-gnu)
$(eval $(call gpu_build,cuda,$(NVCC) $(NVCC_FLAGS) $(CUDA_GENCODE) \
    -DSTRATA_GPU_ARCHS='"$(CUDA_ARCH_LIST)"',$(CUDA_BINDIR),\
    -L$(CUDA_LIBDIR) -lcudart_static -ldl))
$(eval $(call gpu_build,hip,$(HIPCC) $(HIPCC_FLAGS) $(HIP_OFFLOAD) \
    -DSTRATA_GPU_ARCHS='"$(HIP_ARCH_LIST)"',$(HIP_BINDIR),\
    -L$(HIP_LIBDIR) -lamdhip64))

cuda: $(addprefix $(CUDA_BINDIR)/,$(PROGS))
	scripts/gpu-build-json.sh cuda "$(NVCC)" "$(CUDA_ARCHS)" "$(CUDA_LIBDIR)" > $(CUDA_BINDIR)/BUILD.json
	@echo "cuda build in $(CUDA_BINDIR)/ (BUILD.json)"

hip: $(addprefix $(HIP_BINDIR)/,$(PROGS))
	scripts/gpu-build-json.sh hip "$(HIPCC)" "$(HIP_ARCH)" "$(HIP_LIBDIR)" > $(HIP_BINDIR)/BUILD.json
	@echo "hip build in $(HIP_BINDIR)/ (BUILD.json)"

# ---- make check-gpu ----
GPU_TEST_SRCS := $(sort $(wildcard tests/gpu/test_*.cu))
GPU_TESTS     := $(patsubst tests/gpu/%.cu,$(B)/gpu-tests/%,$(GPU_TEST_SRCS))

# The kernel tests need only the CPU reference decoders of the library.
GPU_TEST_LIB := $(patsubst lib/%.c,$(B)/cuda/lib/%.o,$(filter lib/quant%.c lib/iq_tables.c \
                  lib/err.c lib/log.c lib/ggml_types.c,$(LIB_SRCS))) \
                $(patsubst kernels/%.cu,$(B)/cuda/k/%.o,$(filter-out kernels/backend%,$(GPU_SRCS)))
$(B)/gpu-tests/%: tests/gpu/%.cu $(wildcard tests/gpu/*.h) $(GPU_TEST_LIB)
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) $(CUDA_GENCODE) -Itests $< -o $@ $(GPU_TEST_LIB) -lpthread -lm

# C tests and benchmarks of the whole GPU build (engine + backend)
GPU_C_SRCS := $(sort $(wildcard tests/gpu/test_*.c tests/gpu/bench_*.c))
GPU_C_BINS := $(patsubst tests/gpu/%.c,$(B)/gpu-tests/%,$(GPU_C_SRCS))
$(B)/gpu-tests/%: tests/gpu/%.c tests/tap.h $(B)/cuda/libstrata.a
	@mkdir -p $(@D)
	$(CC) $(REL_CFLAGS) -DSTRATA_WITH_GPU -Itests $< -o $@ $(B)/cuda/libstrata.a \
	    -L$(CUDA_LIBDIR) -lcudart_static -ldl $(GPU_LIBS)

GPU_TESTS += $(filter $(B)/gpu-tests/test_%,$(GPU_C_BINS))
# CUDA benchmarks of the device itself (no library)
GPU_CU_BENCH := $(patsubst tests/gpu/%.cu,$(B)/gpu-tests/%,$(sort $(wildcard tests/gpu/bench_*.cu)))
$(B)/gpu-tests/bench_%: tests/gpu/bench_%.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) $(CUDA_GENCODE) $< -o $@
gpu-tests: $(GPU_TESTS) $(GPU_C_BINS) $(GPU_CU_BENCH)

check-gpu: gpu-tests cuda
	STRATA_BIN=$(abspath $(CUDA_BINDIR)) STRATA_ROOT=$(CURDIR) STRATA_BACKEND=cuda \
	    $(PROVE) -v $(GPU_TESTS) $(sort $(wildcard tests/gpu/t[0-9]*.sh))
