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
    int n_cur;     /* drafted tokens the next window may hold (back-off) */
    int adaptive;
    int cool;      /* plain decoding steps left before drafting again */
    int cool_len;  /* the next cool-down's length */
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
    s->n_max = o->n_max;
    s->n_cur = o->n_max;
    s->adaptive = o->adaptive;
    s->cool_len = 8;
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

/* Back-off after a window of k drafts of which a were accepted. */
static void adapt(struct strata_spec *s, int k, int a)
{
    if (!s->adaptive || k == 0)
        return;
    if (a == k) {
        if (s->n_cur < s->n_max)
            s->n_cur++;
        s->cool_len = 8;
    } else if (a > 0) {
        int n = (s->n_cur + a + 1) / 2;
        s->n_cur = n < 1 ? 1 : n;
        s->cool_len = 8;
    } else {
        s->n_cur /= 2;
        if (s->n_cur == 0) {
            /* decode plainly for a while, then probe with one draft */
            s->cool = s->cool_len;
            if (s->cool_len < 64)
                s->cool_len *= 2;
            s->n_cur = 1;
        }
    }
}

/* Close the current window: learn from it, drop its rejected positions. */
static int close_window(struct strata_spec *s, struct strata_err *err)
{
    if (!s->active)
        return 0;
    s->active = 0;
    adapt(s, s->win_n - 1, s->cur);
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
    if ((rc = close_window(s, err)))
        return rc;

    const int32_t n_past = strata_engine_n_past(s->e);
    int32_t room = strata_engine_n_ctx(s->e) - n_past - 1;
    int32_t k_max = s->n_cur < room ? s->n_cur : room;
    if (k_max > strata_engine_n_prefill(s->e) - 1)
        k_max = strata_engine_n_prefill(s->e) - 1;
    if (s->cool > 0) {
        s->cool--;
        k_max = 0;
    }
    int32_t k = 0;
    s->win[0] = id;
    if (s->have_draft && k_max > 0) {
        double t0 = now_ms();
        memcpy(s->hist, strata_engine_history(s->e), (size_t)n_past * sizeof *s->hist);
        s->hist[n_past] = id;
        rc = s->draft.propose(s->draft.state, s->hist, n_past + 1, k_max, s->win + 1, &k, err);
        s->st.t_draft_ms += now_ms() - t0;
        if (rc)
            return rc;
        if (k < 0 || k > k_max)
            k = k < 0 ? 0 : k_max;
    }
    double t0 = now_ms();
    rc = strata_engine_eval(s->e, s->win, k + 1, k ? STRATA_LOGITS_ALL : STRATA_LOGITS_LAST,
                            s->rows, err);
    s->st.t_verify_ms += now_ms() - t0;
    if (rc)
        return rc;
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
    return close_window(s, err);
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
