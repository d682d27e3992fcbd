/* spec.c - the speculative verify loop (see spec.h), its back-off and
 * statistics, and the general rejection-sampling step. */
#include "spec.h"
#include "sampler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

struct strata_spec {
    struct strata_engine *e;
    struct strata_spec_draft draft;
    int have_draft;
    int n_max;     /* T */
    struct strata_spec_backoff bo; /* the back-off's cost model */
    double win_ms; /* the current window's time (draft + verify) */
    double catchup_ms; /* the draft's catch-up before it (probes) */
    int32_t n_vocab;
    float *rows;   /* [(n_max + 1) * n_vocab] logits of the current window */
    int32_t *hist; /* [n_ctx + 1] scratch: history + the accepted token */
    int32_t win[STRATA_SPEC_MAX + 1]; /* the window: accepted token, then drafts */
    int win_n;     /* tokens in the window */
    int cur;       /* the row handed out last */
    int32_t base;  /* position of win[0] */
    int active;
    int trace;     /* STRATA_SPEC_TRACE=1: one line per window on stderr */
    int plain;     /* STRATA_SPEC_PLAIN=1: never draft (the loop's own cost, measured) */
    /* a cheap draft's proposals at a plain step, checked against the tokens that follow
     * (strata_spec_backoff_evidence): sh[0..sh_n) for the positions from sh_pos on,
     * sh_i of them matched so far; sh_n 0: none pending */
    int32_t sh[STRATA_SPEC_MAX];
    int sh_n, sh_i;
    int32_t sh_pos;
    /* strata_spec_set_topk: windows without drafts bring back only these */
    int32_t top_k;
    int top_lse;
    int32_t tk_ids[STRATA_SAMPLER_TOPK_MAX];
    float tk_vals[STRATA_SAMPLER_TOPK_MAX];
    double tk_lse;
    struct strata_spec_stats st;
};

/* Plain steps in a row before a window probes whether drafting pays again: from
 * SPEC_PROBE_MIN, doubled each time drafting stops without having paid for itself, up
 * to SPEC_PROBE_MAX (far past a typical generation: the model lives as long as its
 * speculative state, across a server's requests).  While every size open to
 * exploration is hopeless (no acceptance could make it pay) the wait is
 * SPEC_PROBE_MAX. */
#define SPEC_PROBE_MIN 16
#define SPEC_PROBE_MAX 4096
/* The wait is also at least the draft's catch-ups since drafting last paid, in plain
 * steps, over this: a draft model catches up on up to STRATA_SPEC_CATCHUP tokens of a
 * plain run when a probe comes, so its probes then cost about this share of the plain
 * steps (at 0.01 they were 0.7-0.9% of a 512-token run on an H200, about all that
 * the draft model's rows lost against plain decoding there). */
#define SPEC_PROBE_SHARE 0.0025
/* A probe whose draft proposed nothing (no n-gram match) learnt nothing: the next
 * probe comes this many plain steps later, the wait is not doubled. */
#define SPEC_PROBE_RETRY 4

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* 1 if environment variable name is set to anything but "" or "0". */
static int env_on(const char *name)
{
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0;
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

/* Time a plain step and a window of one draft's verify on s->e, past its kv cache
 * (rolled back to n_past after each): one untimed pair, then the fastest of 5 of each
 * (a shared machine's preemptions only ever slow a call down); seed the back-off with
 * (window + the draft's step) / plain step. */
static int calibrate(struct strata_spec *s, int32_t n_past, struct strata_err *err)
{
    /* two different tokens: a MoE routes two equal ones to the same experts, and a
     * window of 0, 0 cost 1.6 plain steps where real windows cost 2 */
    const int32_t ids[2] = { s->n_vocab / 3, 2 * (s->n_vocab / 3) };
    double t1 = 0, t2 = 0;
    int rc = 0;
    for (int i = 0; i < 6 && !rc; i++) {
        double ta = now_ms();
        if ((rc = strata_engine_eval(s->e, ids, 1, STRATA_LOGITS_LAST, s->rows, err)))
            break;
        double tb = now_ms();
        if ((rc = strata_engine_rollback(s->e, n_past, err)))
            break;
        double tc = now_ms();
        if ((rc = strata_engine_eval(s->e, ids, 2, STRATA_LOGITS_ALL, s->rows, err)))
            break;
        double td = now_ms();
        rc = strata_engine_rollback(s->e, n_past, err);
        if (i == 1 || (i > 1 && tb - ta < t1))
            t1 = tb - ta;
        if (i == 1 || (i > 1 && td - tc < t2))
            t2 = td - tc;
    }
    if (!rc && t1 > 0)
        strata_spec_backoff_seed(&s->bo, 1, (t2 + s->draft.step_ms) / t1);
    return rc;
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
    s->n_max = o->n_max;
    s->trace = env_on("STRATA_SPEC_TRACE");
    s->plain = env_on("STRATA_SPEC_PLAIN");
    strata_spec_backoff_init(&s->bo, o->n_max, o->adaptive);
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
        /* Calibration: a window of one draft (2 positions, every row's logits, and a
         * draft model's step if any) against a plain step, past the kv cache and
         * rolled back (calibrate).  The back-off could learn it only by drafting: the
         * first drafting window of a draft model catches the draft up on the whole
         * prompt (7-8 ms for 142 tokens with tinydraft on 2 threads, where windows of
         * one draft cost 1.9 plain steps and can never pay), and an n-gram's exploring
         * windows cost as much where a window is hopeless.  On the CPU only: a
         * device's windows cost about a step, and a draft step timed too slow there
         * would close drafting where it pays. */
        if (o->adaptive && n_big >= 2 && be &&
            strcmp(be, "cpu") == 0 && (rc = calibrate(s, n_past, err))) {
            strata_err_wrap(err, "speculative calibration: ");
            goto out;
        }
        /* a draft model's probe catches up on up to STRATA_SPEC_CATCHUP tokens: on a
         * device backend in pieces of STRATA_SPEC_MAX + 1 and the last token alone
         * (draft_model.c), each about a step; on the CPU one batch and the last token,
         * at least two steps.  Known before the first probe, so that one already
         * waits its share (SPEC_PROBE_SHARE) */
        if (s->draft.step_ms > 0) {
            int dev = be && strcmp(be, "cpu") != 0;
            int evals = dev ? (STRATA_SPEC_CATCHUP + STRATA_SPEC_MAX) / (STRATA_SPEC_MAX + 1) + 1
                            : 2;
            s->bo.catchup_ms_est = evals * s->draft.step_ms;
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
    s->sh_n = 0;
}

int32_t strata_spec_n_past(const struct strata_spec *s)
{
    return s->active ? s->base + s->cur + 1 : strata_engine_n_past(s->e);
}

/* A window must promise this much more than a plain step before it is drafted:
 * the estimates are medians of noisy timings and the acceptance a model of the
 * text, so near the break-even a window loses as often as it wins; giving up the
 * last 10% of the gain keeps speculation from being slower than plain decoding. */
#define SPEC_MARGIN 1.10

/* Timed windows a size needs before its cost is trusted: until then it is explored
 * (the first window of a size is not timed, so this is its third window). */
#define SPEC_EXPLORE 2

/* Decayed acceptance evidence (accepted drafts plus rejections) before a larger size
 * is explored: about 5 windows (after 3 accepted windows of 1 draft alpha is already
 * 0.79, and exploring a larger size on that evidence lost on text that repeats
 * little). */
#define SPEC_GROW_EVIDENCE 4

/* Timed plain steps before the first window: the plain step is the unit of every
 * cost, and the first steps of a generation are often slower than the rest. */
#define SPEC_PLAIN_FIRST 4

/* Windows with drafts in a row before one plain step re-times the plain step. */
#define SPEC_RETIME 64

void strata_spec_backoff_init(struct strata_spec_backoff *b, int n_max, int adaptive)
{
    memset(b, 0, sizeof *b);
    b->n_max = n_max < 0 ? 0 : n_max > STRATA_SPEC_MAX ? STRATA_SPEC_MAX : n_max;
    b->adaptive = adaptive;
    b->probe_every = SPEC_PROBE_MIN;
}

/* Estimated cost of a window of k drafts in plain steps: measured, else
 * interpolated linearly between the plain step (1) and the nearest measured
 * larger size, else extrapolated from the nearest measured smaller one (1 while
 * nothing was measured: an optimistic guess that exploration, one size at a
 * time, corrects). */
static double est_cost(const struct strata_spec_backoff *b, int k)
{
    if (k == 0 || b->n_win[k])
        return k == 0 ? 1 : b->cost[k];
    for (int j = k + 1; j <= b->n_max; j++)
        if (b->n_win[j])
            return 1 + (b->cost[j] - 1) * k / j;
    for (int j = k - 1; j > 0; j--)
        if (b->n_win[j])
            return 1 + (b->cost[j] - 1) * k / j;
    return 1;
}

/* k drafts cannot pay even if all are accepted: k + 1 tokens from a window that
 * costs k + 1 plain steps or more (with the margin). */
static int hopeless(const struct strata_spec_backoff *b, int k)
{
    return SPEC_MARGIN * est_cost(b, k) >= k + 1;
}

/* The acceptance per drafted token, geometric model, prior 1/2. */
static double alpha_of(const struct strata_spec_backoff *b)
{
    return (b->acc + 1) / (b->acc + b->rej + 2);
}

/* Expected tokens of a window of k drafts: 1 + alpha + ... + alpha^k. */
static double yield_of(double alpha, int k)
{
    double e = 1, pw = 1;
    for (int i = 1; i <= k; i++) {
        pw *= alpha;
        e += pw;
    }
    return e;
}

/* Drafting stopped without having paid for itself (a probe that did not pay, or
 * windows that stopped paying): the wait before the next probe doubles, and is at
 * least the draft's catch-ups since then over SPEC_PROBE_SHARE: a draft model
 * catches up on every token of the wait, so probing it costs about that share of
 * the plain steps after the probe. */
static void lengthen_wait(struct strata_spec_backoff *b)
{
    double w = 2.0 * b->probe_every, cu = b->catchup;
    if (b->catchup_ms_est > 0 && b->t_plain > 0 && b->catchup_ms_est / b->t_plain > cu)
        cu = b->catchup_ms_est / b->t_plain; /* no probe measured yet, or a cheaper one */
    if (cu / SPEC_PROBE_SHARE > w)
        w = cu / SPEC_PROBE_SHARE;
    b->probe_every = w > SPEC_PROBE_MAX ? SPEC_PROBE_MAX : (int)w;
    b->catchup = b->probe_loss = 0;
}

int strata_spec_backoff_choose(struct strata_spec_backoff *b)
{
    if (!b->adaptive)
        return b->n_max;
    if (b->n_max == 0 || b->n_win[0] < SPEC_PLAIN_FIRST)
        return 0; /* plain steps are measured first */
    double alpha = alpha_of(b);
    /* Sizes open to exploration: 1, and k + 1 once a measured k at least breaks even
     * at an acceptance learnt from about 5 windows or more (sizes that ran stay
     * open).  Not "pays": a batch's cost grows less with each position (a MoE's
     * tokens share experts), so where 2 positions cost 1.8 plain steps, 5 cost about
     * 3.3 and pay at an acceptance where 2 do not.  An untried size is estimated at
     * a plain step's cost, so without this the first windows would be drafted at T,
     * which loses where a draft token costs about as much as a target token (a
     * draft model on the CPU). */
    int grow = 1, cap;
    for (int k = 1; k < b->n_max; k++)
        if (b->n_win[k] >= SPEC_EXPLORE && b->acc + b->rej >= SPEC_GROW_EVIDENCE &&
            yield_of(alpha, k) >= b->cost[k])
            grow = k + 1;
    cap = grow;
    for (int k = grow + 1; k <= b->n_max; k++)
        if (b->n_win[k])
            cap = k;
    int best = 0, best_pos = 0;
    double best_rate = SPEC_MARGIN, best_pos_rate = 0; /* tokens per plain step */
    for (int k = 1; k <= cap; k++) {
        if (hopeless(b, k))
            continue;
        double rate = yield_of(alpha, k) / est_cost(b, k);
        if (rate >= best_rate) {
            best_rate = rate;
            best = k;
        }
        if (rate > best_pos_rate) {
            best_pos_rate = rate;
            best_pos = k;
        }
    }
    /* the size that exploration reached is taken until its cost is trusted, hopeless
     * or not (one noisy window must not close it for thousands of steps) */
    if (b->n_win[grow] < SPEC_EXPLORE)
        best = best_pos = grow;
    if (alpha < 0.25)
        best = 0;
    if (best > 0 && ++b->draft_run > SPEC_RETIME) {
        b->draft_run = 0;
        return 0; /* re-time the plain step (not counted as a plain run) */
    }
    if (best == 0) {
        if (b->draft_run > 0 && b->probe_loss > 0)
            lengthen_wait(b);
        b->draft_run = 0;
        if (best_pos == 0)
            b->probe_every = SPEC_PROBE_MAX; /* nothing open can pay: timings, not text */
        /* proposals checked at plain steps say when the text turns predictable: no
         * window probes for it, only (every SPEC_PROBE_MAX steps) to re-time sizes
         * that nothing open could pay at */
        if (++b->plain_run >= b->probe_every && (!b->shadow || best_pos == 0)) {
            best = best_pos > 0 ? best_pos : 1;
            b->probing = 1;
        }
    }
    if (best > 0)
        b->plain_run = 0;
    return best;
}

void strata_spec_backoff_seed(struct strata_spec_backoff *b, int k, double cost)
{
    if (k < 1 || k > b->n_max || !(cost > 0))
        return;
    for (int i = 0; i < SPEC_EXPLORE; i++)
        b->samp[k][i] = cost;
    b->n_win[k] = SPEC_EXPLORE;
    b->cost[k] = cost; /* seen[k] stays 0: the first real window is not timed */
}

void strata_spec_backoff_learn(struct strata_spec_backoff *b, int k, int a, double ms,
                               double catchup_ms)
{
    if (k < 0 || k > b->n_max)
        return;
    /* The first window of each size is not timed: it carries one-time costs that
     * later windows do not (a GPU backend captured a graph per batch size, about a
     * millisecond against a 0.15 ms step; first touches of scratch on the CPU), and
     * one such sample kept the mean of its size several times too high for the next
     * eight windows, so the back-off stopped drafting where windows pay.  A window's
     * cost is learnt in plain steps (its time over the plain step's median then), so
     * a change of the machine's load moves both alike. */
    int first = !b->seen[k];
    b->seen[k] = 1;
    if (!first && (k == 0 || b->n_win[0])) {
        /* the lower median of the last 8 samples: a shared machine's preemptions make
         * single windows many times slower, and one such sample in a mean closed a
         * paying size for thousands of steps */
        b->samp[k][b->n_win[k] % 8] = k == 0 ? ms : ms / b->t_plain;
        b->n_win[k] = b->n_win[k] < 15 ? b->n_win[k] + 1 : 8; /* the ring's place kept */
        int n = b->n_win[k] < 8 ? b->n_win[k] : 8;
        double v[8];
        memcpy(v, b->samp[k], (size_t)n * sizeof *v);
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
                double t = v[j];
                v[j] = v[j - 1];
                v[j - 1] = t;
            }
        if (k == 0)
            b->t_plain = v[(n - 1) / 2];
        else
            b->cost[k] = v[(n - 1) / 2];
    }
    if (k > 0 && a >= 0 && b->t_plain > 0) {
        /* what drafting has lost since it last paid for itself, in plain steps: the
         * windows and the draft's catch-ups, less the tokens they gave; once windows
         * have won it back, probing starts over from the shortest wait */
        b->catchup += catchup_ms / b->t_plain;
        b->probe_loss += (ms + catchup_ms) / b->t_plain - (a + 1);
        if (b->probe_loss < 0) {
            b->catchup = b->probe_loss = 0;
            b->probe_every = SPEC_PROBE_MIN;
        }
    }
    if (b->probing && a >= 0) {
        if (k == 0) {
            /* the draft proposed nothing: no evidence either way; probe again soon
             * (an n-gram search is all it costs) */
            if (b->probe_every > SPEC_PROBE_RETRY)
                b->plain_run = b->probe_every - SPEC_PROBE_RETRY;
        } else if (a > 0 && a + 1 >= est_cost(b, k)) {
            /* it paid (its tokens at its size's usual cost at least match plain
             * steps): the text has changed since drafting stopped, so the rejections
             * that stopped it are forgotten, and while the acceptance has less evidence
             * than exploring a larger window needs, the next window probes again at
             * once (a chain of probes that pay is about break-even, so it ends there) */
            b->rej = 0;
            if (0.9 * b->acc + a + (a < k) < SPEC_GROW_EVIDENCE) /* after this window */
                b->plain_run = b->probe_every;
        } else {
            lengthen_wait(b); /* it did not */
        }
    }
    b->probing = 0;
    if (k > 0 && a >= 0) {
        /* acceptance per drafted token under a geometric model: a accepted,
         * then one rejection unless all were accepted; decayed so the estimate
         * follows the text */
        b->acc = 0.9 * b->acc + a;
        b->rej = 0.9 * b->rej + (a < k);
    }
}

void strata_spec_backoff_evidence(struct strata_spec_backoff *b, int k, int a)
{
    if (k < 1 || k > STRATA_SPEC_MAX || a < 0 || a > k)
        return;
    b->shadow = 1;
    b->acc = 0.9 * b->acc + a;
    b->rej = 0.9 * b->rej + (a < k);
}

/* A cheap draft's pending proposals against the token decided for position pos: one
 * more matched, or the check ends (a mismatch, every proposal matched, or a position
 * that is not the next one: a window ran, or the history was rolled back) and its
 * evidence is counted. */
static void shadow_check(struct strata_spec *s, int32_t pos, int32_t id)
{
    if (!s->sh_n)
        return;
    if (pos != s->sh_pos + s->sh_i) {
        s->sh_n = 0; /* not the next position: dropped, nothing learnt */
        return;
    }
    s->st.n_checked++;
    if (s->sh[s->sh_i] == id) {
        s->st.n_checked_ok++;
        if (++s->sh_i < s->sh_n)
            return;
    }
    strata_spec_backoff_evidence(&s->bo, s->sh_n, s->sh_i);
    s->sh_n = 0;
}

/* Close the current window: learn from it, drop its rejected positions.
 * decided: the next token was sampled (else the generation ended). */
static int close_window(struct strata_spec *s, int decided, struct strata_err *err)
{
    if (!s->active)
        return 0;
    s->active = 0;
    strata_spec_backoff_learn(&s->bo, s->win_n - 1,
                              decided || s->cur + 1 == s->win_n ? s->cur : -1, s->win_ms,
                              s->catchup_ms);
    if (s->trace)
        fprintf(stderr, "spec-trace k %d a %d ms %.4f catchup %.4f plain %.4f c1 %.3f c2 %.3f "
                "alpha %.3f wait %d\n", s->win_n - 1, s->cur, s->win_ms, s->catchup_ms,
                s->bo.t_plain, s->bo.n_win[1] || s->n_max < 1 ? s->bo.cost[1] : -1.0,
                s->n_max >= 2 && s->bo.n_win[2] ? s->bo.cost[2] : -1.0,
                (s->bo.acc + 1) / (s->bo.acc + s->bo.rej + 2), s->bo.probe_every);
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
    shadow_check(s, n_past, id);
    int32_t room = strata_engine_n_ctx(s->e) - n_past - 1;
    int32_t k_max = s->have_draft && !s->plain ? strata_spec_backoff_choose(&s->bo) : 0;
    if (k_max > room)
        k_max = room;
    if (k_max > strata_engine_n_prefill(s->e) - 1)
        k_max = strata_engine_n_prefill(s->e) - 1;
    int32_t k = 0;
    double t_draft = 0;
    s->win[0] = id;
    s->catchup_ms = 0;
    if (s->have_draft && k_max > 0) {
        s->sh_n = 0; /* a window decides these positions: its own outcome is learnt */
        double t0 = now_ms();
        memcpy(s->hist, strata_engine_history(s->e), (size_t)n_past * sizeof *s->hist);
        s->hist[n_past] = id;
        /* a probe follows a run of plain steps, during which the draft did not run:
         * its catch-up is timed apart (the probe's cost, not the window's), up to the
         * token before the accepted one, so that the window then reads the accepted
         * token as every window's draft does and is timed like one (caught up on it
         * as well, a probe window of one draft measured 1.2 plain steps against 1.6
         * for the others on an H200, and pulled the learnt cost down with it) */
        if (s->bo.probing)
            rc = s->draft.propose(s->draft.state, s->hist, n_past, 0, s->win + 1, &k, err);
        double t1 = now_ms();
        s->catchup_ms = t1 - t0;
        k = 0;
        if (!rc)
            rc = s->draft.propose(s->draft.state, s->hist, n_past + 1, k_max, s->win + 1, &k,
                                  err);
        t_draft = now_ms() - t1;
        s->st.t_draft_ms += t_draft + s->catchup_ms;
        if (rc)
            return rc;
        if (k < 0 || k > k_max)
            k = k < 0 ? 0 : k_max;
    }
    /* a plain step of an adaptive back-off with a cheap draft that was not asked for
     * this window: what it would propose after id, checked against the tokens that
     * follow (when it was asked and proposed nothing, there is nothing to check) */
    if (k_max == 0 && s->have_draft && s->draft.cheap && s->bo.adaptive && !s->plain &&
        !s->sh_n && s->n_max > 0 && n_past + 1 <= strata_engine_n_ctx(s->e)) {
        memcpy(s->hist, strata_engine_history(s->e), (size_t)n_past * sizeof *s->hist);
        s->hist[n_past] = id;
        int32_t n = 0;
        if ((rc = s->draft.propose(s->draft.state, s->hist, n_past + 1, s->n_max, s->sh, &n,
                                   err)))
            return rc;
        if (n > 0 && n <= s->n_max) {
            s->sh_n = n;
            s->sh_i = 0;
            s->sh_pos = n_past + 1;
        }
    }
    double t0 = now_ms();
    const int by_topk = k == 0 && s->top_k > 0;
    s->tk_lse = 0;
    rc = by_topk ? strata_engine_eval_topk(s->e, s->win, 1, s->top_k, s->tk_ids, s->tk_vals,
                                           s->top_lse ? &s->tk_lse : NULL, err)
                 : strata_engine_eval(s->e, s->win, k + 1,
                                      k ? STRATA_LOGITS_ALL : STRATA_LOGITS_LAST, s->rows, err);
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
    *logits = by_topk ? NULL : s->rows;
    return 0;
}

void strata_spec_set_topk(struct strata_spec *s, int32_t top_k, int lse)
{
    s->top_k = top_k >= 1 && top_k <= STRATA_SAMPLER_TOPK_MAX && top_k <= s->n_vocab ? top_k
                                                                                     : 0;
    s->top_lse = lse;
}

void strata_spec_topk(const struct strata_spec *s, const int32_t **ids, const float **vals,
                      double *lse)
{
    *ids = s->tk_ids;
    *vals = s->tk_vals;
    *lse = s->tk_lse;
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
