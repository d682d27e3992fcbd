/* quant_avx512.c - AVX-512 (F/BW/VL/DQ/VNNI) dot kernels (compiled with those
 * flags, see mk/quant.mk; called only when CPUID reports them).  The integer
 * kernels are the shared 256-bit ones with VNNI's fused multiply-adds. */
#define SIMD_VNNI 1
#define SIMD_PREFIX avx512_
#include "quant_simd.inc"

const strata_vec_dot_fn strata_quant_dot_avx512[STRATA_TYPE_COUNT] = {SIMD_TABLE_ENTRIES};
