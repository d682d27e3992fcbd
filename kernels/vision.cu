/* vision.cu - the Qwen2-VL / Qwen2.5-VL vision encoder on the GPU: the kernels the
 * engine does not have (norm with bias, bias + activation, gated MLP, 2-D rotary,
 * non-causal windowed attention, the merger's gather) and the encoder itself, which
 * keeps the weights in VRAM and runs the projections on the engine's mat-mat kernel
 * (strata_k_matmul) and RMSNorm on the engine's kernel where the rows are unpadded.
 *
 * Layout: activations are [n_patches][ld] float32 with ld the row width rounded up to
 * 64, the mat-mat kernel's K step; the weights are f16 with their rows padded with
 * zeros to the same width.  The pad columns of the activations are zeroed once when
 * the scratch is allocated and no kernel writes them, so the padded products equal
 * the unpadded ones.
 */
#include "vision.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "ggml_types.h"
#include "log.h"
#include "quant.h"
}

#define VA_THREADS 128 /* attention block: a multiple of every warp size, >= hd */
#define VA_CHUNK 1024  /* keys scored per step of the online softmax */
#define VA_HD 128

/* ---- kernels ---------------------------------------------------------- */

/* One block per row.  LayerNorm (b != NULL) subtracts the mean first; both sums have a
 * fixed order (thread-strided partial sums, then the block tree). */
__global__ void vision_norm_kernel(const float *x, int64_t ld_x, const float *__restrict__ w,
                                   const float *__restrict__ b, float *y, int64_t ld_y, int n,
                                   float eps)
{
    __shared__ float scratch[STRATA_GPU_MAX_WARP];
    const float *xr = x + (int64_t)blockIdx.x * ld_x;
    float *yr = y + (int64_t)blockIdx.x * ld_y;
    float mean = 0.0f;
    if (b) {
        float s = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            s += xr[i];
        mean = strata_block_sum(s, scratch) / (float)n;
    }
    float s2 = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float d = xr[i] - mean;
        s2 = fmaf(d, d, s2);
    }
    s2 = strata_block_sum(s2, scratch);
    float sc = rsqrtf(s2 / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = (xr[i] - mean) * sc * w[i] + (b ? b[i] : 0.0f);
}

int strata_k_vision_norm(struct strata_gpu_ctx *ctx, const float *x, int64_t ld_x,
                         const float *w, const float *b, float *y, int64_t ld_y, int n,
                         int n_rows, float eps, struct strata_err *err)
{
    if (n <= 0 || n_rows <= 0 || ld_x < n || ld_y < n || !w)
        return strata_k_err(err, STRATA_E_INVALID,
                            "vision_norm: bad shape n=%d n_rows=%d ld_x=%lld ld_y=%lld%s", n,
                            n_rows, (long long)ld_x, (long long)ld_y, w ? "" : " (no weight)");
    dim3 grid((unsigned)n_rows), block(STRATA_GPU_BLOCK);
    vision_norm_kernel<<<grid, block, 0, ctx->stream>>>(x, ld_x, w, b, y, ld_y, n, eps);
    return strata_k_check(ctx, "vision_norm_kernel", grid, block, err,
                          "%s n=%d n_rows=%d ld_x=%lld ld_y=%lld", b ? "layer" : "rms", n,
                          n_rows, (long long)ld_x, (long long)ld_y);
}

__global__ void vision_bias_act_kernel(float *y, int64_t ld, const float *__restrict__ b, int n,
                                       int64_t total, int act)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    int64_t r = i / n;
    int c = (int)(i % n);
    float *p = y + r * ld + c;
    float v = *p + (b ? b[c] : 0.0f);
    if (act == STRATA_K_ACT_GELU)
        v = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    else if (act == STRATA_K_ACT_QUICK_GELU)
        v = v / (1.0f + expf(-1.702f * v));
    *p = v;
}

/* Grid of a flat element-wise kernel over total elements; 0 if it does not fit. */
static unsigned flat_grid(int64_t total)
{
    int64_t g = (total + STRATA_GPU_BLOCK - 1) / STRATA_GPU_BLOCK;
    return g > 0 && g <= 0x7fffffff ? (unsigned)g : 0u;
}

int strata_k_vision_bias_act(struct strata_gpu_ctx *ctx, float *y, int64_t ld, const float *b,
                             int n, int n_rows, int act, struct strata_err *err)
{
    int64_t total = (int64_t)n * n_rows;
    unsigned gx = flat_grid(total);
    if (n <= 0 || n_rows <= 0 || ld < n || !gx || act < STRATA_K_ACT_NONE ||
        act > STRATA_K_ACT_QUICK_GELU)
        return strata_k_err(err, STRATA_E_INVALID,
                            "vision_bias_act: bad shape n=%d n_rows=%d ld=%lld act=%d", n, n_rows,
                            (long long)ld, act);
    dim3 grid(gx), block(STRATA_GPU_BLOCK);
    vision_bias_act_kernel<<<grid, block, 0, ctx->stream>>>(y, ld, b, n, total, act);
    return strata_k_check(ctx, "vision_bias_act_kernel", grid, block, err,
                          "n=%d n_rows=%d ld=%lld act=%d bias=%s", n, n_rows, (long long)ld, act,
                          b ? "yes" : "no");
}

__global__ void vision_glu_kernel(float *g, const float *u, int64_t ld,
                                  const float *__restrict__ bg, const float *__restrict__ bu,
                                  int n, int64_t total)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    int64_t o = i / n * ld + i % n;
    int c = (int)(i % n);
    float a = g[o] + (bg ? bg[c] : 0.0f), up = u[o] + (bu ? bu[c] : 0.0f);
    g[o] = a / (1.0f + expf(-a)) * up;
}

int strata_k_vision_glu(struct strata_gpu_ctx *ctx, float *g, const float *u, int64_t ld,
                        const float *bg, const float *bu, int n, int n_rows,
                        struct strata_err *err)
{
    int64_t total = (int64_t)n * n_rows;
    unsigned gx = flat_grid(total);
    if (n <= 0 || n_rows <= 0 || ld < n || !gx || g == u)
        return strata_k_err(err, STRATA_E_INVALID,
                            "vision_glu: bad shape n=%d n_rows=%d ld=%lld", n, n_rows,
                            (long long)ld);
    dim3 grid(gx), block(STRATA_GPU_BLOCK);
    vision_glu_kernel<<<grid, block, 0, ctx->stream>>>(g, u, ld, bg, bu, n, total);
    return strata_k_check(ctx, "vision_glu_kernel", grid, block, err, "n=%d n_rows=%d ld=%lld",
                          n, n_rows, (long long)ld);
}

/* Angles in double precision, as lib/vision.c computes them: positions reach a few
 * hundred and a float angle would lose the low bits before the cosine. */
__global__ void vision_rope_table_kernel(const int32_t *row, const int32_t *col, int n, int hd,
                                         float2 *cs)
{
    const int half = hd / 2, quarter = hd / 4;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n * half)
        return;
    int t = (int)(i / half), j = (int)(i % half);
    int f = j % quarter;
    double inv_freq = pow(10000.0, -(2.0 * f) / half);
    double ang = (j < quarter ? row[t] : col[t]) * inv_freq;
    cs[i] = make_float2((float)cos(ang), (float)sin(ang));
}

int strata_k_vision_rope_table(struct strata_gpu_ctx *ctx, const int32_t *row, const int32_t *col,
                               int n, int hd, float2 *cs, struct strata_err *err)
{
    int64_t total = (int64_t)n * (hd / 2);
    unsigned gx = flat_grid(total);
    if (n <= 0 || hd <= 0 || hd % 4 || !gx)
        return strata_k_err(err, STRATA_E_INVALID, "vision_rope_table: bad shape n=%d hd=%d", n,
                            hd);
    dim3 grid(gx), block(STRATA_GPU_BLOCK);
    vision_rope_table_kernel<<<grid, block, 0, ctx->stream>>>(row, col, n, hd, cs);
    return strata_k_check(ctx, "vision_rope_table_kernel", grid, block, err, "n=%d hd=%d", n,
                          hd);
}

__global__ void vision_rope_kernel(float *q, float *k, int64_t ld, const float2 *__restrict__ cs,
                                   int n_head, int hd, int64_t total)
{
    const int half = hd / 2;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    int j = (int)(i % half);
    int64_t th = i / half;
    int h = (int)(th % n_head);
    int64_t t = th / n_head;
    float2 c = cs[t * half + j];
    float *p = q + t * ld + (int64_t)h * hd;
    float a = p[j], b = p[j + half];
    p[j] = a * c.x - b * c.y;
    p[j + half] = b * c.x + a * c.y;
    if (k) {
        p = k + t * ld + (int64_t)h * hd;
        a = p[j];
        b = p[j + half];
        p[j] = a * c.x - b * c.y;
        p[j + half] = b * c.x + a * c.y;
    }
}

int strata_k_vision_rope(struct strata_gpu_ctx *ctx, float *q, float *k, int64_t ld,
                         const float2 *cs, int n, int n_head, int hd, struct strata_err *err)
{
    int64_t total = (int64_t)n * n_head * (hd / 2);
    unsigned gx = flat_grid(total);
    if (n <= 0 || n_head <= 0 || hd <= 0 || hd % 4 || ld < (int64_t)n_head * hd || !gx)
        return strata_k_err(err, STRATA_E_INVALID,
                            "vision_rope: bad shape n=%d n_head=%d hd=%d ld=%lld", n, n_head, hd,
                            (long long)ld);
    dim3 grid(gx), block(STRATA_GPU_BLOCK);
    vision_rope_kernel<<<grid, block, 0, ctx->stream>>>(q, k, ld, cs, n_head, hd, total);
    return strata_k_check(ctx, "vision_rope_kernel", grid, block, err,
                          "n=%d n_head=%d hd=%d ld=%lld", n, n_head, hd, (long long)ld);
}

/* One block per (query patch, head).  The window's keys are scored VA_CHUNK at a time
 * into shared memory, one key per thread; the output is accumulated with an online
 * softmax (Milakov & Gimelshein 2018), thread c + hd * g owning output dimension c
 * for the keys j = g (mod blockDim / hd); the groups are summed at the end. */
__global__ void __launch_bounds__(VA_THREADS)
vision_attn_kernel(const float *q, const float *k, const float *v, float *out, int64_t ld, int n,
                   int hd, const int32_t *order, const int32_t *win_start,
                   const int32_t *pos_win, float scale)
{
    __shared__ __align__(16) float qs[VA_HD];
    __shared__ float s[VA_CHUNK];
    __shared__ float red[STRATA_GPU_MAX_WARP];
    __shared__ float part[VA_THREADS];
    const int p = blockIdx.x, tid = threadIdx.x;
    const int64_t hoff = (int64_t)blockIdx.y * hd;
    int a = 0, b = n;
    if (order) {
        int w = pos_win[p];
        a = win_start[w];
        b = win_start[w + 1];
    }
    const int qi = order ? order[p] : p;
    for (int i = tid; i < hd; i += blockDim.x)
        qs[i] = q[(int64_t)qi * ld + hoff + i] * scale;
    __syncthreads();
    const int G = blockDim.x / hd, c = tid % hd, g = tid / hd, hd4 = hd / 4;
    const float4 *q4 = (const float4 *)qs;
    float m_run = -INFINITY, l_run = 0.0f, acc = 0.0f;
    for (int c0 = a; c0 < b; c0 += VA_CHUNK) {
        const int cn = b - c0 < VA_CHUNK ? b - c0 : VA_CHUNK;
        float mx = -INFINITY;
        for (int j = tid; j < cn; j += blockDim.x) {
            const int kj = order ? order[c0 + j] : c0 + j;
            const float4 *kr = (const float4 *)(k + (int64_t)kj * ld + hoff);
            float d = 0.0f;
            for (int i = 0; i < hd4; i++) {
                float4 kk = kr[i], qq = q4[i];
                d = fmaf(qq.x, kk.x, d);
                d = fmaf(qq.y, kk.y, d);
                d = fmaf(qq.z, kk.z, d);
                d = fmaf(qq.w, kk.w, d);
            }
            s[j] = d;
            mx = fmaxf(mx, d);
        }
        mx = strata_block_max(mx, red);
        const float m_new = fmaxf(m_run, mx);
        const float corr = expf(m_run - m_new); /* 0 on the first chunk */
        float ls = 0.0f;
        for (int j = tid; j < cn; j += blockDim.x) {
            float e = expf(s[j] - m_new);
            s[j] = e;
            ls += e;
        }
        ls = strata_block_sum(ls, red); /* its barriers publish s[] */
        l_run = l_run * corr + ls;
        acc *= corr;
        if (g < G)
            for (int j = g; j < cn; j += G) {
                const int vj = order ? order[c0 + j] : c0 + j;
                acc = fmaf(s[j], v[(int64_t)vj * ld + hoff + c], acc);
            }
        m_run = m_new;
        __syncthreads(); /* s[] is rewritten by the next chunk */
    }
    part[tid] = g < G ? acc : 0.0f;
    __syncthreads();
    if (tid < hd) {
        float o = 0.0f;
        for (int gg = 0; gg < G; gg++)
            o += part[gg * hd + tid];
        out[(int64_t)qi * ld + hoff + tid] = o / l_run;
    }
}

int strata_k_vision_attn(struct strata_gpu_ctx *ctx, const float *q, const float *k,
                         const float *v, float *out, int64_t ld, int n, int n_head, int hd,
                         const int32_t *order, const int32_t *win_start, const int32_t *pos_win,
                         float scale, struct strata_err *err)
{
    if (n <= 0 || n_head <= 0 || n_head > 65535 || hd <= 0 || hd > VA_HD || hd % 4 ||
        ld % 4 || ld < (int64_t)n_head * hd || (order && (!win_start || !pos_win)) ||
        (((uintptr_t)q | (uintptr_t)k) & 15) != 0)
        return strata_k_err(err, STRATA_E_INVALID,
                            "vision_attn: bad shape n=%d n_head=%d hd=%d (<= %d, multiple of 4) "
                            "ld=%lld (multiple of 4)%s",
                            n, n_head, hd, VA_HD, (long long)ld,
                            order && (!win_start || !pos_win) ? " (window arrays missing)" : "");
    dim3 grid((unsigned)n, (unsigned)n_head), block(VA_THREADS);
    vision_attn_kernel<<<grid, block, 0, ctx->stream>>>(q, k, v, out, ld, n, hd, order,
                                                        win_start, pos_win, scale);
    return strata_k_check(ctx, "vision_attn_kernel", grid, block, err,
                          "n=%d n_head=%d hd=%d ld=%lld %s", n, n_head, hd, (long long)ld,
                          order ? "windowed" : "full");
}

__global__ void vision_merge_kernel(const float *x, int64_t ld_x, int n, int mm, float *y,
                                    int64_t ld_y, int64_t total)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    int c = (int)(i % n);
    int64_t r = i / n; /* source row t * mm + j */
    int64_t t = r / mm;
    int j = (int)(r % mm);
    y[t * ld_y + (int64_t)j * n + c] = x[r * ld_x + c];
}

int strata_k_vision_merge(struct strata_gpu_ctx *ctx, const float *x, int64_t ld_x, int n,
                          int mm, int n_tok, float *y, int64_t ld_y, struct strata_err *err)
{
    int64_t total = (int64_t)n_tok * mm * n;
    unsigned gx = flat_grid(total);
    if (n <= 0 || mm <= 0 || n_tok <= 0 || ld_x < n || ld_y < (int64_t)mm * n || !gx)
        return strata_k_err(err, STRATA_E_INVALID,
                            "vision_merge: bad shape n=%d mm=%d n_tok=%d ld_x=%lld ld_y=%lld", n,
                            mm, n_tok, (long long)ld_x, (long long)ld_y);
    dim3 grid(gx), block(STRATA_GPU_BLOCK);
    vision_merge_kernel<<<grid, block, 0, ctx->stream>>>(x, ld_x, n, mm, y, ld_y, total);
    return strata_k_check(ctx, "vision_merge_kernel", grid, block, err,
                          "n=%d mm=%d n_tok=%d ld_x=%lld ld_y=%lld", n, mm, n_tok,
                          (long long)ld_x, (long long)ld_y);
}

/* ---- the encoder (host code) ------------------------------------------ */
#ifdef STRATA_GPU_HOST_PASS

struct dlin {
    struct strata_k_weight w; /* f16, ne0 padded to a multiple of 64; data NULL: absent */
    float *b;                 /* [ne1] or NULL */
};

struct dblk {
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    struct dlin q, k, v, o, gate, up, down;
};

struct strata_vision_gpu {
    struct strata_gpu_ctx ctx;
    int E, F, H, hd, L, n_out, mm, kdim;
    float eps;
    int64_t ldE, ldF, ldK, ldME;
    struct dlin patch, mm0, mm2;
    struct dblk *blk;
    float *post_w, *post_b;
    void **allocs;       /* weights */
    size_t n_allocs, cap_allocs, vram_bytes;
    /* scratch for cap_n patches: one allocation, zeroed when made */
    int cap_n;
    void *scratch;
    float *pix, *x, *xn, *q, *k, *v, *att, *f1, *f2, *mrg, *mid, *res;
    float2 *cs;
    int32_t *d_row, *d_col, *d_order, *d_win_start, *d_pos_win;
    float *h_pix;  /* [cap_n][ldK], pad columns zero */
    int32_t *h_int; /* row, col, order, win_start, pos_win */
    char desc[384];
};

static int64_t pad64(int64_t n)
{
    return (n + 63) / 64 * 64;
}

static int call(struct strata_vision_gpu *g, cudaError_t e, const char *what,
                struct strata_err *err)
{
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError();
    return strata_k_err(err, STRATA_E_GPU, "vision encoder: %s on %s device %d (%s): %s: %s",
                        what, STRATA_GPU_RUNTIME_NAME, g->ctx.info.device, g->ctx.info.name,
                        cudaGetErrorName(e), cudaGetErrorString(e));
}

static int dalloc(struct strata_vision_gpu *g, void **p, size_t bytes, const char *what,
                  struct strata_err *err)
{
    *p = NULL;
    if (g->n_allocs == g->cap_allocs) {
        size_t nc = g->cap_allocs ? 2 * g->cap_allocs : 128;
        void **na = (void **)realloc(g->allocs, nc * sizeof(void *));
        if (!na)
            return strata_k_err(err, STRATA_E_NOMEM, "out of memory");
        g->allocs = na;
        g->cap_allocs = nc;
    }
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        return strata_k_err(err, STRATA_E_NOMEM,
                            "vision encoder: cannot allocate %.1f MiB of VRAM for %s on device "
                            "%d (%s): %s (%.1f MiB allocated so far)",
                            bytes / 1048576.0, what, g->ctx.info.device, g->ctx.info.name,
                            cudaGetErrorString(e), g->vram_bytes / 1048576.0);
    }
    g->allocs[g->n_allocs++] = *p;
    g->vram_bytes += bytes;
    return 0;
}

static int up_vec(struct strata_vision_gpu *g, const float *h, int64_t n, const char *name,
                  float **d, struct strata_err *err)
{
    *d = NULL;
    if (!h)
        return 0;
    int rc = dalloc(g, (void **)d, sizeof(float) * (size_t)n, name, err);
    if (!rc)
        rc = call(g, cudaMemcpyAsync(*d, h, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice,
                                     g->ctx.stream), name, err);
    return rc;
}

/* Staging of the weight upload: host and device float32 of the largest padded matrix. */
struct stage {
    float *h, *d;
    size_t cap; /* floats */
};

/* Upload l as f16 [ne1][pad64(ne0)] (zero pad), checking it is [n_in] -> [n_out]. */
static int up_linear(struct strata_vision_gpu *g, struct stage *st,
                     const struct strata_vision_gpu_linear *l, const char *name, int64_t n_in,
                     int64_t n_out, struct dlin *d, struct strata_err *err)
{
    memset(d, 0, sizeof(*d));
    if (!l->data)
        return 0;
    if (l->ne0 != n_in || l->ne1 != n_out || n_out > 65535)
        return strata_k_err(err, STRATA_E_INVALID,
                            "vision encoder: tensor %s is [%lld, %lld], expected [%lld, %lld]",
                            name, (long long)l->ne0, (long long)l->ne1, (long long)n_in,
                            (long long)n_out);
    int64_t ne0p = pad64(l->ne0);
    size_t n = (size_t)ne0p * (size_t)l->ne1;
    if (n > st->cap)
        return strata_k_err(err, STRATA_E_INTERNAL, "vision encoder: staging too small for %s",
                            name);
    memset(st->h, 0, n * sizeof(float));
    for (int64_t r = 0; r < l->ne1; r++) {
        int rc = strata_quant_dequant_ref(l->type, (const char *)l->data + (size_t)r * l->nb1,
                                          st->h + (size_t)r * ne0p, l->ne0, err);
        if (rc) {
            char m[sizeof(err->msg)];
            snprintf(m, sizeof(m), "%s", err ? err->msg : "");
            return strata_k_err(err, rc, "vision encoder: tensor %s: %s", name, m);
        }
    }
    void *p;
    int rc = dalloc(g, &p, n * sizeof(__half), name, err);
    if (!rc)
        rc = call(g, cudaMemcpyAsync(st->d, st->h, n * sizeof(float), cudaMemcpyHostToDevice,
                                     g->ctx.stream), name, err);
    if (!rc)
        rc = strata_k_to_f16(&g->ctx, st->d, ne0p, (int)l->ne1, (int)ne0p, (__half *)p, err);
    /* the next upload reuses the staging: finish this conversion first */
    if (!rc)
        rc = call(g, cudaStreamSynchronize(g->ctx.stream), name, err);
    if (rc)
        return rc;
    d->w.type = STRATA_TYPE_F16;
    d->w.ne0 = ne0p;
    d->w.ne1 = l->ne1;
    d->w.nb1 = (size_t)ne0p * sizeof(__half);
    d->w.nb2 = 0;
    d->w.data = p;
    char bname[160];
    snprintf(bname, sizeof(bname), "%s bias", name);
    return up_vec(g, l->bias, l->ne1, bname, &d->b, err);
}

extern "C" const char *strata_vision_gpu_runtime(void)
{
    return STRATA_GPU_RUNTIME_NAME;
}

extern "C" int strata_vision_gpu_n_devices(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" void strata_vision_gpu_free(struct strata_vision_gpu *g)
{
    if (!g)
        return;
    if (g->ctx.stream) {
        (void)cudaSetDevice(g->ctx.info.device); /* the caller may be another thread */
        (void)cudaStreamSynchronize(g->ctx.stream);
    }
    for (size_t i = 0; i < g->n_allocs; i++)
        (void)cudaFree(g->allocs[i]);
    if (g->scratch)
        (void)cudaFree(g->scratch);
    if (g->ctx.stream)
        (void)cudaStreamDestroy(g->ctx.stream);
    (void)cudaGetLastError();
    free(g->allocs);
    free(g->blk);
    free(g->h_pix);
    free(g->h_int);
    free(g);
}

extern "C" const char *strata_vision_gpu_describe(const struct strata_vision_gpu *g)
{
    return g->desc;
}

extern "C" int strata_vision_gpu_open(struct strata_vision_gpu **out,
                                      const struct strata_vision_gpu_model *m, int device,
                                      struct strata_err *err)
{
    *out = NULL;
    struct stage st = {NULL, NULL, 0};
    int rc = 0, n_dev = 0, dev = device >= 0 ? device : 0;
    struct strata_vision_gpu *g = (struct strata_vision_gpu *)calloc(1, sizeof(*g));
    if (!g)
        return strata_k_err(err, STRATA_E_NOMEM, "out of memory");
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        (void)cudaGetLastError();
        rc = strata_k_err(err, STRATA_E_GPU, "vision encoder: no %s device available%s%s",
                          STRATA_GPU_RUNTIME_NAME, e != cudaSuccess ? ": " : "",
                          e != cudaSuccess ? cudaGetErrorString(e) : "");
        goto out;
    }
    if (dev >= n_dev) {
        rc = strata_k_err(err, STRATA_E_INVALID,
                          "vision encoder: device %d does not exist (%d %s device%s visible)",
                          dev, n_dev, STRATA_GPU_RUNTIME_NAME, n_dev == 1 ? "" : "s");
        goto out;
    }
    if ((rc = strata_gpu_info_query(dev, &g->ctx.info, err)) ||
        (rc = call(g, cudaSetDevice(dev), "cudaSetDevice", err)) ||
        (rc = strata_gpu_check_image(&g->ctx.info, err)) ||
        (rc = call(g, cudaStreamCreateWithFlags(&g->ctx.stream, cudaStreamNonBlocking),
                   "cudaStreamCreate", err)))
        goto out;
    {
        const char *sd = getenv("STRATA_SYNC_DEBUG");
        g->ctx.sync_debug = sd && *sd && strcmp(sd, "0") != 0;
    }
    g->E = m->n_embd;
    g->F = m->n_ff;
    g->H = m->n_head;
    g->L = m->n_layer;
    g->n_out = m->n_out;
    g->mm = m->merge * m->merge;
    g->kdim = m->kdim;
    g->eps = m->eps;
    if (g->E <= 0 || g->H <= 0 || g->E % g->H || g->F <= 0 || g->L <= 0 || g->n_out <= 0 ||
        g->mm <= 0 || g->kdim <= 0) {
        rc = strata_k_err(err, STRATA_E_INVALID,
                          "vision encoder: bad hyper-parameters n_embd=%d n_head=%d n_ff=%d "
                          "n_layer=%d n_out=%d merge^2=%d kdim=%d",
                          g->E, g->H, g->F, g->L, g->n_out, g->mm, g->kdim);
        goto out;
    }
    g->hd = g->E / g->H;
    if (g->hd > VA_HD || g->hd % 4) {
        rc = strata_k_err(err, STRATA_E_INVALID,
                          "vision encoder: head dim %d is not supported by the GPU attention "
                          "(at most %d, a multiple of 4)",
                          g->hd, VA_HD);
        goto out;
    }
    g->ldE = pad64(g->E);
    g->ldF = pad64(g->F);
    g->ldK = pad64(g->kdim);
    g->ldME = pad64((int64_t)g->mm * g->E);
    {
        int64_t ME = (int64_t)g->mm * g->E, big = 0;
        int64_t sizes[] = {g->ldK * g->E, g->ldE * g->E, g->ldE * g->F, g->ldF * g->E,
                           g->ldME * ME, g->ldME * g->n_out};
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
            big = sizes[i] > big ? sizes[i] : big;
        st.cap = (size_t)big;
        st.h = (float *)malloc(st.cap * sizeof(float));
        if (!st.h) {
            rc = strata_k_err(err, STRATA_E_NOMEM, "out of memory (weight staging)");
            goto out;
        }
        if ((rc = call(g, cudaMalloc((void **)&st.d, st.cap * sizeof(float)),
                       "cudaMalloc (weight staging)", err)))
            goto out;
        g->blk = (struct dblk *)calloc((size_t)g->L, sizeof(*g->blk));
        if (!g->blk) {
            rc = strata_k_err(err, STRATA_E_NOMEM, "out of memory");
            goto out;
        }
        struct strata_vision_gpu_linear pl = {STRATA_TYPE_F32, g->kdim, g->E,
                                              sizeof(float) * (size_t)g->kdim, m->patch_w,
                                              m->patch_b};
        if ((rc = up_linear(g, &st, &pl, "v.patch_embd", g->kdim, g->E, &g->patch, err)))
            goto out;
        for (int l = 0; l < g->L; l++) {
            const struct strata_vision_gpu_block *b = &m->blk[l];
            struct dblk *d = &g->blk[l];
            char n[64];
#define NM(s) (snprintf(n, sizeof(n), "v.blk.%d.%s", l, s), n)
            if (!b->ln1_w || !b->ln2_w || !b->q.data || !b->k.data || !b->v.data ||
                !b->o.data || !b->up.data || !b->down.data) {
                rc = strata_k_err(err, STRATA_E_INVALID, "vision encoder: block %d is incomplete",
                                  l);
                goto out;
            }
            if ((rc = up_vec(g, b->ln1_w, g->E, NM("ln1.weight"), &d->ln1_w, err)) ||
                (rc = up_vec(g, b->ln1_b, g->E, NM("ln1.bias"), &d->ln1_b, err)) ||
                (rc = up_vec(g, b->ln2_w, g->E, NM("ln2.weight"), &d->ln2_w, err)) ||
                (rc = up_vec(g, b->ln2_b, g->E, NM("ln2.bias"), &d->ln2_b, err)) ||
                (rc = up_linear(g, &st, &b->q, NM("attn_q"), g->E, g->E, &d->q, err)) ||
                (rc = up_linear(g, &st, &b->k, NM("attn_k"), g->E, g->E, &d->k, err)) ||
                (rc = up_linear(g, &st, &b->v, NM("attn_v"), g->E, g->E, &d->v, err)) ||
                (rc = up_linear(g, &st, &b->o, NM("attn_out"), g->E, g->E, &d->o, err)) ||
                (rc = up_linear(g, &st, &b->gate, NM("ffn_gate"), g->E, g->F, &d->gate, err)) ||
                (rc = up_linear(g, &st, &b->up, NM("ffn_up"), g->E, g->F, &d->up, err)) ||
                (rc = up_linear(g, &st, &b->down, NM("ffn_down"), g->F, g->E, &d->down, err)))
                goto out;
#undef NM
        }
        if (!m->post_w) {
            rc = strata_k_err(err, STRATA_E_INVALID, "vision encoder: v.post_ln.weight missing");
            goto out;
        }
        if ((rc = up_vec(g, m->post_w, g->E, "v.post_ln.weight", &g->post_w, err)) ||
            (rc = up_vec(g, m->post_b, g->E, "v.post_ln.bias", &g->post_b, err)) ||
            (rc = up_linear(g, &st, &m->mm0, "mm.0", ME, ME, &g->mm0, err)) ||
            (rc = up_linear(g, &st, &m->mm2, "mm.2", ME, g->n_out, &g->mm2, err)))
            goto out;
        if (!g->mm0.w.data || !g->mm2.w.data) {
            rc = strata_k_err(err, STRATA_E_INVALID, "vision encoder: merger mm.0/mm.2 missing");
            goto out;
        }
    }
    /* uploads are ordered on the stream; finish them before the staging goes */
    if ((rc = call(g, cudaStreamSynchronize(g->ctx.stream), "weight upload", err)))
        goto out;
    snprintf(g->desc, sizeof(g->desc), "%s device %d (%s, %s), %.1f MiB of weights",
             STRATA_GPU_RUNTIME_NAME, dev, g->ctx.info.name, g->ctx.info.arch,
             g->vram_bytes / 1048576.0);
    *out = g;
    g = NULL;
out:
    free(st.h);
    if (st.d)
        (void)cudaFree(st.d);
    strata_vision_gpu_free(g);
    return rc;
}

/* Make room for n patches: scratch VRAM and host staging, zeroed. */
static int grow(struct strata_vision_gpu *g, int n, struct strata_err *err)
{
    if (n <= g->cap_n)
        return 0;
    if (g->scratch) {
        (void)cudaStreamSynchronize(g->ctx.stream);
        (void)cudaFree(g->scratch);
        g->scratch = NULL;
    }
    free(g->h_pix);
    free(g->h_int);
    g->h_pix = NULL;
    g->h_int = NULL;
    g->cap_n = 0;
    const int64_t T = (n + g->mm - 1) / g->mm;
    const int64_t sizes[] = {
        /* floats (or float2 for cs, int32 for the index arrays), in the order of ptrs */
        (int64_t)n * g->ldK, (int64_t)n * g->ldE, (int64_t)n * g->ldE, (int64_t)n * g->ldE,
        (int64_t)n * g->ldE, (int64_t)n * g->ldE, (int64_t)n * g->ldE, (int64_t)n * g->ldF,
        (int64_t)n * g->ldF, T * g->ldME, T * g->ldME, T * g->n_out,
        (int64_t)n * (g->hd / 2) * 2, /* cs: float2 */
        (int64_t)n, (int64_t)n, (int64_t)n, (int64_t)n + 1, (int64_t)n, /* int32 */
    };
    const int n_arr = (int)(sizeof(sizes) / sizeof(sizes[0]));
    size_t off[sizeof(sizes) / sizeof(sizes[0])], total = 0;
    for (int i = 0; i < n_arr; i++) {
        off[i] = total;
        total += ((size_t)sizes[i] * 4 + 255) / 256 * 256;
    }
    cudaError_t e = cudaMalloc(&g->scratch, total);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        g->scratch = NULL;
        return strata_k_err(err, STRATA_E_NOMEM,
                            "vision encoder: cannot allocate %.1f MiB of VRAM for %d patches on "
                            "device %d (%s): %s",
                            total / 1048576.0, n, g->ctx.info.device, g->ctx.info.name,
                            cudaGetErrorString(e));
    }
    char *base = (char *)g->scratch;
    float **fp[] = {&g->pix, &g->x, &g->xn, &g->q, &g->k, &g->v, &g->att,
                    &g->f1, &g->f2, &g->mrg, &g->mid, &g->res};
    for (int i = 0; i < 12; i++)
        *fp[i] = (float *)(base + off[i]);
    g->cs = (float2 *)(base + off[12]);
    g->d_row = (int32_t *)(base + off[13]);
    g->d_col = (int32_t *)(base + off[14]);
    g->d_order = (int32_t *)(base + off[15]);
    g->d_win_start = (int32_t *)(base + off[16]);
    g->d_pos_win = (int32_t *)(base + off[17]);
    int rc = call(g, cudaMemsetAsync(g->scratch, 0, total, g->ctx.stream), "cudaMemset (scratch)",
                  err);
    if (rc)
        return rc;
    g->h_pix = (float *)calloc((size_t)n * (size_t)g->ldK, sizeof(float));
    g->h_int = (int32_t *)malloc(sizeof(int32_t) * ((size_t)5 * n + 1));
    if (!g->h_pix || !g->h_int)
        return strata_k_err(err, STRATA_E_NOMEM, "out of memory for %d patches", n);
    g->cap_n = n;
    return 0;
}

static int mm(struct strata_vision_gpu *g, const struct dlin *l, const float *x, int64_t ld_x,
              int n, float *y, int64_t ld_y, const float *add, struct strata_err *err)
{
    struct strata_k_mm_args a;
    memset(&a, 0, sizeof(a));
    a.w = &l->w;
    a.n_tok = n;
    a.x = x;
    a.x_stride = ld_x;
    a.y = y;
    a.y_stride = ld_y;
    a.add = add;
    int rc = strata_k_matmul(&g->ctx, &a, err);
    if (!rc && l->b)
        rc = strata_k_vision_bias_act(&g->ctx, y, ld_y, l->b, (int)l->w.ne1, n, STRATA_K_ACT_NONE,
                                      err);
    return rc;
}

/* norm(x) -> y over n rows of E: the engine's RMSNorm where it fits (no bias, rows
 * unpadded), else the vision kernel (LayerNorm, or padded rows). */
static int norm(struct strata_vision_gpu *g, const float *x, const float *w, const float *b,
                float *y, int n, struct strata_err *err)
{
    if (!b && g->ldE == g->E)
        return strata_k_rms_norm(&g->ctx, x, w, y, g->E, n, g->eps, err);
    return strata_k_vision_norm(&g->ctx, x, g->ldE, w, b, y, g->ldE, g->E, n, g->eps, err);
}

/* The launches of one image; returns at the first failure. */
static int forward(struct strata_vision_gpu *g, const struct strata_vision_gpu_layout *lay,
                   int *layer, struct strata_err *err)
{
    const int N = lay->n_patches, T = N / g->mm, E = g->E, F = g->F;
    const int64_t ldE = g->ldE, ldF = g->ldF;
    const float scale = 1.0f / sqrtf((float)g->hd);
    struct strata_gpu_ctx *c = &g->ctx;
    int rc;
    *layer = -1;
    if ((rc = strata_k_vision_rope_table(c, g->d_row, g->d_col, N, g->hd, g->cs, err)) ||
        (rc = mm(g, &g->patch, g->pix, g->ldK, N, g->x, ldE, NULL, err)))
        return rc;
    for (int l = 0; l < g->L; l++) {
        const struct dblk *b = &g->blk[l];
        const int full = lay->full[l] != 0;
        *layer = l;
        if ((rc = norm(g, g->x, b->ln1_w, b->ln1_b, g->xn, N, err)) ||
            (rc = mm(g, &b->q, g->xn, ldE, N, g->q, ldE, NULL, err)) ||
            (rc = mm(g, &b->k, g->xn, ldE, N, g->k, ldE, NULL, err)) ||
            (rc = mm(g, &b->v, g->xn, ldE, N, g->v, ldE, NULL, err)) ||
            (rc = strata_k_vision_rope(c, g->q, g->k, ldE, g->cs, N, g->H, g->hd, err)) ||
            (rc = strata_k_vision_attn(c, g->q, g->k, g->v, g->att, ldE, N, g->H, g->hd,
                                       full ? NULL : g->d_order, full ? NULL : g->d_win_start,
                                       full ? NULL : g->d_pos_win, scale, err)) ||
            (rc = mm(g, &b->o, g->att, ldE, N, g->x, ldE, g->x, err)) ||
            (rc = norm(g, g->x, b->ln2_w, b->ln2_b, g->xn, N, err)))
            return rc;
        if (b->gate.w.data) {
            /* f1 = silu(gate xn + b) * (up xn + b); mm() added the biases */
            if ((rc = mm(g, &b->gate, g->xn, ldE, N, g->f1, ldF, NULL, err)) ||
                (rc = mm(g, &b->up, g->xn, ldE, N, g->f2, ldF, NULL, err)) ||
                (rc = strata_k_vision_glu(c, g->f1, g->f2, ldF, NULL, NULL, F, N, err)))
                return rc;
        } else if ((rc = mm(g, &b->up, g->xn, ldE, N, g->f1, ldF, NULL, err)) ||
                   (rc = strata_k_vision_bias_act(c, g->f1, ldF, NULL, F, N,
                                                  STRATA_K_ACT_QUICK_GELU, err))) {
            return rc;
        }
        if ((rc = mm(g, &b->down, g->f1, ldF, N, g->x, ldE, g->x, err)))
            return rc;
    }
    *layer = -1;
    /* merger: norm, merge^2 neighbours side by side, Linear, GELU, Linear */
    if ((rc = norm(g, g->x, g->post_w, g->post_b, g->xn, N, err)) ||
        (rc = strata_k_vision_merge(c, g->xn, ldE, E, g->mm, T, g->mrg, g->ldME, err)) ||
        (rc = mm(g, &g->mm0, g->mrg, g->ldME, T, g->mid, g->ldME, NULL, err)) ||
        (rc = strata_k_vision_bias_act(c, g->mid, g->ldME, NULL, (int)g->mm0.w.ne1, T,
                                       STRATA_K_ACT_GELU, err)) ||
        (rc = mm(g, &g->mm2, g->mid, g->ldME, T, g->res, g->n_out, NULL, err)))
        return rc;
    return 0;
}

extern "C" int strata_vision_gpu_encode(struct strata_vision_gpu *g, const float *pixel,
                                        const struct strata_vision_gpu_layout *lay, float *out,
                                        struct strata_err *err)
{
    const int N = lay->n_patches;
    if (N <= 0 || N % g->mm || lay->n_win <= 0 || lay->n_win > N)
        return strata_k_err(err, STRATA_E_INVALID,
                            "vision encoder: %d patches in %d windows (a multiple of %d)", N,
                            lay->n_win, g->mm);
    const int T = N / g->mm;
    /* the helper's HTTP threads are not the thread that opened the encoder */
    int rc = call(g, cudaSetDevice(g->ctx.info.device), "cudaSetDevice", err);
    if (!rc)
        rc = grow(g, N, err);
    if (rc)
        return rc;
    for (int i = 0; i < N; i++)
        memcpy(g->h_pix + (size_t)i * g->ldK, pixel + (size_t)i * g->kdim,
               sizeof(float) * (size_t)g->kdim);
    int32_t *hi = g->h_int;
    for (int i = 0; i < N; i++) {
        if (lay->order[i] < 0 || lay->order[i] >= N)
            return strata_k_err(err, STRATA_E_INVALID,
                                "vision encoder: window order[%d] = %d is outside [0, %d)", i,
                                lay->order[i], N);
        hi[i] = lay->row[i];
        hi[N + i] = lay->col[i];
        hi[2 * N + i] = lay->order[i];
    }
    for (int w = 0; w <= lay->n_win; w++)
        hi[3 * N + w] = lay->win_start[w];
    for (int w = 0; w < lay->n_win; w++) {
        int a = lay->win_start[w], b = lay->win_start[w + 1];
        if (a < 0 || b < a || b > N)
            return strata_k_err(err, STRATA_E_INVALID, "vision encoder: window %d is [%d, %d)",
                                w, a, b);
        for (int p = a; p < b; p++)
            hi[4 * N + 1 + p] = w;
    }
    if (lay->win_start[0] != 0 || lay->win_start[lay->n_win] != N)
        return strata_k_err(err, STRATA_E_INVALID,
                            "vision encoder: windows cover [%d, %d) of %d patches",
                            lay->win_start[0], lay->win_start[lay->n_win], N);
    cudaStream_t s = g->ctx.stream;
    int layer = -1;
    if ((rc = call(g, cudaMemcpyAsync(g->pix, g->h_pix, sizeof(float) * (size_t)N * g->ldK,
                                      cudaMemcpyHostToDevice, s), "copy of the patches", err)) ||
        (rc = call(g, cudaMemcpyAsync(g->d_row, hi, sizeof(int32_t) * N, cudaMemcpyHostToDevice,
                                      s), "copy of the positions", err)) ||
        (rc = call(g, cudaMemcpyAsync(g->d_col, hi + N, sizeof(int32_t) * N,
                                      cudaMemcpyHostToDevice, s), "copy of the positions", err)) ||
        (rc = call(g, cudaMemcpyAsync(g->d_order, hi + 2 * N, sizeof(int32_t) * N,
                                      cudaMemcpyHostToDevice, s), "copy of the windows", err)) ||
        (rc = call(g, cudaMemcpyAsync(g->d_win_start, hi + 3 * N,
                                      sizeof(int32_t) * (size_t)(lay->n_win + 1),
                                      cudaMemcpyHostToDevice, s), "copy of the windows", err)) ||
        (rc = call(g, cudaMemcpyAsync(g->d_pos_win, hi + 4 * N + 1, sizeof(int32_t) * N,
                                      cudaMemcpyHostToDevice, s), "copy of the windows", err)))
        return rc;
    rc = forward(g, lay, &layer, err);
    if (rc) {
        char m[sizeof(err->msg)];
        snprintf(m, sizeof(m), "%s", err ? err->msg : "");
        if (layer >= 0)
            strata_k_err(err, rc, "vision encoder, block %d of %d patches: %s", layer, N, m);
        else
            strata_k_err(err, rc, "vision encoder, %d patches: %s", N, m);
        (void)cudaStreamSynchronize(s);
        (void)cudaGetLastError();
        return rc;
    }
    if ((rc = call(g, cudaMemcpyAsync(out, g->res, sizeof(float) * (size_t)T * g->n_out,
                                      cudaMemcpyDeviceToHost, s), "copy of the embeddings", err)))
        return rc;
    return call(g, cudaStreamSynchronize(s),
                "encode (asynchronous error; run with STRATA_SYNC_DEBUG=1 to find the kernel)",
                err);
}

#endif /* STRATA_GPU_HOST_PASS */
