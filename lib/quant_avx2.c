/* quant_avx2.c - AVX2 + FMA + F16C dot kernels (compiled with those flags,
 * see mk/quant.mk; called only when CPUID reports them). */
#include "quant_impl.h"

const strata_vec_dot_fn strata_quant_dot_avx2[STRATA_TYPE_COUNT] = {0};
