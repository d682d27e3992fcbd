/* test_splice_prompt.c - image positions in a prompt (splice.h) with the
 * Qwen2 vocabulary, which has <|vision_start|>, <|image_pad|> and
 * <|vision_end|>; the n_embd and M-RoPE checks. */
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "gguf_write.h"
#include "splice.h"
#include "tap.h"
#include "vocab.h"

static size_t tok(const struct strata_vocab *v, const char *s, int32_t *out)
{
    struct strata_err err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    if (strata_vocab_tokenize(v, s, strlen(s), 0, 1, &ids, &n, &err))
        return 0;
    memcpy(out, ids, n * sizeof *ids);
    free(ids);
    return n;
}

/* ids == want[0..nw) */
static int same(const int32_t *ids, size_t n, const int32_t *want, size_t nw)
{
    return n == nw && memcmp(ids, want, n * sizeof *ids) == 0;
}

int main(void)
{
    char path[1024];
    struct strata_err err = {0};
    struct strata_gguf *g = NULL;
    struct strata_vocab *v = NULL;
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-qwen2.gguf", tap_fixtures());
    if (!ok(strata_gguf_open(&g, path, &err) == 0 && strata_vocab_load(&v, g, &err) == 0,
            "qwen2 vocabulary (%s)", err.msg[0] ? err.msg : "ok"))
        return tap_done();
    const char *mk = strata_splice_default_marker(v);
    ok(mk && !strcmp(mk, "<|image_pad|>"), "default marker: <|image_pad|>");
    int32_t vs = strata_vocab_find(v, "<|vision_start|>", 16);
    int32_t ve = strata_vocab_find(v, "<|vision_end|>", 14);
    ok(vs >= 0 && ve >= 0, "vision start/end tokens %d %d", vs, ve);

    int32_t want[256], *ids = NULL;
    size_t n = 0, k;
    uint32_t nt[2] = {4, 2};
    /* the chat-template form: the pad expands in place, start/end kept once */
    const char *t1 = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe it.";
    k = tok(v, "<|im_start|>user\n<|vision_start|>", want);
    for (int i = 0; i < 4; i++)
        want[k++] = -1;
    k += tok(v, "<|vision_end|>Describe it.", want + k);
    int rc = strata_splice_tokenize(v, t1, strlen(t1), 0, mk, 1, nt, &ids, &n, &err);
    ok(rc == 0 && same(ids, n, want, k), "template form: pad -> 4 image positions (%zu ids)", n);
    free(ids);

    /* a plain marker is wrapped in start/end; two images in order */
    const char *t2 = "A<image>B<image>";
    k = tok(v, "A", want);
    want[k++] = vs;
    for (int i = 0; i < 4; i++)
        want[k++] = -1;
    want[k++] = ve;
    k += tok(v, "B", want + k);
    want[k++] = vs;
    want[k++] = -1;
    want[k++] = -1;
    want[k++] = ve;
    rc = strata_splice_tokenize(v, t2, strlen(t2), 0, "<image>", 2, nt, &ids, &n, &err);
    ok(rc == 0 && same(ids, n, want, k), "plain marker wrapped, two images in order");
    free(ids);

    /* no marker: the images first */
    k = 0;
    want[k++] = vs;
    for (int i = 0; i < 4; i++)
        want[k++] = -1;
    want[k++] = ve;
    k += tok(v, "Hi", want + k);
    rc = strata_splice_tokenize(v, "Hi", 2, 0, mk, 1, nt, &ids, &n, &err);
    ok(rc == 0 && same(ids, n, want, k), "no marker: the image comes first");
    free(ids);

    /* marker count differs from the images */
    rc = strata_splice_tokenize(v, t2, strlen(t2), 0, "<image>", 1, nt, &ids, &n, &err);
    ok(rc == STRATA_E_FORMAT && strstr(err.msg, "2 image markers") && strstr(err.msg, "1 image"),
       "marker count mismatch: %s", err.msg);
    ok(strata_splice_count("a<i><i>b<i", 10, "<i>") == 2, "count");

    /* checks: n_embd, and M-RoPE architectures */
    rc = strata_splice_check(g, 2048, 256, "x.emb", &err);
    ok(rc == STRATA_E_FORMAT && strstr(err.msg, "n_embd 256") && strstr(err.msg, "n_embd is 2048"),
       "n_embd mismatch names both: %s", err.msg);
    ok(strata_splice_check(g, 256, 256, "x.emb", &err) == 0, "equal n_embd accepted");
    struct strata_gguf_writer *w = NULL;
    struct strata_gguf *g2 = NULL;
    void *buf = NULL;
    size_t size = 0;
    int32_t sec[4] = {16, 24, 24, 0};
    rc = strata_gguf_writer_create(&w, &err);
    rc = rc ? rc : strata_gguf_writer_add_str(w, "general.architecture", "qwen2vl", &err);
    rc = rc ? rc : strata_gguf_writer_add_arr(w, "qwen2vl.rope.dimension_sections",
                                              STRATA_GGUF_INT32, sec, 4, &err);
    rc = rc ? rc : strata_gguf_writer_write_mem(w, &buf, &size, &err);
    rc = rc ? rc : strata_gguf_open_mem(&g2, buf, size, "mrope.gguf", &err);
    ok(rc == 0, "an in-memory qwen2vl GGUF (%s)", rc ? err.msg : "ok");
    rc = strata_splice_check(g2, 256, 256, "x.emb", &err);
    ok(rc == STRATA_E_UNSUPPORTED && strstr(err.msg, "qwen2vl.rope.dimension_sections"),
       "M-RoPE sections refused: %s", err.msg);
    strata_gguf_close(g2);
    free(buf);
    strata_gguf_writer_free(w);
    strata_vocab_free(v);
    strata_gguf_close(g);
    return tap_done();
}
