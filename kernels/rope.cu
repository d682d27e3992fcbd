/* rope.cu - per-head q/k RMSNorm, rotary position embedding and the kv cache store. */
#include "rope.cuh"

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

/* One block per (head h0 + blockIdx.x of q, k or v; token): qkv_post_head with the block
 * as its group.  early: the next kernel (the attention, whose blocks work out their key
 * ranges and ask L2 for the kv rows before their own wait) may be scheduled as soon as
 * every block of this one has started: this launch is too short to hide the next one's
 * scheduling behind its work after the wait. */
__global__ void qkv_post_kernel(struct strata_k_qkv_args a, struct strata_k_rope rp, int h0,
                                int early)
{
    __shared__ float scratch[STRATA_GPU_MAX_WARP];
    if (early)
        strata_pdl_trigger();
    /* the pair's indices, norm weights and rotation do not depend on the kernel before */
    const struct qkv_post_pair q =
        qkv_post_prep(a, rp, h0 + blockIdx.x, blockIdx.y, threadIdx.x);
    strata_pdl_wait();
    if (!early)
        strata_pdl_trigger();
    qkv_post_apply(a, q, [&](float v) { return strata_block_sum(v, scratch); });
}

/* STRATA_NO_EARLY_POST=1: qkv_post_kernel lets the next kernel be scheduled only after
 * its wait */
STRATA_K_SWITCH_ON(early_post_on, "STRATA_NO_EARLY_POST")

int strata_k_qkv_post_heads(struct strata_gpu_ctx *ctx, const struct strata_k_qkv_args *a,
                            int h0, int h1, struct strata_err *err)
{
    if (a->n_tok <= 0 || a->n_head <= 0 || a->n_head_kv <= 0 || a->hd <= 0 || a->hd > 512 ||
        a->rope->n_rot > a->hd || a->rope->n_rot % 2 || a->n_tok > 65535 || h0 < 0 ||
        h1 <= h0 || h1 > a->n_head + 2 * a->n_head_kv)
        return strata_k_err(err, STRATA_E_INVALID,
                            "qkv_post: bad shape n_tok=%d n_head=%d n_head_kv=%d hd=%d n_rot=%d "
                            "heads %d..%d", a->n_tok, a->n_head, a->n_head_kv, a->hd,
                            a->rope->n_rot, h0, h1);
    int threads = qkv_post_threads(a->hd);
    dim3 grid((unsigned)(h1 - h0), (unsigned)a->n_tok), block(threads);
    strata_k_launch(ctx, qkv_post_kernel, grid, block, *a, *a->rope, h0, early_post_on());
    return strata_k_check(ctx, "qkv_post_kernel", grid, block, err,
                          "n_tok=%d n_head=%d n_head_kv=%d hd=%d heads %d..%d", a->n_tok,
                          a->n_head, a->n_head_kv, a->hd, h0, h1);
}

int strata_k_qkv_post(struct strata_gpu_ctx *ctx, const struct strata_k_qkv_args *a,
                      struct strata_err *err)
{
    return strata_k_qkv_post_heads(ctx, a, 0, a->n_head + 2 * a->n_head_kv, err);
}
