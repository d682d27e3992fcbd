/* synth.c - synthetic models with random weights in real tensor layouts. */
#include "synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_types.h"
#include "gguf_write.h"
#include "quant.h"

struct shape {
    const char *name, *arch;
    uint32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_expert,
        n_expert_used, n_ff_exp, n_ctx;
    float rope_base;
};

/* Hyper-parameters as in the models' config.json / GGUF metadata. */
static const struct shape shapes[] = {
    /* Qwen/Qwen3-30B-A3B */
    {"qwen3-30b-a3b", "qwen3moe", 151936, 2048, 48, 32, 4, 128, 6144, 128, 8, 768, 40960,
     1000000.0f},
    /* Qwen/Qwen3-Coder-30B-A3B-Instruct: the same layout, longer context */
    {"qwen3-coder-30b-a3b", "qwen3moe", 151936, 2048, 48, 32, 4, 128, 6144, 128, 8, 768, 262144,
     10000000.0f},
    /* small shapes for tests */
    {"qwen3-moe-tiny", "qwen3moe", 512, 256, 2, 8, 2, 32, 512, 16, 4, 256, 4096, 1000000.0f},
    {"llama-tiny", "llama", 512, 256, 2, 8, 4, 32, 512, 0, 0, 0, 4096, 10000.0f},
};

const char *const *strata_synth_shapes(void)
{
    static const char *const names[] = {"qwen3-30b-a3b", "qwen3-coder-30b-a3b",
                                        "qwen3-moe-tiny", "llama-tiny", NULL};
    return names;
}

static uint64_t next(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void put_f16(uint8_t *p, float f)
{
    strata_f16 h = strata_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* The values of the random blocks at dst with their f16 scale fields set to (1, 0) and
 * (0, 1): every block type dequantises linearly in its scale fields, value = s0 * X + s1 * Y
 * (Q4_K: d * sc * q - dmin * m, so Y = -m; a one-scale type has no Y).  From up to 16
 * blocks: *r, the s1 / s0 ratio that cancels the mean of X (0 for one-scale types), and
 * *rms, the rms of X + r * Y.  K-quant sub-block scales (6-bit, int8) and unsigned quants
 * make X large (rms ~250 for Q4_K, ~1300 for Q6_K) and, for the min-offset types, mostly
 * positive; calibrating on the real dequantisation gives every type the same magnitude.
 * Returns 0 when the block does not fit the scratch (the caller keeps a fixed scale). */
static int calibrate(uint32_t type, const uint8_t *dst, uint64_t nblk, const int *offs,
                     double *r, double *rms)
{
    uint8_t blk[512];
    float x[256], y[256];
    uint32_t bs = strata_ggml_blck_size(type), bb = strata_ggml_type_size(type);
    if (bs == 0 || bs > 256 || bb > sizeof blk || offs[0] < 0)
        return 0;
    int two = offs[1] >= 0;
    double sx = 0, sy = 0, sxx = 0, sxy = 0, syy = 0, n = 0;
    for (uint64_t b = 0; b < nblk && b < 16; b++) {
        memcpy(blk, dst + b * bb, bb);
        put_f16(blk + offs[0], 1.0f);
        if (two)
            put_f16(blk + offs[1], 0.0f);
        strata_quant_dequant_row(type, blk, x, bs);
        if (two) {
            put_f16(blk + offs[0], 0.0f);
            put_f16(blk + offs[1], 1.0f);
            strata_quant_dequant_row(type, blk, y, bs);
        }
        for (uint32_t i = 0; i < bs; i++) {
            double yi = two ? y[i] : 0;
            sx += x[i];
            sy += yi;
            sxx += (double)x[i] * x[i];
            sxy += x[i] * yi;
            syy += yi * yi;
            n++;
        }
    }
    if (n == 0)
        return 0;
    *r = two && fabs(sy / n) > 1e-9 ? -(sx / n) / (sy / n) : 0;
    double m2 = (sxx + 2 * *r * sxy + *r * *r * syy) / n;
    if (!(m2 > 0) || !isfinite(m2))
        return 0;
    *rms = sqrt(m2);
    return 1;
}

/* n values of type: random blocks whose dequantised values have rms about amp (times a
 * random 0.5-1.5 per block) and mean about 0 (the weights of a layer with fan-in k get
 * amp ~ 1/sqrt(k), so a product keeps the magnitude of its input). */
static void fill(uint32_t type, uint8_t *dst, uint64_t n, float amp, uint64_t *seed)
{
    if (type == STRATA_TYPE_F32 || type == STRATA_TYPE_F16 || type == STRATA_TYPE_BF16) {
        for (uint64_t i = 0; i < n; i++) {
            float f = ((float)(next(seed) >> 40) / 16777216.0f * 2.0f - 1.0f) * amp;
            if (type == STRATA_TYPE_F32)
                memcpy(dst + 4 * i, &f, 4);
            else if (type == STRATA_TYPE_F16)
                put_f16(dst + 2 * i, f);
            else {
                strata_bf16 b = strata_f32_to_bf16(f);
                memcpy(dst + 2 * i, &b, 2);
            }
        }
        return;
    }
    uint64_t bytes = strata_ggml_row_size(type, n), bb = strata_ggml_type_size(type);
    for (uint64_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t r = next(seed);
        memcpy(dst + i, &r, 8);
    }
    for (uint64_t i = bytes & ~7ull; i < bytes; i++)
        dst[i] = (uint8_t)next(seed);
    const int *offs = strata_ggml_f16_scale_offsets(type);
    double ratio = 0, rms = 8;
    if (!calibrate(type, dst, bytes / bb, offs, &ratio, &rms)) {
        ratio = 0;
        rms = 8;
    }
    /* d for the types without an f16 scale field (IQ1_M's is split over 4 fields) */
    float d = amp / 8.0f;
    for (uint64_t b = 0; b < bytes / bb; b++) {
        uint8_t *blk = dst + b * bb;
        double s0 = amp * (0.5 + (double)(next(seed) & 255) / 256.0) / rms;
        if (offs[0] >= 0)
            put_f16(blk + offs[0], (float)s0);
        if (offs[0] >= 0 && offs[1] >= 0)
            put_f16(blk + offs[1], (float)(ratio * s0));
        if (type == STRATA_TYPE_IQ1_M) {
            strata_f16 h = strata_f32_to_f16(d);
            for (int k = 0; k < 4; k++) {
                uint16_t s;
                memcpy(&s, blk + 48 + 2 * k, 2);
                s = (uint16_t)((s & 0x0fff) | (((h >> (4 * k)) & 0xf) << 12));
                memcpy(blk + 48 + 2 * k, &s, 2);
            }
        }
        if (type == STRATA_TYPE_MXFP4)
            blk[0] = 120;
    }
}

struct tensors {
    void **bufs;
    size_t n, cap;
    int dry;        /* 1: only count the bytes (strata_synth_size) */
    uint64_t bytes; /* the tensors' bytes */
};

static int add(struct strata_gguf_writer *w, struct tensors *t, const char *name, uint32_t type,
               uint32_t n_dims, const uint64_t *ne, float amp, uint64_t *seed,
               struct strata_err *err)
{
    uint64_t n = 1;
    for (uint32_t i = 0; i < n_dims; i++)
        n *= ne[i];
    uint64_t bytes = strata_ggml_row_size(type, n);
    if (!bytes)
        return strata_err_set(err, STRATA_E_INVALID, "synthetic tensor '%s': %llu values do not "
                              "fill whole %s blocks", name, (unsigned long long)n,
                              strata_ggml_type_name(type));
    t->bytes += bytes;
    if (t->dry)
        return 0;
    if (t->n == t->cap) {
        size_t nc = t->cap ? 2 * t->cap : 64;
        void **nb = realloc(t->bufs, nc * sizeof(void *));
        if (!nb)
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        t->bufs = nb;
        t->cap = nc;
    }
    uint8_t *d = malloc(bytes);
    if (!d)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory for synthetic tensor '%s' "
                              "(%llu bytes)", name, (unsigned long long)bytes);
    t->bufs[t->n++] = d;
    if (amp > 0)
        fill(type, d, n, amp, seed);
    else {
        /* norms: near 1 */
        float *f = (float *)d;
        for (uint64_t i = 0; i < n; i++)
            f[i] = 0.9f + 0.2f * (float)(next(seed) >> 40) / 16777216.0f;
    }
    return strata_gguf_writer_add_tensor(w, name, type, n_dims, ne, d, err);
}

/* llama.cpp's use_more_bits: layers that get the larger type in the _M mixes. */
static int more_bits(uint32_t i, uint32_t n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* A SentencePiece ("llama") vocabulary of n tokens (n >= 259) that any text goes through:
 * <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF> (byte fallback: a text is read
 * as its UTF-8 bytes), the word boundary "\u2581" (a space), then pieces "\u2581tN"
 * that no text forms.  So strata-generate
 * and strata-serve run a synthetic model end to end, with the shape's real vocabulary
 * size (a row of logits as large as the real model's); the text it writes is
 * meaningless. */
static int add_vocab(struct strata_gguf_writer *w, uint32_t n, struct strata_err *err)
{
    char **tok = calloc(n, sizeof *tok);
    float *score = calloc(n, sizeof *score);
    int32_t *type = calloc(n, sizeof *type);
    char *text = malloc((size_t)n * 16);
    int rc = 0;
    if (!tok || !score || !type || !text) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < n; i++) {
        tok[i] = text + (size_t)i * 16;
        if (i < 3) {
            snprintf(tok[i], 16, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
            type[i] = i == 0 ? 2 : 3; /* unknown, control */
        } else if (i < 259) {
            snprintf(tok[i], 16, "<0x%02X>", i - 3);
            type[i] = 6; /* byte */
        } else if (i == 259) {
            snprintf(tok[i], 16, "\xe2\x96\x81");
            type[i] = 1;
        } else {
            snprintf(tok[i], 16, "\xe2\x96\x81t%u", i);
            type[i] = 1; /* normal */
            score[i] = -(float)i;
        }
    }
    (void)((rc = strata_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama", err)) ||
           (rc = strata_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens",
                                                (const char *const *)tok, n, err)) ||
           (rc = strata_gguf_writer_add_arr(w, "tokenizer.ggml.scores", STRATA_GGUF_FLOAT32,
                                            score, n, err)) ||
           (rc = strata_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", STRATA_GGUF_INT32,
                                            type, n, err)) ||
           (rc = strata_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1, err)) ||
           (rc = strata_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2, err)) ||
           (rc = strata_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0, err)));
out:
    free(tok);
    free(score);
    free(type);
    free(text);
    return rc;
}

static int build(const struct strata_synth_opts *o, struct strata_gguf_writer *w,
                 struct tensors *t, struct strata_err *err)
{
    const struct shape *sh = NULL;
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
        if (o->shape && strcmp(o->shape, shapes[i].name) == 0)
            sh = &shapes[i];
    if (!sh)
        return strata_err_set(err, STRATA_E_INVALID, "unknown synthetic shape '%s'",
                              o->shape ? o->shape : "");
    int mix = o->ftype && strcmp(o->ftype, "Q4_K_M") == 0;
    int ft = mix ? STRATA_TYPE_Q4_K : strata_ggml_type_from_name(o->ftype ? o->ftype : "");
    if (ft < 0 || !strata_quant_supported((uint32_t)ft))
        return strata_err_set(err, STRATA_E_INVALID, "unknown synthetic weight type '%s' "
                              "(Q4_K_M or a block type such as Q4_K)", o->ftype ? o->ftype : "");
    uint32_t L = o->n_layer > 0 ? (uint32_t)o->n_layer : sh->n_layer;
    uint32_t E = sh->n_embd, HD = sh->head_dim, Q = sh->n_head * HD, KV = sh->n_head_kv * HD;
    uint64_t seed = o->seed ? o->seed : 1;
    char key[128];
    int rc;
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, sh->arch), key)
    if ((rc = strata_gguf_writer_add_str(w, "general.architecture", sh->arch, err)) ||
        (rc = strata_gguf_writer_add_str(w, "general.name", sh->name, err)) ||
        (rc = strata_gguf_writer_add_u32(w, KEY("context_length"), sh->n_ctx, err)) ||
        (rc = strata_gguf_writer_add_u32(w, KEY("embedding_length"), E, err)) ||
        (rc = strata_gguf_writer_add_u32(w, KEY("block_count"), L, err)) ||
        (rc = strata_gguf_writer_add_u32(w, KEY("feed_forward_length"), sh->n_ff, err)) ||
        (rc = strata_gguf_writer_add_u32(w, KEY("attention.head_count"), sh->n_head, err)) ||
        (rc = strata_gguf_writer_add_u32(w, KEY("attention.head_count_kv"), sh->n_head_kv, err)) ||
        (rc = strata_gguf_writer_add_u32(w, KEY("attention.key_length"), HD, err)) ||
        (rc = strata_gguf_writer_add_u32(w, KEY("attention.value_length"), HD, err)) ||
        (rc = strata_gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f,
                                         err)) ||
        (rc = strata_gguf_writer_add_f32(w, KEY("rope.freq_base"), sh->rope_base, err)))
        return rc;
    if (sh->n_expert &&
        ((rc = strata_gguf_writer_add_u32(w, KEY("expert_count"), sh->n_expert, err)) ||
         (rc = strata_gguf_writer_add_u32(w, KEY("expert_used_count"), sh->n_expert_used, err)) ||
         (rc = strata_gguf_writer_add_u32(w, KEY("expert_feed_forward_length"), sh->n_ff_exp,
                                          err))))
        return rc;
#undef KEY
    if ((rc = add_vocab(w, sh->n_vocab, err)))
        return rc;
    uint32_t big = mix ? STRATA_TYPE_Q6_K : (uint32_t)ft, t4 = (uint32_t)ft;
    float aE = 1.0f / 45.0f; /* ~1/sqrt(n_embd) for 2048 */
    if ((rc = add(w, t, "token_embd.weight", t4, 2, (uint64_t[]){E, sh->n_vocab}, 1.0f, &seed,
                  err)))
        return rc;
    for (uint32_t il = 0; il < L; il++) {
        char n[96];
        uint32_t tv = mix && more_bits(il, L) ? big : t4;
#define NAME(s) (snprintf(n, sizeof n, "blk.%u." s, il), n)
        if ((rc = add(w, t, NAME("attn_norm.weight"), STRATA_TYPE_F32, 1, (uint64_t[]){E}, 0,
                      &seed, err)) ||
            (rc = add(w, t, NAME("attn_q.weight"), t4, 2, (uint64_t[]){E, Q}, aE, &seed, err)) ||
            (rc = add(w, t, NAME("attn_k.weight"), t4, 2, (uint64_t[]){E, KV}, aE, &seed, err)) ||
            (rc = add(w, t, NAME("attn_v.weight"), tv, 2, (uint64_t[]){E, KV}, aE, &seed, err)) ||
            (rc = add(w, t, NAME("attn_output.weight"), t4, 2, (uint64_t[]){Q, E}, aE, &seed,
                      err)) ||
            (rc = add(w, t, NAME("ffn_norm.weight"), STRATA_TYPE_F32, 1, (uint64_t[]){E}, 0,
                      &seed, err)))
            return rc;
        if (strcmp(sh->arch, "qwen3moe") == 0 &&
            ((rc = add(w, t, NAME("attn_q_norm.weight"), STRATA_TYPE_F32, 1, (uint64_t[]){HD}, 0,
                       &seed, err)) ||
             (rc = add(w, t, NAME("attn_k_norm.weight"), STRATA_TYPE_F32, 1, (uint64_t[]){HD}, 0,
                       &seed, err))))
            return rc;
        if (sh->n_expert) {
            uint64_t ne_in[3] = {E, sh->n_ff_exp, sh->n_expert};
            uint64_t ne_out[3] = {sh->n_ff_exp, E, sh->n_expert};
            if ((rc = add(w, t, NAME("ffn_gate_inp.weight"), STRATA_TYPE_F32, 2,
                          (uint64_t[]){E, sh->n_expert}, aE, &seed, err)) ||
                (rc = add(w, t, NAME("ffn_gate_exps.weight"), t4, 3, ne_in, aE, &seed, err)) ||
                (rc = add(w, t, NAME("ffn_up_exps.weight"), t4, 3, ne_in, aE, &seed, err)) ||
                (rc = add(w, t, NAME("ffn_down_exps.weight"), tv, 3, ne_out, aE, &seed, err)))
                return rc;
        } else {
            if ((rc = add(w, t, NAME("ffn_gate.weight"), t4, 2, (uint64_t[]){E, sh->n_ff}, aE,
                          &seed, err)) ||
                (rc = add(w, t, NAME("ffn_up.weight"), t4, 2, (uint64_t[]){E, sh->n_ff}, aE,
                          &seed, err)) ||
                (rc = add(w, t, NAME("ffn_down.weight"), tv, 2, (uint64_t[]){sh->n_ff, E}, aE,
                          &seed, err)))
                return rc;
        }
#undef NAME
    }
    if ((rc = add(w, t, "output_norm.weight", STRATA_TYPE_F32, 1, (uint64_t[]){E}, 0, &seed,
                  err)) ||
        (rc = add(w, t, "output.weight", big, 2, (uint64_t[]){E, sh->n_vocab}, aE, &seed, err)))
        return rc;
    return 0;
}

static void free_tensors(struct tensors *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->bufs[i]);
    free(t->bufs);
}

/* Build o's model and write it to path, or into *buf, or (dry: its bytes counted, none
 * made) nowhere; *bytes (may be NULL) gets the tensors' bytes. */
static int synth_run(const struct strata_synth_opts *o, int dry, const char *path, void **buf,
                     size_t *size, uint64_t *bytes, struct strata_err *err)
{
    struct strata_gguf_writer *w = NULL;
    struct tensors t = {NULL, 0, 0, dry, 0};
    int rc = strata_gguf_writer_create(&w, err);
    if (!rc)
        rc = build(o, w, &t, err);
    if (!rc && path)
        rc = strata_gguf_writer_write_file(w, path, err);
    else if (!rc && buf)
        rc = strata_gguf_writer_write_mem(w, buf, size, err);
    strata_gguf_writer_free(w);
    free_tensors(&t);
    if (!rc && bytes)
        *bytes = t.bytes;
    return rc;
}

int strata_synth_size(const struct strata_synth_opts *o, uint64_t *bytes,
                      struct strata_err *err)
{
    *bytes = 0;
    return synth_run(o, 1, NULL, NULL, NULL, bytes, err);
}

int strata_synth_build(const struct strata_synth_opts *o, void **buf, size_t *size,
                       struct strata_err *err)
{
    *buf = NULL;
    *size = 0;
    return synth_run(o, 0, NULL, buf, size, NULL, err);
}

int strata_synth_write(const struct strata_synth_opts *o, const char *path,
                       struct strata_err *err)
{
    return synth_run(o, 0, path, NULL, NULL, NULL, err);
}
