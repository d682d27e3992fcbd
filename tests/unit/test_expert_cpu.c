/* test_expert_cpu.c - CPU experts with the GPU's numerics (lib/expert_cpu.h) against
 * references written here from the definitions: the 8-bit path equals the reference
 * dequantised weights times the 32-value q8 activations (and differs from the float
 * product, so the quantisation is really there), the f16 path equals f16-rounded
 * operands, the float path the plain product; a whole expert FFN equals the chain of
 * references; every SIMD level's 8-bit rows give the scalar rows' bits; a worker
 * pool gives the same bits as inline; bad shapes and types are refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expert_cpu.h"
#include "ggml_types.h"
#include "pool.h"
#include "quant.h"
#include "quant_testutil.h"
#include "tap.h"

/* reference q8 of one row: d = amax / 127, q = nearest, ties to even */
static void ref_q8(const float *x, int64_t n, float *xq)
{
    for (int64_t b = 0; b < n / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[32 * b + j]));
        float d = amax / 127.0f;
        for (int j = 0; j < 32; j++)
            xq[32 * b + j] = d > 0 ? d * (float)nearbyintf(x[32 * b + j] / d) : 0.0f;
    }
}

static float r16(float v)
{
    return strata_f16_to_f32(strata_f32_to_f16(v));
}

struct mat_buf {
    struct strata_mat m;
    void *data;
    float *deq; /* [ne1, ne0] reference dequantisation */
};

static int make_mat(struct mat_buf *b, uint32_t type, int64_t ne0, int64_t ne1)
{
    struct strata_err err = {0, ""};
    size_t row = strata_ggml_row_size(type, ne0);
    b->data = malloc(row * (size_t)ne1);
    b->deq = malloc(sizeof(float) * (size_t)(ne0 * ne1));
    if (!b->data || !b->deq)
        return -1;
    qt_random_blocks(type, b->data, ne0 * ne1 / strata_ggml_blck_size(type));
    for (int64_t r = 0; r < ne1; r++)
        if (strata_quant_dequant_ref(type, (char *)b->data + r * row, b->deq + r * ne0, ne0,
                                     &err))
            return -1;
    b->m.type = type;
    b->m.ne0 = ne0;
    b->m.ne1 = ne1;
    b->m.nb1 = row;
    b->m.data = b->data;
    return 0;
}

static void free_mat(struct mat_buf *b)
{
    free(b->data);
    free(b->deq);
}

/* mode: 0 q8 activations, 1 float, 2 f16 operands; y [n_tok, ne1]; mag: sum of |terms| */
static void ref_matmul(const struct mat_buf *b, int mode, const float *x, int n_tok, double *y,
                       double *mag)
{
    const int64_t ne0 = b->m.ne0, ne1 = b->m.ne1;
    float *xr = malloc(sizeof(float) * (size_t)ne0);
    for (int t = 0; t < n_tok; t++) {
        const float *xt = x + t * ne0;
        for (int64_t i = 0; i < ne0; i++)
            xr[i] = mode == 2 ? r16(xt[i]) : xt[i];
        if (mode == 0)
            ref_q8(xt, ne0, xr);
        for (int64_t r = 0; r < ne1; r++) {
            double s = 0, m = 0;
            for (int64_t i = 0; i < ne0; i++) {
                double w = mode == 2 ? r16(b->deq[r * ne0 + i]) : b->deq[r * ne0 + i];
                s += w * xr[i];
                m += fabs(w * xr[i]);
            }
            y[t * ne1 + r] = s;
            mag[t * ne1 + r] = m;
        }
    }
    free(xr);
}

static void fill_x(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = qt_uniform() * (i % 7 == 0 ? 3.0f : 1.0f);
}

static void test_quantize(void)
{
    float x[64], d[2];
    int8_t q[64];
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16) * 0.5f; /* amax 8: d = 8 / 127, halves fall on .5 */
    x[0] = 127.0f;                       /* now amax 127: d = 1, x / d exact */
    for (int j = 0; j < 32; j++)
        x[32 + j] = 0.0f;
    strata_xcpu_quantize_q8(x, 64, q, d);
    int good = d[0] == 1.0f && q[0] == 127 && d[1] == 0.0f;
    for (int j = 1; j < 32 && good; j++)
        good = q[j] == (int8_t)nearbyintf(x[j]);
    for (int j = 0; j < 32 && good; j++)
        good = q[32 + j] == 0;
    /* x = -7.5, -6.5, ..., 7.5 on halves: ties go to even (2.5 -> 2, 3.5 -> 4) */
    ok(good && q[16 + 5] == 2 && q[16 + 7] == 4 && q[16 - 5] == -2,
       "q8 blocks of 32: d = amax / 127, nearest with ties to even, a zero block stays zero "
       "(q[21] = %d, q[23] = %d, q[11] = %d)", q[21], q[23], q[11]);
}

static double max_rel(const float *y, const double *ref, const double *mag, int64_t n)
{
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(y[i] - ref[i]) / (mag[i] + 1e-12);
        if (!(e <= w))
            w = e;
    }
    return w;
}

static void test_matmul(struct strata_pool *pool)
{
    const uint32_t q8t[] = {STRATA_TYPE_Q4_K, STRATA_TYPE_Q5_K, STRATA_TYPE_Q6_K,
                            STRATA_TYPE_Q8_0};
    const uint32_t ft[] = {STRATA_TYPE_Q4_K, STRATA_TYPE_Q6_K, STRATA_TYPE_Q8_0,
                           STRATA_TYPE_Q4_0, STRATA_TYPE_IQ4_XS, STRATA_TYPE_IQ2_XS,
                           STRATA_TYPE_F16};
    const int64_t ne0 = 512, ne1 = 24;
    const int n_tok = 3;
    struct strata_err err = {0, ""};
    float *x = malloc(sizeof(float) * n_tok * ne0), *y = malloc(sizeof(float) * n_tok * ne1);
    float *y2 = malloc(sizeof(float) * n_tok * ne1);
    double *ref = malloc(sizeof(double) * n_tok * ne1), *mag = malloc(sizeof(double) * n_tok * ne1);
    void *scr = malloc(strata_xcpu_scratch_bytes(ne0, n_tok));
    fill_x(x, n_tok * ne0);
    for (size_t k = 0; k < sizeof q8t / sizeof q8t[0]; k++) {
        struct mat_buf b;
        const char *tn = strata_ggml_type_name(q8t[k]);
        if (!ok(make_mat(&b, q8t[k], ne0, ne1) == 0, "%s: random weights", tn))
            continue;
        int rc = 0;
        double e = 0;
        ref_matmul(&b, 0, x, n_tok, ref, mag);
        for (int lv = STRATA_SIMD_COUNT - 1; lv >= STRATA_SIMD_SCALAR; lv--) {
            if (lv > strata_quant_simd_detect()) {
                ok(1, "# SKIP %s: no %s on this CPU", tn, strata_quant_simd_name(lv));
                continue;
            }
            rc = strata_xcpu_matmul_simd(pool, STRATA_XCPU_Q8, &b.m, x, n_tok, y, scr, lv, &err);
            e = rc ? INFINITY : max_rel(y, ref, mag, n_tok * ne1);
            ok(rc == 0 && e < 1e-5, "%s, %s rows: 8-bit path = reference weights x q8 "
               "activations (max error %.2e of the terms' magnitude)%s%s", tn,
               strata_quant_simd_name(lv), e, rc ? ": " : "", err.msg);
        }
        ref_matmul(&b, 1, x, n_tok, ref, mag);
        e = max_rel(y, ref, mag, n_tok * ne1);
        ok(e > 1e-4, "%s: the 8-bit path is not the float product (differs by %.2e)", tn, e);
        rc = strata_xcpu_matmul_simd(NULL, STRATA_XCPU_Q8, &b.m, x, n_tok, y2, scr,
                                     STRATA_SIMD_SCALAR, &err);
        ok(rc == 0 && !memcmp(y, y2, sizeof(float) * n_tok * ne1),
           "%s: a pool of 3 threads gives the bits of one", tn);
        free_mat(&b);
    }
    for (size_t k = 0; k < sizeof ft / sizeof ft[0]; k++) {
        struct mat_buf b;
        const char *tn = strata_ggml_type_name(ft[k]);
        if (!ok(make_mat(&b, ft[k], ne0, ne1) == 0, "%s: random weights", tn))
            continue;
        for (int mode = 1; mode <= 2; mode++) {
            int rc = strata_xcpu_matmul(pool, mode == 1 ? STRATA_XCPU_F32 : STRATA_XCPU_F16,
                                        &b.m, x, n_tok, y, scr, &err);
            ref_matmul(&b, mode, x, n_tok, ref, mag);
            double e = rc ? INFINITY : max_rel(y, ref, mag, n_tok * ne1);
            ref_matmul(&b, 3 - mode, x, n_tok, ref, mag);
            double other = max_rel(y, ref, mag, n_tok * ne1);
            ok(rc == 0 && e < 1e-5 && (ft[k] == STRATA_TYPE_F16 || other > 1e-5),
               "%s: %s path = its reference (max error %.2e), not the %s one (%.2e)%s%s", tn,
               mode == 1 ? "float" : "f16", e, mode == 1 ? "f16" : "float", other,
               rc ? ": " : "", err.msg);
        }
        free_mat(&b);
    }
    /* refusals */
    struct mat_buf b;
    if (make_mat(&b, STRATA_TYPE_IQ4_XS, ne0, ne1) == 0) {
        int rc = strata_xcpu_matmul(pool, STRATA_XCPU_Q8, &b.m, x, n_tok, y, scr, &err);
        ok(rc == STRATA_E_UNSUPPORTED && strstr(err.msg, "IQ4_XS"),
           "8-bit path of IQ4_XS is refused, naming the type: %s", err.msg);
        b.m.ne0 = 500;
        rc = strata_xcpu_matmul(pool, STRATA_XCPU_F32, &b.m, x, n_tok, y, scr, &err);
        ok(rc == STRATA_E_INVALID, "a row of 500 IQ4_XS values is refused: %s", err.msg);
        free_mat(&b);
    }
    free(x);
    free(y);
    free(y2);
    free(ref);
    free(mag);
    free(scr);
}

/* x for the bitwise tests: random, never zero, blocks of very different magnitudes
 * (so each q8 block has its own scale), and in token 1 some blocks whose quants fall
 * exactly on ties (amax 127 gives d = 1, values k + 0.5) */
static void fill_x_mixed(float *x, int n_tok, int64_t ne0)
{
    for (int t = 0; t < n_tok; t++)
        for (int64_t b = 0; b < ne0 / 32; b++) {
            float *xb = x + (int64_t)t * ne0 + 32 * b;
            float mag = powf(10.0f, 3.0f * qt_uniform());
            for (int j = 0; j < 32; j++) {
                float v = qt_uniform();
                xb[j] = mag * (v == 0.0f ? 0.25f : v);
            }
            if (t == 1 && b % 3 == 0) {
                for (int j = 0; j < 32; j++)
                    xb[j] = (float)((int)(qt_rand() % 200) - 100) + 0.5f;
                xb[qt_rand() % 32] = b % 2 ? -127.0f : 127.0f;
            }
        }
}

/* Every SIMD level's 8-bit rows give the scalar rows' bits, per type, on shapes that
 * leave an odd last row (the AVX-512 rows go in pairs) and blocks of any magnitude;
 * the scalar rows themselves are held to the reference, so equal stubs fail. */
static void test_simd_bits(struct strata_pool *pool)
{
    const uint32_t types[] = {STRATA_TYPE_Q4_K, STRATA_TYPE_Q5_K, STRATA_TYPE_Q6_K,
                              STRATA_TYPE_Q8_0};
    const int64_t shapes[][2] = {{768, 37}, {256, 1}, {1280, 6}};
    const int n_tok = 3;
    struct strata_err err = {0, ""};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            /* Q8_0 rows of 32-value blocks: an odd count of them too */
            const int64_t ne0 =
                shapes[si][0] + (types[k] == STRATA_TYPE_Q8_0 ? 32 * (int64_t)si : 0);
            const int64_t ne1 = shapes[si][1];
            const char *tn = strata_ggml_type_name(types[k]);
            struct mat_buf b = {{0, 0, 0, 0, NULL}, NULL, NULL};
            float *x = malloc(sizeof(float) * n_tok * ne0);
            float *y0 = malloc(sizeof(float) * n_tok * ne1);
            float *y = malloc(sizeof(float) * n_tok * ne1);
            double *ref = malloc(sizeof(double) * n_tok * ne1);
            double *mag = malloc(sizeof(double) * n_tok * ne1);
            void *scr = malloc(strata_xcpu_scratch_bytes(ne0, n_tok));
            if (make_mat(&b, types[k], ne0, ne1) != 0 || !x || !y0 || !y || !ref || !mag || !scr) {
                ok(0, "%s [%lld, %lld]: allocation", tn, (long long)ne1, (long long)ne0);
                goto next;
            }
            fill_x_mixed(x, n_tok, ne0);
            int rc = strata_xcpu_matmul_simd(pool, STRATA_XCPU_Q8, &b.m, x, n_tok, y0, scr,
                                             STRATA_SIMD_SCALAR, &err);
            ref_matmul(&b, 0, x, n_tok, ref, mag);
            double e = rc ? INFINITY : max_rel(y0, ref, mag, n_tok * ne1);
            ok(rc == 0 && e < 1e-5, "%s [%lld, %lld], scalar rows = reference (%.2e)", tn,
               (long long)ne1, (long long)ne0, e);
            for (int lv = STRATA_SIMD_SCALAR + 1; lv < STRATA_SIMD_COUNT; lv++) {
                if (lv > strata_quant_simd_detect()) {
                    ok(1, "# SKIP %s: no %s on this CPU", tn, strata_quant_simd_name(lv));
                    continue;
                }
                memset(y, 0xFF, sizeof(float) * n_tok * ne1);
                rc = strata_xcpu_matmul_simd(pool, STRATA_XCPU_Q8, &b.m, x, n_tok, y, scr, lv,
                                             &err);
                int64_t bad = -1;
                for (int64_t i = 0; i < n_tok * ne1 && bad < 0; i++)
                    if (memcmp(&y[i], &y0[i], sizeof(float)))
                        bad = i;
                ok(rc == 0 && bad < 0, "%s [%lld, %lld], %s rows: the scalar rows' bits for "
                   "%d tokens", tn, (long long)ne1, (long long)ne0, strata_quant_simd_name(lv),
                   n_tok);
                if (bad >= 0)
                    diag("token %lld row %lld: %.9g (%s) vs %.9g (scalar)",
                         (long long)(bad / ne1), (long long)(bad % ne1), y[bad],
                         strata_quant_simd_name(lv), y0[bad]);
            }
        next:
            free_mat(&b);
            free(x);
            free(y0);
            free(y);
            free(ref);
            free(mag);
            free(scr);
        }
}

/* the reference FFN of one row: modes per matrix as the GPU batch kind picks them */
static void ref_ffn(const struct mat_buf *g, const struct mat_buf *u, const struct mat_buf *d,
                    int mode, const float *x, double *y, double *mag)
{
    const int64_t nf = g->m.ne1, ne = g->m.ne0;
    double *a = malloc(sizeof(double) * nf), *b = malloc(sizeof(double) * nf);
    double *ma = malloc(sizeof(double) * nf);
    float *h = malloc(sizeof(float) * nf);
    ref_matmul(g, mode, x, 1, a, ma);
    ref_matmul(u, mode, x, 1, b, ma);
    for (int64_t i = 0; i < nf; i++) {
        float av = (float)a[i], bv = (float)b[i];
        h[i] = av / (1.0f + expf(-av)) * bv;
    }
    ref_matmul(d, mode, h, 1, y, mag);
    (void)ne;
    free(a);
    free(b);
    free(ma);
    free(h);
}

/* The gate/up run applies SwiGLU and quantises h on the pool's threads (a q8 block by
 * whichever unit finishes it), x quantised once for gate and up where their types
 * allow: an expert's output has the bits of gate, up, SwiGLU and down one matrix at a
 * time.  The work buffer is the exact size the header asks for (ASan checks it). */
static void chain_bits(struct strata_pool *pool, const struct mat_buf *g,
                       const struct mat_buf *u, const struct mat_buf *d, int n_tok)
{
    const int64_t n_embd = g->m.ne0, n_ff = g->m.ne1;
    const int64_t m = n_embd > n_ff ? n_embd : n_ff;
    struct strata_err err = {0, ""};
    float *x = malloc(sizeof(float) * n_tok * n_embd), *y = malloc(sizeof(float) * n_tok * n_embd);
    float *yc = malloc(sizeof(float) * n_tok * n_embd);
    float *gv = malloc(sizeof(float) * n_tok * n_ff), *uv = malloc(sizeof(float) * n_tok * n_ff);
    void *s1 = malloc(strata_xcpu_scratch_bytes(m, n_tok));
    void *work = malloc(strata_xcpu_ffn_work_bytes(n_embd, n_ff, n_tok));
    int rc = STRATA_E_NOMEM;
    if (x && y && gv && uv && yc && s1 && work) {
        fill_x_mixed(x, n_tok, n_embd);
        rc = strata_xcpu_matmul(pool, STRATA_XCPU_Q8, &g->m, x, n_tok, gv, s1, &err);
        rc = rc ? rc : strata_xcpu_matmul(pool, STRATA_XCPU_Q8, &u->m, x, n_tok, uv, s1, &err);
        for (int64_t i = 0; i < n_tok * n_ff && !rc; i++)
            gv[i] = gv[i] / (1.0f + expf(-gv[i])) * uv[i];
        rc = rc ? rc : strata_xcpu_matmul(pool, STRATA_XCPU_Q8, &d->m, gv, n_tok, yc, s1, &err);
        rc = rc ? rc : strata_xcpu_ffn(pool, &g->m, &u->m, &d->m, 1, 1, x, n_tok, y, work, &err);
    }
    ok(rc == 0 && !memcmp(y, yc, sizeof(float) * n_tok * n_embd),
       "expert FFN of %s/%s/%s, n_embd %lld, n_ff %lld, %d tokens, %s rows: the bits of gate, "
       "up, SwiGLU and down one matrix at a time%s%s", strata_ggml_type_name(g->m.type),
       strata_ggml_type_name(u->m.type), strata_ggml_type_name(d->m.type), (long long)n_embd,
       (long long)n_ff, n_tok, strata_quant_simd_name(strata_quant_simd_level()),
       rc ? ": " : "", rc ? err.msg : "");
    free(x);
    free(y);
    free(gv);
    free(uv);
    free(yc);
    free(s1);
    free(work);
}

static void test_ffn(struct strata_pool *pool)
{
    const int64_t n_embd = 512, n_ff = 256;
    const int n_tok = 2;
    struct mat_buf g, u, d;
    struct strata_err err = {0, ""};
    if (!ok(make_mat(&g, STRATA_TYPE_Q4_K, n_embd, n_ff) == 0 &&
                make_mat(&u, STRATA_TYPE_Q4_K, n_embd, n_ff) == 0 &&
                make_mat(&d, STRATA_TYPE_Q6_K, n_ff, n_embd) == 0,
            "expert FFN: Q4_K gate and up [256, 512], Q6_K down [512, 256]"))
        return;
    float *x = malloc(sizeof(float) * n_tok * n_embd), *y = malloc(sizeof(float) * n_tok * n_embd);
    double *ref = malloc(sizeof(double) * n_embd), *mag = malloc(sizeof(double) * n_embd);
    void *work = malloc(strata_xcpu_ffn_work_bytes(n_embd, n_ff, n_tok));
    fill_x(x, n_tok * n_embd);
    /* batch kinds: mat-vec on 8-bit activations, mat-vec in float, mat-mat in f16 */
    const int mv[3] = {1, 1, 0}, q8[3] = {1, 0, 1}, mode[3] = {0, 1, 2};
    const char *name[3] = {"mat-vec, 8-bit", "mat-vec, float", "mat-mat, f16"};
    for (int k = 0; k < 3; k++) {
        int rc = strata_xcpu_ffn(pool, &g.m, &u.m, &d.m, mv[k], q8[k], x, n_tok, y, work, &err);
        double e = 0;
        for (int t = 0; t < n_tok && !rc; t++) {
            ref_ffn(&g, &u, &d, mode[k], x + t * n_embd, ref, mag);
            double et = max_rel(y + t * n_embd, ref, mag, n_embd);
            e = et > e ? et : e;
        }
        /* 8-bit: a SwiGLU output on a rounding edge may take the neighbouring quant */
        ok(rc == 0 && e < (k == 0 ? 2e-3 : 1e-5),
           "expert FFN, %s: equals the chained references (max error %.2e)%s%s", name[k],
           rc ? INFINITY : e, rc ? ": " : "", err.msg);
    }
    /* three experts in one batch (two pool runs) give the bits of one call each */
    {
        struct strata_xcpu_expert ex[3];
        const int nt[3] = {1, 0, 2};
        float *yb = malloc(sizeof(float) * 3 * n_embd), *y1 = malloc(sizeof(float) * 2 * n_embd);
        void *wb = malloc(strata_xcpu_ffn_work_bytes(n_embd, n_ff, 3));
        for (int i = 0; i < 3; i++) {
            ex[i].gate = i == 1 ? u.m : g.m;
            ex[i].up = i == 1 ? g.m : u.m;
            ex[i].down = d.m;
            ex[i].x = x + (i == 2 ? 0 : n_embd);
            ex[i].y = yb + (i == 2 ? n_embd : 0);
            ex[i].n_tok = nt[i];
        }
        int rc = strata_xcpu_ffn_batch(pool, ex, 3, 1, 1, wb, &err);
        int same = rc == 0;
        for (int i = 0; i < 3 && same; i++) {
            if (!nt[i])
                continue;
            same = strata_xcpu_ffn(pool, &ex[i].gate, &ex[i].up, &ex[i].down, 1, 1, ex[i].x,
                                   nt[i], y1, work, &err) == 0 &&
                   !memcmp(y1, ex[i].y, sizeof(float) * nt[i] * n_embd);
        }
        ok(same, "a batch of 3 experts (1, 0 and 2 tokens) equals one call per expert%s%s",
           rc ? ": " : "", rc ? err.msg : "");
        /* a decode step: experts of one token, each with its own copy of the row (x
         * quantised once for all of them), and one of another row */
        float *xc = malloc(sizeof(float) * 3 * n_embd);
        if (xc) {
            memcpy(xc, x, sizeof(float) * n_embd);
            memcpy(xc + n_embd, x + n_embd, sizeof(float) * n_embd);
            memcpy(xc + 2 * n_embd, x, sizeof(float) * n_embd);
        }
        for (int i = 0; i < 3; i++) {
            ex[i].gate = i == 1 ? u.m : g.m;
            ex[i].up = i == 1 ? g.m : u.m;
            ex[i].x = xc + i * n_embd;
            ex[i].y = yb + i * n_embd;
            ex[i].n_tok = 1;
        }
        rc = xc ? strata_xcpu_ffn_batch(pool, ex, 3, 1, 1, wb, &err) : STRATA_E_NOMEM;
        same = rc == 0;
        for (int i = 0; i < 3 && same; i++)
            same = strata_xcpu_ffn(pool, &ex[i].gate, &ex[i].up, &ex[i].down, 1, 1,
                                   i == 1 ? x + n_embd : x, 1, y1, work, &err) == 0 &&
                   !memcmp(y1, ex[i].y, sizeof(float) * n_embd);
        ok(same, "a batch of 3 one-token experts, two of them copies of one row, equals one "
           "call per expert%s%s", rc ? ": " : "", rc ? err.msg : "");
        free(xc);
        free(yb);
        free(y1);
        free(wb);
    }
    chain_bits(pool, &g, &u, &d, n_tok);
    {
        /* gate and up of different bs groups (two quantised copies of x), a Q8_0 down
         * of 3 q8 blocks (6 units of 16 rows) */
        struct mat_buf g2 = {{0, 0, 0, 0, NULL}, NULL, NULL}, u2 = g2, d2 = g2;
        if (make_mat(&g2, STRATA_TYPE_Q4_K, 256, 96) == 0 &&
            make_mat(&u2, STRATA_TYPE_Q6_K, 256, 96) == 0 &&
            make_mat(&d2, STRATA_TYPE_Q8_0, 96, 256) == 0)
            chain_bits(pool, &g2, &u2, &d2, 3);
        else
            ok(0, "expert FFN of Q4_K/Q6_K/Q8_0: random weights");
        free_mat(&g2);
        free_mat(&u2);
        free_mat(&d2);
    }
    int rc = strata_xcpu_ffn(pool, &g.m, &u.m, &g.m, 1, 1, x, n_tok, y, work, &err);
    ok(rc == STRATA_E_INVALID && strstr(err.msg, "ffn_down"),
       "shapes that do not chain are refused: %s", err.msg);
    free_mat(&g);
    free_mat(&u);
    free_mat(&d);
    free(x);
    free(y);
    free(ref);
    free(mag);
    free(work);
}

int main(void)
{
    struct strata_pool *pool = NULL;
    struct strata_err err = {0, ""};
    if (!ok(strata_pool_create(&pool, 3, &err) == 0, "pool of 3 threads%s", err.msg))
        return tap_done();
    ok(strata_xcpu_q8_supported(STRATA_TYPE_Q4_K) && strata_xcpu_q8_supported(STRATA_TYPE_Q8_0) &&
           !strata_xcpu_q8_supported(STRATA_TYPE_Q4_0) &&
           !strata_xcpu_q8_supported(STRATA_TYPE_IQ2_XS),
       "8-bit activations for Q4_K, Q5_K, Q6_K, Q8_0 only (the GPU's set)");
    test_quantize();
    test_matmul(pool);
    test_simd_bits(pool);
    test_ffn(pool);
    strata_pool_free(pool);
    return tap_done();
}
