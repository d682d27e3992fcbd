/* test_kernels.cu - every GPU kernel against the CPU reference (make check-gpu).
 *
 * Weights are random blocks of every block type (random quants and signs, small
 * random scales), decoded on the CPU by strata_quant_dequant_ref, the ground truth.
 * Shapes include single blocks, odd row counts and large matrices. */
#include "kt_common.h"

/* Offsets of the f16 scale fields in a block, -1 terminated. */
static const int *scale_offsets(uint32_t type)
{
    static const int at0[] = {0, -1}, at02[] = {0, 2, -1}, q2k[] = {80, 82, -1},
                     q3k[] = {108, -1}, q6k[] = {208, -1}, none[] = {-1};
    switch (type) {
    case STRATA_TYPE_Q4_1: case STRATA_TYPE_Q5_1: case STRATA_TYPE_Q4_K: case STRATA_TYPE_Q5_K:
        return at02;
    case STRATA_TYPE_Q2_K: return q2k;
    case STRATA_TYPE_Q3_K: return q3k;
    case STRATA_TYPE_Q6_K: return q6k;
    case STRATA_TYPE_IQ1_M: case STRATA_TYPE_MXFP4: return none;
    default: return at0;
    }
}

static void put_f16(uint8_t *p, float f)
{
    strata_f16 h = strata_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* n_rows rows of ne0 random values of type; returns malloc'ed bytes. */
static uint8_t *random_rows(uint32_t type, int64_t ne0, int64_t n_rows, size_t *row_bytes)
{
    size_t rb = strata_ggml_row_size(type, (uint64_t)ne0);
    uint8_t *w = (uint8_t *)malloc(rb * (size_t)n_rows);
    *row_bytes = rb;
    if (type == STRATA_TYPE_F32 || type == STRATA_TYPE_F16 || type == STRATA_TYPE_BF16) {
        int64_t n = ne0 * n_rows;
        for (int64_t i = 0; i < n; i++) {
            float f = kt_unif(-1.0f, 1.0f);
            if (type == STRATA_TYPE_F32)
                memcpy(w + 4 * i, &f, 4);
            else if (type == STRATA_TYPE_F16)
                put_f16(w + 2 * i, f);
            else {
                strata_bf16 b = strata_f32_to_bf16(f);
                memcpy(w + 2 * i, &b, 2);
            }
        }
        return w;
    }
    for (size_t i = 0; i < rb * (size_t)n_rows; i++)
        w[i] = (uint8_t)kt_u32();
    size_t bb = strata_ggml_type_size(type);
    size_t nblk = rb * (size_t)n_rows / bb;
    for (size_t b = 0; b < nblk; b++) {
        uint8_t *blk = w + b * bb;
        for (const int *o = scale_offsets(type); *o >= 0; o++) {
            float s = kt_unif(0.002f, 0.02f);
            put_f16(blk + *o, (kt_u32() & 1) ? -s : s);
        }
        if (type == STRATA_TYPE_IQ1_M) {
            /* the f16 scale is the top nibbles of the four 16-bit scale words */
            strata_f16 h = strata_f32_to_f16(kt_unif(0.002f, 0.02f));
            for (int k = 0; k < 4; k++) {
                uint16_t s;
                memcpy(&s, blk + 48 + 2 * k, 2);
                s = (uint16_t)((s & 0x0fff) | (((h >> (4 * k)) & 0xf) << 12));
                memcpy(blk + 48 + 2 * k, &s, 2);
            }
        }
        if (type == STRATA_TYPE_MXFP4)
            blk[0] = (uint8_t)(118 + kt_u32() % 8); /* 2^-9 .. 2^-2 */
    }
    return w;
}

static const uint32_t all_types[] = {
    STRATA_TYPE_F32, STRATA_TYPE_F16, STRATA_TYPE_BF16, STRATA_TYPE_Q4_0, STRATA_TYPE_Q4_1,
    STRATA_TYPE_Q5_0, STRATA_TYPE_Q5_1, STRATA_TYPE_Q8_0, STRATA_TYPE_Q2_K, STRATA_TYPE_Q3_K,
    STRATA_TYPE_Q4_K, STRATA_TYPE_Q5_K, STRATA_TYPE_Q6_K, STRATA_TYPE_IQ2_XXS,
    STRATA_TYPE_IQ2_XS, STRATA_TYPE_IQ2_S, STRATA_TYPE_IQ3_XXS, STRATA_TYPE_IQ3_S,
    STRATA_TYPE_IQ1_S, STRATA_TYPE_IQ1_M, STRATA_TYPE_IQ4_NL, STRATA_TYPE_IQ4_XS,
    STRATA_TYPE_MXFP4,
};
#define N_TYPES (sizeof(all_types) / sizeof(all_types[0]))

static struct strata_gpu_ctx ctx;

/* get_rows: the GPU decoder equals the CPU reference (1 ulp allowed: the i-quants
 * multiply in a different order). */
static void test_decode(uint32_t type, int64_t ne0, int64_t ne1)
{
    struct strata_err err = {0, ""};
    size_t rb;
    uint8_t *w = random_rows(type, ne0, ne1, &rb);
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
    uint8_t *w = random_rows(type, ne0, nrow, &rb);
    uint8_t *u = glu ? random_rows(type, ne0, nrow, &rb) : NULL;
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
    uint8_t *w = random_rows(type, ne0, ne1, &rb);
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

    for (size_t i = 0; i < N_TYPES; i++) {
        uint32_t t = all_types[i];
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
    test_matvec(STRATA_TYPE_F16, 13, 5, 1, 1, 1, 0, 1);
    test_matvec(STRATA_TYPE_Q4_K, 4096, 2048, 1, 1, 1, 0, 1); /* large */
    test_matvec(STRATA_TYPE_Q6_K, 2048, 8191, 1, 1, 1, 0, 0);
    test_matvec(STRATA_TYPE_Q8_0, 8192, 1024, 1, 2, 1, 0, 0);
    test_matvec_batch_invariance(STRATA_TYPE_Q4_K);
    test_matvec_batch_invariance(STRATA_TYPE_IQ2_XS);
    test_errors();

    cudaStreamDestroy(ctx.stream);
    return tap_done();
}
