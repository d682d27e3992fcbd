/* test_quant_dot.c - every dot kernel, at every SIMD level the CPU has,
 * against the reference decoder on random blocks (relative error <= 1e-5 of
 * sum |w_i a_i|); the n_act form bitwise equal to single dots; activation
 * quantisation properties. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant_testutil.h"
#include "tap.h"

static void test_type(uint32_t type, int max_level)
{
    const char *name = strata_ggml_type_name(type);
    int64_t bs = strata_ggml_blck_size(type);
    int64_t qk = strata_quant_vec_dot_type(type) == STRATA_TYPE_Q8_K ? 256 : 32;
    if (bs > qk)
        qk = bs;
    /* lengths: one block, an odd number of blocks, a long row */
    int64_t lens[3] = {qk, qk * 7, qk * (qk == 256 ? 16 : 96)};
    uint32_t vt = strata_quant_vec_dot_type(type);
    enum { NA = 13 }; /* passes of 8 and 4 rows plus a single row */
    for (int li = 0; li < 3; li++) {
        int64_t n = lens[li];
        size_t wbytes = strata_ggml_row_size(type, (uint64_t)n);
        size_t abytes = strata_quant_act_size(vt, n);
        void *w = malloc(wbytes);
        float *x = malloc((size_t)n * 4 * NA);
        char *act = malloc(abytes * NA);
        float *wf = malloc((size_t)n * 4);
        double *av = malloc((size_t)n * 8);
        qt_random_blocks(type, w, n / bs);
        strata_quant_dequant_ref(type, w, wf, n, NULL);
        for (int t = 0; t < NA; t++) {
            for (int64_t i = 0; i < n; i++)
                x[t * n + i] = qt_uniform() * (t == 2 ? 100.f : 1.f);
            strata_quant_quantize_act(vt, x + t * n, act + t * abytes, n);
        }
        double ref[NA], mag[NA];
        for (int t = 0; t < NA; t++) {
            qt_act_values(vt, act + t * abytes, n, av);
            ref[t] = 0;
            mag[t] = 0;
            for (int64_t i = 0; i < n; i++) {
                ref[t] += (double)wf[i] * av[i];
                mag[t] += fabs((double)wf[i] * av[i]);
            }
        }
        for (int level = 0; level <= max_level; level++) {
            strata_vec_dot_fn f = strata_quant_vec_dot_fn(type, level);
            float multi[NA], single[NA];
            f(n, w, act, abytes, NA, multi);
            double worst = 0;
            int same = 1;
            for (int t = 0; t < NA; t++) {
                f(n, w, act + t * abytes, abytes, 1, &single[t]);
                double rel = fabs(single[t] - ref[t]) / (mag[t] > 0 ? mag[t] : 1);
                if (rel > worst)
                    worst = rel;
                if (memcmp(&single[t], &multi[t], 4) != 0)
                    same = 0;
            }
            ok(worst <= 1e-5, "%s n=%lld %s: worst relative error %.3g", name, (long long)n,
               strata_quant_simd_name(level), worst);
            ok(same, "%s n=%lld %s: n_act=%d bitwise equal to single dots", name, (long long)n,
               strata_quant_simd_name(level), NA);
        }
        free(w);
        free(x);
        free(act);
        free(wf);
        free(av);
    }
}

static void test_act_quant(void)
{
    float x[256];
    for (int i = 0; i < 256; i++)
        x[i] = qt_uniform();
    x[77] = -3.0f; /* the largest magnitude, negative */
    struct strata_block_q8_K k;
    strata_quant_quantize_act(STRATA_TYPE_Q8_K, x, &k, 256);
    int bs_ok = 1, range_ok = 1;
    for (int g = 0; g < 16; g++) {
        int s = 0;
        for (int j = 0; j < 16; j++)
            s += k.qs[16 * g + j];
        bs_ok &= s == k.bsums[g];
    }
    for (int i = 0; i < 256; i++)
        range_ok &= k.qs[i] != -128 &&
                    fabsf(k.d * k.qs[i] - x[i]) <= fabsf(k.d) * 0.5f + 1e-6f;
    /* the signed extreme maps to -127: d = max / -127 */
    ok(k.qs[77] == -127 && fabsf(k.d - 3.0f / 127.f) < 1e-7f,
       "q8_K: max |x| maps to -127, d = max/-127 (%d, %g)", k.qs[77], k.d);
    ok(bs_ok && range_ok, "q8_K: bsums and half-step rounding");
    struct strata_block_q8_0 q[8];
    strata_quant_quantize_act(STRATA_TYPE_Q8_0, x, q, 256);
    range_ok = 1;
    for (int i = 0; i < 256; i++) {
        float d = strata_f16_to_f32(q[i / 32].d);
        /* q is rounded with the unrounded scale, decoded with the f16 one */
        range_ok &= fabsf(d * q[i / 32].qs[i % 32] - x[i]) <= d * 0.57f;
    }
    ok(range_ok && q[2].qs[77 - 64] == -127, "q8_0: values within half a step, amax -> -127");
    memset(x, 0, sizeof(x));
    strata_quant_quantize_act(STRATA_TYPE_Q8_K, x, &k, 256);
    ok(k.d == 0 && k.qs[5] == 0 && k.bsums[3] == 0, "q8_K: zero block");
}

/* The library's activation quantisation (SIMD when the CPU has it) must be
 * bitwise the scalar one: run this test under STRATA_SIMD=scalar and compare
 * with a copy of the scalar rules here. */
static void test_act_levels(void)
{
    int n = 256 * 5;
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++)
        x[i] = qt_uniform() * (i % 97 == 0 ? 30.f : 1.f);
    x[300] = 0.5f; /* exact half steps after scaling are likely somewhere below */
    for (int i = 512; i < 768; i++)
        x[i] = 0; /* a zero Q8_K block */
    struct strata_block_q8_K k[5];
    struct strata_block_q8_0 q[40];
    strata_quant_quantize_act(STRATA_TYPE_Q8_K, x, k, n);
    strata_quant_quantize_act(STRATA_TYPE_Q8_0, x, q, n);
    int bad_k = -1, bad_0 = -1;
    for (int b = 0; b < 5 && bad_k < 0; b++) {
        const float *xb = x + 256 * b;
        float max = 0, amax = 0;
        for (int j = 0; j < 256; j++)
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        float iscale = amax != 0 ? -127.f / max : 0;
        for (int j = 0; j < 256; j++) {
            long v = amax != 0 ? lrintf(iscale * xb[j]) : 0;
            if (v > 127)
                v = 127;
            if (k[b].qs[j] != v)
                bad_k = 256 * b + j;
        }
        if (amax != 0 && k[b].d != 1.f / iscale)
            bad_k = 256 * b;
    }
    for (int b = 0; b < 40 && bad_0 < 0; b++) {
        const float *xb = x + 32 * b;
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(xb[j]));
        float id = amax != 0 ? 127.f / amax : 0;
        for (int j = 0; j < 32; j++)
            if (q[b].qs[j] != lrintf(xb[j] * id))
                bad_0 = 32 * b + j;
        if (q[b].d != strata_f32_to_f16(amax / 127.f))
            bad_0 = 32 * b;
    }
    ok(bad_k < 0, "q8_K activations (%s) follow the scalar rules bit for bit (first bad %d)",
       strata_quant_simd_name(strata_quant_simd_level()), bad_k);
    ok(bad_0 < 0, "q8_0 activations (%s) follow the scalar rules bit for bit (first bad %d)",
       strata_quant_simd_name(strata_quant_simd_level()), bad_0);
    free(x);
}

static void test_f16(void)
{
    int bad = -1;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = strata_f16_to_f32((strata_f16)h);
        if (isnan(f))
            continue;
        if (strata_f32_to_f16(f) != h && bad < 0)
            bad = (int)h;
    }
    ok(bad < 0, "f16 -> f32 -> f16 round trip of every f16 (first bad %d)", bad);
    ok(strata_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00 && strata_f32_to_f16(1.0f + 3 * 0x1p-11f) ==
       0x3c02, "f32 -> f16 rounds ties to even");
    ok(strata_f32_to_f16(65520.f) == 0x7c00 && strata_f32_to_f16(65519.f) == 0x7bff,
       "f32 -> f16 overflow boundary");
    ok(strata_f32_to_f16(0x1p-25f) == 0 && strata_f32_to_f16(0x1.8p-25f) == 1 &&
       strata_f16_to_f32(1) == 0x1p-24f, "f16 subnormals");
    ok(strata_bf16_to_f32(strata_f32_to_bf16(1.00390625f)) == 1.0f &&
       strata_bf16_to_f32(strata_f32_to_bf16(-2.5f)) == -2.5f, "bf16 rounding");
}

int main(void)
{
    int max_level = strata_quant_simd_detect();
    diag("cpu simd level: %s (library uses %s)", strata_quant_simd_name(max_level),
         strata_quant_simd_name(strata_quant_simd_level()));
    test_f16();
    test_act_quant();
    test_act_levels();
    for (size_t i = 0; i < QT_N_TYPES; i++)
        test_type(qt_types[i], max_level);
    ok(strata_quant_vec_dot_fn(STRATA_TYPE_Q8_1, 0) == NULL &&
           strata_quant_vec_dot_type(STRATA_TYPE_I32) == 0xffffffffu,
       "unsupported types have no kernel");
    return tap_done();
}
