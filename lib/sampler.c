/* sampler.c - penalties, top-k, top-p, min-p, temperature, seeded draws. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct cand {
    int32_t id;
    float logit;
    float p;
};

struct strata_sampler {
    struct strata_sampler_params p;
    int32_t n_vocab;
    uint64_t rng[4];
    int32_t *hist;   /* every accepted token */
    size_t n_hist, cap_hist;
    int32_t *count;  /* [n_vocab] scratch, all zero between calls */
    float *work;     /* [n_vocab] penalised logits */
    float *prob;     /* [n_vocab] draw_all's weights */
    struct cand *cand; /* [n_vocab] */
};

void strata_sampler_params_init(struct strata_sampler_params *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->penalty_last_n = 64;
}

/* splitmix64 (Steele, Lea, Flood 2014) to seed xoshiro256** (Blackman and
 * Vigna 2018, prng.di.unimi.it). */
static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(uint64_t *s)
{
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* uniform in [0, 1) with 53 random bits */
static double rng_uniform(uint64_t *s)
{
    return (double)(xoshiro_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

void strata_sampler_reset(struct strata_sampler *s, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&x);
    s->n_hist = 0;
}

int strata_sampler_create(struct strata_sampler **out, const struct strata_sampler_params *p,
                          int32_t n_vocab, struct strata_err *err)
{
    struct strata_sampler *s = NULL;
    int rc = 0;
    *out = NULL;
    if (n_vocab < 1)
        return strata_err_set(err, STRATA_E_INVALID, "n_vocab %d < 1", n_vocab);
    if (!(p->top_p >= 0 && p->top_p <= 1))
        return strata_err_set(err, STRATA_E_INVALID, "top_p %g outside [0, 1]", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return strata_err_set(err, STRATA_E_INVALID, "min_p %g outside [0, 1]", p->min_p);
    if (!(p->repeat_penalty > 0))
        return strata_err_set(err, STRATA_E_INVALID, "repeat_penalty %g must be > 0",
                              p->repeat_penalty);
    if (!isfinite(p->temperature) || !isfinite(p->presence_penalty) ||
        !isfinite(p->frequency_penalty))
        return strata_err_set(err, STRATA_E_INVALID, "temperature and penalties must be finite");
    s = calloc(1, sizeof *s);
    if (!s)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->count = calloc((size_t)n_vocab, sizeof *s->count);
    s->work = malloc((size_t)n_vocab * sizeof *s->work);
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    s->prob = malloc((size_t)n_vocab * sizeof *s->prob);
    if (!s->count || !s->work || !s->cand || !s->prob) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    strata_sampler_reset(s, p->seed);
    *out = s;
    s = NULL;
out:
    strata_sampler_free(s);
    return rc;
}

void strata_sampler_free(struct strata_sampler *s)
{
    if (!s)
        return;
    free(s->hist);
    free(s->count);
    free(s->work);
    free(s->cand);
    free(s->prob);
    free(s);
}

void strata_sampler_accept(struct strata_sampler *s, const int32_t *ids, size_t n)
{
    if (s->n_hist + n > s->cap_hist) {
        size_t cap = s->cap_hist ? s->cap_hist : 256;
        while (cap < s->n_hist + n)
            cap *= 2;
        int32_t *h = realloc(s->hist, cap * sizeof *h);
        if (!h) {
            /* keep the most recent tokens we can hold: penalties see less */
            size_t keep = s->cap_hist < n ? s->cap_hist : n;
            if (keep) {
                memmove(s->hist, ids + n - keep, keep * sizeof *ids);
                s->n_hist = keep;
            }
            return;
        }
        s->hist = h;
        s->cap_hist = cap;
    }
    memcpy(s->hist + s->n_hist, ids, n * sizeof *ids);
    s->n_hist += n;
}

int32_t strata_sampler_argmax(const float *logits, int32_t n_vocab)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab; i++)
        if (logits[i] > logits[best] || logits[best] != logits[best]) /* NaN never wins */
            best = i;
    return best;
}

static double log_sum_exp(const float *logits, int32_t n, float *mx_out)
{
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (logits[i] > mx)
            mx = logits[i];
    double sum = 0; /* float exponentials (each exact to 1 ulp), summed in double; NaN
                       logits are left out, as the device's strata_k_logsumexp does */
    for (int32_t i = 0; i < n; i++)
        if (logits[i] == logits[i])
            sum += expf(logits[i] - mx);
    *mx_out = mx;
    return log(sum);
}

double strata_sampler_log_sum_exp(const float *logits, int32_t n_vocab)
{
    float mx;
    double lse = log_sum_exp(logits, n_vocab, &mx);
    return (double)mx + lse;
}

float strata_sampler_logprob(const float *logits, int32_t n_vocab, int32_t id)
{
    float mx;
    double lse = log_sum_exp(logits, n_vocab, &mx);
    return (float)((double)logits[id] - mx - lse);
}

/* 1 if p's penalties change no logit whatever the history. */
static int penalties_off(const struct strata_sampler_params *p)
{
    return p->penalty_last_n == 0 ||
           (p->repeat_penalty == 1.0f && p->presence_penalty == 0 && p->frequency_penalty == 0);
}

int strata_sampler_is_argmax(const struct strata_sampler *s)
{
    return s->p.temperature <= 0 && penalties_off(&s->p);
}

/* 1 if apply_penalties would change any logit. */
static int penalties_on(const struct strata_sampler *s)
{
    return !(s->n_hist == 0 || penalties_off(&s->p));
}

static void apply_penalties(struct strata_sampler *s, float *l)
{
    const struct strata_sampler_params *p = &s->p;
    if (!penalties_on(s))
        return;
    size_t n = p->penalty_last_n < 0 ? s->n_hist
               : (size_t)p->penalty_last_n < s->n_hist ? (size_t)p->penalty_last_n
               : s->n_hist;
    const int32_t *h = s->hist + s->n_hist - n;
    for (size_t i = 0; i < n; i++)
        if (h[i] >= 0 && h[i] < s->n_vocab)
            s->count[h[i]]++;
    for (size_t i = 0; i < n; i++) {
        int32_t id = h[i];
        if (id < 0 || id >= s->n_vocab || s->count[id] == 0)
            continue; /* done already */
        int32_t c = s->count[id];
        if (l[id] > 0)
            l[id] /= p->repeat_penalty;
        else
            l[id] *= p->repeat_penalty;
        l[id] -= (float)c * p->frequency_penalty + p->presence_penalty;
        s->count[id] = 0;
    }
}

/* the n_top largest of the raw logits, best first */
static void top_logprobs(const float *logits, int32_t n_vocab, struct strata_token_prob *top,
                         int n_top)
{
    float mx;
    double lse = log_sum_exp(logits, n_vocab, &mx);
    int n = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        float v = logits[i];
        if (n == n_top && !(v > logits[top[n - 1].id]))
            continue;
        int j = n < n_top ? n++ : n - 1;
        while (j > 0 && v > logits[top[j - 1].id]) {
            top[j] = top[j - 1];
            j--;
        }
        top[j].id = i;
    }
    for (int i = 0; i < n; i++)
        top[i].logprob = (float)((double)logits[top[i].id] - mx - lse);
    for (int i = n; i < n_top; i++) {
        top[i].id = -1;
        top[i].logprob = -INFINITY;
    }
}

/* x ranks before (w, j) in the candidates' order: larger logit first, the lower id
 * among equal ones (-0 equals +0), NaN after every number */
static inline int ranks_before(float v, int32_t i, float w, int32_t j)
{
    if (v != w) {
        if (w != w)
            return v == v;
        return v > w;
    }
    return i < j; /* equal, or both NaN */
}

/* The k best of logits [n] (0 < k <= n) into c [k], best first: one pass that keeps
 * the k best seen so far in order (k is small; most logits are below the k-th and
 * cost one comparison). */
static void topk_cands(const float *l, int32_t n, int32_t k, struct cand *c)
{
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (m == k && (i & 15) == 0 && i + 16 <= n) {
            /* 16 at a time while none beats the k-th: a later id never ranks
             * before an equal logit, and NaN compares false */
            const float t = c[k - 1].logit;
            int any = 0;
            for (int32_t j = 0; j < 16; j++)
                any |= l[i + j] > t || t != t;
            if (!any) {
                i += 15;
                continue;
            }
        }
        float v = l[i];
        if (m == k && !ranks_before(v, i, c[k - 1].logit, c[k - 1].id))
            continue;
        int32_t j = m < k ? m++ : k - 1;
        while (j > 0 && ranks_before(v, i, c[j - 1].logit, c[j - 1].id)) {
            c[j] = c[j - 1];
            j--;
        }
        c[j].id = i;
        c[j].logit = v;
    }
}

void strata_sampler_topk(const float *logits, int32_t n, int32_t k, int32_t *ids, float *vals)
{
    struct cand c[STRATA_SAMPLER_TOPK_MAX];
    if (k > STRATA_SAMPLER_TOPK_MAX)
        k = STRATA_SAMPLER_TOPK_MAX;
    if (k > n)
        k = n;
    if (k < 1)
        return;
    topk_cands(logits, n, k, c);
    for (int32_t i = 0; i < k; i++) { /* a NaN place: none, as the device's top-k says */
        const int nan = c[i].logit != c[i].logit;
        ids[i] = nan ? -1 : c[i].id;
        vals[i] = nan ? -INFINITY : c[i].logit;
    }
}

/* After top-k: top-p, min-p and temperature over the n candidates c (best first),
 * then the draw.  The probabilities are relative to the best candidate, before
 * temperature (llama.cpp's default chain applies top-p and min-p before temp). */
static int32_t draw_sorted(struct strata_sampler *s, struct cand *c, size_t n)
{
    const struct strata_sampler_params *p = &s->p;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        c[i].p = (float)exp((double)c[i].logit - c[0].logit);
        sum += c[i].p;
    }
    if (p->top_p < 1.0f) {
        double cum = 0;
        size_t keep = n;
        for (size_t i = 0; i < n; i++) {
            cum += c[i].p / sum;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p->min_p > 0) {
        /* p_i >= min_p * p_max  <=>  exp(l_i - l_max) >= min_p */
        size_t keep = 1;
        while (keep < n && c[keep].p >= p->min_p)
            keep++;
        n = keep;
    }
    /* temperature, then draw */
    sum = 0;
    for (size_t i = 0; i < n; i++) {
        c[i].p = (float)exp(((double)c[i].logit - c[0].logit) / p->temperature);
        sum += c[i].p;
    }
    double u = rng_uniform(s->rng) * sum, cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += c[i].p;
        if (u < cum)
            return c[i].id;
    }
    return c[n - 1].id;
}

/* the candidates' order as a qsort comparison: a total order, so results never
 * depend on the sort algorithm */
static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    return ranks_before(x->logit, x->id, y->logit, y->id) ? -1
           : ranks_before(y->logit, y->id, x->logit, x->id) ? 1 : 0;
}

/* Without top-k: the whole vocabulary.  Sorting 151,936 candidates cost 20 ms a token,
 * so only the ones top-p and min-p can keep are sorted: p_i = exp(l_i - l_max) for
 * every token (float), min-p keeps exactly {p_i >= min_p}, and top-p the shortest
 * sorted prefix whose sum reaches top_p of the total, found among {p_i >= t} for
 * falling t (those are a prefix of the sorted order, so the cut is the one a full sort
 * gives).  With neither the draw walks the vocabulary in id order. */
static int32_t draw_all(struct strata_sampler *s, const float *l)
{
    const struct strata_sampler_params *p = &s->p;
    const int32_t nv = s->n_vocab;
    struct cand *c = s->cand;
    float mx = l[0];
    for (int32_t i = 1; i < nv; i++)
        if (l[i] > mx || mx != mx)
            mx = l[i];
    double sum = 0;
    for (int32_t i = 0; i < nv; i++) {
        const float q = s->prob[i] = expf(l[i] - mx); /* NaN stays NaN: never kept */
        if (q == q)
            sum += q;
    }
    size_t n = (size_t)nv;
    int sorted = 0;
    if (p->top_p < 1.0f || p->min_p > 0) {
        static const float steps[] = { 1e-3f, 1e-6f, 1e-9f, 0.0f };
        for (size_t si = 0; si < sizeof steps / sizeof *steps; si++) {
            float t = p->min_p > 0 ? p->min_p : steps[si];
            n = 0;
            for (int32_t i = 0; i < nv; i++)
                if (s->prob[i] >= t) {
                    c[n].id = i;
                    c[n].logit = l[i];
                    c[n].p = s->prob[i];
                    n++;
                }
            qsort(c, n, sizeof *c, cand_cmp);
            size_t keep = n;
            int reached = p->top_p >= 1.0f;
            if (!reached) {
                double cum = 0;
                for (size_t i = 0; i < n; i++) {
                    cum += c[i].p / sum;
                    if (cum >= p->top_p) {
                        keep = i + 1;
                        reached = 1;
                        break;
                    }
                }
            }
            n = keep;
            if (reached || p->min_p > 0 || t == 0.0f)
                break;
        }
        sorted = 1;
    }
    if (n == 0)
        return strata_sampler_argmax(l, nv); /* every logit NaN */
    /* temperature, then draw (in sorted order, or the vocabulary's) */
    sum = 0;
    for (size_t i = 0; i < n; i++) {
        float v = sorted ? c[i].logit : l[i];
        float q = expf((v - mx) / p->temperature);
        if (sorted)
            c[i].p = q;
        else
            s->prob[i] = q == q ? q : 0;
        sum += sorted ? q : s->prob[i];
    }
    double u = rng_uniform(s->rng) * sum, cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += sorted ? c[i].p : s->prob[i];
        if (u < cum)
            return sorted ? c[i].id : (int32_t)i;
    }
    if (sorted)
        return c[n - 1].id;
    for (int32_t i = nv - 1; i > 0; i--) /* the last token that had any weight */
        if (s->prob[i] > 0)
            return i;
    return 0;
}

int32_t strata_sampler_sample(struct strata_sampler *s, const float *logits, float *logprob,
                              struct strata_token_prob *top, int n_top)
{
    const struct strata_sampler_params *p = &s->p;
    const int32_t nv = s->n_vocab;
    const float *l = logits;
    int32_t id;
    if (penalties_on(s)) {
        /* a copy only when penalties change it (608 KB a token at 151,936 tokens) */
        memcpy(s->work, logits, (size_t)nv * sizeof *s->work);
        apply_penalties(s, s->work);
        l = s->work;
    }
    if (p->temperature <= 0) {
        id = strata_sampler_argmax(l, nv);
    } else if (p->top_k > 0 && p->top_k < nv) {
        size_t n = (size_t)p->top_k;
        topk_cands(l, nv, p->top_k, s->cand);
        while (n > 1 && s->cand[n - 1].logit != s->cand[n - 1].logit)
            n--; /* NaN ranks last: not a candidate */
        id = draw_sorted(s, s->cand, n);
    } else {
        id = draw_all(s, l);
    }
    if (logprob)
        *logprob = strata_sampler_logprob(logits, nv, id);
    if (top && n_top > 0)
        top_logprobs(logits, nv, top, n_top);
    return id;
}

int strata_sampler_topk_k(const struct strata_sampler *s)
{
    const struct strata_sampler_params *p = &s->p;
    return p->temperature > 0 && penalties_off(p) && p->top_k > 0 && p->top_k < s->n_vocab &&
                   p->top_k <= STRATA_SAMPLER_TOPK_MAX
               ? p->top_k
               : 0;
}

int32_t strata_sampler_sample_topk(struct strata_sampler *s, const int32_t *ids,
                                   const float *vals, int32_t k)
{
    struct cand c[STRATA_SAMPLER_TOPK_MAX];
    if (k > STRATA_SAMPLER_TOPK_MAX)
        k = STRATA_SAMPLER_TOPK_MAX;
    while (k > 1 && ids[k - 1] < 0)
        k--; /* places with no number (strata_sampler_topk's -1) */
    if (k < 1)
        return -1;
    for (int32_t i = 0; i < k; i++) {
        c[i].id = ids[i];
        c[i].logit = vals[i];
    }
    return draw_sorted(s, c, (size_t)k);
}
