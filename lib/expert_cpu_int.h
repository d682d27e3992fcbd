/* expert_cpu_int.h - between expert_cpu.c and its SIMD rows (not a public API). */
#ifndef STRATA_EXPERT_CPU_INT_H
#define STRATA_EXPERT_CPU_INT_H

#include <stdint.h>

/* One row of ne0 weights of a Q4_K, Q5_K, Q6_K or Q8_0 type times one q8 row: xq [ne0]
 * quants, xd [ne0 / 32] block scales, bsum the quants' sums per 32 values (per 16
 * for Q6_K).  AVX2 builds only: strata_xcpu_have_avx2() says whether this one is. */
float strata_xcpu_dot_q8_avx2(uint32_t type, const uint8_t *row, int64_t ne0, const int8_t *xq,
                              const float *xd, const int32_t *bsum);
int strata_xcpu_have_avx2(void);

#endif
