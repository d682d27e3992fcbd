/* model.c - architecture table, hyper-parameters and weights from GGUF. */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_types.h"
#include "gguf.h"
#include "quant.h"

/* One entry per supported general.architecture.  expert_weights_norm is the
 * default used when the GGUF has no ARCH.expert_weights_norm key:
 *  - llama (Mixtral): top-k softmax weights sum to 1, as Mixtral defines it;
 *  - qwen3moe: true.  Qwen3-MoE GGUFs written by convert_hf_to_gguf.py carry
 *    no such key; every published Qwen3-MoE config.json sets
 *    norm_topk_prob=true and llama.cpp's qwen3moe graph renormalises
 *    unconditionally, so that is the reference behaviour;
 *  - qwen2moe: false (Qwen1.5/2-MoE configs set norm_topk_prob=false). */
static const struct strata_arch arch_table[] = {
    { "llama", STRATA_ROPE_NORM, 0, 0, 2, 0, 1 },
    { "qwen2", STRATA_ROPE_NEOX, 0, 1, 0, 0, 0 },
    { "qwen3", STRATA_ROPE_NEOX, 1, 0, 0, 0, 0 },
    { "qwen3moe", STRATA_ROPE_NEOX, 1, 0, 1, 0, 1 },
    { "qwen2moe", STRATA_ROPE_NEOX, 0, 1, 1, 1, 0 },
};

const struct strata_arch *strata_model_find_arch(const char *name)
{
    for (size_t i = 0; i < sizeof arch_table / sizeof arch_table[0]; i++)
        if (strcmp(arch_table[i].name, name) == 0)
            return &arch_table[i];
    return NULL;
}

/* ARCH.suffix into buf. */
static const char *akey(char *buf, size_t n, const char *arch, const char *suffix)
{
    snprintf(buf, n, "%s.%s", arch, suffix);
    return buf;
}

static int get_u32(const struct strata_gguf *g, const char *arch, const char *suffix,
                   uint32_t *out, int required, uint32_t def, struct strata_err *err)
{
    char k[128];
    akey(k, sizeof k, arch, suffix);
    if (!strata_gguf_find_kv(g, k)) {
        if (required)
            return strata_err_set(err, STRATA_E_NOTFOUND, "required key '%s' not found", k);
        *out = def;
        return 0;
    }
    return strata_gguf_get_u32(g, k, out, err);
}

static int get_f32(const struct strata_gguf *g, const char *arch, const char *suffix,
                   float *out, int required, float def, struct strata_err *err)
{
    char k[128];
    akey(k, sizeof k, arch, suffix);
    if (!strata_gguf_find_kv(g, k)) {
        if (required)
            return strata_err_set(err, STRATA_E_NOTFOUND, "required key '%s' not found", k);
        *out = def;
        return 0;
    }
    return strata_gguf_get_f32(g, k, out, err);
}

static const char *shape_str(char *buf, size_t n, const int64_t *ne, int nd)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < nd && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)ne[i]);
    if (o < n)
        snprintf(buf + o, n - o, "]");
    return buf;
}

/* Look up tensor name (printf-style with layer il, or il < 0 for globals) and
 * check its shape against ne (nd dims; trailing dims must be 1).  A missing
 * tensor is an error when required, else w stays zeroed. */
static int get_weight(const struct strata_gguf *g, struct strata_weight *w, const char *name,
                      int il, int nd, int64_t ne0, int64_t ne1, int64_t ne2, int required,
                      struct strata_err *err)
{
    char full[160];
    if (il >= 0)
        snprintf(full, sizeof full, "blk.%d.%s.weight", il, name);
    else
        snprintf(full, sizeof full, "%s.weight", name);
    if (strcmp(name, "attn_q.bias") == 0 || strcmp(name, "attn_k.bias") == 0 ||
        strcmp(name, "attn_v.bias") == 0)
        snprintf(full, sizeof full, "blk.%d.%s", il, name);
    memset(w, 0, sizeof *w);
    const struct strata_gguf_tensor *t = strata_gguf_find_tensor(g, full);
    if (!t) {
        if (required)
            return strata_err_set(err, STRATA_E_NOTFOUND, "required tensor '%s' not found",
                                  full);
        return 0;
    }
    int64_t want[4] = { ne0, ne1, ne2, 1 };
    int ok = 1;
    for (int i = 0; i < 4; i++) {
        int64_t have = (int64_t)t->ne[i];
        int64_t exp = i < nd ? want[i] : 1;
        if (have != exp)
            ok = 0;
    }
    /* a [n] vector stored as [n, 1] is the same thing */
    if (!ok) {
        char a[96], b[96];
        int64_t have[4] = { (int64_t)t->ne[0], (int64_t)t->ne[1], (int64_t)t->ne[2],
                            (int64_t)t->ne[3] };
        return strata_err_set(err, STRATA_E_FORMAT, "tensor '%s' has shape %s, expected %s",
                              full, shape_str(a, sizeof a, have, (int)t->n_dims),
                              shape_str(b, sizeof b, want, nd));
    }
    if (!strata_quant_supported(t->type)) {
        const char *tn = strata_ggml_type_name(t->type);
        return strata_err_set(err, STRATA_E_UNSUPPORTED,
                              "tensor '%s' has type %s, which this build cannot compute",
                              full, tn ? tn : "unknown");
    }
    if (nd == 1 && t->type != STRATA_TYPE_F32 && t->type != STRATA_TYPE_F16 &&
        t->type != STRATA_TYPE_BF16)
        return strata_err_set(err, STRATA_E_UNSUPPORTED,
                              "tensor '%s': a norm or bias vector must be F32, F16 or BF16",
                              full);
    w->name = t->name;
    w->type = t->type;
    for (int i = 0; i < 4; i++)
        w->ne[i] = (int64_t)t->ne[i];
    w->nb1 = (size_t)strata_ggml_row_size(t->type, t->ne[0]);
    w->nb2 = w->nb1 * (size_t)t->ne[1];
    w->data = t->data;
    return 0;
}

static int load_hparams(const struct strata_gguf *g, const struct strata_arch *a,
                        struct strata_hparams *hp, struct strata_err *err)
{
    const char *an = a->name;
    int rc;
    memset(hp, 0, sizeof *hp);
    if ((rc = get_u32(g, an, "embedding_length", &hp->n_embd, 1, 0, err)) ||
        (rc = get_u32(g, an, "block_count", &hp->n_layer, 1, 0, err)) ||
        (rc = get_u32(g, an, "attention.head_count", &hp->n_head, 1, 0, err)) ||
        (rc = get_u32(g, an, "context_length", &hp->n_ctx_train, 0, 4096, err)) ||
        (rc = get_f32(g, an, "attention.layer_norm_rms_epsilon", &hp->f_norm_rms_eps, 1, 0,
                      err)))
        return rc;
    if (hp->n_embd == 0 || hp->n_layer == 0 || hp->n_head == 0 || hp->n_layer > 4096 ||
        hp->n_embd > (1u << 20) || hp->n_head > 4096)
        return strata_err_set(err, STRATA_E_FORMAT,
                              "bad hyper-parameters: %s.embedding_length %u, block_count %u,"
                              " attention.head_count %u", an, hp->n_embd, hp->n_layer,
                              hp->n_head);
    if ((rc = get_u32(g, an, "attention.head_count_kv", &hp->n_head_kv, 0, hp->n_head, err)) ||
        (rc = get_u32(g, an, "attention.key_length", &hp->n_embd_head_k, 0,
                      hp->n_embd / hp->n_head, err)))
        return rc;
    if ((rc = get_u32(g, an, "attention.value_length", &hp->n_embd_head_v, 0,
                      hp->n_embd_head_k, err)) ||
        (rc = get_u32(g, an, "feed_forward_length", &hp->n_ff, 0, 0, err)) ||
        (rc = get_u32(g, an, "expert_count", &hp->n_expert, 0, 0, err)) ||
        (rc = get_u32(g, an, "expert_used_count", &hp->n_expert_used, 0, 0, err)) ||
        (rc = get_u32(g, an, "expert_feed_forward_length", &hp->n_ff_exp, 0, 0, err)) ||
        (rc = get_u32(g, an, "expert_shared_feed_forward_length", &hp->n_ff_shexp, 0, 0,
                      err)) ||
        (rc = get_u32(g, an, "rope.dimension_count", &hp->n_rot, 0, hp->n_embd_head_k, err)) ||
        (rc = get_f32(g, an, "rope.freq_base", &hp->rope_freq_base, 0, 10000.0f, err)))
        return rc;
    if (hp->n_head_kv == 0 || hp->n_head % hp->n_head_kv != 0)
        return strata_err_set(err, STRATA_E_FORMAT,
                              "key '%s.attention.head_count_kv' (%u) does not divide "
                              "head_count (%u)", an, hp->n_head_kv, hp->n_head);
    if (hp->n_embd_head_k == 0 || hp->n_embd_head_v == 0 || hp->n_embd_head_k > 1024 ||
        hp->n_embd_head_v > 1024)
        return strata_err_set(err, STRATA_E_FORMAT, "key '%s.attention.key_length' or "
                              "value_length out of range (%u, %u)", an, hp->n_embd_head_k,
                              hp->n_embd_head_v);
    if (hp->n_rot == 0 || hp->n_rot > hp->n_embd_head_k || hp->n_rot % 2)
        return strata_err_set(err, STRATA_E_FORMAT,
                              "key '%s.rope.dimension_count' (%u) must be even and at most "
                              "the head size %u", an, hp->n_rot, hp->n_embd_head_k);
    if (hp->n_expert > 512)
        return strata_err_set(err, STRATA_E_UNSUPPORTED, "key '%s.expert_count' = %u: at "
                              "most 512 experts are supported", an, hp->n_expert);
    if (hp->n_expert > 0 && (hp->n_expert_used == 0 || hp->n_expert_used > hp->n_expert))
        return strata_err_set(err, STRATA_E_FORMAT,
                              "key '%s.expert_used_count' (%u) must be 1..expert_count (%u)",
                              an, hp->n_expert_used, hp->n_expert);
    if (a->moe == 1 && hp->n_expert == 0)
        return strata_err_set(err, STRATA_E_NOTFOUND, "required key '%s.expert_count' not "
                              "found", an);
    if (!(hp->rope_freq_base > 0))
        return strata_err_set(err, STRATA_E_FORMAT, "key '%s.rope.freq_base' must be > 0", an);

    /* rope scaling: ARCH.rope.scaling.type ("none", "linear", "yarn") and
     * ARCH.rope.scaling.factor; the older ARCH.rope.scale_linear too. */
    hp->rope_freq_scale = 1.0f;
    hp->rope_scaling = STRATA_ROPE_SCALING_NONE;
    float factor = 0;
    char k[128];
    const char *stype = NULL;
    akey(k, sizeof k, an, "rope.scaling.type");
    if (strata_gguf_find_kv(g, k) && (rc = strata_gguf_get_str(g, k, &stype, err)))
        return rc;
    if ((rc = get_f32(g, an, "rope.scaling.factor", &factor, 0, 0, err)))
        return rc;
    if (factor == 0 && (rc = get_f32(g, an, "rope.scale_linear", &factor, 0, 0, err)))
        return rc;
    if (stype && strcmp(stype, "yarn") == 0)
        hp->rope_scaling = STRATA_ROPE_SCALING_YARN;
    else if (stype && strcmp(stype, "linear") == 0)
        hp->rope_scaling = STRATA_ROPE_SCALING_LINEAR;
    else if (stype && strcmp(stype, "none") != 0)
        return strata_err_set(err, STRATA_E_UNSUPPORTED, "key '%s' value '%s' is not "
                              "supported (none, linear, yarn)", k, stype);
    else if (!stype && factor > 0 && factor != 1)
        hp->rope_scaling = STRATA_ROPE_SCALING_LINEAR;
    if (hp->rope_scaling != STRATA_ROPE_SCALING_NONE && factor > 0)
        hp->rope_freq_scale = 1.0f / factor;
    if ((rc = get_u32(g, an, "rope.scaling.original_context_length", &hp->n_ctx_orig_yarn, 0,
                      hp->n_ctx_train, err)) ||
        (rc = get_f32(g, an, "rope.scaling.attn_factor", &hp->yarn_attn_factor, 0, 1.0f, err)))
        return rc;
    hp->yarn_ext_factor = hp->rope_scaling == STRATA_ROPE_SCALING_YARN ? 1.0f : 0.0f;
    hp->yarn_beta_fast = 32.0f;
    hp->yarn_beta_slow = 1.0f;
    hp->rope_type = a->rope_type;

    hp->expert_gating = STRATA_GATING_SOFTMAX;
    hp->expert_weights_norm = a->expert_weights_norm;
    akey(k, sizeof k, an, "expert_weights_norm");
    if (strata_gguf_find_kv(g, k) && (rc = strata_gguf_get_bool(g, k, &hp->expert_weights_norm,
                                                               err)))
        return rc;
    if ((rc = get_f32(g, an, "expert_weights_scale", &hp->expert_weights_scale, 0, 1.0f, err)))
        return rc;
    uint32_t gf = 0;
    if ((rc = get_u32(g, an, "expert_gating_func", &gf, 0, 1, err)))
        return rc;
    if (gf != 1)
        return strata_err_set(err, STRATA_E_UNSUPPORTED,
                              "key '%s.expert_gating_func' = %u: only softmax (1) is supported",
                              an, gf);
    return 0;
}

static int tensor_ne(const struct strata_gguf *g, const char *name, int dim, uint32_t *out)
{
    const struct strata_gguf_tensor *t = strata_gguf_find_tensor(g, name);
    if (!t)
        return 0;
    *out = (uint32_t)t->ne[dim];
    return 1;
}

int strata_model_load(struct strata_model **out, const struct strata_gguf *g,
                      struct strata_err *err)
{
    struct strata_model *m = NULL;
    int rc;
    const char *an = NULL;
    *out = NULL;
    if ((rc = strata_gguf_get_str(g, "general.architecture", &an, err)))
        return rc;
    const struct strata_arch *a = strata_model_find_arch(an);
    if (!a)
        return strata_err_set(err, STRATA_E_UNSUPPORTED,
                              "architecture '%s' (general.architecture) is not supported "
                              "(llama, qwen2, qwen3, qwen3moe, qwen2moe)", an);
    m = calloc(1, sizeof *m);
    if (!m)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    m->gguf = g;
    m->arch = a;
    struct strata_hparams *hp = &m->hp;
    if ((rc = load_hparams(g, a, hp, err)))
        goto out;

    const struct strata_gguf_tensor *te = strata_gguf_find_tensor(g, "token_embd.weight");
    if (!te) {
        rc = strata_err_set(err, STRATA_E_NOTFOUND, "required tensor 'token_embd.weight' "
                            "not found");
        goto out;
    }
    hp->n_vocab = (uint32_t)te->ne[1];
    if (hp->n_expert && hp->n_ff_exp == 0)
        tensor_ne(g, "blk.0.ffn_gate_exps.weight", 1, &hp->n_ff_exp);
    if (a->has_shexp && hp->n_ff_shexp == 0)
        tensor_ne(g, "blk.0.ffn_gate_shexp.weight", 1, &hp->n_ff_shexp);

    const int64_t E = hp->n_embd, V = hp->n_vocab;
    const int64_t qd = (int64_t)hp->n_head * hp->n_embd_head_k;
    const int64_t kd = (int64_t)hp->n_head_kv * hp->n_embd_head_k;
    const int64_t vd = (int64_t)hp->n_head_kv * hp->n_embd_head_v;
    const int64_t od = (int64_t)hp->n_head * hp->n_embd_head_v;
    if ((rc = get_weight(g, &m->tok_embd, "token_embd", -1, 2, E, V, 1, 1, err)) ||
        (rc = get_weight(g, &m->output_norm, "output_norm", -1, 1, E, 1, 1, 1, err)) ||
        (rc = get_weight(g, &m->output, "output", -1, 2, E, V, 1, 0, err)) ||
        (rc = get_weight(g, &m->rope_freqs, "rope_freqs", -1, 1, hp->n_rot / 2, 1, 1, 0, err)))
        goto out;
    if (!m->output.data)
        m->output = m->tok_embd; /* tied embeddings */
    if (m->rope_freqs.data) {
        float ff[512];
        strata_quant_dequant_row(m->rope_freqs.type, m->rope_freqs.data, ff, hp->n_rot / 2);
        for (uint32_t i = 0; i < hp->n_rot / 2; i++)
            if (!(ff[i] > 0) || ff[i] > 1e30f) {
                rc = strata_err_set(err, STRATA_E_FORMAT, "tensor 'rope_freqs.weight': "
                                    "element %u is %g, must be a positive number", i, ff[i]);
                goto out;
            }
    }

    m->layers = calloc(hp->n_layer, sizeof *m->layers);
    if (!m->layers) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        struct strata_layer *L = &m->layers[il];
        int l = (int)il;
        if ((rc = get_weight(g, &L->attn_norm, "attn_norm", l, 1, E, 1, 1, 1, err)) ||
            (rc = get_weight(g, &L->wq, "attn_q", l, 2, E, qd, 1, 1, err)) ||
            (rc = get_weight(g, &L->wk, "attn_k", l, 2, E, kd, 1, 1, err)) ||
            (rc = get_weight(g, &L->wv, "attn_v", l, 2, E, vd, 1, 1, err)) ||
            (rc = get_weight(g, &L->wo, "attn_output", l, 2, od, E, 1, 1, err)) ||
            (rc = get_weight(g, &L->ffn_norm, "ffn_norm", l, 1, E, 1, 1, 1, err)))
            goto out;
        if (a->has_qkv_bias &&
            ((rc = get_weight(g, &L->bq, "attn_q.bias", l, 1, qd, 1, 1, 0, err)) ||
             (rc = get_weight(g, &L->bk, "attn_k.bias", l, 1, kd, 1, 1, 0, err)) ||
             (rc = get_weight(g, &L->bv, "attn_v.bias", l, 1, vd, 1, 1, 0, err))))
            goto out;
        if (a->has_qk_norm &&
            ((rc = get_weight(g, &L->attn_q_norm, "attn_q_norm", l, 1, hp->n_embd_head_k, 1, 1,
                              1, err)) ||
             (rc = get_weight(g, &L->attn_k_norm, "attn_k_norm", l, 1, hp->n_embd_head_k, 1, 1,
                              1, err))))
            goto out;
        int moe = 0;
        if (a->moe == 1)
            moe = 1;
        else if (a->moe == 2) {
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%u.ffn_gate_inp.weight", il);
            moe = strata_gguf_find_tensor(g, nm) != NULL;
            if (moe && hp->n_expert == 0) {
                rc = strata_err_set(err, STRATA_E_NOTFOUND, "tensor '%s' exists but required "
                                    "key '%s.expert_count' not found", nm, an);
                goto out;
            }
        }
        L->is_moe = moe;
        if (!moe) {
            if (hp->n_ff == 0) {
                rc = strata_err_set(err, STRATA_E_NOTFOUND, "required key "
                                    "'%s.feed_forward_length' not found", an);
                goto out;
            }
            if ((rc = get_weight(g, &L->ffn_gate, "ffn_gate", l, 2, E, hp->n_ff, 1, 1, err)) ||
                (rc = get_weight(g, &L->ffn_up, "ffn_up", l, 2, E, hp->n_ff, 1, 1, err)) ||
                (rc = get_weight(g, &L->ffn_down, "ffn_down", l, 2, hp->n_ff, E, 1, 1, err)))
                goto out;
            continue;
        }
        const int64_t X = hp->n_expert, F = hp->n_ff_exp ? hp->n_ff_exp : hp->n_ff;
        if ((rc = get_weight(g, &L->ffn_gate_inp, "ffn_gate_inp", l, 2, E, X, 1, 1, err)) ||
            (rc = get_weight(g, &L->ffn_gate_exps, "ffn_gate_exps", l, 3, E, F, X, 1, err)) ||
            (rc = get_weight(g, &L->ffn_up_exps, "ffn_up_exps", l, 3, E, F, X, 1, err)) ||
            (rc = get_weight(g, &L->ffn_down_exps, "ffn_down_exps", l, 3, F, E, X, 1, err)))
            goto out;
        if (hp->n_ff_exp == 0)
            hp->n_ff_exp = (uint32_t)F;
        if (a->has_shexp) {
            const int64_t S = hp->n_ff_shexp;
            if (S == 0) {
                rc = strata_err_set(err, STRATA_E_NOTFOUND, "required tensor "
                                    "'blk.%u.ffn_gate_shexp.weight' not found", il);
                goto out;
            }
            if ((rc = get_weight(g, &L->ffn_gate_inp_shexp, "ffn_gate_inp_shexp", l, 1, E, 1, 1,
                                 1, err)) ||
                (rc = get_weight(g, &L->ffn_gate_shexp, "ffn_gate_shexp", l, 2, E, S, 1, 1,
                                 err)) ||
                (rc = get_weight(g, &L->ffn_up_shexp, "ffn_up_shexp", l, 2, E, S, 1, 1, err)) ||
                (rc = get_weight(g, &L->ffn_down_shexp, "ffn_down_shexp", l, 2, S, E, 1, 1,
                                 err)))
                goto out;
        }
    }
    *out = m;
    m = NULL;
    rc = 0;
out:
    strata_model_free(m);
    return rc;
}

void strata_model_free(struct strata_model *m)
{
    if (!m)
        return;
    free(m->layers);
    free(m);
}

static uint64_t wbytes(const struct strata_weight *w)
{
    return w->data ? (uint64_t)w->nb2 * (uint64_t)w->ne[2] * (uint64_t)w->ne[3] : 0;
}

uint64_t strata_model_total_bytes(const struct strata_model *m)
{
    uint64_t s = wbytes(&m->tok_embd) + wbytes(&m->output_norm);
    if (m->output.data != m->tok_embd.data)
        s += wbytes(&m->output);
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        const struct strata_weight *w = &m->layers[il].attn_norm;
        const struct strata_weight *end = (const struct strata_weight *)(&m->layers[il].is_moe);
        for (; w < end; w++)
            s += wbytes(w);
    }
    return s;
}

uint64_t strata_model_active_bytes(const struct strata_model *m)
{
    uint64_t s = wbytes(&m->output_norm) + wbytes(&m->output) + m->tok_embd.nb1;
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        const struct strata_layer *L = &m->layers[il];
        const struct strata_weight *w = &L->attn_norm;
        const struct strata_weight *end = (const struct strata_weight *)(&L->is_moe);
        for (; w < end; w++) {
            if (w == &L->ffn_gate_exps || w == &L->ffn_up_exps || w == &L->ffn_down_exps)
                s += (uint64_t)w->nb2 * m->hp.n_expert_used * (w->data != NULL);
            else
                s += wbytes(w);
        }
    }
    return s;
}
