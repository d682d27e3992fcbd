/* test_spec.c - speculative decoding: window logits == one-token logits
 * (bitwise) for every fixture model and block type, greedy and sampled
 * output identical to plain decoding, the n-gram draft, back-off, stop
 * handling, the draft model and mtp errors, the rejection-sampling step
 * against a known distribution (chi-square), and the back-off's rule with
 * synthetic timings. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "generate.h"
#include "gguf.h"
#include "spec.h"
#include "tap.h"
#include "vocab.h"

static const char *const prompts[] = {
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "import os\nimport sys\n\nclass Config:\n    def __init__(self, path):\n",
    "Once upon a time, there was a little girl",
};

struct model {
    struct strata_gguf *g;
    struct strata_vocab *v;
    struct strata_engine *e;
};

static int model_open_ctx(struct model *m, const char *name, int n_ctx, struct strata_err *err)
{
    char path[1024];
    struct strata_engine_opts o;
    memset(m, 0, sizeof *m);
    snprintf(path, sizeof path, "%s/models/%s", tap_fixtures(), name);
    strata_engine_opts_init(&o);
    o.n_threads = 2;
    o.n_ctx = n_ctx;
    return strata_gguf_open(&m->g, path, err) || strata_vocab_load(&m->v, m->g, err) ||
           strata_engine_open_gguf(&m->e, m->g, &o, err);
}

static int model_open(struct model *m, const char *name, struct strata_err *err)
{
    return model_open_ctx(m, name, 256, err);
}

static void model_close(struct model *m)
{
    strata_engine_close(m->e);
    strata_vocab_free(m->v);
    strata_gguf_close(m->g);
}

static int32_t *tok(const struct model *m, const char *text, size_t *n)
{
    int32_t *ids = NULL;
    struct strata_err err = { 0 };
    if (strata_vocab_tokenize(m->v, text, strlen(text), strata_vocab_add_bos(m->v), 0, &ids, n,
                              &err))
        return NULL;
    return ids;
}

/* Window logits == one-token logits, bitwise, at every window position. */
static void bitwise(const char *name)
{
    struct model m;
    struct strata_err err = { 0 };
    if (!ok(model_open(&m, name, &err) == 0, "open %s: %s", name, err.msg)) {
        model_close(&m);
        return;
    }
    size_t n = 0;
    int32_t *ids = tok(&m, prompts[0], &n);
    const int32_t nv = strata_engine_n_vocab(m.e);
    const int32_t pre = 5, win = 9;
    float *wl = malloc(sizeof *wl * (size_t)win * nv), *one = malloc(sizeof *one * nv);
    int same = ids && n >= (size_t)(pre + win);
    if (same && (strata_engine_rollback(m.e, 0, &err) ||
                 strata_engine_eval(m.e, ids, pre, STRATA_LOGITS_NONE, NULL, &err) ||
                 strata_engine_eval(m.e, ids + pre, win, STRATA_LOGITS_ALL, wl, &err) ||
                 strata_engine_rollback(m.e, pre, &err)))
        same = 0;
    for (int32_t i = 0; same && i < win; i++) {
        if (strata_engine_eval(m.e, ids + pre + i, 1, STRATA_LOGITS_LAST, one, &err))
            same = 0;
        else
            same &= memcmp(one, wl + (size_t)i * nv, sizeof *one * nv) == 0;
    }
    ok(same, "%s: the logits of a %d-token window equal one-token decodes (bitwise)%s%s", name,
       win, err.msg[0] ? ": " : "", err.msg);
    free(wl);
    free(one);
    free(ids);
    model_close(&m);
}

struct run {
    int rc;
    struct strata_gen_result res;
    int32_t n_past;
    struct strata_spec_stats st;
};

/* Generate with spec T (NULL opts: plain decoding). */
static void gen(struct model *m, const int32_t *ids, size_t n, const struct strata_gen_params *gp0,
                const struct strata_spec_opts *so, struct run *r)
{
    struct strata_err err = { 0 };
    struct strata_spec *sp = NULL;
    struct strata_gen_params gp = *gp0;
    memset(r, 0, sizeof *r);
    strata_engine_rollback(m->e, 0, &err); /* no prefix reuse: runs are independent */
    if (so && (r->rc = strata_spec_create(&sp, m->e, so, &err)))
        return;
    gp.spec = sp;
    r->rc = strata_generate(m->e, m->v, ids, n, &gp, NULL, NULL, &r->res, &err);
    r->n_past = strata_engine_n_past(m->e);
    if (sp)
        strata_spec_stats_get(sp, &r->st);
    strata_spec_free(sp);
}

static int same_run(const struct run *a, const struct run *b)
{
    return a->rc == 0 && b->rc == 0 && a->res.n_gen == b->res.n_gen &&
           (a->res.n_gen == 0 ||
            memcmp(a->res.ids, b->res.ids, sizeof *a->res.ids * (size_t)a->res.n_gen) == 0) &&
           a->res.text_len == b->res.text_len &&
           (a->res.text_len == 0 || memcmp(a->res.text, b->res.text, a->res.text_len) == 0) &&
           a->res.stop_reason == b->res.stop_reason && a->n_past == b->n_past;
}

/* A draft that proposes fixed ids (an oracle or a bad guesser). */
struct fixed {
    const int32_t *ids; /* the full expected sequence: prompt then continuation */
    int32_t n;
    int32_t wrong;      /* >= 0: always propose this id */
};

static int fixed_propose(void *state, const int32_t *hist, int32_t n_hist, int32_t n_max,
                         int32_t *out, int32_t *n_out, struct strata_err *err)
{
    (void)err;
    const struct fixed *f = state;
    int32_t k = 0;
    for (; k < n_max; k++) {
        if (f->wrong >= 0)
            out[k] = f->wrong;
        else if (n_hist + k < f->n)
            out[k] = f->ids[n_hist + k];
        else
            break;
    }
    (void)hist;
    *n_out = k;
    return 0;
}

static void greedy(const char *name, const char *draft_name, size_t n_prompts)
{
    struct model m, d = { 0 };
    struct strata_err err = { 0 };
    if (!ok(model_open(&m, name, &err) == 0 &&
            (!draft_name || model_open(&d, draft_name, &err) == 0), "open %s%s%s: %s", name,
            draft_name ? " + " : "", draft_name ? draft_name : "", err.msg))
        goto out;
    struct strata_gen_params gp;
    strata_gen_params_init(&gp);
    gp.sampling.temperature = 0;
    gp.n_predict = 32;
    gp.ignore_eog = 1;
    for (size_t pi = 0; pi < n_prompts; pi++) {
        size_t n = 0;
        int32_t *ids = tok(&m, prompts[pi], &n);
        struct run plain, sr;
        gen(&m, ids, n, &gp, NULL, &plain);
        static const int ts[] = { 1, 3, 8 };
        int all = plain.rc == 0, bad_t = 0;
        uint64_t acc = 0, drafted = 0;
        for (size_t ti = 0; ti < sizeof ts / sizeof *ts; ti++) {
            struct strata_spec_opts so;
            strata_spec_opts_init(&so);
            so.n_max = ts[ti];
            so.mode = draft_name ? STRATA_SPEC_DRAFT : STRATA_SPEC_NGRAM;
            so.draft = d.e;
            so.adaptive = 0; /* every window as large as the draft allows */
            gen(&m, ids, n, &gp, &so, &sr);
            if (!same_run(&plain, &sr) && all) {
                all = 0;
                bad_t = ts[ti];
            }
            acc += sr.st.n_accepted;
            drafted += sr.st.n_drafted;
            strata_gen_result_free(&sr.res);
        }
        ok(all, "%s p%zu %s: greedy --spec 1,3,8 == --spec 0 (ids, text, kv cache)%s", name,
           pi, draft_name ? "draft model" : "ngram", all ? "" : " FAILED at T");
        if (!all)
            diag("first mismatch at T %d", bad_t);
        diag("%s p%zu: %llu of %llu drafted tokens accepted", name, pi,
             (unsigned long long)acc, (unsigned long long)drafted);
        if (pi == 0) {
            /* an oracle draft (the continuation itself): every draft accepted */
            int32_t *full = malloc(sizeof *full * (n + (size_t)plain.res.n_gen));
            memcpy(full, ids, sizeof *ids * n);
            memcpy(full + n, plain.res.ids, sizeof *full * (size_t)plain.res.n_gen);
            struct fixed f = { full, (int32_t)n + plain.res.n_gen, -1 };
            struct strata_spec_draft fd = { "oracle", &f, fixed_propose, NULL, 0, 0 };
            struct strata_spec_opts so;
            strata_spec_opts_init(&so);
            so.n_max = 4;
            so.user = &fd;
            so.adaptive = 0; /* the back-off follows timings: keep this exact */
            gen(&m, ids, n, &gp, &so, &sr);
            /* (drafts past the last generated token are never looked at) */
            ok(same_run(&plain, &sr) && sr.st.n_drafted > 0 &&
               sr.st.n_drafted - sr.st.n_accepted <= 4 &&
               sr.st.n_steps <= (uint64_t)(plain.res.n_gen + 4) / 5 + 1,
               "%s: an oracle draft is always accepted: %llu of %llu, %llu steps for %d tokens",
               name, (unsigned long long)sr.st.n_accepted, (unsigned long long)sr.st.n_drafted,
               (unsigned long long)sr.st.n_steps, plain.res.n_gen);
            strata_gen_result_free(&sr.res);
            /* a draft that is always wrong: same output, and the back-off stops
             * drafting most of the time */
            f.wrong = plain.res.ids[0] == 1 ? 2 : 1;
            for (int32_t i = 0; i < plain.res.n_gen; i++)
                if (plain.res.ids[i] == f.wrong)
                    f.wrong = -1;
            if (f.wrong >= 0) {
                so.n_max = 8;
                so.adaptive = 1;
                gen(&m, ids, n, &gp, &so, &sr);
                ok(same_run(&plain, &sr) && sr.st.n_accepted == 0 &&
                   sr.st.n_drafted < (uint64_t)plain.res.n_gen,
                   "%s: a draft that is always wrong backs off (%llu drafted in %llu steps)",
                   name, (unsigned long long)sr.st.n_drafted, (unsigned long long)sr.st.n_steps);
                strata_gen_result_free(&sr.res);
                /* the same draft marked cheap: its proposals are checked at the plain
                 * steps before the first window, which then never comes */
                fd.cheap = 1;
                gen(&m, ids, n, &gp, &so, &sr);
                ok(same_run(&plain, &sr) && sr.st.n_drafted == 0 && sr.st.n_checked >= 3 &&
                   sr.st.n_checked_ok == 0,
                   "%s: a cheap draft that is always wrong never drafts (%llu drafted in %llu "
                   "steps; %llu proposals checked at plain steps, %llu right)", name,
                   (unsigned long long)sr.st.n_drafted, (unsigned long long)sr.st.n_steps,
                   (unsigned long long)sr.st.n_checked,
                   (unsigned long long)sr.st.n_checked_ok);
                strata_gen_result_free(&sr.res);
                /* a cheap oracle: every proposal checked at a plain step is right (whether
                 * windows then pay follows this machine's timings, so it is not asserted),
                 * and whatever it drafts is accepted */
                f.wrong = -1;
                gen(&m, ids, n, &gp, &so, &sr);
                ok(same_run(&plain, &sr) && sr.st.n_checked >= 3 &&
                   sr.st.n_checked_ok == sr.st.n_checked &&
                   sr.st.n_accepted + 8 >= sr.st.n_drafted,
                   "%s: a cheap oracle's checked proposals are all right (%llu of %llu), its "
                   "drafts accepted (%llu of %llu)", name,
                   (unsigned long long)sr.st.n_checked_ok, (unsigned long long)sr.st.n_checked,
                   (unsigned long long)sr.st.n_accepted, (unsigned long long)sr.st.n_drafted);
                strata_gen_result_free(&sr.res);
                fd.cheap = 0;
            }
            free(full);
        }
        strata_gen_result_free(&plain.res);
        free(ids);
    }
out:
    model_close(&m);
    if (draft_name)
        model_close(&d);
}

/* Drafts of a fresh draft model of n_ctx positions that reads ctx[0..n) at once. */
static int fresh_drafts(const struct model *t, const char *name, int n_ctx, const int32_t *ctx,
                        int32_t n, int32_t n_max, int32_t *out, int32_t *n_out)
{
    struct model d;
    struct strata_spec_draft dd;
    struct strata_err err = { 0 };
    int rc = model_open_ctx(&d, name, n_ctx, &err) ||
             strata_draft_model_init(&dd, d.e, t->e, &err) ||
             dd.propose(dd.state, ctx, n, n_max, out, n_out, &err);
    if (rc)
        diag("fresh draft: %s", err.msg);
    else
        dd.free(dd.state);
    model_close(&d);
    return rc;
}

/* A draft model's catch-up after a run of plain steps reads the run's last
 * STRATA_SPEC_CATCHUP tokens after what it had seen, and a full context keeps its
 * first half: its kv cache holds exactly that, and its drafts are those of a draft
 * that read that context at once. */
static void draft_catchup(void)
{
    static const char *const dname = "tinydraft-qwen3-F16.gguf";
    struct model t, d;
    struct strata_spec_draft dd = { 0 };
    struct strata_err err = { 0 };
    int32_t *ids = NULL, out[8], ref[8], n_out = 0, n_ref = 0;
    size_t n = 0;
    if (!ok(model_open(&t, "tinycoder-moe-Q4_K_M.gguf", &err) == 0 &&
            model_open(&d, dname, &err) == 0 &&
            strata_draft_model_init(&dd, d.e, t.e, &err) == 0, "open target and draft: %s",
            err.msg))
        return;
    char text[4096] = "";
    for (int i = 0; i < 12; i++)
        strcat(text, prompts[i % 3]);
    ids = tok(&t, text, &n);
    if (!ok(ids && n >= 150, "a history of %zu tokens (>= 150)", n)) {
        dd.free(dd.state);
        goto out;
    }
    /* drafting at 20 tokens, then a plain run of 100, then a probe's catch-up */
    int rc = dd.propose(dd.state, ids, 20, 2, out, &n_out, &err);
    int32_t after = strata_engine_n_past(d.e);
    rc = rc || dd.propose(dd.state, ids, 120, 0, out, &n_out, &err);
    int32_t caught = strata_engine_n_past(d.e);
    /* the draft kept its first 20 tokens (21 if its first draft was right) */
    int32_t keep = strata_engine_common_prefix(d.e, ids, 21);
    ok(rc == 0 && after == 21 && caught == keep + STRATA_SPEC_CATCHUP,
       "a catch-up after 100 plain steps reads %d tokens: the draft at %d positions after "
       "drafting at 20 (21), %d after the catch-up (%d + %d) (%s)", STRATA_SPEC_CATCHUP, after,
       caught, keep, STRATA_SPEC_CATCHUP, err.msg);
    /* the next window drafts from ids[0..keep) + ids[120 - 32..121) */
    rc = dd.propose(dd.state, ids, 121, 4, out, &n_out, &err);
    int32_t view[64];
    memcpy(view, ids, sizeof *ids * (size_t)keep);
    memcpy(view + keep, ids + 120 - STRATA_SPEC_CATCHUP, sizeof *ids * (STRATA_SPEC_CATCHUP + 1));
    int32_t n_view = keep + STRATA_SPEC_CATCHUP + 1;
    int same = rc == 0 && fresh_drafts(&t, dname, 256, view, n_view, 4, ref, &n_ref) == 0 &&
               n_out == 4 && n_ref == 4 && memcmp(out, ref, sizeof *out * 4) == 0;
    ok(same, "drafts after the catch-up are those of a draft that read the kept %d tokens "
       "and the last %d: %d %d %d %d vs %d %d %d %d", keep, STRATA_SPEC_CATCHUP + 1, out[0],
       out[1], out[2], out[3], ref[0], ref[1], ref[2], ref[3]);
    /* a later plain run of 79 starts from the same kept prefix: keep + 32 again */
    rc = dd.propose(dd.state, ids, 200, 0, out, &n_out, &err);
    ok(rc == 0 && strata_engine_n_past(d.e) == keep + STRATA_SPEC_CATCHUP,
       "a second catch-up keeps the same prefix: %d positions (%d)", strata_engine_n_past(d.e),
       keep + STRATA_SPEC_CATCHUP);
    /* another history (a new generation): read whole again, drafts as a fresh draft's */
    rc = dd.propose(dd.state, ids + 1, 60, 3, out, &n_out, &err);
    same = rc == 0 && strata_engine_n_past(d.e) == 62 &&
           fresh_drafts(&t, dname, 256, ids + 1, 60, 3, ref, &n_ref) == 0 && n_out == 3 &&
           n_ref == 3 && memcmp(out, ref, sizeof *out * 3) == 0;
    ok(same, "another history is read whole: %d positions (62), drafts as a fresh draft's",
       strata_engine_n_past(d.e));
    dd.free(dd.state);
    dd.state = NULL;
    model_close(&d);
    /* a draft of 64 positions given 100 tokens: its first 29 (64 - 32 - 3) and the last
     * 32 */
    memset(&d, 0, sizeof d);
    rc = model_open_ctx(&d, dname, 64, &err) || strata_draft_model_init(&dd, d.e, t.e, &err) ||
         dd.propose(dd.state, ids, 100, 4, out, &n_out, &err);
    memcpy(view, ids, sizeof *ids * 29);
    memcpy(view + 29, ids + 100 - STRATA_SPEC_CATCHUP, sizeof *ids * STRATA_SPEC_CATCHUP);
    same = rc == 0 && strata_engine_n_past(d.e) == 64 &&
           fresh_drafts(&t, dname, 256, view, 29 + STRATA_SPEC_CATCHUP, 4, ref, &n_ref) == 0 &&
           n_out == 4 && n_ref == 4 && memcmp(out, ref, sizeof *out * 4) == 0;
    ok(same, "a full draft context keeps its first 29 tokens and the last %d: %d positions "
       "(64), drafts as a fresh draft's (%s)", STRATA_SPEC_CATCHUP, strata_engine_n_past(d.e),
       err.msg);
    if (dd.state)
        dd.free(dd.state);
    dd.state = NULL;
    model_close(&d);
    /* a fresh draft whose first call is a probe keeps nothing and skips to the last 32;
     * another history after it is still read whole */
    memset(&d, 0, sizeof d);
    rc = model_open(&d, dname, &err) || strata_draft_model_init(&dd, d.e, t.e, &err) ||
         dd.propose(dd.state, ids, 100, 0, out, &n_out, &err);
    int32_t probed = rc ? -1 : strata_engine_n_past(d.e);
    rc = rc || dd.propose(dd.state, ids + 3, 150, 3, out, &n_out, &err);
    ok(rc == 0 && probed == STRATA_SPEC_CATCHUP && strata_engine_n_past(d.e) == 152,
       "a first call that is a probe reads %d tokens (%d), then another history of 150 is "
       "read whole: %d positions (152) (%s)", probed, STRATA_SPEC_CATCHUP,
       strata_engine_n_past(d.e), err.msg);
    if (dd.state)
        dd.free(dd.state);
    dd.state = NULL;
    model_close(&d);
    /* a draft of 48 positions whose probe finds 60 tokens: no error, the context fits */
    memset(&d, 0, sizeof d);
    rc = model_open_ctx(&d, dname, 48, &err) || strata_draft_model_init(&dd, d.e, t.e, &err) ||
         dd.propose(dd.state, ids, 60, 0, out, &n_out, &err) ||
         dd.propose(dd.state, ids, 61, 2, out, &n_out, &err);
    ok(rc == 0 && strata_engine_n_past(d.e) <= 48 && n_out == 2,
       "a draft of 48 positions probing 60 tokens, then drafting 2: %d positions (<= 48), "
       "%d drafts (%s)", strata_engine_n_past(d.e), n_out, err.msg);
    if (dd.state)
        dd.free(dd.state);
out:
    free(ids);
    model_close(&d);
    model_close(&t);
}

/* Temperature 1 (with top-k, top-p, min-p and penalties): the same seed
 * gives the same tokens with and without speculation; over many seeds the
 * first-token frequencies agree. */
static void sampled(const char *name)
{
    struct model m;
    struct strata_err err = { 0 };
    if (!ok(model_open(&m, name, &err) == 0, "open %s: %s", name, err.msg)) {
        model_close(&m);
        return;
    }
    size_t n = 0;
    int32_t *ids = tok(&m, prompts[2], &n);
    const int32_t nv = strata_engine_n_vocab(m.e);
    struct strata_gen_params gp;
    strata_gen_params_init(&gp);
    gp.sampling.temperature = 1.0f;
    gp.sampling.top_k = 0;
    gp.sampling.top_p = 1;
    gp.sampling.min_p = 0;
    gp.n_predict = 12;
    gp.ignore_eog = 1;
    const int n_seed = 40;
    int *c0 = calloc((size_t)nv, sizeof *c0), *c1 = calloc((size_t)nv, sizeof *c1);
    int same = 1, total = 0;
    for (int variant = 0; variant < 2; variant++) {
        if (variant == 1) {
            gp.sampling.top_k = 20;
            gp.sampling.top_p = 0.9f;
            gp.sampling.min_p = 0.02f;
            gp.sampling.repeat_penalty = 1.2f;
            gp.sampling.frequency_penalty = 0.3f;
        }
        for (int s = 0; s < n_seed; s++) {
            struct run plain, sr;
            struct strata_spec_opts so;
            strata_spec_opts_init(&so);
            so.n_max = 1 + s % 6;
            so.adaptive = 0;
            gp.sampling.seed = 1000 + (uint64_t)s;
            gen(&m, ids, n, &gp, NULL, &plain);
            gen(&m, ids, n, &gp, &so, &sr);
            same &= same_run(&plain, &sr);
            for (int32_t i = 0; plain.rc == 0 && sr.rc == 0 && i < plain.res.n_gen; i++) {
                c0[plain.res.ids[i]]++;
                c1[sr.res.ids[i]]++;
                total++;
            }
            strata_gen_result_free(&plain.res);
            strata_gen_result_free(&sr.res);
        }
    }
    ok(same, "%s: temperature 1, %d seeds, plain and filtered/penalised chains: the same "
       "tokens with --spec 1..6 as with --spec 0", name, n_seed);
    /* total variation between the two token histograms: with identical
     * samples it is 0; the bound is the one for independent samples of this
     * size (sqrt(k / n) with k the distinct tokens), so it states what is
     * tolerated, not what is expected */
    double tv = 0;
    int distinct = 0;
    for (int32_t i = 0; i < nv; i++) {
        tv += fabs((double)c0[i] - c1[i]);
        distinct += c0[i] || c1[i];
    }
    tv /= 2.0 * (total ? total : 1);
    double bound = sqrt((double)distinct / (total ? total : 1));
    ok(total > 0 && tv <= bound, "%s: token frequencies agree: total variation %.4f <= %.4f "
       "(%d tokens, %d distinct)", name, tv, bound, total, distinct);
    free(c0);
    free(c1);
    free(ids);
    model_close(&m);
}

/* Stop strings, max tokens, EOS and a full context exactly as plain decoding. */
static void stops(void)
{
    struct model m;
    struct strata_err err = { 0 };
    if (!ok(model_open_ctx(&m, "tinycoder-moe-Q4_K_M.gguf", 64, &err) == 0, "open tinycoder: %s",
            err.msg)) {
        model_close(&m);
        return;
    }
    size_t n = 0;
    int32_t *ids = tok(&m, prompts[0], &n);
    struct strata_gen_params gp;
    strata_gen_params_init(&gp);
    gp.sampling.temperature = 0;
    gp.n_predict = 30;
    struct run plain, sr;
    gen(&m, ids, n, &gp, NULL, &plain);
    /* a stop string from the middle of the greedy text, cut inside a token */
    char stop[8] = { 0 };
    if (plain.res.text_len > 20)
        memcpy(stop, plain.res.text + 15, 4);
    const char *stops_[1] = { stop };
    struct strata_spec_opts so;
    strata_spec_opts_init(&so);
    so.n_max = 6;
    so.adaptive = 0;
    int all = 1;
    for (int c = 0; c < 4; c++) {
        struct strata_gen_params g2 = gp;
        if (c == 0) {
            g2.stop = stops_;
            g2.n_stop = 1;
        } else if (c == 1) {
            g2.n_predict = 1;
        } else if (c == 2) {
            g2.n_predict = 0;
        } else {
            g2.n_predict = -1; /* until the context is full */
            g2.ignore_eog = 1;
        }
        struct run p2;
        gen(&m, ids, n, &g2, NULL, &p2);
        gen(&m, ids, n, &g2, &so, &sr);
        int s = same_run(&p2, &sr);
        if (!s)
            diag("case %d differs: %d/%d tokens, stop %d/%d", c, p2.res.n_gen, sr.res.n_gen,
                 p2.res.stop_reason, sr.res.stop_reason);
        all &= s;
        if (c == 0)
            ok(sr.res.stop_reason == STRATA_STOP_STRING, "stop string '%s' matched", stop);
        if (c == 3)
            ok(sr.res.stop_reason == STRATA_STOP_CTX && sr.n_past == 64,
               "a full context stops both at the same place (%d tokens)", sr.res.n_gen);
        strata_gen_result_free(&p2.res);
        strata_gen_result_free(&sr.res);
    }
    ok(all, "stop string, -n 1, -n 0 and a full context: --spec 6 == --spec 0");
    strata_gen_result_free(&plain.res);
    free(ids);

    /* errors: T out of range, draft mode without a model, mtp, other vocabulary */
    struct strata_spec *sp = NULL;
    so.n_max = 17;
    ok(strata_spec_create(&sp, m.e, &so, &err) == STRATA_E_INVALID && !sp,
       "T 17 refused: %s", err.msg);
    so.n_max = 4;
    so.mode = STRATA_SPEC_DRAFT;
    ok(strata_spec_create(&sp, m.e, &so, &err) == STRATA_E_INVALID, "draft mode without a "
       "draft model refused: %s", err.msg);
    so.mode = STRATA_SPEC_MTP;
    ok(strata_spec_create(&sp, m.e, &so, &err) == STRATA_E_UNSUPPORTED &&
       strstr(err.msg, "nextn_predict_layers"), "mtp unavailable: %s", err.msg);
    struct model st;
    if (model_open(&st, "stories260K.gguf", &err) == 0) {
        so.mode = STRATA_SPEC_DRAFT;
        so.draft = st.e;
        ok(strata_spec_create(&sp, m.e, &so, &err) == STRATA_E_INVALID &&
           strstr(err.msg, "512"), "a draft with another vocabulary refused: %s", err.msg);
    }
    model_close(&st);
    so.n_max = 0;
    so.mode = STRATA_SPEC_NGRAM;
    so.draft = NULL;
    ok(strata_spec_create(&sp, m.e, &so, &err) == 0 &&
       strcmp(strata_spec_draft_name(sp), "none") == 0, "T 0 accepted: plain decoding");
    strata_spec_free(sp);
    model_close(&m);
}

static void ngram(void)
{
    int32_t out[16];
    const int32_t h1[] = { 1, 2, 3, 4, 5, 9, 1, 2, 3 };
    ok(strata_draft_ngram(h1, 9, 2, 4, 3, out) == 3 && out[0] == 4 && out[1] == 5 &&
       out[2] == 9, "ngram: continues after the earlier '1 2 3'");
    const int32_t h2[] = { 7, 8, 1, 7, 8, 2, 7, 8 };
    ok(strata_draft_ngram(h2, 8, 2, 4, 1, out) == 1 && out[0] == 2,
       "ngram: the latest earlier occurrence wins");
    ok(strata_draft_ngram(h2, 8, 2, 4, 8, out) == 3 && out[0] == 2 && out[1] == 7 &&
       out[2] == 8, "ngram: the proposal may run up to the end of the history");
    const int32_t h3[] = { 1, 2, 3, 4, 5, 6 };
    ok(strata_draft_ngram(h3, 6, 1, 4, 4, out) == 0, "ngram: no repetition, no draft");
    const int32_t h4[] = { 5, 6, -1, 7, 5, 6 };
    ok(strata_draft_ngram(h4, 6, 2, 3, 4, out) == 0, "ngram: never proposes image positions");
    const int32_t h5[] = { 3, 3, 3, 3 };
    ok(strata_draft_ngram(h5, 4, 2, 2, 5, out) == 1 && out[0] == 3,
       "ngram: a run continues itself");
    struct strata_spec_draft d;
    struct strata_err err = { 0 };
    ok(strata_draft_ngram_init(&d, 3, 2, &err) == STRATA_E_INVALID, "ngram lengths 3..2 "
       "refused: %s", err.msg);
}

/* splitmix64 for the test's own uniforms */
static uint64_t sm(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double unif(uint64_t *x)
{
    return (double)(sm(x) >> 11) * (1.0 / 9007199254740992.0);
}

/* Draw x ~ q, apply the step, histogram; chi-square against p.  With 7
 * degrees of freedom the 0.999 quantile is 24.32: the stated tolerance (a
 * fixed seed makes the outcome deterministic; a wrong residual or
 * acceptance rule gives values in the thousands). */
static void rejection(void)
{
    const float p[8] = { 0.30f, 0.20f, 0.15f, 0.10f, 0.10f, 0.08f, 0.05f, 0.02f };
    const float qs[3][8] = {
        { 0.05f, 0.05f, 0.10f, 0.30f, 0.30f, 0.10f, 0.05f, 0.05f }, /* a poor draft */
        { 0.30f, 0.20f, 0.15f, 0.10f, 0.10f, 0.08f, 0.05f, 0.02f }, /* q == p */
        { 0, 0, 0, 1, 0, 0, 0, 0 },                                /* a point mass */
    };
    const int N = 200000;
    uint64_t rs = 42;
    for (int qi = 0; qi < 3; qi++) {
        const float *q = qs[qi];
        long cnt[8] = { 0 }, acc = 0;
        for (int i = 0; i < N; i++) {
            double u = unif(&rs), cum = 0;
            int32_t x = 7;
            for (int j = 0; j < 8; j++) {
                cum += q[j];
                if (u < cum && q[j] > 0) {
                    x = j;
                    break;
                }
            }
            int a = 0;
            int32_t y = strata_spec_accept_reject(p, q, 8, x, unif(&rs), unif(&rs), &a);
            cnt[y]++;
            acc += a;
        }
        double chi = 0, want_acc = 0;
        for (int j = 0; j < 8; j++) {
            double e = (double)N * p[j];
            chi += (cnt[j] - e) * (cnt[j] - e) / e;
            want_acc += p[j] < q[j] ? p[j] : q[j];
        }
        double got_acc = (double)acc / N;
        ok(chi < 24.32, "rejection step, draft %d: output ~ p (chi-square %.2f < 24.32, 7 dof)",
           qi, chi);
        /* acceptance = sum min(p, q); binomial sd <= 0.0012 at N = 200000 */
        ok(fabs(got_acc - want_acc) < 0.006, "rejection step, draft %d: acceptance %.4f == "
           "sum min(p, q) = %.4f", qi, got_acc, want_acc);
    }
}

/* ---- the back-off's rule with synthetic timings (no engine) ----
 *
 * A simulated generation: every window asks strata_spec_backoff_choose for its
 * size k, the draft proposes k tokens (none with probability p_none, as an n-gram
 * search without a match), each accepted with probability alpha until the first
 * rejection, and the window costs cost(k) plain steps (plus a one-off factor on the
 * first window of each size, and a spike factor on a share of the windows, as a
 * shared machine's preemptions).  A probe's draft catches up on the plain steps
 * since it last ran, at most STRATA_SPEC_CATCHUP of them (a draft model's bound),
 * at catchup plain steps per token.  Time is in plain steps. */
struct bo_sim {
    int T;
    double alpha, p_none;
    double c1, slope, power; /* cost(k) = c1 + slope * (k^power - 1) for k >= 1 */
    double first;            /* the first window of each size costs this many times more */
    double spike_p, spike;   /* a share of all windows (plain too) cost spike times more */
    double catchup;          /* plain steps per token the draft catches up on */
    double catchup_est;      /* the back-off's estimate of a probe's catch-up (0 none) */
    int shadow;              /* a cheap draft: T proposals at each plain step, checked
                                (strata_spec_backoff_evidence) */
    double alpha2;           /* the acceptance from token switch_at on (switch_at 0: none) */
    int switch_at;
    int n_tokens;
    /* results */
    int n_windows, n_drafting, n_tokens_out, n_hopeless_chosen, n_catchups;
    double time;
};

static double bo_cost(const struct bo_sim *m, int k)
{
    return k == 0 ? 1 : m->c1 + m->slope * (pow(k, m->power) - 1);
}

static void bo_run(struct bo_sim *m, uint64_t seed)
{
    struct strata_spec_backoff b;
    strata_spec_backoff_init(&b, m->T, 1);
    b.catchup_ms_est = m->catchup_est;
    unsigned char seen[STRATA_SPEC_MAX + 1] = { 0 };
    int behind = 0; /* tokens the draft has not seen */
    m->n_windows = m->n_drafting = m->n_tokens_out = m->n_hopeless_chosen = m->n_catchups = 0;
    m->time = 0;
    while (m->n_tokens_out < m->n_tokens) {
        int probing_before = b.probing;
        int k = strata_spec_backoff_choose(&b);
        int probe = b.probing && !probing_before;
        if (k > 0 && unif(&seed) < m->p_none)
            k = 0;
        if (k > 0 && 1.10 * bo_cost(m, k) >= k + 1)
            m->n_hopeless_chosen++;
        double ms = bo_cost(m, k) * (seen[k] ? 1 : m->first);
        seen[k] = 1;
        if (unif(&seed) < m->spike_p)
            ms *= m->spike;
        double cu = 0;
        if (k > 0 && probe && m->catchup > 0 && behind > 0) {
            cu = (behind < STRATA_SPEC_CATCHUP ? behind : STRATA_SPEC_CATCHUP) * m->catchup;
            m->n_catchups++;
        }
        const double alpha =
            m->switch_at && m->n_tokens_out >= m->switch_at ? m->alpha2 : m->alpha;
        int a = 0;
        while (a < k && unif(&seed) < alpha)
            a++;
        behind = k > 0 ? 0 : behind + 1;
        strata_spec_backoff_learn(&b, k, a, ms, cu);
        if (m->shadow && k == 0 && unif(&seed) >= m->p_none) {
            int sa = 0;
            while (sa < m->T && unif(&seed) < alpha)
                sa++;
            strata_spec_backoff_evidence(&b, m->T, sa);
        }
        m->time += ms + cu;
        m->n_windows++;
        m->n_drafting += k > 0;
        m->n_tokens_out += a + 1;
    }
}

/* speed against plain decoding (1 plain step per token, spikes alike) */
static double bo_speed(const struct bo_sim *m)
{
    return m->n_tokens_out / m->time * (1 + m->spike_p * (m->spike - 1));
}

static void backoff(void)
{
    /* windows that cost k + 1 plain steps or more cannot pay even when every draft is
     * accepted: after exploring (three windows of 1 draft) none is drafted */
    for (int T = 1; T <= 8; T *= 2) {
        struct bo_sim m = { .T = T, .alpha = 1, .c1 = 2.05, .slope = 1.05, .power = 1,
                            .first = 1, .n_tokens = 1000 };
        bo_run(&m, 1);
        ok(m.n_drafting <= 3 && bo_speed(&m) >= 0.99,
           "back-off, T %d, windows slower than k + 1 plain steps, all drafts accepted: "
           "%d of %d windows drafted (<= 3), speed %.3f (>= 0.99)", T, m.n_drafting,
           m.n_windows, bo_speed(&m));
    }
    /* a draft model on a slow CPU: a window of 1 draft costs 1.95 plain steps with the
     * draft's step, half the drafts accepted, the catch-up 0.12 plain steps a token:
     * hopeless after exploring, so no probe either, even over 128 tokens */
    for (int n = 128; n <= 4000; n *= 31) {
        struct bo_sim m = { .T = 4, .alpha = 0.5, .c1 = 1.95, .slope = 0.9, .power = 1,
                            .first = 1.5, .catchup = 0.12, .n_tokens = n };
        bo_run(&m, 2);
        ok(m.n_drafting <= 3 && bo_speed(&m) >= (n < 1000 ? 0.98 : 0.995),
           "back-off, draft-model costs on a slow CPU, %d tokens: %d drafting windows (<= 3), "
           "speed %.3f", n, m.n_drafting, bo_speed(&m));
    }
    /* a cheap draft whose proposals are checked at plain steps: wrong ones never cost
     * a window, with cheap windows or with a MoE's (2 positions about 1.9 plain steps),
     * right ones draft, and a text that turns predictable is drafted again without a
     * probe */
    {
        struct bo_sim m = { .T = 4, .alpha = 0, .c1 = 1.05, .slope = 0.05, .power = 1,
                            .first = 1, .shadow = 1, .n_tokens = 1000 };
        bo_run(&m, 5);
        ok(m.n_drafting == 0 && bo_speed(&m) >= 0.9999,
           "back-off, checked proposals, acceptance 0, cheap windows: %d of %d windows "
           "drafted (0), speed %.4f", m.n_drafting, m.n_windows, bo_speed(&m));
        struct bo_sim w = { .T = 8, .alpha = 0, .p_none = 0.5, .c1 = 1.9, .slope = 0.5,
                            .power = 0.8, .first = 1, .shadow = 1, .n_tokens = 128 };
        bo_run(&w, 6);
        ok(w.n_drafting == 0 && bo_speed(&w) >= 0.9999,
           "back-off, checked proposals, acceptance 0, a MoE's windows, 128 tokens: %d "
           "drafting windows (0), speed %.4f", w.n_drafting, bo_speed(&w));
        struct bo_sim r = { .T = 4, .alpha = 0.95, .c1 = 1.05, .slope = 0.05, .power = 1,
                            .first = 1, .shadow = 1, .n_tokens = 1000 };
        bo_run(&r, 7);
        ok(r.n_drafting * 10 >= 9 * r.n_windows && bo_speed(&r) >= 3,
           "back-off, checked proposals, acceptance 0.95: %d of %d windows drafted (>= 90%%), "
           "speed %.2f (>= 3)", r.n_drafting, r.n_windows, bo_speed(&r));
        struct bo_sim c = { .T = 4, .alpha = 0, .alpha2 = 0.95, .switch_at = 500, .c1 = 1.05,
                            .slope = 0.05, .power = 1, .first = 1, .shadow = 1,
                            .n_tokens = 1000 };
        bo_run(&c, 8);
        ok(c.n_drafting >= 100 && bo_speed(&c) >= 1.5,
           "back-off, checked proposals, acceptance 0 then 0.95 from token 500: %d drafting "
           "windows (>= 100), speed %.2f (>= 1.5)", c.n_drafting, bo_speed(&c));
    }
    /* acceptance 0 with cheap windows: explores, then probes ever more rarely */
    {
        struct bo_sim m = { .T = 4, .alpha = 0, .c1 = 1.05, .slope = 0.05, .power = 1,
                            .first = 1, .n_tokens = 1000 };
        bo_run(&m, 3);
        ok(m.n_drafting * 100 <= 2 * m.n_windows,
           "back-off, acceptance 0, cheap windows: %d of %d windows drafted (<= 2%%)",
           m.n_drafting, m.n_windows);
    }
    /* an n-gram that seldom matches, and is wrong when it does */
    {
        struct bo_sim m = { .T = 8, .alpha = 0, .p_none = 0.8, .c1 = 1.6, .slope = 0.6,
                            .power = 0.75, .first = 1, .n_tokens = 1000 };
        bo_run(&m, 4);
        ok(m.n_drafting * 100 <= 2 * m.n_windows && bo_speed(&m) >= 0.98,
           "back-off, rare wrong n-gram matches: %d of %d windows drafted (<= 2%%), "
           "speed %.3f", m.n_drafting, m.n_windows, bo_speed(&m));
    }
    /* a draft that does not pay but is not hopeless either (1 draft 1.6 plain steps,
     * acceptance 1/2): without a catch-up probing costs about 1%; with a draft
     * model's (0.12 plain steps a token, at most STRATA_SPEC_CATCHUP tokens: 3.8 plain
     * steps a probe) each wait is at least 400 times the last probe's catch-up, so
     * probing costs well under 1% more (a catch-up of the whole wait would cost 12% of
     * every wait, however long; waits of 100 catch-ups left 0.994) */
    {
        struct bo_sim m = { .T = 4, .alpha = 0.5, .c1 = 1.6, .slope = 0.6, .power = 1,
                            .first = 1, .n_tokens = 4000 };
        bo_run(&m, 5);
        ok(bo_speed(&m) >= 0.985, "back-off, a draft that does not pay: speed %.3f "
           "(>= 0.985), %d of %d windows drafted", bo_speed(&m), m.n_drafting, m.n_windows);
        m.catchup = 0.12;
        bo_run(&m, 5);
        ok(bo_speed(&m) >= 0.995, "back-off, a draft that does not pay, catch-up 0.12 a "
           "token: speed %.3f (>= 0.995), %d catch-ups in 4000 tokens", bo_speed(&m),
           m.n_catchups);
    }
    /* a draft model on a GPU (a window of 1 draft 1.64 plain steps, acceptance 1/2,
     * a probe's catch-up 1.7 plain steps): with the catch-up estimated from the draft's
     * step before the first probe, a 512-token run probes not at all after exploring;
     * without, once */
    for (int est = 0; est <= 1; est++) {
        struct bo_sim m = { .T = 8, .alpha = 0.5, .c1 = 1.64, .slope = 0.45, .power = 1,
                            .first = 1, .catchup = 1.7 / STRATA_SPEC_CATCHUP,
                            .catchup_est = est ? 1.3 : 0, .n_tokens = 512 };
        bo_run(&m, 8);
        ok(est ? m.n_catchups == 0 && m.n_drafting <= 3 : m.n_catchups >= 1,
           "back-off, draft model on a GPU, 512 tokens, catch-up %s: %d probes' catch-ups, "
           "%d drafting windows, speed %.4f", est ? "estimated" : "unknown", m.n_catchups,
           m.n_drafting, bo_speed(&m));
    }
    /* cheap windows (a GPU) and high acceptance: it drafts almost always, near T */
    for (int T = 2; T <= 8; T *= 2) {
        struct bo_sim m = { .T = T, .alpha = 0.9, .c1 = 1.05, .slope = 0.05, .power = 1,
                            .first = 5, .spike_p = 0.05, .spike = 10, .n_tokens = 2000 };
        bo_run(&m, 6);
        double want = 0.8 * (1 - pow(0.9, T + 1)) / 0.1 / (1.05 + 0.05 * (T - 1));
        ok(m.n_drafting * 10 >= 9 * m.n_windows && bo_speed(&m) >= want,
           "back-off, T %d, cheap windows (one-off first windows 5x, 5%% spikes 10x), "
           "acceptance 0.9: %d of %d windows drafted (>= 90%%), speed %.2f (>= %.2f)", T,
           m.n_drafting, m.n_windows, bo_speed(&m), want);
    }
    /* a MoE on the CPU (2 positions 1.8 plain steps, each one after costs less) and
     * code editing's acceptance: the larger windows that pay are found */
    {
        struct bo_sim m = { .T = 8, .alpha = 0.9, .c1 = 1.8, .slope = 0.8, .power = 0.75,
                            .first = 1, .spike_p = 0.02, .spike = 5, .n_tokens = 2000 };
        bo_run(&m, 7);
        ok(bo_speed(&m) >= 1.10 && m.n_hopeless_chosen == 0,
           "back-off, MoE costs on a CPU, acceptance 0.9: speed %.3f (>= 1.10; k = 1 alone "
           "would give %.3f), %d of %d windows drafted", bo_speed(&m), 1.9 / 1.8,
           m.n_drafting, m.n_windows);
    }
    /* a seeded cost (strata_spec_create's calibration with a draft model): a hopeless
     * window of 1 draft is not even explored; a cheap one is drafted from the start */
    for (int cheap = 0; cheap <= 1; cheap++) {
        struct strata_spec_backoff b;
        strata_spec_backoff_init(&b, 4, 1);
        strata_spec_backoff_seed(&b, 1, cheap ? 1.05 : 1.95);
        int drafted = 0;
        for (int i = 0; i < 1000; i++) {
            int k = strata_spec_backoff_choose(&b);
            drafted += k > 0;
            double cost = k == 0 ? 1 : (cheap ? 1.05 : 1.95) + 0.9 * (k - 1);
            strata_spec_backoff_learn(&b, k, k > 0 ? k : 0, cost, 0);
        }
        ok(cheap ? drafted >= 900 : drafted == 0, "back-off, window of 1 draft seeded at %.2f "
           "plain steps, every draft accepted: %d of 1000 windows drafted (%s)",
           cheap ? 1.05 : 1.95, drafted, cheap ? ">= 900" : "none");
    }
    /* fixed windows: always T */
    {
        struct strata_spec_backoff b;
        strata_spec_backoff_init(&b, 5, 0);
        int all = 1;
        for (int i = 0; i < 100; i++) {
            all &= strata_spec_backoff_choose(&b) == 5;
            strata_spec_backoff_learn(&b, 5, 0, 100, 0);
        }
        ok(all, "back-off off (adaptive 0): every window holds T drafts");
    }
}

int main(void)
{
    ngram();
    rejection();
    backoff();
    static const char *const models[] = {
        "tinycoder-moe-F16.gguf",    "tinycoder-moe-Q8_0.gguf",   "tinycoder-moe-Q4_K_M.gguf",
        "tinycoder-moe-IQ4_XS.gguf", "tinycoder-moe-IQ2_XS.gguf", "tinycoder-moe-IQ1_M.gguf",
        "tinydraft-qwen3-F16.gguf",  "stories260K.gguf",
    };
    for (size_t i = 0; i < sizeof models / sizeof *models; i++)
        bitwise(models[i]);
    greedy("tinycoder-moe-Q4_K_M.gguf", NULL, 2);
    greedy("tinycoder-moe-Q4_K_M.gguf", "tinydraft-qwen3-F16.gguf", 1);
    draft_catchup();
    greedy("stories260K.gguf", NULL, 2);
    sampled("stories260K.gguf");
    stops();
    return tap_done();
}
