/* test_splice.c - image embeddings spliced into a prompt: when the spliced
 * rows equal the text tokens' own embedding rows, the logits equal those of
 * the tokens (the invariant strata-generate --image relies on). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "tap.h"

static int run(const char *model_file, int embd_from, int embd_n, struct strata_err *err)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/models/%s", tap_fixtures(), model_file);
    struct strata_engine_opts o;
    strata_engine_opts_init(&o);
    o.n_threads = 2;
    o.n_ctx = 64;
    o.kv_type = STRATA_KV_F32;
    struct strata_engine *e = NULL;
    int rc = strata_engine_open(&e, path, &o, err);
    if (!ok(rc == 0, "%s: open (%s)", model_file, rc ? err->msg : "ok"))
        return tap_done();
    const struct strata_model *m = strata_engine_model(e);
    int32_t n_vocab = strata_engine_n_vocab(e), n_embd = (int32_t)m->hp.n_embd;
    /* a fixed id sequence spread over the vocabulary */
    int32_t ids[12];
    int n = (int)(sizeof(ids) / sizeof(ids[0]));
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)((i * 2654435761u) % (uint32_t)(n_vocab - 10) + 5);
    float *ref = malloc(sizeof(float) * (size_t)n * n_vocab);
    float *got = malloc(sizeof(float) * (size_t)n * n_vocab);
    float *rows = malloc(sizeof(float) * (size_t)embd_n * n_embd);
    rc = strata_engine_eval(e, ids, n, STRATA_LOGITS_ALL, ref, err);
    ok(rc == 0, "%s: token logits (%s)", model_file, rc ? err->msg : "ok");

    /* the embedding rows of ids[embd_from .. embd_from + embd_n) */
    const struct strata_weight *te = &m->tok_embd;
    for (int i = 0; i < embd_n; i++)
        strata_quant_dequant_row(te->type, (const char *)te->data + (size_t)ids[embd_from + i] * te->nb1,
                                 rows + (size_t)i * n_embd, n_embd);

    rc = strata_engine_rollback(e, 0, err);
    rc |= strata_engine_eval(e, ids, embd_from, STRATA_LOGITS_ALL, got, err);
    rc |= strata_engine_eval_embd(e, rows, embd_n, STRATA_LOGITS_ALL,
                                  got + (size_t)embd_from * n_vocab, err);
    rc |= strata_engine_eval(e, ids + embd_from + embd_n, n - embd_from - embd_n,
                             STRATA_LOGITS_ALL, got + (size_t)(embd_from + embd_n) * n_vocab, err);
    ok(rc == 0, "%s: spliced evaluation (%s)", model_file, rc ? err->msg : "ok");
    double maxd = 0;
    for (size_t i = 0; rc == 0 && i < (size_t)n * n_vocab; i++)
        if (fabs((double)ref[i] - got[i]) > maxd)
            maxd = fabs((double)ref[i] - got[i]);
    ok(rc == 0 && maxd == 0, "%s: spliced rows %d..%d give the tokens' logits (max diff %g)",
       model_file, embd_from, embd_from + embd_n - 1, maxd);
    const int32_t *hist = strata_engine_history(e);
    ok(strata_engine_n_past(e) == n && hist[embd_from] == -1 && hist[embd_from - 1] == ids[embd_from - 1],
       "%s: history marks image positions with -1", model_file);

    /* a spliced batch past n_ctx is refused, the cache unchanged */
    float *big = calloc((size_t)64 * n_embd, sizeof(float));
    rc = strata_engine_eval_embd(e, big, 60, STRATA_LOGITS_LAST, got, err);
    ok(rc != 0 && strata_engine_n_past(e) == n, "%s: embeddings past n_ctx refused: %s",
       model_file, err->msg);
    free(big);
    free(ref);
    free(got);
    free(rows);
    strata_engine_close(e);
    return 0;
}

int main(void)
{
    struct strata_err err = {0};
    run("tinycoder-moe-F16.gguf", 3, 4, &err);
    run("tinycoder-moe-Q4_K_M.gguf", 1, 6, &err);
    run("tinydraft-qwen3-F16.gguf", 5, 2, &err);
    return tap_done();
}
