/* test_kernels.cu - every GPU kernel against the CPU reference (make check-gpu).
 *
 * Weights are random blocks of every block type (random quants and signs, small
 * random scales), decoded on the CPU by strata_quant_dequant_ref, the ground truth.
 * Shapes include single blocks, odd row counts and large matrices. */
#include "kt_common.h"

/* Random weight rows of every block type (kt_random_rows, kt_all_types): kernels/kref.h,
 * shared with the kernel self-test. */

static struct strata_gpu_ctx ctx;

/* get_rows: the GPU decoder equals the CPU reference (1 ulp allowed: the i-quants
 * multiply in a different order). */
static void test_decode(uint32_t type, int64_t ne0, int64_t ne1)
{
    struct strata_err err = {0, ""};
    size_t rb;
    uint8_t *w = kt_random_rows(type, ne0, ne1, &rb);
    float *ref = (float *)malloc(sizeof(float) * ne0 * ne1), *got = (float *)malloc(sizeof(float) * ne0 * ne1);
    int rc = strata_quant_dequant_ref(type, w, ref, ne0 * ne1, &err);
    void *dw = kt_up(w, rb * ne1);
    float *dy = (float *)kt_dev(sizeof(float) * ne0 * ne1);
    kt_poison(dy, sizeof(float) * ne0 * ne1);
    struct strata_k_weight kw = {type, ne0, ne1, rb, rb * ne1, dw};
    if (!rc)
        rc = strata_k_get_rows(&ctx, &kw, NULL, (int)ne1, dy, &err);
    KT_CUDA(cudaDeviceSynchronize());
    kt_down(got, dy, sizeof(float) * ne0 * ne1);
    size_t worst;
    double e = rc ? INFINITY : kt_err(got, ref, ne0 * ne1, 1e-30, 2.5e-7, &worst);
    ok(e <= 1.0, "decode %s [%lld x %lld]: max err %.3g ulp-ish%s%s", strata_ggml_type_name(type),
       (long long)ne0, (long long)ne1, e, rc ? ": " : "", rc ? err.msg : "");
    if (!rc && e > 1.0)
        diag("  at %zu: gpu %.9g ref %.9g", worst, got[worst], ref[worst]);
    cudaFree(dw);
    cudaFree(dy);
    free(w);
    free(ref);
    free(got);
}

/* matvec over a stack of n_exp matrices, n_slot slots routed by random ids;
 * glu: silu(gate)*up.  Reference in double from the CPU decoder. */
static void test_matvec(uint32_t type, int64_t ne0, int64_t ne1, int n_exp, int n_slot,
                        int x_group, int glu, int with_add)
{
    struct strata_err err = {0, ""};
    size_t rb;
    int64_t nrow = ne1 * n_exp;
    uint8_t *w = kt_random_rows(type, ne0, nrow, &rb);
    uint8_t *u = glu ? kt_random_rows(type, ne0, nrow, &rb) : NULL;
    float *wf = (float *)malloc(sizeof(float) * ne0 * nrow);
    float *uf = glu ? (float *)malloc(sizeof(float) * ne0 * nrow) : NULL;
    int rc = strata_quant_dequant_ref(type, w, wf, ne0 * nrow, &err);
    if (!rc && glu)
        rc = strata_quant_dequant_ref(type, u, uf, ne0 * nrow, &err);
    int n_x = (n_slot + x_group - 1) / x_group;
    float *x = (float *)malloc(sizeof(float) * ne0 * n_x);
    kt_fill(x, ne0 * n_x, 1.0f);
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * n_slot);
    for (int s = 0; s < n_slot; s++)
        ids[s] = (int32_t)(kt_u32() % n_exp);
    float *add = (float *)malloc(sizeof(float) * ne1 * n_slot);
    kt_fill(add, ne1 * n_slot, 1.0f);
    float *ref = (float *)malloc(sizeof(float) * ne1 * n_slot);
    float *got = (float *)malloc(sizeof(float) * ne1 * n_slot);
    double max_mag = 0;
    for (int s = 0; s < n_slot; s++) {
        const float *xs = x + (s / x_group) * ne0;
        for (int64_t r = 0; r < ne1; r++) {
            const float *wr = wf + ((int64_t)ids[s] * ne1 + r) * ne0;
            double a = 0, b = 0, mag = 0;
            for (int64_t k = 0; k < ne0; k++) {
                a += (double)wr[k] * xs[k];
                mag += fabs((double)wr[k] * xs[k]);
                if (glu)
                    b += (double)uf[((int64_t)ids[s] * ne1 + r) * ne0 + k] * xs[k];
            }
            double v = glu ? a / (1 + exp(-a)) * b : a + (with_add ? add[s * ne1 + r] : 0);
            ref[s * ne1 + r] = (float)v;
            if (mag > max_mag)
                max_mag = mag;
        }
    }
    void *dw = kt_up(w, rb * nrow), *du = glu ? kt_up(u, rb * nrow) : NULL;
    float *dx = (float *)kt_up(x, sizeof(float) * ne0 * n_x);
    int32_t *dids = (int32_t *)kt_up(ids, sizeof(int32_t) * n_slot);
    float *dy = (float *)kt_dev(sizeof(float) * ne1 * n_slot);
    if (with_add)
        KT_CUDA(cudaMemcpy(dy, add, sizeof(float) * ne1 * n_slot, cudaMemcpyHostToDevice));
    else
        kt_poison(dy, sizeof(float) * ne1 * n_slot);
    struct strata_k_weight kw = {type, ne0, ne1, rb, rb * ne1, dw};
    struct strata_k_weight ku = {type, ne0, ne1, rb, rb * ne1, du};
    struct strata_k_mv_args a;
    memset(&a, 0, sizeof(a));
    a.w = &kw;
    a.up = glu ? &ku : NULL;
    a.glu = glu;
    a.ids = n_exp > 1 ? dids : NULL;
    if (n_exp == 1)
        for (int s = 0; s < n_slot; s++)
            ids[s] = 0;
    a.n_slot = n_slot;
    a.x_group = x_group;
    a.x = dx;
    a.x_stride = ne0;
    a.y = dy;
    a.y_stride = ne1;
    a.add = with_add ? dy : NULL;
    if (!rc)
        rc = strata_k_matvec(&ctx, &a, &err);
    KT_CUDA(cudaDeviceSynchronize());
    kt_down(got, dy, sizeof(float) * ne1 * n_slot);
    /* float32 sums of ne0 terms: error relative to the sum of magnitudes */
    size_t worst;
    double atol = 2e-6 * max_mag * (glu ? max_mag + 1 : 1) + 1e-6;
    double e = rc ? INFINITY : kt_err(got, ref, ne1 * n_slot, atol, 1e-5, &worst);
    ok(e <= 1.0, "matvec%s%s %s [%lld x %lld] x%d experts, %d slots/%d: err %.3g%s%s",
       glu ? " glu" : "", with_add ? " add" : "", strata_ggml_type_name(type), (long long)ne0,
       (long long)ne1, n_exp, n_slot, x_group, e, rc ? ": " : "", rc ? err.msg : "");
    if (!rc && e > 1.0)
        diag("  at %zu: gpu %.9g ref %.9g", worst, got[worst], ref[worst]);
    cudaFree(dw);
    if (du)
        cudaFree(du);
    cudaFree(dx);
    cudaFree(dids);
    cudaFree(dy);
    free(w);
    free(u);
    free(wf);
    free(uf);
    free(x);
    free(ids);
    free(add);
    free(ref);
    free(got);
}

/* The same row and input give bitwise equal results alone and inside a batch. */
static void test_matvec_batch_invariance(uint32_t type)
{
    struct strata_err err = {0, ""};
    int64_t ne0 = 2048, ne1 = 96;
    int nt = 7;
    size_t rb;
    uint8_t *w = kt_random_rows(type, ne0, ne1, &rb);
    float *x = (float *)malloc(sizeof(float) * ne0 * nt);
    kt_fill(x, ne0 * nt, 1.0f);
    void *dw = kt_up(w, rb * ne1);
    float *dx = (float *)kt_up(x, sizeof(float) * ne0 * nt);
    float *dy = (float *)kt_dev(sizeof(float) * ne1 * nt);
    float *one = (float *)malloc(sizeof(float) * ne1), *all = (float *)malloc(sizeof(float) * ne1 * nt);
    struct strata_k_weight kw = {type, ne0, ne1, rb, 0, dw};
    struct strata_k_mv_args a;
    memset(&a, 0, sizeof(a));
    a.w = &kw;
    a.n_slot = nt;
    a.x_group = 1;
    a.x = dx;
    a.x_stride = ne0;
    a.y = dy;
    a.y_stride = ne1;
    int rc = strata_k_matvec(&ctx, &a, &err);
    KT_CUDA(cudaDeviceSynchronize());
    kt_down(all, dy, sizeof(float) * ne1 * nt);
    int same = !rc;
    for (int t = 0; t < nt && same; t++) {
        a.n_slot = 1;
        a.x = dx + t * ne0;
        rc = strata_k_matvec(&ctx, &a, &err);
        KT_CUDA(cudaDeviceSynchronize());
        kt_down(one, dy, sizeof(float) * ne1);
        same = !rc && memcmp(one, all + t * ne1, sizeof(float) * ne1) == 0;
    }
    ok(same, "matvec %s: one-token results bitwise equal to a 7-token batch%s%s",
       strata_ggml_type_name(type), rc ? ": " : "", rc ? err.msg : "");
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dy);
    free(w);
    free(x);
    free(one);
    free(all);
}

/* Launch errors name the kernel and shapes. */
static void test_errors(void)
{
    struct strata_err err = {0, ""};
    struct strata_k_weight kw = {STRATA_TYPE_Q4_K, 100, 4, 0, 0, NULL};
    struct strata_k_mv_args a;
    memset(&a, 0, sizeof(a));
    a.w = &kw;
    a.n_slot = 1;
    a.x_group = 1;
    int rc = strata_k_matvec(&ctx, &a, &err);
    ok(rc == STRATA_E_INVALID && strstr(err.msg, "ne0=100"), "matvec refuses ne0 %% 256 != 0: %s",
       err.msg);
    kw.type = STRATA_TYPE_Q8_1;
    rc = strata_k_matvec(&ctx, &a, &err);
    ok(rc == STRATA_E_UNSUPPORTED, "matvec refuses Q8_1 weights: %s", err.msg);
}



/* ---- 8-bit activations (strata_k_quantize_q8, strata_k_matvec_q8) ---- */

/* The q8 rows yq of n_rows rows of n floats v follow the definition: per 32 values
 * d = max |v| / 127 and q = round-to-nearest-even(v / d), bit for bit.  Returns the
 * first mismatching value index, or -1. */
static long q8_mismatch(const float *v, const uint8_t *yq, int n, int n_rows)
{
    size_t rb = strata_k_q8_row_bytes(n);
    for (int r = 0; r < n_rows; r++) {
        const int8_t *q = (const int8_t *)(yq + r * rb);
        const float *d = (const float *)(yq + r * rb + n);
        for (int b = 0; b < n / 32; b++) {
            const float *vb = v + (size_t)r * n + 32 * b;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++)
                amax = fmaxf(amax, fabsf(vb[i]));
            float db = amax / 127.0f;
            if (memcmp(&db, &d[b], sizeof db) != 0)
                return (long)r * n + 32 * b;
            for (int i = 0; i < 32; i++)
                if (q[32 * b + i] != (db > 0.0f ? (int)nearbyintf(vb[i] / db) : 0))
                    return (long)r * n + 32 * b + i;
        }
    }
    return -1;
}

/* Dequantise q8 rows to floats (what the 8-bit mat-vec multiplies). */
static void q8_dequant(const uint8_t *yq, int n, int n_rows, float *out)
{
    size_t rb = strata_k_q8_row_bytes(n);
    for (int r = 0; r < n_rows; r++)
        for (int i = 0; i < n; i++)
            out[(size_t)r * n + i] = ((const float *)(yq + r * rb + n))[i / 32] *
                                     (float)((const int8_t *)(yq + r * rb))[i];
}

static void test_quantize_q8(int n, int n_rows, int norm, int with_w)
{
    struct strata_err err = {0, ""};
    size_t rb = strata_k_q8_row_bytes(n);
    float *x = (float *)malloc(sizeof(float) * n * n_rows), *w = (float *)malloc(sizeof(float) * n);
    float *ref = (float *)malloc(sizeof(float) * n * n_rows), *got = (float *)malloc(sizeof(float) * n * n_rows);
    uint8_t *q = (uint8_t *)malloc(rb * n_rows);
    kt_fill(x, (size_t)n * n_rows, 3.0f);
    kt_fill(w, n, 1.0f);
    x[5] = 0.0f; /* a zero value among non-zero ones */
    for (int r = 0; r < n_rows; r++) {
        double s = 0;
        for (int i = 0; i < n; i++)
            s += (double)x[r * n + i] * x[r * n + i];
        double sc = norm ? 1.0 / sqrt(s / n + 1e-6) : 1.0;
        for (int i = 0; i < n; i++)
            ref[r * n + i] = (float)(x[r * n + i] * sc * (norm && with_w ? w[i] : 1.0f));
    }
    float *dx = (float *)kt_up(x, sizeof(float) * n * n_rows), *dw = (float *)kt_up(w, sizeof(float) * n);
    float *dy = (float *)kt_dev(sizeof(float) * n * n_rows);
    void *dq = kt_dev(rb * n_rows);
    kt_poison(dy, sizeof(float) * n * n_rows);
    kt_poison(dq, rb * n_rows);
    int rc = strata_k_quantize_q8(&ctx, dx, n, n, n_rows, norm, with_w ? dw : NULL, 1e-6f, dy, dq,
                                  &err);
    KT_CUDA(cudaDeviceSynchronize());
    kt_down(got, dy, sizeof(float) * n * n_rows);
    kt_down(q, dq, rb * n_rows);
    size_t worst;
    double e = rc ? INFINITY : kt_err(got, ref, (size_t)n * n_rows, 1e-6, 1e-5, &worst);
    long bad = rc ? 0 : q8_mismatch(got, q, n, n_rows);
    ok(e <= 1 && bad < 0, "quantize_q8 n=%d rows=%d norm=%d w=%d: float err %.3g, q8 %s %s", n,
       n_rows, norm, with_w, e, bad < 0 ? "exact" : "differs", rc ? err.msg : "");
    if (!rc && bad >= 0)
        diag("  q8 differs at value %ld", bad);
    cudaFree(dx); cudaFree(dw); cudaFree(dy); cudaFree(dq);
    free(x); free(w); free(ref); free(got); free(q);
}

/* The 8-bit mat-vec against double sums over the decoded weights and the dequantised
 * q8 activations the GPU made.  mode PLAIN/GLU: n_slot slots over n_exp experts,
 * x_group slots per input row; COMBINE: n_slot tokens of k experts each.  q8_out: GLU
 * output also as q8 rows, checked against the float outputs. */
static void test_matvec_q8(uint32_t type, int64_t ne0, int64_t ne1, int n_exp, int n_slot,
                           int x_group, int k, int mode, int with_add, int q8_out, int fuse = 0)
{
    struct strata_err err = {0, ""};
    size_t rb;
    int glu = mode == STRATA_K_MVQ_GLU, comb = mode == STRATA_K_MVQ_COMBINE;
    int64_t nrow = ne1 * n_exp;
    uint8_t *w = kt_random_rows(type, ne0, nrow, &rb);
    uint8_t *u = glu ? kt_random_rows(type, ne0, nrow, &rb) : NULL;
    float *wf = (float *)malloc(sizeof(float) * ne0 * nrow);
    float *uf = glu ? (float *)malloc(sizeof(float) * ne0 * nrow) : NULL;
    int rc = strata_quant_dequant_ref(type, w, wf, ne0 * nrow, &err);
    if (!rc && glu)
        rc = strata_quant_dequant_ref(type, u, uf, ne0 * nrow, &err);
    int n_sl = comb ? n_slot * k : n_slot; /* expert slots */
    int n_x = comb ? n_sl : (n_slot + x_group - 1) / x_group;
    size_t xrb = strata_k_q8_row_bytes(ne0), yrb = strata_k_q8_row_bytes(ne1);
    float *x = (float *)malloc(sizeof(float) * ne0 * n_x), *xf = (float *)malloc(sizeof(float) * ne0 * n_x);
    uint8_t *xq = (uint8_t *)malloc(xrb * n_x);
    kt_fill(x, ne0 * n_x, 1.0f);
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * n_sl);
    float *cw = (float *)malloc(sizeof(float) * n_sl);
    for (int i = 0; i < n_sl; i++)
        ids[i] = (int32_t)(kt_u32() % n_exp);
    kt_fill(cw, n_sl, 1.0f);
    float *add = (float *)malloc(sizeof(float) * ne1 * n_slot);
    kt_fill(add, ne1 * n_slot, 1.0f);
    float *ref = (float *)malloc(sizeof(float) * ne1 * n_slot);
    float *got = (float *)malloc(sizeof(float) * ne1 * n_slot);
    uint8_t *gq = (uint8_t *)malloc(yrb * n_slot);
    float *dx = (float *)kt_up(x, sizeof(float) * ne0 * n_x);
    void *dxq = kt_dev(xrb * n_x);
    if (!rc)
        rc = strata_k_quantize_q8(&ctx, dx, ne0, (int)ne0, n_x, 0, NULL, 0.0f, NULL, dxq, &err);
    KT_CUDA(cudaDeviceSynchronize());
    kt_down(xq, dxq, xrb * n_x);
    q8_dequant(xq, (int)ne0, n_x, xf);
    double max_mag = 0;
    for (int t = 0; t < n_slot; t++)
        for (int64_t r = 0; r < ne1; r++) {
            double a = 0, b = 0, mag = 0, v = 0;
            for (int j = 0; j < (comb ? k : 1); j++) {
                int sl = comb ? t * k + j : t;
                const float *xs = xf + (size_t)(comb ? sl : sl / x_group) * ne0;
                const float *wr = wf + ((int64_t)ids[sl] * ne1 + r) * ne0;
                double aj = 0, mj = 0;
                for (int64_t i = 0; i < ne0; i++) {
                    aj += (double)wr[i] * xs[i];
                    mj += fabs((double)wr[i] * xs[i]);
                    if (glu)
                        b += (double)uf[((int64_t)ids[sl] * ne1 + r) * ne0 + i] * xs[i];
                }
                a += comb ? cw[sl] * aj : aj;
                mag += comb ? fabs(cw[sl]) * mj : mj;
            }
            v = glu ? a / (1 + exp(-a)) * b : a + (with_add ? add[t * ne1 + r] : 0);
            ref[t * ne1 + r] = (float)v;
            max_mag = fmax(max_mag, mag);
        }
    void *dw = kt_up(w, rb * nrow), *du = glu ? kt_up(u, rb * nrow) : NULL;
    int32_t *dids = (int32_t *)kt_up(ids, sizeof(int32_t) * n_sl);
    float *dcw = (float *)kt_up(cw, sizeof(float) * n_sl);
    float *dy = (float *)kt_dev(sizeof(float) * ne1 * n_slot);
    void *dyq = kt_dev(yrb * n_slot);
    if (with_add)
        KT_CUDA(cudaMemcpy(dy, add, sizeof(float) * ne1 * n_slot, cudaMemcpyHostToDevice));
    else
        kt_poison(dy, sizeof(float) * ne1 * n_slot);
    kt_poison(dyq, yrb * n_slot);
    struct strata_k_weight kw = {type, ne0, ne1, rb, rb * ne1, dw};
    struct strata_k_weight ku = {type, ne0, ne1, rb, rb * ne1, du};
    struct strata_k_mvq_args a;
    memset(&a, 0, sizeof(a));
    a.w = &kw;
    a.up = glu ? &ku : NULL;
    a.mode = mode;
    a.ids = n_exp > 1 || comb ? dids : NULL;
    if (!a.ids)
        for (int i = 0; i < n_sl; i++)
            ids[i] = 0;
    a.n_slot = n_slot;
    a.x_group = comb ? 1 : x_group;
    a.k = k;
    a.cw = dcw;
    a.xq = dxq;
    a.y = dy;
    a.y_stride = ne1;
    a.add = with_add ? dy : NULL;
    a.yq = q8_out ? dyq : NULL;
    /* fused RMSNorm of the outputs (PLAIN, COMBINE): launched twice, so that the second
     * launch proves the counters were reset */
    float *nw = (float *)malloc(sizeof(float) * ne1), *dnw = NULL, *dny = NULL;
    int *dcnt = NULL;
    void *dnyq = NULL;
    if (fuse) {
        kt_fill(nw, ne1, 1.0f);
        dnw = (float *)kt_up(nw, sizeof(float) * ne1);
        dny = (float *)kt_dev(sizeof(float) * ne1 * n_slot);
        dnyq = kt_dev(yrb * n_slot);
        dcnt = (int *)kt_dev(sizeof(int) * n_slot);
        KT_CUDA(cudaMemset(dcnt, 0, sizeof(int) * n_slot));
        kt_poison(dny, sizeof(float) * ne1 * n_slot);
        kt_poison(dnyq, yrb * n_slot);
        a.nw = dnw;
        a.eps = 1e-6f;
        a.ny = dny;
        a.nyq = dnyq;
        a.counter = dcnt;
        if (with_add) /* the second launch adds again: start from add - add */
            KT_CUDA(cudaMemset(dy, 0, sizeof(float) * ne1 * n_slot));
        if (!rc)
            rc = strata_k_matvec_q8(&ctx, &a, &err);
        if (with_add)
            KT_CUDA(cudaMemcpy(dy, add, sizeof(float) * ne1 * n_slot, cudaMemcpyHostToDevice));
        kt_poison(dny, sizeof(float) * ne1 * n_slot);
        kt_poison(dnyq, yrb * n_slot);
    }
    if (!rc)
        rc = strata_k_matvec_q8(&ctx, &a, &err);
    KT_CUDA(cudaDeviceSynchronize());
    kt_down(got, dy, sizeof(float) * ne1 * n_slot);
    kt_down(gq, dyq, yrb * n_slot);
    if (a.ids && mode != STRATA_K_MVQ_PLAIN && !fuse && !rc) {
        /* the same products through an expert table: even experts in VRAM buffers of
         * their own, odd ones in mapped host memory read over PCIe */
        const size_t mb = rb * (size_t)ne1;
        void **own = (void **)calloc(3 * (size_t)n_exp, sizeof(void *));
        const void **tab = (const void **)calloc(3 * (size_t)n_exp, sizeof(void *));
        for (int e = 0; e < n_exp; e++)
            for (int part = 0; part < 3; part++) {
                if (glu ? part == 2 : part != 2)
                    continue;
                const uint8_t *src = (part == 1 ? u : w) + (size_t)e * mb;
                void *dp = NULL;
                if (e % 2 == 0) {
                    dp = own[3 * e + part] = kt_up(src, mb);
                } else {
                    KT_CUDA(cudaHostAlloc(&own[3 * e + part], mb, cudaHostAllocMapped));
                    memcpy(own[3 * e + part], src, mb);
                    KT_CUDA(cudaHostGetDevicePointer(&dp, own[3 * e + part], 0));
                }
                tab[3 * e + part] = dp;
            }
        void *dtab = kt_up(tab, sizeof(void *) * 3 * (size_t)n_exp);
        float *got2 = (float *)malloc(sizeof(float) * ne1 * n_slot);
        uint8_t *gq2 = (uint8_t *)malloc(yrb * n_slot);
        int rt = 0;
        /* the launch again through a table (per expert, or per slot): the same bits? */
        auto again = [&](void *table, int by_slot) {
            if (with_add)
                KT_CUDA(cudaMemcpy(dy, add, sizeof(float) * ne1 * n_slot,
                                   cudaMemcpyHostToDevice));
            else
                kt_poison(dy, sizeof(float) * ne1 * n_slot);
            kt_poison(dyq, yrb * n_slot);
            a.etab = (const void *const *)table;
            a.etab_slot = by_slot;
            if (!rt)
                rt = strata_k_matvec_q8(&ctx, &a, &err);
            a.etab = NULL;
            a.etab_slot = 0;
            KT_CUDA(cudaDeviceSynchronize());
            kt_down(got2, dy, sizeof(float) * ne1 * n_slot);
            kt_down(gq2, dyq, yrb * n_slot);
            return !rt && memcmp(got, got2, sizeof(float) * ne1 * n_slot) == 0 &&
                   (!q8_out || memcmp(gq, gq2, yrb * n_slot) == 0);
        };
        int same = again(dtab, 0);
        /* and through pointers resolved per slot (etab_slot) */
        const void **stab = (const void **)calloc(3 * (size_t)n_sl, sizeof(void *));
        for (int i = 0; i < n_sl; i++)
            for (int part = 0; part < 3; part++)
                stab[3 * i + part] = tab[3 * (size_t)ids[i] + part];
        void *dstab = kt_up(stab, sizeof(void *) * 3 * (size_t)n_sl);
        int same_slot = again(dstab, 1);
        ok(same_slot, "matvec_q8 mode %d %s through pointers resolved per slot: %s%s", mode,
           strata_ggml_type_name(type), same_slot ? "the stacks' bits" : "other results",
           rt ? err.msg : "");
        cudaFree(dstab);
        free(stab);
        ok(same, "matvec_q8 mode %d %s through an expert table (VRAM buffers and mapped host "
           "memory): %s%s", mode, strata_ggml_type_name(type),
           same ? "the stacks' bits" : "other results", rt ? err.msg : "");
        for (int i = 0; i < 3 * n_exp; i++)
            if (own[i] && i / 3 % 2 == 0)
                cudaFree(own[i]);
            else if (own[i])
                cudaFreeHost(own[i]);
        cudaFree(dtab);
        free(own); free(tab); free(got2); free(gq2);
    }
    if (fuse && !rc) {
        float *gn = (float *)malloc(sizeof(float) * ne1 * n_slot), *rn = (float *)malloc(sizeof(float) * ne1 * n_slot);
        uint8_t *gnq = (uint8_t *)malloc(yrb * n_slot);
        int cnt[64];
        kt_down(gn, dny, sizeof(float) * ne1 * n_slot);
        kt_down(gnq, dnyq, yrb * n_slot);
        kt_down(cnt, dcnt, sizeof(int) * n_slot);
        for (int t = 0; t < n_slot; t++) {
            double ss = 0;
            for (int64_t r = 0; r < ne1; r++)
                ss += (double)got[t * ne1 + r] * got[t * ne1 + r];
            double sc = 1.0 / sqrt(ss / ne1 + 1e-6);
            for (int64_t r = 0; r < ne1; r++)
                rn[t * ne1 + r] = (float)(got[t * ne1 + r] * sc * nw[r]);
        }
        size_t wn;
        double en = kt_err(gn, rn, ne1 * n_slot, 1e-6, 1e-5, &wn);
        long badn = q8_mismatch(gn, gnq, (int)ne1, n_slot);
        int zero = 1;
        for (int t = 0; t < n_slot; t++)
            zero &= cnt[t] == 0;
        ok(en <= 1 && badn < 0 && zero,
           "matvec_q8 mode %d %s fused rms_norm of %d rows: err %.3g, q8 %s, counters %s", mode,
           strata_ggml_type_name(type), n_slot, en, badn < 0 ? "exact" : "differ",
           zero ? "reset" : "left set");
        free(gn); free(rn); free(gnq);
        cudaFree(dnw); cudaFree(dny); cudaFree(dnyq); cudaFree(dcnt);
    }
    free(nw);
    size_t worst = 0;
    double atol = 2e-6 * max_mag * (glu ? max_mag + 1 : 1) + 1e-6;
    double e = rc ? INFINITY : kt_err(got, ref, ne1 * n_slot, atol, 1e-5, &worst);
    long bad = !rc && q8_out ? q8_mismatch(got, gq, (int)ne1, n_slot) : -1;
    const char *mn = glu ? " glu" : comb ? " combine" : "";
    ok(e <= 1 && bad < 0, "matvec_q8%s%s%s %s [%lld x %lld] x%d experts, %d slots/%d k=%d: err %.3g%s%s",
       mn, with_add ? " add" : "", q8_out ? " q8-out" : "", strata_ggml_type_name(type),
       (long long)ne0, (long long)ne1, n_exp, n_slot, x_group, k, e, rc ? ": " : "",
       rc ? err.msg : "");
    if (!rc && e > 1)
        diag("  at %zu: gpu %.9g ref %.9g", worst, got[worst], ref[worst]);
    if (bad >= 0)
        diag("  q8 output differs at value %ld", bad);
    cudaFree(dw); if (du) cudaFree(du); cudaFree(dx); cudaFree(dxq); cudaFree(dids);
    cudaFree(dcw); cudaFree(dy); cudaFree(dyq);
    free(w); free(u); free(wf); free(uf); free(x); free(xf); free(xq); free(ids); free(cw);
    free(add); free(ref); free(got); free(gq);
}

/* A PLAIN 8-bit mat-vec's arguments for kw: n_slot slots, x_group slots per input row,
 * output rows of kw->ne1 values; the rest zero. */
static void plain_args(struct strata_k_mvq_args *a, const struct strata_k_weight *kw, int n_slot,
                       int x_group)
{
    memset(a, 0, sizeof(*a));
    a->w = kw;
    a->mode = STRATA_K_MVQ_PLAIN;
    a->n_slot = n_slot;
    a->x_group = x_group;
    a->y_stride = kw->ne1;
}

/* The staged PLAIN kernel (rows through shared memory) and, without expert ids, the
 * streamed one (chunks of rows through two shared buffers, every slot from one copy)
 * give the bits of the direct one, expert ids and token groups included. */
static void test_matvec_q8_stage(uint32_t type, int64_t ne0, int64_t ne1, int n_exp, int n_slot,
                                 int x_group)
{
    struct strata_err err = {0, ""};
    size_t rb, xrb = strata_k_q8_row_bytes(ne0);
    int n_x = (n_slot + x_group - 1) / x_group;
    uint8_t *w = kt_random_rows(type, ne0, ne1 * n_exp, &rb);
    float *x = (float *)malloc(sizeof(float) * ne0 * n_x);
    kt_fill(x, ne0 * n_x, 1.0f);
    int32_t ids[17];
    for (int i = 0; i < n_slot; i++)
        ids[i] = (int32_t)(kt_u32() % n_exp);
    void *dw = kt_up(w, rb * ne1 * n_exp);
    float *dx = (float *)kt_up(x, sizeof(float) * ne0 * n_x);
    int32_t *dids = (int32_t *)kt_up(ids, sizeof ids);
    void *dxq = kt_dev(xrb * n_x);
    const size_t yb = sizeof(float) * ne1 * n_slot;
    const int n_way = n_exp > 1 ? 2 : 3, stages[3] = {-1, 1, 2};
    const char *names[3] = {"direct", "staged", "streamed"};
    float *dy[3], *y[3];
    for (int v = 0; v < n_way; v++) {
        dy[v] = (float *)kt_dev(yb);
        y[v] = (float *)malloc(yb);
        kt_poison(dy[v], yb);
    }
    struct strata_k_weight kw = {type, ne0, ne1, rb, rb * ne1, dw};
    struct strata_k_mvq_args a;
    plain_args(&a, &kw, n_slot, x_group);
    a.ids = n_exp > 1 ? dids : NULL;
    a.xq = dxq;
    int rc = strata_k_quantize_q8(&ctx, dx, ne0, (int)ne0, n_x, 0, NULL, 0.0f, NULL, dxq, &err);
    unsigned long streamed = 0;
    for (int v = 0; v < n_way && !rc; v++) {
        a.y = dy[v];
        a.stage = stages[v];
        const unsigned long before = strata_k_mvq_stream_launches();
        rc = strata_k_matvec_q8(&ctx, &a, &err);
        if (v == 2)
            streamed = strata_k_mvq_stream_launches() - before;
    }
    KT_CUDA(cudaDeviceSynchronize());
    for (int v = 1; v < n_way; v++) {
        kt_down(y[0], dy[0], yb);
        kt_down(y[v], dy[v], yb);
        int same = !rc && memcmp(y[0], y[v], yb) == 0;
        /* the streamed way must have run, not its fallback */
        int ran = v != 2 || streamed == 1;
        ok(same && ran, "matvec_q8 %s %s [%lld x %lld] x%d experts, %d slots/%d: %s%s %s",
           names[v], strata_ggml_type_name(type), (long long)ne0, (long long)ne1, n_exp, n_slot,
           x_group, same ? "same bits as direct" : "differs from direct",
           ran ? "" : " (but the streamed kernel did not run)", rc ? err.msg : "");
    }
    cudaFree(dw); cudaFree(dx); cudaFree(dids); cudaFree(dxq);
    for (int v = 0; v < n_way; v++) {
        cudaFree(dy[v]);
        free(y[v]);
    }
    free(w); free(x);
}

/* A product that normalises its input rows itself (strata_k_mvq_args.in_norm) against
 * quantize_q8 followed by the product: the outputs, and the normed rows it leaves in
 * global memory (floats and q8), must be the same bits; then the same launch's last
 * slot alone (a window against a decode). */
static void test_matvec_q8_innorm(uint32_t type, int64_t ne0, int64_t ne1, int n_slot,
                                  int streams)
{
    struct strata_err err = {0, ""};
    size_t rb, xrb = strata_k_q8_row_bytes(ne0);
    uint8_t *w = kt_random_rows(type, ne0, ne1, &rb);
    const size_t nx = (size_t)ne0 * n_slot, yb = sizeof(float) * ne1 * n_slot;
    float *x = (float *)malloc(4 * nx), *nw = (float *)malloc(4 * ne0);
    kt_fill(x, nx, 3.0f);
    kt_fill(nw, ne0, 1.0f);
    void *dw = kt_up(w, rb * ne1);
    float *dx = (float *)kt_up(x, 4 * nx), *dnw = (float *)kt_up(nw, 4 * ne0);
    float *dxn[3], *dy[3];
    void *dxq[3];
    for (int v = 0; v < 3; v++) {
        dxn[v] = (float *)kt_dev(4 * nx);
        dxq[v] = kt_dev(xrb * n_slot);
        kt_poison(dxn[v], 4 * nx);
        kt_poison(dxq[v], xrb * n_slot);
    }
    for (int v = 0; v < 3; v++) {
        dy[v] = (float *)kt_dev(yb);
        kt_poison(dy[v], yb);
    }
    struct strata_k_weight kw = {type, ne0, ne1, rb, rb * ne1, dw};
    struct strata_k_mvq_args a;
    plain_args(&a, &kw, n_slot, 1);
    /* v 0: two launches; v 1: one; v 2: one, the last slot alone */
    int rc = strata_k_quantize_q8(&ctx, dx, ne0, (int)ne0, n_slot, 1, dnw, 1e-6f, dxn[0],
                                  dxq[0], &err);
    a.xq = dxq[0];
    a.y = dy[0];
    if (!rc)
        rc = strata_k_matvec_q8(&ctx, &a, &err);
    struct strata_k_norm_q8 nn = {dnw, 1e-6f, dxn[1], dxq[1]}, n1 = {dnw, 1e-6f, dxn[2], dxq[2]};
    a.xq = NULL;
    a.x_in = dx;
    a.in_norm = &nn;
    a.y = dy[1];
    const unsigned long before = strata_k_mvq_stream_launches();
    if (!rc)
        rc = strata_k_matvec_q8(&ctx, &a, &err);
    a.n_slot = 1;
    a.x_in = dx + (size_t)(n_slot - 1) * ne0;
    a.in_norm = &n1;
    a.y = dy[2];
    if (!rc)
        rc = strata_k_matvec_q8(&ctx, &a, &err);
    const unsigned long ran = strata_k_mvq_stream_launches() - before;
    KT_CUDA(cudaDeviceSynchronize());
    float *y0 = (float *)malloc(yb), *y1 = (float *)malloc(yb), *y2 = (float *)malloc(yb);
    float *n0 = (float *)malloc(4 * nx), *hn1 = (float *)malloc(4 * nx);
    float *hn2 = (float *)malloc(4 * ne0);
    uint8_t *q0 = (uint8_t *)malloc(xrb * n_slot), *q1 = (uint8_t *)malloc(xrb * n_slot);
    uint8_t *q2 = (uint8_t *)malloc(xrb);
    kt_down(y0, dy[0], yb);
    kt_down(y1, dy[1], yb);
    kt_down(y2, dy[2], sizeof(float) * ne1);
    kt_down(n0, dxn[0], 4 * nx);
    kt_down(q0, dxq[0], xrb * n_slot);
    int same_y = !rc && memcmp(y0, y1, yb) == 0;
    int same_1 = !rc && memcmp(y2, y1 + (size_t)(n_slot - 1) * ne1, sizeof(float) * ne1) == 0;
    kt_down(hn1, dxn[1], 4 * nx);
    kt_down(q1, dxq[1], xrb * n_slot);
    kt_down(hn2, dxn[2], 4 * ne0);
    kt_down(q2, dxq[2], xrb);
    /* the rows each launch left: every row of the n_slot launch, the one-slot launch's
     * row (each q8 row's quants and scales; quantize_q8 leaves the padding unwritten) */
    const size_t lastn = (size_t)(n_slot - 1) * ne0, lastq = (size_t)(n_slot - 1) * xrb;
    const size_t used = (size_t)ne0 + (size_t)ne0 / 8;
    int same_n = !rc && memcmp(n0, hn1, 4 * nx) == 0 && memcmp(n0 + lastn, hn2, 4 * ne0) == 0;
    int same_q = !rc && memcmp(q0 + lastq, q2, used) == 0;
    for (int r = 0; r < n_slot; r++)
        same_q = same_q && memcmp(q0 + r * xrb, q1 + r * xrb, used) == 0;
    int way = rc || ran == (unsigned long)(streams ? 2 : 0);
    ok(same_y && same_1 && same_n && same_q && way,
       "matvec_q8 with its input RMSNorm %s [%lld x %lld], %d slots: outputs %s, the last slot "
       "alone %s, normed rows left %s, q8 rows %s, %lu streamed launches of 2 (expected %d) %s",
       strata_ggml_type_name(type), (long long)ne0, (long long)ne1, n_slot,
       same_y ? "equal" : "differ", same_1 ? "the same bits" : "other bits",
       same_n ? "equal" : "differ", same_q ? "equal" : "differ", ran, streams ? 2 : 0,
       rc ? err.msg : "");
    cudaFree(dw); cudaFree(dx); cudaFree(dnw);
    for (int v = 0; v < 3; v++) {
        cudaFree(dxn[v]);
        cudaFree(dxq[v]);
        cudaFree(dy[v]);
    }
    free(w); free(x); free(nw); free(y0); free(y1); free(y2); free(n0); free(hn1); free(hn2);
    free(q0); free(q1); free(q2);
}

/* The argmax folded into a streamed one-slot product (strata_k_mvq_args.argmax_key):
 * the key names the row the host finds largest in the launch's own output, then the
 * lower of two equal rows (the winning row's bytes copied to a lower row); the launch
 * says it did it.  The same launch writes its rows to mapped host memory too
 * (strata_k_mvq_args.y_host): the same bits as y, and says so.  Two slots with a key
 * are refused, and two with a host row.  in_norm: the output projection's way (its
 * input normed in the launch), else streamed on request (stage 2). */
static void test_argmax_key(uint32_t type, int64_t ne0, int64_t ne1, int in_norm)
{
    struct strata_err err = {0, ""};
    size_t rb, xrb = strata_k_q8_row_bytes(ne0);
    uint8_t *w = kt_random_rows(type, ne0, ne1, &rb);
    float *x = (float *)malloc(4 * ne0), *nw = (float *)malloc(4 * ne0);
    float *y = (float *)malloc(sizeof(float) * ne1);
    kt_fill(x, ne0, 3.0f);
    kt_fill(nw, ne0, 1.0f);
    void *dw = kt_up(w, rb * ne1), *dxq = kt_dev(xrb);
    float *dx = (float *)kt_up(x, 4 * ne0), *dnw = (float *)kt_up(nw, 4 * ne0);
    float *dxn = (float *)kt_dev(4 * ne0), *dy = (float *)kt_dev(sizeof(float) * ne1);
    unsigned long long *dkey = (unsigned long long *)kt_dev(8);
    float *hy = NULL, *hyd = NULL; /* the host row, and the device's address of it */
    KT_CUDA(cudaHostAlloc((void **)&hy, sizeof(float) * ne1, cudaHostAllocMapped));
    KT_CUDA(cudaHostGetDevicePointer((void **)&hyd, hy, 0));
    struct strata_k_weight kw = {type, ne0, ne1, rb, rb * ne1, dw};
    struct strata_k_norm_q8 nn = {dnw, 1e-6f, dxn, dxq};
    int rc = in_norm ? 0 : strata_k_quantize_q8(&ctx, dx, ne0, (int)ne0, 1, 0, NULL, 0.0f,
                                                NULL, dxq, &err);
    int good = !rc, done_all = 1, refused = 0, host_same = 1, refused_host = 0;
    int64_t first = -1, second = -1;
    for (int round = 0; round < 2 && !rc; round++) {
        /* 0: as drawn; 1: the winner's row copied to a lower row (row 0's to row 1 when
         * row 0 won) */
        struct strata_k_mvq_args a;
        plain_args(&a, &kw, 1, 1);
        a.stage = 2;
        if (in_norm) {
            a.x_in = dx;
            a.in_norm = &nn;
        } else {
            a.xq = dxq;
        }
        a.y = dy;
        int done = -1, hdone = -1;
        a.argmax_key = dkey;
        a.argmax_done = &done;
        a.y_host = hyd;
        a.y_host_done = &hdone;
        KT_CUDA(cudaMemset(dkey, 0, 8));
        kt_poison(dy, sizeof(float) * ne1);
        memset(hy, 0xff, sizeof(float) * ne1);
        rc = strata_k_matvec_q8(&ctx, &a, &err);
        KT_CUDA(cudaDeviceSynchronize());
        unsigned long long key = 0;
        kt_down(&key, dkey, 8);
        kt_down(y, dy, sizeof(float) * ne1);
        int64_t best = -1;
        for (int64_t r = 0; r < ne1; r++)
            if (y[r] == y[r] && (best < 0 || y[r] > y[best]))
                best = r;
        const int64_t got = key ? (int64_t)(uint32_t)~(uint32_t)key : -1;
        good = good && !rc && got == best && done == 1;
        done_all = done_all && done == 1 && hdone == 1;
        host_same = host_same && !memcmp(hy, y, sizeof(float) * ne1);
        if (round == 0) {
            first = best;
            /* a lower row takes the winner's bytes: the tie goes to it */
            const int64_t to = best > 0 ? best / 2 : 1;
            memcpy(w + (size_t)to * rb, w + (size_t)best * rb, rb);
            second = best > 0 ? to : 0;
        } else if (round == 1) {
            good = good && best == second;
        }
        KT_CUDA(cudaMemcpy(dw, w, rb * ne1, cudaMemcpyHostToDevice));
        if (round == 1) {
            struct strata_k_mvq_args b = a;
            b.n_slot = 2;
            refused = strata_k_matvec_q8(&ctx, &b, &err) == STRATA_E_INVALID;
            b.argmax_key = NULL;
            b.argmax_done = NULL;
            refused_host = strata_k_matvec_q8(&ctx, &b, &err) == STRATA_E_INVALID;
        }
    }
    ok(good && done_all && host_same && refused && refused_host,
       "argmax key and host row of a streamed %s [%lld x %lld]%s: the largest row (%lld, "
       "then the lower of two equal rows, %lld) %s, the host row %s, the launch %s, two "
       "slots %s / %s %s",
       strata_ggml_type_name(type), (long long)ne0, (long long)ne1,
       in_norm ? " with its input norm" : "", (long long)first, (long long)second,
       good ? "found" : "missed", host_same ? "the same bits" : "differs",
       done_all ? "did both" : "left one", refused ? "refused" : "taken",
       refused_host ? "refused" : "taken", rc ? err.msg : "");
    cudaFree(dw); cudaFree(dxq); cudaFree(dx); cudaFree(dnw); cudaFree(dxn); cudaFree(dy);
    cudaFree(dkey);
    cudaFreeHost(hy);
    free(w); free(x); free(nw); free(y);
}

/* The q/k/v post inside the streamed q/k/v product (strata_k_mvq_args.post) and a
 * separate v product's rows stored into the v cache by the product (y16), against the
 * product followed by strata_k_qkv_post: q rows, k cache and v cache the same bits.
 * n_qkv 3: q, k and v rows in one product; 2: q and k, v apart (type vtype).  The fused
 * way runs twice (its outputs poisoned between), so a head counter left non-zero shows
 * as a second run that never posts; the counters must be zero after.  fused: whether
 * the product can do the post (a streamed launch); where it says it did not, the post
 * follows as its own launch (as the backend does); -1: no post asked for (the post
 * apart, after the product and its second weight).  fold (n_qkv 2): -1, v's product
 * apart; 0 or 1, v passed as the q/k product's second weight (strata_k_mvq_args.w2),
 * with whether the launch can take it (else v's product follows apart). */
static void test_qkv_post_fused(uint32_t type, uint32_t vtype, int64_t ne0, int n_slot,
                                int n_head, int n_head_kv, int hd, int n_qkv, int pos0,
                                int fused, int fold)
{
    struct strata_err err = {0, ""};
    const int nq = n_head * hd, nkv = n_head_kv * hd, qs = nq + 2 * nkv;
    const int64_t ne1 = nq + (n_qkv - 1) * (int64_t)nkv, heads = n_head + 2 * n_head_kv;
    const int n_ctx = pos0 + n_slot + 2;
    size_t rb, vrb = 0;
    uint8_t *w = kt_random_rows(type, ne0, ne1, &rb);
    uint8_t *wv = n_qkv == 2 ? kt_random_rows(vtype, ne0, nkv, &vrb) : NULL;
    const size_t nx = (size_t)ne0 * n_slot, yb = sizeof(float) * qs * n_slot;
    const size_t xrb = strata_k_q8_row_bytes(ne0), cb = sizeof(__half) * n_ctx * nkv;
    float *x = (float *)malloc(4 * nx), *nw = (float *)malloc(4 * ne0);
    float *qn = (float *)malloc(4 * hd), *kn = (float *)malloc(4 * hd);
    kt_fill(x, nx, 3.0f);
    kt_fill(nw, ne0, 1.0f);
    kt_fill(qn, hd, 1.0f);
    kt_fill(kn, hd, 1.0f);
    void *dw = kt_up(w, rb * ne1), *dwv = wv ? kt_up(wv, vrb * nkv) : NULL;
    float *dx = (float *)kt_up(x, 4 * nx), *dnw = (float *)kt_up(nw, 4 * ne0);
    float *dqn = (float *)kt_up(qn, 4 * hd), *dkn = (float *)kt_up(kn, 4 * hd);
    int32_t *dpos = (int32_t *)kt_up(&pos0, 4);
    int *dcnt = (int *)kt_dev(sizeof(int) * heads);
    KT_CUDA(cudaMemset(dcnt, 0, sizeof(int) * heads));
    float *dxn = (float *)kt_dev(4 * nx), *dy[2];
    void *dxq = kt_dev(xrb * n_slot);
    __half *kc[2], *vc[2];
    for (int v = 0; v < 2; v++) {
        dy[v] = (float *)kt_dev(yb);
        kc[v] = (__half *)kt_dev(cb);
        vc[v] = (__half *)kt_dev(cb);
    }
    struct strata_k_rope rp;
    strata_k_rope_init(&rp, 2, hd, 1000000.0f, 1.0f, 4096, 0.0f, 1.0f, 32.0f, 1.0f);
    struct strata_k_weight kw = {type, ne0, ne1, rb, rb * ne1, dw};
    struct strata_k_weight kv = {vtype, ne0, nkv, vrb, vrb * nkv, dwv};
    struct strata_k_norm_q8 nn = {dnw, 1e-6f, dxn, dxq};
    int rc = 0, done[2] = {0, 0}, folded[2] = {-1, -1}, cnt_zero = 1;
    uint16_t *h[2][2];
    float *hq[2];
    for (int v = 0; v < 2; v++) {
        hq[v] = (float *)malloc(yb);
        h[v][0] = (uint16_t *)malloc(cb);
        h[v][1] = (uint16_t *)malloc(cb);
    }
    /* way 0: product(s), then qkv_post; way 1: fused, twice */
    for (int run = 0; run < 3 && !rc; run++) {
        const int v = run ? 1 : 0;
        kt_poison(dy[v], yb);
        kt_poison(kc[v], cb);
        kt_poison(vc[v], cb);
        struct strata_k_qkv_args qa;
        memset(&qa, 0, sizeof(qa));
        qa.q = dy[v]; qa.k = dy[v] + nq; qa.v = dy[v] + nq + nkv;
        qa.q_stride = qa.k_stride = qa.v_stride = qs;
        qa.q_norm = dqn; qa.k_norm = dkn; qa.eps = 1e-6f; qa.rope = &rp; qa.pos0 = dpos;
        qa.n_tok = n_slot; qa.n_head = n_head; qa.n_head_kv = n_head_kv; qa.hd = hd;
        qa.k_cache = kc[v]; qa.v_cache = vc[v];
        struct strata_k_mvq_args a;
        plain_args(&a, &kw, n_slot, 1);
        a.x_in = dx;
        a.in_norm = &nn;
        a.y = dy[v];
        a.y_stride = qs;
        int pd = -1, wd = -1;
        if (v) {
            if (fused >= 0) {
                a.post = &qa;
                a.post_counters = dcnt;
                a.post_done = &pd;
            } else {
                pd = 0;
            }
            if (n_qkv == 2 && fold >= 0) {
                a.w2 = &kv;
                a.w2_done = &wd;
            }
        }
        rc = strata_k_matvec_q8(&ctx, &a, &err);
        if (v)
            folded[run - 1] = wd;
        if (!rc && n_qkv == 2 && wd != 1) {
            plain_args(&a, &kv, n_slot, 1);
            a.xq = dxq;
            a.y = qa.v;
            a.y_stride = qs;
            if (v && pd == 1) {
                a.y16 = vc[v];
                a.y16_pos = dpos;
                a.y16_stride = nkv;
            }
            rc = strata_k_matvec_q8(&ctx, &a, &err);
        }
        if (!rc && (!v || pd == 0))
            rc = strata_k_qkv_post(&ctx, &qa, &err);
        KT_CUDA(cudaDeviceSynchronize());
        if (v)
            done[run - 1] = pd;
        int hc[64];
        kt_down(hc, dcnt, sizeof(int) * (heads < 64 ? heads : 64));
        for (int i = 0; i < heads && i < 64; i++)
            cnt_zero = cnt_zero && hc[i] == 0;
        kt_down(hq[v], dy[v], yb);
        kt_down(h[v][0], kc[v], cb);
        kt_down(h[v][1], vc[v], cb);
        if (run == 1)
            continue;
        /* q rows of every slot (the k and v floats are not compared: the fused way leaves
         * them as the product wrote them, the post only reads them), the cache rows */
        int same_q = 1;
        for (int t = 0; t < n_slot; t++)
            same_q = same_q && memcmp(hq[0] + (size_t)t * qs, hq[1] + (size_t)t * qs,
                                      4 * (size_t)nq) == 0;
        const size_t off = (size_t)pos0 * nkv, n16 = 2 * (size_t)n_slot * nkv;
        const int same_k = memcmp(h[0][0] + off, h[1][0] + off, n16) == 0;
        const int same_v = memcmp(h[0][1] + off, h[1][1] + off, n16) == 0;
        if (run == 2)
            ok(!rc && same_q && same_k && same_v &&
                   (fused < 0 || (done[0] == fused && done[1] == fused)) &&
                   (fold < 0 || n_qkv != 2 || (folded[0] == fold && folded[1] == fold)) &&
                   cnt_zero,
               "q/k/v post inside the streamed product, %s%s%s [%lld x %lld], %d slots, heads "
               "%d/%d hd=%d: q rows %s, k cache %s, v cache %s, done %d/%d (expected %d), v "
               "folded %d/%d (expected %d), counters %s %s",
               strata_ggml_type_name(type), n_qkv == 2 ? ", v apart " : "",
               n_qkv == 2 ? strata_ggml_type_name(vtype) : "", (long long)ne0, (long long)ne1,
               n_slot, n_head, n_head_kv, hd, same_q ? "equal" : "differ",
               same_k ? "equal" : "differ", same_v ? "equal" : "differ", done[0], done[1],
               fused, folded[0], folded[1], fold, cnt_zero ? "zero" : "left set",
               rc ? err.msg : "");
    }
    if (rc)
        ok(0, "q/k/v post inside the streamed product: %s", err.msg);
    cudaFree(dw); cudaFree(dwv); cudaFree(dx); cudaFree(dnw); cudaFree(dqn); cudaFree(dkn);
    cudaFree(dpos); cudaFree(dcnt); cudaFree(dxn); cudaFree(dxq);
    for (int v = 0; v < 2; v++) {
        cudaFree(dy[v]); cudaFree(kc[v]); cudaFree(vc[v]);
        free(hq[v]); free(h[v][0]); free(h[v][1]);
    }
    free(w); free(wv); free(x); free(nw); free(qn); free(kn);
}

/* A token's rows alone equal its rows inside a 7-token batch, bit for bit, in every
 * mode (the verify window guarantee). */
static void test_matvec_q8_batch_invariance(uint32_t type, int mode)
{
    struct strata_err err = {0, ""};
    int64_t ne0 = 1024, ne1 = 96;
    int nt = 7, k = mode == STRATA_K_MVQ_COMBINE ? 4 : 1, n_exp = 5;
    int n_x = nt * k;
    size_t rb, xrb = strata_k_q8_row_bytes(ne0), yrb = strata_k_q8_row_bytes(ne1);
    uint8_t *w = kt_random_rows(type, ne0, ne1 * n_exp, &rb);
    uint8_t *u = kt_random_rows(type, ne0, ne1 * n_exp, &rb);
    float *x = (float *)malloc(sizeof(float) * ne0 * n_x);
    kt_fill(x, ne0 * n_x, 1.0f);
    int32_t ids[28];
    float cw[28];
    for (int i = 0; i < n_x; i++)
        ids[i] = (int32_t)(kt_u32() % n_exp);
    kt_fill(cw, n_x, 1.0f);
    void *dw = kt_up(w, rb * ne1 * n_exp), *du = kt_up(u, rb * ne1 * n_exp);
    float *dx = (float *)kt_up(x, sizeof(float) * ne0 * n_x);
    int32_t *dids = (int32_t *)kt_up(ids, sizeof ids);
    float *dcw = (float *)kt_up(cw, sizeof cw), *dy = (float *)kt_dev(sizeof(float) * ne1 * nt);
    uint8_t *dxq = (uint8_t *)kt_dev(xrb * n_x), *dyq = (uint8_t *)kt_dev(yrb * nt);
    float *one = (float *)malloc(sizeof(float) * ne1), *all = (float *)malloc(sizeof(float) * ne1 * nt);
    uint8_t *oneq = (uint8_t *)malloc(yrb), *allq = (uint8_t *)malloc(yrb * nt);
    struct strata_k_weight kw = {type, ne0, ne1, rb, rb * ne1, dw};
    struct strata_k_weight ku = {type, ne0, ne1, rb, rb * ne1, du};
    int rc = strata_k_quantize_q8(&ctx, dx, ne0, (int)ne0, n_x, 0, NULL, 0.0f, NULL, dxq, &err);
    struct strata_k_mvq_args a;
    memset(&a, 0, sizeof(a));
    a.w = &kw;
    a.up = &ku;
    a.mode = mode;
    a.ids = dids;
    a.n_slot = nt;
    a.x_group = 1;
    a.k = k;
    a.cw = dcw;
    a.xq = dxq;
    a.y = dy;
    a.y_stride = ne1;
    a.yq = mode == STRATA_K_MVQ_GLU ? dyq : NULL;
    if (!rc)
        rc = strata_k_matvec_q8(&ctx, &a, &err);
    KT_CUDA(cudaDeviceSynchronize());
    kt_down(all, dy, sizeof(float) * ne1 * nt);
    kt_down(allq, dyq, yrb * nt);
    int same = !rc;
    for (int t = 0; t < nt && same; t++) {
        a.n_slot = 1;
        a.ids = dids + t * k;
        a.cw = dcw + t * k;
        a.xq = dxq + xrb * t * k;
        rc = strata_k_matvec_q8(&ctx, &a, &err);
        KT_CUDA(cudaDeviceSynchronize());
        kt_down(one, dy, sizeof(float) * ne1);
        kt_down(oneq, dyq, yrb);
        same = !rc && memcmp(one, all + t * ne1, sizeof(float) * ne1) == 0 &&
               (!a.yq || memcmp(oneq, allq + yrb * t, yrb) == 0);
    }
    ok(same, "matvec_q8 mode %d %s: one-token results bitwise equal to a 7-token batch%s%s",
       mode, strata_ggml_type_name(type), rc ? ": " : "", rc ? err.msg : "");
    cudaFree(dw); cudaFree(du); cudaFree(dx); cudaFree(dids); cudaFree(dcw); cudaFree(dy);
    cudaFree(dxq); cudaFree(dyq);
    free(w); free(u); free(x); free(one); free(all); free(oneq); free(allq);
}

/* Router and routing in one launch: the logits against double sums, the ids and
 * weights against the separate routing kernel on the same logits; twice, so that the
 * second launch proves the counters were reset. */
static void test_router_topk(int n_tok, int n_expert, int n, int k, int norm)
{
    struct strata_err err = {0, ""};
    float *w = (float *)malloc(sizeof(float) * n_expert * n), *x = (float *)malloc(sizeof(float) * n_tok * n);
    float *ref = (float *)malloc(sizeof(float) * n_tok * n_expert), *got = (float *)malloc(sizeof(float) * n_tok * n_expert);
    kt_fill(w, (size_t)n_expert * n, 1.0f);
    kt_fill(x, (size_t)n_tok * n, 1.0f);
    double max_mag = kt_router_ref(w, x, n, n_expert, n_tok, ref);
    float *dw = (float *)kt_up(w, sizeof(float) * n_expert * n), *dx = (float *)kt_up(x, sizeof(float) * n_tok * n);
    float *dl = (float *)kt_dev(sizeof(float) * n_tok * n_expert);
    float *dwt = (float *)kt_dev(sizeof(float) * n_tok * k), *dwt2 = (float *)kt_dev(sizeof(float) * n_tok * k);
    int32_t *di = (int32_t *)kt_dev(sizeof(int32_t) * n_tok * k), *di2 = (int32_t *)kt_dev(sizeof(int32_t) * n_tok * k);
    int *dc = (int *)kt_dev(sizeof(int) * n_tok);
    KT_CUDA(cudaMemset(dc, 0, sizeof(int) * n_tok));
    struct strata_k_weight kw = {STRATA_TYPE_F32, n, n_expert, 4 * (size_t)n, 0, dw};
    int rc = 0;
    for (int rep = 0; rep < 2 && !rc; rep++) {
        kt_poison(dl, sizeof(float) * n_tok * n_expert);
        kt_poison(di, sizeof(int32_t) * n_tok * k);
        rc = strata_k_moe_router_topk(&ctx, &kw, dx, n_tok, dl, dc, k, norm, 0.5f, di, dwt, NULL,
                                      NULL, &err);
    }
    KT_CUDA(cudaDeviceSynchronize());
    kt_down(got, dl, sizeof(float) * n_tok * n_expert);
    /* the last token alone: its logits are the bits it got in the batch */
    float *one = (float *)malloc(sizeof(float) * n_expert);
    if (!rc)
        rc = strata_k_moe_router_topk(&ctx, &kw, dx + (size_t)(n_tok - 1) * n, 1, dl, dc, k,
                                      norm, 0.5f, di2, dwt2, NULL, NULL, &err);
    KT_CUDA(cudaDeviceSynchronize());
    kt_down(one, dl, sizeof(float) * n_expert);
    int inv = !rc && memcmp(one, got + (size_t)(n_tok - 1) * n_expert,
                            sizeof(float) * n_expert) == 0;
    KT_CUDA(cudaMemcpy(dl, got, sizeof(float) * n_tok * n_expert, cudaMemcpyHostToDevice));
    if (!rc)
        rc = strata_k_moe_route(&ctx, dl, n_tok, n_expert, k, norm, 0.5f, di2, dwt2, &err);
    KT_CUDA(cudaDeviceSynchronize());
    int32_t *gi = (int32_t *)malloc(sizeof(int32_t) * n_tok * k), *gi2 = (int32_t *)malloc(sizeof(int32_t) * n_tok * k);
    float *gw = (float *)malloc(sizeof(float) * n_tok * k), *gw2 = (float *)malloc(sizeof(float) * n_tok * k);
    int cnt[64];
    kt_down(gi, di, sizeof(int32_t) * n_tok * k);
    kt_down(gi2, di2, sizeof(int32_t) * n_tok * k);
    kt_down(gw, dwt, sizeof(float) * n_tok * k);
    kt_down(gw2, dwt2, sizeof(float) * n_tok * k);
    kt_down(cnt, dc, sizeof(int) * n_tok);
    size_t worst = 0;
    double e = rc ? INFINITY : kt_err(got, ref, (size_t)n_tok * n_expert, 2e-6 * max_mag + 1e-6, 1e-5, &worst);
    int same = !rc && memcmp(gi, gi2, sizeof(int32_t) * n_tok * k) == 0 &&
               memcmp(gw, gw2, sizeof(float) * n_tok * k) == 0;
    int zero = 1;
    for (int t = 0; t < n_tok; t++)
        zero &= cnt[t] == 0;
    ok(e <= 1 && same && zero && inv,
       "moe_router_topk n_tok=%d n_expert=%d n=%d k=%d norm=%d: logits err %.3g, routing %s "
       "the separate kernel's, counters %s, the last token alone %s %s", n_tok, n_expert, n,
       k, norm, e, same ? "equals" : "differs from", zero ? "reset" : "left set",
       inv ? "the same bits" : "other bits", rc ? err.msg : "");
    cudaFree(dw); cudaFree(dx); cudaFree(dl); cudaFree(dwt); cudaFree(dwt2); cudaFree(di);
    cudaFree(di2); cudaFree(dc);
    free(w); free(x); free(ref); free(got); free(gi); free(gi2); free(gw); free(gw2); free(one);
}

/* The router without its routing (no counter): the same logits bit for bit, with the
 * ffn_norm fused or not, and ids and weights left alone; refused with results for the
 * host. */
static void test_router_logits_only(int n_tok, int n_expert, int n, int k, int fused)
{
    struct strata_err err = {0, ""};
    float *w = (float *)malloc(sizeof(float) * n_expert * n), *x = (float *)malloc(sizeof(float) * n * n_tok);
    float *g = (float *)malloc(sizeof(float) * n);
    kt_fill(w, (size_t)n_expert * n, 1.0f);
    kt_fill(x, (size_t)n * n_tok, 2.0f);
    kt_fill(g, n, 1.0f);
    float *dw = (float *)kt_up(w, sizeof(float) * n_expert * n), *dx = (float *)kt_up(x, sizeof(float) * n * n_tok);
    float *dg = (float *)kt_up(g, sizeof(float) * n);
    float *dl[2] = {(float *)kt_dev(4 * n_expert * n_tok), (float *)kt_dev(4 * n_expert * n_tok)};
    float *dy[2] = {(float *)kt_dev(4 * n * n_tok), (float *)kt_dev(4 * n * n_tok)};
    const size_t qrb = strata_k_q8_row_bytes(n);
    uint8_t *dq[2] = {(uint8_t *)kt_dev(qrb * n_tok), (uint8_t *)kt_dev(qrb * n_tok)};
    int32_t *di = (int32_t *)kt_dev(4 * k * n_tok);
    float *dwt = (float *)kt_dev(4 * k * n_tok);
    int *dc = (int *)kt_dev(sizeof(int));
    KT_CUDA(cudaMemset(dc, 0, sizeof(int)));
    struct strata_k_weight kw = {STRATA_TYPE_F32, n, n_expert, 4 * (size_t)n, 0, dw};
    int rc = 0;
    for (int v = 0; v < 2 && !rc; v++) {
        kt_poison(dl[v], 4 * n_expert * n_tok);
        kt_poison(dy[v], 4 * n * n_tok);
        kt_poison(dq[v], qrb * n_tok);
        if (v) {
            kt_poison(di, 4 * k * n_tok);
            kt_poison(dwt, 4 * k * n_tok);
        }
        struct strata_k_norm_q8 fn = {dg, 1e-6f, dy[v], dq[v]};
        rc = strata_k_moe_router_topk(&ctx, &kw, dx, n_tok, dl[v], v ? NULL : dc, k, 1, 1.0f, di,
                                      dwt, fused ? &fn : NULL, NULL, &err);
    }
    KT_CUDA(cudaDeviceSynchronize());
    float *lg = (float *)malloc(8 * n_expert * n_tok), *y = (float *)malloc(8 * n * n_tok);
    uint8_t *q = (uint8_t *)malloc(2 * qrb * n_tok), *pi = (uint8_t *)malloc(8 * k * n_tok);
    for (int v = 0; v < 2; v++) {
        kt_down(lg + v * n_expert * n_tok, dl[v], 4 * n_expert * n_tok);
        kt_down(y + v * n * n_tok, dy[v], 4 * n * n_tok);
        kt_down(q + v * qrb * n_tok, dq[v], qrb * n_tok);
    }
    kt_down(pi, di, 4 * k * n_tok);
    kt_down(pi + 4 * k * n_tok, dwt, 4 * k * n_tok);
    int untouched = 1;
    for (int i = 0; i < 8 * k * n_tok; i++) /* kt_poison's bytes */
        untouched &= pi[i] == pi[0];
    const int same = !memcmp(lg, lg + n_expert * n_tok, 4 * n_expert * n_tok) &&
                     (!fused || (!memcmp(y, y + n * n_tok, 4 * n * n_tok) &&
                                 !memcmp(q, q + qrb * n_tok, qrb * n_tok)));
    struct strata_k_host_route hr = {di, dy[0], (unsigned *)dc, 1};
    int refused = strata_k_moe_router_topk(&ctx, &kw, dx, 1, dl[0], NULL, k, 1, 1.0f, di, dwt,
                                           NULL, &hr, &err) == STRATA_E_INVALID;
    ok(!rc && same && untouched && refused,
       "moe_router_topk without its routing (n_tok=%d, %d experts, n=%d%s): logits%s %s, ids "
       "and weights %s, results for the host %s %s", n_tok, n_expert, n,
       fused ? ", ffn_norm fused" : "", fused ? " and normed rows" : "",
       same ? "equal" : "differ", untouched ? "untouched" : "written",
       refused ? "refused" : "taken", rc ? err.msg : "");
    for (int v = 0; v < 2; v++) {
        cudaFree(dl[v]); cudaFree(dy[v]); cudaFree(dq[v]);
    }
    cudaFree(dw); cudaFree(dx); cudaFree(dg); cudaFree(di); cudaFree(dwt); cudaFree(dc);
    free(w); free(x); free(g); free(lg); free(y); free(q); free(pi);
}

/* A launch that asks L2 for later weights before its wait (strata_k_mvq_args.next_l2):
 * the same output bit for bit as without, with ranges of any size and alignment. */
static void test_next_l2(uint32_t type, int mode)
{
    struct strata_err err = {0, ""};
    const int64_t ne0 = 1024, ne1 = 256;
    const int n_exp = 4, k = 2, comb = mode == STRATA_K_MVQ_COMBINE;
    size_t rb;
    uint8_t *w = kt_random_rows(type, ne0, ne1 * n_exp, &rb);
    const int n_x = comb ? k : 1;
    float *x = (float *)malloc(sizeof(float) * ne0 * n_x);
    kt_fill(x, ne0 * n_x, 1.0f);
    int32_t ids[2] = {3, 1};
    float cw[2] = {0.75f, -0.5f}, *add = (float *)malloc(sizeof(float) * ne1);
    kt_fill(add, ne1, 1.0f);
    const size_t xrb = strata_k_q8_row_bytes(ne0), big = (size_t)5 << 20;
    void *dw = kt_up(w, rb * ne1 * n_exp);
    float *dx = (float *)kt_up(x, sizeof(float) * ne0 * n_x), *dadd = (float *)kt_up(add, sizeof(float) * ne1);
    int32_t *dids = (int32_t *)kt_up(ids, sizeof ids);
    float *dcw = (float *)kt_up(cw, sizeof cw);
    uint8_t *dxq = (uint8_t *)kt_dev(xrb * n_x), *other = (uint8_t *)kt_dev(big);
    float *dy[2] = {(float *)kt_dev(sizeof(float) * ne1), (float *)kt_dev(sizeof(float) * ne1)};
    struct strata_k_weight kw = {type, ne0, ne1, rb, rb * ne1, dw};
    int rc = strata_k_quantize_q8(&ctx, dx, ne0, (int)ne0, n_x, 0, NULL, 0.0f, NULL, dxq, &err);
    for (int v = 0; v < 2 && !rc; v++) {
        kt_poison(dy[v], sizeof(float) * ne1);
        struct strata_k_mvq_args a;
        memset(&a, 0, sizeof(a));
        a.w = &kw;
        a.mode = mode;
        a.ids = comb ? dids : NULL;
        a.n_slot = 1;
        a.x_group = 1;
        a.k = comb ? k : 1;
        a.cw = comb ? dcw : NULL;
        a.xq = dxq;
        a.y = dy[v];
        a.y_stride = ne1;
        a.add = dadd;
        a.stage = -1;
        if (v) { /* an odd start and length, and the weights themselves */
            a.next_l2[0] = other + 3;
            a.next_l2_bytes[0] = big - 7;
            a.next_l2[1] = dw;
            a.next_l2_bytes[1] = rb * ne1 * n_exp;
        }
        rc = strata_k_matvec_q8(&ctx, &a, &err);
    }
    KT_CUDA(cudaDeviceSynchronize());
    float *y = (float *)malloc(2 * sizeof(float) * ne1);
    kt_down(y, dy[0], sizeof(float) * ne1);
    kt_down(y + ne1, dy[1], sizeof(float) * ne1);
    int finite = 1;
    for (int i = 0; i < ne1; i++)
        finite &= isfinite(y[i]);
    const int same = !memcmp(y, y + ne1, sizeof(float) * ne1);
    ok(!rc && same && finite,
       "matvec_q8 %s (type %u) asking L2 for later weights before its wait: output %s%s %s",
       comb ? "COMBINE" : "PLAIN", type, same ? "equal bit for bit" : "differs",
       finite ? "" : " (not finite)", rc ? err.msg : "");
    cudaFree(dw); cudaFree(dx); cudaFree(dadd); cudaFree(dids); cudaFree(dcw); cudaFree(dxq);
    cudaFree(other); cudaFree(dy[0]); cudaFree(dy[1]);
    free(w); free(x); free(add); free(y);
}

/* One token's gate/up launch that routes the token itself (strata_k_mvq_args.
 * route_logits) against moe_route followed by the same launch on its ids: ids, weights
 * and the 8-bit SwiGLU rows equal bit for bit.  ties: every logit twice (pairs of
 * experts tied: the lower id first). */
static void test_glu_route(uint32_t type, int64_t ne0, int64_t ne1, int n_expert, int k,
                           int norm, int ties)
{
    struct strata_err err = {0, ""};
    size_t rb;
    uint8_t *w = kt_random_rows(type, ne0, ne1 * n_expert, &rb);
    uint8_t *u = kt_random_rows(type, ne0, ne1 * n_expert, &rb);
    float *x = (float *)malloc(sizeof(float) * ne0), *lg = (float *)malloc(sizeof(float) * n_expert);
    kt_fill(x, ne0, 1.0f);
    kt_fill(lg, n_expert, 4.0f);
    for (int e = 1; ties && e < n_expert; e += 2)
        lg[e] = lg[e - 1];
    const size_t xrb = strata_k_q8_row_bytes(ne0), yrb = strata_k_q8_row_bytes(ne1);
    void *dw = kt_up(w, rb * ne1 * n_expert), *du = kt_up(u, rb * ne1 * n_expert);
    float *dx = (float *)kt_up(x, sizeof(float) * ne0), *dl = (float *)kt_up(lg, sizeof(float) * n_expert);
    uint8_t *dxq = (uint8_t *)kt_dev(xrb);
    uint8_t *dyq[2] = {(uint8_t *)kt_dev(yrb * k), (uint8_t *)kt_dev(yrb * k)};
    int32_t *di[2] = {(int32_t *)kt_dev(4 * k), (int32_t *)kt_dev(4 * k)};
    float *dwt[2] = {(float *)kt_dev(4 * k), (float *)kt_dev(4 * k)};
    for (int v = 0; v < 2; v++) {
        kt_poison(dyq[v], yrb * k);
        kt_poison(di[v], 4 * k);
        kt_poison(dwt[v], 4 * k);
    }
    struct strata_k_weight kw = {type, ne0, ne1, rb, rb * ne1, dw};
    struct strata_k_weight ku = {type, ne0, ne1, rb, rb * ne1, du};
    int rc = strata_k_quantize_q8(&ctx, dx, ne0, (int)ne0, 1, 0, NULL, 0.0f, NULL, dxq, &err);
    if (!rc)
        rc = strata_k_moe_route(&ctx, dl, 1, n_expert, k, norm, 0.5f, di[0], dwt[0], &err);
    for (int v = 0; v < 2 && !rc; v++) {
        struct strata_k_mvq_args a;
        memset(&a, 0, sizeof(a));
        a.w = &kw;
        a.up = &ku;
        a.mode = STRATA_K_MVQ_GLU;
        a.ids = di[v];
        a.n_slot = k;
        a.x_group = k;
        a.xq = dxq;
        a.yq = dyq[v];
        if (v) {
            a.route_logits = dl;
            a.route_n_expert = n_expert;
            a.route_norm = norm;
            a.route_scale = 0.5f;
            a.route_w = dwt[1];
        }
        rc = strata_k_matvec_q8(&ctx, &a, &err);
    }
    KT_CUDA(cudaDeviceSynchronize());
    int32_t *gi = (int32_t *)malloc(8 * k);
    float *gw = (float *)malloc(8 * k);
    uint8_t *gq = (uint8_t *)malloc(2 * yrb * k);
    for (int v = 0; v < 2; v++) {
        kt_down(gi + v * k, di[v], 4 * k);
        kt_down(gw + v * k, dwt[v], 4 * k);
        kt_down(gq + v * yrb * k, dyq[v], yrb * k);
    }
    int pairs = 1;
    for (int j = 0; ties && j + 1 < k; j += 2)
        pairs &= gi[k + j] % 2 == 0 && gi[k + j + 1] == gi[k + j] + 1;
    const int same_ids = !memcmp(gi, gi + k, 4 * k), same_w = !memcmp(gw, gw + k, 4 * k);
    const int same_q = !memcmp(gq, gq + yrb * k, yrb * k);
    ok(!rc && same_ids && same_w && same_q && pairs,
       "matvec_q8 GLU routing its token (type %u, %lld x %lld, %d experts, k=%d, norm=%d%s): "
       "ids %s, weights %s, q8 rows %s moe_route + GLU's%s %s", type, (long long)ne0,
       (long long)ne1, n_expert, k, norm, ties ? ", tied pairs" : "",
       same_ids ? "equal" : "differ", same_w ? "equal" : "differ", same_q ? "equal to" : "differ from",
       ties && !pairs ? " (tied pairs not chosen together)" : "", rc ? err.msg : "");
    for (int v = 0; v < 2; v++) {
        cudaFree(dyq[v]); cudaFree(di[v]); cudaFree(dwt[v]);
    }
    cudaFree(dw); cudaFree(du); cudaFree(dx); cudaFree(dl); cudaFree(dxq);
    free(w); free(u); free(x); free(lg); free(gi); free(gw); free(gq);
}

/* One token routed by the router's last block against moe_route on the same logits, where
 * logits tie: router rows repeated in pairs (every logit twice: both of a pair chosen, the
 * lower id first), or a zero row x (every logit 0: ids 0 .. k-1, each weight scale / k). */
static void test_router_ties(int zero_x)
{
    struct strata_err err = {0, ""};
    const int n_expert = 128, n = 256, k = 8;
    float *w = (float *)malloc(sizeof(float) * n_expert * n), *x = (float *)malloc(sizeof(float) * n);
    kt_fill(w, (size_t)n_expert * n, 1.0f);
    kt_fill(x, (size_t)n, 1.0f);
    for (int e = 1; e < n_expert; e += 2)
        memcpy(w + (size_t)e * n, w + (size_t)(e - 1) * n, sizeof(float) * n);
    if (zero_x)
        memset(x, 0, sizeof(float) * n);
    float *dw = (float *)kt_up(w, sizeof(float) * n_expert * n), *dx = (float *)kt_up(x, sizeof(float) * n);
    float *dl = (float *)kt_dev(sizeof(float) * n_expert);
    float *dwt = (float *)kt_dev(sizeof(float) * k), *dwt2 = (float *)kt_dev(sizeof(float) * k);
    int32_t *di = (int32_t *)kt_dev(sizeof(int32_t) * k), *di2 = (int32_t *)kt_dev(sizeof(int32_t) * k);
    int *dc = (int *)kt_dev(sizeof(int));
    KT_CUDA(cudaMemset(dc, 0, sizeof(int)));
    struct strata_k_weight kw = {STRATA_TYPE_F32, n, n_expert, 4 * (size_t)n, 0, dw};
    kt_poison(di, sizeof(int32_t) * k);
    int rc = strata_k_moe_router_topk(&ctx, &kw, dx, 1, dl, dc, k, 1, 0.5f, di, dwt, NULL, NULL,
                                      &err);
    if (!rc)
        rc = strata_k_moe_route(&ctx, dl, 1, n_expert, k, 1, 0.5f, di2, dwt2, &err);
    KT_CUDA(cudaDeviceSynchronize());
    int32_t gi[8], gi2[8];
    float gw[8], gw2[8], lg[128];
    kt_down(gi, di, sizeof gi);
    kt_down(gi2, di2, sizeof gi2);
    kt_down(gw, dwt, sizeof gw);
    kt_down(gw2, dwt2, sizeof gw2);
    kt_down(lg, dl, sizeof lg);
    int ties = 0, pairs = 1, first = 1;
    for (int e = 0; e + 1 < n_expert; e += 2)
        ties += lg[e] == lg[e + 1];
    /* both of a pair chosen, the lower id first */
    for (int j = 0; j + 1 < k; j += 2)
        pairs &= gi[j] % 2 == 0 && gi[j + 1] == gi[j] + 1;
    for (int j = 0; zero_x && j < k; j++)
        first &= gi[j] == j && gw[j] == 0.5f / k;
    int same = !rc && !memcmp(gi, gi2, sizeof gi) && !memcmp(gw, gw2, sizeof gw);
    ok(same && ties == n_expert / 2 && pairs && first,
       "moe_router_topk, one token, tied logits%s: routing %s moe_route's, %d of %d pairs tied, "
       "pairs chosen together %s%s %s", zero_x ? " (all zero)" : "",
       same ? "equals" : "differs from", ties, n_expert / 2, pairs ? "yes" : "no",
       zero_x ? (first ? ", ids 0..k-1" : ", not ids 0..k-1") : "", rc ? err.msg : "");
    cudaFree(dw); cudaFree(dx); cudaFree(dl); cudaFree(dwt); cudaFree(dwt2); cudaFree(di);
    cudaFree(di2); cudaFree(dc);
    free(w); free(x);
}

/* The router's results for the host (strata_k_host_route): the ids and the normed row in
 * pinned host memory equal the device's, the flag holds seq; a second launch with the
 * next seq rewrites them; two tokens are refused. */
static void test_router_host(void)
{
    struct strata_err err = {0, ""};
    const int n_expert = 128, n = 2048, k = 8;
    float *w = (float *)malloc(sizeof(float) * n_expert * n), *x = (float *)malloc(sizeof(float) * 2 * n);
    float *nw = (float *)malloc(sizeof(float) * n);
    kt_fill(w, (size_t)n_expert * n, 0.05f);
    kt_fill(x, (size_t)2 * n, 3.0f);
    kt_fill(nw, n, 1.0f);
    float *dw = (float *)kt_up(w, sizeof(float) * n_expert * n), *dx = (float *)kt_up(x, sizeof(float) * 2 * n);
    float *dnw = (float *)kt_up(nw, sizeof(float) * n), *dy = (float *)kt_dev(sizeof(float) * n);
    float *dl = (float *)kt_dev(sizeof(float) * 2 * n_expert), *dwt = (float *)kt_dev(sizeof(float) * 2 * k);
    int32_t *di = (int32_t *)kt_dev(sizeof(int32_t) * 2 * k);
    void *dq = kt_dev(strata_k_q8_row_bytes(n));
    int *dc = (int *)kt_dev(sizeof(int));
    KT_CUDA(cudaMemset(dc, 0, sizeof(int)));
    int32_t *hi = NULL;
    float *hx = NULL;
    unsigned *hf = NULL;
    KT_CUDA(cudaMallocHost((void **)&hi, sizeof(int32_t) * k));
    KT_CUDA(cudaMallocHost((void **)&hx, sizeof(float) * n));
    KT_CUDA(cudaMallocHost((void **)&hf, sizeof(unsigned)));
    void *pi = NULL, *px = NULL, *pf = NULL;
    KT_CUDA(cudaHostGetDevicePointer(&pi, hi, 0));
    KT_CUDA(cudaHostGetDevicePointer(&px, hx, 0));
    KT_CUDA(cudaHostGetDevicePointer(&pf, hf, 0));
    struct strata_k_weight kw = {STRATA_TYPE_F32, n, n_expert, 4 * (size_t)n, 0, dw};
    struct strata_k_norm_q8 fn = {dnw, 1e-6f, dy, dq};
    int good = 1, rc = 0;
    for (int t = 0; t < 2 && !rc; t++) {
        struct strata_k_host_route hr = {(int32_t *)pi, (float *)px, (unsigned *)pf, 7u + t};
        memset(hi, 0xff, sizeof(int32_t) * k);
        memset(hx, 0xff, sizeof(float) * n);
        *hf = 0;
        rc = strata_k_moe_router_topk(&ctx, &kw, dx + (size_t)t * n, 1, dl, dc, k, 1, 1.0f, di,
                                      dwt, &fn, &hr, &err);
        KT_CUDA(cudaDeviceSynchronize());
        int32_t gi[8];
        float *gy = (float *)malloc(sizeof(float) * n);
        kt_down(gi, di, sizeof gi);
        kt_down(gy, dy, sizeof(float) * n);
        good &= !rc && *hf == 7u + t && !memcmp(hi, gi, sizeof gi) &&
                !memcmp(hx, gy, sizeof(float) * n);
        free(gy);
    }
    struct strata_k_host_route hr2 = {(int32_t *)pi, (float *)px, (unsigned *)pf, 9u};
    struct strata_err err2 = {0, ""};
    int refused = strata_k_moe_router_topk(&ctx, &kw, dx, 2, dl, dc, k, 1, 1.0f, di, dwt, &fn,
                                           &hr2, &err2) == STRATA_E_INVALID;
    ok(good && refused, "moe_router_topk with results for the host: ids, normed row and flag "
       "%s, two tokens %s %s", good ? "the device's" : "differ", refused ? "refused" : "taken",
       rc ? err.msg : "");
    cudaFreeHost(hi); cudaFreeHost(hx); cudaFreeHost(hf);
    cudaFree(dw); cudaFree(dx); cudaFree(dnw); cudaFree(dy); cudaFree(dl); cudaFree(dwt);
    cudaFree(di); cudaFree(dq); cudaFree(dc);
    free(w); free(x); free(nw);
}

/* The router with the ffn_norm in its launch (strata_k_norm_q8) against quantize_q8
 * followed by the router on its float rows: the normed rows, their q8 bytes, the logits
 * and the routing must be the same bits; and the last token alone the bits it got in
 * the batch. */
static void test_router_norm(int n_tok, int n_expert, int n, int k, int q8)
{
    struct strata_err err = {0, ""};
    size_t rb = strata_k_q8_row_bytes(n), nx = (size_t)n * n_tok, nl = (size_t)n_expert * n_tok;
    float *w = (float *)malloc(sizeof(float) * n_expert * n), *x = (float *)malloc(4 * nx);
    float *nw = (float *)malloc(sizeof(float) * n);
    kt_fill(w, (size_t)n_expert * n, 0.05f);
    kt_fill(x, nx, 3.0f);
    kt_fill(nw, n, 1.0f);
    float *dw = (float *)kt_up(w, sizeof(float) * n_expert * n), *dx = (float *)kt_up(x, 4 * nx);
    float *dnw = (float *)kt_up(nw, sizeof(float) * n);
    float *dy = (float *)kt_dev(4 * nx), *dl = (float *)kt_dev(4 * nl);
    float *dwt = (float *)kt_dev(sizeof(float) * n_tok * k);
    int32_t *di = (int32_t *)kt_dev(sizeof(int32_t) * n_tok * k);
    void *dq = kt_dev(rb * n_tok);
    int *dc = (int *)kt_dev(sizeof(int));
    KT_CUDA(cudaMemset(dc, 0, sizeof(int)));
    struct strata_k_weight kw = {STRATA_TYPE_F32, n, n_expert, 4 * (size_t)n, 0, dw};
    float *y[3], *lg[3], *gw[3];
    int32_t *gi[3];
    uint8_t *q[3];
    int rc = 0;
    /* v 0: two launches; v 1: fused; v 2: fused, the last token alone */
    for (int v = 0; v < 3; v++) {
        y[v] = (float *)malloc(4 * nx);
        lg[v] = (float *)malloc(4 * nl);
        gw[v] = (float *)malloc(sizeof(float) * n_tok * k);
        gi[v] = (int32_t *)malloc(sizeof(int32_t) * n_tok * k);
        q[v] = (uint8_t *)malloc(rb * n_tok);
        kt_poison(dy, 4 * nx);
        kt_poison(dq, rb * n_tok);
        kt_poison(dl, 4 * nl);
        const int t0 = v == 2 ? n_tok - 1 : 0, nt = v == 2 ? 1 : n_tok;
        struct strata_k_norm_q8 fn = {dnw, 1e-6f, dy, q8 ? dq : NULL};
        if (!rc && v == 0)
            rc = strata_k_quantize_q8(&ctx, dx, n, n, n_tok, 1, dnw, 1e-6f, dy, dq, &err);
        if (!rc)
            rc = strata_k_moe_router_topk(&ctx, &kw, (v ? dx : dy) + (size_t)t0 * n, nt, dl, dc, k,
                                          1, 1.0f, di, dwt, v ? &fn : NULL, NULL, &err);
        KT_CUDA(cudaDeviceSynchronize());
        kt_down(y[v], dy, 4 * nx);
        kt_down(q[v], dq, rb * n_tok);
        kt_down(lg[v], dl, 4 * nl);
        kt_down(gw[v], dwt, sizeof(float) * n_tok * k);
        kt_down(gi[v], di, sizeof(int32_t) * n_tok * k);
    }
    int cnt = -1;
    kt_down(&cnt, dc, sizeof(int));
    const size_t last = (size_t)(n_tok - 1);
    int same_y = !rc && memcmp(y[0], y[1], 4 * nx) == 0;
    int same_q = !rc && (!q8 || memcmp(q[0], q[1], rb * n_tok) == 0);
    int same_l = !rc && memcmp(lg[0], lg[1], 4 * nl) == 0;
    int same_r = !rc && memcmp(gi[0], gi[1], sizeof(int32_t) * n_tok * k) == 0 &&
                 memcmp(gw[0], gw[1], sizeof(float) * n_tok * k) == 0;
    int inv = !rc && memcmp(lg[2], lg[0] + last * n_expert, sizeof(float) * n_expert) == 0 &&
              memcmp(y[2], y[0] + last * n, sizeof(float) * n) == 0 &&
              (!q8 || memcmp(q[2], q[0] + last * rb, rb) == 0);
    ok(same_y && same_q && same_l && same_r && inv && cnt == 0,
       "moe_router_topk with ffn_norm n_tok=%d n_expert=%d n=%d k=%d q8=%d: normed rows %s, q8 "
       "%s, logits %s, routing %s, the last token alone %s, counter %d %s", n_tok, n_expert, n,
       k, q8, same_y ? "equal" : "differ", same_q ? "equal" : "differ",
       same_l ? "equal" : "differ", same_r ? "equal" : "differs", inv ? "the same bits" : "other bits",
       cnt, rc ? err.msg : "");
    if (!rc && !same_y)
        for (size_t i = 0; i < nx; i++)
            if (memcmp(&y[0][i], &y[1][i], 4)) {
                diag("  value %zu: %a fused, %a two launches", i, y[1][i], y[0][i]);
                break;
            }
    cudaFree(dw); cudaFree(dx); cudaFree(dnw); cudaFree(dy); cudaFree(dl); cudaFree(dwt);
    cudaFree(di); cudaFree(dq); cudaFree(dc);
    for (int v = 0; v < 3; v++) {
        free(y[v]); free(lg[v]); free(gw[v]); free(gi[v]); free(q[v]);
    }
    free(w); free(x); free(nw);
}

static void test_q8(void)
{
    test_next_l2(STRATA_TYPE_Q4_K, STRATA_K_MVQ_COMBINE);
    test_next_l2(STRATA_TYPE_Q6_K, STRATA_K_MVQ_PLAIN);
    test_router_logits_only(1, 128, 2048, 8, 1);
    test_router_logits_only(3, 60, 100, 6, 0);
    test_glu_route(STRATA_TYPE_Q4_K, 2048, 768, 128, 8, 1, 0);
    test_glu_route(STRATA_TYPE_Q4_K, 2048, 768, 128, 8, 1, 1);
    test_glu_route(STRATA_TYPE_Q6_K, 512, 64, 60, 6, 0, 0);
    test_glu_route(STRATA_TYPE_Q8_0, 256, 96, 300, 32, 1, 1); /* past ROUTE_REG lanes */
    test_router_topk(1, 128, 2048, 8, 1);
    test_router_topk(17, 60, 100, 6, 0);
    test_router_topk(3, 1000, 64, 32, 1);
    test_router_topk(5, 128, 4352, 8, 1); /* rows longer than the loads before the wait */
    test_router_ties(0);
    test_router_ties(1);
    test_router_host();
    test_router_norm(1, 128, 2048, 8, 1);   /* Qwen3-30B-A3B's decode */
    test_router_norm(17, 128, 2048, 8, 1);  /* a verify window */
    test_router_norm(2, 24, 4640, 4, 1);    /* past the loads before the wait; 145 q8 blocks */
    test_router_norm(3, 64, 2880, 4, 1);    /* gpt-oss's n_embd: a warp half past the row */
    test_router_norm(2, 128, 2048, 8, 0);   /* float rows only (no 8-bit products after) */
    test_router_norm(4, 256, 7168, 8, 1);   /* DeepSeek-V3's */
    {
        struct strata_err err = {0, ""};
        struct strata_k_weight kw = {STRATA_TYPE_F32, 64, 8, 256, 0, NULL};
        int rc = strata_k_moe_router_topk(&ctx, &kw, NULL, 65, NULL, NULL, 2, 1, 1.0f, NULL,
                                          NULL, NULL, NULL, &err);
        ok(rc == STRATA_E_INVALID, "moe_router_topk refuses 65 tokens: %s", err.msg);
    }
    test_quantize_q8(2048, 3, 1, 1);
    test_quantize_q8(96, 5, 1, 0);
    test_quantize_q8(4096, 2, 0, 0);
    test_quantize_q8(32, 17, 1, 1);
    const uint32_t types[] = {STRATA_TYPE_Q4_K, STRATA_TYPE_Q5_K, STRATA_TYPE_Q6_K,
                              STRATA_TYPE_Q8_0};
    for (int i = 0; i < 4; i++) {
        uint32_t t = types[i];
        int64_t qk = strata_ggml_blck_size(t);
        ok(strata_k_matvec_q8_supported(t), "matvec_q8 takes %s", strata_ggml_type_name(t));
        test_matvec_q8(t, qk, 1, 1, 1, 1, 1, STRATA_K_MVQ_PLAIN, 0, 0);
        test_matvec_q8(t, qk * 3, 7, 1, 2, 1, 1, STRATA_K_MVQ_PLAIN, 1, 0);
        test_matvec_q8(t, qk * 8, 257, 1, 3, 1, 1, STRATA_K_MVQ_PLAIN, 0, 0);
        test_matvec_q8(t, qk * 8, 96, 5, 8, 4, 1, STRATA_K_MVQ_GLU, 0, 1);
        test_matvec_q8(t, qk * 3, 64, 6, 6, 3, 1, STRATA_K_MVQ_GLU, 0, 1);
        test_matvec_q8(t, qk, 33, 3, 4, 2, 1, STRATA_K_MVQ_GLU, 0, 0); /* ne1 % 32 != 0 */
        test_matvec_q8(t, qk * 3, 200, 6, 3, 1, 8, STRATA_K_MVQ_COMBINE, 1, 0);
        test_matvec_q8(t, qk, 65, 4, 2, 1, 3, STRATA_K_MVQ_COMBINE, 0, 0);
        test_matvec_q8_batch_invariance(t, STRATA_K_MVQ_PLAIN);
        test_matvec_q8_batch_invariance(t, STRATA_K_MVQ_GLU);
        test_matvec_q8_batch_invariance(t, STRATA_K_MVQ_COMBINE);
    }
    /* the decode shapes of the benchmark model: qkv, attn_output, experts, output */
    test_matvec_q8(STRATA_TYPE_Q4_K, 2048, 5120, 1, 1, 1, 1, STRATA_K_MVQ_PLAIN, 0, 0);
    test_matvec_q8(STRATA_TYPE_Q4_K, 4096, 2048, 1, 2, 1, 1, STRATA_K_MVQ_PLAIN, 1, 0);
    test_matvec_q8(STRATA_TYPE_Q4_K, 2048, 768, 16, 8, 8, 1, STRATA_K_MVQ_GLU, 0, 1);
    test_matvec_q8(STRATA_TYPE_Q6_K, 768, 2048, 16, 1, 1, 8, STRATA_K_MVQ_COMBINE, 1, 0);
    test_matvec_q8(STRATA_TYPE_Q6_K, 2048, 20001, 1, 1, 1, 1, STRATA_K_MVQ_PLAIN, 0, 0);
    test_matvec_q8(STRATA_TYPE_Q8_0, 8192, 1024, 1, 2, 1, 1, STRATA_K_MVQ_PLAIN, 0, 0);
    test_matvec_q8(STRATA_TYPE_Q8_0, 512, 16390, 1, 3, 1, 1, STRATA_K_MVQ_PLAIN, 1, 0);
    test_matvec_q8_stage(STRATA_TYPE_Q6_K, 2048, 16411, 1, 3, 1);
    test_matvec_q8_stage(STRATA_TYPE_Q6_K, 2048, 16389, 3, 5, 2);
    test_matvec_q8_stage(STRATA_TYPE_Q8_0, 512, 16390, 2, 17, 1);
    /* the streamed kernel: Qwen3's output shape, a window's 17 slots, every type, fewer
     * rows than one chunk, a last chunk cut short, rows not 16-byte multiples */
    test_matvec_q8_stage(STRATA_TYPE_Q6_K, 2048, 151936, 1, 1, 1);
    test_matvec_q8_stage(STRATA_TYPE_Q6_K, 2048, 20011, 1, 17, 1);
    test_matvec_q8_stage(STRATA_TYPE_Q4_K, 4096, 16387, 1, 3, 1);
    test_matvec_q8_stage(STRATA_TYPE_Q5_K, 1024, 40, 1, 2, 1);
    test_matvec_q8_stage(STRATA_TYPE_Q8_0, 7168, 16405, 1, 4, 2);
    test_matvec_q8_stage(STRATA_TYPE_Q6_K, 7168, 777, 1, 5, 1);
    test_matvec_q8_innorm(STRATA_TYPE_Q4_K, 2048, 5120, 1, 1);   /* Qwen3-30B-A3B's q/k/v */
    test_argmax_key(STRATA_TYPE_Q6_K, 2048, 151936, 1); /* the output projection */
    test_argmax_key(STRATA_TYPE_Q6_K, 2048, 20000, 0);
    test_argmax_key(STRATA_TYPE_Q5_K, 1024, 333, 1);
    test_argmax_key(STRATA_TYPE_Q8_0, 96, 700, 1);
    test_matvec_q8_innorm(STRATA_TYPE_Q6_K, 2048, 512, 17, 1);   /* attn_v, a 17-token window */
    test_matvec_q8_innorm(STRATA_TYPE_Q6_K, 2048, 151936, 2, 1); /* output */
    test_matvec_q8_innorm(STRATA_TYPE_Q8_0, 7168, 1000, 3, 0);   /* no 256-thread stream */
    test_matvec_q8_innorm(STRATA_TYPE_Q5_K, 1024, 333, 4, 1);
    test_matvec_q8_innorm(STRATA_TYPE_Q8_0, 96, 700, 2, 1);      /* q8 rows with padding */
    /* the q/k/v post in the product: Qwen3-30B-A3B's heads (32/4, hd 128) with v in the
     * product and apart (Q6_K, as Q4_K_M has it), a 17-token window, hd 64 (a chunk of
     * 16 rows in a quarter of a head), Q8_0 */
    test_qkv_post_fused(STRATA_TYPE_Q4_K, STRATA_TYPE_Q4_K, 2048, 1, 32, 4, 128, 3, 7, 1, -1);
    test_qkv_post_fused(STRATA_TYPE_Q4_K, STRATA_TYPE_Q6_K, 2048, 1, 32, 4, 128, 2, 130, 1, -1);
    test_qkv_post_fused(STRATA_TYPE_Q4_K, STRATA_TYPE_Q6_K, 2048, 17, 32, 4, 128, 2, 3, 1, -1);
    test_qkv_post_fused(STRATA_TYPE_Q5_K, STRATA_TYPE_Q5_K, 1024, 3, 16, 8, 64, 3, 0, 1, -1);
    test_qkv_post_fused(STRATA_TYPE_Q8_0, STRATA_TYPE_Q8_0, 160, 2, 14, 2, 64, 2, 40, 1, -1);
    /* rows of 28 Q8_0 blocks: no 256-thread stream, so the post runs apart */
    test_qkv_post_fused(STRATA_TYPE_Q8_0, STRATA_TYPE_Q8_0, 896, 2, 14, 2, 64, 2, 40, 0, -1);
    /* v (Q6_K) in the q/k product's launch: one token, a window, Q5_K, 64-wide heads; a
     * pair without a kernel (Q8_0/Q8_0) runs v apart */
    test_qkv_post_fused(STRATA_TYPE_Q4_K, STRATA_TYPE_Q6_K, 2048, 1, 32, 4, 128, 2, 9, 1, 1);
    test_qkv_post_fused(STRATA_TYPE_Q4_K, STRATA_TYPE_Q6_K, 2048, 17, 32, 4, 128, 2, 200, 1, 1);
    test_qkv_post_fused(STRATA_TYPE_Q5_K, STRATA_TYPE_Q6_K, 2048, 3, 16, 2, 64, 2, 1, 1, 1);
    test_qkv_post_fused(STRATA_TYPE_Q8_0, STRATA_TYPE_Q8_0, 160, 2, 14, 2, 64, 2, 40, 1, 0);
    /* heads of 34 rows: the q/k weight's and v's last chunks cut short */
    test_qkv_post_fused(STRATA_TYPE_Q4_K, STRATA_TYPE_Q6_K, 2048, 2, 3, 1, 34, 2, 5, 1, 1);
    /* v in the q/k launch, the post apart */
    test_qkv_post_fused(STRATA_TYPE_Q4_K, STRATA_TYPE_Q6_K, 2048, 5, 32, 4, 128, 2, 60, -1, 1);
    test_matvec_q8_stage(STRATA_TYPE_Q6_K, 2304, 16411, 1, 3, 1); /* rows of 9 super-blocks:
                                                                     every other row 2 bytes off */
    /* with the following RMSNorm fused (attn_output, the experts' down projections) */
    test_matvec_q8(STRATA_TYPE_Q4_K, 4096, 2048, 1, 3, 1, 1, STRATA_K_MVQ_PLAIN, 1, 0, 1);
    test_matvec_q8(STRATA_TYPE_Q6_K, 768, 2048, 16, 2, 1, 8, STRATA_K_MVQ_COMBINE, 1, 0, 1);
    test_matvec_q8(STRATA_TYPE_Q8_0, 64, 96, 3, 5, 1, 2, STRATA_K_MVQ_COMBINE, 0, 0, 1);
    test_matvec_q8(STRATA_TYPE_Q5_K, 256, 32, 1, 1, 1, 1, STRATA_K_MVQ_PLAIN, 0, 0, 1);
    /* refusals */
    struct strata_err err = {0, ""};
    struct strata_k_weight kw = {STRATA_TYPE_IQ2_XS, 256, 64, 74, 0, NULL};
    struct strata_k_mvq_args a;
    memset(&a, 0, sizeof(a));
    a.w = &kw;
    a.n_slot = 1;
    a.x_group = 1;
    int rc = strata_k_matvec_q8(&ctx, &a, &err);
    ok(rc == STRATA_E_UNSUPPORTED, "matvec_q8 refuses IQ2_XS weights: %s", err.msg);
    struct strata_k_weight kg = {STRATA_TYPE_Q4_K, 256, 40, 144, 0, NULL};
    a.w = &kg;
    a.up = &kg;
    a.mode = STRATA_K_MVQ_GLU;
    a.yq = (void *)256;
    rc = strata_k_matvec_q8(&ctx, &a, &err);
    ok(rc == STRATA_E_INVALID && strstr(err.msg, "ne1=40"),
       "matvec_q8 refuses a q8 output of 40 rows: %s", err.msg);
    rc = strata_k_quantize_q8(&ctx, NULL, 100, 100, 1, 0, NULL, 0.0f, NULL, NULL, &err);
    ok(rc == STRATA_E_INVALID && strstr(err.msg, "n=100"), "quantize_q8 refuses n=100: %s",
       err.msg);
}

static double silu(double v) { return v / (1 + exp(-v)); }

static float f16r(float f) { return strata_f16_to_f32(strata_f32_to_f16(f)); }

static void test_rms_norm(int n, int n_rows)
{
    struct strata_err err = {0, ""};
    float *x = (float *)malloc(sizeof(float) * n * n_rows), *w = (float *)malloc(sizeof(float) * n);
    float *ref = (float *)malloc(sizeof(float) * n * n_rows), *got = (float *)malloc(sizeof(float) * n * n_rows);
    kt_fill(x, (size_t)n * n_rows, 3.0f);
    kt_fill(w, n, 1.0f);
    for (int r = 0; r < n_rows; r++) {
        double s = 0;
        for (int i = 0; i < n; i++)
            s += (double)x[r * n + i] * x[r * n + i];
        double sc = 1.0 / sqrt(s / n + 1e-6);
        for (int i = 0; i < n; i++)
            ref[r * n + i] = (float)(x[r * n + i] * sc * w[i]);
    }
    float *dx = (float *)kt_up(x, sizeof(float) * n * n_rows), *dw = (float *)kt_up(w, sizeof(float) * n);
    float *dy = (float *)kt_dev(sizeof(float) * n * n_rows);
    kt_poison(dy, sizeof(float) * n * n_rows);
    int rc = strata_k_rms_norm(&ctx, dx, dw, dy, n, n_rows, 1e-6f, &err);
    KT_CUDA(cudaDeviceSynchronize());
    kt_down(got, dy, sizeof(float) * n * n_rows);
    size_t worst;
    double e = rc ? INFINITY : kt_err(got, ref, (size_t)n * n_rows, 1e-6, 1e-5, &worst);
    ok(e <= 1, "rms_norm n=%d rows=%d: err %.3g %s", n, n_rows, e, rc ? err.msg : "");
    cudaFree(dx); cudaFree(dw); cudaFree(dy);
    free(x); free(w); free(ref); free(got);
}

/* q/k norm + RoPE + kv store against a double-precision reference of ggml's rope. */
static void test_qkv_post(int mode, int n_tok, int n_head, int n_head_kv, int hd, int n_rot,
                          int with_norm, int pos0, float freq_scale, float ext_factor)
{
    struct strata_err err = {0, ""};
    int nq = n_tok * n_head * hd, nk = n_tok * n_head_kv * hd, n_ctx = pos0 + n_tok + 3;
    float *q = (float *)malloc(4 * nq), *k = (float *)malloc(4 * nk), *v = (float *)malloc(4 * nk);
    float *qn = (float *)malloc(4 * hd), *kn = (float *)malloc(4 * hd);
    kt_fill(q, nq, 2.0f); kt_fill(k, nk, 2.0f); kt_fill(v, nk, 2.0f);
    kt_fill(qn, hd, 1.0f); kt_fill(kn, hd, 1.0f);
    struct strata_k_rope rp;
    strata_k_rope_init(&rp, mode, n_rot, 10000.0f, freq_scale, 4096, ext_factor, 1.0f, 32.0f, 1.0f);
    float *rq = (float *)malloc(4 * nq), *rk = (float *)malloc(4 * nk);
    for (int pass = 0; pass < 2; pass++) {
        const float *src = pass ? k : q;
        float *dst = pass ? rk : rq;
        int nh = pass ? n_head_kv : n_head;
        const float *nw = pass ? kn : qn;
        for (int t = 0; t < n_tok; t++)
            for (int h = 0; h < nh; h++) {
                const float *x = src + (t * nh + h) * hd;
                float *y = dst + (t * nh + h) * hd;
                double s = 0;
                for (int i = 0; i < hd; i++)
                    s += (double)x[i] * x[i];
                double sc = with_norm ? 1.0 / sqrt(s / hd + 1e-6) : 1.0;
                for (int i = 0; i < hd; i++)
                    y[i] = (float)(x[i] * sc * (with_norm ? nw[i] : 1.0f));
                for (int p = 0; p < n_rot / 2; p++) {
                    int i0 = mode == 2 ? p : 2 * p, i1 = mode == 2 ? p + n_rot / 2 : 2 * p + 1;
                    double te = (pos0 + t) * pow(10000.0, -2.0 * p / n_rot), ti = freq_scale * te;
                    double th = ti, ms = 1.0;
                    if (ext_factor != 0.0f) {
                        double yv = (p - rp.corr_dims[0]) / fmax(0.001, rp.corr_dims[1] - rp.corr_dims[0]);
                        double ramp = (1 - fmin(1, fmax(0, yv))) * ext_factor;
                        th = ti * (1 - ramp) + te * ramp;
                        ms *= 1 + 0.1 * log(1.0 / freq_scale);
                    }
                    double a = y[i0], b = y[i1];
                    y[i0] = (float)((a * cos(th) - b * sin(th)) * ms);
                    y[i1] = (float)((a * sin(th) + b * cos(th)) * ms);
                }
            }
    }
    float *dq = (float *)kt_up(q, 4 * nq), *dk = (float *)kt_up(k, 4 * nk), *dv = (float *)kt_up(v, 4 * nk);
    float *dqn = (float *)kt_up(qn, 4 * hd), *dkn = (float *)kt_up(kn, 4 * hd);
    int32_t *dpos = (int32_t *)kt_up(&pos0, 4);
    size_t cbytes = sizeof(__half) * n_ctx * n_head_kv * hd;
    __half *kc = (__half *)kt_dev(cbytes), *vc = (__half *)kt_dev(cbytes);
    kt_poison(kc, cbytes); kt_poison(vc, cbytes);
    struct strata_k_qkv_args a;
    memset(&a, 0, sizeof(a));
    a.q = dq; a.k = dk; a.v = dv;
    a.q_stride = n_head * hd; a.k_stride = n_head_kv * hd; a.v_stride = n_head_kv * hd;
    a.q_norm = with_norm ? dqn : NULL; a.k_norm = with_norm ? dkn : NULL; a.eps = 1e-6f;
    a.rope = &rp; a.pos0 = dpos; a.n_tok = n_tok; a.n_head = n_head; a.n_head_kv = n_head_kv;
    a.hd = hd; a.k_cache = kc; a.v_cache = vc;
    int rc = strata_k_qkv_post(&ctx, &a, &err);
    KT_CUDA(cudaDeviceSynchronize());
    float *gq = (float *)malloc(4 * nq), *gk = (float *)malloc(4 * nk), *gv = (float *)malloc(4 * nk);
    uint16_t *hk = (uint16_t *)malloc(2 * nk), *hv = (uint16_t *)malloc(2 * nk);
    kt_down(gq, dq, 4 * nq);
    kt_down(hk, (char *)kc + sizeof(__half) * pos0 * n_head_kv * hd, 2 * nk);
    kt_down(hv, (char *)vc + sizeof(__half) * pos0 * n_head_kv * hd, 2 * nk);
    for (int i = 0; i < nk; i++) {
        gk[i] = strata_f16_to_f32(hk[i]);
        gv[i] = strata_f16_to_f32(hv[i]);
        rk[i] = f16r(rk[i]);
    }
    size_t w1, w2, w3;
    /* float32 angles of large positions are off by ~pos * 2^-24 radians */
    double e1 = kt_err(gq, rq, nq, 1e-5 + 1e-7 * (pos0 + n_tok), 1e-4, &w1);
    double e2 = kt_err(gk, rk, nk, 1e-3, 2e-3, &w2);
    double e3 = kt_err(gv, v, nk, 1e-3, 2e-3, &w3);
    ok(!rc && e1 <= 1 && e2 <= 1 && e3 <= 1,
       "qkv_post mode %d n_tok=%d heads %d/%d hd=%d n_rot=%d norm=%d pos0=%d scale=%g ext=%g: "
       "err q %.3g k %.3g v %.3g %s", mode, n_tok, n_head, n_head_kv, hd, n_rot, with_norm, pos0,
       freq_scale, ext_factor, e1, e2, e3, rc ? err.msg : "");
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dqn); cudaFree(dkn); cudaFree(dpos);
    cudaFree(kc); cudaFree(vc);
    free(q); free(k); free(v); free(qn); free(kn); free(rq); free(rk);
    free(gq); free(gk); free(gv); free(hk); free(hv);
}

/* Causal GQA attention against a double-precision softmax over the f16 cache. */
static void test_attention(int n_tok, int pos0, int n_head, int n_head_kv, int hd, int n_split,
                           int split_keys = 0, int mma = 0)
{
    struct strata_err err = {0, ""};
    int n_kv = pos0 + n_tok, nq = n_tok * n_head * hd, nc = n_kv * n_head_kv * hd;
    float *q = (float *)malloc(4 * nq), *kf = (float *)malloc(4 * nc), *vf = (float *)malloc(4 * nc);
    uint16_t *kh = (uint16_t *)malloc(2 * nc), *vh = (uint16_t *)malloc(2 * nc);
    kt_fill(q, nq, 1.0f); kt_fill(kf, nc, 1.0f); kt_fill(vf, nc, 1.0f);
    for (int i = 0; i < nc; i++) {
        kh[i] = strata_f32_to_f16(kf[i]); kf[i] = strata_f16_to_f32(kh[i]);
        vh[i] = strata_f32_to_f16(vf[i]); vf[i] = strata_f16_to_f32(vh[i]);
    }
    float scale = 1.0f / sqrtf((float)hd);
    float *ref = (float *)malloc(4 * nq), *got = (float *)malloc(4 * nq);
    double *sc = (double *)malloc(sizeof(double) * n_kv);
    int gqa = n_head / n_head_kv;
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            int g = h / gqa, L = pos0 + t + 1;
            double mx = -1e300, sum = 0;
            for (int j = 0; j < L; j++) {
                double s = 0;
                for (int d = 0; d < hd; d++)
                    s += (double)q[(t * n_head + h) * hd + d] * scale * kf[(j * n_head_kv + g) * hd + d];
                sc[j] = s;
                mx = fmax(mx, s);
            }
            for (int j = 0; j < L; j++)
                sum += sc[j] = exp(sc[j] - mx);
            for (int d = 0; d < hd; d++) {
                double o = 0;
                for (int j = 0; j < L; j++)
                    o += sc[j] * vf[(j * n_head_kv + g) * hd + d];
                ref[(t * n_head + h) * hd + d] = (float)(o / sum);
            }
        }
    float *dq = (float *)kt_up(q, 4 * nq), *dout = (float *)kt_dev(4 * nq);
    __half *dk = (__half *)kt_up(kh, 2 * nc), *dv = (__half *)kt_up(vh, 2 * nc);
    int32_t *dpos = (int32_t *)kt_up(&pos0, 4);
    size_t sb = strata_k_attn_scratch_bytes(n_tok, n_head, hd, n_split);
    float *dscr = sb ? (float *)kt_dev(sb) : NULL;
    kt_poison(dout, 4 * nq);
    struct strata_k_attn_args a;
    memset(&a, 0, sizeof(a));
    a.q = dq; a.q_stride = n_head * hd; a.k_cache = dk; a.v_cache = dv; a.out = dout;
    a.pos0 = dpos; a.n_tok = n_tok; a.n_head = n_head; a.n_head_kv = n_head_kv; a.hd = hd;
    a.max_kv = n_kv + 5; a.n_split = n_split; a.scale = scale; a.scratch = dscr;
    a.split_keys = split_keys;
    a.mma = mma;
    int rc = strata_k_attention(&ctx, &a, &err);
    KT_CUDA(cudaDeviceSynchronize());
    kt_down(got, dout, 4 * nq);
    size_t worst;
    /* the matrix-unit kernel splits q and the softmax weights into two f16 parts: the
     * FMA kernel's bound, doubled */
    double e = rc ? INFINITY : kt_err(got, ref, nq, mma ? 4e-5 : 2e-5, mma ? 4e-4 : 2e-4, &worst);
    ok(e <= 1, "attention%s n_tok=%d pos0=%d heads %d/%d hd=%d split %d (%d keys): err %.3g %s",
       mma ? " (matrix units)" : "", n_tok, pos0, n_head, n_head_kv, hd, n_split, split_keys, e,
       rc ? err.msg : "");
    if (!rc && e > 1)
        diag("  at %zu: gpu %.9g ref %.9g", worst, got[worst], ref[worst]);
    if (mma && !rc) {
        /* the matrix-unit kernel ran: the FMA kernel sums in another order, so the two
         * agree to the bound above but not in every bit */
        float *fma_out = (float *)malloc(4 * nq);
        a.mma = 0;
        kt_poison(dout, 4 * nq);
        rc = strata_k_attention(&ctx, &a, &err);
        KT_CUDA(cudaDeviceSynchronize());
        kt_down(fma_out, dout, 4 * nq);
        ok(!rc && memcmp(fma_out, got, 4 * (size_t)nq) != 0,
           "attention (matrix units) n_tok=%d hd=%d: not the FMA kernel's bits (it ran) %s",
           n_tok, hd, rc ? err.msg : "");
        free(fma_out);
    }
    if (mma) {
        cudaFree(dq); cudaFree(dout); cudaFree(dk); cudaFree(dv); cudaFree(dpos);
        if (dscr) cudaFree(dscr);
        free(q); free(kf); free(vf); free(kh); free(vh); free(ref); free(got); free(sc);
        return;
    }
    /* the merge in the last block of each tile, and the 8-bit output written by the
     * attention launch: the bytes of strata_k_quantize_q8 on its float output; run
     * twice, since the counters must be back at zero for the next launch */
    int nh = n_head * hd;
    size_t nc_cnt = strata_k_attn_counters(n_tok, n_head, n_head_kv);
    size_t qrb = strata_k_q8_row_bytes(nh);
    int *dcnt = (int *)kt_dev(sizeof(int) * nc_cnt);
    KT_CUDA(cudaMemset(dcnt, 0, sizeof(int) * nc_cnt));
    uint8_t *dq8 = (uint8_t *)kt_dev(qrb * n_tok), *dq8r = (uint8_t *)kt_dev(qrb * n_tok);
    uint8_t *g8 = (uint8_t *)malloc(qrb * n_tok), *r8 = (uint8_t *)malloc(qrb * n_tok);
    float *got2 = (float *)malloc(4 * nq);
    int *hcnt = (int *)malloc(sizeof(int) * nc_cnt);
    int with_q8 = hd % 32 == 0;
    a.counters = dcnt;
    a.out_q8 = with_q8 ? dq8 : NULL;
    a.out_q8_row = (int64_t)qrb;
    for (int run = 0; run < 2; run++) {
        kt_poison(dout, 4 * nq);
        kt_poison(dq8, qrb * n_tok);
        kt_poison(dq8r, qrb * n_tok);
        rc = strata_k_attention(&ctx, &a, &err);
        if (!rc && with_q8)
            rc = strata_k_quantize_q8(&ctx, dout, nh, nh, n_tok, 0, NULL, 0.0f, NULL, dq8r, &err);
        KT_CUDA(cudaDeviceSynchronize());
        kt_down(got2, dout, 4 * nq);
        kt_down(g8, dq8, qrb * n_tok);
        kt_down(r8, dq8r, qrb * n_tok);
        kt_down(hcnt, dcnt, sizeof(int) * nc_cnt);
        int zero = 1;
        for (size_t i = 0; i < nc_cnt; i++)
            zero &= hcnt[i] == 0;
        double e2 = rc ? INFINITY : kt_err(got2, ref, nq, 2e-5, 2e-4, &worst);
        int same8 = 1;
        if (with_q8)
            for (int t = 0; t < n_tok; t++)
                same8 &= memcmp(g8 + t * qrb, r8 + t * qrb, nh + nh / 8) == 0;
        ok(!rc && e2 <= 1 && zero && same8,
           "attention (merge in the last block%s, run %d) n_tok=%d pos0=%d heads %d/%d hd=%d "
           "split %d: err %.3g, counters %s, 8-bit rows %s %s",
           with_q8 ? ", 8-bit output" : "", run, n_tok, pos0, n_head, n_head_kv, hd, n_split,
           e2, zero ? "zero" : "left set", same8 ? "equal" : "differ", rc ? err.msg : "");
    }
    if (n_tok * gqa <= 8 && with_q8) {
        /* a decode-sized batch runs a 32-lane group a row; on the 32-row tiles of larger
         * batches it must give the same bits (a decode and a verify window agree), with
         * the merge in the last block and with the merge launch */
        float *t_out = (float *)malloc(4 * nq);
        uint8_t *t8 = (uint8_t *)malloc(qrb * n_tok);
        a.tiles = 1;
        kt_poison(dout, 4 * nq);
        kt_poison(dq8, qrb * n_tok);
        rc = strata_k_attention(&ctx, &a, &err);
        KT_CUDA(cudaDeviceSynchronize());
        kt_down(t_out, dout, 4 * nq);
        kt_down(t8, dq8, qrb * n_tok);
        int same8 = 1;
        for (int t = 0; t < n_tok; t++)
            same8 &= memcmp(g8 + t * qrb, t8 + t * qrb, nh + nh / 8) == 0;
        ok(!rc && !memcmp(t_out, got2, 4 * (size_t)nq) && same8,
           "attention n_tok=%d pos0=%d heads %d/%d hd=%d split %d: a row a 32-lane group = "
           "the 32-row tiles, bit for bit (last-block merge) %s", n_tok, pos0, n_head,
           n_head_kv, hd, n_split, rc ? err.msg : "");
        a.counters = NULL;
        a.out_q8 = NULL;
        for (int tiles = 0; tiles < 2; tiles++) {
            a.tiles = tiles;
            kt_poison(dout, 4 * nq);
            rc = strata_k_attention(&ctx, &a, &err);
            KT_CUDA(cudaDeviceSynchronize());
            kt_down(tiles ? t_out : got2, dout, 4 * nq);
        }
        ok(!rc && !memcmp(t_out, got2, 4 * (size_t)nq),
           "attention n_tok=%d pos0=%d heads %d/%d hd=%d split %d: a row a 32-lane group = "
           "the 32-row tiles, bit for bit (merge launch) %s", n_tok, pos0, n_head, n_head_kv,
           hd, n_split, rc ? err.msg : "");
        free(t_out);
        free(t8);
    }
    cudaFree(dcnt); cudaFree(dq8); cudaFree(dq8r);
    free(g8); free(r8); free(got2); free(hcnt);
    cudaFree(dq); cudaFree(dout); cudaFree(dk); cudaFree(dv); cudaFree(dpos);
    if (dscr) cudaFree(dscr);
    free(q); free(kf); free(vf); free(kh); free(vh); free(ref); free(got); free(sc);
}

static void test_route_combine(int n_tok, int n_expert, int k, int norm)
{
    struct strata_err err = {0, ""};
    int n = 200;
    float *lg = (float *)malloc(4 * n_tok * n_expert);
    kt_fill(lg, (size_t)n_tok * n_expert, 4.0f);
    lg[3] = lg[5] = 9.0f; /* a tie: the lower id first */
    int32_t *rid = (int32_t *)malloc(4 * n_tok * k), *gid = (int32_t *)malloc(4 * n_tok * k);
    float *rw = (float *)malloc(4 * n_tok * k), *gw = (float *)malloc(4 * n_tok * k);
    for (int t = 0; t < n_tok; t++) {
        const float *l = lg + t * n_expert;
        double mx = -1e300, s = 0;
        for (int e = 0; e < n_expert; e++) mx = fmax(mx, l[e]);
        for (int e = 0; e < n_expert; e++) s += exp(l[e] - mx);
        char *used = (char *)calloc(n_expert, 1);
        double sel = 0;
        for (int j = 0; j < k; j++) {
            int b = -1;
            for (int e = 0; e < n_expert; e++)
                if (!used[e] && (b < 0 || l[e] > l[b])) b = e;
            used[b] = 1;
            rid[t * k + j] = b;
            rw[t * k + j] = (float)(exp(l[b] - mx) / s);
            sel += rw[t * k + j];
        }
        if (norm)
            for (int j = 0; j < k; j++) rw[t * k + j] = (float)(rw[t * k + j] / sel);
        free(used);
    }
    float *dl = (float *)kt_up(lg, 4 * n_tok * n_expert), *dw = (float *)kt_dev(4 * n_tok * k);
    int32_t *di = (int32_t *)kt_dev(4 * n_tok * k);
    int rc = strata_k_moe_route(&ctx, dl, n_tok, n_expert, k, norm, 1.0f, di, dw, &err);
    KT_CUDA(cudaDeviceSynchronize());
    kt_down(gid, di, 4 * n_tok * k);
    kt_down(gw, dw, 4 * n_tok * k);
    size_t worst;
    double e = kt_err(gw, rw, n_tok * k, 1e-6, 1e-5, &worst);
    ok(!rc && memcmp(gid, rid, 4 * n_tok * k) == 0 && e <= 1,
       "moe_route n_tok=%d n_expert=%d k=%d norm=%d: ids %s, weight err %.3g %s", n_tok,
       n_expert, k, norm, memcmp(gid, rid, 4 * n_tok * k) ? "differ" : "equal", e,
       rc ? err.msg : "");
    /* combine */
    float *y = (float *)malloc(4 * n_tok * k * n), *add = (float *)malloc(4 * n_tok * n);
    float *ref = (float *)malloc(4 * n_tok * n), *got = (float *)malloc(4 * n_tok * n);
    kt_fill(y, (size_t)n_tok * k * n, 1.0f);
    kt_fill(add, (size_t)n_tok * n, 1.0f);
    for (int t = 0; t < n_tok; t++)
        for (int i = 0; i < n; i++) {
            double s = add[t * n + i];
            for (int j = 0; j < k; j++) s += (double)gw[t * k + j] * y[(t * k + j) * n + i];
            ref[t * n + i] = (float)s;
        }
    float *dy = (float *)kt_up(y, 4 * n_tok * k * n), *da = (float *)kt_up(add, 4 * n_tok * n);
    rc = strata_k_moe_combine(&ctx, dy, dw, n_tok, k, n, da, da, &err);
    KT_CUDA(cudaDeviceSynchronize());
    kt_down(got, da, 4 * n_tok * n);
    e = kt_err(got, ref, n_tok * n, 1e-6, 1e-5, &worst);
    ok(!rc && e <= 1, "moe_combine n_tok=%d k=%d: err %.3g %s", n_tok, k, e, rc ? err.msg : "");
    cudaFree(dl); cudaFree(dw); cudaFree(di); cudaFree(dy); cudaFree(da);
    free(lg); free(rid); free(gid); free(rw); free(gw); free(y); free(add); free(ref); free(got);
}

/* Non-finite router logits (activations that overflowed) still give k distinct expert
 * ids in range: NaNs are never chosen, and a row of NaNs picks the first k experts. */
static void test_route_nan(int n_expert, int k)
{
    struct strata_err err = {0, ""};
    int n_tok = 3;
    float *lg = (float *)malloc(4 * n_tok * n_expert);
    kt_fill(lg, (size_t)n_tok * n_expert, 4.0f);
    for (int e = 0; e < n_expert; e += 3)
        lg[e] = NAN; /* token 0: every third logit */
    for (int e = 0; e < n_expert; e++)
        lg[n_expert + e] = NAN; /* token 1: all */
    lg[2 * n_expert + 1] = NAN; /* token 2: one */
    int32_t *gid = (int32_t *)malloc(4 * n_tok * k);
    float *dl = (float *)kt_up(lg, 4 * n_tok * n_expert), *dw = (float *)kt_dev(4 * n_tok * k);
    int32_t *di = (int32_t *)kt_dev(4 * n_tok * k);
    int rc = strata_k_moe_route(&ctx, dl, n_tok, n_expert, k, 1, 1.0f, di, dw, &err);
    KT_CUDA(cudaDeviceSynchronize());
    kt_down(gid, di, 4 * n_tok * k);
    int good = !rc;
    for (int t = 0; t < n_tok; t++)
        for (int j = 0; j < k; j++) {
            int id = gid[t * k + j];
            good &= id >= 0 && id < n_expert;
            if (!good)
                break;
            if (t == 1)
                good &= id == j; /* a row of NaNs: the first k experts, in order */
            else
                good &= !isnan(lg[t * n_expert + id]);
            for (int i = 0; i < j; i++)
                good &= gid[t * k + i] != id;
        }
    ok(good, "moe_route n_expert=%d k=%d with NaN logits: ids in range, distinct, never a NaN "
       "expert %s", n_expert, k, rc ? err.msg : "");
    cudaFree(dl); cudaFree(dw); cudaFree(di);
    free(lg); free(gid);
}

/* Dense and grouped mat-mat against double sums over the decoded weights with
 * f16-rounded activations and weights (what the matrix units multiply). */
static void test_matmul(uint32_t type, int64_t ne0, int64_t ne1, int n_tok, int n_expert, int k,
                        int glu, int with_add)
{
    struct strata_err err = {0, ""};
    size_t rb;
    int grouped = n_expert > 0, ne = grouped ? n_expert : 1;
    int64_t nrow = ne1 * ne;
    uint8_t *w = kt_random_rows(type, ne0, nrow, &rb), *u = glu ? kt_random_rows(type, ne0, nrow, &rb) : NULL;
    float *wf = (float *)malloc(4 * ne0 * nrow), *uf = glu ? (float *)malloc(4 * ne0 * nrow) : NULL;
    strata_quant_dequant_ref(type, w, wf, ne0 * nrow, &err);
    if (glu)
        strata_quant_dequant_ref(type, u, uf, ne0 * nrow, &err);
    for (int64_t i = 0; i < ne0 * nrow; i++) {
        wf[i] = f16r(wf[i]);
        if (glu) uf[i] = f16r(uf[i]);
    }
    int n_asg = grouped ? n_tok * k : n_tok;
    int x_div = grouped && glu ? k : 1;        /* gate/up read the token, down its own row */
    int n_x = grouped ? (glu ? n_tok : n_asg) : n_tok;
    float *x = (float *)malloc(4 * ne0 * n_x);
    kt_fill(x, (size_t)ne0 * n_x, 1.0f);
    float *xr = (float *)malloc(4 * ne0 * n_x);
    for (int64_t i = 0; i < ne0 * n_x; i++) xr[i] = f16r(x[i]);
    int32_t *ids = (int32_t *)malloc(4 * (n_asg + 1));
    for (int i = 0; i < n_asg; i++)
        ids[i] = grouped ? (int32_t)(kt_u32() % (n_expert > 3 ? n_expert - 2 : n_expert)) : 0;
    float *add = (float *)malloc(4 * ne1 * n_asg);
    kt_fill(add, (size_t)ne1 * n_asg, 1.0f);
    float *ref = (float *)malloc(4 * ne1 * n_asg), *got = (float *)malloc(4 * ne1 * n_asg);
    double max_mag = 0;
    for (int i = 0; i < n_asg; i++) {
        const float *xs = xr + (int64_t)(i / x_div) * ne0;
        for (int64_t r = 0; r < ne1; r++) {
            const float *wr = wf + ((int64_t)ids[i] * ne1 + r) * ne0;
            double a = 0, b = 0, mag = 0;
            for (int64_t kk = 0; kk < ne0; kk++) {
                a += (double)wr[kk] * xs[kk];
                mag += fabs((double)wr[kk] * xs[kk]);
                if (glu) b += (double)uf[((int64_t)ids[i] * ne1 + r) * ne0 + kk] * xs[kk];
            }
            ref[i * ne1 + r] = (float)(glu ? silu(a) * b : a + (with_add ? add[i * ne1 + r] : 0));
            max_mag = fmax(max_mag, mag);
        }
    }
    void *dw = kt_up(w, rb * nrow), *du = glu ? kt_up(u, rb * nrow) : NULL;
    float *dx = (float *)kt_up(x, 4 * ne0 * n_x), *dy = (float *)kt_dev(4 * ne1 * n_asg);
    float *dadd = (float *)kt_up(add, 4 * ne1 * n_asg);
    int32_t *dids = (int32_t *)kt_up(ids, 4 * n_asg);
    int max_tiles = grouped ? strata_k_moe_max_tiles(n_asg, n_expert) : 0;
    int32_t *dperm = (int32_t *)kt_dev(4 * n_asg), *dtiles = (int32_t *)kt_dev(12 * (max_tiles + 1));
    int32_t *dnt = (int32_t *)kt_dev(4);
    kt_poison(dy, 4 * ne1 * n_asg);
    int rc = 0;
    if (grouped)
        rc = strata_k_moe_plan(&ctx, dids, n_asg, n_expert, dperm, dtiles, dnt, &err);
    struct strata_k_weight kw = {type, ne0, ne1, rb, rb * ne1, dw}, ku = {type, ne0, ne1, rb, rb * ne1, du};
    struct strata_k_mm_args a;
    memset(&a, 0, sizeof(a));
    a.w = &kw; a.up = glu ? &ku : NULL; a.glu = glu; a.n_tok = n_asg;
    if (grouped) {
        a.perm = dperm; a.tiles = dtiles; a.n_tiles = dnt; a.max_tiles = max_tiles; a.x_div = x_div;
    }
    a.x = dx; a.x_stride = ne0; a.y = dy; a.y_stride = ne1; a.add = with_add ? dadd : NULL;
    if (!rc)
        rc = strata_k_matmul(&ctx, &a, &err);
    KT_CUDA(cudaDeviceSynchronize());
    kt_down(got, dy, 4 * ne1 * n_asg);
    size_t worst;
    double atol = 1e-5 * max_mag * (glu ? max_mag + 1 : 1) + 1e-5;
    double e = rc ? INFINITY : kt_err(got, ref, ne1 * n_asg, atol, 1e-4, &worst);
    ok(e <= 1, "matmul%s%s %s [%lld x %lld] %d tok%s: err %.3g %s", glu ? " glu" : "",
       with_add ? " add" : "", strata_ggml_type_name(type), (long long)ne0, (long long)ne1, n_tok,
       grouped ? " grouped" : "", e, rc ? err.msg : "");
    if (!rc && e > 1)
        diag("  at %zu: gpu %.9g ref %.9g", worst, got[worst], ref[worst]);
    if (ctx.info.has_mma_f16 && !rc) {
        /* the pipelined kernel (f16 activations staged by cp.async, Q4_K fetched a step
         * ahead): the same tiles and mma order, so bit for bit the same outputs */
        __half *dxh = (__half *)kt_dev(2 * ne0 * n_x);
        float *got2 = (float *)malloc(4 * ne1 * n_asg);
        kt_poison(dy, 4 * ne1 * n_asg);
        a.xh = dxh;
        a.n_x = grouped ? n_x : 0; /* dense: the default (n_tok rows) */
        rc = strata_k_matmul(&ctx, &a, &err);
        KT_CUDA(cudaDeviceSynchronize());
        kt_down(got2, dy, 4 * ne1 * n_asg);
        size_t diff = 0, first = 0;
        for (size_t i = 0; i < (size_t)(ne1 * n_asg); i++)
            if (memcmp(&got[i], &got2[i], 4) != 0 && !diff++)
                first = i;
        ok(!rc && diff == 0, "matmul pipelined%s%s %s [%lld x %lld] %d tok%s: %zu of %lld "
           "outputs differ from the first kernel %s", glu ? " glu" : "", with_add ? " add" : "",
           strata_ggml_type_name(type), (long long)ne0, (long long)ne1, n_tok,
           grouped ? " grouped" : "", diff, (long long)(ne1 * n_asg), rc ? err.msg : "");
        if (diff)
            diag("  at %zu: pipelined %.9g first %.9g", first, got2[first], got[first]);
        cudaFree(dxh);
        free(got2);
    }
    cudaFree(dw); if (du) cudaFree(du); cudaFree(dx); cudaFree(dy); cudaFree(dadd); cudaFree(dids);
    cudaFree(dperm); cudaFree(dtiles); cudaFree(dnt);
    free(w); free(u); free(wf); free(uf); free(x); free(xr); free(ids); free(add); free(ref); free(got);
}

/* before_ref: (v, i) ranks before (w, j) - larger first, lower index on ties, -0 equal to
 * +0, NaN after every number */
static int before_ref(float v, int i, float w, int j)
{
    if (v != v || w != w)
        return (v == v && w != w) || (v != v && w != w && i < j);
    return v == w ? i < j : v > w;
}

/* ties: 0 continuous values; 1 few distinct values; 2 with NaN, -0/+0 and -inf; 3 all
 * NaN but 3; 4 all equal (but the two 50s every row has); 5 ascending */
static void test_topk(int n, int n_rows, int k, int ties)
{
    struct strata_err err = {0, ""};
    float *l = (float *)malloc(4 * (size_t)n * n_rows);
    kt_fill(l, (size_t)n * n_rows, 10.0f);
    for (int64_t i = 0; i < (int64_t)n * n_rows; i++) {
        if (ties == 1)
            l[i] = floorf(l[i]);
        else if (ties == 2 && i % 7 == 0)
            l[i] = i % 3 == 0 ? NAN : i % 3 == 1 ? -0.0f : (i % 2 ? 0.0f : -INFINITY);
        else if (ties == 3)
            l[i] = i % (n / 3) == 5 ? (float)i : NAN;
        else if (ties == 4) /* one value: no filter of a part can keep few keys */
            l[i] = 1.5f;
        else if (ties == 5) /* ascending: a part's best all in its last groups */
            l[i] = (float)(i % n) * 1e-3f;
    }
    for (int r = 0; r < n_rows; r++)
        l[(int64_t)r * n + n - 1] = l[(int64_t)r * n + 7] = 50.0f; /* tie: 7 first */
    int32_t *gi = (int32_t *)malloc(4 * k * n_rows), *am = (int32_t *)malloc(4 * n_rows);
    float *gv = (float *)malloc(4 * k * n_rows);
    float *dl = (float *)kt_up(l, 4 * (size_t)n * n_rows), *dv = (float *)kt_dev(4 * k * n_rows);
    int32_t *di = (int32_t *)kt_dev(4 * k * n_rows), *da = (int32_t *)kt_dev(4 * n_rows);
    void *scr = kt_dev(strata_k_topk_scratch(n, n_rows, k));
    double *dlse = (double *)kt_dev(8 * n_rows), *glse = (double *)malloc(8 * n_rows);
    /* the top-k with the log-sum-exp from its parts: the same ids and values as alone */
    int32_t *di2 = (int32_t *)kt_dev(4 * k * n_rows);
    float *dv2 = (float *)kt_dev(4 * k * n_rows);
    double *dlse2 = (double *)kt_dev(8 * n_rows), *glse2 = (double *)malloc(8 * n_rows);
    int32_t *gi2 = (int32_t *)malloc(4 * k * n_rows);
    float *gv2 = (float *)malloc(4 * k * n_rows);
    int rc = strata_k_topk(&ctx, dl, n, n_rows, k, scr, di, dv, &err);
    if (!rc)
        rc = strata_k_argmax(&ctx, dl, n, n_rows, da, &err);
    if (!rc)
        rc = strata_k_logsumexp(&ctx, dl, n, n_rows, dlse, &err);
    if (!rc)
        rc = strata_k_topk_lse(&ctx, dl, n, n_rows, k, scr, di2, dv2, dlse2, &err);
    KT_CUDA(cudaDeviceSynchronize());
    kt_down(glse, dlse, 8 * n_rows);
    kt_down(glse2, dlse2, 8 * n_rows);
    kt_down(gi2, di2, 4 * k * n_rows);
    kt_down(gv2, dv2, 4 * k * n_rows);
    int lse_ok = 1;
    for (int r = 0; r < n_rows && !rc; r++) {
        /* the largest number, then float exponentials summed in double; NaN skipped */
        const float *lr = l + (int64_t)r * n;
        float mx = -INFINITY;
        for (int i = 0; i < n; i++)
            if (lr[i] > mx)
                mx = lr[i];
        double sum = 0;
        for (int i = 0; i < n; i++)
            if (lr[i] == lr[i])
                sum += (double)expf(lr[i] - mx);
        const double want = (double)mx + log(sum);
        if (!(fabs(glse[r] - want) <= 1e-9 * (1 + fabs(want)))) {
            lse_ok = 0;
            diag("row %d: logsumexp %.12g, reference %.12g", r, glse[r], want);
        }
        /* (an all-NaN row's -inf equals itself; a NaN result never passes) */
        if (!(glse2[r] == want || fabs(glse2[r] - want) <= 1e-9 * (1 + fabs(want)))) {
            lse_ok = 0;
            diag("row %d: topk_lse's log-sum-exp %.12g, reference %.12g", r, glse2[r], want);
        }
    }
    kt_down(gi, di, 4 * k * n_rows);
    kt_down(gv, dv, 4 * k * n_rows);
    kt_down(am, da, 4 * n_rows);
    int good = !rc;
    char *used = (char *)malloc(n);
    for (int r = 0; r < n_rows && good; r++) {
        memset(used, 0, n);
        const float *lr = l + (int64_t)r * n;
        for (int j = 0; j < k && good; j++) {
            int b = -1;
            for (int i = 0; i < n; i++)
                if (!used[i] && (b < 0 || before_ref(lr[i], i, lr[b], b)))
                    b = i;
            used[b] = 1;
            if (lr[b] != lr[b]) /* only NaN left: none */
                good = gi[r * k + j] == -1 && gv[r * k + j] == -INFINITY;
            else
                good = gi[r * k + j] == b && gv[r * k + j] == lr[b] && (j || am[r] == b);
            if (!good)
                diag("row %d rank %d: gpu %d (%g), reference %d (%g)", r, j, gi[r * k + j],
                     gv[r * k + j], b, lr[b]);
        }
    }
    const int same2 = !rc && !memcmp(gi, gi2, 4 * (size_t)k * n_rows) &&
                      !memcmp(gv, gv2, 4 * (size_t)k * n_rows);
    ok(good && lse_ok && same2, "topk/argmax/logsumexp n=%d rows=%d k=%d ties=%d (topk_lse: "
       "top-k %s) %s", n, n_rows, k, ties, same2 ? "the same" : "differs", rc ? err.msg : "");
    cudaFree(dl); cudaFree(dv); cudaFree(di); cudaFree(da); cudaFree(scr); cudaFree(dlse);
    cudaFree(di2); cudaFree(dv2); cudaFree(dlse2);
    free(l); free(gi); free(am); free(gv); free(used); free(glse); free(glse2); free(gi2);
    free(gv2);
}

static void test_ops(void)
{
    test_rms_norm(2048, 3);
    test_rms_norm(37, 5);
    test_rms_norm(128, 64);
    test_qkv_post(2, 3, 32, 4, 128, 128, 1, 17, 1.0f, 0.0f);
    test_qkv_post(0, 2, 8, 4, 8, 8, 0, 0, 1.0f, 0.0f);
    test_qkv_post(2, 5, 8, 2, 32, 32, 1, 300, 1.0f, 0.0f);
    test_qkv_post(0, 1, 6, 2, 64, 32, 0, 4000, 0.25f, 1.0f); /* partial rotation, YaRN */
    test_attention(1, 0, 8, 4, 8, 1);
    test_attention(1, 300, 32, 4, 128, 1);
    test_attention(1, 1000, 32, 4, 128, 7);
    test_attention(1, 77, 8, 2, 32, 16); /* more splits than tiles */
    test_attention(37, 0, 8, 2, 32, 1);
    test_attention(70, 50, 32, 4, 128, 1);
    test_attention(5, 200, 16, 16, 64, 3);
    test_attention(3, 517, 12, 3, 96, 9);  /* 8-bit output, odd shapes, 5 of 9 splits */
    test_attention(17, 120, 32, 4, 128, 32); /* a full verify window, 1 or 2 splits a row */
    /* splits of at least 32 keys (the backend's default): short contexts split too */
    test_attention(1, 40, 32, 4, 128, 32, 32);
    test_attention(1, 100, 32, 4, 128, 32, 32);
    test_attention(1, 1000, 32, 4, 128, 32, 32); /* every one of 32 splits merged */
    test_attention(2, 260, 8, 2, 64, 4);            /* two tokens, 8 rows: row groups */
    test_attention(1, 90, 6, 2, 96, 2, 32);         /* 3 rows of 8, hd 96, 2 splits */
    test_attention(1, 33, 4, 4, 32, 1);             /* one row a kv head, hd 32 */
    test_attention(1, 500, 8, 1, 96, 8, 32);        /* 8 rows, hd 96, 8 splits merged */
    test_attention(1, 500, 8, 1, 32, 8, 32);        /* hd 32, 8 splits */
    test_attention(8, 1000, 8, 8, 128, 32, 32);     /* 8 tokens, rows of unequal splits */
    test_attention(7, 200, 7, 7, 96, 5, 32);        /* 7 tokens, hd 96 */
    test_attention(17, 50, 32, 4, 128, 32, 32);
    test_attention(3, 517, 12, 3, 96, 9, 64);
    /* prefill on the matrix units: GQA 8, 4 and 1, a first chunk and later chunks, rows
     * that end inside a tile, hd 128 and 64 */
    test_attention(200, 0, 32, 4, 128, 1, 0, 1);
    test_attention(77, 130, 32, 4, 128, 1, 0, 1);
    test_attention(300, 0, 16, 4, 64, 1, 0, 1);
    test_attention(65, 1000, 8, 8, 128, 1, 0, 1);
    test_attention(33, 5, 12, 3, 64, 1, 0, 1);
    test_attention(150, 20, 16, 4, 32, 1, 0, 1);
    test_route_combine(1, 128, 8, 1);
    test_route_combine(9, 16, 4, 1);
    test_route_combine(3, 60, 6, 0);
    test_route_combine(2, 256, 8, 1); /* the most experts a lane's registers hold */
    test_route_combine(2, 257, 8, 0); /* one more: the shared-memory rounds */
    test_route_nan(128, 8);
    test_route_nan(40, 6);
    test_matmul(STRATA_TYPE_F16, 256, 100, 37, 0, 0, 0, 1);
    test_matmul(STRATA_TYPE_Q4_K, 2048, 200, 130, 0, 0, 0, 0);
    test_matmul(STRATA_TYPE_Q6_K, 512, 64, 64, 0, 0, 1, 0);
    test_matmul(STRATA_TYPE_IQ2_XS, 256, 70, 9, 0, 0, 0, 1);
    test_matmul(STRATA_TYPE_Q4_0, 128, 33, 200, 0, 0, 0, 0);
    test_matmul(STRATA_TYPE_Q4_K, 512, 96, 70, 8, 4, 1, 0);  /* grouped gate/up */
    test_matmul(STRATA_TYPE_Q4_K, 2048, 768, 40, 16, 4, 1, 0); /* the benchmark's gate/up */
    test_matmul(STRATA_TYPE_Q4_K, 768, 2048, 40, 16, 4, 0, 0); /* and its down */
    test_matmul(STRATA_TYPE_Q4_K, 256, 100, 45, 5, 3, 1, 0);  /* rows past the last tile */
    test_matmul(STRATA_TYPE_Q6_K, 768, 130, 90, 12, 8, 0, 0); /* grouped down, Q6_K */
    test_matmul(STRATA_TYPE_Q4_K, 1024, 70, 129, 0, 0, 0, 1); /* dense with add */
    test_matmul(STRATA_TYPE_Q4_K, 512, 96, 70, 0, 0, 1, 0);   /* dense SwiGLU */
    test_matmul(STRATA_TYPE_Q5_K, 256, 130, 33, 16, 4, 0, 0); /* grouped down */
    test_matmul(STRATA_TYPE_IQ4_XS, 256, 64, 100, 3, 2, 1, 0);
    test_matmul(STRATA_TYPE_F32, 64, 10, 5, 0, 0, 0, 0);
    for (int i = 0; i < KT_N_TYPES; i++)
        test_matmul(kt_all_types[i], 256, 65, 66, 0, 0, 0, 0);
    test_topk(151936, 2, 40, 0);
    test_topk(1000, 3, 1, 0);
    test_topk(151936, 1, 64, 1);  /* many ties across parts */
    test_topk(300000, 2, 64, 2);  /* parts longer than one sort, NaN, -0/+0, -inf */
    test_topk(4096 * 70, 1, 8, 0); /* 70 parts */
    test_topk(200, 2, 64, 2);     /* one short part */
    test_topk(9000, 2, 16, 3);    /* fewer numbers than k */
    test_topk(151936, 1, 64, 4);  /* every logit equal but two */
    test_topk(151936, 2, 40, 5);  /* ascending */
    test_topk(151936, 1, 1, 0);   /* greedy's k */
    test_topk(32000, 1, 20, 0);   /* a Llama vocabulary, Qwen3's suggested top_k */
    {
        struct strata_err err = {0, ""};
        ok(strata_k_topk(&ctx, NULL, 100, 1, 65, (void *)&err, NULL, NULL, &err) ==
               STRATA_E_INVALID && strata_k_topk_scratch(100, 1, 65) == 0,
           "topk refuses k 65: %s", err.msg);
    }
}

int main(void)
{
    struct strata_err err = {0, ""};
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("1..0 # SKIP no GPU device\n");
        return 0;
    }
    if (strata_gpu_info_query(0, &ctx.info, &err)) {
        printf("Bail out! %s\n", err.msg);
        return 1;
    }
    KT_CUDA(cudaStreamCreate(&ctx.stream));
    const char *sd = getenv("STRATA_SYNC_DEBUG");
    ctx.sync_debug = sd && *sd == '1';
    diag("device %d: %s (%s), warp %d, %d SMs", ctx.info.device, ctx.info.name, ctx.info.arch,
         ctx.info.warp_size, ctx.info.n_sm);

    for (int i = 0; i < KT_N_TYPES; i++) {
        uint32_t t = kt_all_types[i];
        int64_t qk = strata_ggml_blck_size(t);
        if (qk == 1)
            qk = 32;
        if (!strata_quant_supported(t)) {
            ok(0, "CPU reference decoder for %s", strata_ggml_type_name(t));
            continue;
        }
        test_decode(t, qk, 1);
        test_decode(t, qk * 8, 37);
        test_matvec(t, qk, 1, 1, 1, 1, 0, 0);
        test_matvec(t, qk * 3, 7, 1, 1, 1, 0, 1);
        test_matvec(t, qk * 8, 257, 1, 3, 1, 0, 0);
        test_matvec(t, qk * (qk == 32 ? 64 : 8), 96, 5, 8, 4, 1, 0);
        test_matvec(t, qk * (qk == 32 ? 24 : 3), 200, 6, 6, 1, 0, 0);
    }
    test_matvec(STRATA_TYPE_F32, 100, 33, 1, 2, 1, 0, 0);  /* ne0 not a multiple of 8 */
    test_matvec(STRATA_TYPE_F16, 20, 5, 1, 1, 1, 0, 1);
    test_matvec(STRATA_TYPE_Q4_K, 4096, 2048, 1, 1, 1, 0, 1); /* large */
    test_matvec(STRATA_TYPE_Q6_K, 2048, 8191, 1, 1, 1, 0, 0);
    test_matvec(STRATA_TYPE_Q8_0, 8192, 1024, 1, 2, 1, 0, 0);
    test_matvec_batch_invariance(STRATA_TYPE_Q4_K);
    test_matvec_batch_invariance(STRATA_TYPE_IQ2_XS);
    test_errors();
    test_ops();
    test_q8();

    cudaStreamDestroy(ctx.stream);
    return tap_done();
}
