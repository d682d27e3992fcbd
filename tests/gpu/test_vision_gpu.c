/* test_vision_gpu.c - the vision encoder on the GPU against the CPU encoder (make
 * check-gpu), with the tinyvl Qwen2.5-VL projector of the fixtures: the reference
 * patches of the astronaut image, the PNG through Strata's own preprocessing, a
 * non-square image of another size (partial attention windows), and a larger image
 * (more keys than one attention chunk).  Each: equal token count and grid, cosine
 * similarity >= 0.9999 per row.  Also: the GPU result is the same on a second run,
 * errors (a backend not in this build, a device that does not exist, a bad grid) are
 * reported and leave the encoder usable, and the time per image on the GPU and the
 * CPU (median of 5 runs after a warm-up) is printed.  A synthetic qwen2vl projector
 * (LayerNorm with biases, fc1 / QuickGELU / fc2, head dim 80, widths that are not
 * multiples of 64, BF16 and F32 weights) covers the paths the fixture does not.
 * The backend is $STRATA_BACKEND (default cuda). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "ggml_types.h"
#include "gguf.h"
#include "gguf_write.h"
#include "image.h"
#include "pool.h"
#include "tap.h"
#include "vision.h"

#define MIN_PIXELS 3136
#define MAX_PIXELS 200704 /* the reference processor's budget: 256 tokens */

static const char *backend(void)
{
    const char *b = getenv("STRATA_BACKEND");
    return b && *b ? b : "cuda";
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static double min_row_cosine(const float *a, const float *b, int rows, int dim)
{
    double worst = 1;
    for (int r = 0; r < rows; r++) {
        double d = 0, na = 0, nb = 0;
        for (int i = 0; i < dim; i++) {
            d += (double)a[(size_t)r * dim + i] * b[(size_t)r * dim + i];
            na += (double)a[(size_t)r * dim + i] * a[(size_t)r * dim + i];
            nb += (double)b[(size_t)r * dim + i] * b[(size_t)r * dim + i];
        }
        double c = d / sqrt(na * nb + 1e-30);
        if (!(c >= worst)) /* a NaN row counts as the worst */
            worst = isnan(c) ? -2 : c;
    }
    return worst;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median ms of 5 encodes of img after one warm-up; -1 on error. */
static double time_image(struct strata_vision *v, struct strata_pool *pool,
                         const struct strata_image *img, int64_t max_pixels)
{
    double t[5];
    for (int i = -1; i < 5; i++) {
        struct strata_err err = {0};
        float *out = NULL;
        int n = 0;
        double t0 = now_ms();
        int rc = strata_vision_encode_image(v, pool, img, MIN_PIXELS, max_pixels, &out, &n, NULL,
                                            NULL, &err);
        double dt = now_ms() - t0;
        free(out);
        if (rc) {
            diag("timing run failed: %s", err.msg);
            return -1;
        }
        if (i >= 0)
            t[i] = dt;
    }
    qsort(t, 5, sizeof(t[0]), cmp_double);
    return t[2];
}

/* ---- a synthetic qwen2vl projector, in memory ---- */

#define SY_E 160 /* n_embd: 2 heads of 80 */
#define SY_F 200
#define SY_OUT 96
#define SY_P 14

struct synth {
    void *bufs[128];
    int n_bufs;
    uint32_t rng;
};

static float frand(struct synth *s)
{
    s->rng = s->rng * 1664525u + 1013904223u;
    return (float)(s->rng >> 8) / 16777216.0f * 2.0f - 1.0f;
}

/* n floats offset + scale * U(-1, 1), owned by s. */
static float *rnd(struct synth *s, size_t n, float scale, float offset)
{
    float *p = malloc(sizeof(float) * n);
    if (!p || s->n_bufs == 128) {
        free(p);
        return NULL;
    }
    s->bufs[s->n_bufs++] = p;
    for (size_t i = 0; i < n; i++)
        p[i] = offset + scale * frand(s);
    return p;
}

static int add_t(struct strata_gguf_writer *w, struct synth *s, const char *name, int bf16,
                 uint32_t n_dims, uint64_t ne0, uint64_t ne1, uint64_t ne2, uint64_t ne3,
                 float scale, float offset, struct strata_err *err)
{
    uint64_t ne[4] = {ne0, ne1, ne2, ne3};
    size_t n = (size_t)(ne0 * ne1 * ne2 * ne3);
    float *f = rnd(s, n, scale, offset);
    if (!f)
        return STRATA_E_NOMEM;
    if (!bf16)
        return strata_gguf_writer_add_tensor(w, name, STRATA_TYPE_F32, n_dims, ne, f, err);
    uint16_t *h = (uint16_t *)f; /* in place: bf16 is the top half of each float */
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &f[i], 4);
        h[i] = (uint16_t)(u >> 16);
    }
    return strata_gguf_writer_add_tensor(w, name, STRATA_TYPE_BF16, n_dims, ne, h, err);
}

static int synth_qwen2vl(struct synth *s, void **buf, size_t *size, struct strata_err *err)
{
    struct strata_gguf_writer *w = NULL;
    const float mean[3] = {0.5f, 0.5f, 0.5f}, std[3] = {0.25f, 0.25f, 0.25f};
    const int ME = 4 * SY_E;
    int rc = strata_gguf_writer_create(&w, err);
    rc = rc ? rc : strata_gguf_writer_add_str(w, "general.architecture", "clip", err);
    rc = rc ? rc : strata_gguf_writer_add_str(w, "clip.projector_type", "qwen2vl_merger", err);
    rc = rc ? rc : strata_gguf_writer_add_u32(w, "clip.vision.patch_size", SY_P, err);
    rc = rc ? rc : strata_gguf_writer_add_u32(w, "clip.vision.embedding_length", SY_E, err);
    rc = rc ? rc : strata_gguf_writer_add_u32(w, "clip.vision.feed_forward_length", SY_F, err);
    rc = rc ? rc : strata_gguf_writer_add_u32(w, "clip.vision.block_count", 2, err);
    rc = rc ? rc : strata_gguf_writer_add_u32(w, "clip.vision.attention.head_count", 2, err);
    rc = rc ? rc : strata_gguf_writer_add_u32(w, "clip.vision.projection_dim", SY_OUT, err);
    rc = rc ? rc : strata_gguf_writer_add_f32(w, "clip.vision.attention.layer_norm_epsilon",
                                              1e-6f, err);
    rc = rc ? rc : strata_gguf_writer_add_arr(w, "clip.vision.image_mean", STRATA_GGUF_FLOAT32,
                                              mean, 3, err);
    rc = rc ? rc : strata_gguf_writer_add_arr(w, "clip.vision.image_std", STRATA_GGUF_FLOAT32,
                                              std, 3, err);
    float kp = sqrtf(3.0f / (6 * SY_P * SY_P)), ke = sqrtf(3.0f / SY_E),
          kf = sqrtf(3.0f / SY_F), km = sqrtf(3.0f / ME);
    rc = rc ? rc : add_t(w, s, "v.patch_embd.weight", 0, 4, SY_P, SY_P, 3, SY_E, kp, 0, err);
    rc = rc ? rc : add_t(w, s, "v.patch_embd.weight.1", 0, 4, SY_P, SY_P, 3, SY_E, kp, 0, err);
    rc = rc ? rc : add_t(w, s, "v.patch_embd.bias", 0, 1, SY_E, 1, 1, 1, 0.1f, 0, err);
    for (int l = 0; l < 2 && rc == 0; l++) {
        char n[64];
#define T(name) (snprintf(n, sizeof(n), "v.blk.%d.%s", l, name), n)
        rc = rc ? rc : add_t(w, s, T("ln1.weight"), 0, 1, SY_E, 1, 1, 1, 0.2f, 1.0f, err);
        rc = rc ? rc : add_t(w, s, T("ln1.bias"), 0, 1, SY_E, 1, 1, 1, 0.1f, 0, err);
        rc = rc ? rc : add_t(w, s, T("ln2.weight"), 0, 1, SY_E, 1, 1, 1, 0.2f, 1.0f, err);
        rc = rc ? rc : add_t(w, s, T("ln2.bias"), 0, 1, SY_E, 1, 1, 1, 0.1f, 0, err);
        rc = rc ? rc : add_t(w, s, T("attn_q.weight"), 1, 2, SY_E, SY_E, 1, 1, ke, 0, err);
        rc = rc ? rc : add_t(w, s, T("attn_q.bias"), 0, 1, SY_E, 1, 1, 1, 0.1f, 0, err);
        rc = rc ? rc : add_t(w, s, T("attn_k.weight"), 0, 2, SY_E, SY_E, 1, 1, ke, 0, err);
        rc = rc ? rc : add_t(w, s, T("attn_k.bias"), 0, 1, SY_E, 1, 1, 1, 0.1f, 0, err);
        rc = rc ? rc : add_t(w, s, T("attn_v.weight"), 0, 2, SY_E, SY_E, 1, 1, ke, 0, err);
        rc = rc ? rc : add_t(w, s, T("attn_v.bias"), 0, 1, SY_E, 1, 1, 1, 0.1f, 0, err);
        rc = rc ? rc : add_t(w, s, T("attn_out.weight"), 0, 2, SY_E, SY_E, 1, 1, ke, 0, err);
        rc = rc ? rc : add_t(w, s, T("attn_out.bias"), 0, 1, SY_E, 1, 1, 1, 0.1f, 0, err);
        rc = rc ? rc : add_t(w, s, T("ffn_up.weight"), 0, 2, SY_E, SY_F, 1, 1, ke, 0, err);
        rc = rc ? rc : add_t(w, s, T("ffn_up.bias"), 0, 1, SY_F, 1, 1, 1, 0.1f, 0, err);
        rc = rc ? rc : add_t(w, s, T("ffn_down.weight"), 0, 2, SY_F, SY_E, 1, 1, kf, 0, err);
        rc = rc ? rc : add_t(w, s, T("ffn_down.bias"), 0, 1, SY_E, 1, 1, 1, 0.1f, 0, err);
#undef T
    }
    rc = rc ? rc : add_t(w, s, "v.post_ln.weight", 0, 1, SY_E, 1, 1, 1, 0.2f, 1.0f, err);
    rc = rc ? rc : add_t(w, s, "v.post_ln.bias", 0, 1, SY_E, 1, 1, 1, 0.1f, 0, err);
    rc = rc ? rc : add_t(w, s, "mm.0.weight", 0, 2, ME, ME, 1, 1, km, 0, err);
    rc = rc ? rc : add_t(w, s, "mm.0.bias", 0, 1, ME, 1, 1, 1, 0.1f, 0, err);
    rc = rc ? rc : add_t(w, s, "mm.2.weight", 0, 2, ME, SY_OUT, 1, 1, km, 0, err);
    rc = rc ? rc : add_t(w, s, "mm.2.bias", 0, 1, SY_OUT, 1, 1, 1, 0.1f, 0, err);
    rc = rc ? rc : strata_gguf_writer_write_mem(w, buf, size, err);
    strata_gguf_writer_free(w);
    return rc;
}

static void synth_free(struct synth *s)
{
    for (int i = 0; i < s->n_bufs; i++)
        free(s->bufs[i]);
    s->n_bufs = 0;
}

/* The synthetic qwen2vl projector on a 10 x 14 patch grid: cpu against gpu. */
static void synthetic_qwen2vl(struct strata_pool *pool)
{
    struct synth s = {.rng = 20261130u};
    struct strata_err err = {0}, eg = {0};
    struct strata_gguf *g = NULL;
    struct strata_vision *vc = NULL, *vg = NULL;
    void *buf = NULL;
    size_t size = 0;
    float *pix = NULL, *oc = NULL, *og = NULL;
    const int gh = 10, gw = 14, kdim = 6 * SY_P * SY_P;
    int rc = synth_qwen2vl(&s, &buf, &size, &err);
    if (rc == 0)
        rc = strata_gguf_open_mem(&g, buf, size, "synthetic-qwen2vl.gguf", &err);
    if (rc == 0)
        rc = strata_vision_load(&vc, g, &err);
    if (rc == 0)
        rc = strata_vision_load(&vg, g, &err);
    if (!ok(rc == 0, "synthetic qwen2vl projector: %s", rc ? err.msg : "ok"))
        goto out;
    const struct strata_vision_hparams *hp = strata_vision_hparams(vc);
    ok(hp->projector == STRATA_VISION_QWEN2VL && hp->n_embd == SY_E && hp->n_wa_pattern == 0,
       "synthetic: qwen2vl, n_embd %d, head dim %d, all blocks full attention", hp->n_embd,
       hp->n_embd / hp->n_head);
    rc = strata_vision_set_backend(vg, backend(), 0, &err);
    if (!ok(rc == 0, "synthetic: backend %s: %s", backend(), rc ? err.msg : "ok"))
        goto out;
    pix = rnd(&s, (size_t)gh * gw * kdim, 2.0f, 0.0f);
    int nc = 0, ng = 0;
    int rcc = pix ? strata_vision_encode(vc, pool, pix, gh, gw, &oc, &nc, &err) : STRATA_E_NOMEM;
    int rcg = pix ? strata_vision_encode(vg, pool, pix, gh, gw, &og, &ng, &eg) : STRATA_E_NOMEM;
    if (!ok(rcc == 0 && rcg == 0 && nc == gh * gw / 4 && ng == nc,
            "synthetic: %d tokens on the cpu, %d on the gpu (expected %d)%s%s%s%s", nc, ng,
            gh * gw / 4, rcc ? "; cpu: " : "", rcc ? err.msg : "", rcg ? "; gpu: " : "",
            rcg ? eg.msg : ""))
        goto out;
    double cs = min_row_cosine(oc, og, nc, SY_OUT);
    ok(cs >= 0.9999, "synthetic qwen2vl: gpu vs cpu min row cosine %.7f >= 0.9999", cs);
out:
    free(oc);
    free(og);
    strata_vision_free(vg);
    strata_vision_free(vc);
    strata_gguf_close(g);
    free(buf);
    synth_free(&s);
}

/* Median ms of 5 encodes of ready patches (the encoder alone) after one warm-up; -1 on
 * error. */
static double time_patches(struct strata_vision *v, struct strata_pool *pool, const float *pix,
                           int gh, int gw)
{
    double t[5];
    for (int i = -1; i < 5; i++) {
        struct strata_err err = {0};
        float *out = NULL;
        int n = 0;
        double t0 = now_ms();
        int rc = strata_vision_encode(v, pool, pix, gh, gw, &out, &n, &err);
        double dt = now_ms() - t0;
        free(out);
        if (rc) {
            diag("timing run failed: %s", err.msg);
            return -1;
        }
        if (i >= 0)
            t[i] = dt;
    }
    qsort(t, 5, sizeof(t[0]), cmp_double);
    return t[2];
}

/* Encode img on both encoders and compare. */
static void compare_image(struct strata_vision *vc, struct strata_vision *vg,
                          struct strata_pool *pool, const struct strata_image *img,
                          const char *name, int64_t max_pixels, int *tokens_out, int *gh_out,
                          int *gw_out)
{
    struct strata_err ec = {0}, eg = {0};
    float *oc = NULL, *og = NULL;
    int nc = 0, ng = 0, ghc = 0, gwc = 0, ghg = 0, gwg = 0;
    int rcc = strata_vision_encode_image(vc, pool, img, MIN_PIXELS, max_pixels, &oc, &nc, &ghc,
                                         &gwc, &ec);
    int rcg = strata_vision_encode_image(vg, pool, img, MIN_PIXELS, max_pixels, &og, &ng, &ghg,
                                         &gwg, &eg);
    ok(rcc == 0 && rcg == 0, "%s (%dx%d): encoded on cpu and %s%s%s%s%s", name, img->w, img->h,
       strata_vision_backend(vg), rcc ? "; cpu: " : "", rcc ? ec.msg : "",
       rcg ? "; gpu: " : "", rcg ? eg.msg : "");
    if (rcc == 0 && rcg == 0) {
        ok(nc == ng && ghc == ghg && gwc == gwg && nc == ghc * gwc,
           "%s: %d tokens, grid %dx%d on the cpu; %d tokens, grid %dx%d on the gpu", name, nc,
           ghc, gwc, ng, ghg, gwg);
        int dim = strata_vision_hparams(vc)->n_out;
        double cs = nc == ng ? min_row_cosine(oc, og, nc, dim) : 0;
        ok(cs >= 0.9999, "%s: gpu vs cpu min row cosine %.7f >= 0.9999", name, cs);
    }
    if (tokens_out)
        *tokens_out = ng;
    if (gh_out)
        *gh_out = ghg;
    if (gw_out)
        *gw_out = gwg;
    free(oc);
    free(og);
}

int main(void)
{
    char path[1024];
    const char *fx = tap_fixtures();
    struct strata_err err = {0};
    struct strata_gguf *g = NULL;
    struct strata_vision *vc = NULL, *vg = NULL, *v3 = NULL;
    struct strata_pool *pool = NULL;
    struct strata_image img = {0}, odd = {0};
    float *pv = NULL, *embd = NULL, *oc = NULL, *og = NULL, *og2 = NULL;
    cJSON *ref = NULL;

    snprintf(path, sizeof(path), "%s/ref/tinyvl-hf-reference.json", fx);
    size_t n_json = 0;
    char *json = tap_slurp(path, &n_json);
    ref = json ? cJSON_ParseWithLength(json, n_json) : NULL;
    free(json);
    const cJSON *astro = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(ref, "images"), "astronaut");
    const cJSON *thw = cJSON_GetObjectItemCaseSensitive(astro, "grid_thw");
    const cJSON *jt = cJSON_GetObjectItemCaseSensitive(astro, "n_tokens");
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(astro, "dim");
    int ref_tokens = cJSON_IsNumber(jt) ? jt->valueint : 0;
    int ref_dim = cJSON_IsNumber(jd) ? jd->valueint : 0;
    int ref_gh = cJSON_GetArraySize(thw) == 3 ? cJSON_GetArrayItem(thw, 1)->valueint : 0;
    int ref_gw = cJSON_GetArraySize(thw) == 3 ? cJSON_GetArrayItem(thw, 2)->valueint : 0;
    if (!ok(ref_tokens > 0 && ref_dim > 0 && ref_gh > 0 && ref_gw > 0,
            "read %s (%d tokens of %d, patch grid %dx%d)", path, ref_tokens, ref_dim, ref_gh,
            ref_gw))
        goto out;

    snprintf(path, sizeof(path), "%s/models/mmproj-tinyvl-F16.gguf", fx);
    int rc = strata_gguf_open(&g, path, &err);
    if (rc == 0)
        rc = strata_vision_load(&vc, g, &err);
    if (rc == 0)
        rc = strata_vision_load(&vg, g, &err);
    if (rc == 0)
        rc = strata_pool_create(&pool, 0, &err);
    if (!ok(rc == 0, "load %s: %s", path, rc ? err.msg : "ok"))
        goto out;
    rc = strata_vision_set_backend(vg, backend(), 0, &err);
    if (!ok(rc == 0 && strcmp(strata_vision_backend(vg), backend()) == 0,
            "vision encoder on backend %s, device 0: %s", backend(), rc ? err.msg : "ok"))
        goto out;
    const struct strata_vision_hparams *hp = strata_vision_hparams(vc);

    /* 1. the reference patches */
    size_t n_pv = 0, n_embd = 0;
    snprintf(path, sizeof(path), "%s/ref/tinyvl-astronaut-pixel_values.f32", fx);
    pv = tap_slurp(path, &n_pv);
    snprintf(path, sizeof(path), "%s/ref/tinyvl-astronaut-embd.f32", fx);
    embd = tap_slurp(path, &n_embd);
    size_t kdim = (size_t)3 * hp->temporal * hp->patch_size * hp->patch_size;
    if (!ok(pv && embd && n_pv == (size_t)ref_gh * ref_gw * kdim * 4 &&
                n_embd == (size_t)ref_tokens * ref_dim * 4,
            "reference patches and embeddings read"))
        goto out;
    int nc = 0, ng = 0;
    struct strata_err ec = {0}, eg = {0};
    int rcc = strata_vision_encode(vc, pool, pv, ref_gh, ref_gw, &oc, &nc, &ec);
    int rcg = strata_vision_encode(vg, pool, pv, ref_gh, ref_gw, &og, &ng, &eg);
    if (!ok(rcc == 0 && rcg == 0 && nc == ref_tokens && ng == ref_tokens,
            "reference patches: %d tokens on the cpu, %d on the gpu (expected %d)%s%s%s%s", nc,
            ng, ref_tokens, rcc ? "; cpu: " : "", rcc ? ec.msg : "", rcg ? "; gpu: " : "",
            rcg ? eg.msg : ""))
        goto out;
    double cs = min_row_cosine(oc, og, ref_tokens, ref_dim);
    ok(cs >= 0.9999, "reference patches: gpu vs cpu min row cosine %.7f >= 0.9999", cs);
    cs = min_row_cosine(og, embd, ref_tokens, ref_dim);
    ok(cs >= 0.999, "reference patches: gpu vs HF transformers min row cosine %.6f >= 0.999", cs);
    rcg = strata_vision_encode(vg, pool, pv, ref_gh, ref_gw, &og2, &ng, &eg);
    ok(rcg == 0 && ng == ref_tokens &&
           memcmp(og, og2, sizeof(float) * (size_t)ref_tokens * ref_dim) == 0,
       "reference patches: a second gpu run gives the same bits%s%s", rcg ? ": " : "",
       rcg ? eg.msg : "");

    /* 2. the PNG through the preprocessing */
    snprintf(path, sizeof(path), "%s/images/img-astronaut.png", fx);
    rc = strata_image_load(&img, path, &err);
    if (!ok(rc == 0, "decode %s: %s", path, rc ? err.msg : "ok"))
        goto out;
    int tokens = 0, gh = 0, gw = 0;
    compare_image(vc, vg, pool, &img, "astronaut PNG", MAX_PIXELS, &tokens, &gh, &gw);
    ok(tokens == ref_tokens && gh * hp->merge == ref_gh && gw * hp->merge == ref_gw,
       "astronaut PNG: %d tokens, token grid %dx%d as the reference", tokens, gh, gw);

    /* 3. non-square, another size: windows cut by the image border */
    rc = strata_image_resize(&img, 333, 190, &odd, &err);
    if (ok(rc == 0, "resize to 333x190: %s", rc ? err.msg : "ok")) {
        compare_image(vc, vg, pool, &odd, "333x190 image", MAX_PIXELS, &tokens, &gh, &gw);
        ok(gh > 0 && gw > gh && tokens == gh * gw, "333x190 image: wide token grid %dx%d", gh,
           gw);
    }

    /* 4. a larger budget: 1296 patches, more keys than one attention chunk (1024) */
    compare_image(vc, vg, pool, &img, "astronaut PNG, 1003520-pixel budget", 1003520, &tokens,
                  &gh, &gw);
    ok(tokens * hp->merge * hp->merge > 1024, "larger image: %d patches", tokens * 4);

    /* 5. errors */
    free(og2);
    og2 = NULL;
    rc = strata_vision_encode(vg, pool, pv, ref_gh - 1, ref_gw, &og2, &ng, &eg);
    ok(rc == STRATA_E_INVALID && strstr(eg.msg, "invalid patch grid"), "odd grid refused: %s",
       eg.msg);
    rc = strata_vision_load(&v3, g, &err);
    if (rc == 0) {
        const char *other = strcmp(backend(), "hip") == 0 ? "cuda" : "hip";
        rc = strata_vision_set_backend(v3, other, 0, &err);
        ok(rc == STRATA_E_UNSUPPORTED && strstr(err.msg, "is not in this build") &&
               strcmp(strata_vision_backend(v3), "cpu") == 0,
           "backend %s in a %s build: %s", other, backend(), err.msg);
        rc = strata_vision_set_backend(v3, backend(), 99, &err);
        ok(rc == STRATA_E_INVALID && strstr(err.msg, "device 99 does not exist") &&
               strcmp(strata_vision_backend(v3), "cpu") == 0,
           "device 99: %s", err.msg);
    }
    free(og2);
    og2 = NULL;
    rcg = strata_vision_encode(vg, pool, pv, ref_gh, ref_gw, &og2, &ng, &eg);
    ok(rcg == 0 && ng == ref_tokens &&
           memcmp(og, og2, sizeof(float) * (size_t)ref_tokens * ref_dim) == 0,
       "after the errors the gpu encoder gives the same bits%s%s", rcg ? ": " : "",
       rcg ? eg.msg : "");

    /* 6. the paths the fixture does not take */
    synthetic_qwen2vl(pool);

    /* 7. time per image */
    double tg = time_image(vg, pool, &img, MAX_PIXELS), tc = time_image(vc, pool, &img, MAX_PIXELS);
    diag("time per image (astronaut 512x512 -> 448x448, 1024 patches, 256 tokens, with "
         "preprocessing), median of 5: %s %.2f ms, cpu (%d threads) %.2f ms",
         backend(), tg, strata_pool_n_threads(pool), tc);
    double tg2 = time_image(vg, pool, &img, 1003520), tc2 = time_image(vc, pool, &img, 1003520);
    diag("time per image (astronaut 512x512 -> 504x504, 1296 patches, 324 tokens), median of 5: "
         "%s %.2f ms, cpu %.2f ms",
         backend(), tg2, tc2);
    double te = time_patches(vg, pool, pv, ref_gh, ref_gw);
    double tce = time_patches(vc, pool, pv, ref_gh, ref_gw);
    diag("time per image, encoder only (reference patches, 1024 patches, 256 tokens), median "
         "of 5: %s %.2f ms, cpu %.2f ms",
         backend(), te, tce);
    ok(tg > 0 && tc > 0 && tg2 > 0 && tc2 > 0 && te > 0 && tce > 0, "timed runs succeed");
out:
    free(pv);
    free(embd);
    free(oc);
    free(og);
    free(og2);
    strata_image_free(&img);
    strata_image_free(&odd);
    strata_vision_free(v3);
    strata_vision_free(vg);
    strata_vision_free(vc);
    strata_pool_free(pool);
    strata_gguf_close(g);
    cJSON_Delete(ref);
    return tap_done();
}
