/* selftest.cu - the kernel self-test table of the GPU backend (lib/selftest.h): every
 * launcher the backend uses, on small random non-zero inputs, against plain C
 * references in double precision over the CPU decoders (strata_quant_dequant_ref).
 * Outputs are poisoned (NaN) before each launch so that an element left unwritten
 * fails.  The harness runs the cases in a child process with a deadline each.
 *
 * Test builds: compiled with -DSTRATA_BREAK_KERNEL='"name"' (make cuda
 * STRATA_BREAK_KERNEL=name), the case of that kernel (or every case whose name starts
 * with it, e.g. "matvec") is broken on purpose after its launch, as STRATA_BREAK_MODE
 * says: "wrong" (default) overwrites the output with wrong values, "fault" makes a
 * kernel write through an invalid pointer, "hang" launches a kernel that never ends.
 * They prove that a broken kernel is reported with its name. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kref.h"

extern "C" {
#include "selftest.h"
}

/* ---- buffers of one case, freed together ---- */

#define ST_MAX_BUF 24
struct st {
    int dev;
    struct strata_gpu_ctx ctx;
    void *d[ST_MAX_BUF];
    int n_d;
    void *h[ST_MAX_BUF];
    int n_h;
    char *msg;
    size_t msg_cap;
    int rc;
};

static int st_fail(struct st *s, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int st_fail(struct st *s, int rc, const char *fmt, ...)
{
    if (s->rc)
        return s->rc;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->msg, s->msg_cap, fmt, ap);
    va_end(ap);
    s->rc = rc;
    return rc;
}

/* A runtime call: on error the case faults with the call and the runtime's message. */
#define ST_RT(s, call)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            st_fail((s), STRATA_SELFTEST_FAULT, "%s: %s (%s)", #call, cudaGetErrorString(e_),      \
                    cudaGetErrorName(e_));                                                         \
    } while (0)

static int st_begin(struct st *s, int dev, char *msg, size_t cap)
{
    memset(s, 0, sizeof(*s));
    s->dev = dev;
    s->msg = msg;
    s->msg_cap = cap;
    struct strata_err err = {0, ""};
    ST_RT(s, cudaSetDevice(dev));
    if (!s->rc && strata_gpu_info_query(dev, &s->ctx.info, &err))
        st_fail(s, STRATA_SELFTEST_FAULT, "%s", err.msg);
    if (!s->rc)
        ST_RT(s, cudaStreamCreate(&s->ctx.stream));
    s->ctx.sync_debug = 1; /* a fault is reported by the launch that caused it */
    return s->rc;
}

static int st_end(struct st *s)
{
    for (int i = 0; i < s->n_d; i++)
        (void)cudaFree(s->d[i]);
    for (int i = 0; i < s->n_h; i++)
        free(s->h[i]);
    if (s->ctx.stream)
        (void)cudaStreamDestroy(s->ctx.stream);
    return s->rc;
}

static void *st_host(struct st *s, size_t bytes)
{
    if (s->rc)
        return NULL;
    void *p = s->n_h < ST_MAX_BUF ? calloc(1, bytes ? bytes : 1) : NULL;
    if (!p) {
        st_fail(s, STRATA_SELFTEST_FAULT, "out of host memory (%zu bytes)", bytes);
        return NULL;
    }
    s->h[s->n_h++] = p;
    return p;
}

/* Device buffer poisoned with NaN. */
static void *st_dev(struct st *s, size_t bytes)
{
    if (s->rc)
        return NULL;
    void *p = NULL;
    if (s->n_d >= ST_MAX_BUF) {
        st_fail(s, STRATA_SELFTEST_FAULT, "too many buffers");
        return NULL;
    }
    ST_RT(s, cudaMalloc(&p, bytes ? bytes : 1));
    if (s->rc)
        return NULL;
    s->d[s->n_d++] = p;
    ST_RT(s, cudaMemset(p, 0xff, bytes ? bytes : 1));
    return p;
}

static void *st_up(struct st *s, const void *h, size_t bytes)
{
    void *d = st_dev(s, bytes);
    if (d)
        ST_RT(s, cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return s->rc ? NULL : d;
}

static void st_down(struct st *s, void *h, const void *d, size_t bytes)
{
    if (!s->rc)
        ST_RT(s, cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* A launcher's return code and message; then wait for the kernel. */
static void st_launched(struct st *s, const char *kernel, int rc, const struct strata_err *err,
                        void *out, size_t out_bytes);

/* Compare n results; fails the case as WRONG when any is off. */
static void st_compare(struct st *s, const char *what, const float *got, const float *ref, size_t n,
                       double atol, double rtol)
{
    if (s->rc)
        return;
    size_t worst;
    double e = kt_err(got, ref, n, atol, rtol, &worst);
    if (e > 1.0)
        st_fail(s, STRATA_SELFTEST_WRONG,
                "%s differs from the CPU reference: at %zu gpu %.6g ref "
                "%.6g (%.3g times the tolerance)",
                what, worst, got[worst], ref[worst], e);
}

/* ---- deliberate breakage (test builds) ---- */

#ifdef STRATA_BREAK_KERNEL
#ifndef STRATA_BREAK_MODE
#define STRATA_BREAK_MODE "wrong"
#endif
__global__ void st_break_fault(float *p)
{
    p[threadIdx.x] = 1.0f;
}

__global__ void st_break_hang(volatile int *flag)
{
    while (*flag == 0) {
    }
}

static int st_broken(const char *kernel)
{
    size_t n = strlen(STRATA_BREAK_KERNEL);
    return strncmp(kernel, STRATA_BREAK_KERNEL, n) == 0 && (kernel[n] == '\0' || kernel[n] == ' ');
}

static void st_break(struct st *s, const char *kernel, void *out, size_t out_bytes)
{
    if (!st_broken(kernel) || s->rc)
        return;
    if (strcmp(STRATA_BREAK_MODE, "fault") == 0) {
        st_break_fault<<<1, 64, 0, s->ctx.stream>>>((float *)(uintptr_t)0x10);
    } else if (strcmp(STRATA_BREAK_MODE, "hang") == 0) {
        int *flag = (int *)st_dev(s, sizeof(int));
        if (flag) {
            ST_RT(s, cudaMemset(flag, 0, sizeof(int)));
            st_break_hang<<<1, 1, 0, s->ctx.stream>>>(flag);
        }
    } else if (out) {
        ST_RT(s, cudaMemsetAsync(out, 0x3f, out_bytes, s->ctx.stream));
    }
}
#else
static void st_break(struct st *s, const char *kernel, void *out, size_t out_bytes)
{
    (void)s;
    (void)kernel;
    (void)out;
    (void)out_bytes;
}
#endif

static void st_launched(struct st *s, const char *kernel, int rc, const struct strata_err *err,
                        void *out, size_t out_bytes)
{
    if (s->rc)
        return;
    if (rc) {
        st_fail(s, rc == STRATA_E_GPU ? STRATA_SELFTEST_FAULT : STRATA_SELFTEST_WRONG, "%s",
                err->msg);
        return;
    }
    st_break(s, kernel, out, out_bytes);
    if (!s->rc)
        ST_RT(s, cudaStreamSynchronize(s->ctx.stream));
    if (!s->rc)
        ST_RT(s, cudaGetLastError());
}

/* ---- references ---- */

static double st_silu(double v)
{
    return v / (1 + exp(-v));
}

static float st_f16r(float f)
{
    return strata_f16_to_f32(strata_f32_to_f16(f));
}

/* Random weights of type on the host and device, and their decoded values. */
struct st_w {
    struct strata_k_weight kw;
    float *f; /* decoded, ne0 * ne1 * n_exp */
};

static void st_weights(struct st *s, struct st_w *w, uint32_t type, int64_t ne0, int64_t ne1,
                       int n_exp, int f16_round)
{
    size_t rb = 0;
    int64_t nrow = ne1 * n_exp;
    memset(w, 0, sizeof(*w));
    if (s->rc)
        return;
    uint8_t *raw = kt_random_rows(type, ne0, nrow, &rb);
    if (!raw) {
        st_fail(s, STRATA_SELFTEST_FAULT, "out of host memory");
        return;
    }
    if (s->n_h >= ST_MAX_BUF) {
        free(raw);
        st_fail(s, STRATA_SELFTEST_FAULT, "too many buffers");
        return;
    }
    s->h[s->n_h++] = raw;
    w->f = (float *)st_host(s, sizeof(float) * ne0 * nrow);
    struct strata_err err = {0, ""};
    if (w->f && strata_quant_dequant_ref(type, raw, w->f, ne0 * nrow, &err))
        st_fail(s, STRATA_SELFTEST_WRONG, "CPU reference: %s", err.msg);
    if (!s->rc && f16_round)
        for (int64_t i = 0; i < ne0 * nrow; i++)
            w->f[i] = st_f16r(w->f[i]);
    w->kw.type = type;
    w->kw.ne0 = ne0;
    w->kw.ne1 = ne1;
    w->kw.nb1 = rb;
    w->kw.nb2 = rb * ne1;
    w->kw.data = st_up(s, raw, rb * nrow);
}

static int64_t st_blck(uint32_t type)
{
    int64_t qk = strata_ggml_blck_size(type);
    return qk == 1 ? 32 : qk;
}

/* ---- cases ---- */

static int c_init(int dev, char *msg, size_t cap)
{
    struct st s;
    st_begin(&s, dev, msg, cap);
    if (!s.rc) {
        struct strata_err err = {0, ""};
        if (strata_gpu_check_image(&s.ctx.info, &err))
            st_fail(&s, STRATA_SELFTEST_FAULT, "%s", err.msg);
    }
    return st_end(&s);
}

static int c_get_rows(int dev, int type, char *shapes, size_t sc, char *msg, size_t mc)
{
    struct st s;
    int64_t ne0 = st_blck(type) * 2, ne1 = 5;
    int rows[3] = {4, 0, 2};
    snprintf(shapes, sc, "%s [%lld x %lld], rows 4 0 2", strata_ggml_type_name(type),
             (long long)ne0, (long long)ne1);
    st_begin(&s, dev, msg, mc);
    struct st_w w;
    st_weights(&s, &w, type, ne0, ne1, 1, 0);
    int32_t *drows = (int32_t *)st_up(&s, rows, sizeof(rows));
    float *dy = (float *)st_dev(&s, sizeof(float) * ne0 * 3);
    float *got = (float *)st_host(&s, sizeof(float) * ne0 * 3);
    float *ref = (float *)st_host(&s, sizeof(float) * ne0 * 3);
    if (!s.rc) {
        struct strata_err err = {0, ""};
        int rc = strata_k_get_rows(&s.ctx, &w.kw, drows, 3, dy, &err);
        st_launched(&s, "get_rows", rc, &err, dy, sizeof(float) * ne0 * 3);
        st_down(&s, got, dy, sizeof(float) * ne0 * 3);
        for (int i = 0; i < 3 && !s.rc; i++)
            memcpy(ref + i * ne0, w.f + rows[i] * ne0, sizeof(float) * ne0);
        st_compare(&s, "get_rows", got, ref, ne0 * 3, 1e-30, 2.5e-7);
    }
    return st_end(&s);
}

/* Plain and routed/GLU products: 3 experts, 4 slots, 2 slots per input row. */
static int c_matvec(int dev, int type, char *shapes, size_t sc, char *msg, size_t mc)
{
    struct st s;
    int64_t ne0 = st_blck(type) * 4, ne1 = 33;
    int n_exp = 3, n_slot = 4, x_group = 2, n_x = 2;
    int32_t ids[4] = {2, 0, 1, 2};
    snprintf(shapes, sc, "%s [%lld x %lld] x%d experts, %d slots; glu", strata_ggml_type_name(type),
             (long long)ne0, (long long)ne1, n_exp, n_slot);
    st_begin(&s, dev, msg, mc);
    struct st_w w, u;
    st_weights(&s, &w, type, ne0, ne1, n_exp, 0);
    st_weights(&s, &u, type, ne0, ne1, n_exp, 0);
    float *x = (float *)st_host(&s, sizeof(float) * ne0 * n_x);
    float *ref = (float *)st_host(&s, sizeof(float) * ne1 * n_slot * 2);
    float *got = (float *)st_host(&s, sizeof(float) * ne1 * n_slot * 2);
    if (s.rc)
        return st_end(&s);
    kt_fill(x, ne0 * n_x, 1.0f);
    double max_mag = 0;
    for (int glu = 0; glu < 2; glu++)
        for (int sl = 0; sl < n_slot; sl++) {
            const float *xs = x + (sl / x_group) * ne0;
            int e = glu ? ids[sl] : 0;
            for (int64_t r = 0; r < ne1; r++) {
                const float *wr = w.f + ((int64_t)e * ne1 + r) * ne0;
                const float *ur = u.f + ((int64_t)e * ne1 + r) * ne0;
                double a = 0, b = 0, mag = 0;
                for (int64_t k = 0; k < ne0; k++) {
                    a += (double)wr[k] * xs[k];
                    b += (double)ur[k] * xs[k];
                    mag += fabs((double)wr[k] * xs[k]);
                }
                ref[(glu * n_slot + sl) * ne1 + r] = (float)(glu ? st_silu(a) * b : a);
                max_mag = fmax(max_mag, mag);
            }
        }
    float *dx = (float *)st_up(&s, x, sizeof(float) * ne0 * n_x);
    int32_t *dids = (int32_t *)st_up(&s, ids, sizeof(ids));
    float *dy = (float *)st_dev(&s, sizeof(float) * ne1 * n_slot * 2);
    for (int glu = 0; glu < 2 && !s.rc; glu++) {
        struct strata_k_mv_args a;
        memset(&a, 0, sizeof(a));
        a.w = &w.kw;
        a.up = glu ? &u.kw : NULL;
        a.glu = glu;
        a.ids = glu ? dids : NULL;
        a.n_slot = n_slot;
        a.x_group = x_group;
        a.x = dx;
        a.x_stride = ne0;
        a.y = dy + glu * n_slot * ne1;
        a.y_stride = ne1;
        struct strata_err err = {0, ""};
        int rc = strata_k_matvec(&s.ctx, &a, &err);
        st_launched(&s, "matvec", rc, &err, a.y, sizeof(float) * ne1 * n_slot);
    }
    st_down(&s, got, dy, sizeof(float) * ne1 * n_slot * 2);
    double atol = 2e-6 * max_mag * (max_mag + 1) + 1e-6;
    st_compare(&s, "matvec", got, ref, ne1 * n_slot * 2, atol, 1e-5);
    return st_end(&s);
}

/* Dense mat-mat with add (arg: type), or grouped GLU over a moe_plan (arg < 0: -type). */
static int matmul_case(int dev, uint32_t type, int grouped, char *shapes, size_t sc, char *msg,
                       size_t mc)
{
    struct st s;
    int64_t ne0 = st_blck(type) * (st_blck(type) == 32 ? 8 : 1), ne1 = 40;
    int n_tok = 19, k = grouped ? 2 : 1, n_expert = grouped ? 4 : 1, glu = grouped;
    int n_asg = n_tok * k, n_x = n_tok;
    snprintf(shapes, sc, "%s [%lld x %lld] %d tok%s", strata_ggml_type_name(type), (long long)ne0,
             (long long)ne1, n_tok, grouped ? ", 4 experts k=2 glu" : ", add");
    st_begin(&s, dev, msg, mc);
    struct st_w w, u;
    st_weights(&s, &w, type, ne0, ne1, n_expert, 1);
    st_weights(&s, &u, type, ne0, ne1, n_expert, 1);
    float *x = (float *)st_host(&s, sizeof(float) * ne0 * n_x);
    float *add = (float *)st_host(&s, sizeof(float) * ne1 * n_asg);
    int32_t *ids = (int32_t *)st_host(&s, sizeof(int32_t) * n_asg);
    float *ref = (float *)st_host(&s, sizeof(float) * ne1 * n_asg);
    float *got = (float *)st_host(&s, sizeof(float) * ne1 * n_asg);
    if (s.rc)
        return st_end(&s);
    kt_fill(x, ne0 * n_x, 1.0f);
    kt_fill(add, ne1 * n_asg, 1.0f);
    for (int i = 0; i < n_asg; i++)
        ids[i] = grouped ? (int32_t)((i * 7 + i / 3) % (n_expert - 1)) : 0; /* expert 3 unused */
    double max_mag = 0;
    for (int i = 0; i < n_asg; i++) {
        const float *xs = x + (int64_t)(i / k) * ne0;
        for (int64_t r = 0; r < ne1; r++) {
            const float *wr = w.f + ((int64_t)ids[i] * ne1 + r) * ne0;
            const float *ur = u.f + ((int64_t)ids[i] * ne1 + r) * ne0;
            double a = 0, b = 0, mag = 0;
            for (int64_t kk = 0; kk < ne0; kk++) {
                double xv = st_f16r(xs[kk]);
                a += wr[kk] * xv;
                b += ur[kk] * xv;
                mag += fabs(wr[kk] * xv);
            }
            ref[i * ne1 + r] = (float)(glu ? st_silu(a) * b : a + add[i * ne1 + r]);
            max_mag = fmax(max_mag, mag);
        }
    }
    float *dx = (float *)st_up(&s, x, sizeof(float) * ne0 * n_x);
    float *dadd = (float *)st_up(&s, add, sizeof(float) * ne1 * n_asg);
    float *dy = (float *)st_dev(&s, sizeof(float) * ne1 * n_asg);
    int32_t *dids = (int32_t *)st_up(&s, ids, sizeof(int32_t) * n_asg);
    int max_tiles = grouped ? strata_k_moe_max_tiles(n_asg, n_expert) : 0;
    int32_t *dperm = (int32_t *)st_dev(&s, sizeof(int32_t) * n_asg);
    int32_t *dtiles = (int32_t *)st_dev(&s, sizeof(int32_t) * 3 * (max_tiles + 1));
    int32_t *dnt = (int32_t *)st_dev(&s, sizeof(int32_t));
    struct strata_err err = {0, ""};
    if (grouped && !s.rc) {
        int rc = strata_k_moe_plan(&s.ctx, dids, n_asg, n_expert, dperm, dtiles, dnt, &err);
        st_launched(&s, "moe_plan", rc, &err, dperm, sizeof(int32_t) * n_asg);
        /* the plan: every assignment once, grouped by expert, tiles cover it */
        int32_t *perm = (int32_t *)st_host(&s, sizeof(int32_t) * n_asg);
        int32_t *tiles = (int32_t *)st_host(&s, sizeof(int32_t) * 3 * (max_tiles + 1));
        int32_t nt = 0;
        st_down(&s, perm, dperm, sizeof(int32_t) * n_asg);
        st_down(&s, tiles, dtiles, sizeof(int32_t) * 3 * max_tiles);
        st_down(&s, &nt, dnt, sizeof(int32_t));
        int covered = 0, good = !s.rc && nt > 0 && nt <= max_tiles;
        for (int t = 0; good && t < nt; t++) {
            int e = tiles[3 * t], b = tiles[3 * t + 1], en = tiles[3 * t + 2];
            good = b >= 0 && en > b && en <= n_asg && en - b <= STRATA_K_MM_BN;
            for (int i = b; good && i < en; i++)
                good = perm[i] >= 0 && perm[i] < n_asg && ids[perm[i]] == e;
            covered += good ? en - b : 0;
        }
        if (!s.rc && (!good || covered != n_asg))
            st_fail(&s, STRATA_SELFTEST_WRONG,
                    "moe_plan: %d tiles cover %d of %d assignments "
                    "or group them under the wrong expert",
                    nt, covered, n_asg);
    }
    if (!s.rc) {
        struct strata_k_mm_args a;
        memset(&a, 0, sizeof(a));
        a.w = &w.kw;
        a.up = glu ? &u.kw : NULL;
        a.glu = glu;
        a.n_tok = n_asg;
        if (grouped) {
            a.perm = dperm;
            a.tiles = dtiles;
            a.n_tiles = dnt;
            a.max_tiles = max_tiles;
            a.x_div = k;
        }
        a.x = dx;
        a.x_stride = ne0;
        a.y = dy;
        a.y_stride = ne1;
        a.add = grouped ? NULL : dadd;
        int rc = strata_k_matmul(&s.ctx, &a, &err);
        st_launched(&s, grouped ? "matmul grouped" : "matmul", rc, &err, dy,
                    sizeof(float) * ne1 * n_asg);
    }
    st_down(&s, got, dy, sizeof(float) * ne1 * n_asg);
    double atol = 1e-5 * max_mag * (glu ? max_mag + 1 : 1) + 1e-5;
    st_compare(&s, "matmul", got, ref, ne1 * n_asg, atol, 1e-4);
    return st_end(&s);
}

static int c_matmul(int dev, int type, char *shapes, size_t sc, char *msg, size_t mc)
{
    return matmul_case(dev, (uint32_t)type, 0, shapes, sc, msg, mc);
}

static int c_matmul_grouped(int dev, int type, char *shapes, size_t sc, char *msg, size_t mc)
{
    return matmul_case(dev, (uint32_t)type, 1, shapes, sc, msg, mc);
}

/* RMSNorm of rows rows of n values with weight w and eps 1e-6, in double. */
static void st_rms_norm_ref(const float *x, const float *w, int n, int rows, float *ref)
{
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < n; i++)
            ss += (double)x[r * n + i] * x[r * n + i];
        double sc2 = 1.0 / sqrt(ss / n + 1e-6);
        for (int i = 0; i < n; i++)
            ref[r * n + i] = (float)(x[r * n + i] * sc2 * w[i]);
    }
}

/* The routing reference: softmax over n_expert logits per token, the k largest (ties to
 * the lower id), renormalised; ids and weights [n_tok, k].  n_expert <= 64. */
static void st_route_ref(const float *lg, int n_tok, int n_expert, int k, int32_t *ids, float *w)
{
    for (int t = 0; t < n_tok; t++) {
        const float *l = lg + t * n_expert;
        double mx = -1e300, sum = 0, sel = 0;
        char used[64] = {0};
        for (int e = 0; e < n_expert; e++)
            mx = fmax(mx, l[e]);
        for (int e = 0; e < n_expert; e++)
            sum += exp(l[e] - mx);
        for (int j = 0; j < k; j++) {
            int b = -1;
            for (int e = 0; e < n_expert; e++)
                if (!used[e] && (b < 0 || l[e] > l[b]))
                    b = e;
            used[b] = 1;
            ids[t * k + j] = b;
            w[t * k + j] = (float)(exp(l[b] - mx) / sum);
            sel += w[t * k + j];
        }
        for (int j = 0; j < k; j++)
            w[t * k + j] = (float)(w[t * k + j] / sel);
    }
}

/* strata_k_rms_norm of dx (rows of n) with dw on the device, eps 1e-6, into got (host). */
static void st_rms_norm_dev(struct st *s, const float *dx, const float *dw, int n, int rows,
                            float *got)
{
    float *dy = (float *)st_dev(s, sizeof(float) * n * rows);
    if (!s->rc) {
        struct strata_err err = {0, ""};
        int rc = strata_k_rms_norm(&s->ctx, dx, dw, dy, n, rows, 1e-6f, &err);
        st_launched(s, "rms_norm", rc, &err, dy, sizeof(float) * n * rows);
    }
    st_down(s, got, dy, sizeof(float) * n * rows);
}

static int c_rms_norm(int dev, int arg, char *shapes, size_t sc, char *msg, size_t mc)
{
    (void)arg;
    struct st s;
    int n = 300, rows = 3;
    snprintf(shapes, sc, "n=%d rows=%d", n, rows);
    st_begin(&s, dev, msg, mc);
    float *x = (float *)st_host(&s, sizeof(float) * n * rows);
    float *w = (float *)st_host(&s, sizeof(float) * n);
    float *ref = (float *)st_host(&s, sizeof(float) * n * rows);
    float *got = (float *)st_host(&s, sizeof(float) * n * rows);
    if (s.rc)
        return st_end(&s);
    kt_fill(x, (size_t)n * rows, 3.0f);
    kt_fill(w, n, 1.0f);
    st_rms_norm_ref(x, w, n, rows, ref);
    float *dx = (float *)st_up(&s, x, sizeof(float) * n * rows);
    float *dw = (float *)st_up(&s, w, sizeof(float) * n);
    st_rms_norm_dev(&s, dx, dw, n, rows, got);
    st_compare(&s, "rms_norm", got, ref, (size_t)n * rows, 1e-6, 1e-5);
    return st_end(&s);
}

/* q8 rows (kernels.h: n int8 quants, then n / 32 float32 scales) to floats. */
static void st_q8_dequant(const uint8_t *q, int64_t n, int rows, float *out)
{
    size_t rb = strata_k_q8_row_bytes(n);
    for (int r = 0; r < rows; r++) {
        const int8_t *qs = (const int8_t *)(q + rb * r);
        const float *d = (const float *)(q + rb * r + n);
        for (int64_t i = 0; i < n; i++)
            out[r * n + i] = d[i / 32] * qs[i];
    }
}

/* The 8-bit activations of rows rows of ne0 values x (host): uploaded, quantised on the
 * device (the q8 rows the mat-vec reads, returned; NULL after a failure) and brought
 * back as floats to xf [rows * ne0] for the references.  xq: host scratch of
 * strata_k_q8_row_bytes(ne0) * rows bytes. */
static void *st_q8_input(struct st *s, const float *x, int64_t ne0, int rows, uint8_t *xq,
                         float *xf)
{
    size_t xrb = strata_k_q8_row_bytes(ne0);
    float *dx = (float *)st_up(s, x, sizeof(float) * ne0 * rows);
    void *dxq = st_dev(s, xrb * rows);
    if (!s->rc) {
        struct strata_err err = {0, ""};
        int rc = strata_k_quantize_q8(&s->ctx, dx, ne0, (int)ne0, rows, 0, NULL, 0.0f, NULL, dxq,
                                      &err);
        st_launched(s, "quantize_q8", rc, &err, dxq, xrb * rows);
    }
    st_down(s, xq, dxq, xrb * rows);
    if (s->rc)
        return NULL;
    st_q8_dequant(xq, ne0, rows, xf);
    return dxq;
}

/* RMSNorm fused with the 8-bit quantisation of the decode mat-vec's activations. */
static int c_quantize_q8(int dev, int arg, char *shapes, size_t sc, char *msg, size_t mc)
{
    (void)arg;
    struct st s;
    int n = 320, rows = 3;
    size_t rb = strata_k_q8_row_bytes(n);
    snprintf(shapes, sc, "n=%d rows=%d norm", n, rows);
    st_begin(&s, dev, msg, mc);
    float *x = (float *)st_host(&s, sizeof(float) * n * rows);
    float *w = (float *)st_host(&s, sizeof(float) * n);
    float *ref = (float *)st_host(&s, sizeof(float) * n * rows);
    float *got = (float *)st_host(&s, sizeof(float) * n * rows);
    float *deq = (float *)st_host(&s, sizeof(float) * n * rows);
    uint8_t *q = (uint8_t *)st_host(&s, rb * rows);
    if (s.rc)
        return st_end(&s);
    kt_fill(x, (size_t)n * rows, 3.0f);
    kt_fill(w, n, 1.0f);
    st_rms_norm_ref(x, w, n, rows, ref);
    float *dx = (float *)st_up(&s, x, sizeof(float) * n * rows);
    float *dw = (float *)st_up(&s, w, sizeof(float) * n);
    float *dy = (float *)st_dev(&s, sizeof(float) * n * rows);
    void *dq = st_dev(&s, rb * rows);
    if (!s.rc) {
        struct strata_err err = {0, ""};
        int rc = strata_k_quantize_q8(&s.ctx, dx, n, n, rows, 1, dw, 1e-6f, dy, dq, &err);
        st_launched(&s, "quantize_q8", rc, &err, dq, rb * rows);
    }
    st_down(&s, got, dy, sizeof(float) * n * rows);
    st_down(&s, q, dq, rb * rows);
    st_compare(&s, "quantize_q8 (normed rows)", got, ref, (size_t)n * rows, 1e-6, 1e-5);
    /* the normed rows bitwise those of rms_norm (the header's contract: a decode and a
     * verify window may normalise a row with either kernel, or the fused epilogue) */
    float *rn = (float *)st_host(&s, sizeof(float) * n * rows);
    st_rms_norm_dev(&s, dx, dw, n, rows, rn);
    for (int i = 0; i < n * rows && !s.rc; i++)
        if (memcmp(&got[i], &rn[i], sizeof(float)) != 0)
            st_fail(&s, STRATA_SELFTEST_WRONG,
                    "quantize_q8: row %d value %d is %a, rms_norm's %a (must be equal bitwise)",
                    i / n, i % n, got[i], rn[i]);
    if (s.rc)
        return st_end(&s);
    /* each value within half a quantisation step of the normed row */
    st_q8_dequant(q, n, rows, deq);
    for (int r = 0; r < rows && !s.rc; r++)
        for (int b = 0; b < n / 32 && !s.rc; b++) {
            float mx = 0;
            for (int i = b * 32; i < b * 32 + 32; i++)
                mx = fmaxf(mx, fabsf(got[r * n + i]));
            float d = ((const float *)(q + rb * r + n))[b];
            if (!(fabsf(d - mx / 127) <= 1e-6f * mx + 1e-30f))
                st_fail(&s, STRATA_SELFTEST_WRONG,
                        "quantize_q8: row %d block %d scale %g, expected %g", r, b, d, mx / 127);
            for (int i = b * 32; i < b * 32 + 32 && !s.rc; i++)
                if (!(fabsf(deq[r * n + i] - got[r * n + i]) <= 0.5001f * d + 1e-30f))
                    st_fail(&s, STRATA_SELFTEST_WRONG,
                            "quantize_q8: row %d value %d is %g, the normed value %g", r, i,
                            deq[r * n + i], got[r * n + i]);
        }
    return st_end(&s);
}

/* The 8-bit mat-vec (type: Q4_K, Q5_K, Q6_K, Q8_0) in its three modes: plain, the
 * experts' SwiGLU, and the experts' down projection with the weighted combine and a
 * residual, against double sums over the q8 activations the GPU made. */
static int c_matvec_q8(int dev, int type, char *shapes, size_t sc, char *msg, size_t mc)
{
    struct st s;
    int64_t ne0 = 512, ne1 = 40;
    int n_exp = 3, k = 2, n_tok = 2, n_x = n_tok * k;
    int32_t ids[4] = {2, 0, 1, 2};
    float cw[4] = {0.7f, 0.3f, 0.25f, 0.75f};
    size_t xrb = strata_k_q8_row_bytes(ne0);
    snprintf(shapes, sc, "%s [%lld x %lld] x%d experts, %d tokens, k=%d; plain, glu, combine",
             strata_ggml_type_name(type), (long long)ne0, (long long)ne1, n_exp, n_tok, k);
    st_begin(&s, dev, msg, mc);
    struct st_w w, u;
    st_weights(&s, &w, type, ne0, ne1, n_exp, 0);
    st_weights(&s, &u, type, ne0, ne1, n_exp, 0);
    float *x = (float *)st_host(&s, sizeof(float) * ne0 * n_x);
    float *xf = (float *)st_host(&s, sizeof(float) * ne0 * n_x);
    uint8_t *xq = (uint8_t *)st_host(&s, xrb * n_x);
    float *add = (float *)st_host(&s, sizeof(float) * ne1 * n_tok);
    float *ref = (float *)st_host(&s, sizeof(float) * ne1 * 8);
    float *got = (float *)st_host(&s, sizeof(float) * ne1 * 8);
    if (s.rc)
        return st_end(&s);
    kt_fill(x, ne0 * n_x, 1.0f);
    kt_fill(add, ne1 * n_tok, 1.0f);
    void *dxq = st_q8_input(&s, x, ne0, n_x, xq, xf);
    if (s.rc)
        return st_end(&s);
    /* outputs: plain [2 rows] at 0, glu [4 slots] at 2, combine [2 tokens] at 6 */
    double max_mag = 0;
    for (int m = 0; m < 3; m++) {
        int rows = m == 1 ? 4 : 2, at = m == 0 ? 0 : m == 1 ? 2 : 6;
        for (int t = 0; t < rows; t++)
            for (int64_t r = 0; r < ne1; r++) {
                double v = m == 2 ? add[t * ne1 + r] : 0, mag = 0;
                for (int j = 0; j < (m == 2 ? k : 1); j++) {
                    int sl = m == 2 ? t * k + j : t;
                    int e = m == 0 ? 0 : ids[sl];
                    const float *xs = xf + (m == 1 ? sl / k : sl) * ne0;
                    const float *wr = w.f + ((int64_t)e * ne1 + r) * ne0;
                    const float *ur = u.f + ((int64_t)e * ne1 + r) * ne0;
                    double a = 0, b = 0, mj = 0;
                    for (int64_t i = 0; i < ne0; i++) {
                        a += (double)wr[i] * xs[i];
                        b += (double)ur[i] * xs[i];
                        mj += fabs((double)wr[i] * xs[i]) + fabs((double)ur[i] * xs[i]);
                    }
                    v += m == 1 ? st_silu(a) * b : m == 2 ? cw[sl] * a : a;
                    mag += mj;
                }
                ref[(at + t) * ne1 + r] = (float)v;
                max_mag = fmax(max_mag, mag);
            }
    }
    int32_t *dids = (int32_t *)st_up(&s, ids, sizeof(ids));
    float *dcw = (float *)st_up(&s, cw, sizeof(cw));
    float *dy = (float *)st_dev(&s, sizeof(float) * ne1 * 8);
    if (!s.rc)
        ST_RT(&s, cudaMemcpy(dy + 6 * ne1, add, sizeof(float) * ne1 * n_tok,
                             cudaMemcpyHostToDevice));
    static const char *const names[3] = {"matvec_q8 plain", "matvec_q8 glu", "matvec_q8 combine"};
    for (int m = 0; m < 3 && !s.rc; m++) {
        struct strata_k_mvq_args a;
        memset(&a, 0, sizeof(a));
        a.w = &w.kw;
        a.up = m == 1 ? &u.kw : NULL;
        a.mode = m == 0 ? STRATA_K_MVQ_PLAIN : m == 1 ? STRATA_K_MVQ_GLU : STRATA_K_MVQ_COMBINE;
        a.ids = m == 0 ? NULL : dids;
        a.n_slot = m == 1 ? 4 : 2;
        a.x_group = m == 1 ? k : 1;
        a.k = k;
        a.cw = dcw;
        a.xq = dxq;
        a.y = dy + (m == 0 ? 0 : m == 1 ? 2 : 6) * ne1;
        a.y_stride = ne1;
        a.add = m == 2 ? a.y : NULL;
        struct strata_err err = {0, ""};
        int rc = strata_k_matvec_q8(&s.ctx, &a, &err);
        st_launched(&s, names[m], rc, &err, a.y, sizeof(float) * ne1 * a.n_slot);
    }
    st_down(&s, got, dy, sizeof(float) * ne1 * 8);
    st_compare(&s, "matvec_q8", got, ref, ne1 * 8, 1e-5 * max_mag + 1e-6, 1e-4);
    return st_end(&s);
}

/* The output projection's staged mat-vec (rows through shared memory; two rows per
 * group from 16384 rows on): against double sums over the decoded weights, and bit for
 * bit against the direct kernel. */
static int c_matvec_q8_stage(int dev, int type, char *shapes, size_t sc, char *msg, size_t mc)
{
    struct st s;
    /* Q6_K: the output projection's shape class (32 lanes a row, the streamed kernel's
     * word reads); the others a staged shape */
    const int64_t ne0 = type == STRATA_TYPE_Q6_K ? 2048 : 512,
                  ne1 = type == STRATA_TYPE_Q6_K ? 4100 : 16390;
    const int n_tok = 2;
    size_t xrb = strata_k_q8_row_bytes(ne0);
    snprintf(shapes, sc, "%s [%lld x %lld], %d tokens", strata_ggml_type_name(type),
             (long long)ne0, (long long)ne1, n_tok);
    st_begin(&s, dev, msg, mc);
    struct st_w w;
    st_weights(&s, &w, type, ne0, ne1, 1, 0);
    float *x = (float *)st_host(&s, sizeof(float) * ne0 * n_tok);
    float *xf = (float *)st_host(&s, sizeof(float) * ne0 * n_tok);
    uint8_t *xq = (uint8_t *)st_host(&s, xrb * n_tok);
    float *ref = (float *)st_host(&s, sizeof(float) * ne1 * n_tok);
    float *got = (float *)st_host(&s, sizeof(float) * ne1 * n_tok);
    float *direct = (float *)st_host(&s, sizeof(float) * ne1 * n_tok);
    if (s.rc)
        return st_end(&s);
    kt_fill(x, ne0 * n_tok, 1.0f);
    void *dxq = st_q8_input(&s, x, ne0, n_tok, xq, xf);
    float *dy = (float *)st_dev(&s, sizeof(float) * ne1 * n_tok);
    float *dd = (float *)st_dev(&s, sizeof(float) * ne1 * n_tok);
    if (s.rc)
        return st_end(&s);
    double max_mag = 0;
    for (int t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < ne1; r++) {
            const float *wr = w.f + r * ne0, *xs = xf + t * ne0;
            double a = 0, mag = 0;
            for (int64_t i = 0; i < ne0; i++) {
                a += (double)wr[i] * xs[i];
                mag += fabs((double)wr[i] * xs[i]);
            }
            ref[t * ne1 + r] = (float)a;
            max_mag = fmax(max_mag, mag);
        }
    float *streamed = (float *)st_host(&s, sizeof(float) * ne1 * n_tok);
    float *ds = (float *)st_dev(&s, sizeof(float) * ne1 * n_tok);
    if (s.rc)
        return st_end(&s);
    /* staged (1), direct (-1), streamed (2) */
    const int ways[3] = {1, -1, 2};
    float *outs[3] = {dy, dd, ds};
    const char *names[3] = {"matvec_q8 staged", "matvec_q8 plain", "matvec_q8 streamed"};
    for (int v = 0; v < 3 && !s.rc; v++) {
        struct strata_k_mvq_args a;
        memset(&a, 0, sizeof(a));
        a.w = &w.kw;
        a.mode = STRATA_K_MVQ_PLAIN;
        a.n_slot = n_tok;
        a.x_group = 1;
        a.xq = dxq;
        a.y = outs[v];
        a.y_stride = ne1;
        a.stage = ways[v];
        struct strata_err err = {0, ""};
        int rc = strata_k_matvec_q8(&s.ctx, &a, &err);
        st_launched(&s, names[v], rc, &err, a.y, sizeof(float) * ne1 * n_tok);
    }
    st_down(&s, got, dy, sizeof(float) * ne1 * n_tok);
    st_down(&s, direct, dd, sizeof(float) * ne1 * n_tok);
    st_down(&s, streamed, ds, sizeof(float) * ne1 * n_tok);
    st_compare(&s, "matvec_q8 staged", got, ref, ne1 * n_tok, 1e-5 * max_mag + 1e-6, 1e-4);
    if (!s.rc && memcmp(got, direct, sizeof(float) * ne1 * n_tok) != 0)
        st_fail(&s, STRATA_SELFTEST_WRONG, "matvec_q8 staged: not the bits of the direct kernel");
    if (!s.rc && memcmp(streamed, direct, sizeof(float) * ne1 * n_tok) != 0)
        st_fail(&s, STRATA_SELFTEST_WRONG,
                "matvec_q8 streamed: not the bits of the direct kernel");
    return st_end(&s);
}

/* The router (F32 weights) and its top-k routing in one launch: logits against double
 * sums, ids and weights against the route reference on the logits the GPU made. */
static int c_router_topk(int dev, int arg, char *shapes, size_t sc, char *msg, size_t mc)
{
    (void)arg;
    struct st s;
    int n = 256, n_expert = 24, k = 4, n_tok = 2;
    snprintf(shapes, sc, "n=%d n_expert=%d k=%d n_tok=%d norm=1", n, n_expert, k, n_tok);
    st_begin(&s, dev, msg, mc);
    struct st_w rw;
    st_weights(&s, &rw, STRATA_TYPE_F32, n, n_expert, 1, 0);
    float *x = (float *)st_host(&s, sizeof(float) * n * n_tok);
    float *lref = (float *)st_host(&s, sizeof(float) * n_expert * n_tok);
    float *lg = (float *)st_host(&s, sizeof(float) * n_expert * n_tok);
    int32_t *gid = (int32_t *)st_host(&s, 4 * n_tok * k), *rid = (int32_t *)st_host(&s, 4 * n_tok * k);
    float *gw = (float *)st_host(&s, 4 * n_tok * k), *wref = (float *)st_host(&s, 4 * n_tok * k);
    if (s.rc)
        return st_end(&s);
    kt_fill(x, (size_t)n * n_tok, 1.0f);
    double max_mag = kt_router_ref(rw.f, x, n, n_expert, n_tok, lref);
    float *dx = (float *)st_up(&s, x, sizeof(float) * n * n_tok);
    float *dl = (float *)st_dev(&s, sizeof(float) * n_expert * n_tok);
    float *dw = (float *)st_dev(&s, 4 * n_tok * k);
    int32_t *di = (int32_t *)st_dev(&s, 4 * n_tok * k);
    int *dc = (int *)st_dev(&s, sizeof(int) * n_tok);
    if (!s.rc)
        ST_RT(&s, cudaMemset(dc, 0, sizeof(int) * n_tok));
    if (!s.rc) {
        struct strata_err err = {0, ""};
        int rc = strata_k_moe_router_topk(&s.ctx, &rw.kw, dx, n_tok, dl, dc, k, 1, 1.0f, di, dw,
                                          NULL, NULL, &err);
        st_launched(&s, "moe_router_topk", rc, &err, dw, 4 * n_tok * k);
    }
    st_down(&s, lg, dl, sizeof(float) * n_expert * n_tok);
    st_down(&s, gid, di, 4 * n_tok * k);
    st_down(&s, gw, dw, 4 * n_tok * k);
    st_compare(&s, "moe_router_topk logits", lg, lref, n_expert * n_tok, 1e-6 * max_mag + 1e-6,
               1e-5);
    if (s.rc)
        return st_end(&s);
    st_route_ref(lg, n_tok, n_expert, k, rid, wref);
    for (int i = 0; i < n_tok * k && !s.rc; i++)
        if (gid[i] != rid[i])
            st_fail(&s, STRATA_SELFTEST_WRONG,
                    "moe_router_topk: expert id %d of token %d is %d, the reference chose %d",
                    i % k, i / k, gid[i], rid[i]);
    st_compare(&s, "moe_router_topk weights", gw, wref, n_tok * k, 1e-6, 1e-5);
    return st_end(&s);
}

/* The router with its ffn_norm fused (strata_k_norm_q8): the normed rows (floats and
 * q8), the logits and the routing must be the bits of quantize_q8 followed by the
 * router on its float rows.  n > 4096 (float4s past the ones loaded before the PDL
 * wait), n / 32 q8 blocks over fewer experts (a block writes several), 3 tokens. */
static int c_router_norm(int dev, int arg, char *shapes, size_t sc, char *msg, size_t mc)
{
    (void)arg;
    struct st s;
    int n = 4640, n_expert = 24, k = 4, n_tok = 3;
    size_t rb = strata_k_q8_row_bytes(n);
    snprintf(shapes, sc, "n=%d n_expert=%d k=%d n_tok=%d", n, n_expert, k, n_tok);
    st_begin(&s, dev, msg, mc);
    struct st_w rw;
    st_weights(&s, &rw, STRATA_TYPE_F32, n, n_expert, 1, 0);
    const size_t nx = (size_t)n * n_tok, nl = (size_t)n_expert * n_tok, nk = (size_t)n_tok * k;
    float *x = (float *)st_host(&s, 4 * nx), *nw = (float *)st_host(&s, 4 * (size_t)n);
    float *y[2], *lg[2], *gw[2];
    uint8_t *q[2];
    int32_t *gid[2];
    for (int v = 0; v < 2; v++) {
        y[v] = (float *)st_host(&s, 4 * nx);
        lg[v] = (float *)st_host(&s, 4 * nl);
        gw[v] = (float *)st_host(&s, 4 * nk);
        gid[v] = (int32_t *)st_host(&s, 4 * nk);
        q[v] = (uint8_t *)st_host(&s, rb * n_tok);
    }
    if (s.rc)
        return st_end(&s);
    kt_fill(x, nx, 4.0f);
    kt_fill(nw, n, 1.0f);
    float *dx = (float *)st_up(&s, x, 4 * nx), *dnw = (float *)st_up(&s, nw, 4 * (size_t)n);
    float *dy = (float *)st_dev(&s, 4 * nx), *dl = (float *)st_dev(&s, 4 * nl);
    float *dw = (float *)st_dev(&s, 4 * nk);
    int32_t *di = (int32_t *)st_dev(&s, 4 * nk);
    void *dq = st_dev(&s, rb * n_tok);
    int *dc = (int *)st_dev(&s, sizeof(int));
    if (!s.rc)
        ST_RT(&s, cudaMemset(dc, 0, sizeof(int)));
    /* v = 0: quantize_q8, then the router on its float rows; v = 1: one launch */
    for (int v = 0; v < 2 && !s.rc; v++) {
        struct strata_err err = {0, ""};
        ST_RT(&s, cudaMemset(dy, 0, 4 * nx));
        ST_RT(&s, cudaMemset(dq, 0, rb * n_tok));
        if (s.rc)
            break;
        struct strata_k_norm_q8 fn = {dnw, 1e-6f, dy, dq};
        int rc = v ? 0 : strata_k_quantize_q8(&s.ctx, dx, n, n, n_tok, 1, dnw, 1e-6f, dy, dq, &err);
        if (!rc)
            rc = strata_k_moe_router_topk(&s.ctx, &rw.kw, v ? dx : dy, n_tok, dl, dc, k, 1, 1.0f,
                                          di, dw, v ? &fn : NULL, NULL, &err);
        st_launched(&s, v ? "moe_router_topk (ffn_norm fused)" : "quantize_q8 + moe_router_topk",
                    rc, &err, dw, 4 * nk);
        st_down(&s, y[v], dy, 4 * nx);
        st_down(&s, q[v], dq, rb * n_tok);
        st_down(&s, lg[v], dl, 4 * nl);
        st_down(&s, gw[v], dw, 4 * nk);
        st_down(&s, gid[v], di, 4 * nk);
    }
    if (s.rc)
        return st_end(&s);
    /* the two-launch path itself against the CPU's RMSNorm */
    float *ref = (float *)st_host(&s, 4 * nx);
    if (s.rc)
        return st_end(&s);
    st_rms_norm_ref(x, nw, n, n_tok, ref);
    st_compare(&s, "quantize_q8 (normed rows)", y[0], ref, nx, 1e-6, 1e-5);
    if (!s.rc && memcmp(y[0], y[1], 4 * nx) != 0)
        for (size_t i = 0; i < nx && !s.rc; i++)
            if (memcmp(&y[0][i], &y[1][i], 4) != 0)
                st_fail(&s, STRATA_SELFTEST_WRONG,
                        "fused ffn_norm: token %zu value %zu is %a, quantize_q8's %a (must be "
                        "equal bitwise)", i / n, i % n, y[1][i], y[0][i]);
    if (!s.rc && memcmp(q[0], q[1], rb * n_tok) != 0)
        for (size_t i = 0; i < rb * n_tok && !s.rc; i++)
            if (q[0][i] != q[1][i])
                st_fail(&s, STRATA_SELFTEST_WRONG,
                        "fused ffn_norm: q8 byte %zu of token %zu is %u, quantize_q8's %u", i % rb,
                        i / rb, q[1][i], q[0][i]);
    if (!s.rc && memcmp(lg[0], lg[1], 4 * nl) != 0)
        for (size_t i = 0; i < nl && !s.rc; i++)
            if (memcmp(&lg[0][i], &lg[1][i], 4) != 0)
                st_fail(&s, STRATA_SELFTEST_WRONG,
                        "fused ffn_norm: logit of expert %zu token %zu is %a, the two-launch "
                        "path's %a (must be equal bitwise)", i % n_expert, i / n_expert, lg[1][i],
                        lg[0][i]);
    if (!s.rc && (memcmp(gid[0], gid[1], 4 * nk) != 0 || memcmp(gw[0], gw[1], 4 * nk) != 0))
        st_fail(&s, STRATA_SELFTEST_WRONG, "fused ffn_norm: the routing differs");
    /* the logits themselves against double sums over the normed rows */
    float *lref = (float *)st_host(&s, 4 * nl);
    if (s.rc)
        return st_end(&s);
    double max_mag = kt_router_ref(rw.f, ref, n, n_expert, n_tok, lref);
    st_compare(&s, "moe_router_topk logits (ffn_norm fused)", lg[1], lref, nl,
               1e-5 * max_mag + 1e-6, 1e-4);
    return st_end(&s);
}

/* RoPE with q/k norms into the kv cache (arg: rope mode 0 or 2). */
static int c_qkv(int dev, int mode, char *shapes, size_t sc, char *msg, size_t mc)
{
    struct st s;
    int n_tok = 3, n_head = 4, n_head_kv = 2, hd = 32, n_rot = hd, pos0 = 5;
    int n_ctx = pos0 + n_tok + 2, nq = n_tok * n_head * hd, nk = n_tok * n_head_kv * hd;
    snprintf(shapes, sc, "mode %d n_tok=%d heads %d/%d hd=%d pos0=%d", mode, n_tok, n_head,
             n_head_kv, hd, pos0);
    st_begin(&s, dev, msg, mc);
    float *q = (float *)st_host(&s, 4 * nq), *k = (float *)st_host(&s, 4 * nk);
    float *v = (float *)st_host(&s, 4 * nk), *qn = (float *)st_host(&s, 4 * hd);
    float *kn = (float *)st_host(&s, 4 * hd), *rq = (float *)st_host(&s, 4 * nq);
    float *rk = (float *)st_host(&s, 4 * nk), *gq = (float *)st_host(&s, 4 * nq);
    float *gk = (float *)st_host(&s, 4 * nk), *gv = (float *)st_host(&s, 4 * nk);
    uint16_t *hk = (uint16_t *)st_host(&s, 2 * nk), *hv = (uint16_t *)st_host(&s, 2 * nk);
    if (s.rc)
        return st_end(&s);
    kt_fill(q, nq, 2.0f);
    kt_fill(k, nk, 2.0f);
    kt_fill(v, nk, 2.0f);
    kt_fill(qn, hd, 1.0f);
    kt_fill(kn, hd, 1.0f);
    struct strata_k_rope rp;
    strata_k_rope_init(&rp, mode, n_rot, 10000.0f, 1.0f, 4096, 0.0f, 1.0f, 32.0f, 1.0f);
    for (int pass = 0; pass < 2; pass++) {
        const float *src = pass ? k : q, *nw = pass ? kn : qn;
        float *dst = pass ? rk : rq;
        int nh = pass ? n_head_kv : n_head;
        for (int t = 0; t < n_tok; t++)
            for (int h = 0; h < nh; h++) {
                const float *x = src + (t * nh + h) * hd;
                float *y = dst + (t * nh + h) * hd;
                double ss = 0;
                for (int i = 0; i < hd; i++)
                    ss += (double)x[i] * x[i];
                double scl = 1.0 / sqrt(ss / hd + 1e-6);
                for (int i = 0; i < hd; i++)
                    y[i] = (float)(x[i] * scl * nw[i]);
                for (int p = 0; p < n_rot / 2; p++) {
                    int i0 = mode == 2 ? p : 2 * p, i1 = mode == 2 ? p + n_rot / 2 : 2 * p + 1;
                    double th = (pos0 + t) * pow(10000.0, -2.0 * p / n_rot);
                    double a = y[i0], b = y[i1];
                    y[i0] = (float)(a * cos(th) - b * sin(th));
                    y[i1] = (float)(a * sin(th) + b * cos(th));
                }
            }
    }
    float *dq = (float *)st_up(&s, q, 4 * nq), *dk = (float *)st_up(&s, k, 4 * nk);
    float *dv = (float *)st_up(&s, v, 4 * nk), *dqn = (float *)st_up(&s, qn, 4 * hd);
    float *dkn = (float *)st_up(&s, kn, 4 * hd);
    int32_t *dpos = (int32_t *)st_up(&s, &pos0, 4);
    size_t cbytes = sizeof(__half) * n_ctx * n_head_kv * hd;
    __half *kc = (__half *)st_dev(&s, cbytes), *vc = (__half *)st_dev(&s, cbytes);
    if (!s.rc) {
        struct strata_k_qkv_args a;
        memset(&a, 0, sizeof(a));
        a.q = dq;
        a.k = dk;
        a.v = dv;
        a.q_stride = n_head * hd;
        a.k_stride = n_head_kv * hd;
        a.v_stride = n_head_kv * hd;
        a.q_norm = dqn;
        a.k_norm = dkn;
        a.eps = 1e-6f;
        a.rope = &rp;
        a.pos0 = dpos;
        a.n_tok = n_tok;
        a.n_head = n_head;
        a.n_head_kv = n_head_kv;
        a.hd = hd;
        a.k_cache = kc;
        a.v_cache = vc;
        struct strata_err err = {0, ""};
        int rc = strata_k_qkv_post(&s.ctx, &a, &err);
        st_launched(&s, "qkv_rope", rc, &err, dq, 4 * nq);
    }
    st_down(&s, gq, dq, 4 * nq);
    st_down(&s, hk, (char *)kc + sizeof(__half) * pos0 * n_head_kv * hd, 2 * nk);
    st_down(&s, hv, (char *)vc + sizeof(__half) * pos0 * n_head_kv * hd, 2 * nk);
    if (s.rc)
        return st_end(&s);
    for (int i = 0; i < nk; i++) {
        gk[i] = strata_f16_to_f32(hk[i]);
        gv[i] = strata_f16_to_f32(hv[i]);
        rk[i] = st_f16r(rk[i]);
    }
    st_compare(&s, "q (norm + rope)", gq, rq, nq, 1e-5, 1e-4);
    st_compare(&s, "k cache (norm + rope)", gk, rk, nk, 1e-3, 2e-3);
    st_compare(&s, "v cache", gv, v, nk, 1e-3, 2e-3);
    return st_end(&s);
}

/* Causal GQA attention: arg 0 decode (one query, split-K), 1 prefill (a batch), 2 decode
 * with the merge in the last block and the 8-bit output (dequantised: within half a
 * quantisation step of the reference). */
static int c_attention(int dev, int mode, char *shapes, size_t sc, char *msg, size_t mc)
{
    struct st s;
    const int prefill = mode == 1, q8 = mode == 2;
    int n_tok = prefill ? 9 : q8 ? 2 : 1, pos0 = prefill ? 4 : q8 ? 300 : 70, n_head = 8,
        n_head_kv = 2, hd = 64;
    int n_split = prefill ? 1 : 3;
    int n_kv = pos0 + n_tok, nq = n_tok * n_head * hd, nc = n_kv * n_head_kv * hd;
    snprintf(shapes, sc, "n_tok=%d pos0=%d heads %d/%d hd=%d split %d", n_tok, pos0, n_head,
             n_head_kv, hd, n_split);
    st_begin(&s, dev, msg, mc);
    float *q = (float *)st_host(&s, 4 * nq), *kf = (float *)st_host(&s, 4 * nc);
    float *vf = (float *)st_host(&s, 4 * nc), *ref = (float *)st_host(&s, 4 * nq);
    float *got = (float *)st_host(&s, 4 * nq);
    uint16_t *kh = (uint16_t *)st_host(&s, 2 * nc), *vh = (uint16_t *)st_host(&s, 2 * nc);
    double *scr = (double *)st_host(&s, sizeof(double) * n_kv);
    if (s.rc)
        return st_end(&s);
    kt_fill(q, nq, 1.0f);
    kt_fill(kf, nc, 1.0f);
    kt_fill(vf, nc, 1.0f);
    for (int i = 0; i < nc; i++) {
        kh[i] = strata_f32_to_f16(kf[i]);
        kf[i] = strata_f16_to_f32(kh[i]);
        vh[i] = strata_f32_to_f16(vf[i]);
        vf[i] = strata_f16_to_f32(vh[i]);
    }
    float scale = 1.0f / sqrtf((float)hd);
    int gqa = n_head / n_head_kv;
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            int g = h / gqa, L = pos0 + t + 1;
            double mx = -1e300, sum = 0;
            for (int j = 0; j < L; j++) {
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)q[(t * n_head + h) * hd + i] * scale *
                         kf[(j * n_head_kv + g) * hd + i];
                scr[j] = d;
                mx = fmax(mx, d);
            }
            for (int j = 0; j < L; j++)
                sum += scr[j] = exp(scr[j] - mx);
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int j = 0; j < L; j++)
                    o += scr[j] * vf[(j * n_head_kv + g) * hd + i];
                ref[(t * n_head + h) * hd + i] = (float)(o / sum);
            }
        }
    float *dq = (float *)st_up(&s, q, 4 * nq), *dout = (float *)st_dev(&s, 4 * nq);
    __half *dk = (__half *)st_up(&s, kh, 2 * nc), *dv = (__half *)st_up(&s, vh, 2 * nc);
    int32_t *dpos = (int32_t *)st_up(&s, &pos0, 4);
    size_t sb = strata_k_attn_scratch_bytes(n_tok, n_head, hd, n_split);
    float *dscr = sb ? (float *)st_dev(&s, sb) : NULL;
    size_t n_cnt = strata_k_attn_counters(n_tok, n_head, n_head_kv);
    size_t qrb = strata_k_q8_row_bytes(n_head * hd);
    int *dcnt = q8 ? (int *)st_dev(&s, sizeof(int) * n_cnt) : NULL;
    uint8_t *dq8 = q8 ? (uint8_t *)st_dev(&s, qrb * n_tok) : NULL;
    uint8_t *h8 = q8 ? (uint8_t *)st_host(&s, qrb * n_tok) : NULL;
    int *hcnt = q8 ? (int *)st_host(&s, sizeof(int) * n_cnt) : NULL;
    float *dout2 = prefill ? NULL : (float *)st_dev(&s, 4 * nq);
    uint8_t *dq82 = q8 ? (uint8_t *)st_dev(&s, qrb * n_tok) : NULL;
    if (q8 && !s.rc)
        ST_RT(&s, cudaMemset(dcnt, 0, sizeof(int) * n_cnt));
    if (!s.rc) {
        struct strata_k_attn_args a;
        memset(&a, 0, sizeof(a));
        a.q = dq;
        a.q_stride = n_head * hd;
        a.k_cache = dk;
        a.v_cache = dv;
        a.out = dout;
        a.pos0 = dpos;
        a.n_tok = n_tok;
        a.n_head = n_head;
        a.n_head_kv = n_head_kv;
        a.hd = hd;
        a.max_kv = n_kv + 5;
        a.n_split = n_split;
        a.scale = scale;
        a.scratch = dscr;
        a.counters = dcnt;
        a.out_q8 = dq8;
        a.out_q8_row = (int64_t)qrb;
        struct strata_err err = {0, ""};
        int rc = strata_k_attention(&s.ctx, &a, &err);
        st_launched(&s, prefill ? "attention prefill" : q8 ? "attention q8" : "attention decode",
                    rc, &err, dout, 4 * nq);
        if (!prefill && !s.rc) {
            /* a decode's rows a 32-lane group each, or on the 32-row tiles of a larger
             * batch: the same bits */
            a.out = dout2;
            a.out_q8 = dq82;
            a.tiles = 1;
            rc = strata_k_attention(&s.ctx, &a, &err);
            st_launched(&s, q8 ? "attention q8 (tiles)" : "attention decode (tiles)", rc, &err,
                        dout2, 4 * nq);
        }
    }
    st_down(&s, got, dout, 4 * nq);
    st_compare(&s, "attention", got, ref, nq, 2e-5, 2e-4);
    if (!prefill) {
        float *got2 = (float *)st_host(&s, 4 * nq);
        st_down(&s, got2, dout2, 4 * nq);
        if (!s.rc && memcmp(got, got2, 4 * (size_t)nq))
            st_fail(&s, STRATA_SELFTEST_WRONG,
                    "attention: a decode's row groups and the batch tiles differ");
        if (q8 && !s.rc) {
            uint8_t *a8 = (uint8_t *)st_host(&s, qrb * n_tok), *b8 = (uint8_t *)st_host(&s, qrb * n_tok);
            st_down(&s, a8, dq8, qrb * n_tok);
            st_down(&s, b8, dq82, qrb * n_tok);
            if (!s.rc && memcmp(a8, b8, qrb * n_tok))
                st_fail(&s, STRATA_SELFTEST_WRONG,
                        "attention: a decode's 8-bit rows differ between row groups and tiles");
        }
    }
    if (q8) {
        st_down(&s, h8, dq8, qrb * n_tok);
        st_down(&s, hcnt, dcnt, sizeof(int) * n_cnt);
        if (s.rc)
            return st_end(&s);
        for (size_t i = 0; i < n_cnt; i++)
            if (hcnt[i] != 0) {
                st_fail(&s, STRATA_SELFTEST_WRONG, "attention: counter %zu left at %d", i,
                        hcnt[i]);
                return st_end(&s);
            }
        const int nh = n_head * hd;
        for (int t = 0; t < n_tok; t++)
            for (int i = 0; i < nh; i++) {
                const uint8_t *row = h8 + t * qrb;
                got[t * nh + i] = ((const float *)(row + nh))[i / 32] * (float)(int8_t)row[i];
            }
        st_compare(&s, "attention q8 (dequantised)", got, ref, nq, 4.1e-3, 0.0);
    }
    return st_end(&s);
}

/* Router and combine. */
static int c_moe(int dev, int combine, char *shapes, size_t sc, char *msg, size_t mc)
{
    struct st s;
    int n_tok = 3, n_expert = 24, k = 4, n = 100;
    snprintf(shapes, sc, combine ? "n_tok=%d k=%d n=%d" : "n_tok=%d n_expert=%d k=%d norm=1", n_tok,
             combine ? k : n_expert, combine ? n : k);
    st_begin(&s, dev, msg, mc);
    float *lg = (float *)st_host(&s, 4 * n_tok * n_expert);
    int32_t *rid = (int32_t *)st_host(&s, 4 * n_tok * k),
            *gid = (int32_t *)st_host(&s, 4 * n_tok * k);
    float *rw = (float *)st_host(&s, 4 * n_tok * k), *gw = (float *)st_host(&s, 4 * n_tok * k);
    if (s.rc)
        return st_end(&s);
    kt_fill(lg, (size_t)n_tok * n_expert, 4.0f);
    lg[3] = lg[5] = 9.0f; /* a tie: the lower id first */
    st_route_ref(lg, n_tok, n_expert, k, rid, rw);
    if (combine) {
        float *y = (float *)st_host(&s, 4 * n_tok * k * n),
              *add = (float *)st_host(&s, 4 * n_tok * n);
        float *ref = (float *)st_host(&s, 4 * n_tok * n),
              *got = (float *)st_host(&s, 4 * n_tok * n);
        if (s.rc)
            return st_end(&s);
        kt_fill(y, (size_t)n_tok * k * n, 1.0f);
        kt_fill(add, (size_t)n_tok * n, 1.0f);
        for (int t = 0; t < n_tok; t++)
            for (int i = 0; i < n; i++) {
                double v = add[t * n + i];
                for (int j = 0; j < k; j++)
                    v += (double)rw[t * k + j] * y[(t * k + j) * n + i];
                ref[t * n + i] = (float)v;
            }
        float *dy = (float *)st_up(&s, y, 4 * n_tok * k * n),
              *dw = (float *)st_up(&s, rw, 4 * n_tok * k);
        float *da = (float *)st_up(&s, add, 4 * n_tok * n),
              *dout = (float *)st_dev(&s, 4 * n_tok * n);
        if (!s.rc) {
            struct strata_err err = {0, ""};
            int rc = strata_k_moe_combine(&s.ctx, dy, dw, n_tok, k, n, da, dout, &err);
            st_launched(&s, "moe_combine", rc, &err, dout, 4 * n_tok * n);
        }
        st_down(&s, got, dout, 4 * n_tok * n);
        st_compare(&s, "moe_combine", got, ref, n_tok * n, 1e-6, 1e-5);
        return st_end(&s);
    }
    float *dl = (float *)st_up(&s, lg, 4 * n_tok * n_expert),
          *dw = (float *)st_dev(&s, 4 * n_tok * k);
    int32_t *di = (int32_t *)st_dev(&s, 4 * n_tok * k);
    if (!s.rc) {
        struct strata_err err = {0, ""};
        int rc = strata_k_moe_route(&s.ctx, dl, n_tok, n_expert, k, 1, 1.0f, di, dw, &err);
        st_launched(&s, "moe_route", rc, &err, dw, 4 * n_tok * k);
    }
    st_down(&s, gid, di, 4 * n_tok * k);
    st_down(&s, gw, dw, 4 * n_tok * k);
    if (!s.rc && memcmp(gid, rid, 4 * n_tok * k) != 0) {
        int i = 0;
        while (gid[i] == rid[i])
            i++;
        st_fail(&s, STRATA_SELFTEST_WRONG,
                "moe_route: expert id %d of token %d is %d, the "
                "reference chose %d",
                i % k, i / k, gid[i], rid[i]);
    }
    st_compare(&s, "moe_route weights", gw, rw, n_tok * k, 1e-6, 1e-5);
    return st_end(&s);
}

/* argmax (arg 0) and top-k (arg 1) over logits with a tie. */
static int c_sample(int dev, int topk, char *shapes, size_t sc, char *msg, size_t mc)
{
    struct st s;
    int n = 5000, rows = 2, k = topk ? 8 : 1;
    snprintf(shapes, sc, "n=%d rows=%d%s", n, rows, topk ? " k=8" : "");
    st_begin(&s, dev, msg, mc);
    float *l = (float *)st_host(&s, 4 * n * rows);
    int32_t *gi = (int32_t *)st_host(&s, 4 * k * rows), *ri = (int32_t *)st_host(&s, 4 * k * rows);
    float *gv = (float *)st_host(&s, 4 * k * rows), *rv = (float *)st_host(&s, 4 * k * rows);
    char *used = (char *)st_host(&s, n);
    if (s.rc)
        return st_end(&s);
    kt_fill(l, (size_t)n * rows, 10.0f);
    l[n - 1] = l[7] = 50.0f; /* a tie: 7 first */
    for (int r = 0; r < rows; r++) {
        memset(used, 0, n);
        const float *lr = l + (int64_t)r * n;
        for (int j = 0; j < k; j++) {
            int b = -1;
            for (int i = 0; i < n; i++)
                if (!used[i] && (b < 0 || lr[i] > lr[b]))
                    b = i;
            used[b] = 1;
            ri[r * k + j] = b;
            rv[r * k + j] = lr[b];
        }
    }
    float *dl = (float *)st_up(&s, l, 4 * n * rows), *dv = (float *)st_dev(&s, 4 * k * rows);
    int32_t *di = (int32_t *)st_dev(&s, 4 * k * rows);
    void *scr = topk ? st_dev(&s, strata_k_topk_scratch(n, rows, k)) : NULL;
    if (!s.rc) {
        struct strata_err err = {0, ""};
        int rc = topk ? strata_k_topk(&s.ctx, dl, n, rows, k, scr, di, dv, &err)
                      : strata_k_argmax(&s.ctx, dl, n, rows, di, &err);
        st_launched(&s, topk ? "topk" : "argmax", rc, &err, di, 4 * k * rows);
    }
    st_down(&s, gi, di, 4 * k * rows);
    if (topk)
        st_down(&s, gv, dv, 4 * k * rows);
    for (int i = 0; i < k * rows && !s.rc; i++)
        if (gi[i] != ri[i] || (topk && gv[i] != rv[i]))
            st_fail(&s, STRATA_SELFTEST_WRONG,
                    "%s: row %d rank %d: gpu id %d, reference id %d "
                    "(value %.6g)",
                    topk ? "topk" : "argmax", i / k, i % k, gi[i], ri[i], rv[i]);
    return st_end(&s);
}

/* add, to_f16 and dequant_f16 (the cuBLAS path's conversions): arg 0, 1, 2. */
static int c_elementwise(int dev, int which, char *shapes, size_t sc, char *msg, size_t mc)
{
    struct st s;
    int n = 1000, rows = 3, cols = 200;
    uint32_t type = STRATA_TYPE_Q4_K;
    if (which == 0)
        snprintf(shapes, sc, "n=%d", n);
    else if (which == 1)
        snprintf(shapes, sc, "rows=%d cols=%d stride=%d", rows, cols, cols + 8);
    else
        snprintf(shapes, sc, "Q4_K [256 x 7] expert 1 of 2");
    st_begin(&s, dev, msg, mc);
    struct strata_err err = {0, ""};
    if (which == 0) {
        float *a = (float *)st_host(&s, 4 * n), *b = (float *)st_host(&s, 4 * n);
        float *ref = (float *)st_host(&s, 4 * n), *got = (float *)st_host(&s, 4 * n);
        if (s.rc)
            return st_end(&s);
        kt_fill(a, n, 1.0f);
        kt_fill(b, n, 1.0f);
        for (int i = 0; i < n; i++)
            ref[i] = a[i] + b[i];
        float *da = (float *)st_up(&s, a, 4 * n), *db = (float *)st_up(&s, b, 4 * n);
        float *dy = (float *)st_dev(&s, 4 * n);
        if (!s.rc)
            st_launched(&s, "add", strata_k_add(&s.ctx, da, db, dy, n, &err), &err, dy, 4 * n);
        st_down(&s, got, dy, 4 * n);
        st_compare(&s, "add", got, ref, n, 1e-30, 1e-7);
        return st_end(&s);
    }
    int64_t ne0 = 256, ne1 = 7;
    size_t nout = which == 1 ? (size_t)rows * cols : (size_t)ne0 * ne1;
    float *ref = (float *)st_host(&s, 4 * nout), *got = (float *)st_host(&s, 4 * nout);
    uint16_t *gh = (uint16_t *)st_host(&s, 2 * nout);
    __half *dh = (__half *)st_dev(&s, 2 * nout);
    if (s.rc)
        return st_end(&s);
    if (which == 1) {
        int stride = cols + 8;
        float *x = (float *)st_host(&s, 4 * rows * stride);
        if (s.rc)
            return st_end(&s);
        kt_fill(x, (size_t)rows * stride, 4.0f);
        for (int t = 0; t < rows; t++)
            for (int i = 0; i < cols; i++)
                ref[t * cols + i] = st_f16r(x[t * stride + i]);
        float *dx = (float *)st_up(&s, x, 4 * rows * stride);
        if (!s.rc)
            st_launched(&s, "to_f16", strata_k_to_f16(&s.ctx, dx, stride, rows, cols, dh, &err),
                        &err, dh, 2 * nout);
    } else {
        struct st_w w;
        st_weights(&s, &w, type, ne0, ne1, 2, 1);
        if (s.rc)
            return st_end(&s);
        memcpy(ref, w.f + ne0 * ne1, 4 * nout);
        st_launched(&s, "dequant_f16", strata_k_dequant_f16(&s.ctx, &w.kw, 1, dh, &err), &err, dh,
                    2 * nout);
    }
    st_down(&s, gh, dh, 2 * nout);
    if (s.rc)
        return st_end(&s);
    for (size_t i = 0; i < nout; i++)
        got[i] = strata_f16_to_f32(gh[i]);
    st_compare(&s, which == 1 ? "to_f16" : "dequant_f16", got, ref, nout, 1e-7, 2e-3);
    return st_end(&s);
}

/* ---- the table ---- */

static struct strata_selftest_case st_cases[STRATA_SELFTEST_MAX];
static char st_names[STRATA_SELFTEST_MAX][24];
/* The targets this image was compiled for (mk/gpu.mk defines it; a bare compile
 * knows none). */
#ifndef STRATA_GPU_ARCHS
#define STRATA_GPU_ARCHS ""
#endif

static struct strata_selftest_table st_table;

static void st_add(int *n, const char *kernel, uint32_t type, int has_type,
                   int (*run)(int, int, char *, size_t, char *, size_t), int arg)
{
    if (*n >= STRATA_SELFTEST_MAX - 1)
        return;
    if (has_type)
        snprintf(st_names[*n], sizeof(st_names[*n]), "%s %s", kernel, strata_ggml_type_name(type));
    else
        snprintf(st_names[*n], sizeof(st_names[*n]), "%s", kernel);
    st_cases[*n].kernel = st_names[*n];
    st_cases[*n].run = run;
    st_cases[*n].arg = arg;
    (*n)++;
}

extern "C" const struct strata_selftest_table *strata_gpu_selftest_table(void)
{
    if (st_table.n_cases)
        return &st_table;
    int n = 0;
    st_add(&n, "rms_norm", 0, 0, c_rms_norm, 0);
    st_add(&n, "qkv_rope", 0, 0, c_qkv, 0);
    st_add(&n, "qkv_rope neox", 0, 0, c_qkv, 2);
    st_add(&n, "attention decode", 0, 0, c_attention, 0);
    st_add(&n, "attention prefill", 0, 0, c_attention, 1);
    st_add(&n, "attention q8", 0, 0, c_attention, 2);
    st_add(&n, "moe_route", 0, 0, c_moe, 0);
    st_add(&n, "moe_combine", 0, 0, c_moe, 1);
    st_add(&n, "argmax", 0, 0, c_sample, 0);
    st_add(&n, "topk", 0, 0, c_sample, 1);
    st_add(&n, "add", 0, 0, c_elementwise, 0);
    st_add(&n, "to_f16", 0, 0, c_elementwise, 1);
    st_add(&n, "dequant_f16", 0, 0, c_elementwise, 2);
    st_add(&n, "matmul grouped", STRATA_TYPE_Q4_K, 1, c_matmul_grouped, STRATA_TYPE_Q4_K);
    st_add(&n, "quantize_q8", 0, 0, c_quantize_q8, 0);
    st_add(&n, "moe_router_topk", 0, 0, c_router_topk, 0);
    st_add(&n, "router+ffn_norm", 0, 0, c_router_norm, 0);
    for (int i = 0; i < KT_N_TYPES; i++) {
        uint32_t t = kt_all_types[i];
        if (!strata_k_type_supported(t))
            continue;
        st_add(&n, "get_rows", t, 1, c_get_rows, (int)t);
        st_add(&n, "matvec", t, 1, c_matvec, (int)t);
        st_add(&n, "matmul", t, 1, c_matmul, (int)t);
        if (strata_k_matvec_q8_supported(t))
            st_add(&n, "matvec_q8", t, 1, c_matvec_q8, (int)t);
        if (t == STRATA_TYPE_Q8_0 || t == STRATA_TYPE_Q6_K)
            st_add(&n, "matvec_q8 staged", t, 1, c_matvec_q8_stage, (int)t);
    }
    st_table.api = STRATA_GPU_RUNTIME_NAME;
    st_table.archs = STRATA_GPU_ARCHS;
    st_table.cases = st_cases;
    st_table.init = c_init;
    st_table.n_cases = n;
    return &st_table;
}
