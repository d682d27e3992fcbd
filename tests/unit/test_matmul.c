/* test_matmul.c - threaded matmul: every value equals the single dot of its
 * (token, row) bit for bit whatever n_tok, thread count and row range (batch
 * invariance), at every SIMD level; results near the float64 reference;
 * argument errors; the pool runs every ith exactly once. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.h"
#include "pool.h"
#include "quant_testutil.h"
#include "tap.h"

static void count_fn(void *ctx, int ith, int nth)
{
    atomic_int *c = ctx;
    atomic_fetch_add(&c[ith], 1);
    atomic_fetch_add(&c[nth], 1); /* slot nth counts all calls */
}

static void test_pool(void)
{
    struct strata_pool *p = NULL;
    struct strata_err err = {0};
    ok(strata_pool_create(&p, 3, &err) == 0 && strata_pool_n_threads(p) == 3, "pool of 3");
    atomic_int c[4] = {0};
    for (int i = 0; i < 200; i++)
        strata_pool_run(p, count_fn, c);
    ok(c[0] == 200 && c[1] == 200 && c[2] == 200 && c[3] == 600,
       "200 jobs: each ith ran 200 times (%d %d %d, total %d)", c[0], c[1], c[2], c[3]);
    strata_pool_free(p);
    ok(strata_pool_create(&p, 100000, &err) == STRATA_E_INVALID && p == NULL,
       "pool of 100000 refused: %s", err.msg);
    atomic_int d[2] = {0};
    strata_pool_run(NULL, count_fn, d);
    ok(d[0] == 1 && d[1] == 1, "NULL pool runs inline");
}

static void test_type(uint32_t type, struct strata_pool **pools, int n_pools, int max_level)
{
    const char *name = strata_ggml_type_name(type);
    int64_t ne0 = 512, ne1 = 37;
    size_t row = strata_ggml_row_size(type, (uint64_t)ne0);
    size_t nb1 = row + 8; /* rows need not be packed */
    uint8_t *wd = malloc(nb1 * (size_t)ne1);
    for (int64_t r = 0; r < ne1; r++)
        qt_random_blocks(type, wd + r * nb1, ne0 / strata_ggml_blck_size(type));
    struct strata_mat w = {type, ne0, ne1, nb1, wd};
    enum { MAXT = 40 };
    float *x = malloc(sizeof(float) * ne0 * MAXT);
    for (int64_t i = 0; i < ne0 * MAXT; i++)
        x[i] = qt_uniform();
    float *y = malloc(sizeof(float) * ne1 * MAXT);
    uint32_t vt = strata_quant_vec_dot_type(type);
    size_t abytes = strata_quant_act_size(vt, ne0);
    char *act = malloc(abytes);
    float *wf = malloc(sizeof(float) * ne0);
    double *av = malloc(sizeof(double) * ne0);
    struct strata_err err = {0};

    for (int level = 0; level <= max_level; level++) {
        strata_vec_dot_fn f = strata_quant_vec_dot_fn(type, level);
        int64_t toks[3] = {1, 7, MAXT};
        int all_same = 1, rc_all = 0;
        double worst = 0;
        for (int ti = 0; ti < 3; ti++) {
            /* thread counts matter for every level, but the lower levels
             * share the scheduling code: 1 and 2 threads are enough there */
            for (int pi = 0; pi < (level == max_level ? n_pools : 2); pi++) {
                int64_t n_tok = toks[ti];
                int64_t r0 = pi == 2 ? 3 : 0, r1 = pi == 2 ? ne1 - 5 : ne1;
                for (int64_t i = 0; i < ne1 * n_tok; i++)
                    y[i] = -12345.f;
                rc_all |= strata_matmul_rows(pools[pi], &w, x, n_tok, y, r0, r1, level, &err);
                for (int64_t t = 0; t < n_tok; t++) {
                    strata_quant_quantize_act(vt, x + t * ne0, act, ne0);
                    for (int64_t r = 0; r < ne1; r++) {
                        float got = y[t * ne1 + r];
                        if (r < r0 || r >= r1) {
                            all_same &= got == -12345.f;
                            continue;
                        }
                        float want;
                        f(ne0, wd + r * nb1, act, abytes, 1, &want);
                        all_same &= memcmp(&got, &want, 4) == 0;
                        if (ti == 0 && pi == 0) {
                            strata_quant_dequant_ref(type, wd + r * nb1, wf, ne0, NULL);
                            qt_act_values(vt, act, ne0, av);
                            double ref = 0, mag = 0;
                            for (int64_t i = 0; i < ne0; i++) {
                                ref += (double)wf[i] * av[i];
                                mag += fabs((double)wf[i] * av[i]);
                            }
                            double rel = fabs(got - ref) / (mag > 0 ? mag : 1);
                            worst = rel > worst ? rel : worst;
                        }
                    }
                }
            }
        }
        ok(rc_all == 0 && all_same,
           "%s %s: 37 rows x {1,7,40} tokens x {1,2,3} threads, row ranges: every value "
           "bitwise equal to its single dot", name, strata_quant_simd_name(level));
        ok(worst <= 1e-5, "%s %s: worst relative error vs float64 %.3g", name,
           strata_quant_simd_name(level), worst);
    }
    free(wd);
    free(x);
    free(y);
    free(act);
    free(wf);
    free(av);
}

static void test_errors(void)
{
    struct strata_err err = {0};
    float x[64] = {0}, y[4];
    uint8_t wd[256] = {0};
    struct strata_mat w = {STRATA_TYPE_Q8_1, 32, 1, 36, wd};
    ok(strata_matmul(NULL, &w, x, 1, y, &err) == STRATA_E_UNSUPPORTED && strstr(err.msg, "Q8_1"),
       "Q8_1 weights refused: %s", err.msg);
    struct strata_mat w2 = {STRATA_TYPE_Q4_K, 64, 1, 144, wd};
    ok(strata_matmul(NULL, &w2, x, 1, y, &err) == STRATA_E_INVALID,
       "Q4_K with ne0 64 refused: %s", err.msg);
    struct strata_mat w3 = {STRATA_TYPE_Q8_0, 64, 2, 34, wd};
    ok(strata_matmul(NULL, &w3, x, 1, y, &err) == STRATA_E_INVALID,
       "nb1 smaller than a row refused: %s", err.msg);
    struct strata_mat w4 = {STRATA_TYPE_Q8_0, 64, 2, 68, wd};
    ok(strata_matmul_rows(NULL, &w4, x, 1, y, 1, 3, -1, &err) == STRATA_E_INVALID,
       "row range past ne1 refused: %s", err.msg);
}

/* strata_matmul_q with activations quantised by the caller, rows padded
 * apart, equals strata_matmul bit for bit. */
static void test_prequantised(struct strata_pool *pool)
{
    struct strata_err err = {0};
    uint32_t type = STRATA_TYPE_Q4_K;
    int64_t ne0 = 512, ne1 = 19, n_tok = 6;
    size_t row = strata_ggml_row_size(type, (uint64_t)ne0);
    uint8_t *wd = malloc(row * (size_t)ne1);
    qt_random_blocks(type, wd, ne1 * ne0 / 256);
    struct strata_mat w = {type, ne0, ne1, row, wd};
    float *x = malloc(sizeof(float) * (size_t)(ne0 * n_tok));
    for (int64_t i = 0; i < ne0 * n_tok; i++)
        x[i] = qt_uniform();
    float y1[19 * 6], y2[19 * 6];
    size_t arow = strata_quant_act_size(STRATA_TYPE_Q8_K, ne0), stride = arow + 40;
    char *act = malloc(stride * (size_t)n_tok);
    for (int64_t t = 0; t < n_tok; t++)
        strata_quant_quantize_act(STRATA_TYPE_Q8_K, x + t * ne0, act + (size_t)t * stride, ne0);
    int rc1 = strata_matmul(pool, &w, x, n_tok, y1, &err);
    int rc2 = strata_matmul_q(pool, &w, act, stride, n_tok, y2, 0, ne1, -1, &err);
    ok(rc1 == 0 && rc2 == 0 && memcmp(y1, y2, sizeof(y1)) == 0,
       "matmul_q on caller-quantised activations (stride %zu) equals matmul", stride);
    free(wd);
    free(x);
    free(act);
}

int main(void)
{
    test_pool();
    test_errors();
    struct strata_pool *pools[3] = {NULL, NULL, NULL};
    struct strata_err err = {0};
    strata_pool_create(&pools[1], 2, &err);
    strata_pool_create(&pools[2], 3, &err);
    int max_level = strata_quant_simd_detect();
    test_prequantised(pools[1]);
    for (size_t i = 0; i < QT_N_TYPES; i++)
        test_type(qt_types[i], pools, 3, max_level);
    strata_pool_free(pools[1]);
    strata_pool_free(pools[2]);
    return tap_done();
}
