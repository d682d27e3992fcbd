/* quant_avx2.c - AVX2 + FMA + F16C dot kernels (compiled with those flags,
 * see mk/quant.mk; called only when CPUID reports them). */
#define SIMD_VNNI 0
#define SIMD_PREFIX avx2_
#include "quant_simd.inc"

const strata_vec_dot_fn strata_quant_dot_avx2[STRATA_TYPE_COUNT] = {SIMD_TABLE_ENTRIES};
