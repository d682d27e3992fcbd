/* vocab_bpe.c - byte-level BPE (tokenizer.ggml.model = "gpt2") and the
 * pre-tokenizers of the tokenizer.json files the GGUF vocabularies come from.
 *
 * A pre-tokenizer is run as the Hugging Face tokenizers library runs it: a
 * sequence of steps, each splitting every current piece on its own (a regex
 * sees only its piece, so a lookahead stops at the piece's end); matches and
 * the gaps between them both become pieces (behaviour "Isolated").  The
 * ByteLevel step maps each byte to one printable character (GPT-2's
 * bytes_to_unicode); steps after it see the mapped text, as in Falcon's
 * tokenizer.json.  Then each piece is merged by BPE: the pair with the lowest
 * merge rank first, leftmost on ties, until no pair has a rank. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "gguf.h"
#include "vocab_int.h"

/* GPT-2's split (ByteLevel use_regex=true), from tokenizers'
 * pre_tokenizers/byte_level.rs. */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* Llama 3 / GLM-4 tokenizer.json Split pattern (tiktoken cl100k). */
#define RE_LLAMA3                                                                          \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "               \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* Qwen2 / Qwen3 tokenizer.json Split pattern: cl100k with single digits. */
#define RE_QWEN2                                                                           \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "                    \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* GPT-4o (tiktoken o200k) tokenizer.json Split pattern. */
#define RE_O200K                                                                           \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+" \
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| "              \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* Kimi-K2 (tokenization_kimi.py, tiktoken).  Its classes use the set
 * intersection "[...&&[^\p{Han}]]", which PCRE2 spells as a negative
 * lookahead before the class. */
#define KIMI_UP "(?:(?!\\p{Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])"
#define KIMI_LO "(?:(?!\\p{Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])"
#define RE_KIMI                                                                            \
    "[\\p{Han}]+|[^\\r\\n\\p{L}\\p{N}]?" KIMI_UP "*" KIMI_LO                                   \
    "+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?" KIMI_UP "+" KIMI_LO              \
    "*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" \
    "\\s+(?!\\S)|\\s+"

/* DeepSeek-V3 tokenizer.json: three Splits. */
#define RE_DSV3_HAN "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+"
#define RE_DSV3                                                                            \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?"        \
    "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* DeepSeek LLM / Coder tokenizer.json Splits. */
#define RE_DS_CJK "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
#define RE_DS_PUNCT                                                                        \
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+"
#define RE_DS_LETTERS                                                                      \
    "\\s?["                                                                                \
    "A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"            \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-"             \
    "\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-"               \
    "\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-"                    \
    "\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-"             \
    "\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-"             \
    "\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-"             \
    "\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}"               \
    "\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-"             \
    "\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-"             \
    "\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}"               \
    "\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}"               \
    "\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-"              \
    "\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-"              \
    "\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-"             \
    "\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-"             \
    "\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"                   \
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-"               \
    "\\x{118DF}\\x{1E900}-\\x{1E943}"                                                          \
    "]+"

/* tokenizers' Digits pre-tokenizer (char::is_numeric ~ \p{N}). */
#define RE_DIGIT "\\p{N}"
#define RE_DIGITS "\\p{N}+"
/* tokenizers' Punctuation(Contiguous): ASCII punctuation or Unicode P*. */
#define RE_PUNCT "[\\p{P}!-/:-@\\[-`{-~]+"

#define SPLIT(r) { VOCAB_STEP_SPLIT, r }
#define BYTELEVEL { VOCAB_STEP_BYTELEVEL, NULL }
#define BYTELEVEL_RE { VOCAB_STEP_BYTELEVEL_RE, NULL }

/* Each entry mirrors the pre_tokenizer (and normalizer) of the model's
 * tokenizer.json; names are the tokenizer.ggml.pre values llama.cpp's
 * converter writes for them.  A name is listed only where its
 * tokenizer.json is known: an unknown name is refused rather than
 * tokenized by a guess. */
static const struct vocab_pre pre_table[] = {
    { "default|gpt-2|gpt2|phi-2", 0, 0, 0, 0, 1, { BYTELEVEL_RE } },
    /* GPT-NeoX tokenizer (MPT): NFC normalizer, ByteLevel */
    { "mpt", 1, 0, 0, 0, 1, { BYTELEVEL_RE } },
    { "llama-bpe|llama3|llama-v3", 0, 1, 0, 1, 2,
      { SPLIT(RE_LLAMA3), BYTELEVEL } },
    { "glm4|chatglm-bpe", 0, 0, 1, 0, 2, { SPLIT(RE_LLAMA3), BYTELEVEL } },
    { "qwen2|deepseek-r1-qwen", 1, 0, 0, 0, 2,
      { SPLIT(RE_QWEN2), BYTELEVEL } },
    { "deepseek-llm", 0, 0, 0, 0, 7,
      { SPLIT("[\\r\\n]"), SPLIT(RE_DS_LETTERS), SPLIT(RE_DS_PUNCT), SPLIT("\\s+$"),
        SPLIT(RE_DS_CJK), SPLIT(RE_DIGIT), BYTELEVEL } },
    { "deepseek-coder", 0, 0, 0, 0, 6,
      { SPLIT("[\\r\\n]"), SPLIT("\\s?\\p{L}+"), SPLIT("\\s?\\p{P}+"), SPLIT(RE_DS_CJK),
        SPLIT(RE_DIGIT), BYTELEVEL } },
    { "deepseek-v3", 0, 0, 0, 0, 4,
      { SPLIT("\\p{N}{1,3}"), SPLIT(RE_DSV3_HAN), SPLIT(RE_DSV3), BYTELEVEL } },
    { "falcon", 0, 0, 0, 0, 4,
      { SPLIT(RE_PUNCT), BYTELEVEL_RE, SPLIT(RE_DIGITS), SPLIT("[0-9][0-9][0-9]") } },
    { "starcoder|refact|smollm", 0, 0, 0, 0, 2,
      { SPLIT(RE_DIGIT), BYTELEVEL_RE } },
    { "gpt-4o", 0, 1, 0, 0, 2, { SPLIT(RE_O200K), BYTELEVEL } },
    { "kimi-k2", 0, 1, 0, 0, 2, { SPLIT(RE_KIMI), BYTELEVEL } },
};

static const struct vocab_pre *find_pre(const char *name)
{
    size_t nl = strlen(name);
    for (size_t i = 0; i < sizeof(pre_table) / sizeof(pre_table[0]); i++) {
        const char *p = pre_table[i].names;
        while (*p) {
            const char *e = strchr(p, '|');
            size_t l = e ? (size_t)(e - p) : strlen(p);
            if (l == nl && memcmp(p, name, l) == 0)
                return &pre_table[i];
            p += l + (e ? 1 : 0);
        }
    }
    return NULL;
}

static int compile_re(const char *pattern, pcre2_code **out, struct strata_err *err)
{
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof(msg));
        return strata_err_set(err, STRATA_E_INTERNAL,
                              "pre-tokenizer regex does not compile at offset %zu: %s",
                              (size_t)eo, (const char *)msg);
    }
    /* JIT is an optimisation: the interpreter is used where it is missing */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return 0;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static const struct vocab_merge_slot *merge_find(const struct vocab_merge_map *m, int32_t a,
                                                 int32_t b)
{
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t i = (size_t)mix64(key) & m->mask;
    for (;;) {
        const struct vocab_merge_slot *s = &m->slots[i];
        if (s->key == key)
            return s;
        if (s->key == 0)
            return NULL;
        i = (i + 1) & m->mask;
    }
}

static int build_merges(struct strata_vocab *v, const struct strata_gguf *g,
                        struct strata_err *err)
{
    const struct strata_gguf_arr *arr;
    char *buf = NULL;
    size_t bufcap = 0;
    int rc = strata_gguf_get_arr(g, "tokenizer.ggml.merges", STRATA_GGUF_STRING, &arr, err);
    if (rc)
        return rc;
    if (arr->n > INT32_MAX / 4)
        return strata_err_set(err, STRATA_E_FORMAT,
                              "key 'tokenizer.ggml.merges' has too many entries (%llu)",
                              (unsigned long long)arr->n);
    size_t cap = 16;
    while (cap < arr->n * 2)
        cap *= 2;
    v->merges.slots = calloc(cap, sizeof(*v->merges.slots));
    if (!v->merges.slots)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory for %llu merges",
                              (unsigned long long)arr->n);
    v->merges.mask = cap - 1;
    for (uint64_t r = 0; r < arr->n; r++) {
        const char *s = arr->strs[r].ptr;
        size_t n = arr->strs[r].len, sp;
        for (sp = 1; sp < n && s[sp] != ' '; sp++)
            ;
        if (n < 3 || sp >= n - 1) {
            rc = strata_err_set(err, STRATA_E_FORMAT,
                                "merge %llu of 'tokenizer.ggml.merges' ('%.*s') is not 'A B'",
                                (unsigned long long)r, (int)(n > 64 ? 64 : n), s);
            goto out;
        }
        int32_t a = vocab_lookup(v, s, sp), b = vocab_lookup(v, s + sp + 1, n - sp - 1);
        if (a < 0 || b < 0)
            continue; /* a merge of unknown pieces can never apply */
        if (n > bufcap) {
            char *nb = realloc(buf, n * 2);
            if (!nb) {
                rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory reading merges");
                goto out;
            }
            buf = nb;
            bufcap = n * 2;
        }
        memcpy(buf, s, sp);
        memcpy(buf + sp, s + sp + 1, n - sp - 1);
        int32_t id = vocab_lookup(v, buf, n - 1);
        if (id < 0)
            continue;
        uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
        size_t i = (size_t)mix64(key) & v->merges.mask;
        while (v->merges.slots[i].key && v->merges.slots[i].key != key)
            i = (i + 1) & v->merges.mask;
        if (v->merges.slots[i].key)
            continue; /* the first (lowest) rank of a repeated pair wins */
        v->merges.slots[i].key = key;
        v->merges.slots[i].rank = (int32_t)r;
        v->merges.slots[i].id = id;
    }
    rc = 0;
out:
    free(buf);
    return rc;
}

static size_t put_utf8(char *d, uint32_t cp)
{
    if (cp < 0x80) {
        d[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        d[0] = (char)(0xC0 | (cp >> 6));
        d[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    d[0] = (char)(0xE0 | (cp >> 12));
    d[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    d[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

int vocab_bpe_init(struct strata_vocab *v, const struct strata_gguf *g, struct strata_err *err)
{
    int rc;
    v->pre = find_pre(v->pre_name);
    if (!v->pre)
        return strata_err_set(err, STRATA_E_UNSUPPORTED,
                              "pre-tokenizer '%s' (key 'tokenizer.ggml.pre') is not supported",
                              v->pre_name);
    for (int i = 0; i < v->pre->n_steps; i++) {
        if (v->pre->steps[i].kind == VOCAB_STEP_SPLIT &&
            (rc = compile_re(v->pre->steps[i].re, &v->re[i], err)))
            return rc;
        if (v->pre->steps[i].kind == VOCAB_STEP_BYTELEVEL_RE && !v->re_gpt2 &&
            (rc = compile_re(RE_GPT2, &v->re_gpt2, err)))
            return rc;
    }
    /* GPT-2 bytes_to_unicode: printable Latin-1 bytes stand for themselves,
     * the other 68 map to U+0100.. in byte order */
    int next = 0;
    for (int i = 0; i < 0x144; i++)
        v->u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        uint32_t cp;
        if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
            cp = (uint32_t)b;
        else
            cp = 0x100 + (uint32_t)next++;
        v->b2u_len[b] = (uint8_t)put_utf8(v->b2u[b], cp);
        v->u2b[cp] = (int16_t)b;
        v->byte_id[b] = vocab_lookup(v, v->b2u[b], v->b2u_len[b]);
    }
    return build_merges(v, g, err);
}

void vocab_bpe_free(struct strata_vocab *v)
{
    for (int i = 0; i < VOCAB_MAX_STEPS; i++)
        pcre2_code_free(v->re[i]);
    pcre2_code_free(v->re_gpt2);
    free(v->merges.slots);
}

size_t vocab_bpe_decode_piece(const struct strata_vocab *v, const char *s, size_t len,
                              char *dst)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < len) {
        size_t l;
        uint32_t cp = 0;
        if (vocab_utf8_check(p + i, len - i, &l) != 1) {
            dst[o++] = (char)p[i++];
            continue;
        }
        if (l == 1)
            cp = p[i];
        else if (l == 2)
            cp = ((uint32_t)(p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F);
        if (l <= 2 && cp < 0x144 && v->u2b[cp] >= 0) {
            dst[o++] = (char)v->u2b[cp];
        } else {
            memcpy(dst + o, p + i, l);
            o += l;
        }
        i += l;
    }
    return o;
}

/* ---- tokenizing ------------------------------------------------------- */

struct span {
    size_t off, len;
};

struct spans {
    struct span *v;
    size_t n, cap;
};

static int spans_push(struct spans *a, size_t off, size_t len, struct strata_err *err)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 256;
        struct span *nv = realloc(a->v, cap * sizeof(*nv));
        if (!nv)
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory splitting text");
        a->v = nv;
        a->cap = cap;
    }
    a->v[a->n].off = off;
    a->v[a->n].len = len;
    a->n++;
    return 0;
}

struct bpe_sym {
    int32_t id;   /* -1: merged away */
    int32_t prev, next;
};

struct bpe_item {
    int32_t rank;
    int32_t left;
    int32_t lid, rid;
};

/* Pieces repeat a lot in real text (keywords, indentation, punctuation):
 * a cache local to one tokenize call maps a short piece to its ids. */
#define CACHE_MAX_PIECE 48

struct cache_slot {
    uint64_t hash;   /* 0 = empty */
    uint32_t key_off, key_len;
    uint32_t ids_off, n_ids;
};

struct bpe_work {
    struct cache_slot *cache;
    size_t cache_slots; /* a power of two */
    size_t cache_used;
    char *keys;
    size_t keys_n, keys_cap;
    int32_t *cids;
    size_t cids_n, cids_cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    struct bpe_sym *sym;
    size_t sym_cap;
    struct bpe_item *heap;
    size_t heap_n, heap_cap;
    char *mapped;
    size_t mapped_cap;
};

static int item_less(const struct bpe_item *a, const struct bpe_item *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static int heap_push(struct bpe_work *w, struct bpe_item it, struct strata_err *err)
{
    if (w->heap_n == w->heap_cap) {
        size_t cap = w->heap_cap ? w->heap_cap * 2 : 64;
        struct bpe_item *nh = realloc(w->heap, cap * sizeof(*nh));
        if (!nh)
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory merging tokens");
        w->heap = nh;
        w->heap_cap = cap;
    }
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!item_less(&it, &w->heap[p]))
            break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = it;
    return 0;
}

static struct bpe_item heap_pop(struct bpe_work *w)
{
    struct bpe_item top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && item_less(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!item_less(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n)
        w->heap[i] = last;
    return top;
}

static int try_pair(const struct strata_vocab *v, struct bpe_work *w, int32_t left,
                    struct strata_err *err)
{
    if (left < 0)
        return 0;
    int32_t right = w->sym[left].next;
    if (right < 0)
        return 0;
    const struct vocab_merge_slot *m = merge_find(&v->merges, w->sym[left].id, w->sym[right].id);
    if (!m)
        return 0;
    struct bpe_item it = { m->rank, left, w->sym[left].id, w->sym[right].id };
    return heap_push(w, it, err);
}

static int ensure_mapped(struct bpe_work *w, size_t need, struct strata_err *err)
{
    if (need <= w->mapped_cap)
        return 0;
    char *nm = realloc(w->mapped, need);
    if (!nm)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory mapping bytes");
    w->mapped = nm;
    w->mapped_cap = need;
    return 0;
}

static int bpe_merge(const struct strata_vocab *v, struct bpe_work *w, const unsigned char *s,
                     size_t n, struct vocab_ids *out, struct strata_err *err);

/* BPE-merge one piece of raw bytes and append its ids, through the cache. */
static int bpe_word(const struct strata_vocab *v, struct bpe_work *w, const unsigned char *s,
                    size_t n, struct vocab_ids *out, struct strata_err *err)
{
    int rc;
    if (n == 1 && v->byte_id[s[0]] >= 0)
        return vocab_ids_push(out, v->byte_id[s[0]], err);
    if (n > CACHE_MAX_PIECE || !w->cache)
        return bpe_merge(v, w, s, n, out, err);
    uint64_t h = vocab_hash_bytes((const char *)s, n) | 1;
    size_t i = (size_t)h & (w->cache_slots - 1);
    for (;;) {
        struct cache_slot *c = &w->cache[i];
        if (c->hash == 0)
            break;
        if (c->hash == h && c->key_len == n && memcmp(w->keys + c->key_off, s, n) == 0) {
            for (uint32_t k = 0; k < c->n_ids; k++)
                if ((rc = vocab_ids_push(out, w->cids[c->ids_off + k], err)))
                    return rc;
            return 0;
        }
        i = (i + 1) & (w->cache_slots - 1);
    }
    size_t first = out->n;
    if ((rc = bpe_merge(v, w, s, n, out, err)))
        return rc;
    size_t k = out->n - first;
    if (w->cache_used >= w->cache_slots / 2)
        return 0; /* full: stop remembering */
    if (w->keys_n + n > w->keys_cap) {
        size_t cap = w->keys_cap ? w->keys_cap * 2 : 65536;
        char *nk = realloc(w->keys, cap);
        if (!nk)
            return 0;
        w->keys = nk;
        w->keys_cap = cap;
    }
    if (w->cids_n + k > w->cids_cap) {
        size_t cap = w->cids_cap ? w->cids_cap * 2 : 16384;
        while (cap < w->cids_n + k)
            cap *= 2;
        int32_t *nc = realloc(w->cids, cap * sizeof(*nc));
        if (!nc)
            return 0;
        w->cids = nc;
        w->cids_cap = cap;
    }
    struct cache_slot *c = &w->cache[i];
    c->hash = h;
    c->key_off = (uint32_t)w->keys_n;
    c->key_len = (uint32_t)n;
    c->ids_off = (uint32_t)w->cids_n;
    c->n_ids = (uint32_t)k;
    memcpy(w->keys + w->keys_n, s, n);
    w->keys_n += n;
    memcpy(w->cids + w->cids_n, out->v + first, k * sizeof(int32_t));
    w->cids_n += k;
    w->cache_used++;
    return 0;
}

static int bpe_merge(const struct strata_vocab *v, struct bpe_work *w, const unsigned char *s,
                     size_t n, struct vocab_ids *out, struct strata_err *err)
{
    int rc;
    if (v->pre->ignore_merges) {
        if ((rc = ensure_mapped(w, 2 * n, err)))
            return rc;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(w->mapped + m, v->b2u[s[i]], v->b2u_len[s[i]]);
            m += v->b2u_len[s[i]];
        }
        int32_t id = vocab_lookup(v, w->mapped, m);
        if (id >= 0)
            return vocab_ids_push(out, id, err);
    }
    if (n > w->sym_cap) {
        struct bpe_sym *ns = realloc(w->sym, n * sizeof(*ns));
        if (!ns)
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory merging tokens");
        w->sym = ns;
        w->sym_cap = n;
    }
    /* a byte whose character is not in the vocabulary is dropped, as the
     * Hugging Face BPE model does without an unk_token */
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = v->byte_id[s[i]];
        if (id < 0)
            continue;
        w->sym[ns].id = id;
        w->sym[ns].prev = ns - 1;
        w->sym[ns].next = -1;
        if (ns > 0)
            w->sym[ns - 1].next = ns;
        ns++;
    }
    if (ns == 0)
        return 0;
    w->heap_n = 0;
    for (int32_t i = 0; i + 1 < ns; i++)
        if ((rc = try_pair(v, w, i, err)))
            return rc;
    while (w->heap_n) {
        struct bpe_item it = heap_pop(w);
        struct bpe_sym *l = &w->sym[it.left];
        if (l->id != it.lid || l->next < 0)
            continue;
        struct bpe_sym *r = &w->sym[l->next];
        if (r->id != it.rid)
            continue;
        const struct vocab_merge_slot *m = merge_find(&v->merges, it.lid, it.rid);
        l->id = m->id;
        int32_t rn = r->next;
        r->id = -1;
        l->next = rn;
        if (rn >= 0)
            w->sym[rn].prev = it.left;
        if ((rc = try_pair(v, w, l->prev, err)) || (rc = try_pair(v, w, it.left, err)))
            return rc;
    }
    for (int32_t i = 0; i >= 0; i = w->sym[i].next)
        if ((rc = vocab_ids_push(out, w->sym[i].id, err)))
            return rc;
    return 0;
}

/* Split every span of base by re (Isolated: matches and gaps are pieces). */
static int split_spans(struct bpe_work *w, const pcre2_code *re, const char *base,
                       const struct spans *in, struct spans *out, struct strata_err *err)
{
    int rc;
    out->n = 0;
    for (size_t k = 0; k < in->n; k++) {
        const char *s = base + in->v[k].off;
        size_t n = in->v[k].len, start = 0, last = 0;
        while (start < n) {
            int mr = pcre2_match(re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, w->md,
                                 w->mctx);
            if (mr == PCRE2_ERROR_NOMATCH)
                break;
            if (mr < 0) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(mr, msg, sizeof(msg));
                return strata_err_set(err, STRATA_E_INTERNAL,
                                      "pre-tokenizer regex failed: %s", (const char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
            size_t ms = ov[0], me = ov[1];
            if (me <= ms) {
                /* empty matches split nothing: step over one character */
                size_t l = 1;
                while (ms + l < n && ((unsigned char)s[ms + l] & 0xC0) == 0x80)
                    l++;
                start = ms + l;
                continue;
            }
            if (ms > last && (rc = spans_push(out, in->v[k].off + last, ms - last, err)))
                return rc;
            if ((rc = spans_push(out, in->v[k].off + ms, me - ms, err)))
                return rc;
            last = start = me;
        }
        if (n > last && (rc = spans_push(out, in->v[k].off + last, n - last, err)))
            return rc;
    }
    return 0;
}

/* Unicode NFC (utf8proc).  ASCII characters neither decompose nor compose
 * with what precedes them, so only the runs of non-ASCII characters (with
 * the one character before each run, which a combining mark may join) go
 * through utf8proc; the rest is copied.  *out is NULL when text is ASCII. */
static int nfc(const char *text, size_t len, char **out, size_t *out_len,
               struct strata_err *err)
{
    size_t i, o = 0, cap;
    char *d = NULL;
    *out = NULL;
    for (i = 0; i < len && (unsigned char)text[i] < 0x80; i++)
        ;
    if (i == len)
        return 0;
    /* NFC can grow a string (up to 3x by the Unicode stability policy) */
    cap = 3 * len + 16;
    d = malloc(cap);
    if (!d)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory normalizing text");
    size_t copied = 0;
    while (i < len) {
        /* i: first non-ASCII byte of a run; include the ASCII char before it */
        size_t start = i > copied ? i - 1 : i;
        size_t end = i;
        while (end < len && ((unsigned char)text[end] >= 0x80 ||
                             (end + 1 < len && (unsigned char)text[end + 1] >= 0x80)))
            end++;
        memcpy(d + o, text + copied, start - copied);
        o += start - copied;
        utf8proc_uint8_t *seg = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)text + start,
                                          (utf8proc_ssize_t)(end - start), &seg,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (r < 0) {
            free(d);
            return strata_err_set(err, r == UTF8PROC_ERROR_NOMEM ? STRATA_E_NOMEM
                                                                 : STRATA_E_INTERNAL,
                                  "NFC normalization failed: %s", utf8proc_errmsg(r));
        }
        if (o + (size_t)r + (len - end) > cap) {
            cap = o + (size_t)r + (len - end) + cap / 2;
            char *nd = realloc(d, cap);
            if (!nd) {
                free(seg);
                free(d);
                return strata_err_set(err, STRATA_E_NOMEM, "out of memory normalizing text");
            }
            d = nd;
        }
        memcpy(d + o, seg, (size_t)r);
        o += (size_t)r;
        free(seg);
        copied = end;
        for (i = end; i < len && (unsigned char)text[i] < 0x80; i++)
            ;
    }
    memcpy(d + o, text + copied, len - copied);
    o += len - copied;
    *out = d;
    *out_len = o;
    return 0;
}

int vocab_bpe_tokenize(const struct strata_vocab *v, const char *text, size_t len,
                       struct vocab_ids *out, struct strata_err *err)
{
    struct bpe_work w = { 0 };
    struct spans a = { 0 }, b = { 0 };
    char *norm = NULL, *mapped = NULL;
    size_t *raw_of = NULL, *map_of = NULL;
    int rc;

    if (v->pre->nfc) {
        size_t nl;
        if ((rc = nfc(text, len, &norm, &nl, err)))
            goto out;
        if (norm) {
            text = norm;
            len = nl;
        }
    }
    w.md = pcre2_match_data_create(8, NULL);
    w.mctx = pcre2_match_context_create(NULL);
    w.jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!w.md || !w.mctx || !w.jit) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory for the regex engine");
        goto out;
    }
    pcre2_jit_stack_assign(w.mctx, NULL, w.jit);
    /* the cache pays off only on longer texts; it is an optimisation, so
     * running without it when memory is short is fine */
    if (len >= 4096) {
        w.cache_slots = 1024;
        while (w.cache_slots < len / 8 && w.cache_slots < (1u << 18))
            w.cache_slots *= 2;
        w.cache = calloc(w.cache_slots, sizeof(*w.cache));
    }

    if ((rc = spans_push(&a, 0, len, err)))
        goto out;
    const char *base = text;
    int mapped_mode = 0;
    for (int i = 0; i < v->pre->n_steps; i++) {
        int kind = v->pre->steps[i].kind;
        if (kind == VOCAB_STEP_SPLIT || kind == VOCAB_STEP_BYTELEVEL_RE) {
            const pcre2_code *re = kind == VOCAB_STEP_SPLIT ? v->re[i] : v->re_gpt2;
            if ((rc = split_spans(&w, re, base, &a, &b, err)))
                goto out;
            struct spans t = a;
            a = b;
            b = t;
        }
        if (kind != VOCAB_STEP_SPLIT && i + 1 < v->pre->n_steps && !mapped_mode) {
            /* later steps see the byte-level characters: map the text and
             * keep both directions of the offset correspondence */
            mapped = malloc(2 * len + 1);
            raw_of = malloc((2 * len + 1) * sizeof(size_t));
            map_of = malloc((len + 1) * sizeof(size_t));
            if (!mapped || !raw_of || !map_of) {
                rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory mapping bytes");
                goto out;
            }
            size_t m = 0;
            for (size_t j = 0; j < len; j++) {
                unsigned char c = (unsigned char)text[j];
                map_of[j] = m;
                raw_of[m] = j;
                memcpy(mapped + m, v->b2u[c], v->b2u_len[c]);
                m += v->b2u_len[c];
            }
            map_of[len] = m;
            raw_of[m] = len;
            for (size_t j = 0; j < a.n; j++) {
                size_t s0 = map_of[a.v[j].off], s1 = map_of[a.v[j].off + a.v[j].len];
                a.v[j].off = s0;
                a.v[j].len = s1 - s0;
            }
            base = mapped;
            mapped_mode = 1;
        }
    }
    if (mapped_mode) {
        for (size_t j = 0; j < a.n; j++) {
            size_t s0 = raw_of[a.v[j].off], s1 = raw_of[a.v[j].off + a.v[j].len];
            a.v[j].off = s0;
            a.v[j].len = s1 - s0;
        }
    }
    for (size_t j = 0; j < a.n; j++)
        if ((rc = bpe_word(v, &w, (const unsigned char *)text + a.v[j].off, a.v[j].len, out,
                           err)))
            goto out;
    rc = 0;
out:
    pcre2_match_data_free(w.md);
    pcre2_match_context_free(w.mctx);
    pcre2_jit_stack_free(w.jit);
    free(w.sym);
    free(w.heap);
    free(w.cache);
    free(w.keys);
    free(w.cids);
    free(w.mapped);
    free(a.v);
    free(b.v);
    free(norm);
    free(mapped);
    free(raw_of);
    free(map_of);
    return rc;
}
