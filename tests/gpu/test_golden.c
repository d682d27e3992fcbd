/* test_golden.c - the GPU backend against the HF transformers references and the CPU
 * backend (make check-gpu): tinycoder (qwen3moe) and tinydraft (qwen3) F16 logits at
 * every prompt position (argmax equal, max abs difference <= 5e-2) and greedy ids;
 * the quantised tinycoder files against the CPU backend; verify windows of 2, 8, 16
 * and 17 tokens bitwise equal to one-token decodes for every fixture model (so every
 * block type in the fixtures), on both sides of an attention split boundary, with
 * and without graphs, and with the fused decode step (STRATA_FUSED_STEP=1); launch
 * errors reported, not hidden.
 * The backend is $STRATA_BACKEND (default cuda). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine.h"
#include "generate.h"
#include "gguf.h"
#include "log.h"
#include "sampler.h"
#include "tap.h"
#include "vocab.h"

static const char *backend(void)
{
    const char *b = getenv("STRATA_BACKEND");
    return b && *b ? b : "cuda";
}

static int32_t *json_ids(const cJSON *a, int *n)
{
    *n = cJSON_GetArraySize(a);
    int32_t *ids = malloc(sizeof *ids * (size_t)(*n ? *n : 1));
    for (int i = 0; i < *n; i++)
        ids[i] = (int32_t)cJSON_GetArrayItem(a, i)->valuedouble;
    return ids;
}

static int open_engine(struct strata_engine **e, const struct strata_gguf *g, const char *be,
                       int n_ctx, struct strata_err *err)
{
    struct strata_engine_opts o;
    strata_engine_opts_init(&o);
    o.topk_min_vocab = 0; /* the device's top-k, whatever the vocabulary */
    o.backend = be;
    o.n_ctx = n_ctx;
    o.n_threads = 4;
    return strata_engine_open_gguf(e, g, &o, err);
}

static void golden_hf(const char *model, const char *refname)
{
    char path[1024];
    struct strata_err err = {0, ""};
    struct strata_gguf *g = NULL;
    struct strata_vocab *v = NULL;
    struct strata_engine *e = NULL;
    snprintf(path, sizeof path, "%s/ref/%s", tap_fixtures(), refname);
    char *js = tap_slurp(path, NULL);
    cJSON *ref = js ? cJSON_Parse(js) : NULL;
    free(js);
    if (!ok(ref != NULL, "read %s", path))
        return;
    snprintf(path, sizeof path, "%s/models/%s", tap_fixtures(), model);
    int rc = strata_gguf_open(&g, path, &err);
    if (!rc)
        rc = strata_vocab_load(&v, g, &err);
    if (!rc)
        rc = open_engine(&e, g, backend(), 256, &err);
    if (!ok(rc == 0, "%s: open with backend %s%s%s", model, backend(), rc ? ": " : "", err.msg))
        goto out;
    const cJSON *prompts = cJSON_GetObjectItem(ref, "prompts");
    int nv = strata_engine_n_vocab(e);
    for (int pi = 0; pi < cJSON_GetArraySize(prompts); pi++) {
        const cJSON *p = cJSON_GetArrayItem(prompts, pi);
        int n, ng;
        int32_t *ids = json_ids(cJSON_GetObjectItem(p, "ids"), &n);
        int32_t *gids = json_ids(cJSON_GetObjectItem(p, "greedy_ids"), &ng);
        snprintf(path, sizeof path, "%s/ref/%s", tap_fixtures(),
                 cJSON_GetObjectItem(p, "logits_file")->valuestring);
        size_t rl_len = 0;
        float *rl = (float *)tap_slurp(path, &rl_len);
        float *l = malloc(sizeof *l * (size_t)n * nv);
        rc = strata_engine_rollback(e, 0, &err);
        if (!rc)
            rc = strata_engine_eval(e, ids, n, STRATA_LOGITS_ALL, l, &err);
        if (ok(rc == 0 && rl && rl_len == sizeof(float) * (size_t)n * nv,
               "%s p%d: %d positions evaluated%s%s", model, pi, n, rc ? ": " : "", err.msg)) {
            double maxd = 0;
            int arg_ok = 1;
            for (int t = 0; t < n; t++) {
                int a = 0, b = 0;
                for (int i = 0; i < nv; i++) {
                    float x = l[(size_t)t * nv + i], y = rl[(size_t)t * nv + i];
                    double d = fabs((double)x - y);
                    if (!(d <= maxd))
                        maxd = isnan(d) ? INFINITY : d;
                    if (x > l[(size_t)t * nv + a])
                        a = i;
                    if (y > rl[(size_t)t * nv + b])
                        b = i;
                }
                arg_ok &= a == b;
            }
            ok(arg_ok, "%s p%d: argmax equal at every position", model, pi);
            ok(maxd <= 5e-2, "%s p%d: max abs logit difference %.4g <= 5e-2", model, pi, maxd);
        }
        struct strata_gen_params gp;
        struct strata_gen_result res;
        strata_gen_params_init(&gp);
        gp.sampling.temperature = 0;
        gp.n_predict = ng;
        gp.ignore_eog = 1;
        rc = strata_generate(e, v, ids, (size_t)n, &gp, NULL, NULL, &res, &err);
        ok(rc == 0 && res.n_gen == ng && memcmp(res.ids, gids, sizeof *gids * ng) == 0,
           "%s p%d: %d greedy ids equal HF's%s%s", model, pi, ng, rc ? ": " : "", err.msg);
        if (rc == 0)
            diag("%s p%d: prefill %.0f tok/s, decode %.0f tok/s", model, pi, res.prefill_tps,
                 res.decode_tps);
        strata_gen_result_free(&res);
        free(l);
        free(rl);
        free(ids);
        free(gids);
    }
out:
    strata_engine_close(e);
    strata_vocab_free(v);
    strata_gguf_close(g);
    cJSON_Delete(ref);
}

/* The GPU against the CPU backend on a quantised file (the CPU quantises activations
 * to 8 bits, the GPU keeps them in f32/f16: a small difference, same argmax mostly). */
static void versus_cpu(const char *model)
{
    char path[1024];
    struct strata_err err = {0, ""};
    struct strata_gguf *g = NULL;
    struct strata_engine *eg = NULL, *ec = NULL;
    snprintf(path, sizeof path, "%s/models/%s", tap_fixtures(), model);
    if (strata_gguf_open(&g, path, &err)) {
        ok(1, "# SKIP %s: %s", model, err.msg);
        return;
    }
    int rc = open_engine(&eg, g, backend(), 256, &err);
    if (!rc)
        rc = open_engine(&ec, g, "cpu", 256, &err);
    if (!ok(rc == 0, "%s: open gpu and cpu engines%s%s", model, rc ? ": " : "", err.msg))
        goto out;
    int nv = strata_engine_n_vocab(eg), n = 40;
    int32_t ids[40];
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)((i * 7919 + 13) % nv);
    float *lg = malloc(sizeof(float) * (size_t)n * nv), *lc = malloc(sizeof(float) * (size_t)n * nv);
    rc = strata_engine_eval(eg, ids, n, STRATA_LOGITS_ALL, lg, &err);
    if (!rc)
        rc = strata_engine_eval(ec, ids, n, STRATA_LOGITS_ALL, lc, &err);
    if (ok(rc == 0, "%s: 40 positions on both%s%s", model, rc ? ": " : "", err.msg)) {
        double maxd = 0, maxv = 0;
        int agree = 0;
        for (int t = 0; t < n; t++) {
            int a = 0, b = 0;
            for (int i = 0; i < nv; i++) {
                size_t k = (size_t)t * nv + i;
                double d = fabs((double)lg[k] - lc[k]);
                if (!(d <= maxd))
                    maxd = isnan(d) ? INFINITY : d;
                maxv = fmax(maxv, fabs(lc[k]));
                if (lg[k] > lg[(size_t)t * nv + a])
                    a = i;
                if (lc[k] > lc[(size_t)t * nv + b])
                    b = i;
            }
            agree += a == b;
        }
        diag("%s: gpu vs cpu max abs logit difference %.4g (max |logit| %.3g), argmax agree "
             "%d/%d", model, maxd, maxv, agree, n);
        /* the CPU's 8-bit activations move logits of random-token input by up to ~10%
         * of their range (perplexities agree with llama.cpp's within 0.5% on both) */
        ok(maxd <= 0.2 * maxv && agree >= n * 9 / 10,
           "%s: gpu logits close to the cpu's (%.4g, argmax %d/%d)", model, maxd, agree, n);
    }
    free(lg);
    free(lc);
out:
    strata_engine_close(eg);
    strata_engine_close(ec);
    strata_gguf_close(g);
}

/* Bring the kv cache to exactly ids[0..to): roll back, or evaluate the missing
 * positions in chunks of 16 (the mat-vec path, so two engines making the same calls
 * hold the same prefix bitwise). */
static int fill_to(struct strata_engine *e, const int32_t *ids, int to, struct strata_err *err)
{
    int rc = 0;
    if (strata_engine_n_past(e) > to)
        return strata_engine_rollback(e, to, err);
    for (int p = strata_engine_n_past(e); p < to && !rc; p += 16)
        rc = strata_engine_eval(e, ids + p, to - p < 16 ? to - p : 16, STRATA_LOGITS_NONE, NULL,
                                err);
    return rc;
}

/* Verify windows against one-token decodes on one engine: for each (pos, size) the
 * window's logits rows must be bitwise those of decoding its tokens one at a time
 * after the same kv cache prefix.  Windows end past position 128, where the
 * decode attention splits the kv range.  ref: the windows of another engine to equal
 * bitwise (NULL: none); out: the windows (may be NULL). */
#define WIN_CASES 6
static const int win_pos[WIN_CASES] = {40, 100, 120, 124, 150, 170};
static const int win_len[WIN_CASES] = {2, 8, 16, 8, 17, 16};

static int windows(struct strata_engine *e, const int32_t *ids, int n_ids, const char *what,
                   const float *ref, float *out, const char *model)
{
    struct strata_err err = {0, ""};
    int nv = strata_engine_n_vocab(e), rc = 0, bad = 0;
    size_t row = (size_t)nv;
    float *w = malloc(sizeof(float) * 17 * row), *one = malloc(sizeof(float) * row);
    float *w1 = malloc(sizeof(float) * 17 * row);
    rc = fill_to(e, ids, n_ids, &err);
    if (!ok(rc == 0, "%s (%s): kv cache prefix of %d positions%s%s", model, what, n_ids,
            rc ? ": " : "", err.msg))
        goto out;
    for (int c = 0; c < WIN_CASES; c++) {
        int p = win_pos[c], n = win_len[c], same = 1, first_bad = -1;
        rc = fill_to(e, ids, p, &err);
        /* twice: the backend captures a shape as a graph on its second use, so with
         * graphs on the second window is a replay, and it must equal the first */
        if (!rc)
            rc = strata_engine_eval(e, ids + p, n, STRATA_LOGITS_ALL, w1, &err);
        if (!rc)
            rc = strata_engine_rollback(e, p, &err);
        if (!rc)
            rc = strata_engine_eval(e, ids + p, n, STRATA_LOGITS_ALL, w, &err);
        if (!rc)
            ok(memcmp(w1, w, sizeof(float) * n * row) == 0,
               "%s (%s): the %d-token window at %d equal on its first and second run", model,
               what, n, p);
        if (!rc)
            rc = strata_engine_rollback(e, p, &err);
        for (int i = 0; i < n && !rc; i++) {
            rc = strata_engine_eval(e, ids + p + i, 1, STRATA_LOGITS_LAST, one, &err);
            if (!rc && memcmp(one, w + (size_t)i * row, sizeof(float) * row) != 0 && same) {
                same = 0;
                first_bad = i;
            }
        }
        if (!ok(rc == 0 && same, "%s (%s): a %d-token window at position %d bitwise equals "
                "%d one-token decodes%s%s", model, what, n, p, n, rc ? ": " : "", err.msg))
            bad = 1;
        if (first_bad >= 0)
            diag("%s (%s): window %d@%d differs first at row %d (position %d)", model, what, n,
                 p, first_bad, p + first_bad);
        /* the same steps into the engine's host row (written by the device itself) */
        if (!rc)
            rc = strata_engine_rollback(e, p, &err);
        int agree = 1;
        for (int i = 0; i < n && !rc; i++) {
            const float *r = NULL;
            rc = strata_engine_eval_row(e, ids + p + i, 1, &r, &err);
            agree &= !rc && !memcmp(r, w + (size_t)i * row, sizeof(float) * row);
        }
        ok(rc == 0 && agree, "%s (%s): %d steps from %d into the engine's row give each "
           "decode's logits bitwise%s%s", model, what, n, p, rc ? ": " : "", err.msg);
        /* greedy steps that bring back only the argmax id (found on the device) */
        if (!rc)
            rc = strata_engine_rollback(e, p, &err);
        agree = 1;
        for (int i = 0; i < n && !rc; i++) {
            int32_t next = -1;
            rc = strata_engine_eval_argmax(e, ids + p + i, 1, &next, &err);
            agree &= !rc && next == strata_sampler_argmax(w + (size_t)i * row, (int32_t)row);
        }
        ok(rc == 0 && agree, "%s (%s): %d argmax steps from %d give the largest logit's id of "
           "each decode%s%s", model, what, n, p, rc ? ": " : "", err.msg);
        /* sampling steps that bring back only the top-k (found on the device) */
        if (!rc)
            rc = strata_engine_rollback(e, p, &err);
        agree = 1;
        const int32_t k = c % 2 ? STRATA_SAMPLER_TOPK_MAX : 40;
        for (int i = 0; i < n && !rc; i++) {
            int32_t gi[STRATA_SAMPLER_TOPK_MAX], wi[STRATA_SAMPLER_TOPK_MAX];
            float gv[STRATA_SAMPLER_TOPK_MAX], wv[STRATA_SAMPLER_TOPK_MAX];
            double lse = 0;
            rc = strata_engine_eval_topk(e, ids + p + i, 1, k, gi, gv, i % 2 ? &lse : NULL,
                                         &err);
            const float *wr = w + (size_t)i * row;
            strata_sampler_topk(wr, (int32_t)row, k, wi, wv);
            for (int j = 0; j < k && !rc; j++)
                agree &= gi[j] == wi[j] && gv[j] == wv[j];
            /* the device's log-sum-exp: the host's up to the order of its sum and the
             * device's expf (2 ulp): well below a float logprob's resolution */
            if (!rc && i % 2) {
                const double want = strata_sampler_log_sum_exp(wr, (int32_t)row);
                if (!(fabs(lse - want) <= 1e-6 * (1 + fabs(want)))) {
                    agree = 0;
                    diag("%s: log-sum-exp at %d: device %.12g, host %.12g", model, p + i,
                         lse, want);
                }
            }
        }
        ok(rc == 0 && agree, "%s (%s): %d top-%d steps from %d give the %d largest logits of "
           "each decode in order (and the log-sum-exp)%s%s", model, what, n, k, p, k,
           rc ? ": " : "", err.msg);
        if (!rc && ref)
            ok(memcmp(ref + (size_t)c * 17 * row, w, sizeof(float) * n * row) == 0,
               "%s: the %d-token window at %d equal with and without graphs", model, n, p);
        if (!rc && out)
            memcpy(out + (size_t)c * 17 * row, w, sizeof(float) * n * row);
        if (rc)
            break;
    }
out:
    free(w);
    free(w1);
    free(one);
    return rc || bad;
}

/* A log sink that notes whether the fused decode step was set up, and prints as the
 * default sink does. */
static void step_sink(int level, const char *msg, void *ud)
{
    (void)level;
    if (strstr(msg, "decode steps as one kernel"))
        *(int *)ud = 1;
    fprintf(stderr, "strata: %s\n", msg);
}

static void window_check(const char *model)
{
    char path[1024];
    struct strata_err err = {0, ""};
    struct strata_gguf *g = NULL;
    struct strata_engine *e = NULL;
    float *keep = NULL;
    snprintf(path, sizeof path, "%s/models/%s", tap_fixtures(), model);
    if (strata_gguf_open(&g, path, &err)) {
        ok(1, "# SKIP %s: %s", model, err.msg);
        return;
    }
    /* graphs as configured (on unless STRATA_NO_GRAPH / STRATA_SYNC_DEBUG), then off */
    int rc = open_engine(&e, g, backend(), 256, &err);
    if (!ok(rc == 0, "%s: open (%s)%s%s", model, backend(), rc ? ": " : "", err.msg))
        goto out;
    int nv = strata_engine_n_vocab(e), n_ids = 200;
    int32_t ids[200];
    for (int i = 0; i < n_ids; i++)
        ids[i] = (int32_t)((i * 2654435761u + 17) % (unsigned)nv);
    keep = malloc(sizeof(float) * WIN_CASES * 17 * (size_t)nv);
    windows(e, ids, n_ids, "graphs", NULL, keep, model);
    strata_engine_close(e);
    e = NULL;
    const char *ng = getenv("STRATA_NO_GRAPH");
    char *saved = ng ? strdup(ng) : NULL;
    setenv("STRATA_NO_GRAPH", "1", 1);
    rc = open_engine(&e, g, backend(), 256, &err);
    if (saved)
        setenv("STRATA_NO_GRAPH", saved, 1);
    else
        unsetenv("STRATA_NO_GRAPH");
    free(saved);
    if (ok(rc == 0, "%s: open without graphs%s%s", model, rc ? ": " : "", err.msg))
        windows(e, ids, n_ids, "no graphs", keep, NULL, model);
    /* the decode steps of the fused step kernel (decode_step.cu, opt-in) where the model
     * takes it: the windows, which run the separate launches, must equal them too */
    strata_engine_close(e);
    e = NULL;
    int stepped = 0;
    setenv("STRATA_FUSED_STEP", "1", 1);
    strata_log_set_sink(step_sink, &stepped);
    rc = open_engine(&e, g, backend(), 256, &err);
    strata_log_set_sink(NULL, NULL);
    unsetenv("STRATA_FUSED_STEP");
    if (ok(rc == 0, "%s: open with the fused decode step%s%s", model, rc ? ": " : "", err.msg))
        windows(e, ids, n_ids, "fused step", keep, NULL, model);
    /* the files whose every product has an 8-bit kernel must take it */
    if (strstr(model, "Q8_0") || strstr(model, "Q4_K_M"))
        ok(stepped, "%s: the fused decode step was set up (its windows above compared it)",
           model);
out:
    free(keep);
    strata_engine_close(e);
    strata_gguf_close(g);
}

int main(void)
{
    golden_hf("tinycoder-moe-F16.gguf", "tinycoder-hf-reference.json");
    golden_hf("tinydraft-qwen3-F16.gguf", "tinydraft-hf-reference.json");
    const char *q[] = {"tinycoder-moe-Q8_0.gguf", "tinycoder-moe-Q4_K_M.gguf",
                       "tinycoder-moe-IQ4_XS.gguf", "tinycoder-moe-IQ2_XS.gguf",
                       "tinycoder-moe-IQ1_M.gguf"};
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        versus_cpu(q[i]);
    const char *all[] = {"tinycoder-moe-F16.gguf",   "tinycoder-moe-Q8_0.gguf",
                         "tinycoder-moe-Q4_K_M.gguf", "tinycoder-moe-IQ4_XS.gguf",
                         "tinycoder-moe-IQ2_XS.gguf", "tinycoder-moe-IQ1_M.gguf",
                         "tinydraft-qwen3-F16.gguf",  "stories260K.gguf"};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        window_check(all[i]);
    return tap_done();
}
