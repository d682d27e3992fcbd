/* test_sampler.c - sampler: greedy, top-k, top-p, min-p, penalties, seeds. */
#include <math.h>
#include <stdlib.h>
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
    return tap_done();
}
