/* test_engine.c - the CPU engine against HF transformers references
 * (tinycoder qwen3moe, tinydraft qwen3), batch invariance, kv rollback,
 * greedy generation and stop strings. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine.h"
#include "sampler.h"
#include "generate.h"
#include "gguf.h"
#include "tap.h"
#include "vocab.h"

static int32_t *json_ids(const cJSON *a, int *n)
{
    *n = cJSON_GetArraySize(a);
    int32_t *ids = malloc(sizeof *ids * (size_t)(*n ? *n : 1));
    for (int i = 0; i < *n; i++)
        ids[i] = (int32_t)cJSON_GetArrayItem(a, i)->valuedouble;
    return ids;
}

struct cb_acc {
    char text[4096];
    size_t n;
    int calls;
};

static int acc_cb(const struct strata_gen_token *t, void *ud)
{
    struct cb_acc *a = ud;
    if (a->n + t->text_len < sizeof a->text) {
        memcpy(a->text + a->n, t->text, t->text_len);
        a->n += t->text_len;
    }
    a->calls++;
    return 0;
}

static void golden(const char *model, const char *refname, int with_extras)
{
    char path[1024];
    struct strata_err err = { 0 };
    struct strata_gguf *g = NULL;
    struct strata_vocab *v = NULL;
    struct strata_engine *e = NULL;
    cJSON *ref = NULL;
    float *l = NULL, *l1 = NULL;
    snprintf(path, sizeof path, "%s/ref/%s", tap_fixtures(), refname);
    char *js = tap_slurp(path, NULL);
    ref = js ? cJSON_Parse(js) : NULL;
    free(js);
    if (!ok(ref != NULL, "read %s", path))
        return;
    snprintf(path, sizeof path, "%s/models/%s", tap_fixtures(), model);
    struct strata_engine_opts o;
    strata_engine_opts_init(&o);
    o.n_threads = 2;
    o.n_ctx = 128;
    if (!ok(strata_gguf_open(&g, path, &err) == 0 && strata_vocab_load(&v, g, &err) == 0 &&
            strata_engine_open_gguf(&e, g, &o, &err) == 0, "open %s: %s", model, err.msg))
        goto out;
    const int32_t nv = strata_engine_n_vocab(e);
    const cJSON *prompts = cJSON_GetObjectItem(ref, "prompts");
    for (int pi = 0; pi < cJSON_GetArraySize(prompts); pi++) {
        const cJSON *p = cJSON_GetArrayItem(prompts, pi);
        int n = 0, ng = 0;
        int32_t *ids = json_ids(cJSON_GetObjectItem(p, "ids"), &n);
        int32_t *gids = json_ids(cJSON_GetObjectItem(p, "greedy_ids"), &ng);
        snprintf(path, sizeof path, "%s/ref/%s", tap_fixtures(),
                 cJSON_GetObjectItem(p, "logits_file")->valuestring);
        size_t rlen = 0;
        float *rl = (float *)tap_slurp(path, &rlen);
        l = malloc(sizeof *l * (size_t)n * nv);
        strata_err_clear(&err);
        int rc = strata_engine_rollback(e, 0, &err) ||
                 strata_engine_eval(e, ids, n, STRATA_LOGITS_ALL, l, &err);
        ok(rc == 0 && rl && rlen == sizeof(float) * (size_t)n * nv, "%s p%d: eval %d tokens%s%s",
           model, pi, n, rc ? ": " : "", rc ? err.msg : "");
        if (rc || !rl || rlen != sizeof(float) * (size_t)n * nv)
            goto next;
        double maxd = 0;
        int bad_arg = -1;
        for (int t = 0; t < n; t++) {
            const float *a = l + (size_t)t * nv, *b = rl + (size_t)t * nv;
            int32_t am = 0, bm = 0;
            for (int32_t i = 0; i < nv; i++) {
                double d = fabs((double)a[i] - b[i]);
                if (d > maxd || d != d)
                    maxd = d != d ? INFINITY : d;
                if (a[i] > a[am])
                    am = i;
                if (b[i] > b[bm])
                    bm = i;
            }
            if (am != bm && bad_arg < 0)
                bad_arg = t;
        }
        ok(bad_arg < 0, "%s p%d: argmax equals HF at every position (first bad %d)", model, pi,
           bad_arg);
        ok(maxd <= 1e-2, "%s p%d: max abs logit diff %.5f <= 1e-2", model, pi, maxd);

        if (with_extras && pi == 1) {
            /* one position at a time gives bitwise the same logits */
            l1 = malloc(sizeof *l1 * nv);
            int same = 1;
            strata_engine_rollback(e, 0, &err);
            for (int t = 0; t < n; t++) {
                if (strata_engine_eval(e, ids + t, 1, STRATA_LOGITS_LAST, l1, &err)) {
                    same = 0;
                    break;
                }
                same &= memcmp(l1, l + (size_t)t * nv, sizeof *l1 * nv) == 0;
            }
            ok(same, "%s: logits one position at a time == in one batch (bitwise)", model);
            /* the same into the engine's row: the same bits, one buffer for every call */
            {
                const float *r = NULL, *r0 = NULL;
                int agree = 1;
                strata_engine_rollback(e, 0, &err);
                for (int t = 0; t < n && agree; t++) {
                    agree = !strata_engine_eval_row(e, ids + t, 1, &r, &err) &&
                            !memcmp(r, l + (size_t)t * nv, sizeof *l1 * nv) && (!r0 || r == r0);
                    r0 = r;
                }
                ok(agree && strata_engine_n_past(e) == n,
                   "%s: strata_engine_eval_row gives each position's logits bitwise in one "
                   "row (%s)", model, err.msg);
                ok(strata_engine_eval_row(e, ids, 1, NULL, &err) == STRATA_E_INVALID &&
                       strata_engine_eval_row(e, NULL, 1, &r, &err) == STRATA_E_INVALID &&
                       strata_engine_n_past(e) == n,
                   "strata_engine_eval_row refuses NULL ids or row: %s", err.msg);
            }
            /* the argmax evaluation: the largest logit's id of the same positions, the
             * kv cache as after a plain eval */
            {
                int agree = 1;
                strata_engine_rollback(e, 0, &err);
                for (int t = 0; t < n && agree; t++) {
                    int32_t next = -1;
                    if (strata_engine_eval_argmax(e, ids + t, 1, &next, &err)) {
                        agree = 0;
                        break;
                    }
                    int32_t want = 0;
                    for (int32_t j = 1; j < nv; j++)
                        if (l[(size_t)t * nv + j] > l[(size_t)t * nv + want])
                            want = j;
                    agree &= next == want;
                }
                ok(agree && strata_engine_n_past(e) == n,
                   "%s: strata_engine_eval_argmax gives the largest logit's id at each of %d "
                   "positions, %d in the kv cache (%s)", model, n, strata_engine_n_past(e),
                   err.msg);
                int32_t dummy;
                ok(strata_engine_eval_argmax(e, ids, 1, NULL, &err) == STRATA_E_INVALID &&
                   strata_engine_eval_argmax(e, NULL, 1, &dummy, &err) == STRATA_E_INVALID,
                   "strata_engine_eval_argmax refuses NULL ids or output: %s", err.msg);
                int32_t np = strata_engine_n_past(e);
                ok(strata_engine_eval(e, ids, 1, STRATA_LOGITS_ARGMAX, l1, &err) ==
                       STRATA_E_INVALID && strata_engine_n_past(e) == np,
                   "strata_engine_eval refuses the ARGMAX mode (kv cache kept): %s", err.msg);
            }
            /* the top-k evaluation: the k largest logits of the same positions, in
             * strata_sampler_topk's order */
            {
                int agree = 1;
                const int32_t k = 40 < nv ? 40 : nv;
                strata_engine_rollback(e, 0, &err);
                for (int t = 0; t < n && agree; t++) {
                    int32_t gi[STRATA_SAMPLER_TOPK_MAX], wi[STRATA_SAMPLER_TOPK_MAX];
                    float gv[STRATA_SAMPLER_TOPK_MAX], wv[STRATA_SAMPLER_TOPK_MAX];
                    double lse = 0;
                    if (strata_engine_eval_topk(e, ids + t, 1, k, gi, gv, t % 2 ? &lse : NULL,
                                                &err)) {
                        agree = 0;
                        break;
                    }
                    strata_sampler_topk(l + (size_t)t * nv, nv, k, wi, wv);
                    agree &= memcmp(gi, wi, sizeof *gi * (size_t)k) == 0 &&
                             memcmp(gv, wv, sizeof *gv * (size_t)k) == 0 &&
                             gv[0] == l[(size_t)t * nv + gi[0]];
                    /* the log-sum-exp gives the sampler's logprob of each */
                    for (int j = 0; j < k && t % 2; j++)
                        agree &= (float)((double)gv[j] - lse) ==
                                 strata_sampler_logprob(l + (size_t)t * nv, nv, gi[j]);
                }
                ok(agree && strata_engine_n_past(e) == n,
                   "%s: strata_engine_eval_topk gives the %d largest logits (and the "
                   "log-sum-exp of the row: the sampler's logprobs) at each of %d positions, "
                   "%d in the kv cache (%s)", model, k, n, strata_engine_n_past(e),
                   err.msg);
                int32_t di[2];
                float dv[2];
                int32_t np = strata_engine_n_past(e);
                ok(strata_engine_eval_topk(e, ids, 1, 0, di, dv, NULL, &err) ==
                       STRATA_E_INVALID &&
                   strata_engine_eval_topk(e, ids, 1, STRATA_SAMPLER_TOPK_MAX + 1, di, dv, NULL,
                                           &err) == STRATA_E_INVALID &&
                   strata_engine_eval_topk(e, ids, 1, 2, NULL, dv, NULL, &err) ==
                       STRATA_E_INVALID &&
                   strata_engine_eval(e, ids, 1, STRATA_LOGITS_TOPK, l1, &err) ==
                       STRATA_E_INVALID &&
                   strata_engine_n_past(e) == np,
                   "strata_engine_eval_topk refuses top_k 0 and %d, NULL outputs, and "
                   "strata_engine_eval the TOPK mode (kv cache kept): %s",
                   STRATA_SAMPLER_TOPK_MAX + 1, err.msg);
            }
            /* roll back and re-evaluate the tail as one window */
            int ok_rb = strata_engine_rollback(e, 4, &err) == 0 &&
                        strata_engine_n_past(e) == 4 &&
                        strata_engine_eval(e, ids + 4, n - 4, STRATA_LOGITS_ALL, l, &err) == 0;
            float *full = malloc(sizeof *full * (size_t)n * nv);
            strata_engine_rollback(e, 0, &err);
            strata_engine_eval(e, ids, n, STRATA_LOGITS_ALL, full, &err);
            ok(ok_rb && memcmp(l, full + (size_t)4 * nv, sizeof *l * (size_t)(n - 4) * nv) == 0,
               "%s: rollback to 4 + a window of %d == the full batch (bitwise)", model, n - 4);
            free(full);
            ok(strata_engine_rollback(e, n + 1, &err) == STRATA_E_INVALID,
               "rollback past n_past refused: %s", err.msg);
            /* one thread, and a prefill chunk of 3, give the same bits */
            {
                struct strata_engine *e1 = NULL;
                struct strata_engine_opts o1 = o;
                o1.n_threads = 1;
                o1.n_prefill = 3;
                float *l3 = malloc(sizeof *l3 * (size_t)n * nv);
                int r1 = strata_engine_open_gguf(&e1, g, &o1, &err) ||
                         strata_engine_eval(e1, ids, n, STRATA_LOGITS_ALL, l3, &err);
                full = malloc(sizeof *full * (size_t)n * nv);
                strata_engine_rollback(e, 0, &err);
                strata_engine_eval(e, ids, n, STRATA_LOGITS_ALL, full, &err);
                ok(r1 == 0 && memcmp(l3, full, sizeof *l3 * (size_t)n * nv) == 0,
                   "%s: 1 thread with prefill chunks of 3 == 2 threads in one batch (bitwise)",
                   model);
                free(l3);
                free(full);
                strata_engine_close(e1);
            }
            free(l1);
            l1 = NULL;
        }

        /* greedy: the HF ids */
        {
            struct strata_gen_params gp;
            struct strata_gen_result res;
            strata_gen_params_init(&gp);
            gp.sampling.temperature = 0;
            gp.n_predict = ng;
            gp.ignore_eog = 1;
            rc = strata_generate(e, v, ids, (size_t)n, &gp, NULL, NULL, &res, &err);
            ok(rc == 0 && res.n_gen == ng && memcmp(res.ids, gids, sizeof *gids * ng) == 0,
               "%s p%d: %d greedy ids equal HF's", model, pi, ng);
            const char *gt = cJSON_GetObjectItem(p, "greedy_text")->valuestring;
            if (with_extras && pi == 0) {
                ok(res.n_cached == n - 1, "a repeated prompt reuses the kv cache (%d cached)",
                   res.n_cached);
                /* a stop string that ends inside a token: cut exactly there */
                const char *stop = "int, ra";
                const char *hit = strstr(gt, stop);
                if (hit) {
                    struct strata_gen_result r2;
                    struct cb_acc acc = { { 0 }, 0, 0 };
                    const char *stops[2] = { "never-there", stop };
                    gp.stop = stops;
                    gp.n_stop = 2;
                    rc = strata_generate(e, v, ids, (size_t)n, &gp, acc_cb, &acc, &r2, &err);
                    size_t want = (size_t)(hit - gt);
                    ok(rc == 0 && r2.stop_reason == STRATA_STOP_STRING && r2.stop_index == 1 &&
                       r2.text_len == want && memcmp(r2.text, gt, want) == 0,
                       "stop string ending inside a token cuts the text to '%s'", r2.text);
                    ok(acc.n == r2.text_len && memcmp(acc.text, r2.text, acc.n) == 0,
                       "callback texts add up to the result text");
                    ok(acc.calls == r2.n_gen && r2.n_gen < ng, "one callback per token (%d)",
                       acc.calls);
                    strata_gen_result_free(&r2);
                    gp.stop = NULL;
                    gp.n_stop = 0;
                }
                /* -n 0 and -n 1 */
                struct strata_gen_result r0;
                gp.n_predict = 0;
                rc = strata_generate(e, v, ids, (size_t)n, &gp, NULL, NULL, &r0, &err);
                ok(rc == 0 && r0.n_gen == 0 && r0.text_len == 0 &&
                   r0.stop_reason == STRATA_STOP_LENGTH, "n_predict 0: no tokens");
                strata_gen_result_free(&r0);
                gp.n_predict = 1;
                rc = strata_generate(e, v, ids, (size_t)n, &gp, NULL, NULL, &r0, &err);
                ok(rc == 0 && r0.n_gen == 1 && r0.ids[0] == gids[0], "n_predict 1: one token");
                strata_gen_result_free(&r0);
                /* empty prompt, prompt longer than the context */
                rc = strata_generate(e, v, ids, 0, &gp, NULL, NULL, &r0, &err);
                ok(rc == STRATA_E_INVALID && strstr(err.msg, "empty prompt"), "empty prompt: %s",
                   err.msg);
                strata_gen_result_free(&r0);
                int32_t *big = calloc(200, sizeof *big);
                rc = strata_generate(e, v, big, 200, &gp, NULL, NULL, &r0, &err);
                ok(rc == STRATA_E_LIMIT && strstr(err.msg, "200") && strstr(err.msg, "128"),
                   "prompt longer than the context: %s", err.msg);
                strata_gen_result_free(&r0);
                free(big);
            }
            strata_gen_result_free(&res);
        }
    next:
        free(l);
        l = NULL;
        free(rl);
        free(ids);
        free(gids);
    }
out:
    free(l);
    strata_engine_close(e);
    strata_vocab_free(v);
    strata_gguf_close(g);
    cJSON_Delete(ref);
}

int main(void)
{
    golden("tinycoder-moe-F16.gguf", "tinycoder-hf-reference.json", 1);
    golden("tinydraft-qwen3-F16.gguf", "tinydraft-hf-reference.json", 0);
    return tap_done();
}
