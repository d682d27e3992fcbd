/* quant_avx512.c - AVX-512 (F/BW/VL/DQ/VNNI) dot kernels (compiled with those
 * flags, see mk/quant.mk; called only when CPUID reports them). */
#include "quant_impl.h"

const strata_vec_dot_fn strata_quant_dot_avx512[STRATA_TYPE_COUNT] = {0};
