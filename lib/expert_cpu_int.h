/* expert_cpu_int.h - between expert_cpu.c and its SIMD rows (not a public API).
 *
 * Every level gives the bits of the scalar rows of expert_cpu.c: the integer dot
 * products are exact, and the float combination follows one fixed order - eight
 * float lanes per row (lane j: the 4-value partial sums j of a Q8_0 block, or scale
 * group j of a K-quant super-block), each updated by one fused multiply-add per block
 * in block order, then summed as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)),
 * the order of the AVX2 rows. */
#ifndef STRATA_EXPERT_CPU_INT_H
#define STRATA_EXPERT_CPU_INT_H

#include <stddef.h>
#include <stdint.h>

/* One row of ne0 weights of a Q4_K, Q5_K, Q6_K or Q8_0 type times one q8 row: xq [ne0]
 * quants, xd [ne0 / 32] block scales, bsum the quants' sums per 32 values (per 16
 * for Q6_K).  AVX2 builds only: strata_xcpu_have_avx2() says whether this one is. */
float strata_xcpu_dot_q8_avx2(uint32_t type, const uint8_t *row, int64_t ne0, const int8_t *xq,
                              const float *xd, const int32_t *bsum);
/* strata_xcpu_quantize_q8 with the same bits, and the sums of the quants per g values
 * (g = 16 or 32) into bsum [n / g]. */
void strata_xcpu_quantize_q8_avx2(const float *x, int64_t n, int8_t *q, float *d,
                                  int32_t *bsum, int g);
int strata_xcpu_have_avx2(void);

/* y[r] = row r (at w + r * nb1) times the q8 row, r < n_rows, as
 * strata_xcpu_dot_q8_avx2 gives it bit for bit; rows two at a time.  AVX-512
 * (F/BW/VL/DQ + VNNI) builds only: strata_xcpu_have_avx512(). */
void strata_xcpu_rows_q8_avx512(uint32_t type, const uint8_t *w, size_t nb1, int64_t n_rows,
                                int64_t ne0, const int8_t *xq, const float *xd,
                                const int32_t *bsum, float *y);
/* strata_xcpu_quantize_q8_avx2 in 512-bit registers */
void strata_xcpu_quantize_q8_avx512(const float *x, int64_t n, int8_t *q, float *d,
                                    int32_t *bsum, int g);
int strata_xcpu_have_avx512(void);

#endif
