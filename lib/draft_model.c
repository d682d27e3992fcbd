/* draft_model.c - drafts from a small model with the target's vocabulary,
 * run greedily through its own engine; and the (unavailable) drafts from a
 * model's own multi-token-prediction layers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "gguf.h"
#include "sampler.h"
#include "spec.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

struct model_state {
    struct strata_engine *e; /* not owned */
    float *logits;           /* [n_vocab] */
    int32_t piece;           /* most tokens of a catch-up batch without logits */
    int32_t logits_at;       /* logits follow the draft's first logits_at positions
                                (-1: none) */
    /* The draft's context: hist[0, keep) then hist[keep + skip, n_hist) (skip 0: the
     * whole history), built in view[view_cap] when skip > 0 */
    int32_t keep, skip;
    uint64_t skipped; /* hash of hist[keep, keep + skip): the same history goes on */
    int32_t *view;
    size_t view_cap;
};

/* FNV-1a over n token ids (tells another history from the one whose middle was
 * skipped). */
static uint64_t ids_hash(const int32_t *ids, int32_t n)
{
    uint64_t h = 14695981039346656037ull;
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint32_t)ids[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* The draft's context of hist (hist itself while nothing is skipped); NULL when
 * out of memory. */
static const int32_t *view_of(struct model_state *st, const int32_t *hist, int32_t n_hist,
                              int32_t *n_view)
{
    *n_view = n_hist;
    if (st->skip == 0)
        return hist;
    const int32_t n = n_hist - st->skip;
    if ((size_t)n > st->view_cap) {
        size_t cap = 2 * (size_t)n;
        int32_t *v = realloc(st->view, cap * sizeof *v);
        if (!v)
            return NULL;
        st->view = v;
        st->view_cap = cap;
    }
    memcpy(st->view, hist, (size_t)st->keep * sizeof *hist);
    memcpy(st->view + st->keep, hist + st->keep + st->skip,
           (size_t)(n - st->keep) * sizeof *hist);
    *n_view = n;
    return st->view;
}

/* Greedy drafting from the logits after the draft's last position: n_max tokens,
 * each the argmax after the one before. */
static int draft_from(struct model_state *st, int32_t n_max, int32_t *out, int32_t *n_out,
                      struct strata_err *err)
{
    const int32_t nv = strata_engine_n_vocab(st->e);
    for (int32_t k = 0; k < n_max; k++) {
        out[k] = strata_sampler_argmax(st->logits, nv);
        *n_out = k + 1;
        if (k + 1 < n_max) {
            st->logits_at = -1;
            int rc = strata_engine_eval(st->e, out + k, 1, STRATA_LOGITS_LAST, st->logits, err);
            if (rc)
                return rc;
            st->logits_at = strata_engine_n_past(st->e);
        }
    }
    return 0;
}

static int model_propose(void *state, const int32_t *hist, int32_t n_hist, int32_t n_max,
                         int32_t *out, int32_t *n_out, struct strata_err *err)
{
    struct model_state *st = state;
    const int32_t nv = strata_engine_n_vocab(st->e), n_ctx = strata_engine_n_ctx(st->e);
    int rc;
    *n_out = 0;
    if (n_max < 0)
        return 0;
    if (n_max > n_ctx)
        n_max = n_ctx;
    for (int32_t i = 0; i < n_hist; i++)
        if (hist[i] < 0 || hist[i] >= nv)
            return 0; /* image positions: nothing the draft can read */
    /* a history that no longer holds the kept prefix and the skipped part (another
     * generation) is read whole again */
    if (st->skip && (n_hist <= st->keep + st->skip ||
                     strata_engine_common_prefix(st->e, hist, st->keep) < st->keep ||
                     ids_hash(hist + st->keep, st->skip) != st->skipped))
        st->keep = st->skip = 0;
    int32_t n_view;
    const int32_t *v = view_of(st, hist, n_hist, &n_view);
    if (!v)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    int32_t common = strata_engine_common_prefix(st->e, v, n_view);
    /* Skip the middle of what the draft has not seen when that is a plain run longer
     * than STRATA_SPEC_CATCHUP (n_max 0, see spec.h): the draft keeps what it has and
     * reads the last STRATA_SPEC_CATCHUP tokens after it; or when its context has no
     * room for the window's drafts: it keeps at most the first half of its context. */
    const int full = n_view + (n_max > 0 ? n_max - 1 : 0) > n_ctx;
    if (full || (n_max == 0 && n_view - common > STRATA_SPEC_CATCHUP)) {
        int32_t keep = st->skip ? st->keep : full ? n_ctx / 2 : common;
        if (full && keep > n_ctx / 2)
            keep = n_ctx / 2;
        const int32_t more = n_max > 0 ? n_max - 1 : 0; /* the drafts after the last */
        if (keep + STRATA_SPEC_CATCHUP + more > n_ctx)
            keep = n_ctx - STRATA_SPEC_CATCHUP - more;
        if (keep < 0 || n_hist - STRATA_SPEC_CATCHUP <= keep)
            return 0; /* a context too small for STRATA_SPEC_CATCHUP tokens: no drafts */
        st->keep = keep;
        st->skip = n_hist - STRATA_SPEC_CATCHUP - keep;
        st->skipped = ids_hash(hist + keep, st->skip);
        if (!(v = view_of(st, hist, n_hist, &n_view)))
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        common = strata_engine_common_prefix(st->e, v, n_view);
    }
    if (common == n_view && strata_engine_n_past(st->e) == n_view && st->logits_at == n_view)
        return draft_from(st, n_max, out, n_out, err); /* caught up already (n_max 0) */
    if (common == n_view)
        common--; /* the last position must be evaluated for its logits */
    /* Catch up on the tokens the draft has not seen.  Drafting windows leave it one
     * or two behind; after the back-off's plain run it is the run's last
     * STRATA_SPEC_CATCHUP tokens (the draft does not run while no window drafts), and
     * at the first window of a generation the prompt.  Three or more go as batches
     * without logits and then the last token alone, so the only batch sizes that ask
     * for logits are 1 and 2: a GPU backend captures a graph per size that asks for
     * logits (about a millisecond each, on the first use of the size) and a prompt
     * has a new size every time. */
    int32_t n_new = n_view - common;
    st->logits_at = -1;
    if ((rc = strata_engine_rollback(st->e, common, err)))
        return rc;
    /* On a device backend the batch without logits goes in pieces of at most
     * STRATA_SPEC_MAX + 1 tokens: those take the mat-vec kernels every window uses,
     * where a longer batch takes the prefill path with a batch size not seen before
     * (one such catch-up took 3.9 ms on the H200 with tinydraft, most of what the
     * draft model cost there on text where it ends up drafting nothing).  The CPU
     * takes it whole (one pass over the draft's weights; st->piece). */
    for (int32_t done = 0, todo = n_new > 2 ? n_new - 1 : 0; todo > 0;) {
        int32_t c = todo < st->piece ? todo : st->piece;
        if ((rc = strata_engine_eval(st->e, v + common + done, c, STRATA_LOGITS_NONE, NULL,
                                     err)))
            return rc;
        done += c;
        todo -= c;
    }
    if ((rc = strata_engine_eval(st->e, v + n_view - (n_new > 2 ? 1 : n_new),
                                 n_new > 2 ? 1 : n_new, STRATA_LOGITS_LAST, st->logits, err)))
        return rc;
    st->logits_at = n_view;
    return draft_from(st, n_max, out, n_out, err);
}

static void model_free(void *state)
{
    struct model_state *st = state;
    if (st) {
        free(st->logits);
        free(st->view);
    }
    free(st);
}

int strata_draft_model_init(struct strata_spec_draft *d, struct strata_engine *draft,
                            const struct strata_engine *target, struct strata_err *err)
{
    memset(d, 0, sizeof *d);
    if (strata_engine_n_vocab(draft) != strata_engine_n_vocab(target))
        return strata_err_set(err, STRATA_E_INVALID, "draft model vocabulary of %d tokens "
                              "differs from the target's %d", strata_engine_n_vocab(draft),
                              strata_engine_n_vocab(target));
    struct model_state *st = calloc(1, sizeof *st);
    if (st)
        st->logits = malloc((size_t)strata_engine_n_vocab(draft) * sizeof *st->logits);
    if (!st || !st->logits) {
        model_free(st);
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    }
    st->e = draft;
    st->logits_at = -1;
    const char *be = strata_engine_backend_name(draft);
    st->piece = be && strcmp(be, "cpu") != 0 ? STRATA_SPEC_MAX + 1 : INT32_MAX;
    /* Warm-up: the draft's first forward calls carry one-time costs (a GPU backend
     * loads kernels, sets up its matrix library and captures a graph per batch size
     * that asks for logits, on the second use of the size); paid here, at open, they
     * do not fall on the first drafting windows, whose timing the back-off learns
     * from.  The shapes are the ones drafting uses: single steps and catch-ups of 2
     * (each twice), and batches without logits (small and large).  The draft's kv
     * cache is left empty. */
    {
        int32_t ids[40] = { 0 }, n_big = strata_engine_n_prefill(draft);
        if (n_big > strata_engine_n_ctx(draft) - 4)
            n_big = strata_engine_n_ctx(draft) - 4;
        if (n_big > 40)
            n_big = 40;
        int rc = 0, warm = n_big >= 4 && strata_engine_n_past(draft) == 0;
        if (warm &&
            ((rc = strata_engine_eval(draft, ids, 1, STRATA_LOGITS_LAST, st->logits, err)) ||
             (rc = strata_engine_eval(draft, ids, 2, STRATA_LOGITS_LAST, st->logits, err)) ||
             (rc = strata_engine_rollback(draft, 0, err)) ||
             (rc = strata_engine_eval(draft, ids, 1, STRATA_LOGITS_LAST, st->logits, err)) ||
             (rc = strata_engine_eval(draft, ids, 2, STRATA_LOGITS_LAST, st->logits, err)) ||
             (rc = strata_engine_rollback(draft, 0, err)) ||
             (rc = strata_engine_eval(draft, ids, 3, STRATA_LOGITS_NONE, NULL, err)) ||
             (rc = strata_engine_rollback(draft, 0, err)) ||
             (rc = strata_engine_eval(draft, ids, n_big, STRATA_LOGITS_NONE, NULL, err)) ||
             (rc = strata_engine_rollback(draft, 0, err)))) {
            model_free(st);
            strata_err_wrap(err, "draft model warm-up: ");
            return rc;
        }
        /* single steps, timed, the fastest of 16: what a drafted token costs (the
         * back-off's calibration, strata_spec_create).  The fastest, because a
         * preemption only slows a step down, and because the first steps after opening
         * a model are slow for a while (tinydraft on 2 threads: 0.8 ms a step for the
         * first 10-15, then 0.06) */
        for (int i = 0; warm && i < 16; i++) {
            double t0 = now_ms();
            if ((rc = strata_engine_eval(draft, ids, 1, STRATA_LOGITS_LAST, st->logits, err)) ||
                (rc = strata_engine_rollback(draft, 0, err))) {
                model_free(st);
                strata_err_wrap(err, "draft model warm-up: ");
                return rc;
            }
            double t = now_ms() - t0;
            if (i == 0 || t < d->step_ms)
                d->step_ms = t;
        }
    }
    d->name = "draft";
    d->state = st;
    d->propose = model_propose;
    d->free = model_free;
    return 0;
}

int strata_draft_mtp_init(struct strata_spec_draft *d, const struct strata_gguf *g,
                          struct strata_err *err)
{
    const char *arch = NULL;
    char key[256];
    uint32_t n = 0;
    memset(d, 0, sizeof *d);
    if (!g || strata_gguf_get_str(g, "general.architecture", &arch, NULL))
        return strata_err_set(err, STRATA_E_UNSUPPORTED, "multi-token prediction unavailable: "
                              "the model has no general.architecture");
    snprintf(key, sizeof key, "%s.nextn_predict_layers", arch);
    if (strata_gguf_get_u32(g, key, &n, NULL) || n == 0)
        return strata_err_set(err, STRATA_E_UNSUPPORTED, "multi-token prediction unavailable: "
                              "the model has no nextn layers (%s absent or 0); use "
                              "--spec-mode ngram or --draft MODEL", key);
    return strata_err_set(err, STRATA_E_UNSUPPORTED, "multi-token prediction unavailable: "
                          "the model has %u nextn layers (%s) but drafting with them is not "
                          "implemented; use --spec-mode ngram or --draft MODEL", n, key);
}
