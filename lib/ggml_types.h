/* ggml_types.h - the GGUF tensor type ids and their block geometry.
 *
 * Type ids and block sizes are those of the GGUF specification
 * (ggml/docs/gguf.md, enum ggml_type).  A block holds blck_size elements in
 * type_size bytes; a row of n elements (n a multiple of blck_size) takes
 * n / blck_size * type_size bytes.
 */
#ifndef STRATA_GGML_TYPES_H
#define STRATA_GGML_TYPES_H

#include <stdint.h>

enum strata_ggml_type {
    STRATA_TYPE_F32 = 0,
    STRATA_TYPE_F16 = 1,
    STRATA_TYPE_Q4_0 = 2,
    STRATA_TYPE_Q4_1 = 3,
    STRATA_TYPE_Q5_0 = 6,
    STRATA_TYPE_Q5_1 = 7,
    STRATA_TYPE_Q8_0 = 8,
    STRATA_TYPE_Q8_1 = 9,
    STRATA_TYPE_Q2_K = 10,
    STRATA_TYPE_Q3_K = 11,
    STRATA_TYPE_Q4_K = 12,
    STRATA_TYPE_Q5_K = 13,
    STRATA_TYPE_Q6_K = 14,
    STRATA_TYPE_Q8_K = 15,
    STRATA_TYPE_IQ2_XXS = 16,
    STRATA_TYPE_IQ2_XS = 17,
    STRATA_TYPE_IQ3_XXS = 18,
    STRATA_TYPE_IQ1_S = 19,
    STRATA_TYPE_IQ4_NL = 20,
    STRATA_TYPE_IQ3_S = 21,
    STRATA_TYPE_IQ2_S = 22,
    STRATA_TYPE_IQ4_XS = 23,
    STRATA_TYPE_I8 = 24,
    STRATA_TYPE_I16 = 25,
    STRATA_TYPE_I32 = 26,
    STRATA_TYPE_I64 = 27,
    STRATA_TYPE_F64 = 28,
    STRATA_TYPE_IQ1_M = 29,
    STRATA_TYPE_BF16 = 30,
    STRATA_TYPE_MXFP4 = 39,
    STRATA_TYPE_COUNT = 40, /* one past the largest id known here */
};

/* Name as GGUF tools print it ("Q4_K"); NULL for an id not listed above. */
const char *strata_ggml_type_name(uint32_t type);
/* 1 when the id is listed above (its geometry is known), else 0. */
int strata_ggml_type_known(uint32_t type);
/* Elements per block (1 for plain types); 0 for an unknown id. */
uint32_t strata_ggml_blck_size(uint32_t type);
/* Bytes per block; 0 for an unknown id. */
uint32_t strata_ggml_type_size(uint32_t type);
/* Bytes of a row of n elements; 0 for an unknown id or when n is not a
 * multiple of the block size.  No overflow for n < 2^56. */
uint64_t strata_ggml_row_size(uint32_t type, uint64_t n);
/* Look a type up by name (case-sensitive, "Q4_K"); -1 when unknown. */
int strata_ggml_type_from_name(const char *name);
/* Byte offsets of the f16 scale fields in one block of type (d, then dmin / m where
 * the type has one), -1 terminated; static storage.  The list is empty for plain
 * types, unknown ids and types without a whole f16 scale field (IQ1_M packs its
 * scale into four nibbles, MXFP4 has an e8m0 byte, Q8_K a float32).  Layouts of
 * ggml-common.h (block_q4_1, block_q2_K, block_q3_K, block_q6_K, ...). */
const int *strata_ggml_f16_scale_offsets(uint32_t type);

#endif
