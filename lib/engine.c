/* engine.c - the engine object and the CPU backend's forward pass. */
#include "engine.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#endif

#include "ggml_types.h"
#include "gguf.h"
#include "log.h"
#include "matmul.h"
#include "model.h"
#include "pack.h"
#include "pool.h"
#include "quant.h"
#include "sampler.h"

/* ------------------------------------------------------------------------ */
/* small helpers                                                            */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A norm/bias vector (F32, F16 or BF16) as float32. */
static void vec_to_f32(const struct strata_weight *w, float *dst, int64_t n)
{
    strata_quant_dequant_row(w->type, w->data, dst, n);
}

static struct strata_mat mat_of(const struct strata_weight *w, int64_t expert)
{
    struct strata_mat m;
    m.type = w->type;
    m.ne0 = w->ne[0];
    m.ne1 = w->ne[1];
    m.nb1 = w->nb1;
    m.data = (const char *)w->data + (size_t)expert * w->nb2;
    return m;
}

/* y = x / sqrt(mean(x^2) + eps) * g, as llama.cpp's rms_norm (sum in double
 * would differ from the references only in the last bits; float is what
 * both HF in float32 and ggml use, ggml accumulating in ggml_float=double). */
static void rms_norm(const float *x, const float *g, float *y, int64_t n, float eps)
{
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)x[i] * x[i];
    const float scale = (float)(1.0 / sqrt(sum / (double)n + eps));
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * scale * g[i];
}

static float silu(float x)
{
    return x / (1.0f + expf(-x));
}

/* ------------------------------------------------------------------------ */
/* CPU backend                                                              */

#define ATTN_MAX_GQA 64    /* query heads per kv head */
#define MM_TILE 32          /* tokens per kernel call */
#define MM_CHUNK_ROWS 16    /* rows per work item */
#define MM_INLINE_MACS (1 << 15) /* smaller jobs run on the calling thread */
#define MM_MAX_TASKS 1040

struct mm_task {
    struct strata_mat w;
    const char *act;   /* n_tok rows of act_stride bytes */
    size_t act_stride;
    int n_tok;
    float *y;          /* y[t * ldy + r] */
    int64_t ldy;
    strata_vec_dot_fn dot;
    int64_t chunk0;    /* first chunk index of this task */
};

/* Profile counters (ms), printed at close when STRATA_PROFILE is set. */
enum { PROF_EMBD, PROF_QKV, PROF_ATTN, PROF_WO, PROF_FFN, PROF_ROUTER, PROF_EXPERTS,
       PROF_OUT, PROF_N };
static const char *const prof_names[PROF_N] = {
    "embed", "qkv", "attention", "attn_output", "dense_ffn", "router", "experts", "output"
};

struct cpu_state {
    const struct strata_model *m;
    struct strata_pool *pool;
    int n_ctx, n_ub, kv_f16, n_threads;
    size_t kv_elt;      /* bytes per kv element */
    int64_t n_kv_k;     /* n_head_kv * n_embd_head_k */
    int64_t n_kv_v;
    void **k_cache;     /* [n_layer] -> [n_ctx / 8, n_kv_k, 8]: keys of 8 positions
                           interleaved per dim, so 8 scores are one vector op per dim */
    void **v_cache;     /* [n_layer] -> [n_ctx, n_kv_v] */
    float *rope_cs;     /* [n_ctx, n_rot/2, 2] cos, sin */
    /* per-layer norm vectors as float */
    float **attn_norm, **ffn_norm, **q_norm, **k_norm, **bq, **bk, **bv, **shexp_gate;
    float *out_norm;
    /* scratch, sized for n_ub positions */
    float *x, *cur, *q, *k, *v, *att, *tmp;
    float *router;      /* [n_ub, n_expert] */
    int32_t *sel;       /* [n_ub, n_expert_used] */
    float *selw;        /* [n_ub, n_expert_used] */
    int32_t *elist;     /* [n_ub * n_expert_used] (t * K + slot) grouped by expert */
    int32_t *ecount;    /* [n_expert + 1] offsets */
    float *ge, *ue, *ye; /* ffn hidden states and outputs, [n_ub * K] rows */
    int32_t *inv;       /* [n_ub * K] grouped position of each (token, slot) */
    char *aq8_0, *aq8_k;   /* quantised activations of a layer input */
    char *aq8_0b, *aq8_kb; /* ... of the ffn hidden state */
    char *xg, *xg2;     /* [n_ub * K] gathered activation rows (gate, up) */
    struct mm_task *tasks; /* [MM_MAX_TASKS] */
    float *scores;      /* [n_threads, n_ctx] */
    int profile;
    double prof[PROF_N];
    long prof_tok;
    void (*route_trace)(void *, int, int32_t, int, int, const int32_t *);
    void *route_trace_ctx;
    int32_t pos0;       /* of the forward call, for route_trace */
};

static void cpu_free(void *state)
{
    struct cpu_state *s = state;
    if (!s)
        return;
    if (s->profile && s->prof_tok) {
        double tot = 0;
        for (int i = 0; i < PROF_N; i++)
            tot += s->prof[i];
        strata_log_info("cpu profile over %ld positions: %.1f ms", s->prof_tok, tot);
        for (int i = 0; i < PROF_N; i++)
            strata_log_info("  %-12s %8.2f ms  %5.1f%%", prof_names[i], s->prof[i],
                            tot > 0 ? 100 * s->prof[i] / tot : 0);
    }
    uint32_t nl = s->m ? s->m->hp.n_layer : 0;
    for (uint32_t i = 0; i < nl; i++) {
        if (s->k_cache)
            free(s->k_cache[i]);
        if (s->v_cache)
            free(s->v_cache[i]);
        if (s->attn_norm)
            free(s->attn_norm[i]);
        if (s->ffn_norm)
            free(s->ffn_norm[i]);
        if (s->q_norm)
            free(s->q_norm[i]);
        if (s->k_norm)
            free(s->k_norm[i]);
        if (s->bq)
            free(s->bq[i]);
        if (s->bk)
            free(s->bk[i]);
        if (s->bv)
            free(s->bv[i]);
        if (s->shexp_gate)
            free(s->shexp_gate[i]);
    }
    free(s->k_cache); free(s->v_cache); free(s->attn_norm); free(s->ffn_norm);
    free(s->q_norm); free(s->k_norm); free(s->bq); free(s->bk); free(s->bv);
    free(s->shexp_gate); free(s->out_norm); free(s->rope_cs);
    free(s->x); free(s->cur); free(s->q); free(s->k); free(s->v); free(s->att);
    free(s->tmp); free(s->router); free(s->sel); free(s->selw);
    free(s->elist); free(s->ecount); free(s->ge); free(s->ue); free(s->ye);
    free(s->inv); free(s->aq8_0); free(s->aq8_k); free(s->aq8_0b); free(s->aq8_kb);
    free(s->xg); free(s->xg2); free(s->tasks); free(s->scores);
    free(s);
}

/* ggml's YaRN helpers (ggml/src/ggml.c: ggml_rope_yarn_corr_dims and
 * rope_yarn_ramp; the formula is from the YaRN paper, arXiv:2309.00071). */
static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base)
{
    return n_dims * logf(n_ctx_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

static float yarn_ramp(float low, float high, int i0)
{
    float y = (i0 / 2 - low) / fmaxf(0.001f, high - low);
    return 1 - fminf(1, fmaxf(0, y));
}

/* cos/sin of every (position, dim pair), as ggml's rope with YaRN does. */
static void rope_table(struct cpu_state *s)
{
    const struct strata_hparams *hp = &s->m->hp;
    const int n_dims = (int)hp->n_rot;
    const float base = hp->rope_freq_base, fs = hp->rope_freq_scale;
    const float ext = hp->yarn_ext_factor;
    float corr0 = 0, corr1 = 0;
    float mscale = hp->yarn_attn_factor;
    if (ext != 0) {
        int n_orig = hp->n_ctx_orig_yarn ? (int)hp->n_ctx_orig_yarn : (int)hp->n_ctx_train;
        corr0 = fmaxf(0, floorf(yarn_corr_dim(n_dims, n_orig, hp->yarn_beta_fast, base)));
        corr1 = fminf(n_dims - 1, ceilf(yarn_corr_dim(n_dims, n_orig, hp->yarn_beta_slow, base)));
        mscale *= 1.0f + 0.1f * logf(1.0f / fs);
    }
    /* rope_freqs.weight divides each pair's frequency (as ggml's rope with
     * freq_factors); absent: 1 */
    float ff[512];
    for (int i = 0; i < n_dims / 2; i++)
        ff[i] = 1.0f;
    if (s->m->rope_freqs.data)
        strata_quant_dequant_row(s->m->rope_freqs.type, s->m->rope_freqs.data, ff, n_dims / 2);
    for (int p = 0; p < s->n_ctx; p++) {
        float *cs = s->rope_cs + (size_t)p * n_dims;
        for (int i0 = 0; i0 < n_dims; i0 += 2) {
            /* theta = p * base^(-i0/n_dims), computed in double */
            double th_extrap = p * pow((double)base, -(double)i0 / n_dims) / ff[i0 / 2];
            double th = fs * th_extrap;
            if (ext != 0) {
                double mix = yarn_ramp(corr0, corr1, i0) * ext;
                th = th * (1 - mix) + th_extrap * mix;
            }
            cs[i0] = (float)cos(th) * mscale;
            cs[i0 + 1] = (float)sin(th) * mscale;
        }
    }
}

/* Rotate one head of n_head_dim values at position pos. */
static void rope_apply(const struct cpu_state *s, float *x, int pos)
{
    const int n_dims = (int)s->m->hp.n_rot;
    const float *cs = s->rope_cs + (size_t)pos * n_dims;
    if (s->m->hp.rope_type == STRATA_ROPE_NEOX) {
        const int half = n_dims / 2;
        for (int i = 0; i < half; i++) {
            float c = cs[2 * i], sn = cs[2 * i + 1];
            float a = x[i], b = x[i + half];
            x[i] = a * c - b * sn;
            x[i + half] = a * sn + b * c;
        }
    } else {
        for (int i0 = 0; i0 < n_dims; i0 += 2) {
            float c = cs[i0], sn = cs[i0 + 1];
            float a = x[i0], b = x[i0 + 1];
            x[i0] = a * c - b * sn;
            x[i0 + 1] = a * sn + b * c;
        }
    }
}

#define ALLOC(p, n)                                                             \
    do {                                                                        \
        size_t n__ = (size_t)(n);                                               \
        (p) = calloc(n__ ? n__ : 1, sizeof *(p));                               \
        if (!(p)) {                                                             \
            rc = strata_err_set(err, STRATA_E_NOMEM,                            \
                                "cannot allocate %zu bytes for the cpu backend", \
                                n__ * sizeof *(p));                             \
            goto out;                                                           \
        }                                                                       \
    } while (0)

static int cpu_init(void **state, const struct strata_model *m,
                    const struct strata_engine_opts *o, struct strata_pool *pool,
                    struct strata_err *err)
{
    struct cpu_state *s = NULL;
    int rc = 0;
    *state = NULL;
    s = calloc(1, sizeof *s);
    if (!s)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    s->m = m;
    s->pool = pool;
    s->n_threads = strata_pool_n_threads(pool);
    s->n_ctx = o->n_ctx;
    s->n_ub = o->n_prefill;
    s->kv_f16 = o->kv_type == STRATA_KV_F16;
    s->kv_elt = s->kv_f16 ? 2 : 4;
    s->route_trace = o->route_trace;
    s->route_trace_ctx = o->route_trace_ctx;
    const char *pe = getenv("STRATA_PROFILE");
    s->profile = pe && *pe && strcmp(pe, "0") != 0;
    const struct strata_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, T = s->n_ub, L = hp->n_layer;
    s->n_kv_k = (int64_t)hp->n_head_kv * hp->n_embd_head_k;
    s->n_kv_v = (int64_t)hp->n_head_kv * hp->n_embd_head_v;
    const int64_t qd = (int64_t)hp->n_head * hp->n_embd_head_k;
    const int64_t od = (int64_t)hp->n_head * hp->n_embd_head_v;
    int64_t ff = hp->n_ff;
    if (hp->n_ff_exp > ff)
        ff = hp->n_ff_exp;
    if (hp->n_ff_shexp > ff)
        ff = hp->n_ff_shexp;
    const int64_t K = hp->n_expert_used ? hp->n_expert_used : 1;
    const int64_t X = hp->n_expert;

    ALLOC(s->k_cache, L); ALLOC(s->v_cache, L);
    ALLOC(s->attn_norm, L); ALLOC(s->ffn_norm, L); ALLOC(s->q_norm, L); ALLOC(s->k_norm, L);
    ALLOC(s->bq, L); ALLOC(s->bk, L); ALLOC(s->bv, L); ALLOC(s->shexp_gate, L);
    for (int64_t il = 0; il < L; il++) {
        const struct strata_layer *ly = &m->layers[il];
        s->k_cache[il] = calloc((size_t)(s->n_ctx + 7) / 8 * 8 * s->n_kv_k, s->kv_elt);
        s->v_cache[il] = calloc((size_t)s->n_ctx * s->n_kv_v, s->kv_elt);
        if (!s->k_cache[il] || !s->v_cache[il]) {
            rc = strata_err_set(err, STRATA_E_NOMEM, "cannot allocate the kv cache (%d "
                                "positions, %lld layers)", s->n_ctx, (long long)L);
            goto out;
        }
        ALLOC(s->attn_norm[il], E);
        vec_to_f32(&ly->attn_norm, s->attn_norm[il], E);
        ALLOC(s->ffn_norm[il], E);
        vec_to_f32(&ly->ffn_norm, s->ffn_norm[il], E);
        if (ly->attn_q_norm.data) {
            ALLOC(s->q_norm[il], hp->n_embd_head_k);
            vec_to_f32(&ly->attn_q_norm, s->q_norm[il], hp->n_embd_head_k);
            ALLOC(s->k_norm[il], hp->n_embd_head_k);
            vec_to_f32(&ly->attn_k_norm, s->k_norm[il], hp->n_embd_head_k);
        }
        if (ly->bq.data) {
            ALLOC(s->bq[il], qd);
            vec_to_f32(&ly->bq, s->bq[il], qd);
        }
        if (ly->bk.data) {
            ALLOC(s->bk[il], s->n_kv_k);
            vec_to_f32(&ly->bk, s->bk[il], s->n_kv_k);
        }
        if (ly->bv.data) {
            ALLOC(s->bv[il], s->n_kv_v);
            vec_to_f32(&ly->bv, s->bv[il], s->n_kv_v);
        }
        if (ly->ffn_gate_inp_shexp.data) {
            ALLOC(s->shexp_gate[il], E);
            vec_to_f32(&ly->ffn_gate_inp_shexp, s->shexp_gate[il], E);
        }
    }
    ALLOC(s->out_norm, E);
    vec_to_f32(&m->output_norm, s->out_norm, E);
    ALLOC(s->rope_cs, (size_t)s->n_ctx * hp->n_rot);
    rope_table(s);
    ALLOC(s->x, T * E); ALLOC(s->cur, T * E); ALLOC(s->tmp, T * E);
    ALLOC(s->q, T * qd); ALLOC(s->k, T * s->n_kv_k); ALLOC(s->v, T * s->n_kv_v);
    ALLOC(s->att, T * od);
    {
        int64_t mx = E > od ? E : od;
        if (ff > mx)
            mx = ff;
        const int64_t rows = T * K;
        ALLOC(s->ge, rows * ff); ALLOC(s->ue, rows * ff); ALLOC(s->ye, rows * E);
        ALLOC(s->aq8_0, rows * (mx / 32 + 1) * 34); ALLOC(s->aq8_k, rows * (mx / 256 + 1) * 292);
        ALLOC(s->aq8_0b, rows * (mx / 32 + 1) * 34);
        ALLOC(s->aq8_kb, rows * (mx / 256 + 1) * 292);
        ALLOC(s->xg, rows * mx * 4);
        ALLOC(s->xg2, rows * mx * 4);
        ALLOC(s->tasks, MM_MAX_TASKS);
    }
    if (X) {
        ALLOC(s->router, T * X); ALLOC(s->sel, T * K); ALLOC(s->selw, T * K);
        ALLOC(s->elist, T * K); ALLOC(s->inv, T * K); ALLOC(s->ecount, X + 1);
    }
    if (hp->n_head / hp->n_head_kv > ATTN_MAX_GQA) {
        rc = strata_err_set(err, STRATA_E_UNSUPPORTED, "head_count / head_count_kv = %u: at most "
                            "%d query heads per kv head are supported",
                            hp->n_head / hp->n_head_kv, ATTN_MAX_GQA);
        goto out;
    }
    ALLOC(s->scores, (size_t)s->n_threads * s->n_ctx * (hp->n_head / hp->n_head_kv));
    *state = s;
    s = NULL;
out:
    cpu_free(s);
    return rc;
}

/* ---- fused matmuls ----
 *
 * Several products that can run at the same time (q, k and v; ffn gate and
 * up; every routed expert of a layer) go to the pool as one job: their rows
 * are cut into chunks that the threads take from an atomic counter, so a
 * decode step costs a few pool wake-ups per layer instead of one per matrix.
 * Each (token, row) value is one call of the quant module's dot kernel, whose
 * result does not depend on how many tokens it is given (quant.h), so the
 * logits stay bitwise independent of the batch and of the thread count.
 */
struct mm_job {
    struct mm_task *t;
    int n;
    int64_t n_chunks;
    atomic_llong next;
};

static void mm_worker(void *ctx, int ith, int nth)
{
    struct mm_job *j = ctx;
    float out[MM_TILE];
    int ti = 0;
    (void)ith;
    (void)nth;
    for (;;) {
        int64_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (c >= j->n_chunks)
            break;
        while (ti + 1 < j->n && j->t[ti + 1].chunk0 <= c)
            ti++;
        while (ti > 0 && j->t[ti].chunk0 > c)
            ti--;
        const struct mm_task *k = &j->t[ti];
        int64_t ra = (c - k->chunk0) * MM_CHUNK_ROWS;
        int64_t rb = ra + MM_CHUNK_ROWS < k->w.ne1 ? ra + MM_CHUNK_ROWS : k->w.ne1;
        for (int t0 = 0; t0 < k->n_tok; t0 += MM_TILE) {
            int nt = k->n_tok - t0 < MM_TILE ? k->n_tok - t0 : MM_TILE;
            const char *a = k->act + (size_t)t0 * k->act_stride;
            for (int64_t r = ra; r < rb; r++) {
                k->dot(k->w.ne0, (const char *)k->w.data + (size_t)r * k->w.nb1, a,
                       k->act_stride, nt, out);
                for (int t = 0; t < nt; t++)
                    k->y[(size_t)(t0 + t) * k->ldy + r] = out[t];
            }
        }
    }
}

/* Run tasks[0..n) as one pool job. */
static void mm_run(struct cpu_state *s, struct mm_task *tasks, int n)
{
    struct mm_job j;
    int64_t chunks = 0, macs = 0;
    for (int i = 0; i < n; i++) {
        tasks[i].chunk0 = chunks;
        chunks += (tasks[i].w.ne1 + MM_CHUNK_ROWS - 1) / MM_CHUNK_ROWS;
        macs += tasks[i].w.ne0 * tasks[i].w.ne1 * tasks[i].n_tok;
    }
    if (chunks == 0)
        return;
    j.t = tasks;
    j.n = n;
    j.n_chunks = chunks;
    atomic_init(&j.next, 0);
    strata_pool_run(macs < MM_INLINE_MACS || chunks < 2 ? NULL : s->pool, mm_worker, &j);
}

/* Activations of x [n_tok, ne0] in the form the weight type dots against:
 * quantised once per (input, activation type) into the slot's buffer. */
struct act_cache {
    const float *x;
    int64_t ne0;
    int n_tok;
    char *q8_0, *q8_k; /* buffers owned by the cpu state */
    int have_q8_0, have_q8_k;
};

struct qa_job {
    uint32_t vt;
    const float *x;
    int64_t ne0;
    int n_tok;
    char *dst;
    size_t row;
};

static void qa_worker(void *ctx, int ith, int nth)
{
    struct qa_job *q = ctx;
    for (int t = ith; t < q->n_tok; t += nth)
        strata_quant_quantize_act(q->vt, q->x + (size_t)t * q->ne0, q->dst + (size_t)t * q->row,
                                  q->ne0);
}

static void act_init(struct act_cache *a, const float *x, int64_t ne0, int n_tok, char *q8_0,
                     char *q8_k)
{
    a->x = x;
    a->ne0 = ne0;
    a->n_tok = n_tok;
    a->q8_0 = q8_0;
    a->q8_k = q8_k;
    a->have_q8_0 = a->have_q8_k = 0;
}

static const char *act_get(struct cpu_state *s, struct act_cache *a, uint32_t weight_type,
                           size_t *stride)
{
    uint32_t vt = strata_quant_vec_dot_type(weight_type);
    if (vt == STRATA_TYPE_F32) {
        *stride = (size_t)a->ne0 * sizeof(float);
        return (const char *)a->x;
    }
    size_t row = strata_quant_act_size(vt, a->ne0);
    *stride = row;
    char *dst = vt == STRATA_TYPE_Q8_0 ? a->q8_0 : a->q8_k;
    int *have = vt == STRATA_TYPE_Q8_0 ? &a->have_q8_0 : &a->have_q8_k;
    if (!*have) {
        struct qa_job q = { vt, a->x, a->ne0, a->n_tok, dst, row };
        strata_pool_run(a->n_tok > 1 ? s->pool : NULL, qa_worker, &q);
        *have = 1;
    }
    return dst;
}

static struct mm_task mm_task_of(struct cpu_state *s, struct act_cache *a,
                                 const struct strata_weight *w, int64_t expert, float *y,
                                 int64_t ldy)
{
    struct mm_task t;
    memset(&t, 0, sizeof t);
    t.w = mat_of(w, expert);
    t.act = act_get(s, a, w->type, &t.act_stride);
    t.n_tok = a->n_tok;
    t.y = y;
    t.ldy = ldy;
    t.dot = strata_quant_vec_dot_fn(w->type, strata_quant_simd_level());
    return t;
}

/* ---- attention ---- */

static float dot_f32(const float *a, const float *b, int n)
{
    float s = 0;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

#ifdef HAVE_X86
__attribute__((target("avx2,fma,f16c")))
static void axpy_f16_avx2(float *y, float a, const uint16_t *x, int n)
{
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 vx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, vx, _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++)
        y[i] += a * strata_f16_to_f32(x[i]);
}

__attribute__((target("avx2,fma")))
static void axpy_f32_avx2(float *y, float a, const float *x, int n)
{
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i),
                                                _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}
#endif

static void kv_axpy(int simd, int f16, float *y, float a, const void *x, int n)
{
#ifdef HAVE_X86
    if (simd >= STRATA_SIMD_AVX2) {
        if (f16)
            axpy_f16_avx2(y, a, x, n);
        else
            axpy_f32_avx2(y, a, x, n);
        return;
    }
#endif
    (void)simd;
    if (!f16) {
        const float *f = x;
        for (int i = 0; i < n; i++)
            y[i] += a * f[i];
        return;
    }
    const uint16_t *h = x;
    for (int i = 0; i < n; i++)
        y[i] += a * strata_f16_to_f32(h[i]);
}

struct attn_job {
    struct cpu_state *s;
    int il, n_tok, pos0;
};

/* One (token, kv head) per work item: the gqa query heads that share a kv
 * head are scored together, so each key and value row is converted once.
 * Every item reads keys and values from the cache only, so its result does
 * not depend on the batch it is in. */
#ifdef HAVE_X86
/* e^x for 8 floats (x <= 88), the Cephes expf scheme: x = n ln2 + r with
 * |r| <= ln2/2 (ln2 split in two constants), a degree-5 minimax polynomial
 * for e^r, 2^n built in the exponent bits; within 2 ulp of expf. */
__attribute__((target("avx2,fma")))
static __m256 exp8_avx2(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365478515625f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                                _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx),
                                                   _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

/* AVX2 item for head sizes that are multiples of 8 with an f16 cache. */
__attribute__((target("avx2,fma,f16c")))
static void attn_item_avx2_f16(const float *q, int G, int hk, int hv, int n_pos,
                               const uint16_t *kc, size_t kblk, const uint16_t *vc,
                               size_t vrow, float scale, float *sc, float *o, size_t ostride)
{
    float mx[ATTN_MAX_GQA], sum[ATTN_MAX_GQA];
    for (int g = 0; g < G; g++)
        mx[g] = -INFINITY;
    /* scores of 8 positions at a time: the key cache holds each dim of 8
     * positions side by side, so a score vector is hk multiply-adds with no
     * horizontal reduction; every lane is computed the same way whatever
     * n_pos is (batch invariance) and lanes past n_pos are dropped */
    for (int p0 = 0; p0 < n_pos; p0 += 8) {
        const uint16_t *kb = kc + (size_t)(p0 / 8) * kblk;
        const int nj = n_pos - p0 < 8 ? n_pos - p0 : 8;
        for (int g0 = 0; g0 < G; g0 += 4) {
            const int ng = G - g0 < 4 ? G - g0 : 4;
            const float *q0 = q + (size_t)g0 * hk;
            const float *q1 = ng > 1 ? q0 + hk : q0, *q2 = ng > 2 ? q0 + 2 * hk : q0;
            const float *q3 = ng > 3 ? q0 + 3 * hk : q0;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < hk; d++) {
                __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kb + d * 8)));
                a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q0 + d), kv, a0);
                a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(q1 + d), kv, a1);
                a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(q2 + d), kv, a2);
                a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(q3 + d), kv, a3);
            }
            __m256 acc[4] = { a0, a1, a2, a3 };
            for (int g = 0; g < ng; g++) {
                float v8[8];
                _mm256_storeu_ps(v8, _mm256_mul_ps(acc[g], _mm256_set1_ps(scale)));
                float *sg = sc + (size_t)(g0 + g) * n_pos + p0;
                for (int j = 0; j < nj; j++) {
                    sg[j] = v8[j];
                    if (v8[j] > mx[g0 + g])
                        mx[g0 + g] = v8[j];
                }
            }
        }
    }
    for (int g = 0; g < G; g++) {
        float *sg = sc + (size_t)g * n_pos;
        __m256 vs = _mm256_setzero_ps(), vm = _mm256_set1_ps(mx[g]);
        int p = 0;
        for (; p + 8 <= n_pos; p += 8) {
            __m256 e = exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(sg + p), vm));
            _mm256_storeu_ps(sg + p, e);
            vs = _mm256_add_ps(vs, e);
        }
        float part[8], sm = 0;
        _mm256_storeu_ps(part, vs);
        for (int i = 0; i < 8; i++)
            sm += part[i];
        for (; p < n_pos; p++) {
            sg[p] = expf(sg[p] - mx[g]);
            sm += sg[p];
        }
        sum[g] = sm;
    }
    /* weighted values: 8 output dims of up to 4 heads stay in registers
     * while the positions stream past (the sum order per output is fixed) */
    for (int g0 = 0; g0 < G; g0 += 4) {
        const int ng = G - g0 < 4 ? G - g0 : 4;
        const float *s0 = sc + (size_t)g0 * n_pos;
        const float *s1 = ng > 1 ? s0 + n_pos : s0, *s2 = ng > 2 ? s0 + 2 * (size_t)n_pos : s0;
        const float *s3 = ng > 3 ? s0 + 3 * (size_t)n_pos : s0;
        for (int i = 0; i < hv; i += 8) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int p = 0; p < n_pos; p++) {
                __m256 vv = _mm256_cvtph_ps(
                    _mm_loadu_si128((const __m128i *)(vc + (size_t)p * vrow + i)));
                a0 = _mm256_fmadd_ps(_mm256_set1_ps(s0[p]), vv, a0);
                a1 = _mm256_fmadd_ps(_mm256_set1_ps(s1[p]), vv, a1);
                a2 = _mm256_fmadd_ps(_mm256_set1_ps(s2[p]), vv, a2);
                a3 = _mm256_fmadd_ps(_mm256_set1_ps(s3[p]), vv, a3);
            }
            __m256 acc[4] = { a0, a1, a2, a3 };
            for (int g = 0; g < ng; g++)
                _mm256_storeu_ps(o + (size_t)(g0 + g) * ostride + i, acc[g]);
        }
    }
    for (int g = 0; g < G; g++) {
        const float inv = 1.0f / sum[g];
        for (int d = 0; d < hv; d++)
            o[(size_t)g * ostride + d] *= inv;
    }
}
#endif

/* Portable item (any head size, f16 or f32 cache). */
static void attn_item(const struct cpu_state *s, int simd, const float *q, int G, int hk,
                      int hv, int n_pos, const char *kc, size_t kblk, const char *vc,
                      size_t vrow, float scale, float *sc, float *o, size_t ostride)
{
    float mx[ATTN_MAX_GQA], sum[ATTN_MAX_GQA];
    float kp[1024];
    for (int g = 0; g < G; g++)
        mx[g] = -INFINITY;
    for (int p = 0; p < n_pos; p++) {
        /* gather the key of position p from its block (lane p % 8) */
        const char *kb = kc + (size_t)(p / 8) * kblk * s->kv_elt;
        for (int d = 0; d < hk; d++) {
            size_t at = (size_t)d * 8 + p % 8;
            kp[d] = s->kv_f16 ? strata_f16_to_f32(((const uint16_t *)kb)[at])
                              : ((const float *)kb)[at];
        }
        for (int g = 0; g < G; g++) {
            float v = dot_f32(q + (size_t)g * hk, kp, hk) * scale;
            sc[(size_t)g * n_pos + p] = v;
            if (v > mx[g])
                mx[g] = v;
        }
    }
    for (int g = 0; g < G; g++) {
        float *sg = sc + (size_t)g * n_pos, sm = 0;
        for (int p = 0; p < n_pos; p++) {
            sg[p] = expf(sg[p] - mx[g]);
            sm += sg[p];
        }
        sum[g] = sm;
        memset(o + (size_t)g * ostride, 0, sizeof(float) * hv);
    }
    for (int p = 0; p < n_pos; p++) {
        const void *vp = vc + (size_t)p * vrow;
        for (int g = 0; g < G; g++)
            kv_axpy(simd, s->kv_f16, o + (size_t)g * ostride, sc[(size_t)g * n_pos + p], vp, hv);
    }
    for (int g = 0; g < G; g++) {
        const float inv = 1.0f / sum[g];
        for (int d = 0; d < hv; d++)
            o[(size_t)g * ostride + d] *= inv;
    }
}

static void attn_worker(void *ctx, int ith, int nth)
{
    struct attn_job *j = ctx;
    struct cpu_state *s = j->s;
    const struct strata_hparams *hp = &s->m->hp;
    const int nh = (int)hp->n_head, nhk = (int)hp->n_head_kv;
    const int hk = (int)hp->n_embd_head_k, hv = (int)hp->n_embd_head_v;
    const int G = nh / nhk;
    const int64_t qd = (int64_t)nh * hk, od = (int64_t)nh * hv;
    const float scale = 1.0f / sqrtf((float)hk);
    const int simd = strata_quant_simd_level();
    float *sc = s->scores + (size_t)ith * s->n_ctx * G;
    const char *kc = s->k_cache[j->il], *vc = s->v_cache[j->il];
    const size_t kblk = (size_t)s->n_kv_k * 8; /* elements per block of 8 positions */
    const size_t vrow = (size_t)s->n_kv_v * s->kv_elt;
    const int n_items = j->n_tok * nhk;
    const int per = (n_items + nth - 1) / nth;
    const int i0 = ith * per, i1 = i0 + per < n_items ? i0 + per : n_items;
    for (int it = i0; it < i1; it++) {
        const int t = it / nhk, hkv = it % nhk;
        const int n_pos = j->pos0 + t + 1;
        const float *q = s->q + (size_t)t * qd + (size_t)hkv * G * hk;
        float *o = s->att + (size_t)t * od + (size_t)hkv * G * hv;
        const char *kb = kc + (size_t)hkv * hk * 8 * s->kv_elt;
        const char *vb = vc + (size_t)hkv * hv * s->kv_elt;
#ifdef HAVE_X86
        if (simd >= STRATA_SIMD_AVX2 && s->kv_f16 && hv % 8 == 0) {
            attn_item_avx2_f16(q, G, hk, hv, n_pos, (const uint16_t *)kb, kblk,
                               (const uint16_t *)vb, vrow / 2, scale, sc, o, (size_t)hv);
            continue;
        }
#endif
        attn_item(s, simd, q, G, hk, hv, n_pos, kb, kblk, vb, vrow, scale, sc, o, (size_t)hv);
    }
}

/* keys: element (pos, c) of the [n_kv_k] row at ((pos / 8) * n_kv_k + c) * 8 + pos % 8 */
static void k_store(struct cpu_state *s, void *cache, const float *src, int pos)
{
    const size_t base = (size_t)(pos / 8) * s->n_kv_k * 8 + pos % 8;
    for (int64_t c = 0; c < s->n_kv_k; c++) {
        if (s->kv_f16)
            ((uint16_t *)cache)[base + (size_t)c * 8] = strata_f32_to_f16(src[c]);
        else
            ((float *)cache)[base + (size_t)c * 8] = src[c];
    }
}

static void kv_store(struct cpu_state *s, void *cache, const float *src, int64_t n, int pos)
{
    char *dst = (char *)cache + (size_t)pos * n * s->kv_elt;
    if (s->kv_f16) {
        uint16_t *h = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++)
            h[i] = strata_f32_to_f16(src[i]);
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

/* ---- MoE ---- */

/* softmax over the n_expert router logits, top-k by probability (the lower
 * index first on ties), weights renormalised when expert_weights_norm. */
static void route(const struct strata_hparams *hp, const float *logits, int32_t *sel,
                  float *w)
{
    const int X = (int)hp->n_expert, K = (int)hp->n_expert_used;
    float p[512];
    float mx = -INFINITY;
    for (int e = 0; e < X; e++)
        if (logits[e] > mx)
            mx = logits[e];
    double sum = 0;
    for (int e = 0; e < X; e++) {
        p[e] = expf(logits[e] - mx);
        sum += p[e];
    }
    for (int e = 0; e < X; e++)
        p[e] = (float)(p[e] / sum);
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < X; e++) {
            int taken = 0;
            for (int j = 0; j < k; j++)
                if (sel[j] == e)
                    taken = 1;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = e;
        }
        sel[k] = best;
        w[k] = p[best];
    }
    if (hp->expert_weights_norm) {
        float ws = 0;
        for (int k = 0; k < K; k++)
            ws += w[k];
        for (int k = 0; k < K; k++)
            w[k] /= ws;
    }
    for (int k = 0; k < K; k++)
        w[k] *= hp->expert_weights_scale;
}

/* Dense SwiGLU FFN: y = down(silu(gate x) * up x) for the n rows of a. */
static void swiglu_ffn(struct cpu_state *s, struct act_cache *a,
                       const struct strata_weight *g, const struct strata_weight *u,
                       const struct strata_weight *d, float *y)
{
    const int n = a->n_tok;
    const int64_t F = g->ne[1];
    struct mm_task t[2];
    t[0] = mm_task_of(s, a, g, 0, s->ge, F);
    t[1] = mm_task_of(s, a, u, 0, s->ue, F);
    mm_run(s, t, 2);
    for (int64_t i = 0; i < (int64_t)n * F; i++)
        s->ge[i] = silu(s->ge[i]) * s->ue[i];
    struct act_cache h;
    act_init(&h, s->ge, F, n, s->aq8_0b, s->aq8_kb);
    t[0] = mm_task_of(s, &h, d, 0, y, d->ne[1]);
    mm_run(s, t, 1);
}

/* Routed experts: every (token, slot) pair is grouped by expert; each
 * expert's rows are one task over its tokens, all experts in one job. */
static void moe_ffn(struct cpu_state *s, int il, int n_tok)
{
    const struct strata_model *m = s->m;
    const struct strata_hparams *hp = &m->hp;
    const struct strata_layer *ly = &m->layers[il];
    const int64_t E = hp->n_embd, F = hp->n_ff_exp;
    const int X = (int)hp->n_expert, K = (int)hp->n_expert_used;
    double t0 = s->profile ? now_ms() : 0;
    struct act_cache a;
    act_init(&a, s->cur, E, n_tok, s->aq8_0, s->aq8_k);
    struct mm_task *tk = s->tasks;
    tk[0] = mm_task_of(s, &a, &ly->ffn_gate_inp, 0, s->router, X);
    mm_run(s, tk, 1);
    for (int t = 0; t < n_tok; t++)
        route(hp, s->router + (size_t)t * X, s->sel + (size_t)t * K, s->selw + (size_t)t * K);
    if (s->route_trace)
        s->route_trace(s->route_trace_ctx, il, s->pos0, n_tok, K, s->sel);
    /* group (token, slot) pairs by expert, in (token, slot) order inside each */
    memset(s->ecount, 0, sizeof(int32_t) * (X + 1));
    for (int i = 0; i < n_tok * K; i++)
        s->ecount[s->sel[i] + 1]++;
    for (int e = 0; e < X; e++)
        s->ecount[e + 1] += s->ecount[e];
    int32_t pos[512];
    for (int e = 0; e < X; e++)
        pos[e] = s->ecount[e];
    for (int i = 0; i < n_tok * K; i++) {
        int g = pos[s->sel[i]]++;
        s->elist[g] = i;
        s->inv[i] = g;
    }
    const int n_pairs = n_tok * K;
    if (s->profile) {
        double t1 = now_ms();
        s->prof[PROF_ROUTER] += t1 - t0;
        t0 = t1;
    }
    /* gather the activations of each pair (already in the experts' dot form) */
    size_t stride, ustride;
    const char *xa = act_get(s, &a, ly->ffn_gate_exps.type, &stride);
    const char *xu = act_get(s, &a, ly->ffn_up_exps.type, &ustride);
    for (int g = 0; g < n_pairs; g++)
        memcpy(s->xg + (size_t)g * stride, xa + (size_t)(s->elist[g] / K) * stride, stride);
    const char *ug = s->xg; /* up reads the same rows unless its form differs */
    if (xu != xa) {
        for (int g = 0; g < n_pairs; g++)
            memcpy(s->xg2 + (size_t)g * ustride, xu + (size_t)(s->elist[g] / K) * ustride,
                   ustride);
        ug = s->xg2;
    }
    int nt = 0;
    strata_vec_dot_fn gdot = strata_quant_vec_dot_fn(ly->ffn_gate_exps.type,
                                                     strata_quant_simd_level());
    strata_vec_dot_fn udot = strata_quant_vec_dot_fn(ly->ffn_up_exps.type,
                                                     strata_quant_simd_level());
    for (int e = 0; e < X; e++) {
        const int b = s->ecount[e], n = s->ecount[e + 1] - b;
        if (n == 0)
            continue;
        struct mm_task *t = &tk[nt++];
        memset(t, 0, sizeof *t);
        t->w = mat_of(&ly->ffn_gate_exps, e);
        t->act = s->xg + (size_t)b * stride;
        t->act_stride = stride;
        t->n_tok = n;
        t->y = s->ge + (size_t)b * F;
        t->ldy = F;
        t->dot = gdot;
        tk[nt] = *t;
        tk[nt].w = mat_of(&ly->ffn_up_exps, e);
        tk[nt].act = ug + (size_t)b * ustride;
        tk[nt].act_stride = ustride;
        tk[nt].y = s->ue + (size_t)b * F;
        tk[nt].dot = udot;
        nt++;
    }
    mm_run(s, tk, nt);
    for (int64_t i = 0; i < (int64_t)n_pairs * F; i++)
        s->ge[i] = silu(s->ge[i]) * s->ue[i];
    struct act_cache h;
    act_init(&h, s->ge, F, n_pairs, s->aq8_0b, s->aq8_kb);
    const char *ha = act_get(s, &h, ly->ffn_down_exps.type, &stride);
    strata_vec_dot_fn ddot = strata_quant_vec_dot_fn(ly->ffn_down_exps.type,
                                                     strata_quant_simd_level());
    nt = 0;
    for (int e = 0; e < X; e++) {
        const int b = s->ecount[e], n = s->ecount[e + 1] - b;
        if (n == 0)
            continue;
        struct mm_task *t = &tk[nt++];
        memset(t, 0, sizeof *t);
        t->w = mat_of(&ly->ffn_down_exps, e);
        t->act = ha + (size_t)b * stride;
        t->act_stride = stride;
        t->n_tok = n;
        t->y = s->ye + (size_t)b * E;
        t->ldy = E;
        t->dot = ddot;
    }
    mm_run(s, tk, nt);
    /* weighted sum in slot order (fixed per token, whatever the batch) */
    for (int t = 0; t < n_tok; t++) {
        float *o = s->tmp + (size_t)t * E;
        for (int64_t i = 0; i < E; i++)
            o[i] = 0;
        for (int k = 0; k < K; k++) {
            const float w = s->selw[t * K + k];
            const float *src = s->ye + (size_t)s->inv[t * K + k] * E;
            for (int64_t i = 0; i < E; i++)
                o[i] += w * src[i];
        }
    }
    if (ly->ffn_gate_shexp.data) {
        swiglu_ffn(s, &a, &ly->ffn_gate_shexp, &ly->ffn_up_shexp, &ly->ffn_down_shexp, s->ye);
        for (int t = 0; t < n_tok; t++) {
            const float gate = 1.0f / (1.0f + expf(-dot_f32(s->shexp_gate[il],
                                                            s->cur + (size_t)t * E, (int)E)));
            for (int64_t i = 0; i < E; i++)
                s->tmp[(size_t)t * E + i] += gate * s->ye[(size_t)t * E + i];
        }
    }
    if (s->profile)
        s->prof[PROF_EXPERTS] += now_ms() - t0;
}

static int cpu_forward(void *state, const struct strata_batch *b, float *logits,
                       struct strata_err *err)
{
    struct cpu_state *s = state;
    const struct strata_model *m = s->m;
    const struct strata_hparams *hp = &m->hp;
    const int n = b->n_tok, pos0 = b->pos0;
    const int64_t E = hp->n_embd;
    const int nh = (int)hp->n_head, nhk = (int)hp->n_head_kv;
    const int hk = (int)hp->n_embd_head_k;
    const int64_t qd = (int64_t)nh * hk, od = (int64_t)nh * hp->n_embd_head_v;
    double t0 = s->profile ? now_ms() : 0, t1;
    (void)err;
    s->pos0 = pos0;
#define PROF(slot)                          \
    do {                                    \
        if (s->profile) {                   \
            t1 = now_ms();                  \
            s->prof[slot] += t1 - t0;       \
            t0 = t1;                        \
        }                                   \
    } while (0)

    if (b->embd) {
        memcpy(s->x, b->embd, sizeof(float) * (size_t)n * E);
    } else {
        for (int t = 0; t < n; t++)
            strata_quant_dequant_row(m->tok_embd.type,
                                     (const char *)m->tok_embd.data +
                                         (size_t)b->ids[t] * m->tok_embd.nb1,
                                     s->x + (size_t)t * E, E);
    }
    PROF(PROF_EMBD);

    for (int il = 0; il < (int)hp->n_layer; il++) {
        const struct strata_layer *ly = &m->layers[il];
        for (int t = 0; t < n; t++)
            rms_norm(s->x + (size_t)t * E, s->attn_norm[il], s->cur + (size_t)t * E, E,
                     hp->f_norm_rms_eps);
        struct act_cache a;
        act_init(&a, s->cur, E, n, s->aq8_0, s->aq8_k);
        struct mm_task t3[3];
        t3[0] = mm_task_of(s, &a, &ly->wq, 0, s->q, qd);
        t3[1] = mm_task_of(s, &a, &ly->wk, 0, s->k, s->n_kv_k);
        t3[2] = mm_task_of(s, &a, &ly->wv, 0, s->v, s->n_kv_v);
        mm_run(s, t3, 3);
        for (int t = 0; t < n; t++) {
            float *q = s->q + (size_t)t * qd, *k = s->k + (size_t)t * s->n_kv_k;
            float *v = s->v + (size_t)t * s->n_kv_v;
            if (s->bq[il])
                for (int64_t i = 0; i < qd; i++)
                    q[i] += s->bq[il][i];
            if (s->bk[il])
                for (int64_t i = 0; i < s->n_kv_k; i++)
                    k[i] += s->bk[il][i];
            if (s->bv[il])
                for (int64_t i = 0; i < s->n_kv_v; i++)
                    v[i] += s->bv[il][i];
            for (int h = 0; h < nh; h++) {
                float *qh = q + (size_t)h * hk;
                if (s->q_norm[il])
                    rms_norm(qh, s->q_norm[il], qh, hk, hp->f_norm_rms_eps);
                rope_apply(s, qh, pos0 + t);
            }
            for (int h = 0; h < nhk; h++) {
                float *kh = k + (size_t)h * hk;
                if (s->k_norm[il])
                    rms_norm(kh, s->k_norm[il], kh, hk, hp->f_norm_rms_eps);
                rope_apply(s, kh, pos0 + t);
            }
            k_store(s, s->k_cache[il], k, pos0 + t);
            kv_store(s, s->v_cache[il], v, s->n_kv_v, pos0 + t);
        }
        PROF(PROF_QKV);
        struct attn_job aj = { s, il, n, pos0 };
        int64_t work = (int64_t)n * nh * (pos0 + n) * hk;
        strata_pool_run(work < MM_INLINE_MACS ? NULL : s->pool, attn_worker, &aj);
        PROF(PROF_ATTN);
        struct act_cache ao;
        act_init(&ao, s->att, od, n, s->aq8_0, s->aq8_k);
        t3[0] = mm_task_of(s, &ao, &ly->wo, 0, s->tmp, E);
        mm_run(s, t3, 1);
        for (int64_t i = 0; i < (int64_t)n * E; i++)
            s->x[i] += s->tmp[i];
        PROF(PROF_WO);

        for (int t = 0; t < n; t++)
            rms_norm(s->x + (size_t)t * E, s->ffn_norm[il], s->cur + (size_t)t * E, E,
                     hp->f_norm_rms_eps);
        if (ly->is_moe) {
            moe_ffn(s, il, n);
            if (s->profile)
                t0 = now_ms();
        } else {
            act_init(&a, s->cur, E, n, s->aq8_0, s->aq8_k);
            swiglu_ffn(s, &a, &ly->ffn_gate, &ly->ffn_up, &ly->ffn_down, s->tmp);
            PROF(PROF_FFN);
        }
        for (int64_t i = 0; i < (int64_t)n * E; i++)
            s->x[i] += s->tmp[i];
    }

    if (b->logits != STRATA_LOGITS_NONE && logits) {
        const int first = b->logits == STRATA_LOGITS_ALL ? 0 : n - 1;
        const int cnt = n - first;
        for (int t = first; t < n; t++)
            rms_norm(s->x + (size_t)t * E, s->out_norm, s->cur + (size_t)(t - first) * E, E,
                     hp->f_norm_rms_eps);
        struct act_cache a;
        act_init(&a, s->cur, E, cnt, s->aq8_0, s->aq8_k);
        struct mm_task t1o = mm_task_of(s, &a, &m->output, 0, logits, hp->n_vocab);
        mm_run(s, &t1o, 1);
    }
    PROF(PROF_OUT);
    s->prof_tok += n;
#undef PROF
    return 0;
}

static int cpu_kv_rollback(void *state, int32_t n_past, struct strata_err *err)
{
    (void)state;
    (void)n_past;
    (void)err;
    return 0; /* positions >= n_past are overwritten before they are read */
}

const struct strata_backend_ops strata_backend_cpu_ops = {
    "cpu", cpu_init, cpu_free, cpu_forward, cpu_kv_rollback, NULL, NULL, 0, 0, NULL,
};

#ifdef STRATA_WITH_GPU
extern const struct strata_backend_ops strata_backend_gpu_ops;
#endif

int strata_engine_find_backend(const char *name, const struct strata_backend_ops **out,
                               struct strata_err *err)
{
    if (!name || strcmp(name, "cpu") == 0) {
        *out = &strata_backend_cpu_ops;
        return 0;
    }
#ifdef STRATA_WITH_GPU
    if (strcmp(name, "auto") == 0 && strata_backend_gpu_ops.n_devices &&
        strata_backend_gpu_ops.n_devices() == 0) {
        strata_log_info("backend auto: no %s device found, using the cpu backend",
                        strata_backend_gpu_ops.name);
        *out = &strata_backend_cpu_ops;
        return 0;
    }
    if (strcmp(name, "auto") == 0 || strcmp(name, strata_backend_gpu_ops.name) == 0 ||
        strcmp(name, "gpu") == 0) {
        *out = &strata_backend_gpu_ops;
        return 0;
    }
#else
    if (strcmp(name, "auto") == 0) {
        *out = &strata_backend_cpu_ops;
        return 0;
    }
    if (strcmp(name, "cuda") == 0 || strcmp(name, "hip") == 0 || strcmp(name, "gpu") == 0)
        return strata_err_set(err, STRATA_E_UNSUPPORTED,
                              "backend '%s' is not in this build (built for the cpu only; "
                              "build with 'make cuda' or 'make hip')", name);
#endif
    return strata_err_set(err, STRATA_E_UNSUPPORTED, "unknown backend '%s' (cpu, auto%s)",
                          name,
#ifdef STRATA_WITH_GPU
                          ", cuda, hip"
#else
                          ""
#endif
    );
}

/* ------------------------------------------------------------------------ */
/* engine                                                                   */

struct strata_engine {
    struct strata_gguf *owned_g;
    const struct strata_gguf *g;
    struct strata_model *m;
    struct strata_pool *pool;
    const struct strata_backend_ops *ops;
    void *bstate;
    struct strata_engine_opts o;
    int32_t n_past;
    int32_t *hist; /* [n_ctx] */
    float *argmax_row; /* [n_vocab] strata_engine_eval_row's row (and _argmax's and
                          _topk's on backends without them) where the backend has no
                          host row (row_buffer), made on first use */
};

void strata_engine_opts_init(struct strata_engine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_prefill = 512;
    o->kv_type = STRATA_KV_F16;
    o->backend = "cpu";
    o->device = -1;
    o->topk_min_vocab = 32768;
}

/* Point the routed-expert weights at the pack's copy of them: a (data,
 * bytes per expert) pair per tensor, which in a repacked pack lies inside
 * experts.bin with the record size as stride (lib/pack.h). */
static int use_pack_experts(struct strata_model *m, const struct strata_pack *p,
                            struct strata_err *err)
{
    if (strata_pack_mode(p) != STRATA_PACK_REPACKED)
        return 0; /* native: the GGUF's own bytes */
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        struct strata_weight *w[3] = {&m->layers[il].ffn_gate_exps, &m->layers[il].ffn_up_exps,
                                      &m->layers[il].ffn_down_exps};
        for (int k = 0; k < 3; k++) {
            const void *data;
            size_t stride;
            if (!w[k]->data)
                continue;
            int rc = strata_pack_expert_tensor(p, w[k]->name, &data, &stride, err);
            if (rc)
                return rc;
            w[k]->data = data;
            w[k]->nb2 = stride;
        }
    }
    return 0;
}

int strata_engine_open_gguf(struct strata_engine **out, const struct strata_gguf *g,
                            const struct strata_engine_opts *o, struct strata_err *err)
{
    struct strata_engine *e = NULL;
    int rc;
    *out = NULL;
    e = calloc(1, sizeof *e);
    if (!e)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    if (o)
        e->o = *o;
    else
        strata_engine_opts_init(&e->o);
    /* STRATA_TOPK_MIN_VOCAB=N: topk_min_vocab for measurements (0: the device's top-k
     * whatever the vocabulary) */
    const char *tmv = getenv("STRATA_TOPK_MIN_VOCAB");
    if (tmv && *tmv)
        e->o.topk_min_vocab = atoi(tmv);
    e->g = g;
    if (e->o.n_threads < 0 || e->o.n_threads > 512) {
        rc = strata_err_set(err, STRATA_E_INVALID, "threads %d out of range (1..512)",
                            e->o.n_threads);
        goto out;
    }
    if (e->o.n_ctx < 0 || e->o.n_prefill < 0) {
        rc = strata_err_set(err, STRATA_E_INVALID, "ctx %d / prefill %d must be >= 0",
                            e->o.n_ctx, e->o.n_prefill);
        goto out;
    }
    if (e->o.kv_type != STRATA_KV_F16 && e->o.kv_type != STRATA_KV_F32) {
        rc = strata_err_set(err, STRATA_E_INVALID, "kv cache type %d is not f16 or f32",
                            e->o.kv_type);
        goto out;
    }
    if ((rc = strata_model_load(&e->m, g, err)))
        goto out;
    if (e->o.pack && (rc = use_pack_experts(e->m, e->o.pack, err)))
        goto out;
    if (e->o.n_ctx == 0)
        e->o.n_ctx = e->m->hp.n_ctx_train < 4096 ? (int)e->m->hp.n_ctx_train : 4096;
    if (e->o.n_ctx > (1 << 24)) {
        rc = strata_err_set(err, STRATA_E_INVALID, "ctx %d too large", e->o.n_ctx);
        goto out;
    }
    if (e->o.n_prefill == 0)
        e->o.n_prefill = 512;
    if (e->o.n_prefill > e->o.n_ctx)
        e->o.n_prefill = e->o.n_ctx;
    if (e->o.backend_ops)
        e->ops = e->o.backend_ops;
    else if ((rc = strata_engine_find_backend(e->o.backend, &e->ops, err)))
        goto out;
    if (e->o.pool)
        e->pool = e->o.pool;
    else if ((rc = strata_pool_create(&e->pool, e->o.n_threads, err)))
        goto out;
    e->o.n_threads = strata_pool_n_threads(e->pool);
    e->hist = calloc((size_t)e->o.n_ctx, sizeof *e->hist);
    if (!e->hist) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = e->ops->init(&e->bstate, e->m, &e->o, e->pool, err)))
        goto out;
    *out = e;
    e = NULL;
out:
    strata_engine_close(e);
    return rc;
}

int strata_engine_open(struct strata_engine **out, const char *path,
                       const struct strata_engine_opts *o, struct strata_err *err)
{
    struct strata_gguf *g = NULL;
    int rc;
    *out = NULL;
    if ((rc = strata_gguf_open(&g, path, err)))
        return rc;
    if ((rc = strata_engine_open_gguf(out, g, o, err))) {
        strata_err_wrap(err, "'%s': ", path);
        strata_gguf_close(g);
        return rc;
    }
    (*out)->owned_g = g;
    return 0;
}

void strata_engine_close(struct strata_engine *e)
{
    if (!e)
        return;
    if (e->ops && e->bstate)
        e->ops->free(e->bstate);
    if (!e->o.pool)
        strata_pool_free(e->pool);
    strata_model_free(e->m);
    free(e->hist);
    free(e->argmax_row);
    strata_gguf_close(e->owned_g);
    free(e);
}

const struct strata_model *strata_engine_model(const struct strata_engine *e) { return e->m; }
const struct strata_gguf *strata_engine_gguf(const struct strata_engine *e) { return e->g; }
struct strata_pool *strata_engine_pool(const struct strata_engine *e) { return e->pool; }
const char *strata_engine_backend_name(const struct strata_engine *e) { return e->ops->name; }
int32_t strata_engine_n_vocab(const struct strata_engine *e) { return (int32_t)e->m->hp.n_vocab; }
int32_t strata_engine_n_ctx(const struct strata_engine *e) { return e->o.n_ctx; }
int32_t strata_engine_n_prefill(const struct strata_engine *e) { return e->o.n_prefill; }
int strata_engine_n_threads(const struct strata_engine *e) { return e->o.n_threads; }

int strata_engine_expert_stats(struct strata_engine *e, struct strata_expert_cache **ec,
                               struct strata_ec_times *t)
{
    if (!e->ops->expert_stats)
        return 0;
    return e->ops->expert_stats(e->bstate, 0, ec, t);
}

void strata_engine_expert_stats_reset(struct strata_engine *e)
{
    if (e->ops->expert_stats)
        (void)e->ops->expert_stats(e->bstate, 1, NULL, NULL);
}
int32_t strata_engine_n_past(const struct strata_engine *e) { return e->n_past; }
const int32_t *strata_engine_history(const struct strata_engine *e) { return e->hist; }

static int eval_common(struct strata_engine *e, const int32_t *ids, const float *embd,
                       int32_t n_tok, int mode, int32_t top_k, int want_lse, float *logits,
                       struct strata_err *err)
{
    const int32_t n_vocab = (int32_t)e->m->hp.n_vocab;
    if (n_tok < 1)
        return strata_err_set(err, STRATA_E_INVALID, "batch of %d tokens (need >= 1)", n_tok);
    if (mode != STRATA_LOGITS_NONE && !logits)
        return strata_err_set(err, STRATA_E_INVALID, "logits requested into a NULL buffer");
    if ((int64_t)e->n_past + n_tok > e->o.n_ctx)
        return strata_err_set(err, STRATA_E_LIMIT,
                              "context full: %d positions in the kv cache + %d new > ctx %d",
                              e->n_past, n_tok, e->o.n_ctx);
    if (ids)
        for (int32_t i = 0; i < n_tok; i++)
            if (ids[i] < 0 || ids[i] >= n_vocab)
                return strata_err_set(err, STRATA_E_INVALID,
                                      "token id %d at batch index %d is outside the "
                                      "vocabulary (0..%d)", ids[i], i, n_vocab - 1);
    const int32_t ub = e->o.n_prefill;
    const int32_t start = e->n_past;
    for (int32_t off = 0; off < n_tok; off += ub) {
        int32_t cnt = n_tok - off < ub ? n_tok - off : ub;
        struct strata_batch b;
        b.n_tok = cnt;
        b.ids = ids ? ids + off : NULL;
        b.embd = embd ? embd + (size_t)off * e->m->hp.n_embd : NULL;
        b.pos0 = start + off;
        b.top_k = top_k;
        b.lse = want_lse;
        float *lo = NULL;
        if (mode == STRATA_LOGITS_ALL) {
            b.logits = STRATA_LOGITS_ALL;
            lo = logits + (size_t)off * n_vocab;
        } else if ((mode == STRATA_LOGITS_LAST || mode == STRATA_LOGITS_ARGMAX ||
                    mode == STRATA_LOGITS_TOPK) &&
                   off + cnt == n_tok) {
            b.logits = mode;
            lo = logits;
        } else {
            b.logits = STRATA_LOGITS_NONE;
        }
        int rc = e->ops->forward(e->bstate, &b, lo, err);
        if (rc) {
            e->n_past = start;
            return rc;
        }
        for (int32_t i = 0; i < cnt; i++)
            e->hist[start + off + i] = ids ? ids[off + i] : -1;
        e->n_past = start + off + cnt;
    }
    return 0;
}

/* The modes whose output is not logits belong to their own calls: refused here. */
static int reduced_mode(int mode, struct strata_err *err)
{
    if (mode == STRATA_LOGITS_ARGMAX)
        return strata_err_set(err, STRATA_E_INVALID, "logits mode ARGMAX is "
                              "strata_engine_eval_argmax's");
    if (mode == STRATA_LOGITS_TOPK)
        return strata_err_set(err, STRATA_E_INVALID, "logits mode TOPK is "
                              "strata_engine_eval_topk's");
    return 0;
}

int strata_engine_eval(struct strata_engine *e, const int32_t *ids, int32_t n_tok,
                       int logits_mode, float *logits, struct strata_err *err)
{
    if (!ids)
        return strata_err_set(err, STRATA_E_INVALID, "NULL token ids");
    int rc = reduced_mode(logits_mode, err);
    if (rc)
        return rc;
    return eval_common(e, ids, NULL, n_tok, logits_mode, 0, 0, logits, err);
}

/* The host row of strata_engine_eval_row (and of the argmax and top-k modes done on
 * the host): the backend's, or the engine's own, allocated at first use; NULL: out of
 * memory. */
static float *row_buffer(struct strata_engine *e)
{
    float *r = e->ops->host_row ? e->ops->host_row(e->bstate) : NULL;
    if (r)
        return r;
    if (!e->argmax_row)
        e->argmax_row = malloc(sizeof(float) * (size_t)e->m->hp.n_vocab);
    return e->argmax_row;
}

/* The last position's logits into row_buffer's row, *r set to it (on success). */
static int eval_last_row(struct strata_engine *e, const int32_t *ids, int32_t n_tok,
                         const float **r, struct strata_err *err)
{
    float *b = row_buffer(e);
    if (!b)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    int rc = eval_common(e, ids, NULL, n_tok, STRATA_LOGITS_LAST, 0, 0, b, err);
    if (!rc)
        *r = b;
    return rc;
}

int strata_engine_eval_row(struct strata_engine *e, const int32_t *ids, int32_t n_tok,
                           const float **row, struct strata_err *err)
{
    if (!ids || !row)
        return strata_err_set(err, STRATA_E_INVALID, "NULL token ids or row output");
    return eval_last_row(e, ids, n_tok, row, err);
}

int strata_engine_eval_argmax(struct strata_engine *e, const int32_t *ids, int32_t n_tok,
                              int32_t *next, struct strata_err *err)
{
    if (!ids || !next)
        return strata_err_set(err, STRATA_E_INVALID, "NULL token ids or id output");
    if (e->ops->argmax)
        return eval_common(e, ids, NULL, n_tok, STRATA_LOGITS_ARGMAX, 0, 0, (float *)next, err);
    const float *r = NULL;
    int rc = eval_last_row(e, ids, n_tok, &r, err);
    if (!rc)
        *next = strata_sampler_argmax(r, (int32_t)e->m->hp.n_vocab);
    return rc;
}

int strata_engine_eval_topk(struct strata_engine *e, const int32_t *ids, int32_t n_tok,
                            int32_t top_k, int32_t *top_ids, float *top_vals, double *lse,
                            struct strata_err *err)
{
    const int32_t n_vocab = (int32_t)e->m->hp.n_vocab;
    if (!ids || !top_ids || !top_vals)
        return strata_err_set(err, STRATA_E_INVALID, "NULL token ids or top-k output");
    if (top_k < 1 || top_k > STRATA_SAMPLER_TOPK_MAX || top_k > n_vocab)
        return strata_err_set(err, STRATA_E_INVALID, "top_k %d outside 1..%d", top_k,
                              n_vocab < STRATA_SAMPLER_TOPK_MAX ? n_vocab
                                                                : STRATA_SAMPLER_TOPK_MAX);
    if (e->ops->topk_max >= top_k && n_vocab >= e->o.topk_min_vocab) {
        /* ids, values, then the log-sum-exp (a double at byte 8 top_k: aligned) */
        double buf[STRATA_SAMPLER_TOPK_MAX + 1];
        int rc = eval_common(e, ids, NULL, n_tok, STRATA_LOGITS_TOPK, top_k, lse != NULL,
                             (float *)buf, err);
        if (!rc) {
            memcpy(top_ids, buf, sizeof(int32_t) * (size_t)top_k);
            memcpy(top_vals, (int32_t *)buf + top_k, sizeof(float) * (size_t)top_k);
            if (lse)
                memcpy(lse, buf + top_k, sizeof *lse);
        }
        return rc;
    }
    const float *r = NULL;
    int rc = eval_last_row(e, ids, n_tok, &r, err);
    if (!rc) {
        strata_sampler_topk(r, n_vocab, top_k, top_ids, top_vals);
        if (top_ids[0] < 0)
            return strata_err_set(err, STRATA_E_INTERNAL, "step at position %d: no logit is "
                                  "a number (every one NaN)", e->n_past - 1);
        if (lse)
            *lse = strata_sampler_log_sum_exp(r, n_vocab);
    }
    return rc;
}

int strata_engine_eval_embd(struct strata_engine *e, const float *embd, int32_t n_tok,
                            int logits_mode, float *logits, struct strata_err *err)
{
    if (!embd)
        return strata_err_set(err, STRATA_E_INVALID, "NULL embeddings");
    int rc = reduced_mode(logits_mode, err);
    if (rc)
        return rc;
    return eval_common(e, NULL, embd, n_tok, logits_mode, 0, 0, logits, err);
}

int strata_engine_rollback(struct strata_engine *e, int32_t n_past, struct strata_err *err)
{
    if (n_past < 0 || n_past > e->n_past)
        return strata_err_set(err, STRATA_E_INVALID,
                              "rollback to %d positions, the kv cache holds %d", n_past,
                              e->n_past);
    int rc = e->ops->kv_rollback(e->bstate, n_past, err);
    if (rc)
        return rc;
    e->n_past = n_past;
    return 0;
}

int32_t strata_engine_common_prefix(const struct strata_engine *e, const int32_t *ids,
                                    int32_t n)
{
    int32_t i = 0;
    while (i < n && i < e->n_past && e->hist[i] == ids[i] && ids[i] >= 0)
        i++;
    return i;
}
