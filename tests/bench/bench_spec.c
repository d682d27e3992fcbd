/* bench_spec.c - what speculative decoding costs and gains on one engine, with drafts
 * of known quality, on a GGUF model or a synthetic one (lib/synth.h; prompts are token
 * ids, so no tokenizer is used).
 *
 *   bench_spec [--model GGUF | --synth SHAPE] [--layers N] [--ftype F] [--backend B]
 *              [-t THREADS] [--prompt P] [--gen N] [--reps R] [--spec "2 4 8"] [--label L]
 *
 * The prompt is P ids (a fixed pseudo-random sequence).  A plain greedy run (T 0)
 * records the N tokens the model writes; then for each T:
 *   oracle fixed   a draft that proposes exactly those tokens: every draft accepted,
 *                  the most a window of T + 1 can give
 *   ngram back-off prompt lookup over the model's own output, with the back-off
 *   wrong back-off a draft that is always wrong: the back-off must keep it at T 0's
 *                  speed (docs/speculative.md)
 *   wrong fixed    the same without the back-off: the raw cost of useless windows
 * One table row per run: decode tokens/s (median of R), acceptance, tokens and time
 * per verify step, and whether the text equals T 0's (it must: greedy).  T 0 runs again
 * last ("none (again)"): its ratio is how far the machine drifted over the table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "gguf.h"
#include "spec.h"
#include "synth.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int argmax(const float *l, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b])
            b = i;
    return b;
}

/* A draft that proposes the recorded continuation (wrong: each token + 1). */
struct known {
    const int32_t *ref;
    int n_ref, n_prompt, wrong, n_vocab;
};

static int known_propose(void *state, const int32_t *hist, int32_t n_hist, int32_t n_max,
                         int32_t *out, int32_t *n_out, struct strata_err *err)
{
    const struct known *k = state;
    (void)hist;
    (void)err;
    int j = n_hist - k->n_prompt; /* index in ref of the next token */
    *n_out = 0;
    for (int i = 0; i < n_max && j + i >= 0 && j + i < k->n_ref; i++)
        out[(*n_out)++] = k->wrong ? (k->ref[j + i] + 1) % k->n_vocab : k->ref[j + i];
    return 0;
}

struct run {
    double tps;
    struct strata_spec_stats st;
    int same;
};

/* One greedy generation of n_gen tokens after the prompt; sp NULL = plain decoding.
 * gen receives the tokens. */
static int generate(struct strata_engine *e, struct strata_spec *sp, const int32_t *prompt,
                    int n_prompt, int n_gen, int32_t *gen, double *secs, struct strata_err *err)
{
    int nv = strata_engine_n_vocab(e);
    float *l = malloc(sizeof(float) * (size_t)nv);
    int rc = l ? 0 : STRATA_E_NOMEM;
    if (!rc)
        rc = strata_engine_rollback(e, 0, err);
    if (!rc)
        rc = strata_engine_eval(e, prompt, n_prompt, STRATA_LOGITS_LAST, l, err);
    if (rc)
        goto out;
    double t0 = now_s();
    const float *cur = l;
    if (sp)
        strata_spec_begin(sp);
    for (int i = 0; i < n_gen && !rc; i++) {
        gen[i] = argmax(cur, nv);
        if (i + 1 == n_gen)
            break;
        if (sp) {
            rc = strata_spec_next(sp, gen[i], &cur, err);
        } else {
            rc = strata_engine_eval(e, gen + i, 1, STRATA_LOGITS_LAST, l, err);
            cur = l;
        }
    }
    if (!rc && sp)
        rc = strata_spec_end(sp, err);
    *secs = now_s() - t0;
out:
    free(l);
    return rc;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *shape = "qwen3-30b-a3b", *ftype = "Q4_K_M", *backend = "cpu";
    const char *ts = "2 4 8", *label = NULL;
    int layers = 12, threads = 0, n_prompt = 64, n_gen = 128, reps = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_spec: '%s' needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--synth")) shape = v;
        else if (!strcmp(a, "--layers")) layers = atoi(v);
        else if (!strcmp(a, "--ftype")) ftype = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "-t")) threads = atoi(v);
        else if (!strcmp(a, "--prompt")) n_prompt = atoi(v);
        else if (!strcmp(a, "--gen")) n_gen = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--spec")) ts = v;
        else if (!strcmp(a, "--label")) label = v;
        else {
            fprintf(stderr, "bench_spec: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (n_prompt < 1 || n_gen < 2 || reps < 1) {
        fprintf(stderr, "bench_spec: --prompt >= 1, --gen >= 2, --reps >= 1\n");
        return 2;
    }
    struct strata_err err = {0, ""};
    void *buf = NULL;
    size_t size = 0;
    struct strata_gguf *g = NULL;
    struct strata_engine *e = NULL;
    char name[256];
    int rc;
    if (model) {
        const char *b = strrchr(model, '/');
        snprintf(name, sizeof name, "%s", label ? label : b ? b + 1 : model);
        rc = strata_gguf_open(&g, model, &err);
    } else {
        struct strata_synth_opts so = {shape, layers, ftype, 42};
        snprintf(name, sizeof name, "%s", label ? label : shape);
        if (!label)
            snprintf(name + strlen(name), sizeof name - strlen(name), " %dL %s", layers, ftype);
        rc = strata_synth_build(&so, &buf, &size, &err);
        if (!rc)
            rc = strata_gguf_open_mem(&g, buf, size, shape, &err);
    }
    struct strata_engine_opts o;
    strata_engine_opts_init(&o);
    o.backend = backend;
    o.n_threads = threads;
    o.n_ctx = n_prompt + n_gen + 32;
    if (!rc)
        rc = strata_engine_open_gguf(&e, g, &o, &err);
    if (rc) {
        fprintf(stderr, "bench_spec: %s\n", err.msg);
        strata_gguf_close(g);
        free(buf);
        return 1;
    }
    int nv = strata_engine_n_vocab(e);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    int32_t *ref = malloc(sizeof(int32_t) * (size_t)n_gen);
    int32_t *gen = malloc(sizeof(int32_t) * (size_t)n_gen);
    double *t = malloc(sizeof(double) * (size_t)reps);
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = (int32_t)((i * 2654435761u + 7) % (unsigned)nv);
    const char *be = strata_engine_backend_name(e);
    int thr = strata_engine_n_threads(e);
    /* T 0: warm up (graphs, caches), then the reference */
    double secs = 0;
    rc = generate(e, NULL, prompt, n_prompt, n_gen, ref, &secs, &err);
    for (int r = 0; r < reps && !rc; r++) {
        rc = generate(e, NULL, prompt, n_prompt, n_gen, gen, &t[r], &err);
        if (!rc && memcmp(gen, ref, sizeof(int32_t) * (size_t)n_gen) != 0) {
            fprintf(stderr, "bench_spec: two plain greedy runs differ\n");
            rc = 1;
        }
    }
    if (rc) {
        fprintf(stderr, "bench_spec: %s\n", err.msg);
        goto done;
    }
    qsort(t, (size_t)reps, sizeof(double), cmp_d);
    double tps0 = (n_gen - 1) / t[reps / 2];
    printf("%-28s %-5s %3s  %-15s %2s  %8s %6s %7s %8s %8s %4s\n", "model", "backend", "thr",
           "draft", "T", "tok/s", "x T0", "accept", "tok/step", "ms/step", "same");
    printf("%-28s %-5s %3d  %-15s %2d  %8.1f %6.2f %7s %8s %8s %4s\n", name, be, thr,
           "none (plain)", 0, tps0, 1.0, "-", "1.00", "-", "yes");
    fflush(stdout);
    const char *modes[] = {"oracle fixed", "ngram back-off", "wrong back-off", "wrong fixed"};
    const char *p = ts;
    while (*p && !rc) {
        char *end;
        long T = strtol(p, &end, 10);
        if (end == p)
            break;
        p = end;
        if (T < 1 || T > STRATA_SPEC_MAX)
            continue;
        for (int m = 0; m < 4 && !rc; m++) {
            struct known k = {ref, n_gen, n_prompt, m >= 2, nv};
            struct strata_spec_draft d = {"known", &k, known_propose, NULL, 0, 1};
            struct strata_spec_opts so;
            strata_spec_opts_init(&so);
            so.n_max = (int)T;
            so.mode = STRATA_SPEC_NGRAM;
            so.adaptive = m == 1 || m == 2;
            so.user = m == 1 ? NULL : &d;
            struct strata_spec *sp = NULL;
            int same = 1;
            struct strata_spec_stats st;
            memset(&st, 0, sizeof st);
            rc = strata_spec_create(&sp, e, &so, &err);
            for (int r = 0; r < reps && !rc; r++) {
                strata_spec_stats_reset(sp);
                rc = generate(e, sp, prompt, n_prompt, n_gen, gen, &t[r], &err);
                same &= !rc && memcmp(gen, ref, sizeof(int32_t) * (size_t)n_gen) == 0;
                if (!rc && r == reps / 2)
                    strata_spec_stats_get(sp, &st);
            }
            strata_spec_free(sp);
            if (rc)
                break;
            qsort(t, (size_t)reps, sizeof(double), cmp_d);
            double tps = (n_gen - 1) / t[reps / 2];
            char acc[16] = "-", tstep[16] = "1.00", ms[16] = "-";
            if (st.n_drafted)
                snprintf(acc, sizeof acc, "%.1f%%", 100.0 * st.n_accepted / st.n_drafted);
            if (st.n_steps) {
                snprintf(tstep, sizeof tstep, "%.2f", (double)st.n_tokens / st.n_steps);
                snprintf(ms, sizeof ms, "%.3f", (st.t_draft_ms + st.t_verify_ms) / st.n_steps);
            }
            printf("%-28s %-5s %3d  %-15s %2ld  %8.1f %6.2f %7s %8s %8s %4s\n", name, be, thr,
                   modes[m], T, tps, tps / tps0, acc, tstep, ms, same ? "yes" : "NO");
            fflush(stdout); /* rows as they come: a run cut short keeps them */
            if (!same)
                rc = 1;
        }
    }
    /* T 0 again, after every row: its ratio is the run's own drift and spread */
    for (int r = 0; r < reps && !rc; r++)
        rc = generate(e, NULL, prompt, n_prompt, n_gen, gen, &t[r], &err);
    if (!rc) {
        qsort(t, (size_t)reps, sizeof(double), cmp_d);
        double tps = (n_gen - 1) / t[reps / 2];
        printf("%-28s %-5s %3d  %-15s %2d  %8.1f %6.2f %7s %8s %8s %4s\n", name, be, thr,
               "none (again)", 0, tps, tps / tps0, "-", "1.00", "-", "yes");
    }
    if (rc && err.msg[0])
        fprintf(stderr, "bench_spec: %s\n", err.msg);
done:
    free(prompt);
    free(ref);
    free(gen);
    free(t);
    strata_engine_close(e);
    strata_gguf_close(g);
    free(buf);
    return rc ? 1 : 0;
}
