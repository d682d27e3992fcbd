/* bench_gpu.c - prefill and decode speed of the GPU backend on a synthetic model
 * (lib/synth.h), as llama-bench measures them: pp = one prompt of P tokens from an
 * empty kv cache, tg = T single-token decode steps from an empty kv cache.
 *
 *   bench_gpu [--shape S] [--layers N] [--ftype F] [--pp P] [--tg T] [--reps R]
 *             [--ab VAR[,VAR...]] [--argmax | --copy]
 *
 * Prints tokens/s (median of R runs) next to the bandwidth floor of decoding: the
 * bytes of weights one token reads (strata_model_active_bytes) over the device's
 * copy bandwidth, measured here with a device-to-device copy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "gguf.h"
#include "model.h"
#include "synth.h"

double strata_gpu_bench_copy_bw(void); /* kernels/bench_bw.cu: bytes read+written per s */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* what each tg step asks for: the last row of logits in the engine's host row
 * (strata_engine_eval_row; as llama-bench's tg, whose llama_decode copies them into the
 * context's pinned output buffer every step), the same row copied into the caller's
 * buffer (--copy: strata_engine_eval), or only its argmax found on the device (--argmax:
 * what greedy decoding needs) */
static int tg_logits = STRATA_LOGITS_LAST, tg_copy = 0;

/* Open an engine on g, measure pp and tg (median of reps after a warm-up run), print
 * the figures (label: a variant's name, or ""), close it.  Returns 0 or 1. */
static int bench_one(struct strata_gguf *g, int pp, int tg, int reps, const char *label)
{
    struct strata_err err = {0, ""};
    struct strata_engine *e = NULL;
    struct strata_engine_opts o;
    strata_engine_opts_init(&o);
    o.backend = getenv("STRATA_BACKEND") ? getenv("STRATA_BACKEND") : "cuda";
    o.n_ctx = pp + tg + 16;
    o.n_prefill = pp;
    o.n_threads = 2;
    double t0 = now();
    int rc = strata_engine_open_gguf(&e, g, &o, &err);
    if (rc) {
        fprintf(stderr, "bench_gpu: %s\n", err.msg);
        return 1;
    }
    printf("%sengine open (upload) %.1f s\n", label, now() - t0);
    const struct strata_model *m = strata_engine_model(e);
    int nv = strata_engine_n_vocab(e);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(pp + tg));
    for (int i = 0; i < pp + tg; i++)
        ids[i] = (int32_t)((i * 2654435761u) % (unsigned)nv);
    float *logits = malloc(sizeof(float) * (size_t)nv);
    double *tp = calloc((size_t)reps + 1, sizeof(double)), *tt = calloc((size_t)reps + 1, sizeof(double));
    for (int r = 0; r <= reps && !rc; r++) { /* run 0 warms up */
        rc = strata_engine_rollback(e, 0, &err);
        double a = now();
        if (!rc)
            rc = strata_engine_eval(e, ids, pp, STRATA_LOGITS_LAST, logits, &err);
        tp[r] = now() - a;
        if (!rc)
            rc = strata_engine_rollback(e, 0, &err);
        a = now();
        const float *row = NULL;
        for (int i = 0; i < tg && !rc; i++)
            rc = tg_logits == STRATA_LOGITS_ARGMAX
                     ? strata_engine_eval_argmax(e, ids + pp + i, 1, (int32_t *)logits, &err)
                 : tg_copy ? strata_engine_eval(e, ids + pp + i, 1, STRATA_LOGITS_LAST, logits, &err)
                           : strata_engine_eval_row(e, ids + pp + i, 1, &row, &err);
        tt[r] = now() - a;
    }
    if (rc) {
        fprintf(stderr, "bench_gpu: %s\n", err.msg);
    } else {
        qsort(tp + 1, (size_t)reps, sizeof(double), cmp_d);
        qsort(tt + 1, (size_t)reps, sizeof(double), cmp_d);
        double pp_s = tp[1 + reps / 2], tg_s = tt[1 + reps / 2];
        double bw = strata_gpu_bench_copy_bw();
        uint64_t act = strata_model_active_bytes(m), tot = strata_model_total_bytes(m);
        printf("%sweights %.2f GB, active per token %.1f MB; device copy bandwidth %.2f TB/s\n",
               label, tot / 1e9, act / 1e6, bw / 1e12);
        printf("%spp%d: %.0f tok/s (%.2f ms)\n", label, pp, pp / pp_s, pp_s * 1e3);
        printf("%stg%d%s: %.0f tok/s (%.3f ms/token); floor %.3f ms/token = %.0f tok/s\n", label,
               tg, tg_logits == STRATA_LOGITS_ARGMAX ? " (argmax)" : tg_copy ? " (copy)" : "", tg / tg_s, tg_s / tg * 1e3, act / bw * 1e3, bw / act);
    }
    free(ids);
    free(logits);
    free(tp);
    free(tt);
    strata_engine_close(e);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *shape = "qwen3-30b-a3b", *ftype = "Q4_K_M";
    int layers = 12, pp = 512, tg = 128, reps = 3;
    const char *ab = NULL;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--shape")) shape = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--layers")) layers = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--ftype")) ftype = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--pp")) pp = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--tg")) tg = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--ab")) ab = argv[++i];
        else if (!strcmp(argv[i], "--argmax")) tg_logits = STRATA_LOGITS_ARGMAX;
        else if (!strcmp(argv[i], "--copy")) tg_copy = 1;
    }
    struct strata_err err = {0, ""};
    struct strata_synth_opts so = {shape, layers, ftype, 42};
    void *buf = NULL;
    size_t size = 0;
    struct strata_gguf *g = NULL;
    double t0 = now();
    int rc = strata_synth_build(&so, &buf, &size, &err);
    if (!rc)
        rc = strata_gguf_open_mem(&g, buf, size, shape, &err);
    printf("synthetic %s, %d layers, %s: %.2f GB built in %.1f s\n", shape, layers, ftype,
           size / 1e9, now() - t0);
    if (rc) {
        fprintf(stderr, "bench_gpu: %s\n", err.msg);
        return 1;
    }
    /* --ab VAR[+VAR...][,...]: the same measurement with each group of VARs set to 1
     * (or VAR=VALUE to VALUE) in the environment in turn (e.g. STRATA_NO_MVQ:
     * float-activation mat-vec; STRATA_NO_ATTQ+STRATA_NO_PIN_IN: both at once), then as
     * the environment is */
    for (const char *v = ab; v && *v && !rc;) {
        char group[256], label[280];
        size_t len = strcspn(v, ",");
        snprintf(group, sizeof group, "%.*s", (int)(len < sizeof group ? len : sizeof group - 1),
                 v);
        snprintf(label, sizeof label, strchr(group, '=') ? "[%s] " : "[%s=1] ", group);
        for (char *n = strtok(group, "+"); n; n = strtok(NULL, "+")) {
            char *eq = strchr(n, '=');
            if (eq)
                *eq = '\0';
            setenv(n, eq ? eq + 1 : "1", 1);
        }
        rc = bench_one(g, pp, tg, reps, label);
        snprintf(group, sizeof group, "%.*s", (int)(len < sizeof group ? len : sizeof group - 1),
                 v);
        for (char *n = strtok(group, "+"); n; n = strtok(NULL, "+")) {
            char *eq = strchr(n, '=');
            if (eq)
                *eq = '\0';
            unsetenv(n);
        }
        v += len + (v[len] == ',');
    }
    if (!rc)
        rc = bench_one(g, pp, tg, reps, "");
    strata_gguf_close(g);
    free(buf);
    return rc;
}
