/* ggml_types.c - block geometry of the GGUF tensor types.
 * Sizes from the GGUF specification and ggml's block structs
 * (ggml-common.h): QK_K = 256 super-blocks, 32-element simple blocks. */
#include "ggml_types.h"

#include <string.h>

static const struct {
    const char *name;
    uint32_t blck_size;
    uint32_t type_size;
} type_table[STRATA_TYPE_COUNT] = {
    [STRATA_TYPE_F32] = {"F32", 1, 4},
    [STRATA_TYPE_F16] = {"F16", 1, 2},
    [STRATA_TYPE_Q4_0] = {"Q4_0", 32, 2 + 16},
    [STRATA_TYPE_Q4_1] = {"Q4_1", 32, 2 + 2 + 16},
    [STRATA_TYPE_Q5_0] = {"Q5_0", 32, 2 + 4 + 16},
    [STRATA_TYPE_Q5_1] = {"Q5_1", 32, 2 + 2 + 4 + 16},
    [STRATA_TYPE_Q8_0] = {"Q8_0", 32, 2 + 32},
    [STRATA_TYPE_Q8_1] = {"Q8_1", 32, 4 + 32},
    [STRATA_TYPE_Q2_K] = {"Q2_K", 256, 16 + 64 + 2 + 2},
    [STRATA_TYPE_Q3_K] = {"Q3_K", 256, 32 + 64 + 12 + 2},
    [STRATA_TYPE_Q4_K] = {"Q4_K", 256, 2 + 2 + 12 + 128},
    [STRATA_TYPE_Q5_K] = {"Q5_K", 256, 2 + 2 + 12 + 32 + 128},
    [STRATA_TYPE_Q6_K] = {"Q6_K", 256, 128 + 64 + 16 + 2},
    [STRATA_TYPE_Q8_K] = {"Q8_K", 256, 4 + 256 + 32},
    [STRATA_TYPE_IQ2_XXS] = {"IQ2_XXS", 256, 2 + 64},
    [STRATA_TYPE_IQ2_XS] = {"IQ2_XS", 256, 2 + 64 + 8},
    [STRATA_TYPE_IQ3_XXS] = {"IQ3_XXS", 256, 2 + 96},
    [STRATA_TYPE_IQ1_S] = {"IQ1_S", 256, 2 + 32 + 16},
    [STRATA_TYPE_IQ4_NL] = {"IQ4_NL", 32, 2 + 16},
    [STRATA_TYPE_IQ3_S] = {"IQ3_S", 256, 2 + 64 + 8 + 32 + 4},
    [STRATA_TYPE_IQ2_S] = {"IQ2_S", 256, 2 + 64 + 16},
    [STRATA_TYPE_IQ4_XS] = {"IQ4_XS", 256, 2 + 2 + 4 + 128},
    [STRATA_TYPE_I8] = {"I8", 1, 1},
    [STRATA_TYPE_I16] = {"I16", 1, 2},
    [STRATA_TYPE_I32] = {"I32", 1, 4},
    [STRATA_TYPE_I64] = {"I64", 1, 8},
    [STRATA_TYPE_F64] = {"F64", 1, 8},
    [STRATA_TYPE_IQ1_M] = {"IQ1_M", 256, 32 + 16 + 8},
    [STRATA_TYPE_BF16] = {"BF16", 1, 2},
    [STRATA_TYPE_MXFP4] = {"MXFP4", 32, 1 + 16},
};

const char *strata_ggml_type_name(uint32_t type)
{
    return type < STRATA_TYPE_COUNT ? type_table[type].name : NULL;
}

int strata_ggml_type_known(uint32_t type)
{
    return type < STRATA_TYPE_COUNT && type_table[type].name != NULL;
}

uint32_t strata_ggml_blck_size(uint32_t type)
{
    return strata_ggml_type_known(type) ? type_table[type].blck_size : 0;
}

uint32_t strata_ggml_type_size(uint32_t type)
{
    return strata_ggml_type_known(type) ? type_table[type].type_size : 0;
}

uint64_t strata_ggml_row_size(uint32_t type, uint64_t n)
{
    if (!strata_ggml_type_known(type))
        return 0;
    uint64_t bs = type_table[type].blck_size;
    if (n % bs != 0)
        return 0;
    return n / bs * type_table[type].type_size;
}

int strata_ggml_type_from_name(const char *name)
{
    for (int t = 0; t < STRATA_TYPE_COUNT; t++)
        if (type_table[t].name && strcmp(type_table[t].name, name) == 0)
            return t;
    return -1;
}

const int *strata_ggml_f16_scale_offsets(uint32_t type)
{
    static const int at0[] = {0, -1}, at02[] = {0, 2, -1}, q2k[] = {80, 82, -1},
                     q3k[] = {108, -1}, q6k[] = {208, -1}, none[] = {-1};
    if (!strata_ggml_type_known(type) || strata_ggml_blck_size(type) == 1)
        return none;
    switch (type) {
    case STRATA_TYPE_Q4_1: case STRATA_TYPE_Q5_1: case STRATA_TYPE_Q4_K: case STRATA_TYPE_Q5_K:
        return at02;
    case STRATA_TYPE_Q2_K: return q2k;
    case STRATA_TYPE_Q3_K: return q3k;
    case STRATA_TYPE_Q6_K: return q6k;
    case STRATA_TYPE_IQ1_M: case STRATA_TYPE_MXFP4: case STRATA_TYPE_Q8_K: return none;
    default: return at0;
    }
}
