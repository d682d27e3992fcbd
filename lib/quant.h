/* quant.h - GGUF block formats on the CPU: layouts, reference decoders,
 * activation quantisation and dot products.
 *
 * Block layouts are those of the GGUF tensor types (ggml/src/ggml-common.h,
 * enum ggml_type).  Every multi-byte field is little-endian; every struct below
 * is packed to the exact on-disk size (checked with _Static_assert in
 * quant.c), so a pointer into an mmap'ed tensor can be read through it.
 *
 * Dot products follow ggml's pairing of weight and activation types: the
 * 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4) dot against
 * Q8_0 activations, the 256-element K- and i-quants against Q8_K activations,
 * and F32/F16/BF16 weights against float32 activations.  Quantising the
 * activations the way ggml does keeps perplexity aligned with llama.cpp.
 *
 * SIMD: the fast paths (AVX2, AVX-512) are picked at run time from CPUID.
 * STRATA_SIMD=scalar|avx2|avx512 in the environment caps the level (it can
 * only lower it).  Every level gives the same result as the scalar reference
 * up to float32 rounding of the final sums.
 */
#ifndef STRATA_QUANT_H
#define STRATA_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "ggml_types.h"

#define STRATA_QK 32   /* elements of the 32-blocks (Q4_0 ... Q8_0, IQ4_NL, MXFP4) */
#define STRATA_QK_K 256 /* elements of the K- and i-quant super-blocks */

/* IEEE binary16 and bfloat16 stored as raw bits. */
typedef uint16_t strata_f16;
typedef uint16_t strata_bf16;

/* ---- 32-element blocks ------------------------------------------------ */
struct strata_block_q4_0 { strata_f16 d; uint8_t qs[16]; };             /* 18 B */
struct strata_block_q4_1 { strata_f16 d, m; uint8_t qs[16]; };          /* 20 B */
struct strata_block_q5_0 { strata_f16 d; uint8_t qh[4]; uint8_t qs[16]; };       /* 22 B */
struct strata_block_q5_1 { strata_f16 d, m; uint8_t qh[4]; uint8_t qs[16]; };    /* 24 B */
struct strata_block_q8_0 { strata_f16 d; int8_t qs[32]; };              /* 34 B */
struct strata_block_iq4_nl { strata_f16 d; uint8_t qs[16]; };           /* 18 B */
struct strata_block_mxfp4 { uint8_t e; uint8_t qs[16]; };               /* 17 B */

/* ---- 256-element super-blocks ----------------------------------------- */
struct strata_block_q2_K {                   /* 84 B */
    uint8_t scales[16];                      /* 4-bit scale | 4-bit min << 4 */
    uint8_t qs[64];                          /* 2-bit quants */
    strata_f16 d, dmin;
};
struct strata_block_q3_K {                   /* 110 B */
    uint8_t hmask[32];                       /* high bit of the 3-bit quants */
    uint8_t qs[64];                          /* low 2 bits */
    uint8_t scales[12];                      /* 16 x 6-bit scales */
    strata_f16 d;
};
struct strata_block_q4_K {                   /* 144 B */
    strata_f16 d, dmin;
    uint8_t scales[12];                      /* 8 x (6-bit scale, 6-bit min) */
    uint8_t qs[128];
};
struct strata_block_q5_K {                   /* 176 B */
    strata_f16 d, dmin;
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
};
struct strata_block_q6_K {                   /* 210 B */
    uint8_t ql[128];                         /* low 4 bits */
    uint8_t qh[64];                          /* high 2 bits */
    int8_t scales[16];
    strata_f16 d;
};
struct strata_block_q8_K {                   /* 292 B: activations only */
    float d;
    int8_t qs[256];
    int16_t bsums[16];                       /* sums of each 16 qs */
};
struct strata_block_iq2_xxs { strata_f16 d; uint16_t qs[32]; };                 /* 66 B */
struct strata_block_iq2_xs { strata_f16 d; uint16_t qs[32]; uint8_t scales[8]; }; /* 74 B */
struct strata_block_iq2_s {                  /* 82 B */
    strata_f16 d;
    uint8_t qs[64];                          /* 32 grid indices, then 32 sign bytes */
    uint8_t qh[8];
    uint8_t scales[8];
};
struct strata_block_iq3_xxs { strata_f16 d; uint8_t qs[96]; };                  /* 98 B */
struct strata_block_iq3_s {                  /* 110 B */
    strata_f16 d;
    uint8_t qs[64];
    uint8_t qh[8];
    uint8_t signs[32];
    uint8_t scales[4];
};
struct strata_block_iq1_s { strata_f16 d; uint8_t qs[32]; uint16_t qh[8]; };    /* 50 B */
struct strata_block_iq1_m {                  /* 56 B: the f16 scale is spread over scales */
    uint8_t qs[32];
    uint8_t qh[16];
    uint8_t scales[8];
};
struct strata_block_iq4_xs {                 /* 136 B */
    strata_f16 d;
    uint16_t scales_h;
    uint8_t scales_l[4];
    uint8_t qs[128];
};

/* ---- scalar conversions ----------------------------------------------- */
/* binary16 <-> float32; exact for every f16 (subnormals, inf, nan); the
 * narrowing one rounds to nearest even. */
float strata_f16_to_f32(strata_f16 h);
strata_f16 strata_f32_to_f16(float f);
/* bfloat16 -> float32 (exact) and float32 -> bfloat16 (round to nearest even). */
float strata_bf16_to_f32(strata_bf16 h);
strata_bf16 strata_f32_to_bf16(float f);

/* ---- SIMD levels -------------------------------------------------------- */
enum strata_simd {
    STRATA_SIMD_SCALAR = 0,
    STRATA_SIMD_AVX2 = 1,   /* AVX2 + FMA + F16C */
    STRATA_SIMD_AVX512 = 2, /* AVX-512 F/BW/VL/DQ + VNNI (else the AVX2 level) */
    STRATA_SIMD_COUNT
};
/* Highest level this CPU supports (CPUID), ignoring the environment. */
int strata_quant_simd_detect(void);
/* Level the library uses: detect() capped by $STRATA_SIMD (scalar|avx2|avx512;
 * an unknown value is ignored).  Read once and cached. */
int strata_quant_simd_level(void);
/* "scalar", "avx2", "avx512"; "?" for an unknown level. */
const char *strata_quant_simd_name(int level);

/* ---- decoders ------------------------------------------------------------ */
/* 1 if the type has a reference decoder and a dot product: F32, F16, BF16,
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS,
 * IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, MXFP4; else 0 (Q8_1 and Q8_K are
 * activation formats, the integer and F64 types are not weights).
 * Every function here is reentrant: no state but the cached SIMD level. */
int strata_quant_supported(uint32_t type);

/* Scalar reference decoder: n elements (n % blck_size == 0) of type from src
 * (n / blck_size blocks) to float32 dst.  Written for clarity; the ground
 * truth of the other paths.  Returns STRATA_E_UNSUPPORTED for a type without
 * a decoder, STRATA_E_INVALID for n < 0 or not a multiple of the block size. */
int strata_quant_dequant_ref(uint32_t type, const void *src, float *dst, int64_t n,
                             struct strata_err *err);

/* Decoder for a row without argument checks (same values as the reference,
 * bit for bit; today it is the reference).  The caller guarantees a
 * supported type and n % blck_size == 0. */
void strata_quant_dequant_row(uint32_t type, const void *src, float *dst, int64_t n);

/* ---- activations and dot products ---------------------------------------- */
/* The activation type a weight type dots against: STRATA_TYPE_Q8_0,
 * STRATA_TYPE_Q8_K or STRATA_TYPE_F32; 0xffffffff for an unsupported type. */
uint32_t strata_quant_vec_dot_type(uint32_t type);

/* Bytes of n activations stored as vec_type (Q8_0: n/32 blocks, Q8_K: n/256
 * blocks, F32: 4n). */
size_t strata_quant_act_size(uint32_t vec_type, int64_t n);

/* Quantise n float32 activations (n a multiple of the block size of vec_type)
 * into dst (strata_quant_act_size bytes) as ggml's x86 quantize_row_q8_0 /
 * quantize_row_q8_K do (Q8_0: d = amax/127, q = nearest-even(x * 127/amax);
 * Q8_K: d = max/-127 signed, q = nearest-even(x/d), bsums); F32 copies.
 * The result is the same at every SIMD level. */
void strata_quant_quantize_act(uint32_t vec_type, const float *x, void *dst, int64_t n);

/* Dot products of one weight row (n elements of `type`) with n_act activation
 * rows (act + i * act_stride bytes, each already in vec_dot_type form):
 * out[i] = w . act_i, i < n_act.  Each out[i] is bitwise the same whatever
 * n_act is.  n % 256 == 0 for K/i-quants, n % 32 == 0 for 32-blocks. */
typedef void (*strata_vec_dot_fn)(int64_t n, const void *w, const void *act,
                                  size_t act_stride, int n_act, float *out);

/* The dot kernel for type at a SIMD level (a level above what the type has
 * falls back to the best lower one).  NULL for an unsupported type. */
strata_vec_dot_fn strata_quant_vec_dot_fn(uint32_t type, int level);

/* One dot at strata_quant_simd_level(): weight row w (n elements of type)
 * against act (in vec_dot_type form). */
float strata_quant_vec_dot(uint32_t type, int64_t n, const void *w, const void *act);

#endif
