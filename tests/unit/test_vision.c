/* test_vision.c - image decoding and preprocessing, and the Qwen2.5-VL
 * vision encoder, against the Hugging Face reference in the fixtures. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include <stb/stb_image_write.h>

#include "image.h"
#include "tap.h"
#include "vision.h"

static double min_row_cosine(const float *a, const float *b, int rows, int dim)
{
    double worst = 1;
    for (int r = 0; r < rows; r++) {
        double d = 0, na = 0, nb = 0;
        for (int i = 0; i < dim; i++) {
            d += (double)a[r * dim + i] * b[r * dim + i];
            na += (double)a[r * dim + i] * a[r * dim + i];
            nb += (double)b[r * dim + i] * b[r * dim + i];
        }
        double c = d / sqrt(na * nb + 1e-30);
        if (c < worst)
            worst = c;
    }
    return worst;
}

struct membuf {
    unsigned char *p;
    size_t n, cap;
};

static void mem_write(void *ctx, void *data, int size)
{
    struct membuf *m = ctx;
    if (m->n + (size_t)size > m->cap) {
        m->cap = (m->n + (size_t)size) * 2;
        m->p = realloc(m->p, m->cap);
    }
    memcpy(m->p + m->n, data, (size_t)size);
    m->n += (size_t)size;
}

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void png_chunk(struct membuf *m, const char *type, const unsigned char *data, uint32_t n)
{
    unsigned char hdr[8];
    put_be32(hdr, n);
    memcpy(hdr + 4, type, 4);
    mem_write(m, hdr, 8);
    if (n)
        mem_write(m, (void *)data, (int)n);
    uLong crc = crc32(0, (const Bytef *)type, 4);
    crc = crc32(crc, data, n);
    unsigned char c[4];
    put_be32(c, (uint32_t)crc);
    mem_write(m, c, 4);
}

/* A 16-bit grayscale PNG (stb_image_write only writes 8-bit). */
static struct membuf png_gray16(int w, int h)
{
    struct membuf m = {0};
    mem_write(&m, "\x89PNG\r\n\x1a\n", 8);
    unsigned char ihdr[13];
    put_be32(ihdr, (uint32_t)w);
    put_be32(ihdr + 4, (uint32_t)h);
    ihdr[8] = 16; /* bit depth */
    ihdr[9] = 0;  /* grayscale */
    ihdr[10] = ihdr[11] = ihdr[12] = 0;
    png_chunk(&m, "IHDR", ihdr, 13);
    size_t raw_n = (size_t)h * (1 + 2 * (size_t)w);
    unsigned char *raw = calloc(1, raw_n);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint16_t v = (uint16_t)(x * 65535 / (w - 1));
            raw[y * (1 + 2 * w) + 1 + 2 * x] = (unsigned char)(v >> 8);
            raw[y * (1 + 2 * w) + 2 + 2 * x] = (unsigned char)v;
        }
    uLongf zn = compressBound(raw_n);
    unsigned char *z = malloc(zn);
    compress(z, &zn, raw, raw_n);
    png_chunk(&m, "IDAT", z, (uint32_t)zn);
    png_chunk(&m, "IEND", NULL, 0);
    free(raw);
    free(z);
    return m;
}

static struct membuf png_rgba(int w, int h, int alpha)
{
    struct membuf m = {0};
    unsigned char *px = malloc((size_t)w * h * 4);
    for (int i = 0; i < w * h; i++) {
        px[4 * i] = (unsigned char)(i * 7);
        px[4 * i + 1] = (unsigned char)(i * 13);
        px[4 * i + 2] = (unsigned char)(i * 29);
        px[4 * i + 3] = (unsigned char)alpha;
    }
    stbi_write_png_to_func(mem_write, &m, w, h, 4, px, w * 4);
    free(px);
    return m;
}

/* Decode + encode; returns the error code.  tokens/grid checked by caller. */
static int embed_buffer(struct strata_vision *v, const void *buf, size_t n, const char *name,
                        int *tokens, int *gh, int *gw, float **out, struct strata_err *err)
{
    struct strata_image img;
    int rc = strata_image_load_mem(&img, buf, n, name, err);
    if (rc)
        return rc;
    rc = strata_vision_encode_image(v, NULL, &img, 3136, 200704, out, tokens, gh, gw, err);
    strata_image_free(&img);
    return rc;
}

int main(void)
{
    char path[1024];
    const char *fx = tap_fixtures();
    struct strata_err err = {0};

    /* the reference's metadata */
    snprintf(path, sizeof(path), "%s/ref/tinyvl-hf-reference.json", fx);
    size_t n_json = 0;
    char *json = tap_slurp(path, &n_json);
    cJSON *ref = json ? cJSON_ParseWithLength(json, n_json) : NULL;
    free(json);
    const cJSON *astro = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(ref, "images"), "astronaut");
    const cJSON *thw = cJSON_GetObjectItemCaseSensitive(astro, "grid_thw");
    int ref_tokens = cJSON_GetObjectItemCaseSensitive(astro, "n_tokens")->valueint;
    int ref_dim = cJSON_GetObjectItemCaseSensitive(astro, "dim")->valueint;
    int ref_gh = cJSON_GetArrayItem(thw, 1)->valueint, ref_gw = cJSON_GetArrayItem(thw, 2)->valueint;
    const cJSON *pv_shape = cJSON_GetObjectItemCaseSensitive(astro, "pixel_values_shape");
    int ref_np = cJSON_GetArrayItem(pv_shape, 0)->valueint;
    int ref_pd = cJSON_GetArrayItem(pv_shape, 1)->valueint;
    ok(ref != NULL && ref_tokens > 0, "reference JSON read (%d tokens, grid %dx%d)", ref_tokens,
       ref_gh, ref_gw);

    snprintf(path, sizeof(path), "%s/models/mmproj-tinyvl-F16.gguf", fx);
    struct strata_gguf *g = NULL;
    struct strata_vision *v = NULL;
    int rc = strata_gguf_open(&g, path, &err);
    if (rc == 0)
        rc = strata_vision_load(&v, g, &err);
    if (!ok(rc == 0, "load the qwen2.5vl projector: %s", rc ? err.msg : "ok")) {
        cJSON_Delete(ref);
        strata_gguf_close(g);
        return tap_done();
    }
    const struct strata_vision_hparams *hp = strata_vision_hparams(v);
    ok(hp->projector == STRATA_VISION_QWEN25VL && hp->n_layer == 4 && hp->n_embd == 128 &&
           hp->n_out == ref_dim && hp->n_wa_pattern == 2,
       "hyper-parameters from clip.vision.* (layers %d, n_embd %d, out %d)", hp->n_layer,
       hp->n_embd, hp->n_out);

    size_t n_pv = 0, n_embd = 0;
    snprintf(path, sizeof(path), "%s/ref/tinyvl-astronaut-pixel_values.f32", fx);
    float *pv = tap_slurp(path, &n_pv);
    snprintf(path, sizeof(path), "%s/ref/tinyvl-astronaut-embd.f32", fx);
    float *embd = tap_slurp(path, &n_embd);
    ok(pv && embd && n_pv == (size_t)ref_np * ref_pd * 4 && n_embd == (size_t)ref_tokens * ref_dim * 4,
       "reference tensors read");

    /* 1. the encoder, fed the reference patches */
    struct strata_pool *pool = NULL;
    strata_pool_create(&pool, 2, &err);
    float *out = NULL;
    int tokens = 0;
    rc = strata_vision_encode(v, pool, pv, ref_gh, ref_gw, &out, &tokens,
                              &err);
    ok(rc == 0 && tokens == ref_tokens, "encode reference patches: %d tokens (%s)", tokens,
       rc ? err.msg : "ok");
    double cosr = rc ? 0 : min_row_cosine(out, embd, ref_tokens, ref_dim);
    ok(cosr >= 0.999, "embeddings from reference patches: min row cosine %.6f >= 0.999", cosr);
    free(out);
    out = NULL;

    /* 2. from the PNG through our own preprocessing */
    snprintf(path, sizeof(path), "%s/images/img-astronaut.png", fx);
    struct strata_image img = {0}, sized = {0};
    rc = strata_image_load(&img, path, &err);
    ok(rc == 0 && img.w == 512 && img.h == 512, "decode the PNG (%dx%d)", img.w, img.h);
    int h = 0, w = 0;
    strata_image_smart_resize(img.h, img.w, hp->patch_size * hp->merge, 3136, 200704, &h, &w, &err);
    ok(h == ref_gh * hp->patch_size && w == ref_gw * hp->patch_size,
       "smart_resize 512x512 -> %dx%d", w, h);
    strata_image_resize(&img, w, h, &sized, &err);
    float *patches = NULL;
    int np = 0, gh = 0, gw = 0;
    rc = strata_image_patches(&sized, hp->mean, hp->std, hp->patch_size, hp->merge, hp->temporal,
                              &patches, &np, &gh, &gw, &err);
    ok(rc == 0 && np == ref_np && gh * gw == np, "patches: %d (grid %dx%d)", np, gh, gw);
    double maxd = 0;
    for (size_t i = 0; rc == 0 && i < (size_t)np * ref_pd; i++)
        if (fabs(patches[i] - pv[i]) > maxd)
            maxd = fabs(patches[i] - pv[i]);
    ok(rc == 0 && maxd <= 1e-2, "patches match the reference processor: max abs diff %g", maxd);
    int tgh = 0, tgw = 0;
    rc = strata_vision_encode_image(v, pool, &img, 3136, 200704, &out, &tokens, &tgh, &tgw, &err);
    ok(rc == 0 && tokens == ref_tokens && tgh == ref_gh / hp->merge && tgw == ref_gw / hp->merge,
       "PNG -> %d tokens, token grid %dx%d", tokens, tgh, tgw);
    double cosp = rc ? 0 : min_row_cosine(out, embd, ref_tokens, ref_dim);
    ok(cosp >= 0.99, "embeddings from the PNG: min row cosine %.6f >= 0.99", cosp);
    free(out);
    out = NULL;
    free(patches);
    strata_image_free(&sized);

    /* 3. the payload round trip */
    FILE *tf = tmpfile();
    float rows[6] = {1, 2, 3, 4, 5, 6};
    struct strata_embd_header eh = {1, 2, 3, 1, 1, 2, 0}, back;
    float *rb = NULL;
    rc = strata_embd_write(tf, &eh, rows, &err);
    rewind(tf);
    rc |= strata_embd_read(tf, "tmp", &back, &rb, &err);
    ok(rc == 0 && back.n_tokens == 2 && back.n_embd == 3 && back.grid_w == 2 && rb &&
           memcmp(rb, rows, sizeof(rows)) == 0,
       "payload round trip");
    free(rb);
    rb = NULL;
    fclose(tf);
    tf = tmpfile();
    fwrite("STRATAEB\1\0\0\0", 1, 12, tf);
    rewind(tf);
    rc = strata_embd_read(tf, "tmp", &back, &rb, &err);
    ok(rc == STRATA_E_FORMAT && strstr(err.msg, "truncated") && !rb, "truncated payload: %s",
       err.msg);
    free(rb);
    fclose(tf);

    /* 4. hostile images: each embeds correctly or fails clearly */
    struct {
        const char *name;
        int w, h;
    } sizes[] = {{"1x1", 1, 1}, {"27x27", 27, 27}, {"257x27", 257, 27}};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        struct membuf m = png_rgba(sizes[i].w, sizes[i].h, 255);
        int gh2 = 0, gw2 = 0;
        rc = embed_buffer(v, m.p, m.n, sizes[i].name, &tokens, &gh2, &gw2, &out, &err);
        int finite = 1;
        for (int k = 0; rc == 0 && k < tokens * hp->n_out; k++)
            finite &= isfinite(out[k]);
        ok(rc == 0 && tokens == gh2 * gw2 && tokens * hp->merge * hp->merge * 14 * 14 >= 3136 &&
               finite,
           "%s image: %d tokens (grid %dx%d), scaled up to the minimum", sizes[i].name, tokens,
           gh2, gw2);
        free(out);
        out = NULL;
        free(m.p);
    }
    {
        /* 8000x6000, as an uncompressed BMP built in memory */
        int W = 8000, H = 6000;
        unsigned char *px = malloc((size_t)W * H * 3);
        for (size_t i = 0; i < (size_t)W * H * 3; i++)
            px[i] = (unsigned char)(i * 2654435761u >> 24);
        struct membuf m = {0};
        stbi_write_bmp_to_func(mem_write, &m, W, H, 3, px);
        free(px);
        int gh2 = 0, gw2 = 0;
        rc = embed_buffer(v, m.p, m.n, "8000x6000", &tokens, &gh2, &gw2, &out, &err);
        ok(rc == 0 && (int64_t)tokens * 4 * 14 * 14 <= 200704 && gw2 > gh2,
           "8000x6000 image scaled down to the budget: %d tokens (grid %dx%d) %s", tokens, gh2,
           gw2, rc ? err.msg : "");
        free(out);
        out = NULL;
        free(m.p);
    }
    {
        struct membuf m = png_rgba(64, 64, 0);
        struct strata_image t = {0};
        rc = strata_image_load_mem(&t, m.p, m.n, "transparent", &err);
        int white = rc == 0;
        for (int k = 0; white && k < 64 * 64 * 3; k++)
            white &= t.rgb[k] == 255;
        ok(white, "fully transparent RGBA composites to white");
        strata_image_free(&t);
        rc = embed_buffer(v, m.p, m.n, "transparent", &tokens, NULL, NULL, &out, &err);
        ok(rc == 0 && tokens > 0, "fully transparent image embeds (%d tokens)", tokens);
        free(out);
        out = NULL;
        free(m.p);
    }
    {
        struct membuf m = png_gray16(40, 30);
        struct strata_image t = {0};
        rc = strata_image_load_mem(&t, m.p, m.n, "gray16", &err);
        ok(rc == 0 && t.w == 40 && t.h == 30 && t.rgb[0] == 0 && t.rgb[3 * 39] == 255 &&
               t.rgb[3 * 39 + 1] == 255,
           "16-bit grayscale PNG -> 8-bit RGB (%s)", rc ? err.msg : "ok");
        strata_image_free(&t);
        free(m.p);
    }
    {
        size_t n = 0;
        unsigned char *png = tap_slurp(path, &n);
        struct strata_image t = {0};
        rc = strata_image_load_mem(&t, png, n / 3, "truncated.png", &err);
        ok(rc == STRATA_E_FORMAT && strstr(err.msg, "truncated.png"),
           "truncated PNG refused: %s", err.msg);
        strata_image_free(&t);
        free(png);
        const char text[] = "def f():\n    return 1\n";
        rc = strata_image_load_mem(&t, text, sizeof(text) - 1, "code.py", &err);
        ok(rc == STRATA_E_FORMAT && strstr(err.msg, "'code.py' is not a readable image"),
           "non-image refused: %s", err.msg);
        rc = strata_image_load(&t, "/nonexistent/x.png", &err);
        ok(rc == STRATA_E_IO && strstr(err.msg, "/nonexistent/x.png"), "missing file: %s",
           err.msg);
    }
    int oh, ow;
    rc = strata_image_smart_resize(10, 4000, 28, 3136, 200704, &oh, &ow, &err);
    ok(rc == STRATA_E_INVALID && strstr(err.msg, "aspect ratio"), "aspect ratio 400 refused: %s",
       err.msg);

    strata_image_free(&img);
    strata_pool_free(pool);
    strata_vision_free(v);
    strata_gguf_close(g);
    free(pv);
    free(embd);
    cJSON_Delete(ref);
    return tap_done();
}
