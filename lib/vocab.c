/* vocab.c - tokenizer vocabulary from GGUF: loading, special tokens,
 * the tokenize driver, detokenization and the streaming detokenizer.
 * The two tokenizer models live in vocab_bpe.c and vocab_spm.c. */
#include "vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "vocab_int.h"

/* ---- small helpers ---------------------------------------------------- */

int vocab_ids_push(struct vocab_ids *a, int32_t id, struct strata_err *err)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *nv = realloc(a->v, cap * sizeof(*nv));
        if (!nv)
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory growing token list");
        a->v = nv;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

uint64_t vocab_hash_bytes(const char *s, size_t n)
{
    /* FNV-1a, 64-bit, with a final avalanche so the low bits index well */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

int32_t vocab_lookup(const struct strata_vocab *v, const char *s, size_t n)
{
    size_t i = (size_t)vocab_hash_bytes(s, n) & v->tmap.mask;
    for (;;) {
        int32_t id = v->tmap.slots[i];
        if (id < 0)
            return -1;
        if (v->text_len[id] == n && memcmp(v->text_blob + v->text_off[id], s, n) == 0)
            return id;
        i = (i + 1) & v->tmap.mask;
    }
}

int vocab_utf8_check(const unsigned char *s, size_t n, size_t *len)
{
    unsigned c = s[0];
    size_t need;
    unsigned lo = 0x80, hi = 0xBF; /* range of the second byte */
    if (c < 0x80) {
        *len = 1;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        *len = 1;
        return 0;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= n) {
            *len = n;
            return -1;
        }
        unsigned b = s[i];
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *len = i;
            return 0;
        }
    }
    *len = need;
    return 1;
}

/* Copy text with each ill-formed subsequence replaced by U+FFFD.  *out is
 * text itself when it is valid (nothing allocated, *owned = NULL). */
static int utf8_sanitize(const char *text, size_t len, const char **out, size_t *out_len,
                         char **owned, struct strata_err *err)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0, l;
    *owned = NULL;
    while (i < len) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        if (vocab_utf8_check(s + i, len - i, &l) != 1)
            break;
        i += l;
    }
    if (i == len) {
        *out = text;
        *out_len = len;
        return 0;
    }
    /* each bad byte can grow to 3 */
    if (len > (SIZE_MAX - 1) / 3)
        return strata_err_set(err, STRATA_E_NOMEM, "text too long (%zu bytes)", len);
    char *d = malloc(len * 3 + 1);
    if (!d)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory (%zu bytes of text)", len);
    memcpy(d, text, i);
    size_t o = i;
    while (i < len) {
        int r = vocab_utf8_check(s + i, len - i, &l);
        if (r == 1) {
            memcpy(d + o, s + i, l);
            o += l;
        } else {
            memcpy(d + o, "\xEF\xBF\xBD", 3);
            o += 3;
        }
        i += l;
    }
    d[o] = 0;
    *owned = d;
    *out = d;
    *out_len = o;
    return 0;
}

/* ---- loading ---------------------------------------------------------- */

static char *dup_str(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* A special token id key: absent -> dflt; values that do not fit (the
 * converters write 0xFFFFFFFF for "none") -> -1.  An id >= n_tokens is an
 * error naming the key. */
static int get_special(const struct strata_gguf *g, const char *key, int32_t n_tokens,
                       int32_t dflt, int32_t *out, struct strata_err *err)
{
    const struct strata_gguf_kv *kv = strata_gguf_find_kv(g, key);
    *out = dflt;
    if (!kv)
        return 0;
    int64_t val;
    switch (kv->type) {
    case STRATA_GGUF_UINT8: case STRATA_GGUF_UINT16: case STRATA_GGUF_UINT32:
    case STRATA_GGUF_UINT64:
        val = kv->v.u > INT32_MAX ? -1 : (int64_t)kv->v.u;
        break;
    case STRATA_GGUF_INT8: case STRATA_GGUF_INT16: case STRATA_GGUF_INT32:
    case STRATA_GGUF_INT64:
        val = kv->v.i;
        break;
    default:
        return strata_err_set(err, STRATA_E_FORMAT, "key '%s' is a %s, expected an integer",
                              key, strata_gguf_vtype_name(kv->type));
    }
    if (val < 0) {
        *out = -1;
        return 0;
    }
    if (val >= n_tokens)
        return strata_err_set(err, STRATA_E_FORMAT,
                              "key '%s' is %lld, beyond the %d tokens of the vocabulary", key,
                              (long long)val, n_tokens);
    *out = (int32_t)val;
    return 0;
}

static int get_flag(const struct strata_gguf *g, const char *key, int dflt, int *out,
                    struct strata_err *err)
{
    const struct strata_gguf_kv *kv = strata_gguf_find_kv(g, key);
    *out = dflt;
    if (!kv)
        return 0;
    return strata_gguf_get_bool(g, key, out, err);
}

static int build_text_map(struct strata_vocab *v, struct strata_err *err)
{
    size_t cap = 16;
    while (cap < (size_t)v->n_tokens * 2)
        cap *= 2;
    v->tmap.slots = malloc(cap * sizeof(int32_t));
    if (!v->tmap.slots)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory for the token map");
    memset(v->tmap.slots, 0xff, cap * sizeof(int32_t));
    v->tmap.mask = cap - 1;
    for (int32_t id = 0; id < v->n_tokens; id++) {
        const char *s = v->text_blob + v->text_off[id];
        size_t n = v->text_len[id];
        size_t i = (size_t)vocab_hash_bytes(s, n) & v->tmap.mask;
        int dup = 0;
        while (v->tmap.slots[i] >= 0) {
            int32_t o = v->tmap.slots[i];
            if (v->text_len[o] == n && memcmp(v->text_blob + v->text_off[o], s, n) == 0) {
                dup = 1; /* the first id of a duplicated piece wins */
                break;
            }
            i = (i + 1) & v->tmap.mask;
        }
        if (!dup)
            v->tmap.slots[i] = id;
    }
    return 0;
}

static int is_special_type(int t)
{
    return t == STRATA_VOCAB_TT_CONTROL || t == STRATA_VOCAB_TT_USER_DEFINED ||
           t == STRATA_VOCAB_TT_UNKNOWN;
}

static int build_trie(struct strata_vocab *v, struct strata_err *err)
{
    size_t cap = 256, n = 1;
    struct vocab_trie_node *t = malloc(cap * sizeof(*t));
    if (!t)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory for special tokens");
    t[0] = (struct vocab_trie_node){ -1, -1, -1, 0 };
    for (int32_t id = 0; id < v->n_tokens; id++) {
        if (!is_special_type(v->ttype[id]) || v->text_len[id] == 0)
            continue;
        const unsigned char *s = (const unsigned char *)v->text_blob + v->text_off[id];
        size_t len = v->text_len[id];
        int32_t node = 0;
        v->special_first[s[0]] = 1;
        for (size_t i = 0; i < len; i++) {
            int32_t c = t[node].child;
            while (c >= 0 && t[c].byte != s[i])
                c = t[c].sibling;
            if (c < 0) {
                if (n == cap) {
                    cap *= 2;
                    struct vocab_trie_node *nt = realloc(t, cap * sizeof(*t));
                    if (!nt) {
                        free(t);
                        return strata_err_set(err, STRATA_E_NOMEM,
                                              "out of memory for special tokens");
                    }
                    t = nt;
                }
                c = (int32_t)n++;
                t[c] = (struct vocab_trie_node){ -1, t[node].child, -1, s[i] };
                t[node].child = c;
            }
            node = c;
        }
        if (t[node].id < 0)
            t[node].id = id;
    }
    v->trie = t;
    v->n_trie = (int32_t)n;
    return 0;
}

/* Decoded bytes of every token (strata_vocab_token_bytes). */
static int build_decoded(struct strata_vocab *v, struct strata_err *err)
{
    size_t total = 0;
    for (int32_t id = 0; id < v->n_tokens; id++)
        total += v->text_len[id] + 1;
    v->dec_blob = malloc(total + 1);
    v->dec_off = malloc((size_t)v->n_tokens * sizeof(uint32_t));
    v->dec_len = malloc((size_t)v->n_tokens * sizeof(uint32_t));
    if (!v->dec_blob || !v->dec_off || !v->dec_len)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory for decoded tokens");
    size_t o = 0;
    for (int32_t id = 0; id < v->n_tokens; id++) {
        const char *s = v->text_blob + v->text_off[id];
        size_t n = v->text_len[id], d = 0;
        char *dst = v->dec_blob + o;
        int t = v->ttype[id];
        unsigned hexv;
        if (t == STRATA_VOCAB_TT_BYTE && n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' &&
            sscanf(s + 3, "%2x", &hexv) == 1) {
            dst[0] = (char)hexv;
            d = 1;
        } else if (t == STRATA_VOCAB_TT_CONTROL || t == STRATA_VOCAB_TT_USER_DEFINED ||
                   t == STRATA_VOCAB_TT_UNKNOWN) {
            memcpy(dst, s, n);
            d = n;
        } else if (v->kind == STRATA_VOCAB_SPM) {
            /* U+2581 "▁" (E2 96 81) stands for a space */
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
                    dst[d++] = ' ';
                    i += 3;
                } else {
                    dst[d++] = s[i++];
                }
            }
        } else {
            d = vocab_bpe_decode_piece(v, s, n, dst);
        }
        v->dec_off[id] = (uint32_t)o;
        v->dec_len[id] = (uint32_t)d;
        if (d > v->max_dec)
            v->max_dec = d;
        o += d;
    }
    return 0;
}

/* End-of-generation markers by text (control tokens only). */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "_<EOT>", "<|end_of_text|>", "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
    "<|return|>", "<|call|>", "<end_of_utterance>", "<|user|>", "<|observation|>",
};

int strata_vocab_load(struct strata_vocab **out, const struct strata_gguf *g,
                      struct strata_err *err)
{
    struct strata_vocab *v = NULL;
    const char *model = NULL, *pre = NULL;
    const struct strata_gguf_arr *toks = NULL, *scores = NULL, *types = NULL;
    int rc;

    *out = NULL;
    if ((rc = strata_gguf_get_str(g, "tokenizer.ggml.model", &model, err)))
        goto out;
    if (strata_gguf_find_kv(g, "tokenizer.ggml.pre") &&
        (rc = strata_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err)))
        goto out;
    if ((rc = strata_gguf_get_arr(g, "tokenizer.ggml.tokens", STRATA_GGUF_STRING, &toks, err)))
        goto out;
    if (toks->n == 0 || toks->n > INT32_MAX / 2) {
        rc = strata_err_set(err, STRATA_E_FORMAT,
                            "key 'tokenizer.ggml.tokens' has %llu entries",
                            (unsigned long long)toks->n);
        goto out;
    }
    if (strata_gguf_find_kv(g, "tokenizer.ggml.scores")) {
        if ((rc = strata_gguf_get_arr(g, "tokenizer.ggml.scores", -1, &scores, err)))
            goto out;
        if (scores->n != toks->n || scores->type == STRATA_GGUF_STRING ||
            scores->type == STRATA_GGUF_ARRAY) {
            rc = strata_err_set(err, STRATA_E_FORMAT,
                                "key 'tokenizer.ggml.scores' has %llu numbers, expected %llu",
                                (unsigned long long)scores->n, (unsigned long long)toks->n);
            goto out;
        }
    }
    if (strata_gguf_find_kv(g, "tokenizer.ggml.token_type")) {
        if ((rc = strata_gguf_get_arr(g, "tokenizer.ggml.token_type", -1, &types, err)))
            goto out;
        if (types->n != toks->n || types->type == STRATA_GGUF_STRING ||
            types->type == STRATA_GGUF_ARRAY) {
            rc = strata_err_set(err, STRATA_E_FORMAT,
                                "key 'tokenizer.ggml.token_type' has %llu numbers, expected %llu",
                                (unsigned long long)types->n, (unsigned long long)toks->n);
            goto out;
        }
    }

    v = calloc(1, sizeof(*v));
    if (!v) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory for the vocabulary");
        goto out;
    }
    if (strcmp(model, "llama") == 0) {
        v->kind = STRATA_VOCAB_SPM;
    } else if (strcmp(model, "gpt2") == 0) {
        v->kind = STRATA_VOCAB_BPE;
    } else {
        rc = strata_err_set(err, STRATA_E_UNSUPPORTED,
                            "tokenizer model '%s' (key 'tokenizer.ggml.model') is not supported "
                            "(supported: llama, gpt2)", model);
        goto out;
    }
    v->model_name = dup_str(model, strlen(model));
    v->pre_name = dup_str(pre ? pre : "default", strlen(pre ? pre : "default"));
    v->n_tokens = (int32_t)toks->n;
    size_t total = 0;
    for (uint64_t i = 0; i < toks->n; i++)
        total += toks->strs[i].len + 1;
    v->text_blob = malloc(total ? total : 1);
    v->text_off = malloc(toks->n * sizeof(uint32_t));
    v->text_len = malloc(toks->n * sizeof(uint32_t));
    v->scores = calloc(toks->n, sizeof(float));
    v->ttype = malloc(toks->n);
    v->eog = calloc(toks->n, 1);
    if (!v->model_name || !v->pre_name || !v->text_blob || !v->text_off || !v->text_len ||
        !v->scores || !v->ttype || !v->eog) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory for the vocabulary");
        goto out;
    }
    if (total > UINT32_MAX) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "key 'tokenizer.ggml.tokens' is too large");
        goto out;
    }
    size_t o = 0;
    for (uint64_t i = 0; i < toks->n; i++) {
        size_t n = toks->strs[i].len;
        memcpy(v->text_blob + o, toks->strs[i].ptr, n);
        v->text_blob[o + n] = 0;
        v->text_off[i] = (uint32_t)o;
        v->text_len[i] = (uint32_t)n;
        o += n + 1;
        v->scores[i] = scores ? (float)strata_gguf_arr_f64(scores, i) : 0.0f;
        int64_t t = types ? strata_gguf_arr_i64(types, i) : STRATA_VOCAB_TT_NORMAL;
        v->ttype[i] = (uint8_t)(t >= 0 && t <= 6 ? t : STRATA_VOCAB_TT_UNDEFINED);
    }
    if ((rc = build_text_map(v, err)))
        goto out;

    int32_t n = v->n_tokens;
    int spm = v->kind == STRATA_VOCAB_SPM;
    if ((rc = get_special(g, "tokenizer.ggml.bos_token_id", n, spm ? (n > 1 ? 1 : -1) : -1,
                          &v->bos, err)) ||
        (rc = get_special(g, "tokenizer.ggml.eos_token_id", n, spm ? (n > 2 ? 2 : -1) : -1,
                          &v->eos, err)) ||
        (rc = get_special(g, "tokenizer.ggml.eot_token_id", n, -1, &v->eot, err)) ||
        (rc = get_special(g, "tokenizer.ggml.eom_token_id", n, -1, &v->eom, err)) ||
        (rc = get_special(g, "tokenizer.ggml.unknown_token_id", n, spm ? 0 : -1, &v->unk, err)) ||
        (rc = get_special(g, "tokenizer.ggml.padding_token_id", n, -1, &v->pad, err)))
        goto out;
    if ((rc = get_flag(g, "tokenizer.ggml.add_bos_token", spm, &v->add_bos, err)) ||
        (rc = get_flag(g, "tokenizer.ggml.add_eos_token", 0, &v->add_eos, err)) ||
        (rc = get_flag(g, "tokenizer.ggml.add_space_prefix", spm, &v->add_space_prefix, err)))
        goto out;

    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof(hex), "<0x%02X>", b);
        v->byte_tok[b] = vocab_lookup(v, hex, 6);
    }
    if (v->kind == STRATA_VOCAB_SPM)
        vocab_spm_init(v);
    if (v->kind == STRATA_VOCAB_BPE) {
        if ((rc = vocab_bpe_init(v, g, err)))
            goto out;
        if (v->pre->no_bos)
            v->bos = -1;
        if (v->pre->bos_default && !strata_gguf_find_kv(g, "tokenizer.ggml.add_bos_token"))
            v->add_bos = 1;
    }
    if ((rc = build_trie(v, err)) || (rc = build_decoded(v, err)))
        goto out;

    if (v->eos >= 0)
        v->eog[v->eos] = 1;
    if (v->eot >= 0)
        v->eog[v->eot] = 1;
    if (v->eom >= 0)
        v->eog[v->eom] = 1;
    for (size_t i = 0; i < sizeof(eog_texts) / sizeof(eog_texts[0]); i++) {
        int32_t id = vocab_lookup(v, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0 && v->ttype[id] == STRATA_VOCAB_TT_CONTROL)
            v->eog[id] = 1;
    }
    /* <|user|> and <|observation|> end a turn only for GLM-4 */
    if (strcmp(v->pre_name, "glm4") != 0 && strcmp(v->pre_name, "chatglm-bpe") != 0) {
        int32_t id = vocab_lookup(v, "<|user|>", 8);
        if (id >= 0 && id != v->eos && id != v->eot)
            v->eog[id] = 0;
        id = vocab_lookup(v, "<|observation|>", 15);
        if (id >= 0 && id != v->eos && id != v->eot)
            v->eog[id] = 0;
    }
    /* gpt-oss (harmony): <|end|> closes a message, not the generation, when
     * <|return|> and <|call|> exist */
    if (vocab_lookup(v, "<|return|>", 10) >= 0 && vocab_lookup(v, "<|call|>", 8) >= 0) {
        int32_t id = vocab_lookup(v, "<|end|>", 7);
        if (id >= 0 && id != v->eos && id != v->eot)
            v->eog[id] = 0;
    }
    if (v->eot < 0) {
        int32_t id = vocab_lookup(v, "<|im_end|>", 10);
        if (id < 0)
            id = vocab_lookup(v, "<|eot_id|>", 10);
        if (id >= 0 && v->ttype[id] == STRATA_VOCAB_TT_CONTROL)
            v->eot = id;
    }
    *out = v;
    v = NULL;
    rc = 0;
out:
    strata_vocab_free(v);
    return rc;
}

void strata_vocab_free(struct strata_vocab *v)
{
    if (!v)
        return;
    vocab_bpe_free(v);
    free(v->model_name);
    free(v->pre_name);
    free(v->text_blob);
    free(v->text_off);
    free(v->text_len);
    free(v->dec_blob);
    free(v->dec_off);
    free(v->dec_len);
    free(v->scores);
    free(v->ttype);
    free(v->eog);
    free(v->tmap.slots);
    free(v->trie);
    free(v);
}

/* ---- accessors -------------------------------------------------------- */

int32_t strata_vocab_n_tokens(const struct strata_vocab *v) { return v->n_tokens; }
enum strata_vocab_kind strata_vocab_kind(const struct strata_vocab *v) { return v->kind; }
const char *strata_vocab_model_name(const struct strata_vocab *v) { return v->model_name; }
const char *strata_vocab_pre(const struct strata_vocab *v) { return v->pre_name; }
int32_t strata_vocab_bos(const struct strata_vocab *v) { return v->bos; }
int32_t strata_vocab_eos(const struct strata_vocab *v) { return v->eos; }
int32_t strata_vocab_eot(const struct strata_vocab *v) { return v->eot; }
int32_t strata_vocab_eom(const struct strata_vocab *v) { return v->eom; }
int32_t strata_vocab_unk(const struct strata_vocab *v) { return v->unk; }
int32_t strata_vocab_pad(const struct strata_vocab *v) { return v->pad; }
int strata_vocab_add_bos(const struct strata_vocab *v) { return v->add_bos && v->bos >= 0; }
int strata_vocab_add_eos(const struct strata_vocab *v) { return v->add_eos && v->eos >= 0; }

int strata_vocab_is_eog(const struct strata_vocab *v, int32_t id)
{
    return id >= 0 && id < v->n_tokens && v->eog[id];
}

const char *strata_vocab_token_text(const struct strata_vocab *v, int32_t id)
{
    if (id < 0 || id >= v->n_tokens)
        return NULL;
    return v->text_blob + v->text_off[id];
}

int strata_vocab_token_type(const struct strata_vocab *v, int32_t id)
{
    if (id < 0 || id >= v->n_tokens)
        return STRATA_VOCAB_TT_UNDEFINED;
    return v->ttype[id];
}

float strata_vocab_token_score(const struct strata_vocab *v, int32_t id)
{
    if (id < 0 || id >= v->n_tokens)
        return 0.0f;
    return v->scores[id];
}

int32_t strata_vocab_find(const struct strata_vocab *v, const char *text, size_t len)
{
    return vocab_lookup(v, text, len);
}

const char *strata_vocab_token_bytes(const struct strata_vocab *v, int32_t id, size_t *len)
{
    if (id < 0 || id >= v->n_tokens) {
        *len = 0;
        return NULL;
    }
    *len = v->dec_len[id];
    return v->dec_blob + v->dec_off[id];
}

size_t strata_vocab_max_token_bytes(const struct strata_vocab *v) { return v->max_dec; }

/* ---- tokenize --------------------------------------------------------- */

/* Longest special token starting at s (leftmost-longest, as the Hugging
 * Face added-token matcher).  Control and unknown tokens only when
 * parse_special.  Returns its id (*mlen its length) or -1. */
static int32_t match_special(const struct strata_vocab *v, const unsigned char *s, size_t n,
                             int parse_special, size_t *mlen)
{
    int32_t best = -1, node = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t c = v->trie[node].child;
        while (c >= 0 && v->trie[c].byte != s[i])
            c = v->trie[c].sibling;
        if (c < 0)
            break;
        node = c;
        int32_t id = v->trie[node].id;
        if (id >= 0 && (parse_special || v->ttype[id] == STRATA_VOCAB_TT_USER_DEFINED)) {
            best = id;
            *mlen = i + 1;
        }
    }
    return best;
}

static int tokenize_fragment(const struct strata_vocab *v, const char *s, size_t n,
                             struct vocab_ids *out, struct strata_err *err)
{
    if (n == 0)
        return 0;
    if (v->kind == STRATA_VOCAB_SPM)
        return vocab_spm_tokenize(v, s, n, out, err);
    return vocab_bpe_tokenize(v, s, n, out, err);
}

int strata_vocab_tokenize(const struct strata_vocab *v, const char *text, size_t len,
                          int add_bos, int parse_special, int32_t **ids, size_t *n_ids,
                          struct strata_err *err)
{
    struct vocab_ids out = { 0 };
    const char *s;
    size_t n, frag = 0, pos = 0;
    char *owned = NULL;
    int rc;

    *ids = NULL;
    *n_ids = 0;
    if (!text)
        len = 0;
    if ((rc = utf8_sanitize(text ? text : "", len, &s, &n, &owned, err)))
        goto out;
    if (add_bos && v->bos >= 0 && (rc = vocab_ids_push(&out, v->bos, err)))
        goto out;
    while (pos < n) {
        size_t mlen = 0;
        int32_t id;
        if (v->special_first[(unsigned char)s[pos]] &&
            (id = match_special(v, (const unsigned char *)s + pos, n - pos, parse_special,
                                &mlen)) >= 0) {
            if ((rc = tokenize_fragment(v, s + frag, pos - frag, &out, err)) ||
                (rc = vocab_ids_push(&out, id, err)))
                goto out;
            pos += mlen;
            frag = pos;
            continue;
        }
        pos++;
    }
    if ((rc = tokenize_fragment(v, s + frag, n - frag, &out, err)))
        goto out;
    if (add_bos && v->add_eos && v->eos >= 0 && (rc = vocab_ids_push(&out, v->eos, err)))
        goto out;
    if (!out.v && !(out.v = malloc(sizeof(int32_t)))) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory for the token list");
        goto out;
    }
    *ids = out.v;
    *n_ids = out.n;
    out.v = NULL;
    rc = 0;
out:
    free(out.v);
    free(owned);
    return rc;
}

/* ---- detokenize ------------------------------------------------------- */

static int special_only(const struct strata_vocab *v, int32_t id)
{
    return v->ttype[id] == STRATA_VOCAB_TT_CONTROL || v->ttype[id] == STRATA_VOCAB_TT_UNKNOWN;
}

int strata_vocab_detokenize(const struct strata_vocab *v, const int32_t *ids, size_t n_ids,
                            int special, char **text, size_t *len, struct strata_err *err)
{
    size_t total = 0;
    char *raw = NULL, *clean = NULL;
    const char *s;
    size_t n;
    int rc;

    *text = NULL;
    *len = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= v->n_tokens)
            return strata_err_set(err, STRATA_E_INVALID,
                                  "token id %d (position %zu) is out of range 0..%d", ids[i], i,
                                  v->n_tokens - 1);
        total += v->dec_len[ids[i]];
    }
    raw = malloc(total + 1);
    if (!raw)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory (%zu bytes of text)", total);
    size_t o = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (!special && special_only(v, ids[i]))
            continue;
        memcpy(raw + o, v->dec_blob + v->dec_off[ids[i]], v->dec_len[ids[i]]);
        o += v->dec_len[ids[i]];
    }
    raw[o] = 0;
    if ((rc = utf8_sanitize(raw, o, &s, &n, &clean, err)))
        goto out;
    if (v->kind == STRATA_VOCAB_SPM && v->add_space_prefix && n > 0 && s[0] == ' ') {
        s++;
        n--;
    }
    char *res = malloc(n + 1);
    if (!res) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory (%zu bytes of text)", n);
        goto out;
    }
    memcpy(res, s, n);
    res[n] = 0;
    *text = res;
    *len = n;
    rc = 0;
out:
    free(raw);
    free(clean);
    return rc;
}

void strata_detok_init(struct strata_detok *d, const struct strata_vocab *v, unsigned flags)
{
    memset(d, 0, sizeof(*d));
    d->vocab = v;
    d->flags = flags;
}

int strata_detok_push(struct strata_detok *d, int32_t id, char *out, size_t cap,
                      size_t *n_out, struct strata_err *err)
{
    const struct strata_vocab *v = d->vocab;
    *n_out = 0;
    if (id < 0 || id >= v->n_tokens)
        return strata_err_set(err, STRATA_E_INVALID, "token id %d is out of range 0..%d", id,
                              v->n_tokens - 1);
    if (!(d->flags & STRATA_DETOK_SPECIAL) && special_only(v, id))
        return 0;
    size_t tl = v->dec_len[id];
    if (cap < 3 * (tl + d->n_held))
        return strata_err_set(err, STRATA_E_LIMIT,
                              "detokenizer buffer of %zu bytes is too small for token %d", cap,
                              id);
    /* work on held bytes + token bytes without copying the token */
    const unsigned char *tok = (const unsigned char *)v->dec_blob + v->dec_off[id];
    unsigned char buf[8];
    size_t o = 0, i = 0, total = d->n_held + tl;
    /* at most 3 held bytes; complete them with the first token bytes */
    while (i < total) {
        const unsigned char *p;
        size_t avail;
        if (i < d->n_held) {
            size_t k = 0;
            for (size_t j = i; j < d->n_held; j++)
                buf[k++] = d->held[j];
            for (size_t j = 0; j < tl && k < 4; j++)
                buf[k++] = tok[j];
            p = buf;
            avail = k;
        } else {
            p = tok + (i - d->n_held);
            avail = total - i;
        }
        size_t l;
        int r = vocab_utf8_check(p, avail, &l);
        if (r == 1) {
            memcpy(out + o, p, l);
            o += l;
        } else if (r == 0) {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
        } else {
            /* incomplete at the end: hold it (l < 4 bytes) */
            unsigned char keep[4];
            memcpy(keep, p, l);
            memcpy(d->held, keep, l);
            d->n_held = l;
            *n_out = o;
            return 0;
        }
        i += l;
    }
    d->n_held = 0;
    *n_out = o;
    return 0;
}

void strata_detok_flush(struct strata_detok *d, char *out, size_t cap, size_t *n_out)
{
    *n_out = 0;
    if (d->n_held && cap >= 3) {
        memcpy(out, "\xEF\xBF\xBD", 3);
        *n_out = 3;
    }
    d->n_held = 0;
}
