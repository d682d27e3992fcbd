/* generate.c - the generation loop (stop strings, callbacks, timings) and
 * llama.cpp-compatible perplexity. */
#include "generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "model.h"
#include "spec.h"
#include "vocab.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

const char *strata_stop_reason_name(int reason)
{
    switch (reason) {
    case STRATA_STOP_LENGTH: return "length";
    case STRATA_STOP_EOG: return "eos";
    case STRATA_STOP_STRING: return "stop";
    case STRATA_STOP_CTX: return "context";
    case STRATA_STOP_CANCEL: return "cancelled";
    default: return "none";
    }
}

void strata_gen_params_init(struct strata_gen_params *p)
{
    memset(p, 0, sizeof *p);
    strata_sampler_params_init(&p->sampling);
    p->n_predict = -1;
}

void strata_gen_result_free(struct strata_gen_result *r)
{
    if (!r)
        return;
    free(r->text);
    free(r->ids);
    r->text = NULL;
    r->ids = NULL;
}

/* Growing byte buffer, always NUL-terminated. */
struct buf {
    char *p;
    size_t n, cap;
};

static int buf_add(struct buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q)
            return -1;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

/* Earliest match of any stop string in text[from..n); sets *which. */
static long find_stop(const char *text, size_t n, size_t from,
                      const struct strata_gen_params *p, int *which)
{
    long best = -1;
    for (size_t i = 0; i < p->n_stop; i++) {
        const char *st = p->stop[i];
        size_t sl = st ? strlen(st) : 0;
        if (sl == 0 || sl > n)
            continue;
        for (size_t pos = from; pos + sl <= n; pos++) {
            if (best >= 0 && (long)pos >= best)
                break;
            if (memcmp(text + pos, st, sl) == 0) {
                best = (long)pos;
                *which = (int)i;
                break;
            }
        }
    }
    return best;
}

/* Bytes at the end of text that are a proper prefix of some stop string
 * (and so must be held back). */
static size_t stop_hold(const char *text, size_t n, const struct strata_gen_params *p)
{
    size_t hold = 0;
    for (size_t i = 0; i < p->n_stop; i++) {
        const char *st = p->stop[i];
        size_t sl = st ? strlen(st) : 0;
        for (size_t k = sl ? sl - 1 : 0; k > hold; k--) {
            if (k <= n && memcmp(text + n - k, st, k) == 0) {
                hold = k;
                break;
            }
        }
    }
    return hold;
}

/* Prefill prompt[from..n) where ids of -1 take the next rows of embd (the
 * rows of the -1 ids before from are skipped): runs of text ids through
 * strata_engine_eval, runs of image positions through
 * strata_engine_eval_embd; the last run writes the last position's logits. */
static int prefill_spliced(struct strata_engine *e, const int32_t *prompt, int32_t n,
                           int32_t from, const float *embd, float *logits,
                           struct strata_err *err)
{
    const size_t n_embd = (size_t)strata_engine_model(e)->hp.n_embd;
    size_t row = 0;
    for (int32_t i = 0; i < from; i++)
        row += prompt[i] < 0;
    for (int32_t i = from; i < n;) {
        int32_t j = i;
        int img = prompt[i] < 0;
        while (j < n && (prompt[j] < 0) == img)
            j++;
        int mode = j == n ? STRATA_LOGITS_LAST : STRATA_LOGITS_NONE;
        float *lg = j == n ? logits : NULL;
        int rc = img ? strata_engine_eval_embd(e, embd + row * n_embd, j - i, mode, lg, err)
                     : strata_engine_eval(e, prompt + i, j - i, mode, lg, err);
        if (rc)
            return rc;
        if (img)
            row += (size_t)(j - i);
        i = j;
    }
    return 0;
}

int strata_generate(struct strata_engine *e, const struct strata_vocab *v,
                    const int32_t *prompt, size_t n_prompt,
                    const struct strata_gen_params *p, strata_gen_token_fn cb, void *ud,
                    struct strata_gen_result *res, struct strata_err *err)
{
    struct strata_sampler *smp = NULL;
    float *logits = NULL;
    char *piece = NULL;
    struct buf text = { 0 };
    int32_t *ids = NULL;
    size_t cap_ids = 0;
    struct strata_token_prob top[STRATA_GEN_MAX_TOP];
    int rc = 0;
    const int32_t n_vocab = strata_engine_n_vocab(e);
    const int32_t n_ctx = strata_engine_n_ctx(e);

    memset(res, 0, sizeof *res);
    res->stop_index = -1;
    res->n_prompt = (int32_t)n_prompt;
    if (n_prompt == 0 || !prompt) {
        rc = strata_err_set(err, STRATA_E_INVALID, "empty prompt: need at least one token");
        goto out;
    }
    if (n_prompt > (size_t)n_ctx) {
        rc = strata_err_set(err, STRATA_E_LIMIT, "prompt of %zu tokens does not fit the "
                            "context of %d tokens (raise --ctx)", n_prompt, n_ctx);
        goto out;
    }
    if (p->n_top_logprobs < 0 || p->n_top_logprobs > STRATA_GEN_MAX_TOP) {
        rc = strata_err_set(err, STRATA_E_INVALID, "top logprobs %d outside 0..%d",
                            p->n_top_logprobs, STRATA_GEN_MAX_TOP);
        goto out;
    }
    if ((rc = strata_sampler_create(&smp, &p->sampling, n_vocab, err)))
        goto out;
    logits = malloc((size_t)n_vocab * sizeof *logits);
    size_t piece_cap = STRATA_DETOK_OUT_MAX(v);
    piece = malloc(piece_cap);
    if (!logits || !piece || buf_add(&text, "", 0)) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }

    /* prefill, reusing the kv cache's common prefix */
    double t0 = now_ms();
    int32_t n_common = strata_engine_common_prefix(e, prompt, (int32_t)n_prompt);
    if (n_common == (int32_t)n_prompt)
        n_common--; /* the last prompt position must be evaluated for its logits */
    if ((rc = strata_engine_rollback(e, n_common, err)))
        goto out;
    res->n_cached = n_common;
    if ((rc = p->embd ? prefill_spliced(e, prompt, (int32_t)n_prompt, n_common, p->embd,
                                        logits, err)
                      : strata_engine_eval(e, prompt + n_common, (int32_t)n_prompt - n_common,
                                           STRATA_LOGITS_LAST, logits, err)))
        goto out;
    double t1 = now_ms();
    res->t_prefill_ms = t1 - t0;
    if (res->t_prefill_ms > 0)
        res->prefill_tps = (n_prompt - (size_t)n_common) / (res->t_prefill_ms / 1e3);
    strata_sampler_accept(smp, prompt, n_prompt);
    if (p->spec)
        strata_spec_begin(p->spec);
    const float *cur = logits; /* the logits to sample from next */

    struct strata_detok dt;
    strata_detok_init(&dt, v, p->special ? STRATA_DETOK_SPECIAL : 0);
    size_t released = 0, searched = 0;
    int n_evals = 0;
    /* greedy without logprobs: each step's argmax is found where the logits are
     * (strata_engine_eval_argmax: on a GPU 4 bytes come back instead of the row) */
    const int by_argmax = !p->spec && !p->logprobs && p->n_top_logprobs == 0 &&
                          strata_sampler_is_argmax(smp);
    int32_t next = -1; /* the argmax of the last step, when by_argmax */
    /* Steps that need only the largest logits of the row: sampling with top-k and no
     * penalties (samp_k of them), and the logprob and top logprobs of a greedy or such
     * a sampled step (with the row's log-sum-exp).  Those are found where the logits
     * are (strata_engine_eval_topk) and give the same tokens as the whole row; with
     * speculation, in its windows without drafts. */
    const int32_t samp_k = strata_sampler_topk_k(smp);
    const int want_lp = p->logprobs || p->n_top_logprobs > 0;
    int32_t by_topk = 0;
    if (!by_argmax && p->n_top_logprobs <= STRATA_SAMPLER_TOPK_MAX &&
        (samp_k > 0 || strata_sampler_is_argmax(smp))) {
        by_topk = samp_k > 0 ? samp_k : 1;
        if (p->n_top_logprobs > by_topk)
            by_topk = p->n_top_logprobs;
        if (by_topk > n_vocab)
            by_topk = 0; /* a vocabulary smaller than the top logprobs asked for */
    }
    int32_t tk_ids[STRATA_SAMPLER_TOPK_MAX];
    float tk_vals[STRATA_SAMPLER_TOPK_MAX];
    const int32_t *tki = tk_ids; /* the last step's top-k: ours, or the spec's */
    const float *tkv = tk_vals;
    double tk_lse = 0;
    int have_tk = 0; /* the last step's top-k (and log-sum-exp) are in tki/tkv */
    if (p->spec) /* its windows without drafts the same way */
        strata_spec_set_topk(p->spec, by_topk, want_lp);
    for (;;) {
        if (p->n_predict >= 0 && res->n_gen >= p->n_predict) {
            res->stop_reason = STRATA_STOP_LENGTH;
            break;
        }
        float lp = 0;
        int n_top = p->n_top_logprobs;
        int32_t id;
        if (next >= 0) {
            id = next;
        } else if (have_tk) {
            id = samp_k > 0 ? strata_sampler_sample_topk(smp, tki, tkv, samp_k) : tki[0];
            for (int32_t j = 0; j < by_topk; j++) {
                const float l = (float)((double)tkv[j] - tk_lse);
                if (tki[j] == id)
                    lp = l;
                if (j < n_top) {
                    top[j].id = tki[j];
                    top[j].logprob = tki[j] >= 0 ? l : -INFINITY;
                }
            }
        } else {
            id = strata_sampler_sample(smp, cur, p->logprobs || n_top ? &lp : NULL,
                                       n_top ? top : NULL, n_top);
        }
        if (!p->ignore_eog && strata_vocab_is_eog(v, id)) {
            res->stop_reason = STRATA_STOP_EOG;
            break;
        }
        strata_sampler_accept(smp, &id, 1);
        if ((size_t)res->n_gen + 1 > cap_ids) {
            size_t cap = cap_ids ? cap_ids * 2 : 64;
            int32_t *q = realloc(ids, cap * sizeof *q);
            if (!q) {
                rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
                goto out;
            }
            ids = q;
            cap_ids = cap;
        }
        ids[res->n_gen++] = id;

        size_t np = 0;
        if ((rc = strata_detok_push(&dt, id, piece, piece_cap, &np, err)))
            goto out;
        if (buf_add(&text, piece, np)) {
            rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
            goto out;
        }
        /* a stop string may start up to (longest - 1) bytes before the new text */
        int which = -1;
        long at = find_stop(text.p, text.n, searched, p, &which);
        size_t upto;
        if (at >= 0) {
            text.n = (size_t)at;
            text.p[text.n] = 0;
            upto = text.n;
            res->stop_reason = STRATA_STOP_STRING;
            res->stop_index = which;
        } else {
            upto = text.n - stop_hold(text.p, text.n, p);
            searched = upto;
        }
        if (upto < released)
            upto = released;
        struct strata_gen_token tk;
        tk.id = id;
        tk.text = text.p + released;
        tk.text_len = upto - released;
        tk.logprob = lp;
        tk.top = top;
        tk.n_top = n_top;
        tk.index = res->n_gen - 1;
        released = upto;
        if (cb && cb(&tk, ud) && res->stop_reason != STRATA_STOP_STRING) {
            res->stop_reason = STRATA_STOP_CANCEL;
            break;
        }
        if (res->stop_reason == STRATA_STOP_STRING)
            break;
        if (p->n_predict >= 0 && res->n_gen >= p->n_predict) {
            res->stop_reason = STRATA_STOP_LENGTH;
            break;
        }
        if ((p->spec ? strata_spec_n_past(p->spec) : strata_engine_n_past(e)) >= n_ctx) {
            res->stop_reason = STRATA_STOP_CTX;
            break;
        }
        if ((rc = p->spec       ? strata_spec_next(p->spec, id, &cur, err)
                  : by_argmax ? strata_engine_eval_argmax(e, &id, 1, &next, err)
                  : by_topk   ? strata_engine_eval_topk(e, &id, 1, by_topk, tk_ids, tk_vals,
                                                          want_lp ? &tk_lse : NULL, err)
                              : strata_engine_eval_row(e, &id, 1, &cur, err)))
            goto out;
        have_tk = by_topk > 0 && (!p->spec || !cur);
        if (have_tk && p->spec)
            strata_spec_topk(p->spec, &tki, &tkv, &tk_lse);
        n_evals++;
    }
    /* drop drafted positions that were never decided */
    if (p->spec && (rc = strata_spec_end(p->spec, err)))
        goto out;
    /* release what was held back (a partial stop string that never completed,
     * an incomplete UTF-8 tail) */
    if (res->stop_reason != STRATA_STOP_STRING) {
        size_t np = 0;
        strata_detok_flush(&dt, piece, piece_cap, &np);
        if (buf_add(&text, piece, np)) {
            rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
            goto out;
        }
        if (text.n > released && cb && res->n_gen > 0) {
            struct strata_gen_token tk = { ids[res->n_gen - 1], text.p + released,
                                           text.n - released, 0, NULL, 0, -1 };
            cb(&tk, ud);
        }
        released = text.n;
    }
    double t2 = now_ms();
    res->t_decode_ms = t2 - t1;
    if (n_evals > 0 && res->t_decode_ms > 0)
        res->decode_tps = n_evals / (res->t_decode_ms / 1e3);
out:
    res->text = text.p ? text.p : calloc(1, 1);
    res->text_len = text.p ? text.n : 0;
    res->ids = ids;
    strata_sampler_free(smp);
    free(logits);
    free(piece);
    return rc;
}

int strata_perplexity(struct strata_engine *e, const int32_t *ids, size_t n_ids,
                      int32_t n_ctx, int32_t n_chunks, int add_bos, int32_t bos,
                      void (*progress)(int chunk, int n_chunk, double ppl, void *ud),
                      void *ud, double *ppl, double *ppl_err, struct strata_err *err)
{
    const int32_t n_vocab = strata_engine_n_vocab(e);
    float *logits = NULL;
    int32_t *chunk = NULL;
    int rc = 0;
    if (n_ctx < 4 || n_ctx > strata_engine_n_ctx(e))
        return strata_err_set(err, STRATA_E_INVALID, "perplexity context %d outside 4..%d "
                              "(the engine's --ctx)", n_ctx, strata_engine_n_ctx(e));
    if (n_ids < 2 * (size_t)n_ctx)
        return strata_err_set(err, STRATA_E_INVALID, "perplexity needs at least %d tokens "
                              "for a context of %d, the text has %zu", 2 * n_ctx, n_ctx,
                              n_ids);
    if (add_bos && bos < 0)
        return strata_err_set(err, STRATA_E_INVALID, "add_bos set but the vocabulary has no "
                              "BOS token");
    int n_chunk = (int)(n_ids / (size_t)n_ctx);
    if (n_chunks > 0 && n_chunks < n_chunk)
        n_chunk = n_chunks;
    const int first = n_ctx / 2;
    logits = malloc((size_t)(n_ctx - first) * n_vocab * sizeof *logits);
    chunk = malloc((size_t)n_ctx * sizeof *chunk);
    if (!logits || !chunk) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    double nll = 0, nll2 = 0;
    long count = 0;
    for (int c = 0; c < n_chunk; c++) {
        memcpy(chunk, ids + (size_t)c * n_ctx, (size_t)n_ctx * sizeof *chunk);
        if (add_bos)
            chunk[0] = bos;
        if ((rc = strata_engine_rollback(e, 0, err)))
            goto out;
        /* the first half only fills the kv cache; the second half's logits
         * are the same as in one batch (the engine is batch-invariant) */
        if ((rc = strata_engine_eval(e, chunk, first, STRATA_LOGITS_NONE, NULL, err)) ||
            (rc = strata_engine_eval(e, chunk + first, n_ctx - first, STRATA_LOGITS_ALL,
                                     logits, err)))
            goto out;
        for (int i = first; i < n_ctx - 1; i++) {
            const float *l = logits + (size_t)(i - first) * n_vocab;
            double v = -(double)strata_sampler_logprob(l, n_vocab, chunk[i + 1]);
            nll += v;
            nll2 += v * v;
            count++;
        }
        if (progress)
            progress(c, n_chunk, exp(nll / count), ud);
    }
    double mean = nll / count, mean2 = nll2 / count;
    *ppl = exp(mean);
    double var = mean2 - mean * mean;
    *ppl_err = var > 0 && count > 1 ? sqrt(var / (count - 1)) * *ppl : 0;
    strata_engine_rollback(e, 0, NULL);
out:
    free(logits);
    free(chunk);
    return rc;
}
