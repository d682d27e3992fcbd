/* vocab_spm.c - SentencePiece-style BPE (tokenizer.ggml.model = "llama").
 *
 * Spaces become U+2581 "▁" (and one is prepended when add_space_prefix),
 * the text is split into characters, and the adjacent pair whose
 * concatenation is the vocabulary piece with the highest score is merged
 * first (leftmost on ties), until no pair forms a piece.  A character that
 * is not a piece falls back to its UTF-8 bytes as <0xNN> tokens, or to the
 * unknown token when the vocabulary has no byte tokens.  This is the
 * encoding of sentencepiece's bpe_model.cc. */
#include <stdlib.h>
#include <string.h>

#include "vocab_int.h"

struct spm_sym {
    size_t off, n; /* bytes of the escaped text; n 0 once merged away */
    int32_t prev, next;
};

struct spm_item {
    float score;
    int32_t left, right;
    size_t size;
};

struct spm_heap {
    struct spm_item *v;
    size_t n, cap;
};

/* max-heap by score, then the leftmost pair */
static int item_before(const struct spm_item *a, const struct spm_item *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static int heap_push(struct spm_heap *h, struct spm_item it, struct strata_err *err)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        struct spm_item *nv = realloc(h->v, cap * sizeof(*nv));
        if (!nv)
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory merging tokens");
        h->v = nv;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!item_before(&it, &h->v[p]))
            break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = it;
    return 0;
}

static struct spm_item heap_pop(struct spm_heap *h)
{
    struct spm_item top = h->v[0], last = h->v[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && item_before(&h->v[c + 1], &h->v[c]))
            c++;
        if (!item_before(&h->v[c], &last))
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (n)
        h->v[i] = last;
    return top;
}

/* Pieces text can merge into: not control, unknown, byte or unused tokens. */
static int mergeable(const struct strata_vocab *v, int32_t id)
{
    int t = v->ttype[id];
    return t == STRATA_VOCAB_TT_NORMAL || t == STRATA_VOCAB_TT_USER_DEFINED ||
           t == STRATA_VOCAB_TT_UNDEFINED;
}

static int try_pair(const struct strata_vocab *v, const char *text, const struct spm_sym *sym,
                    int32_t left, int32_t right, struct spm_heap *h, struct strata_err *err)
{
    if (left < 0 || right < 0)
        return 0;
    size_t size = sym[left].n + sym[right].n;
    int32_t id = vocab_lookup(v, text + sym[left].off, size);
    if (id < 0 || !mergeable(v, id))
        return 0;
    struct spm_item it = { v->scores[id], left, right, size };
    return heap_push(h, it, err);
}

void vocab_spm_init(struct strata_vocab *v)
{
    for (int c = 0; c < 128; c++)
        v->spm_barrier[c] = 1;
    for (int32_t id = 0; id < v->n_tokens; id++) {
        if (!mergeable(v, id))
            continue;
        const unsigned char *s = (const unsigned char *)v->text_blob + v->text_off[id];
        size_t n = v->text_len[id], chars = 0;
        for (size_t i = 0; i < n; i++)
            chars += (s[i] & 0xC0) != 0x80;
        if (chars < 2)
            continue;
        for (size_t i = 0; i < n; i++)
            if (s[i] < 0x80)
                v->spm_barrier[s[i]] = 0;
    }
}

struct spm_work {
    struct spm_sym *sym;
    struct spm_heap h;
};

/* Merge one chunk of escaped text and append its ids. */
static int spm_chunk(const struct strata_vocab *v, struct spm_work *w, const char *esc,
                     size_t off, size_t end, struct vocab_ids *out, struct strata_err *err)
{
    struct spm_sym *sym = w->sym;
    int rc;
    int32_t ns = 0;
    for (size_t i = off; i < end;) {
        size_t l;
        if (vocab_utf8_check((const unsigned char *)esc + i, end - i, &l) != 1)
            l = 1; /* cannot happen: the text was made valid UTF-8 */
        sym[ns].off = i;
        sym[ns].n = l;
        sym[ns].prev = ns - 1;
        sym[ns].next = i + l < end ? ns + 1 : -1;
        ns++;
        i += l;
    }
    w->h.n = 0;
    for (int32_t i = 1; i < ns; i++)
        if ((rc = try_pair(v, esc, sym, i - 1, i, &w->h, err)))
            return rc;
    while (w->h.n) {
        struct spm_item it = heap_pop(&w->h);
        struct spm_sym *l = &sym[it.left], *r = &sym[it.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != it.size || l->next != it.right)
            continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = it.left;
        if ((rc = try_pair(v, esc, sym, l->prev, it.left, &w->h, err)) ||
            (rc = try_pair(v, esc, sym, it.left, l->next, &w->h, err)))
            return rc;
    }
    for (int32_t i = ns ? 0 : -1; i >= 0; i = sym[i].next) {
        int32_t id = vocab_lookup(v, esc + sym[i].off, sym[i].n);
        if (id >= 0) {
            if ((rc = vocab_ids_push(out, id, err)))
                return rc;
            continue;
        }
        for (size_t k = 0; k < sym[i].n; k++) {
            int32_t b = v->byte_tok[(unsigned char)esc[sym[i].off + k]];
            if (b < 0)
                b = v->unk;
            if (b < 0)
                continue;
            if ((rc = vocab_ids_push(out, b, err)))
                return rc;
            if (b == v->unk)
                break; /* one unknown token per character */
        }
    }
    return 0;
}

int vocab_spm_tokenize(const struct strata_vocab *v, const char *text, size_t len,
                       struct vocab_ids *out, struct strata_err *err)
{
    static const char space[] = "\xE2\x96\x81";
    struct spm_work w = { 0 };
    char *esc = NULL;
    size_t n = 0;
    int rc;

    if (len > (SIZE_MAX - 3) / 3) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "text too long (%zu bytes)", len);
        goto out;
    }
    esc = malloc(3 * len + 3);
    if (!esc) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory (%zu bytes of text)", len);
        goto out;
    }
    if (v->add_space_prefix) {
        memcpy(esc, space, 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(esc + n, space, 3);
            n += 3;
        } else {
            esc[n++] = text[i];
        }
    }
    w.sym = malloc((n ? n : 1) * sizeof(*w.sym));
    if (!w.sym) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory (%zu bytes of text)", len);
        goto out;
    }
    /* barrier bytes are chunks of their own; results equal merging the
     * whole text at once, since no merge can involve them */
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)esc[i];
        if (c < 0x80 && v->spm_barrier[c]) {
            if ((i > start && (rc = spm_chunk(v, &w, esc, start, i, out, err))) ||
                (rc = spm_chunk(v, &w, esc, i, i + 1, out, err)))
                goto out;
            start = i + 1;
        }
    }
    if (n > start && (rc = spm_chunk(v, &w, esc, start, n, out, err)))
        goto out;
    rc = 0;
out:
    free(esc);
    free(w.sym);
    free(w.h.v);
    return rc;
}
