/* bench_tok.c - tokenizer throughput: tokenize at least 1 MiB of Python
 * source ($STRATA_FIXTURES/ref/heldout.py.txt repeated) with a vocabulary
 * (default: the qwen2 fixture vocabulary) on one thread, and print bytes/s
 * and tokens/s of the best of several runs.
 *
 *   bench_tok [VOCAB.gguf [TEXT_FILE [MIB]]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "vocab.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const char *fx = getenv("STRATA_FIXTURES");
    char vpath[4096], tpath[4096];
    if (!fx || !*fx)
        fx = "../shared/fixtures";
    if (argc > 1)
        snprintf(vpath, sizeof(vpath), "%s", argv[1]);
    else
        snprintf(vpath, sizeof(vpath), "%s/vocab/ggml-vocab-qwen2.gguf", fx);
    if (argc > 2)
        snprintf(tpath, sizeof(tpath), "%s", argv[2]);
    else
        snprintf(tpath, sizeof(tpath), "%s/ref/heldout.py.txt", fx);
    double mib = argc > 3 ? atof(argv[3]) : 1.0;
    if (mib <= 0)
        mib = 1.0;

    struct strata_err err = { 0 };
    struct strata_gguf *g = NULL;
    struct strata_vocab *v = NULL;
    double t0 = now();
    if (strata_gguf_open(&g, vpath, &err) || strata_vocab_load(&v, g, &err)) {
        fprintf(stderr, "bench_tok: %s\n", err.msg);
        return 1;
    }
    double t_load = now() - t0;

    FILE *f = fopen(tpath, "rb");
    if (!f) {
        fprintf(stderr, "bench_tok: cannot open '%s'\n", tpath);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long fl = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *src = malloc((size_t)fl + 1);
    if (!src || fl <= 0 || fread(src, 1, (size_t)fl, f) != (size_t)fl) {
        fprintf(stderr, "bench_tok: cannot read '%s'\n", tpath);
        return 1;
    }
    fclose(f);
    size_t want = (size_t)(mib * 1024 * 1024), n = 0;
    char *text = malloc(want + (size_t)fl);
    while (n < want) {
        memcpy(text + n, src, (size_t)fl);
        n += (size_t)fl;
    }

    double best = 1e30;
    size_t n_ids = 0;
    for (int run = 0; run < 5; run++) {
        int32_t *ids = NULL;
        double t = now();
        if (strata_vocab_tokenize(v, text, n, 0, 1, &ids, &n_ids, &err)) {
            fprintf(stderr, "bench_tok: %s\n", err.msg);
            return 1;
        }
        t = now() - t;
        if (t < best)
            best = t;
        free(ids);
    }
    printf("vocab %s (pre '%s', %d tokens), loaded in %.3f s\n", vpath, strata_vocab_pre(v),
           strata_vocab_n_tokens(v), t_load);
    printf("text %s repeated to %zu bytes -> %zu tokens (%.2f bytes/token)\n", tpath, n, n_ids,
           (double)n / (double)n_ids);
    printf("best of 5: %.3f s = %.2f MB/s, %.0f tokens/s (one thread)\n", best,
           (double)n / best / 1e6, (double)n_ids / best);
    strata_vocab_free(v);
    strata_gguf_close(g);
    free(src);
    free(text);
    return 0;
}
