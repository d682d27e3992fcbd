# quant.mk - per-file ISA flags of the SIMD kernels, and the quant benchmark.
CFLAGS_quant_avx2   := -mavx2 -mfma -mf16c
CFLAGS_quant_avx512 := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq \
                       -mavx512vnni
# the kernels' float results must not depend on how the compiler fuses operations
CFLAGS_quant_dot    := -ffp-contract=off
CFLAGS_quant_avx2   += -ffp-contract=off
CFLAGS_quant_avx512 += -ffp-contract=off
