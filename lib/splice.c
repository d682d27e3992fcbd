/* splice.c - image positions in a prompt (splice.h). */
#include "splice.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "vocab.h"

#define SPLICE_MAX_POS (1 << 24)

const char *strata_splice_default_marker(const struct strata_vocab *v)
{
    return strata_vocab_find(v, STRATA_SPLICE_PAD, strlen(STRATA_SPLICE_PAD)) >= 0
               ? STRATA_SPLICE_PAD : NULL;
}

int strata_splice_check(const struct strata_gguf *g, uint32_t model_n_embd, uint32_t n_embd,
                        const char *name, struct strata_err *err)
{
    const char *arch = NULL;
    char key[160];
    if (g && strata_gguf_get_str(g, "general.architecture", &arch, NULL) == 0 && arch) {
        snprintf(key, sizeof key, "%s.rope.dimension_sections", arch);
        if (strata_gguf_find_kv(g, key))
            return strata_err_set(err, STRATA_E_UNSUPPORTED,
                                  "the model's architecture '%s' declares %s (M-RoPE): "
                                  "3-D positions for image tokens are not supported yet",
                                  arch, key);
    }
    if (n_embd != model_n_embd)
        return strata_err_set(err, STRATA_E_FORMAT,
                              "'%s': the image embeddings have n_embd %u but the model's "
                              "n_embd is %u (an mmproj for another model?)",
                              name, n_embd, model_n_embd);
    return 0;
}

int strata_splice_count(const char *text, size_t len, const char *marker)
{
    size_t ml = marker ? strlen(marker) : 0;
    int n = 0;
    if (!ml)
        return 0;
    for (size_t i = 0; i + ml <= len;) {
        if (memcmp(text + i, marker, ml) == 0) {
            n++;
            i += ml;
        } else {
            i++;
        }
    }
    return n;
}

struct ids {
    int32_t *a;
    size_t n, cap;
};

static int push(struct ids *b, const int32_t *x, size_t n, int32_t fill, struct strata_err *err)
{
    if (b->n + n > SPLICE_MAX_POS)
        return strata_err_set(err, STRATA_E_LIMIT, "prompt with images of more than %d "
                              "positions", SPLICE_MAX_POS);
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n)
            cap *= 2;
        int32_t *q = realloc(b->a, cap * sizeof *q);
        if (!q)
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        b->a = q;
        b->cap = cap;
    }
    for (size_t i = 0; i < n; i++)
        b->a[b->n + i] = x ? x[i] : fill;
    b->n += n;
    return 0;
}

static int push_text(struct ids *b, const struct strata_vocab *v, const char *t, size_t n,
                     struct strata_err *err)
{
    int32_t *x = NULL;
    size_t nx = 0;
    if (n == 0)
        return 0;
    int rc = strata_vocab_tokenize(v, t, n, 0, 1, &x, &nx, err);
    if (rc == 0)
        rc = push(b, x, nx, 0, err);
    free(x);
    return rc;
}

static int push_image(struct ids *b, int32_t start, int32_t end, int wrap, uint32_t n_tok,
                      struct strata_err *err)
{
    int rc = 0;
    if (wrap)
        rc = push(b, &start, 1, 0, err);
    if (rc == 0)
        rc = push(b, NULL, n_tok, -1, err);
    if (rc == 0 && wrap)
        rc = push(b, &end, 1, 0, err);
    return rc;
}

int strata_splice_tokenize(const struct strata_vocab *v, const char *text, size_t len,
                           int add_bos, const char *marker, int n_images,
                           const uint32_t *n_tokens, int32_t **ids, size_t *n_ids,
                           struct strata_err *err)
{
    struct ids b = { 0 };
    const size_t sl = strlen(STRATA_SPLICE_START), el = strlen(STRATA_SPLICE_END);
    const int32_t start = strata_vocab_find(v, STRATA_SPLICE_START, sl);
    const int32_t end = strata_vocab_find(v, STRATA_SPLICE_END, el);
    const int have_se = start >= 0 && end >= 0;
    const size_t ml = marker ? strlen(marker) : 0;
    int n_mark = strata_splice_count(text, len, marker), rc = 0, k = 0;
    *ids = NULL;
    *n_ids = 0;
    if (n_images > 0 && !ml)
        return strata_err_set(err, STRATA_E_INVALID, "empty image marker");
    if (n_mark > 0 && n_mark != n_images)
        return strata_err_set(err, STRATA_E_FORMAT, "the prompt has %d image marker%s "
                              "('%s') but %d image%s given", n_mark, n_mark == 1 ? "" : "s",
                              marker, n_images, n_images == 1 ? " was" : "s were");
    int32_t bos = strata_vocab_bos(v);
    if (add_bos && bos >= 0 && (rc = push(&b, &bos, 1, 0, err)))
        goto out;
    for (; n_mark == 0 && k < n_images; k++)
        if ((rc = push_image(&b, start, end, have_se, n_tokens[k], err)))
            goto out;
    size_t pos = 0;
    for (;;) {
        size_t m = pos;
        while (ml && n_mark && m + ml <= len && memcmp(text + m, marker, ml) != 0)
            m++;
        int found = ml && n_mark && m + ml <= len;
        if (!found)
            m = len;
        if ((rc = push_text(&b, v, text + pos, m - pos, err)))
            goto out;
        if (!found)
            break;
        int inside = m >= sl && memcmp(text + m - sl, STRATA_SPLICE_START, sl) == 0 &&
                     m + ml + el <= len && memcmp(text + m + ml, STRATA_SPLICE_END, el) == 0;
        if ((rc = push_image(&b, start, end, have_se && !inside, n_tokens[k++], err)))
            goto out;
        pos = m + ml;
    }
    *ids = b.a;
    *n_ids = b.n;
    b.a = NULL;
out:
    free(b.a);
    return rc;
}
