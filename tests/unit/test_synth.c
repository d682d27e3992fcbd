/* test_synth.c - synthetic models load as the shape they name, with finite weights of the
 * intended magnitude (rms ~ amp, mean ~ 0 in every block type), and a forward pass keeps
 * its activations bounded (the GPU's f16 activations overflow at 65504). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "ggml_types.h"
#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "synth.h"
#include "tap.h"
#include "vocab.h"

/* Build a synthetic model in memory (*buf, caller frees) and open it as *g. */
static int synth_open(const char *shape, int n_layer, const char *ftype, uint64_t seed,
                      void **buf, struct strata_gguf **g, struct strata_err *err)
{
    struct strata_synth_opts o = {shape, n_layer, ftype, seed};
    size_t size = 0;
    int rc = strata_synth_build(&o, buf, &size, err);
    return rc ? rc : strata_gguf_open_mem(g, *buf, size, shape, err);
}

static void check_shape(const char *shape, const char *ftype, int n_layer, uint32_t want_expert)
{
    struct strata_err err = {0, ""};
    void *buf = NULL;
    struct strata_gguf *g = NULL;
    struct strata_model *m = NULL;
    int rc = synth_open(shape, n_layer, ftype, 7, &buf, &g, &err);
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

/* rms and mean of the first rows of w (dequantised) against amp. */
static void check_weight(const char *ftype, const struct strata_weight *w, int64_t rows,
                         double amp)
{
    struct strata_err err = {0, ""};
    float *row = malloc(sizeof(float) * (size_t)w->ne[0]);
    double ss = 0, sum = 0, n = 0;
    int finite = 1;
    for (int64_t r = 0; row && r < rows; r++) {
        strata_quant_dequant_ref(w->type, (const char *)w->data + (size_t)r * w->nb1, row,
                                 w->ne[0], &err);
        for (int64_t i = 0; i < w->ne[0]; i++) {
            finite &= isfinite(row[i]) != 0;
            ss += (double)row[i] * row[i];
            sum += row[i];
            n++;
        }
    }
    double rms = n ? sqrt(ss / n) : 0, mean = n ? sum / n : 0;
    ok(finite && rms > 0.5 * amp && rms < 2.0 * amp && fabs(mean) < 0.1 * rms,
       "%s: %s (%s) rms %.4g for amp %.4g, mean %.3g", ftype, w->name,
       strata_ggml_type_name(w->type), rms, amp, mean);
    free(row);
}

static void check_magnitudes(const char *ftype)
{
    struct strata_err err = {0, ""};
    struct strata_synth_opts o = {"qwen3-moe-tiny", 2, ftype, 11};
    void *buf = NULL;
    size_t size = 0;
    struct strata_gguf *g = NULL;
    struct strata_model *m = NULL;
    int rc = strata_synth_build(&o, &buf, &size, &err);
    if (!rc)
        rc = strata_gguf_open_mem(&g, buf, size, "synth", &err);
    if (!rc)
        rc = strata_model_load(&m, g, &err);
    ok(rc == 0, "%s: builds and loads%s%s", ftype, rc ? ": " : "", err.msg);
    if (!rc) {
        const double aE = 1.0 / 45.0;
        check_weight(ftype, &m->tok_embd, 16, 1.0);
        check_weight(ftype, &m->layers[0].wq, 16, aE);
        check_weight(ftype, &m->layers[1].wv, 16, aE);
        check_weight(ftype, &m->layers[0].ffn_gate_exps, 16, aE);
        check_weight(ftype, &m->layers[1].ffn_down_exps, 16, aE);
        check_weight(ftype, &m->output, 16, aE);
    }
    strata_model_free(m);
    strata_gguf_close(g);
    free(buf);
}

/* Random token ids through the CPU engine: the logits stay finite and small (they were
 * ~860 on the full-size shape when K-quant scales were taken for 4-bit steps). */
static void check_forward(void)
{
    struct strata_err err = {0, ""};
    void *buf = NULL;
    struct strata_gguf *g = NULL;
    struct strata_engine *e = NULL;
    float *logits = NULL;
    int rc = synth_open("qwen3-moe-tiny", 2, "Q4_K_M", 42, &buf, &g, &err);
    struct strata_engine_opts eo;
    strata_engine_opts_init(&eo);
    eo.backend = "cpu";
    eo.n_threads = 1;
    eo.n_ctx = 64;
    if (!rc)
        rc = strata_engine_open_gguf(&e, g, &eo, &err);
    enum { N = 16 };
    int32_t nv = rc ? 0 : strata_engine_n_vocab(e);
    if (!rc && !(logits = malloc(sizeof(float) * (size_t)N * (size_t)nv)))
        rc = strata_err_set(&err, STRATA_E_NOMEM, "out of memory");
    int32_t ids[N];
    uint64_t st = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < N; i++) {
        st ^= st << 13;
        st ^= st >> 7;
        st ^= st << 17;
        ids[i] = (int32_t)(((st >> 32) * (uint64_t)(nv ? nv : 1)) >> 32);
    }
    if (!rc)
        rc = strata_engine_eval(e, ids, N, STRATA_LOGITS_ALL, logits, &err);
    ok(rc == 0, "forward of %d random ids%s%s", N, rc ? ": " : "", err.msg);
    if (!rc) {
        double mx = 0;
        int finite = 1;
        for (int64_t i = 0; i < (int64_t)N * nv; i++) {
            finite &= isfinite(logits[i]) != 0;
            if (fabs(logits[i]) > mx)
                mx = fabs(logits[i]);
        }
        ok(finite && mx > 0 && mx < 20, "logits finite and bounded: max |logit| %.3g", mx);
    }
    free(logits);
    strata_engine_close(e);
    strata_gguf_close(g);
    free(buf);
}

/* RssFile + RssShmem of /proc/self/status in kB (a file on tmpfs, as /tmp may be, is
 * counted as shared memory), -1 when absent */
static long rss_file_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "RssFile:", 8) || !strncmp(line, "RssShmem:", 9))
            v = (v < 0 ? 0 : v) + atol(line + (line[3] == 'F' ? 8 : 9));
    if (f)
        fclose(f);
    return v;
}

/* strata_gguf_drop_pages: the pages of a file-mapped tensor leave the resident set and
 * read back the same; an in-memory image is never touched. */
static void check_drop_pages(void)
{
    struct strata_err err = {0, ""};
    struct strata_synth_opts o = {"qwen3-moe-tiny", 2, "Q8_0", 11};
    char path[] = "/tmp/strata-test-drop-XXXXXX";
    int fd = mkstemp(path);
    struct strata_gguf *g = NULL, *gm = NULL;
    struct strata_model *m = NULL, *mm = NULL;
    void *buf = NULL;
    size_t size = 0;
    if (fd >= 0)
        close(fd);
    int rc = fd < 0 ? STRATA_E_IO : strata_synth_write(&o, path, &err);
    if (!rc)
        rc = strata_gguf_open(&g, path, &err);
    if (!rc)
        rc = strata_model_load(&m, g, &err);
    if (!rc)
        rc = strata_synth_build(&o, &buf, &size, &err);
    if (!rc)
        rc = strata_gguf_open_mem(&gm, buf, size, "mem", &err);
    if (!rc)
        rc = strata_model_load(&mm, gm, &err);
    ok(rc == 0, "drop_pages: model written, mapped and built%s%s", rc ? ": " : "", err.msg);
    if (!rc) {
        const struct strata_weight *w = &m->layers[0].ffn_gate_exps;
        size_t n = w->nb2 * (size_t)w->ne[2];
        unsigned char *copy = malloc(n);
        memcpy(copy, w->data, n);
        size_t pg = (size_t)sysconf(_SC_PAGESIZE);
        long before = rss_file_kb();
        size_t got = strata_gguf_drop_pages(g, w->data, n);
        long after = rss_file_kb();
        ok(got > 0 && got <= n && got % pg == 0, "drop_pages: %zu of %zu bytes dropped", got, n);
        /* the memcpy above mapped every page of the tensor in; now they are out */
        ok(before > 0 && after >= 0 && before - after >= (long)(got / 1024) * 9 / 10,
           "drop_pages: file-backed RSS %ld kB -> %ld kB", before, after);
        ok(memcmp(copy, w->data, n) == 0, "drop_pages: the tensor reads back the same bytes");
        free(copy);
        const struct strata_weight *v = &mm->layers[0].ffn_gate_exps;
        size_t nv = v->nb2 * (size_t)v->ne[2];
        unsigned char first = *(const unsigned char *)v->data;
        ok(strata_gguf_drop_pages(gm, v->data, nv) == 0 && first == *(const unsigned char *)v->data,
           "drop_pages: an in-memory image is left alone");
        ok(strata_gguf_drop_pages(g, buf, size) == 0, "drop_pages: a range outside the file is "
           "refused");
    }
    strata_model_free(mm);
    strata_gguf_close(gm);
    free(buf);
    strata_model_free(m);
    strata_gguf_close(g);
    unlink(path);
}

/* The synthetic vocabulary: the shape's size, any text through its byte tokens and
 * back. */
static void check_vocab(void)
{
    struct strata_err err = {0, ""};
    void *buf = NULL;
    struct strata_gguf *g = NULL;
    struct strata_vocab *v = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    const char *text = "hello, w\xc3\xb6rld";
    int rc = synth_open("qwen3-moe-tiny", 1, "Q8_0", 3, &buf, &g, &err);
    if (!rc)
        rc = strata_vocab_load(&v, g, &err);
    if (!rc)
        rc = strata_vocab_tokenize(v, text, strlen(text), 1, 0, &ids, &n, &err);
    /* BOS, then "\u2581" (259), the 6 bytes of "hello,", "\u2581", the 6 of "w\u00f6rld" */
    ok(rc == 0 && strata_vocab_n_tokens(v) == 512 && n == 15 && ids[0] == 1 && ids[1] == 259 &&
           ids[2] == 3 + 'h' && ids[8] == 259,
       "synthetic vocabulary: 512 tokens, \"%s\" is BOS, word boundaries and %zu byte tokens "
       "(12)%s%s", text, n > 3 ? n - 3 : 0, rc ? ": " : "", err.msg);
    char *out = NULL;
    size_t len = 0;
    if (!rc)
        rc = strata_vocab_detokenize(v, ids + 1, n - 1, 0, &out, &len, &err);
    ok(rc == 0 && len == strlen(text) && memcmp(out, text, len) == 0,
       "synthetic vocabulary: the ids read back as the text (%zu bytes)", len);
    free(out);
    free(ids);
    strata_vocab_free(v);
    strata_gguf_close(g);
    free(buf);
}

int main(void)
{
    check_vocab();
    check_drop_pages();
    check_shape("qwen3-moe-tiny", "Q4_K_M", 3, 16);
    check_shape("qwen3-moe-tiny", "IQ2_XS", 1, 16);
    check_shape("llama-tiny", "Q8_0", 2, 0);
    static const char *const ftypes[] = {"Q4_K_M", "Q8_0", "Q5_K", "Q4_1", "Q2_K", "Q3_K",
                                         "IQ2_XS", "IQ4_XS"};
    for (size_t i = 0; i < sizeof ftypes / sizeof ftypes[0]; i++)
        check_magnitudes(ftypes[i]);
    check_forward();
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
