/* test_sampler.c - sampler: greedy, top-k, top-p, min-p, penalties, seeds. */
#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "sampler.h"
#include "tap.h"

#define NV 64

static void fill_logits(float *l)
{
    /* a smooth distribution with a clear best token (17) and many
     * plausible others */
    for (int i = 0; i < NV; i++)
        l[i] = -0.05f * (float)((i * 37) % NV);
    l[17] = 1.0f;
    l[3] = 0.9f;
}

static int draw(struct strata_sampler_params *p, const float *l, int n, int32_t *out)
{
    struct strata_sampler *s = NULL;
    struct strata_err err = { 0 };
    if (strata_sampler_create(&s, p, NV, &err)) {
        diag("create: %s", err.msg);
        return -1;
    }
    for (int i = 0; i < n; i++)
        out[i] = strata_sampler_sample(s, l, NULL, NULL, 0);
    strata_sampler_free(s);
    return 0;
}

static int n_distinct(const int32_t *a, int n)
{
    int seen[NV] = { 0 }, d = 0;
    for (int i = 0; i < n; i++)
        if (a[i] >= 0 && a[i] < NV && !seen[a[i]]++)
            d++;
    return d;
}


/* rank of (v, i) before (w, j): larger first, lower id on ties, NaN last */
static int before_ref(float v, int i, float w, int j)
{
    if (isnan(v) || isnan(w))
        return !isnan(v) && isnan(w) ? 1 : isnan(v) && isnan(w) ? i < j : 0;
    if (v == w)
        return i < j;
    return v > w;
}

/* the k best of l [n] by repeated scans (the definition, not the sampler's pass) */
static void topk_ref(const float *l, int n, int k, int32_t *ids)
{
    char *used = calloc((size_t)n, 1);
    for (int j = 0; j < k; j++) {
        int b = -1;
        for (int i = 0; i < n; i++)
            if (!used[i] && (b < 0 || before_ref(l[i], i, l[b], b)))
                b = i;
        used[b] = 1;
        ids[j] = b;
    }
    free(used);
}

static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

/* top-k of rows with ties, NaN, -0/+0 and -inf against topk_ref; k = 1, 7, 40, 64 */
static void test_topk(void)
{
    enum { N = 5000 };
    static float l[N];
    uint64_t x = 7;
    int good = 1;
    for (int round = 0; round < 6 && good; round++) {
        for (int i = 0; i < N; i++) {
            /* round 0-1: few distinct values (many ties); then continuous */
            l[i] = round < 2 ? (float)(lcg(&x) % 50) - 25.0f
                             : (float)((double)lcg(&x) / 2147483648.0 * 40.0 - 20.0);
        }
        if (round == 2) {
            l[10] = NAN;
            l[4000] = NAN;
            l[11] = 19.99999f;
        }
        if (round == 3) {
            for (int i = 0; i < N; i++)
                l[i] = (i % 3) ? -INFINITY : (i % 2 ? -0.0f : 0.0f);
        }
        if (round == 4)
            for (int i = 0; i < N; i++)
                l[i] = i % 5 ? NAN : l[i];
        const int ks[] = { 1, 7, 40, 64 };
        for (int q = 0; q < 4 && good; q++) {
            int k = ks[q];
            int32_t got[64], want[64];
            float vals[64];
            strata_sampler_topk(l, N, k, got, vals);
            topk_ref(l, N, k, want);
            for (int j = 0; j < k && good; j++) {
                if (isnan(l[want[j]])) /* no number left: none */
                    good = got[j] == -1 && vals[j] == -INFINITY;
                else
                    good = got[j] == want[j] && memcmp(&vals[j], &l[want[j]], 4) == 0;
                if (!good)
                    diag("round %d k %d: place %d has %d, the definition %d", round, k, j,
                         got[j], want[j]);
            }
        }
    }
    ok(good, "strata_sampler_topk: the k best, ties to the lower id, -0 equal to +0, NaN "
       "never (id -1, -inf)");
    int32_t few[4] = { -5, -5, -5, -5 };
    float v4[4];
    const float l3[3] = { 1, 3, 2 };
    strata_sampler_topk(l3, 3, 99, few, v4);
    ok(few[0] == 1 && few[1] == 2 && few[2] == 0 && few[3] == -5,
       "k above n is clamped to n (%d %d %d %d)", few[0], few[1], few[2], few[3]);
}

/* sample_topk on the k best gives sample's tokens on the whole row, draw for draw */
static void test_sample_topk(void)
{
    enum { V = 3000 };
    static float l[V];
    struct strata_sampler_params p;
    struct strata_sampler *a = NULL, *b = NULL;
    struct strata_err err = { 0 };
    strata_sampler_params_init(&p);
    p.temperature = 0.9f;
    p.seed = 11;
    p.top_p = 0.97f;
    p.min_p = 0.01f;
    int same = 1, k = 0, n_distinct_tok = 0;
    char seen[V] = { 0 };
    uint64_t x = 3;
    if (strata_sampler_create(&a, &p, V, &err) || strata_sampler_create(&b, &p, V, &err)) {
        ok(0, "samplers: %s", err.msg);
        return;
    }
    k = strata_sampler_topk_k(a);
    for (int r = 0; r < 300 && same; r++) {
        for (int i = 0; i < V; i++)
            l[i] = (float)((double)lcg(&x) / 2147483648.0 * 6.0);
        int32_t ids[STRATA_SAMPLER_TOPK_MAX];
        float vals[STRATA_SAMPLER_TOPK_MAX];
        strata_sampler_topk(l, V, k, ids, vals);
        int32_t t1 = strata_sampler_sample(a, l, NULL, NULL, 0);
        int32_t t2 = strata_sampler_sample_topk(b, ids, vals, k);
        same = t1 == t2;
        if (!seen[t1]++)
            n_distinct_tok++;
    }
    ok(k == 40 && same && n_distinct_tok > 50,
       "sample_topk draws sample's tokens (k %d, %d distinct tokens in 300 draws)", k,
       n_distinct_tok);
    strata_sampler_free(a);
    strata_sampler_free(b);

    /* when the k best are not enough */
    const struct {
        float temp, rp, pres;
        int top_k;
        const char *what;
    } no[] = { { 0, 1, 0, 40, "greedy" },       { 0.8f, 1.1f, 0, 40, "repeat penalty" },
               { 0.8f, 1, 0.5f, 40, "presence penalty" }, { 0.8f, 1, 0, 0, "top_k 0" },
               { 0.8f, 1, 0, 65, "top_k above the limit" } };
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
        strata_sampler_params_init(&p);
        p.temperature = no[i].temp;
        p.repeat_penalty = no[i].rp;
        p.presence_penalty = no[i].pres;
        p.top_k = no[i].top_k;
        if (strata_sampler_create(&a, &p, V, &err) == 0) {
            ok(strata_sampler_topk_k(a) == 0, "no top-k shortcut with %s", no[i].what);
            strata_sampler_free(a);
        }
    }
}

/* without top-k: top-p and min-p keep the sorted prefix a full sort defines */
static void test_no_topk(void)
{
    enum { V = 20000 };
    static float l[V], pr[V];
    uint64_t x = 5;
    for (int i = 0; i < V; i++)
        l[i] = (float)((double)lcg(&x) / 2147483648.0 * 12.0);
    float mx = l[0];
    for (int i = 1; i < V; i++)
        mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++)
        sum += pr[i] = expf(l[i] - mx);
    struct strata_sampler_params p;
    struct strata_sampler *s = NULL;
    struct strata_err err = { 0 };
    const float top_ps[] = { 0.3f, 1.0f, 1.0f };
    const float min_ps[] = { 0.0f, 0.9f, 0.0f };
    for (int c = 0; c < 3; c++) {
        strata_sampler_params_init(&p);
        p.top_k = 0;
        p.temperature = 1.0f;
        p.top_p = top_ps[c];
        p.min_p = min_ps[c];
        p.seed = 9;
        if (strata_sampler_create(&s, &p, V, &err)) {
            ok(0, "sampler: %s", err.msg);
            return;
        }
        /* the kept set by definition: tokens sorted by logit, the prefix whose share of
         * the total reaches top_p; min_p: p_i >= min_p */
        float thr = -INFINITY; /* smallest kept logit */
        if (c == 0) {
            static float sorted[V];
            memcpy(sorted, l, sizeof sorted);
            for (int i = 1; i < V; i++) /* insertion sort of 20,000: fine for a test */
                for (int j = i; j > 0 && sorted[j] > sorted[j - 1]; j--) {
                    float t = sorted[j];
                    sorted[j] = sorted[j - 1];
                    sorted[j - 1] = t;
                }
            double cum = 0;
            for (int i = 0; i < V; i++) {
                cum += expf(sorted[i] - mx) / sum;
                if (cum >= p.top_p) {
                    thr = sorted[i];
                    break;
                }
            }
        } else if (c == 1) {
            thr = INFINITY;
            for (int i = 0; i < V; i++)
                if (pr[i] >= p.min_p && l[i] < thr)
                    thr = l[i];
        }
        int inside = 1, distinct = 0;
        static char seen[V];
        memset(seen, 0, sizeof seen);
        for (int r = 0; r < 400; r++) {
            int32_t t = strata_sampler_sample(s, l, NULL, NULL, 0);
            inside &= t >= 0 && t < V && l[t] >= thr;
            distinct += !seen[t]++;
        }
        ok(inside && distinct > (c == 2 ? 300 : 5),
           "top_k 0, top_p %g, min_p %g: every draw inside the kept set (%d distinct)",
           p.top_p, p.min_p, distinct);
        if (c == 0) {
            /* a NaN logit is no candidate and leaves the cut where it was */
            const float keep = l[V - 1];
            l[V - 1] = NAN;
            if (!(keep >= thr)) {
                inside = 1;
                for (int r = 0; r < 400; r++) {
                    int32_t t = strata_sampler_sample(s, l, NULL, NULL, 0);
                    inside &= t >= 0 && t < V - 1 && l[t] >= thr;
                }
                ok(inside, "top_k 0, top_p %g with a NaN logit: every draw inside the same set",
                   p.top_p);
            }
            l[V - 1] = keep;
        }
        strata_sampler_free(s);
    }
    /* NaN never wins the argmax, nor a top-k draw */
    {
        float v[5] = { NAN, 1, 3, NAN, 2 };
        ok(strata_sampler_argmax(v, 5) == 2, "argmax skips NaN (got %d)",
           strata_sampler_argmax(v, 5));
        strata_sampler_params_init(&p);
        p.top_k = 4;
        p.temperature = 1;
        p.top_p = 1;
        p.min_p = 0;
        if (strata_sampler_create(&s, &p, 5, &err) == 0) {
            int fine = 1;
            for (int r = 0; r < 200; r++) {
                int32_t t = strata_sampler_sample(s, v, NULL, NULL, 0);
                fine &= t == 1 || t == 2 || t == 4;
            }
            ok(fine, "top_k 4 of a row with two NaN draws only its three numbers");
            strata_sampler_free(s);
        }
    }
}

int main(void)
{
    float l[NV];
    int32_t a[200], b[200];
    struct strata_sampler_params p;
    struct strata_err err = { 0 };
    fill_logits(l);

    ok(strata_sampler_argmax(l, NV) == 17, "argmax finds the best token");

    /* greedy */
    strata_sampler_params_init(&p);
    p.temperature = 0;
    draw(&p, l, 20, a);
    int all17 = 1;
    for (int i = 0; i < 20; i++)
        all17 &= a[i] == 17;
    ok(all17, "temperature 0 is greedy");

    /* top-k 1 is greedy whatever the temperature and seed */
    strata_sampler_params_init(&p);
    p.temperature = 5.0f;
    p.top_p = 1;
    p.min_p = 0;
    p.top_k = 1;
    p.seed = 42;
    draw(&p, l, 200, a);
    ok(n_distinct(a, 200) == 1 && a[0] == 17, "top_k 1 always picks the argmax");
    /* top-k 0 disables the filter: a hot temperature reaches many tokens */
    p.top_k = 0;
    draw(&p, l, 200, a);
    ok(n_distinct(a, 200) > 20, "top_k 0 disables top-k (%d distinct tokens)",
       n_distinct(a, 200));
    p.top_k = 2;
    draw(&p, l, 200, a);
    int only2 = 1;
    for (int i = 0; i < 200; i++)
        only2 &= a[i] == 17 || a[i] == 3;
    ok(only2 && n_distinct(a, 200) == 2, "top_k 2 keeps exactly the two best");

    /* top-p edges */
    strata_sampler_params_init(&p);
    p.temperature = 5.0f;
    p.top_k = 0;
    p.min_p = 0;
    p.seed = 7;
    p.top_p = 0.0f;
    draw(&p, l, 100, a);
    ok(n_distinct(a, 100) == 1 && a[0] == 17, "top_p 0 keeps only the best token");
    p.top_p = 1.0f;
    draw(&p, l, 200, a);
    p.top_k = 0;
    struct strata_sampler_params q = p;
    q.top_p = 1.0f;
    draw(&q, l, 200, b);
    ok(memcmp(a, b, sizeof a) == 0 && n_distinct(a, 200) > 20, "top_p 1 disables top-p");
    p.top_p = 0.5f;
    draw(&p, l, 200, a);
    ok(n_distinct(a, 200) > 1 && n_distinct(a, 200) < 40, "top_p 0.5 keeps a middle set "
       "(%d distinct)", n_distinct(a, 200));

    /* min-p: 1 keeps only tokens as likely as the best */
    strata_sampler_params_init(&p);
    p.temperature = 5.0f;
    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 1.0f;
    draw(&p, l, 100, a);
    ok(n_distinct(a, 100) == 1 && a[0] == 17, "min_p 1 keeps only the best token");

    /* seeds reproduce, different seeds differ */
    strata_sampler_params_init(&p);
    p.temperature = 1.5f;
    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 0;
    p.seed = 1234;
    draw(&p, l, 200, a);
    draw(&p, l, 200, b);
    ok(memcmp(a, b, sizeof a) == 0, "the same seed reproduces the same tokens");
    p.seed = 1235;
    draw(&p, l, 200, b);
    ok(memcmp(a, b, sizeof a) != 0, "another seed gives other tokens");

    /* reset restarts the stream */
    {
        struct strata_sampler *s = NULL;
        p.seed = 99;
        strata_sampler_create(&s, &p, NV, &err);
        int32_t x[50], y[50];
        for (int i = 0; i < 50; i++)
            x[i] = strata_sampler_sample(s, l, NULL, NULL, 0);
        strata_sampler_reset(s, 99);
        for (int i = 0; i < 50; i++)
            y[i] = strata_sampler_sample(s, l, NULL, NULL, 0);
        ok(memcmp(x, y, sizeof x) == 0, "reset(seed) restarts the same stream");
        strata_sampler_free(s);
    }

    /* repetition penalty moves greedy off a seen token */
    {
        struct strata_sampler *s = NULL;
        strata_sampler_params_init(&p);
        p.temperature = 0;
        p.repeat_penalty = 2.0f;
        strata_sampler_create(&s, &p, NV, &err);
        int32_t seen = 17;
        strata_sampler_accept(s, &seen, 1);
        int32_t t = strata_sampler_sample(s, l, NULL, NULL, 0);
        ok(t == 3, "repeat_penalty 2 demotes a seen best token (got %d)", t);
        strata_sampler_free(s);
        /* penalty_last_n 0 disables */
        p.penalty_last_n = 0;
        strata_sampler_create(&s, &p, NV, &err);
        strata_sampler_accept(s, &seen, 1);
        ok(strata_sampler_sample(s, l, NULL, NULL, 0) == 17, "penalty_last_n 0 disables");
        strata_sampler_free(s);
        /* window: a token older than the last N is not penalised */
        p.penalty_last_n = 2;
        p.repeat_penalty = 1;
        p.presence_penalty = 1.0f;
        strata_sampler_create(&s, &p, NV, &err);
        int32_t h[3] = { 17, 5, 6 };
        strata_sampler_accept(s, h, 3);
        ok(strata_sampler_sample(s, l, NULL, NULL, 0) == 17, "only the last N are penalised");
        int32_t h2 = 17;
        strata_sampler_accept(s, &h2, 1);
        ok(strata_sampler_sample(s, l, NULL, NULL, 0) == 3, "presence penalty applies");
        strata_sampler_free(s);
        /* frequency penalty scales with the count */
        strata_sampler_params_init(&p);
        p.temperature = 0;
        p.frequency_penalty = 0.06f;
        strata_sampler_create(&s, &p, NV, &err);
        strata_sampler_accept(s, &h2, 1);
        ok(strata_sampler_sample(s, l, NULL, NULL, 0) == 17, "one occurrence: 1 - 0.06 > 0.9");
        strata_sampler_accept(s, &h2, 1);
        ok(strata_sampler_sample(s, l, NULL, NULL, 0) == 3, "two occurrences: 1 - 0.12 < 0.9");
        strata_sampler_free(s);
    }

    /* logprobs */
    {
        double z = 0;
        for (int i = 0; i < NV; i++)
            z += exp(l[i]);
        float want = (float)(l[17] - log(z));
        float got = strata_sampler_logprob(l, NV, 17);
        ok(fabsf(got - want) < 1e-5f, "logprob %g == %g", got, want);
        struct strata_sampler *s = NULL;
        strata_sampler_params_init(&p);
        p.temperature = 0;
        strata_sampler_create(&s, &p, NV, &err);
        struct strata_token_prob top[3];
        float lp;
        int32_t t = strata_sampler_sample(s, l, &lp, top, 3);
        ok(t == 17 && fabsf(lp - want) < 1e-5f, "sample reports the token's logprob");
        ok(top[0].id == 17 && top[1].id == 3 && top[0].logprob >= top[1].logprob &&
           top[1].logprob >= top[2].logprob, "top logprobs best first (%d %d %d)", top[0].id,
           top[1].id, top[2].id);
        strata_sampler_free(s);
    }

    /* bad parameters */
    {
        struct strata_sampler *s = NULL;
        strata_sampler_params_init(&p);
        p.top_p = 1.5f;
        int rc = strata_sampler_create(&s, &p, NV, &err);
        ok(rc == STRATA_E_INVALID && strstr(err.msg, "top_p"), "top_p 1.5 refused: %s",
           err.msg);
        strata_sampler_params_init(&p);
        p.min_p = -1;
        rc = strata_sampler_create(&s, &p, NV, &err);
        ok(rc == STRATA_E_INVALID && strstr(err.msg, "min_p"), "min_p -1 refused");
        ok(s == NULL, "no sampler on error");
    }
    test_topk();
    test_sample_topk();
    test_no_topk();
    return tap_done();
}
