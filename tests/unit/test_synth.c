/* test_synth.c - synthetic models load as the shape they name, with finite weights. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "synth.h"
#include "tap.h"

static void check_shape(const char *shape, const char *ftype, int n_layer, uint32_t want_expert)
{
    struct strata_err err = {0, ""};
    struct strata_synth_opts o = {shape, n_layer, ftype, 7};
    void *buf = NULL;
    size_t size = 0;
    struct strata_gguf *g = NULL;
    struct strata_model *m = NULL;
    int rc = strata_synth_build(&o, &buf, &size, &err);
    if (!rc)
        rc = strata_gguf_open_mem(&g, buf, size, shape, &err);
    if (!rc)
        rc = strata_model_load(&m, g, &err);
    ok(rc == 0, "%s %s: builds and loads%s%s", shape, ftype, rc ? ": " : "", err.msg);
    if (!rc) {
        ok(m->hp.n_layer == (uint32_t)n_layer && m->hp.n_expert == want_expert,
           "%s: %u layers, %u experts", shape, m->hp.n_layer, m->hp.n_expert);
        const struct strata_weight *w = &m->layers[0].wq;
        float *row = malloc(sizeof(float) * (size_t)w->ne[0]);
        strata_quant_dequant_ref(w->type, w->data, row, w->ne[0], &err);
        int finite = 1, nonzero = 0;
        for (int64_t i = 0; i < w->ne[0]; i++) {
            finite &= isfinite(row[i]) != 0;
            nonzero += row[i] != 0.0f;
        }
        ok(finite && nonzero > w->ne[0] / 2, "%s: %s row finite, %d of %lld non-zero", shape,
           w->name, nonzero, (long long)w->ne[0]);
        free(row);
    }
    strata_model_free(m);
    strata_gguf_close(g);
    free(buf);
}

int main(void)
{
    check_shape("qwen3-moe-tiny", "Q4_K_M", 3, 16);
    check_shape("qwen3-moe-tiny", "IQ2_XS", 1, 16);
    check_shape("llama-tiny", "Q8_0", 2, 0);
    struct strata_err err = {0, ""};
    struct strata_synth_opts bad = {"nope", 1, "Q4_K", 1};
    void *buf = NULL;
    size_t size = 0;
    int rc = strata_synth_build(&bad, &buf, &size, &err);
    ok(rc == STRATA_E_INVALID && strstr(err.msg, "'nope'"), "unknown shape refused: %s", err.msg);
    struct strata_synth_opts badt = {"llama-tiny", 1, "Q9_X", 1};
    rc = strata_synth_build(&badt, &buf, &size, &err);
    ok(rc == STRATA_E_INVALID && strstr(err.msg, "'Q9_X'"), "unknown type refused: %s", err.msg);
    return tap_done();
}
