/* rope.cu - per-head q/k RMSNorm, rotary position embedding and the kv cache store. */
#include "kernels.h"

#include <math.h>

/* ggml_rope_yarn_corr_dim: the dimension whose wavelength spans n_ctx_orig / beta
 * rotations (YaRN, Peng et al. 2023, as ggml computes it). */
static float corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base)
{
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2.0f * (float)M_PI)) /
           (2.0f * logf(base));
}

void strata_k_rope_init(struct strata_k_rope *r, int mode, int n_rot, float freq_base,
                        float freq_scale, int n_ctx_orig, float ext_factor, float attn_factor,
                        float beta_fast, float beta_slow)
{
    r->mode = mode;
    r->n_rot = n_rot;
    r->freq_base = freq_base;
    r->freq_scale = freq_scale;
    r->ext_factor = ext_factor;
    r->attn_factor = attn_factor;
    float start = floorf(corr_dim(n_rot, n_ctx_orig, beta_fast, freq_base));
    float end = ceilf(corr_dim(n_rot, n_ctx_orig, beta_slow, freq_base));
    r->corr_dims[0] = fmaxf(0.0f, start);
    r->corr_dims[1] = fminf((float)(n_rot - 1), end);
}

/* One block per (head of q, k or v; token).  Thread p owns the pair of values that
 * RoPE rotates together (both halves of a neox pair, or 2p and 2p + 1). */
__global__ void qkv_post_kernel(struct strata_k_qkv_args a, struct strata_k_rope rp)
{
    __shared__ float scratch[STRATA_GPU_MAX_WARP];
    int hidx = blockIdx.x, t = blockIdx.y, hd = a.hd;
    int pos = *a.pos0 + t;
    float *src;
    const float *nw;
    int is_v = 0, kv_head = -1;
    if (hidx < a.n_head) {
        src = a.q + t * a.q_stride + (int64_t)hidx * hd;
        nw = a.q_norm;
    } else if (hidx < a.n_head + a.n_head_kv) {
        kv_head = hidx - a.n_head;
        src = a.k + t * a.k_stride + (int64_t)kv_head * hd;
        nw = a.k_norm;
    } else {
        kv_head = hidx - a.n_head - a.n_head_kv;
        src = a.v + t * a.v_stride + (int64_t)kv_head * hd;
        nw = NULL;
        is_v = 1;
    }
    int half_rot = rp.n_rot / 2;
    int p = threadIdx.x;
    /* element indices of this thread's pair */
    int i0, i1;
    if (p < half_rot) {
        i0 = rp.mode == 2 ? p : 2 * p;
        i1 = rp.mode == 2 ? p + half_rot : 2 * p + 1;
    } else {
        i0 = 2 * p; /* past n_rot: unrotated pairs */
        i1 = 2 * p + 1;
    }
    int have = 2 * p < hd;
    float x0 = have ? src[i0] : 0.0f, x1 = have && i1 < hd ? src[i1] : 0.0f;
    if (nw) {
        float s = strata_block_sum(x0 * x0 + x1 * x1, scratch);
        float sc = rsqrtf(s / (float)hd + a.eps);
        x0 = x0 * sc * (have ? nw[i0] : 0.0f);
        x1 = x1 * sc * (have && i1 < hd ? nw[i1] : 0.0f);
    }
    if (!have)
        return;
    if (!is_v && p < half_rot) {
        /* ggml's rope_yarn */
        float theta_extrap = (float)pos * powf(rp.freq_base, -2.0f * (float)p / (float)rp.n_rot);
        float theta_interp = rp.freq_scale * theta_extrap, theta = theta_interp;
        float mscale = rp.attn_factor;
        if (rp.ext_factor != 0.0f) {
            float y = ((float)p - rp.corr_dims[0]) / fmaxf(0.001f, rp.corr_dims[1] - rp.corr_dims[0]);
            float ramp = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * rp.ext_factor;
            theta = theta_interp * (1.0f - ramp) + theta_extrap * ramp;
            mscale *= 1.0f + 0.1f * logf(1.0f / rp.freq_scale);
        }
        float c = cosf(theta) * mscale, s = sinf(theta) * mscale;
        float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
        x0 = r0;
        x1 = r1;
    }
    if (kv_head < 0) {
        src[i0] = x0;
        if (i1 < hd)
            src[i1] = x1;
        return;
    }
    __half *dst = (is_v ? a.v_cache : a.k_cache) + ((int64_t)pos * a.n_head_kv + kv_head) * hd;
    dst[i0] = __float2half(x0);
    if (i1 < hd)
        dst[i1] = __float2half(x1);
}

int strata_k_qkv_post(struct strata_gpu_ctx *ctx, const struct strata_k_qkv_args *a,
                      struct strata_err *err)
{
    if (a->n_tok <= 0 || a->n_head <= 0 || a->n_head_kv <= 0 || a->hd <= 0 || a->hd > 512 ||
        a->rope->n_rot > a->hd || a->rope->n_rot % 2 || a->n_tok > 65535)
        return strata_k_err(err, STRATA_E_INVALID,
                            "qkv_post: bad shape n_tok=%d n_head=%d n_head_kv=%d hd=%d n_rot=%d",
                            a->n_tok, a->n_head, a->n_head_kv, a->hd, a->rope->n_rot);
    int threads = (a->hd / 2 + 63) / 64 * 64;
    dim3 grid((unsigned)(a->n_head + 2 * a->n_head_kv), (unsigned)a->n_tok), block(threads);
    qkv_post_kernel<<<grid, block, 0, ctx->stream>>>(*a, *a->rope);
    return strata_k_check(ctx, "qkv_post_kernel", grid, block, err,
                          "n_tok=%d n_head=%d n_head_kv=%d hd=%d", a->n_tok, a->n_head,
                          a->n_head_kv, a->hd);
}
