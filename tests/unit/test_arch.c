/* test_arch.c - every architecture of the table on small random-weight
 * models written with the GGUF writer, against a naive reference forward
 * pass written here from the model definitions (HF modeling_llama /
 * modeling_mixtral / modeling_qwen2_moe / modeling_qwen3): llama dense,
 * llama with Mixtral-style experts (softmax, top-k renormalised), qwen3
 * (q/k norm, NeoX RoPE), qwen2moe (q/k/v biases, no renormalisation, shared
 * expert behind a sigmoid gate), qwen3moe; linear and YaRN RoPE scaling; a missing
 * key and a missing tensor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "gguf.h"
#include "gguf_write.h"
#include "model.h"
#include "tap.h"

enum { E = 64, NH = 4, NKV = 2, HD = 16, NFF = 48, NX = 4, NK = 2, FX = 32, FS = 40, V = 40,
       NL = 2 };

struct cfg {
    const char *arch;
    int moe, qk_norm, bias, shexp, neox, norm_w;
    float rope_scale; /* linear factor, 0 = none */
    int yarn;         /* rope_scale is a YaRN factor (original context 16) */
    int freqs;        /* rope_freqs.weight divides the frequencies */
};

/* all weights of the test model (F32) */
struct w {
    float tok[V * E], out[V * E], onorm[E], rfreq[HD / 2];
    struct {
        float an[E], fn[E], q[NH * HD * E], k[NKV * HD * E], v[NKV * HD * E], o[E * NH * HD];
        float bq[NH * HD], bk[NKV * HD], bv[NKV * HD], qn[HD], kn[HD];
        float g[NFF * E], u[NFF * E], d[E * NFF];
        float gi[NX * E], ge[NX * FX * E], ue[NX * FX * E], de[NX * E * FX];
        float gis[E], gs[FS * E], us[FS * E], ds[E * FS];
    } l[NL];
};

static uint64_t rng = 0x1234567;
static float frand(float scale)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return ((float)((rng >> 40) & 0xffffff) / 16777216.0f - 0.5f) * 2 * scale;
}
static void fill(float *p, size_t n, float scale, float bias)
{
    for (size_t i = 0; i < n; i++)
        p[i] = bias + frand(scale);
}

/* ---- reference ---- */

static void ref_norm(const float *x, const float *g, float *y, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    double r = 1.0 / sqrt(s / n + 1e-6);
    for (int i = 0; i < n; i++)
        y[i] = (float)(x[i] * r * g[i]);
}

/* y[r] = W[r, :] . x, W [rows, cols] row-major (GGUF ne0 = cols) */
static void ref_mv(const float *W, const float *x, float *y, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++)
            s += (double)W[(size_t)r * cols + c] * x[c];
        y[r] = (float)s;
    }
}

static void ref_ffn(const float *g, const float *u, const float *d, int f, const float *x,
                    float *y)
{
    float a[64], b[64];
    ref_mv(g, x, a, f, E);
    ref_mv(u, x, b, f, E);
    for (int i = 0; i < f; i++)
        a[i] = a[i] / (1 + expf(-a[i])) * b[i];
    ref_mv(d, a, y, E, f);
}

/* YaRN as transformers' _compute_yarn_parameters: per-dimension blend of
 * interpolated and extrapolated frequencies with a linear ramp between the
 * correction dims of beta_fast 32 / beta_slow 1, cos/sin scaled by
 * 0.1 ln(factor) + 1. */
static double yarn_corr(double n_rot, double base, double orig)
{
    return HD * log(orig / (n_rot * 2 * M_PI)) / (2 * log(base));
}

static const float *ref_freqs; /* rope_freqs of the model under test, or NULL */

static void ref_rope(float *x, int pos, int neox, float scale, float yarn_factor)
{
    double low = 0, high = 0, msc = 1;
    if (yarn_factor > 0) {
        low = floor(yarn_corr(32, 10000, 16));
        high = ceil(yarn_corr(1, 10000, 16));
        if (low < 0)
            low = 0;
        if (high > HD - 1)
            high = HD - 1;
        msc = 0.1 * log(yarn_factor) + 1;
    }
    for (int i = 0; i < HD / 2; i++) {
        double inv = pow(10000.0, -2.0 * i / HD) / (ref_freqs ? ref_freqs[i] : 1.0);
        double th = pos * inv * scale;
        if (yarn_factor > 0) {
            double ramp = (i - low) / (high - low > 0.001 ? high - low : 0.001);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extra = 1 - ramp;
            th = pos * (inv / yarn_factor * (1 - extra) + inv * extra);
        }
        double c = cos(th) * msc, s = sin(th) * msc;
        int a = neox ? i : 2 * i, b = neox ? i + HD / 2 : 2 * i + 1;
        double x0 = x[a], x1 = x[b];
        x[a] = (float)(x0 * c - x1 * s);
        x[b] = (float)(x0 * s + x1 * c);
    }
}

static void ref_forward(const struct cfg *c, const struct w *W, const int32_t *ids, int n,
                        float *logits)
{
    static float x[16][E], K[NL][16][NKV * HD], Vv[NL][16][NKV * HD];
    const float rs = c->rope_scale > 0 && !c->yarn ? 1.0f / c->rope_scale : 1.0f;
    const float yf = c->yarn ? c->rope_scale : 0;
    for (int t = 0; t < n; t++)
        memcpy(x[t], W->tok + (size_t)ids[t] * E, sizeof x[t]);
    for (int l = 0; l < NL; l++) {
        for (int t = 0; t < n; t++) {
            float h[E], q[NH * HD], att[NH * HD], o[E];
            ref_norm(x[t], W->l[l].an, h, E);
            ref_mv(W->l[l].q, h, q, NH * HD, E);
            ref_mv(W->l[l].k, h, K[l][t], NKV * HD, E);
            ref_mv(W->l[l].v, h, Vv[l][t], NKV * HD, E);
            for (int i = 0; c->bias && i < NH * HD; i++)
                q[i] += W->l[l].bq[i];
            for (int i = 0; c->bias && i < NKV * HD; i++) {
                K[l][t][i] += W->l[l].bk[i];
                Vv[l][t][i] += W->l[l].bv[i];
            }
            for (int hh = 0; hh < NH; hh++) {
                if (c->qk_norm)
                    ref_norm(q + hh * HD, W->l[l].qn, q + hh * HD, HD);
                ref_rope(q + hh * HD, t, c->neox, rs, yf);
            }
            for (int hh = 0; hh < NKV; hh++) {
                if (c->qk_norm)
                    ref_norm(K[l][t] + hh * HD, W->l[l].kn, K[l][t] + hh * HD, HD);
                ref_rope(K[l][t] + hh * HD, t, c->neox, rs, yf);
            }
            for (int hh = 0; hh < NH; hh++) {
                int kv = hh / (NH / NKV);
                double sc[16], mx = -1e30, sum = 0;
                for (int p = 0; p <= t; p++) {
                    double s = 0;
                    for (int d = 0; d < HD; d++)
                        s += (double)q[hh * HD + d] * K[l][p][kv * HD + d];
                    sc[p] = s / sqrt((double)HD);
                    if (sc[p] > mx)
                        mx = sc[p];
                }
                for (int p = 0; p <= t; p++)
                    sum += (sc[p] = exp(sc[p] - mx));
                for (int d = 0; d < HD; d++) {
                    double a = 0;
                    for (int p = 0; p <= t; p++)
                        a += sc[p] / sum * Vv[l][p][kv * HD + d];
                    att[hh * HD + d] = (float)a;
                }
            }
            ref_mv(W->l[l].o, att, o, E, NH * HD);
            for (int i = 0; i < E; i++)
                x[t][i] += o[i];
            ref_norm(x[t], W->l[l].fn, h, E);
            float y[E] = { 0 };
            if (!c->moe) {
                ref_ffn(W->l[l].g, W->l[l].u, W->l[l].d, NFF, h, y);
            } else {
                float r[NX], p[NX], mx = -1e30f, sum = 0;
                ref_mv(W->l[l].gi, h, r, NX, E);
                for (int e = 0; e < NX; e++)
                    mx = r[e] > mx ? r[e] : mx;
                for (int e = 0; e < NX; e++)
                    sum += (p[e] = expf(r[e] - mx));
                for (int e = 0; e < NX; e++)
                    p[e] /= sum;
                int sel[NK];
                float wsum = 0, wk[NK];
                for (int k = 0; k < NK; k++) {
                    int best = -1;
                    for (int e = 0; e < NX; e++) {
                        int taken = 0;
                        for (int j = 0; j < k; j++)
                            taken |= sel[j] == e;
                        if (!taken && (best < 0 || p[e] > p[best]))
                            best = e;
                    }
                    sel[k] = best;
                    wsum += (wk[k] = p[best]);
                }
                for (int k = 0; k < NK; k++) {
                    float ye[E];
                    int e = sel[k];
                    ref_ffn(W->l[l].ge + (size_t)e * FX * E, W->l[l].ue + (size_t)e * FX * E,
                            W->l[l].de + (size_t)e * E * FX, FX, h, ye);
                    float wgt = c->norm_w ? wk[k] / wsum : wk[k];
                    for (int i = 0; i < E; i++)
                        y[i] += wgt * ye[i];
                }
                if (c->shexp) {
                    float ys[E];
                    double gd = 0;
                    ref_ffn(W->l[l].gs, W->l[l].us, W->l[l].ds, FS, h, ys);
                    for (int i = 0; i < E; i++)
                        gd += (double)W->l[l].gis[i] * h[i];
                    float gate = (float)(1 / (1 + exp(-gd)));
                    for (int i = 0; i < E; i++)
                        y[i] += gate * ys[i];
                }
            }
            for (int i = 0; i < E; i++)
                x[t][i] += y[i];
        }
    }
    for (int t = 0; t < n; t++) {
        float h[E];
        ref_norm(x[t], W->onorm, h, E);
        ref_mv(W->out, h, logits + (size_t)t * V, V, E);
    }
}

/* ---- GGUF ---- */

static int add_t(struct strata_gguf_writer *g, const char *name, int l, const float *data,
                 int nd, uint64_t a, uint64_t b, uint64_t c, struct strata_err *err)
{
    char full[96];
    uint64_t ne[3] = { a, b, c };
    if (l >= 0)
        snprintf(full, sizeof full, "blk.%d.%s", l, name);
    else
        snprintf(full, sizeof full, "%s", name);
    return strata_gguf_writer_add_tensor(g, full, 0, (uint32_t)nd, ne, data, err);
}

static void *build(const struct cfg *c, const struct w *W, size_t *size, const char *skip_key,
                   const char *skip_tensor)
{
    struct strata_err err = { 0 };
    struct strata_gguf_writer *g = NULL;
    void *buf = NULL;
    char k[128];
    int rc = strata_gguf_writer_create(&g, &err);
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", c->arch, suffix), k)
#define U32(suffix, v)                                                             \
    if (!rc && !(skip_key && strcmp(skip_key, suffix) == 0))                       \
    rc = strata_gguf_writer_add_u32(g, KEY(suffix), v, &err)
    if (!rc)
        rc = strata_gguf_writer_add_str(g, "general.architecture", c->arch, &err);
    U32("embedding_length", E);
    U32("block_count", NL);
    U32("attention.head_count", NH);
    U32("attention.head_count_kv", NKV);
    U32("attention.key_length", HD);
    U32("context_length", 64);
    if (!c->moe)
        U32("feed_forward_length", NFF);
    if (c->moe) {
        U32("expert_count", NX);
        U32("expert_used_count", NK);
        U32("expert_feed_forward_length", FX);
    }
    if (c->shexp)
        U32("expert_shared_feed_forward_length", FS);
    if (!rc)
        rc = strata_gguf_writer_add_f32(g, KEY("attention.layer_norm_rms_epsilon"), 1e-6f,
                                        &err);
    if (!rc && c->rope_scale > 0) {
        rc = strata_gguf_writer_add_str(g, KEY("rope.scaling.type"), c->yarn ? "yarn" : "linear",
                                        &err);
        if (!rc)
            rc = strata_gguf_writer_add_f32(g, KEY("rope.scaling.factor"), c->rope_scale, &err);
        if (!rc && c->yarn)
            rc = strata_gguf_writer_add_u32(g, KEY("rope.scaling.original_context_length"), 16,
                                            &err);
    }
    if (!rc && c->moe && strcmp(c->arch, "qwen3moe") == 0 && !c->norm_w)
        rc = strata_gguf_writer_add_bool(g, KEY("expert_weights_norm"), 0, &err);
    const struct { const char *n; int l; const float *d; int nd; uint64_t a, b, cc; int when; }
        *tt, tl[] = {
        { "token_embd.weight", -1, W->tok, 2, E, V, 1, 1 },
        { "output_norm.weight", -1, W->onorm, 1, E, 1, 1, 1 },
        { "output.weight", -1, W->out, 2, E, V, 1, 1 },
    };
    for (tt = tl; !rc && tt < tl + 3; tt++)
        rc = add_t(g, tt->n, tt->l, tt->d, tt->nd, tt->a, tt->b, tt->cc, &err);
    if (!rc && c->freqs)
        rc = add_t(g, "rope_freqs.weight", -1, W->rfreq, 1, HD / 2, 1, 1, &err);
    for (int l = 0; !rc && l < NL; l++) {
        const struct { const char *n; const float *d; int nd; uint64_t a, b, cc; int when; }
            *t, ts[] = {
            { "attn_norm.weight", W->l[l].an, 1, E, 1, 1, 1 },
            { "ffn_norm.weight", W->l[l].fn, 1, E, 1, 1, 1 },
            { "attn_q.weight", W->l[l].q, 2, E, NH * HD, 1, 1 },
            { "attn_k.weight", W->l[l].k, 2, E, NKV * HD, 1, 1 },
            { "attn_v.weight", W->l[l].v, 2, E, NKV * HD, 1, 1 },
            { "attn_output.weight", W->l[l].o, 2, NH * HD, E, 1, 1 },
            { "attn_q.bias", W->l[l].bq, 1, NH * HD, 1, 1, c->bias },
            { "attn_k.bias", W->l[l].bk, 1, NKV * HD, 1, 1, c->bias },
            { "attn_v.bias", W->l[l].bv, 1, NKV * HD, 1, 1, c->bias },
            { "attn_q_norm.weight", W->l[l].qn, 1, HD, 1, 1, c->qk_norm },
            { "attn_k_norm.weight", W->l[l].kn, 1, HD, 1, 1, c->qk_norm },
            { "ffn_gate.weight", W->l[l].g, 2, E, NFF, 1, !c->moe },
            { "ffn_up.weight", W->l[l].u, 2, E, NFF, 1, !c->moe },
            { "ffn_down.weight", W->l[l].d, 2, NFF, E, 1, !c->moe },
            { "ffn_gate_inp.weight", W->l[l].gi, 2, E, NX, 1, c->moe },
            { "ffn_gate_exps.weight", W->l[l].ge, 3, E, FX, NX, c->moe },
            { "ffn_up_exps.weight", W->l[l].ue, 3, E, FX, NX, c->moe },
            { "ffn_down_exps.weight", W->l[l].de, 3, FX, E, NX, c->moe },
            { "ffn_gate_inp_shexp.weight", W->l[l].gis, 1, E, 1, 1, c->shexp },
            { "ffn_gate_shexp.weight", W->l[l].gs, 2, E, FS, 1, c->shexp },
            { "ffn_up_shexp.weight", W->l[l].us, 2, E, FS, 1, c->shexp },
            { "ffn_down_shexp.weight", W->l[l].ds, 2, FS, E, 1, c->shexp },
        };
        for (t = ts; !rc && t < ts + sizeof ts / sizeof ts[0]; t++) {
            char full[96];
            snprintf(full, sizeof full, "blk.%d.%s", l, t->n);
            if (!t->when || (skip_tensor && strcmp(skip_tensor, full) == 0))
                continue;
            rc = add_t(g, t->n, l, t->d, t->nd, t->a, t->b, t->cc, &err);
        }
    }
    if (!rc)
        rc = strata_gguf_writer_write_mem(g, &buf, size, &err);
    if (rc)
        diag("build %s: %s", c->arch, err.msg);
    strata_gguf_writer_free(g);
    return rc ? NULL : buf;
}

static void check_arch(const struct cfg *c, struct w *W)
{
    struct strata_err err = { 0 };
    size_t size = 0;
    void *buf = build(c, W, &size, NULL, NULL);
    struct strata_gguf *g = NULL;
    struct strata_engine *e = NULL;
    struct strata_engine_opts o;
    strata_engine_opts_init(&o);
    o.n_threads = 2;
    o.n_ctx = 32;
    o.kv_type = STRATA_KV_F32;
    o.n_prefill = 5; /* the 11-token prompt runs as 5 + 5 + 1 */
    if (!ok(buf && strata_gguf_open_mem(&g, buf, size, c->arch, &err) == 0 &&
                strata_engine_open_gguf(&e, g, &o, &err) == 0,
            "%s%s: load (%s)", c->arch, c->moe ? " moe" : "", err.msg))
        goto out;
    const struct strata_model *m = strata_engine_model(e);
    ok(m->hp.expert_weights_norm == c->norm_w || !c->moe,
       "%s: expert_weights_norm %d", c->arch, m->hp.expert_weights_norm);
    int32_t ids[11];
    for (int i = 0; i < 11; i++)
        ids[i] = (i * 7 + 3) % V;
    float got[11 * V], want[11 * V];
    ref_freqs = c->freqs ? W->rfreq : NULL;
    ref_forward(c, W, ids, 11, want);
    int rc = strata_engine_eval(e, ids, 11, STRATA_LOGITS_ALL, got, &err);
    double md = 0;
    for (int i = 0; i < 11 * V; i++)
        if (fabs(got[i] - want[i]) > md || got[i] != got[i])
            md = got[i] != got[i] ? INFINITY : fabs(got[i] - want[i]);
    ok(rc == 0 && md < 2e-4, "%s%s%s: logits match the reference (max diff %.2g)", c->arch,
       c->moe ? " moe" : "",
       c->freqs ? " rope_freqs" : c->yarn ? " yarn rope" : c->rope_scale > 0 ? " linear rope" : "",
       md);
out:
    strata_engine_close(e);
    strata_gguf_close(g);
    free(buf);
}

static void check_missing(const struct cfg *c, struct w *W, const char *key,
                          const char *tensor, const char *want)
{
    struct strata_err err = { 0 };
    size_t size = 0;
    void *buf = build(c, W, &size, key, tensor);
    struct strata_gguf *g = NULL;
    struct strata_engine *e = NULL;
    int rc = buf ? strata_gguf_open_mem(&g, buf, size, c->arch, &err) : -1;
    if (rc == 0)
        rc = strata_engine_open_gguf(&e, g, NULL, &err);
    ok(rc == STRATA_E_NOTFOUND && strstr(err.msg, want), "missing %s: '%s'",
       key ? key : tensor, err.msg);
    strata_engine_close(e);
    strata_gguf_close(g);
    free(buf);
}

int main(void)
{
    struct w *W = calloc(1, sizeof *W);
    fill(W->tok, V * E, 1.0f, 0);
    fill(W->out, V * E, 0.3f, 0);
    fill(W->onorm, E, 0.2f, 1);
    for (int i = 0; i < HD / 2; i++)
        W->rfreq[i] = 1.0f + (float)(i * i); /* as Llama 3.1's: low frequencies slowed */
    for (int l = 0; l < NL; l++) {
        fill(W->l[l].an, E, 0.2f, 1);
        fill(W->l[l].fn, E, 0.2f, 1);
        fill(W->l[l].q, sizeof W->l[l].q / 4, 0.25f, 0);
        fill(W->l[l].k, sizeof W->l[l].k / 4, 0.25f, 0);
        fill(W->l[l].v, sizeof W->l[l].v / 4, 0.25f, 0);
        fill(W->l[l].o, sizeof W->l[l].o / 4, 0.15f, 0);
        fill(W->l[l].bq, NH * HD, 0.3f, 0);
        fill(W->l[l].bk, NKV * HD, 0.3f, 0);
        fill(W->l[l].bv, NKV * HD, 0.3f, 0);
        fill(W->l[l].qn, HD, 0.2f, 1);
        fill(W->l[l].kn, HD, 0.2f, 1);
        fill(W->l[l].g, NFF * E, 0.2f, 0);
        fill(W->l[l].u, NFF * E, 0.2f, 0);
        fill(W->l[l].d, NFF * E, 0.2f, 0);
        fill(W->l[l].gi, NX * E, 0.5f, 0);
        fill(W->l[l].ge, NX * FX * E, 0.2f, 0);
        fill(W->l[l].ue, NX * FX * E, 0.2f, 0);
        fill(W->l[l].de, NX * FX * E, 0.2f, 0);
        fill(W->l[l].gis, E, 0.3f, 0);
        fill(W->l[l].gs, FS * E, 0.2f, 0);
        fill(W->l[l].us, FS * E, 0.2f, 0);
        fill(W->l[l].ds, FS * E, 0.2f, 0);
    }
    /*                    arch        moe qkn bias shx neox norm rope yarn freqs */
    struct cfg llama = { "llama", 0, 0, 0, 0, 0, 1, 0, 0, 0 };
    struct cfg mixtral = { "llama", 1, 0, 0, 0, 0, 1, 0, 0, 0 };
    struct cfg llama_lin = { "llama", 0, 0, 0, 0, 0, 1, 4.0f, 0, 0 };
    struct cfg qwen3 = { "qwen3", 0, 1, 0, 0, 1, 0, 0, 0, 0 };
    struct cfg q3moe = { "qwen3moe", 1, 1, 0, 0, 1, 1, 0, 0, 0 };
    struct cfg q3moe_nonorm = { "qwen3moe", 1, 1, 0, 0, 1, 0, 0, 0, 0 };
    struct cfg q2moe = { "qwen2moe", 1, 0, 1, 1, 1, 0, 0, 0, 0 };
    struct cfg q3_yarn = { "qwen3", 0, 1, 0, 0, 1, 0, 4.0f, 1, 0 };
    struct cfg llama_ff = { "llama", 0, 0, 0, 0, 0, 1, 0, 0, 1 };
    struct cfg qwen2 = { "qwen2", 0, 0, 1, 0, 1, 0, 0, 0, 0 };
    check_arch(&llama, W);
    check_arch(&mixtral, W);
    check_arch(&llama_lin, W);
    check_arch(&qwen3, W);
    check_arch(&q3moe, W);
    check_arch(&q3moe_nonorm, W);
    check_arch(&q2moe, W);
    check_arch(&q3_yarn, W);
    check_arch(&llama_ff, W);
    check_arch(&qwen2, W);
    check_missing(&q2moe, W, "attention.head_count", NULL,
                  "required key 'qwen2moe.attention.head_count' not found");
    check_missing(&q2moe, W, NULL, "blk.1.ffn_up_shexp.weight",
                  "required tensor 'blk.1.ffn_up_shexp.weight' not found");
    check_missing(&qwen3, W, NULL, "blk.0.attn_k_norm.weight",
                  "required tensor 'blk.0.attn_k_norm.weight' not found");
    free(W);
    return tap_done();
}
