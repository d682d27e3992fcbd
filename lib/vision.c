/* vision.c - Qwen2-VL / Qwen2.5-VL vision encoder on the CPU. */
#include "vision.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "matmul.h"
#include "quant.h"

#ifdef STRATA_WITH_GPU
#include "../kernels/vision.h"
#endif

struct lin {
    struct strata_mat w; /* [out rows][in cols] */
    const float *b;      /* [out] or NULL */
};

struct vblock {
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    struct lin q, k, v, o;
    struct lin gate, up, down; /* gate.w.data NULL for the fc1/fc2 MLP */
};

struct strata_vision {
    struct strata_vision_hparams hp;
    float *patch_w; /* [n_embd][3 * temporal * patch^2], both temporal halves */
    const float *patch_b;
    struct vblock *blk;
    const float *post_w, *post_b;
    struct lin mm0, mm2;
    const char *backend; /* "cpu", or the GPU runtime's name */
#ifdef STRATA_WITH_GPU
    struct strata_vision_gpu *gpu; /* non-NULL: encode on the GPU */
#endif
};

/* ---- loading ---------------------------------------------------------- */

static const struct strata_gguf_tensor *find(const struct strata_gguf *g, const char *name,
                                             int required, struct strata_err *err, int *rc)
{
    const struct strata_gguf_tensor *t = strata_gguf_find_tensor(g, name);
    if (!t && required && *rc == 0)
        *rc = strata_err_set(err, STRATA_E_NOTFOUND, "mmproj tensor '%s' not found", name);
    return t;
}

/* A float32 vector of n elements, or NULL (absent and optional). */
static const float *vec(const struct strata_gguf *g, const char *name, int64_t n, int required,
                        struct strata_err *err, int *rc)
{
    const struct strata_gguf_tensor *t = find(g, name, required, err, rc);
    if (!t)
        return NULL;
    if (t->type != STRATA_TYPE_F32 || (int64_t)t->n_elements != n) {
        if (*rc == 0)
            *rc = strata_err_set(err, STRATA_E_FORMAT,
                                 "mmproj tensor '%s' must be F32 of %lld elements (is %s, %llu)",
                                 name, (long long)n, strata_ggml_type_name(t->type),
                                 (unsigned long long)t->n_elements);
        return NULL;
    }
    return t->data;
}

static void linear(const struct strata_gguf *g, const char *name, int64_t n_in, int64_t n_out,
                   int required, struct lin *l, struct strata_err *err, int *rc)
{
    char buf[96];
    memset(l, 0, sizeof(*l));
    snprintf(buf, sizeof(buf), "%s.weight", name);
    const struct strata_gguf_tensor *t = find(g, buf, required, err, rc);
    if (!t)
        return;
    if ((int64_t)t->ne[0] != n_in || (int64_t)t->ne[1] != n_out || t->ne[2] != 1 ||
        !strata_quant_supported(t->type)) {
        if (*rc == 0)
            *rc = strata_err_set(err, STRATA_E_FORMAT,
                                 "mmproj tensor '%s' has shape [%llu, %llu] type %s, expected "
                                 "[%lld, %lld]",
                                 buf, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                                 strata_ggml_type_name(t->type), (long long)n_in,
                                 (long long)n_out);
        return;
    }
    l->w.type = t->type;
    l->w.ne0 = n_in;
    l->w.ne1 = n_out;
    l->w.nb1 = (size_t)strata_ggml_row_size(t->type, (uint64_t)n_in);
    l->w.data = t->data;
    snprintf(buf, sizeof(buf), "%s.bias", name);
    l->b = vec(g, buf, n_out, 0, err, rc);
}

static int get_u32(const struct strata_gguf *g, const char *key, int def, int *out,
                   struct strata_err *err)
{
    uint32_t v;
    struct strata_err e = {0};
    int rc = strata_gguf_get_u32(g, key, &v, &e);
    if (rc == STRATA_E_NOTFOUND && def >= 0) {
        *out = def;
        return 0;
    }
    if (rc != 0) {
        if (err)
            *err = e;
        return rc;
    }
    if (v == 0 || v > 1u << 20)
        return strata_err_set(err, STRATA_E_FORMAT, "mmproj key '%s' = %u is out of range", key,
                              v);
    *out = (int)v;
    return 0;
}

int strata_vision_load(struct strata_vision **out, const struct strata_gguf *g,
                       struct strata_err *err)
{
    *out = NULL;
    int rc = 0;
    const char *proj = NULL;
    struct strata_vision *v = calloc(1, sizeof(*v));
    if (!v)
        return strata_err_set(err, STRATA_E_NOMEM, "no memory for the vision encoder");
    struct strata_vision_hparams *hp = &v->hp;
    v->backend = "cpu";

    if ((rc = strata_gguf_get_str(g, "clip.projector_type", &proj, err)) != 0)
        goto out;
    if (strcmp(proj, "qwen2.5vl_merger") == 0 || strcmp(proj, "qwen2.5vl") == 0)
        hp->projector = STRATA_VISION_QWEN25VL;
    else if (strcmp(proj, "qwen2vl_merger") == 0 || strcmp(proj, "qwen2vl") == 0)
        hp->projector = STRATA_VISION_QWEN2VL;
    else {
        rc = strata_err_set(err, STRATA_E_UNSUPPORTED,
                            "clip.projector_type '%s' is not supported (supported: "
                            "qwen2vl_merger, qwen2.5vl_merger)",
                            proj);
        goto out;
    }
    if ((rc = get_u32(g, "clip.vision.patch_size", -1, &hp->patch_size, err)) ||
        (rc = get_u32(g, "clip.vision.embedding_length", -1, &hp->n_embd, err)) ||
        (rc = get_u32(g, "clip.vision.feed_forward_length", -1, &hp->n_ff, err)) ||
        (rc = get_u32(g, "clip.vision.block_count", -1, &hp->n_layer, err)) ||
        (rc = get_u32(g, "clip.vision.attention.head_count", -1, &hp->n_head, err)) ||
        (rc = get_u32(g, "clip.vision.projection_dim", -1, &hp->n_out, err)) ||
        (rc = get_u32(g, "clip.vision.spatial_merge_size", 2, &hp->merge, err)) ||
        (rc = get_u32(g, "clip.vision.window_size", 112, &hp->window_size, err)))
        goto out;
    hp->n_wa_pattern = 0;
    if (hp->projector == STRATA_VISION_QWEN25VL &&
        (rc = get_u32(g, "clip.vision.n_wa_pattern", 0, &hp->n_wa_pattern, err)))
        goto out;
    hp->temporal = 2;
    hp->eps = 1e-6f;
    if (strata_gguf_find_kv(g, "clip.vision.attention.layer_norm_epsilon") &&
        (rc = strata_gguf_get_f32(g, "clip.vision.attention.layer_norm_epsilon", &hp->eps, err)))
        goto out;
    if (hp->n_embd % hp->n_head || (hp->n_embd / hp->n_head) % 4 || hp->patch_size > 64 ||
        hp->n_layer > 256) {
        rc = strata_err_set(err, STRATA_E_FORMAT,
                            "mmproj: n_embd %d, head_count %d, patch_size %d, block_count %d "
                            "are inconsistent",
                            hp->n_embd, hp->n_head, hp->patch_size, hp->n_layer);
        goto out;
    }
    const struct strata_gguf_arr *mean, *std;
    if ((rc = strata_gguf_get_arr(g, "clip.vision.image_mean", -1, &mean, err)) ||
        (rc = strata_gguf_get_arr(g, "clip.vision.image_std", -1, &std, err)))
        goto out;
    if (mean->n != 3 || std->n != 3) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "clip.vision.image_mean/std must have 3 values");
        goto out;
    }
    for (int c = 0; c < 3; c++) {
        hp->mean[c] = (float)strata_gguf_arr_f64(mean, c);
        hp->std[c] = (float)strata_gguf_arr_f64(std, c);
        if (!(hp->std[c] > 0)) {
            rc = strata_err_set(err, STRATA_E_FORMAT, "clip.vision.image_std[%d] is not positive",
                                c);
            goto out;
        }
    }

    /* patch embedding: two [n_embd][3][p][p] halves -> one [n_embd][3*2*p*p] */
    int p = hp->patch_size, E = hp->n_embd;
    const struct strata_gguf_tensor *pw[2] = {
        find(g, "v.patch_embd.weight", 1, err, &rc),
        find(g, "v.patch_embd.weight.1", 1, err, &rc),
    };
    if (rc)
        goto out;
    for (int t = 0; t < 2; t++) {
        if (pw[t]->ne[0] != (uint64_t)p || pw[t]->ne[1] != (uint64_t)p || pw[t]->ne[2] != 3 ||
            pw[t]->ne[3] != (uint64_t)E || !strata_quant_supported(pw[t]->type) ||
            strata_ggml_blck_size(pw[t]->type) != 1) {
            rc = strata_err_set(err, STRATA_E_FORMAT,
                                "mmproj tensor '%s' must be [%d, %d, 3, %d] F32/F16/BF16",
                                pw[t]->name, p, p, E);
            goto out;
        }
    }
    size_t kdim = (size_t)3 * 2 * p * p;
    v->patch_w = malloc(sizeof(float) * kdim * (size_t)E);
    if (!v->patch_w) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "no memory for the patch embedding");
        goto out;
    }
    for (int t = 0; t < 2; t++) {
        float *tmp = malloc(sizeof(float) * 3 * (size_t)p * p);
        if (!tmp) {
            rc = strata_err_set(err, STRATA_E_NOMEM, "no memory for the patch embedding");
            goto out;
        }
        size_t es = strata_ggml_type_size(pw[t]->type);
        for (int o = 0; o < E; o++) {
            strata_quant_dequant_row(pw[t]->type, (const char *)pw[t]->data + es * 3 * p * p * o,
                                     tmp, 3 * p * p);
            for (int c = 0; c < 3; c++)
                for (int k = 0; k < p * p; k++)
                    v->patch_w[(size_t)o * kdim + (size_t)(c * 2 + t) * p * p + k] =
                        tmp[c * p * p + k];
        }
        free(tmp);
    }
    v->patch_b = vec(g, "v.patch_embd.bias", E, 0, err, &rc);

    v->blk = calloc((size_t)hp->n_layer, sizeof(*v->blk));
    if (!v->blk) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "no memory for the vision blocks");
        goto out;
    }
    int gated = hp->projector == STRATA_VISION_QWEN25VL;
    for (int i = 0; i < hp->n_layer && rc == 0; i++) {
        struct vblock *b = &v->blk[i];
        char n[64];
#define NAME(s) (snprintf(n, sizeof(n), "v.blk.%d.%s", i, s), n)
        b->ln1_w = vec(g, NAME("ln1.weight"), E, 1, err, &rc);
        b->ln1_b = vec(g, NAME("ln1.bias"), E, 0, err, &rc);
        b->ln2_w = vec(g, NAME("ln2.weight"), E, 1, err, &rc);
        b->ln2_b = vec(g, NAME("ln2.bias"), E, 0, err, &rc);
        linear(g, NAME("attn_q"), E, E, 1, &b->q, err, &rc);
        linear(g, NAME("attn_k"), E, E, 1, &b->k, err, &rc);
        linear(g, NAME("attn_v"), E, E, 1, &b->v, err, &rc);
        linear(g, NAME("attn_out"), E, E, 1, &b->o, err, &rc);
        if (gated)
            linear(g, NAME("ffn_gate"), E, hp->n_ff, 1, &b->gate, err, &rc);
        linear(g, NAME("ffn_up"), E, hp->n_ff, 1, &b->up, err, &rc);
        linear(g, NAME("ffn_down"), hp->n_ff, E, 1, &b->down, err, &rc);
#undef NAME
    }
    if (rc)
        goto out;
    v->post_w = vec(g, "v.post_ln.weight", E, 1, err, &rc);
    v->post_b = vec(g, "v.post_ln.bias", E, 0, err, &rc);
    int merged = E * hp->merge * hp->merge;
    linear(g, "mm.0", merged, merged, 1, &v->mm0, err, &rc);
    linear(g, "mm.2", merged, hp->n_out, 1, &v->mm2, err, &rc);
out:
    if (rc) {
        strata_vision_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

void strata_vision_free(struct strata_vision *v)
{
    if (!v)
        return;
#ifdef STRATA_WITH_GPU
    strata_vision_gpu_free(v->gpu);
#endif
    free(v->patch_w);
    free(v->blk);
    free(v);
}

const struct strata_vision_hparams *strata_vision_hparams(const struct strata_vision *v)
{
    return &v->hp;
}

const char *strata_vision_backend(const struct strata_vision *v)
{
    return v->backend;
}

#ifdef STRATA_WITH_GPU
static void gpu_linear(const struct lin *l, struct strata_vision_gpu_linear *d)
{
    d->type = l->w.type;
    d->ne0 = l->w.ne0;
    d->ne1 = l->w.ne1;
    d->nb1 = l->w.nb1;
    d->data = l->w.data;
    d->bias = l->b;
}

/* Describe the loaded weights to the GPU encoder and upload them. */
static int gpu_open(struct strata_vision *v, int device, struct strata_err *err)
{
    const struct strata_vision_hparams *hp = &v->hp;
    struct strata_vision_gpu_block *blk = calloc((size_t)hp->n_layer, sizeof(*blk));
    if (!blk)
        return strata_err_set(err, STRATA_E_NOMEM, "no memory for the vision blocks");
    for (int i = 0; i < hp->n_layer; i++) {
        const struct vblock *b = &v->blk[i];
        struct strata_vision_gpu_block *d = &blk[i];
        d->ln1_w = b->ln1_w;
        d->ln1_b = b->ln1_b;
        d->ln2_w = b->ln2_w;
        d->ln2_b = b->ln2_b;
        gpu_linear(&b->q, &d->q);
        gpu_linear(&b->k, &d->k);
        gpu_linear(&b->v, &d->v);
        gpu_linear(&b->o, &d->o);
        gpu_linear(&b->gate, &d->gate);
        gpu_linear(&b->up, &d->up);
        gpu_linear(&b->down, &d->down);
    }
    struct strata_vision_gpu_model m = {
        .n_embd = hp->n_embd, .n_ff = hp->n_ff, .n_head = hp->n_head, .n_layer = hp->n_layer,
        .n_out = hp->n_out, .merge = hp->merge,
        .kdim = 3 * hp->temporal * hp->patch_size * hp->patch_size, .eps = hp->eps,
        .patch_w = v->patch_w, .patch_b = v->patch_b, .blk = blk,
        .post_w = v->post_w, .post_b = v->post_b,
    };
    gpu_linear(&v->mm0, &m.mm0);
    gpu_linear(&v->mm2, &m.mm2);
    int rc = strata_vision_gpu_open(&v->gpu, &m, device, err);
    free(blk);
    if (rc == 0) {
        v->backend = strata_vision_gpu_runtime();
        strata_log_info("vision encoder on %s", strata_vision_gpu_describe(v->gpu));
    }
    return rc;
}
#endif

int strata_vision_set_backend(struct strata_vision *v, const char *name, int device,
                              struct strata_err *err)
{
#ifdef STRATA_WITH_GPU
    strata_vision_gpu_free(v->gpu);
    v->gpu = NULL;
#endif
    v->backend = "cpu";
    if (!name || strcmp(name, "cpu") == 0)
        return 0;
#ifdef STRATA_WITH_GPU
    const char *rt = strata_vision_gpu_runtime();
    if (strcmp(name, "auto") == 0) {
        if (strata_vision_gpu_n_devices() == 0) {
            strata_log_info("backend auto: no %s device found, the vision encoder runs on "
                            "the cpu", rt);
            return 0;
        }
        return gpu_open(v, device, err);
    }
    if (strcmp(name, rt) == 0 || strcmp(name, "gpu") == 0)
        return gpu_open(v, device, err);
    if (strcmp(name, "cuda") == 0 || strcmp(name, "hip") == 0)
        return strata_err_set(err, STRATA_E_UNSUPPORTED,
                              "backend '%s' is not in this build (built for %s; build with "
                              "'make %s')", name, rt, name);
    return strata_err_set(err, STRATA_E_UNSUPPORTED, "unknown backend '%s' (cpu, auto, %s)",
                          name, rt);
#else
    (void)device;
    if (strcmp(name, "auto") == 0)
        return 0;
    if (strcmp(name, "cuda") == 0 || strcmp(name, "hip") == 0 || strcmp(name, "gpu") == 0)
        return strata_err_set(err, STRATA_E_UNSUPPORTED,
                              "backend '%s' is not in this build (built for the cpu only; "
                              "build with 'make cuda' or 'make hip')", name);
    return strata_err_set(err, STRATA_E_UNSUPPORTED, "unknown backend '%s' (cpu, auto)", name);
#endif
}

/* ---- forward ---------------------------------------------------------- */

/* y[n][l->w.ne1] = x[n][ne0] W^T + b */
static int run_linear(struct strata_pool *pool, const struct lin *l, const float *x, int64_t n,
                      float *y, struct strata_err *err)
{
    int rc = strata_matmul(pool, &l->w, x, n, y, err);
    if (rc == 0 && l->b)
        for (int64_t t = 0; t < n; t++)
            for (int64_t r = 0; r < l->w.ne1; r++)
                y[t * l->w.ne1 + r] += l->b[r];
    return rc;
}

/* RMSNorm (no bias) or LayerNorm (with bias), per row of n. */
static void norm_rows(const float *x, float *y, int64_t rows, int n, const float *w,
                      const float *b, float eps)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        double mean = 0, var = 0;
        if (b) {
            for (int i = 0; i < n; i++)
                mean += xr[i];
            mean /= n;
        }
        for (int i = 0; i < n; i++)
            var += (xr[i] - mean) * (xr[i] - mean);
        float s = (float)(1.0 / sqrt(var / n + eps));
        for (int i = 0; i < n; i++)
            yr[i] = (float)(xr[i] - mean) * s * w[i] + (b ? b[i] : 0.0f);
    }
}

struct attn_job {
    const float *q, *k, *v; /* [N][E] */
    float *out;             /* [N][E] */
    const int *order;       /* patches grouped by window */
    const int *win_start;   /* start of each window in order[], n_win + 1 entries */
    int n_win, n_head, head_dim, E;
    float *scratch;         /* per thread [N] */
    int N;
};

static void attn_worker(void *ctx, int ith, int nth)
{
    struct attn_job *j = ctx;
    float *s = j->scratch + (size_t)ith * j->N;
    float scale = 1.0f / sqrtf((float)j->head_dim);
    int64_t n_items = (int64_t)j->n_win * j->n_head;
    for (int64_t it = ith; it < n_items; it += nth) {
        int w = (int)(it / j->n_head), h = (int)(it % j->n_head);
        int a = j->win_start[w], b = j->win_start[w + 1];
        for (int qi = a; qi < b; qi++) {
            const float *q = j->q + (size_t)j->order[qi] * j->E + h * j->head_dim;
            float mx = -INFINITY;
            for (int ki = a; ki < b; ki++) {
                const float *k = j->k + (size_t)j->order[ki] * j->E + h * j->head_dim;
                float d = 0;
                for (int c = 0; c < j->head_dim; c++)
                    d += q[c] * k[c];
                s[ki - a] = d * scale;
                if (s[ki - a] > mx)
                    mx = s[ki - a];
            }
            float sum = 0;
            for (int ki = a; ki < b; ki++)
                sum += s[ki - a] = expf(s[ki - a] - mx);
            float *o = j->out + (size_t)j->order[qi] * j->E + h * j->head_dim;
            memset(o, 0, sizeof(float) * j->head_dim);
            for (int ki = a; ki < b; ki++) {
                const float *vv = j->v + (size_t)j->order[ki] * j->E + h * j->head_dim;
                float p = s[ki - a] / sum;
                for (int c = 0; c < j->head_dim; c++)
                    o[c] += p * vv[c];
            }
        }
    }
}

/* Rotate pairs (i, i + d/2) of each head by the patch's 2-D angle: the
 * first d/4 frequencies follow the row, the next d/4 the column
 * (VisionRotaryEmbedding with dim = head_dim / 2, theta 10000). */
static void rope_2d(float *x, int N, int E, int n_head, const int *row, const int *col)
{
    int d = E / n_head, half = d / 2, quarter = d / 4;
    for (int t = 0; t < N; t++)
        for (int h = 0; h < n_head; h++) {
            float *v = x + (size_t)t * E + h * d;
            for (int i = 0; i < half; i++) {
                int f = i % quarter;
                double inv_freq = pow(10000.0, -(2.0 * f) / half);
                double ang = (i < quarter ? row[t] : col[t]) * inv_freq;
                float c = (float)cos(ang), s = (float)sin(ang);
                float a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
}

/* Whether block l attends to the whole image (qwen2.5vl: every n_wa_pattern-th
 * block; qwen2vl: all). */
static int block_full(const struct strata_vision_hparams *hp, int l)
{
    return hp->n_wa_pattern == 0 || (l + 1) % hp->n_wa_pattern == 0;
}

/* Positions and windows of the N = grid_h * grid_w patches in HF order: row[i],
 * col[i]; order_win[] lists the patches window by window (windows of ws x ws merge
 * blocks, row-major; HF order inside a window, which attention does not depend on),
 * window w holding order_win[win_start[w] .. win_start[w + 1]).  Returns the number
 * of windows. */
static int patch_layout(const struct strata_vision_hparams *hp, int grid_h, int grid_w, int *row,
                        int *col, int *order_win, int *win_start)
{
    int m = hp->merge, N = grid_h * grid_w;
    /* patch i of the HF order sits in merge block i / m^2 */
    int bw_n = grid_w / m;
    for (int i = 0; i < N; i++) {
        int blk = i / (m * m), in = i % (m * m);
        row[i] = blk / bw_n * m + in / m;
        col[i] = blk % bw_n * m + in % m;
    }
    int ws = hp->window_size / (hp->patch_size * m);
    if (ws < 1)
        ws = 1;
    int n_wy = (grid_h / m + ws - 1) / ws, n_wx = (bw_n + ws - 1) / ws, n_win = 0, at = 0;
    for (int wy = 0; wy < n_wy; wy++)
        for (int wx = 0; wx < n_wx; wx++) {
            win_start[n_win++] = at;
            for (int i = 0; i < N; i++)
                if (row[i] / m / ws == wy && col[i] / m / ws == wx)
                    order_win[at++] = i;
        }
    win_start[n_win] = at;
    return n_win;
}

int strata_vision_encode(struct strata_vision *v, struct strata_pool *pool, const float *pixel,
                         int grid_h, int grid_w, float **out, int *n_tokens,
                         struct strata_err *err)
{
    const struct strata_vision_hparams *hp = &v->hp;
    *out = NULL;
    int m = hp->merge;
    if (grid_h <= 0 || grid_w <= 0 || grid_h % m || grid_w % m ||
        (int64_t)grid_h * grid_w > (1 << 20))
        return strata_err_set(err, STRATA_E_INVALID,
                              "invalid patch grid %dx%d (must be positive multiples of %d)",
                              grid_h, grid_w, m);
    int N = grid_h * grid_w, E = hp->n_embd, F = hp->n_ff;
    int kdim = 3 * hp->temporal * hp->patch_size * hp->patch_size;
    int rc = 0;
    float *x = NULL, *hbuf = NULL, *q = NULL, *k = NULL, *vv = NULL, *att = NULL, *f1 = NULL;
    float *f2 = NULL, *scratch = NULL, *merged = NULL, *mid = NULL, *res = NULL;
    int *order_full = NULL, win_start_full[2] = {0, N};
    unsigned char *full = NULL;
    int *row = malloc(sizeof(int) * N), *col = malloc(sizeof(int) * N);
    int *order_win = malloc(sizeof(int) * N), *win_start_w = malloc(sizeof(int) * (N + 1));
    if (!row || !col || !order_win || !win_start_w) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "no memory to encode %d patches", N);
        goto out;
    }
    int n_win = patch_layout(hp, grid_h, grid_w, row, col, order_win, win_start_w);

#ifdef STRATA_WITH_GPU
    if (v->gpu) {
        int T = N / (m * m);
        full = malloc((size_t)hp->n_layer);
        res = malloc(sizeof(float) * (size_t)T * hp->n_out);
        if (!full || !res) {
            rc = strata_err_set(err, STRATA_E_NOMEM, "no memory for %d image tokens", T);
            goto out;
        }
        for (int l = 0; l < hp->n_layer; l++)
            full[l] = (unsigned char)block_full(hp, l);
        struct strata_vision_gpu_layout lay = {
            .n_patches = N, .n_win = n_win, .row = row, .col = col, .order = order_win,
            .win_start = win_start_w, .full = full,
        };
        if ((rc = strata_vision_gpu_encode(v->gpu, pixel, &lay, res, err)))
            goto out;
        *out = res;
        res = NULL;
        *n_tokens = T;
        goto out;
    }
#endif

    x = malloc(sizeof(float) * N * E);
    hbuf = malloc(sizeof(float) * N * E);
    q = malloc(sizeof(float) * N * E);
    k = malloc(sizeof(float) * N * E);
    vv = malloc(sizeof(float) * N * E);
    att = malloc(sizeof(float) * N * E);
    f1 = malloc(sizeof(float) * (size_t)N * F);
    f2 = malloc(sizeof(float) * (size_t)N * F);
    order_full = malloc(sizeof(int) * N);
    int n_threads = strata_pool_n_threads(pool);
    scratch = malloc(sizeof(float) * (size_t)N * n_threads);
    if (!x || !hbuf || !q || !k || !vv || !att || !f1 || !f2 || !order_full || !scratch) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "no memory to encode %d patches", N);
        goto out;
    }
    for (int i = 0; i < N; i++)
        order_full[i] = i;

    /* patch embedding */
    struct lin pe = {.w = {STRATA_TYPE_F32, kdim, E, sizeof(float) * kdim, v->patch_w},
                     .b = v->patch_b};
    if ((rc = run_linear(pool, &pe, pixel, N, x, err)))
        goto out;

    for (int l = 0; l < hp->n_layer; l++) {
        const struct vblock *b = &v->blk[l];
        norm_rows(x, hbuf, N, E, b->ln1_w, b->ln1_b, hp->eps);
        if ((rc = run_linear(pool, &b->q, hbuf, N, q, err)) ||
            (rc = run_linear(pool, &b->k, hbuf, N, k, err)) ||
            (rc = run_linear(pool, &b->v, hbuf, N, vv, err)))
            goto out;
        rope_2d(q, N, E, hp->n_head, row, col);
        rope_2d(k, N, E, hp->n_head, row, col);
        int is_full = block_full(hp, l);
        struct attn_job job = {
            .q = q, .k = k, .v = vv, .out = att,
            .order = is_full ? order_full : order_win,
            .win_start = is_full ? win_start_full : win_start_w,
            .n_win = is_full ? 1 : n_win,
            .n_head = hp->n_head, .head_dim = E / hp->n_head, .E = E,
            .scratch = scratch, .N = N,
        };
        strata_pool_run(pool, attn_worker, &job);
        if ((rc = run_linear(pool, &b->o, att, N, hbuf, err)))
            goto out;
        for (int64_t i = 0; i < (int64_t)N * E; i++)
            x[i] += hbuf[i];

        norm_rows(x, hbuf, N, E, b->ln2_w, b->ln2_b, hp->eps);
        if ((rc = run_linear(pool, &b->up, hbuf, N, f1, err)))
            goto out;
        if (b->gate.w.data) {
            if ((rc = run_linear(pool, &b->gate, hbuf, N, f2, err)))
                goto out;
            for (int64_t i = 0; i < (int64_t)N * F; i++) {
                float g = f2[i];
                f1[i] *= g / (1.0f + expf(-g)); /* SiLU(gate) * up */
            }
        } else {
            for (int64_t i = 0; i < (int64_t)N * F; i++) {
                float u = f1[i];
                f1[i] = u / (1.0f + expf(-1.702f * u)); /* QuickGELU */
            }
        }
        if ((rc = run_linear(pool, &b->down, f1, N, hbuf, err)))
            goto out;
        for (int64_t i = 0; i < (int64_t)N * E; i++)
            x[i] += hbuf[i];
    }

    /* merger: norm, m*m consecutive patches -> one row, MLP with GELU */
    norm_rows(x, hbuf, N, E, v->post_w, v->post_b, hp->eps);
    int T = N / (m * m), ME = E * m * m;
    mid = malloc(sizeof(float) * (size_t)T * ME);
    res = malloc(sizeof(float) * (size_t)T * hp->n_out);
    if (!mid || !res) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "no memory for %d image tokens", T);
        goto out;
    }
    merged = hbuf; /* [N][E] is already [T][m*m*E] in memory */
    if ((rc = run_linear(pool, &v->mm0, merged, T, mid, err)))
        goto out;
    for (int64_t i = 0; i < (int64_t)T * ME; i++)
        mid[i] = 0.5f * mid[i] * (1.0f + erff(mid[i] * (float)M_SQRT1_2)); /* exact GELU */
    if ((rc = run_linear(pool, &v->mm2, mid, T, res, err)))
        goto out;
    *out = res;
    res = NULL;
    *n_tokens = T;
out:
    free(x);
    free(hbuf);
    free(q);
    free(k);
    free(vv);
    free(att);
    free(f1);
    free(f2);
    free(row);
    free(col);
    free(order_win);
    free(win_start_w);
    free(order_full);
    free(scratch);
    free(mid);
    free(res);
    free(full);
    return rc;
}

int strata_vision_encode_image(struct strata_vision *v, struct strata_pool *pool,
                               const struct strata_image *img, int64_t min_pixels,
                               int64_t max_pixels, float **out, int *n_tokens, int *grid_h,
                               int *grid_w, struct strata_err *err)
{
    const struct strata_vision_hparams *hp = &v->hp;
    struct strata_image sized = {0};
    float *patches = NULL;
    int h, w, n, gh, gw;
    int rc = strata_image_smart_resize(img->h, img->w, hp->patch_size * hp->merge, min_pixels,
                                       max_pixels, &h, &w, err);
    if (rc == 0)
        rc = strata_image_resize(img, w, h, &sized, err);
    if (rc == 0)
        rc = strata_image_patches(&sized, hp->mean, hp->std, hp->patch_size, hp->merge,
                                  hp->temporal, &patches, &n, &gh, &gw, err);
    if (rc == 0)
        rc = strata_vision_encode(v, pool, patches, gh, gw, out, n_tokens, err);
    if (rc == 0) {
        if (grid_h)
            *grid_h = gh / hp->merge;
        if (grid_w)
            *grid_w = gw / hp->merge;
    }
    free(patches);
    strata_image_free(&sized);
    return rc;
}

/* ---- payload ---------------------------------------------------------- */

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static uint32_t get_u32le(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int strata_embd_write(FILE *f, const struct strata_embd_header *h, const float *rows,
                      struct strata_err *err)
{
    unsigned char hdr[STRATA_EMBD_HEADER_SIZE] = {0};
    memcpy(hdr, STRATA_EMBD_MAGIC, 8);
    put_u32(hdr + 8, 1);
    put_u32(hdr + 12, h->n_tokens);
    put_u32(hdr + 16, h->n_embd);
    put_u32(hdr + 20, h->grid_t);
    put_u32(hdr + 24, h->grid_h);
    put_u32(hdr + 28, h->grid_w);
    put_u32(hdr + 32, h->flags);
    size_t n = (size_t)h->n_tokens * h->n_embd;
    /* float32 rows are written as the host stores them: x86-64 and ARM64
     * are little-endian, as the format requires */
    if (fwrite(hdr, 1, sizeof(hdr), f) != sizeof(hdr) || fwrite(rows, sizeof(float), n, f) != n ||
        fflush(f) != 0)
        return strata_err_set(err, STRATA_E_IO, "cannot write the embedding payload");
    return 0;
}

int strata_embd_read(FILE *f, const char *name, struct strata_embd_header *h, float **rows,
                     struct strata_err *err)
{
    unsigned char hdr[STRATA_EMBD_HEADER_SIZE];
    *rows = NULL;
    if (fread(hdr, 1, sizeof(hdr), f) != sizeof(hdr))
        return strata_err_set(err, STRATA_E_FORMAT,
                              "'%s': truncated embedding payload (header is %d bytes)", name,
                              STRATA_EMBD_HEADER_SIZE);
    if (memcmp(hdr, STRATA_EMBD_MAGIC, 8) != 0)
        return strata_err_set(err, STRATA_E_FORMAT,
                              "'%s' is not an embedding payload (bad magic)", name);
    h->version = get_u32le(hdr + 8);
    h->n_tokens = get_u32le(hdr + 12);
    h->n_embd = get_u32le(hdr + 16);
    h->grid_t = get_u32le(hdr + 20);
    h->grid_h = get_u32le(hdr + 24);
    h->grid_w = get_u32le(hdr + 28);
    h->flags = get_u32le(hdr + 32);
    if (h->version != 1)
        return strata_err_set(err, STRATA_E_FORMAT, "'%s': payload version %u is not supported",
                              name, h->version);
    if (h->n_tokens == 0 || h->n_tokens > (1u << 20) || h->n_embd == 0 || h->n_embd > (1u << 16))
        return strata_err_set(err, STRATA_E_LIMIT, "'%s': payload of %u tokens x %u dims is "
                              "out of range", name, h->n_tokens, h->n_embd);
    size_t n = (size_t)h->n_tokens * h->n_embd;
    float *r = malloc(n * sizeof(float));
    if (!r)
        return strata_err_set(err, STRATA_E_NOMEM, "no memory for %zu floats", n);
    if (fread(r, sizeof(float), n, f) != n) {
        free(r);
        return strata_err_set(err, STRATA_E_FORMAT,
                              "'%s': truncated embedding payload (expected %u x %u floats)", name,
                              h->n_tokens, h->n_embd);
    }
    *rows = r;
    return 0;
}
