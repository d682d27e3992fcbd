/* test_quant_pack.c - round trips for the block types without a fixture
 * tensor (Q4_1, Q5_0, Q5_1, Q3_K, IQ1_S, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL,
 * MXFP4): random integer fields are packed into blocks by a packer written
 * here from the format description, the value each element must decode to is
 * computed independently (grids and value tables read from the fixture JSON,
 * scales powers of two so every product is exact), and the reference decoder
 * must reproduce every value bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant_testutil.h"
#include "tap.h"

static char *json_text;

/* Values of table `name` in the fixture JSON, parsed exactly from the text
 * (64-bit grid entries do not survive a double). */
static int table(const char *name, uint64_t *out, int n)
{
    char key[64];
    snprintf(key, sizeof(key), "\"%s\"", name);
    const char *p = strstr(json_text, key);
    p = p ? strstr(p, "\"values\"") : NULL;
    p = p ? strchr(p, '[') : NULL;
    int i = 0;
    while (p && *p != ']' && i < n) {
        p++;
        while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')
            p++;
        char *end;
        out[i++] = *p == '-' ? (uint64_t)strtoll(p, &end, 10) : strtoull(p, &end, 10);
        p = end;
        while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')
            p++;
    }
    return i;
}

static uint64_t g_iq2s[1024], g_iq1s[2048], g_iq3xxs[256], g_iq3s[512], g_ksigns[128];
static int8_t kv_iq4nl[16], kv_fp4[16];

static int load_tables(void)
{
    uint64_t t[16];
    int okk = table("iq2s_grid", g_iq2s, 1024) == 1024 && table("iq1s_grid", g_iq1s, 2048) == 2048 &&
              table("iq3xxs_grid", g_iq3xxs, 256) == 256 && table("iq3s_grid", g_iq3s, 512) == 512 &&
              table("ksigns_iq2xs", g_ksigns, 128) == 128;
    okk = okk && table("kvalues_iq4nl", t, 16) == 16;
    for (int i = 0; i < 16; i++)
        kv_iq4nl[i] = (int8_t)t[i];
    okk = okk && table("kvalues_fp4", t, 16) == 16;
    for (int i = 0; i < 16; i++)
        kv_fp4[i] = (int8_t)t[i];
    return okk;
}

/* grid byte j of a 64-bit (8 x int8) or 32-bit (4 x uint8) grid entry */
static int gbyte_s(uint64_t g, int j)
{
    return (int8_t)(g >> (8 * j));
}

static int gbyte_u(uint64_t g, int j)
{
    return (int)((g >> (8 * j)) & 0xff);
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* d = 2^e as f16 */
static float pow2_scale(uint8_t *p, int e)
{
    float d = ldexpf(1.0f, e);
    put16(p, strata_f32_to_f16(d));
    return d;
}

#define NB 6 /* blocks per type */

static int check(const char *name, uint32_t type, const void *blocks, const float *want, int64_t n)
{
    float *got = malloc(sizeof(float) * (size_t)n);
    int rc = strata_quant_dequant_ref(type, blocks, got, n, NULL);
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (memcmp(&got[i], &want[i], 4) != 0)
            bad = i;
    int r = ok(rc == 0 && bad < 0, "%s: %lld packed values decode exactly (first bad %lld: %g vs %g)",
               name, (long long)n, (long long)bad, bad >= 0 ? got[bad] : 0.0,
               bad >= 0 ? want[bad] : 0.0);
    free(got);
    return r;
}

static void t_q4_1_q5(uint32_t type)
{
    int is5 = type != STRATA_TYPE_Q4_1, has_m = type != STRATA_TYPE_Q5_0;
    size_t bsz = strata_ggml_type_size(type);
    uint8_t *buf = calloc(NB, bsz);
    float want[NB * 32];
    for (int b = 0; b < NB; b++) {
        uint8_t *p = buf + b * bsz;
        float d = pow2_scale(p, -3 - b);
        float m = 0;
        if (has_m) {
            m = (float)((int)(qt_rand() % 64) - 32) * 0.25f;
            put16(p + 2, strata_f32_to_f16(m));
        }
        uint8_t *qh = p + (has_m ? 4 : 2), *qs = qh + (is5 ? 4 : 0);
        for (int j = 0; j < 32; j++) {
            int q = (int)(qt_rand() % (is5 ? 32 : 16));
            qs[j % 16] |= (uint8_t)((q & 15) << (j < 16 ? 0 : 4));
            if (is5)
                qh[j / 8] |= (uint8_t)((q >> 4) << (j % 8));
            want[b * 32 + j] = has_m ? (float)q * d + m : (float)(q - 16) * d;
        }
    }
    check(strata_ggml_type_name(type), type, buf, want, NB * 32);
    free(buf);
}

static void t_iq4_nl(void)
{
    struct strata_block_iq4_nl blk[NB];
    float want[NB * 32];
    memset(blk, 0, sizeof(blk));
    for (int b = 0; b < NB; b++) {
        float d = pow2_scale((uint8_t *)&blk[b].d, -8 + b);
        for (int j = 0; j < 32; j++) {
            int q = (int)(qt_rand() % 16);
            blk[b].qs[j % 16] |= (uint8_t)(q << (j < 16 ? 0 : 4));
            want[b * 32 + j] = d * (float)kv_iq4nl[q];
        }
    }
    check("IQ4_NL", STRATA_TYPE_IQ4_NL, blk, want, NB * 32);
}

static void t_mxfp4(void)
{
    static const int exps[NB] = {0, 1, 2, 100, 127, 254};
    struct strata_block_mxfp4 blk[NB];
    float want[NB * 32];
    memset(blk, 0, sizeof(blk));
    for (int b = 0; b < NB; b++) {
        blk[b].e = (uint8_t)exps[b];
        for (int j = 0; j < 32; j++) {
            int q = (int)(qt_rand() % 16);
            blk[b].qs[j % 16] |= (uint8_t)(q << (j < 16 ? 0 : 4));
            /* E8M0 scale 2^(e-127); the table holds doubled fp4 values */
            want[b * 32 + j] = (float)ldexp((double)kv_fp4[q], exps[b] - 128);
        }
    }
    check("MXFP4", STRATA_TYPE_MXFP4, blk, want, NB * 32);
}

static void t_q3_K(void)
{
    struct strata_block_q3_K blk[NB];
    float *want = malloc(sizeof(float) * NB * 256);
    memset(blk, 0, sizeof(blk));
    for (int b = 0; b < NB; b++) {
        struct strata_block_q3_K *k = &blk[b];
        float d = pow2_scale((uint8_t *)&k->d, -10 + b);
        int sc[16];
        for (int g = 0; g < 16; g++) {
            sc[g] = (int)(qt_rand() % 64); /* stored 6-bit, value sc - 32 */
            if (g < 8)
                k->scales[g] |= (uint8_t)(sc[g] & 15);
            else
                k->scales[g - 8] |= (uint8_t)((sc[g] & 15) << 4);
            k->scales[8 + g % 4] |= (uint8_t)((sc[g] >> 4) << (2 * (g / 4)));
        }
        for (int e = 0; e < 256; e++) {
            int q = (int)(qt_rand() % 8); /* value q - 4 */
            int h = e / 128, r = e % 128;
            k->qs[32 * h + r % 32] |= (uint8_t)((q & 3) << (2 * (r / 32)));
            k->hmask[r % 32] |= (uint8_t)((q >> 2) << (4 * h + r / 32));
            want[b * 256 + e] = d * (float)(sc[e / 16] - 32) * (float)(q - 4);
        }
    }
    check("Q3_K", STRATA_TYPE_Q3_K, blk, want, NB * 256);
    free(want);
}

static void t_iq1_s(void)
{
    struct strata_block_iq1_s blk[NB];
    float *want = malloc(sizeof(float) * NB * 256);
    memset(blk, 0, sizeof(blk));
    for (int b = 0; b < NB; b++) {
        float d = pow2_scale((uint8_t *)&blk[b].d, -6 + b);
        for (int ib = 0; ib < 8; ib++) {
            int ls = (int)(qt_rand() % 8), neg = (int)(qt_rand() % 2);
            uint16_t qh = (uint16_t)(ls << 12 | neg << 15);
            for (int l = 0; l < 4; l++) {
                int idx = (int)(qt_rand() % 2048);
                blk[b].qs[4 * ib + l] = (uint8_t)idx;
                qh |= (uint16_t)((idx >> 8) << (3 * l));
                for (int j = 0; j < 8; j++)
                    want[b * 256 + 32 * ib + 8 * l + j] =
                        d * (float)(2 * ls + 1) *
                        ((float)gbyte_s(g_iq1s[idx], j) + (neg ? -0.125f : 0.125f));
            }
            blk[b].qh[ib] = qh;
        }
    }
    check("IQ1_S", STRATA_TYPE_IQ1_S, blk, want, NB * 256);
    free(want);
}

static void t_iq2_s(void)
{
    struct strata_block_iq2_s blk[NB];
    float *want = malloc(sizeof(float) * NB * 256);
    memset(blk, 0, sizeof(blk));
    for (int b = 0; b < NB; b++) {
        float d = pow2_scale((uint8_t *)&blk[b].d, -4 - b);
        for (int ib = 0; ib < 8; ib++) {
            int s0 = (int)(qt_rand() % 16), s1 = (int)(qt_rand() % 16);
            blk[b].scales[ib] = (uint8_t)(s0 | s1 << 4);
            for (int l = 0; l < 4; l++) {
                int idx = (int)(qt_rand() % 1024), signs = (int)(qt_rand() % 256);
                blk[b].qs[4 * ib + l] = (uint8_t)idx;
                blk[b].qh[ib] |= (uint8_t)((idx >> 8) << (2 * l));
                blk[b].qs[32 + 4 * ib + l] = (uint8_t)signs;
                float db = d * (0.5f + (float)(l < 2 ? s0 : s1)) * 0.25f;
                for (int j = 0; j < 8; j++)
                    want[b * 256 + 32 * ib + 8 * l + j] =
                        db * (float)gbyte_s(g_iq2s[idx], j) * (signs >> j & 1 ? -1.f : 1.f);
            }
        }
    }
    check("IQ2_S", STRATA_TYPE_IQ2_S, blk, want, NB * 256);
    free(want);
}

static void t_iq3_xxs(void)
{
    struct strata_block_iq3_xxs blk[NB];
    float *want = malloc(sizeof(float) * NB * 256);
    memset(blk, 0, sizeof(blk));
    for (int b = 0; b < NB; b++) {
        float d = pow2_scale((uint8_t *)&blk[b].d, -5 + b);
        for (int ib = 0; ib < 8; ib++) {
            int s = (int)(qt_rand() % 16);
            uint32_t word = (uint32_t)s << 28;
            for (int l = 0; l < 4; l++) {
                int si = (int)(qt_rand() % 128);
                word |= (uint32_t)si << (7 * l);
                int signs = (int)g_ksigns[si];
                for (int half = 0; half < 2; half++) {
                    int idx = (int)(qt_rand() % 256);
                    blk[b].qs[8 * ib + 2 * l + half] = (uint8_t)idx;
                    for (int j = 0; j < 4; j++) {
                        int e = 4 * half + j;
                        want[b * 256 + 32 * ib + 8 * l + e] =
                            d * (0.5f + (float)s) * 0.5f * (float)gbyte_u(g_iq3xxs[idx], j) *
                            (signs >> e & 1 ? -1.f : 1.f);
                    }
                }
            }
            memcpy(blk[b].qs + 64 + 4 * ib, &word, 4);
        }
    }
    check("IQ3_XXS", STRATA_TYPE_IQ3_XXS, blk, want, NB * 256);
    free(want);
}

static void t_iq3_s(void)
{
    struct strata_block_iq3_s blk[NB];
    float *want = malloc(sizeof(float) * NB * 256);
    memset(blk, 0, sizeof(blk));
    for (int b = 0; b < NB; b++) {
        float d = pow2_scale((uint8_t *)&blk[b].d, -7 + b);
        for (int ib = 0; ib < 8; ib++) {
            int s = (int)(qt_rand() % 16);
            blk[b].scales[ib / 2] |= (uint8_t)(s << (4 * (ib % 2)));
            for (int l = 0; l < 4; l++) {
                int signs = (int)(qt_rand() % 256);
                blk[b].signs[4 * ib + l] = (uint8_t)signs;
                for (int half = 0; half < 2; half++) {
                    int k = 2 * l + half, idx = (int)(qt_rand() % 512);
                    blk[b].qs[8 * ib + k] = (uint8_t)idx;
                    blk[b].qh[ib] |= (uint8_t)((idx >> 8) << k);
                    for (int j = 0; j < 4; j++) {
                        int e = 4 * half + j;
                        want[b * 256 + 32 * ib + 8 * l + e] =
                            d * (float)(1 + 2 * s) * (float)gbyte_u(g_iq3s[idx], j) *
                            (signs >> e & 1 ? -1.f : 1.f);
                    }
                }
            }
        }
    }
    check("IQ3_S", STRATA_TYPE_IQ3_S, blk, want, NB * 256);
    free(want);
}

int main(void)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/ref/gguf-quant-tables.json", tap_fixtures());
    FILE *f = fopen(path, "rb");
    if (!ok(f != NULL, "open %s", path))
        return tap_done();
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    json_text = calloc(1, (size_t)len + 1);
    size_t got = fread(json_text, 1, (size_t)len, f);
    fclose(f);
    if (!ok(got == (size_t)len && load_tables(), "tables read from %s", path)) {
        free(json_text);
        return tap_done();
    }
    for (int rep = 0; rep < 4; rep++) {
        t_q4_1_q5(STRATA_TYPE_Q4_1);
        t_q4_1_q5(STRATA_TYPE_Q5_0);
        t_q4_1_q5(STRATA_TYPE_Q5_1);
        t_iq4_nl();
        t_mxfp4();
        t_q3_K();
        t_iq1_s();
        t_iq2_s();
        t_iq3_xxs();
        t_iq3_s();
    }
    free(json_text);
    return tap_done();
}
