/* spec.c - the speculative verify loop (see spec.h), its back-off and
 * statistics, and the general rejection-sampling step. */
#include "spec.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

struct strata_spec {
    struct strata_engine *e;
    struct strata_spec_draft draft;
    int have_draft;
    int n_max;     /* T */
    int adaptive;
    /* back-off: a cost model of the windows seen so far */
    double t_win[STRATA_SPEC_MAX + 1]; /* mean ms (draft + verify) of windows of k drafts */
    int n_win[STRATA_SPEC_MAX + 1];    /* how many were measured (capped) */
    unsigned char seen[STRATA_SPEC_MAX + 1]; /* a window of k drafts ran (the first of
                                                each size is a warm-up, not timed) */
    double acc, rej;  /* decayed counts: drafts accepted, windows with a rejection */
    int plain_run;    /* windows chosen without drafts in a row */
    int draft_run;    /* windows chosen with drafts in a row */
    int probe_every;  /* plain steps in a row before a probing window */
    int probing;      /* the current window is a probe */
    double win_ms;    /* the current window's time (draft + verify) */
    int32_t n_vocab;
    float *rows;   /* [(n_max + 1) * n_vocab] logits of the current window */
    int32_t *hist; /* [n_ctx + 1] scratch: history + the accepted token */
    int32_t win[STRATA_SPEC_MAX + 1]; /* the window: accepted token, then drafts */
    int win_n;     /* tokens in the window */
    int cur;       /* the row handed out last */
    int32_t base;  /* position of win[0] */
    int active;
    struct strata_spec_stats st;
};

/* Plain steps in a row before a window probes whether drafting pays again: from
 * SPEC_PROBE_MIN, doubled after each probe that did not pay, up to SPEC_PROBE_MAX. */
#define SPEC_PROBE_MIN 32
#define SPEC_PROBE_MAX 256
/* A probe whose draft proposed nothing (no n-gram match) learnt nothing: the next
 * probe comes this many plain steps later, the wait is not doubled. */
#define SPEC_PROBE_RETRY 4

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static const char *const mode_names[] = { "auto", "ngram", "draft", "mtp" };

int strata_spec_mode_parse(const char *name)
{
    for (int i = 0; i < 4; i++)
        if (name && strcmp(name, mode_names[i]) == 0)
            return i;
    return -1;
}

const char *strata_spec_mode_name(int mode)
{
    return mode >= 0 && mode < 4 ? mode_names[mode] : "unknown";
}

void strata_spec_opts_init(struct strata_spec_opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_max = 4;
    o->mode = STRATA_SPEC_AUTO;
    o->ngram_min = 2;
    o->ngram_max = 5;
    o->adaptive = 1;
}

int strata_spec_create(struct strata_spec **out, struct strata_engine *target,
                       const struct strata_spec_opts *o, struct strata_err *err)
{
    struct strata_spec_opts def;
    struct strata_spec *s = NULL;
    int rc = 0;
    *out = NULL;
    if (!o) {
        strata_spec_opts_init(&def);
        o = &def;
    }
    if (o->n_max < 0 || o->n_max > STRATA_SPEC_MAX)
        return strata_err_set(err, STRATA_E_INVALID, "speculative window %d outside 0..%d",
                              o->n_max, STRATA_SPEC_MAX);
    if (o->mode < STRATA_SPEC_AUTO || o->mode > STRATA_SPEC_MTP)
        return strata_err_set(err, STRATA_E_INVALID, "unknown speculative mode %d", o->mode);
    if (o->mode == STRATA_SPEC_DRAFT && !o->draft)
        return strata_err_set(err, STRATA_E_INVALID, "speculative mode 'draft' needs a draft "
                              "model (--draft MODEL)");
    s = calloc(1, sizeof *s);
    if (!s)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    s->e = target;
    s->probe_every = SPEC_PROBE_MIN;
    s->n_max = o->n_max;
    s->adaptive = o->adaptive;
    s->n_vocab = strata_engine_n_vocab(target);
    s->rows = malloc((size_t)(o->n_max + 1) * (size_t)s->n_vocab * sizeof *s->rows);
    s->hist = malloc(((size_t)strata_engine_n_ctx(target) + 1) * sizeof *s->hist);
    if (!s->rows || !s->hist) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    if (o->n_max > 0) {
        if (o->user)
            s->draft = *o->user;
        else if (o->mode == STRATA_SPEC_MTP)
            rc = strata_draft_mtp_init(&s->draft, strata_engine_gguf(target), err);
        else if (o->mode == STRATA_SPEC_DRAFT || (o->mode == STRATA_SPEC_AUTO && o->draft))
            rc = strata_draft_model_init(&s->draft, o->draft, target, err);
        else
            rc = strata_draft_ngram_init(&s->draft, o->ngram_min, o->ngram_max, err);
        if (rc)
            goto out;
        s->have_draft = 1;
        /* Warm-up on a device backend: the second window of each size captures a
         * graph there (about a millisecond against a 0.15 ms step on an H200; the
         * first runs direct launches); run each size a window can take twice now,
         * past the kv cache's positions, and roll back, so that one-time cost falls
         * at start rather than on the generation.  The CPU has no such cost and
         * skips it. */
        const char *be = strata_engine_backend_name(target);
        int32_t n_past = strata_engine_n_past(target), n_big = o->n_max + 1;
        if (n_big > strata_engine_n_prefill(target))
            n_big = strata_engine_n_prefill(target);
        if (n_big > strata_engine_n_ctx(target) - n_past)
            n_big = strata_engine_n_ctx(target) - n_past;
        int32_t ids[STRATA_SPEC_MAX + 1] = { 0 };
        for (int32_t i = 0; be && strcmp(be, "cpu") != 0 && i < 2 * (n_big - 1); i++) {
            int32_t n = 2 + i / 2;
            if ((rc = strata_engine_eval(target, ids, n, STRATA_LOGITS_ALL, s->rows, err)) ||
                (rc = strata_engine_rollback(target, n_past, err))) {
                strata_err_wrap(err, "speculative warm-up (a %d-token window): ", n);
                goto out;
            }
        }
    }
    *out = s;
    s = NULL;
out:
    strata_spec_free(s);
    return rc;
}

void strata_spec_free(struct strata_spec *s)
{
    if (!s)
        return;
    if (s->have_draft && s->draft.free)
        s->draft.free(s->draft.state);
    free(s->rows);
    free(s->hist);
    free(s);
}

const char *strata_spec_draft_name(const struct strata_spec *s)
{
    return s->have_draft ? s->draft.name : "none";
}

int strata_spec_n_max(const struct strata_spec *s)
{
    return s->n_max;
}

void strata_spec_begin(struct strata_spec *s)
{
    s->active = 0;
    s->win_n = 0;
    s->cur = 0;
}

int32_t strata_spec_n_past(const struct strata_spec *s)
{
    return s->active ? s->base + s->cur + 1 : strata_engine_n_past(s->e);
}

static double est_ms(const struct strata_spec *s, int k);

/* Back-off: learn from a window of k drafts of which a were accepted (a < 0:
 * the generation ended inside the window, nothing learnt about acceptance). */
static void adapt(struct strata_spec *s, int k, int a)
{
    /* The first window of each size is not timed: it carries one-time costs that
     * later windows do not (a GPU backend captures a graph per batch size, about a
     * millisecond against a 0.15 ms step; first touches of scratch on the CPU), and
     * one such sample kept the mean of its size several times too high for the next
     * eight windows, so the back-off stopped drafting where windows pay.  A probe's
     * draft time is not learnt either: a draft model catches up there on every token
     * of the plain run before it, a cost of probing, not of a window. */
    int first = !s->seen[k];
    s->seen[k] = 1;
    if (!first && !(s->probing && k > 0)) {
        /* running means of the window time per size (the last ~8 windows weigh most) */
        int n = s->n_win[k] < 8 ? ++s->n_win[k] : 8;
        s->t_win[k] += (s->win_ms - s->t_win[k]) / n;
    }
    if (s->probing && a >= 0) {
        if (k == 0) {
            /* the draft proposed nothing: no evidence either way; probe again soon
             * (an n-gram search is all it costs) */
            if (s->probe_every > SPEC_PROBE_RETRY)
                s->plain_run = s->probe_every - SPEC_PROBE_RETRY;
        } else {
            /* a probe that did not pay (an accepted draft, and more tokens per
             * estimated millisecond than a plain step) doubles the wait before the
             * next one: a draft model catches up on every token it missed, so frequent
             * probes of a text that does not suit it cost more than they find */
            int paid = a > 0 && s->n_win[0] && (a + 1) * s->t_win[0] >= est_ms(s, k);
            s->probe_every = paid ? SPEC_PROBE_MIN
                                  : 2 * s->probe_every > SPEC_PROBE_MAX ? SPEC_PROBE_MAX
                                                                        : 2 * s->probe_every;
        }
        s->probing = 0;
    }
    if (k > 0 && a >= 0) {
        /* acceptance per drafted token under a geometric model: a accepted,
         * then one rejection unless all were accepted; decayed so the estimate
         * follows the text */
        s->acc = 0.9 * s->acc + a;
        s->rej = 0.9 * s->rej + (a < k);
    }
}

/* Estimated time of a window of k drafts: measured, else interpolated
 * linearly from the plain step and the nearest measured larger window
 * (optimistic, 0 slope, while nothing larger was measured). */
static double est_ms(const struct strata_spec *s, int k)
{
    if (s->n_win[k])
        return s->t_win[k];
    double t0 = s->t_win[0];
    for (int j = k + 1; j <= s->n_max; j++)
        if (s->n_win[j])
            return t0 + (s->t_win[j] - t0) * k / j;
    for (int j = k - 1; j > 0; j--)
        if (s->n_win[j])
            return t0 + (s->t_win[j] - t0) * k / j;
    return t0;
}

/* A window must promise this much more than a plain step before it is drafted:
 * the estimates are means of noisy timings and the acceptance a model of the
 * text, so near the break-even a window loses as often as it wins; giving up the
 * last 10% of the gain keeps speculation from being slower than plain decoding. */
#define SPEC_MARGIN 1.10

/* Window sizes open to exploration before any window was measured. */
#define SPEC_EXPLORE 2

/* Windows with drafts in a row before one plain step re-times the plain step. */
#define SPEC_RETIME 64

/* The number of drafts for the next window: the one with the most expected
 * tokens per millisecond, where a window of k drafts yields
 * (1 - alpha^(k+1)) / (1 - alpha) tokens at acceptance alpha, if it beats a
 * plain step by SPEC_MARGIN.  A plain step is measured first; below an
 * acceptance of 1/4 drafting is off whatever the timings say (a noisy timing of
 * the plain step would otherwise keep windows going that cost more than they
 * yield); after SPEC_RETIME windows with drafts in a row one plain step is taken
 * so the plain step's time stays current; after probe_every plain steps in a
 * row one window probes with the best k > 0 so the estimates can follow the
 * text. */
static int choose(struct strata_spec *s)
{
    if (!s->adaptive)
        return s->n_max;
    if (!s->n_win[0])
        return 0;
    double alpha = (s->acc + 1) / (s->acc + s->rej + 2); /* prior: 1/2 */
    int best = 0, best_pos = 1, cap = SPEC_EXPLORE;
    double best_rate = SPEC_MARGIN / est_ms(s, 0), best_pos_rate = 0, e = 1, pw = 1;
    /* Exploration grows from small windows: an untried size is estimated at the
     * cost of a plain step (optimistic), so without a cap the first windows would
     * be drafted at T, which loses where a draft token costs about as much as a
     * target token (a draft model on the CPU).  Sizes up to SPEC_EXPLORE are open
     * from the start; a larger one only once a measured smaller one's rate beats a
     * plain step, or once it was measured itself. */
    for (int k = 1; k <= s->n_max; k++) {
        pw *= alpha;
        e += pw;
        if (s->n_win[k] && k > cap)
            cap = k;
        if (s->n_win[k] && e / s->t_win[k] > 1 / s->t_win[0] && k + 1 > cap)
            cap = k + 1;
    }
    e = 1;
    pw = 1;
    for (int k = 1; k <= s->n_max && k <= cap; k++) {
        pw *= alpha;
        e += pw; /* 1 + alpha + ... + alpha^k */
        double rate = e / est_ms(s, k);
        if (rate > best_rate) {
            best_rate = rate;
            best = k;
        }
        if (rate > best_pos_rate) {
            best_pos_rate = rate;
            best_pos = k;
        }
    }
    if (alpha < 0.25)
        best = 0;
    if (best > 0 && ++s->draft_run > SPEC_RETIME) {
        s->draft_run = 0;
        return 0; /* re-time the plain step (not counted as a plain run) */
    }
    if (best == 0)
        s->draft_run = 0;
    if (best == 0 && ++s->plain_run >= s->probe_every) {
        best = best_pos;
        s->probing = 1;
    }
    if (best > 0)
        s->plain_run = 0;
    return best;
}

/* Close the current window: learn from it, drop its rejected positions.
 * decided: the next token was sampled (else the generation ended). */
static int close_window(struct strata_spec *s, int decided, struct strata_err *err)
{
    if (!s->active)
        return 0;
    s->active = 0;
    adapt(s, s->win_n - 1, decided || s->cur + 1 == s->win_n ? s->cur : -1);
    int32_t keep = s->base + s->cur + 1;
    if (strata_engine_n_past(s->e) > keep)
        return strata_engine_rollback(s->e, keep, err);
    return 0;
}

int strata_spec_next(struct strata_spec *s, int32_t id, const float **logits,
                     struct strata_err *err)
{
    int rc;
    if (s->active && s->cur + 1 < s->win_n && s->win[s->cur + 1] == id) {
        s->cur++;
        s->st.n_tokens++;
        s->st.n_accepted++;
        *logits = s->rows + (size_t)s->cur * s->n_vocab;
        return 0;
    }
    if ((rc = close_window(s, 1, err)))
        return rc;

    const int32_t n_past = strata_engine_n_past(s->e);
    int32_t room = strata_engine_n_ctx(s->e) - n_past - 1;
    int32_t k_max = s->have_draft ? choose(s) : 0;
    if (k_max > room)
        k_max = room;
    if (k_max > strata_engine_n_prefill(s->e) - 1)
        k_max = strata_engine_n_prefill(s->e) - 1;
    int32_t k = 0;
    double t_draft = 0;
    s->win[0] = id;
    if (s->have_draft && k_max > 0) {
        double t0 = now_ms();
        memcpy(s->hist, strata_engine_history(s->e), (size_t)n_past * sizeof *s->hist);
        s->hist[n_past] = id;
        rc = s->draft.propose(s->draft.state, s->hist, n_past + 1, k_max, s->win + 1, &k, err);
        t_draft = now_ms() - t0;
        s->st.t_draft_ms += t_draft;
        if (rc)
            return rc;
        if (k < 0 || k > k_max)
            k = k < 0 ? 0 : k_max;
    }
    double t0 = now_ms();
    rc = strata_engine_eval(s->e, s->win, k + 1, k ? STRATA_LOGITS_ALL : STRATA_LOGITS_LAST,
                            s->rows, err);
    double t_verify = now_ms() - t0;
    s->st.t_verify_ms += t_verify;
    if (rc)
        return rc;
    s->win_ms = t_draft + t_verify;
    s->base = n_past;
    s->cur = 0;
    s->win_n = k + 1;
    s->active = 1;
    s->st.n_steps++;
    s->st.n_tokens++;
    s->st.n_drafted += (uint64_t)k;
    *logits = s->rows;
    return 0;
}

int strata_spec_end(struct strata_spec *s, struct strata_err *err)
{
    return close_window(s, 0, err);
}

void strata_spec_stats_get(const struct strata_spec *s, struct strata_spec_stats *st)
{
    *st = s->st;
}

void strata_spec_stats_reset(struct strata_spec *s)
{
    memset(&s->st, 0, sizeof s->st);
}

int32_t strata_spec_accept_reject(const float *p, const float *q, int32_t n, int32_t x,
                                  double u1, double u2, int *accepted)
{
    if (x >= 0 && x < n && u1 * (double)q[x] < (double)p[x]) {
        if (accepted)
            *accepted = 1;
        return x;
    }
    if (accepted)
        *accepted = 0;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) {
        double r = (double)p[i] - q[i];
        sum += r > 0 ? r : 0;
    }
    int use_p = !(sum > 0);
    if (use_p) {
        sum = 0;
        for (int32_t i = 0; i < n; i++)
            sum += p[i];
    }
    double t = u2 * sum, cum = 0;
    int32_t last = -1;
    for (int32_t i = 0; i < n; i++) {
        double r = use_p ? (double)p[i] : (double)p[i] - q[i];
        if (!(r > 0))
            continue;
        last = i;
        cum += r;
        if (t < cum)
            return i;
    }
    return last >= 0 ? last : (x >= 0 && x < n ? x : 0);
}
