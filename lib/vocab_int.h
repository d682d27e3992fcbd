/* vocab_int.h - internals shared by vocab.c (loading, specials, decoding),
 * vocab_bpe.c (byte-level BPE and its pre-tokenizers) and vocab_spm.c
 * (SentencePiece-style BPE).  Not a public header. */
#ifndef STRATA_VOCAB_INT_H
#define STRATA_VOCAB_INT_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "vocab.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* A growable array of token ids. */
struct vocab_ids {
    int32_t *v;
    size_t n, cap;
};

int vocab_ids_push(struct vocab_ids *a, int32_t id, struct strata_err *err);

/* Open-addressing hash from token text to id. */
struct vocab_text_map {
    int32_t *slots; /* id or -1 */
    size_t mask;
};

/* Open-addressing hash from a merge pair (left id, right id) to its rank and
 * the id of the merged token (tokenizer.ggml.merges). */
struct vocab_merge_slot {
    uint64_t key; /* (left << 32 | right) + 1; 0 = empty */
    int32_t rank;
    int32_t id;
};

struct vocab_merge_map {
    struct vocab_merge_slot *slots;
    size_t mask;
};

/* One step of a pre-tokenizer pipeline, as tokenizer.json spells it. */
enum vocab_step_kind {
    VOCAB_STEP_SPLIT = 1,      /* Split(Regex, Isolated) / Digits / Punctuation */
    VOCAB_STEP_BYTELEVEL = 2,  /* ByteLevel(use_regex=false): map bytes */
    VOCAB_STEP_BYTELEVEL_RE = 3, /* ByteLevel(use_regex=true): GPT-2 split, map */
};

#define VOCAB_MAX_STEPS 8

struct vocab_pre {
    const char *names;  /* '|'-separated tokenizer.ggml.pre names */
    int nfc;            /* normalizer NFC */
    int ignore_merges;  /* BPE ignore_merges: a whole piece in the vocab is one token */
    int no_bos;         /* the pre name implies no BOS (glm4) */
    int bos_default;    /* add_bos_token when the key is absent (Llama 3 adds BOS) */
    int n_steps;
    struct {
        int kind;
        const char *re; /* VOCAB_STEP_SPLIT */
    } steps[VOCAB_MAX_STEPS];
};

struct vocab_trie_node {
    int32_t child;   /* first child node, -1 none */
    int32_t sibling; /* next sibling, -1 none */
    int32_t id;      /* token ending here, -1 none */
    uint8_t byte;
};

struct strata_vocab {
    enum strata_vocab_kind kind;
    char *model_name;
    char *pre_name;
    int32_t n_tokens;

    /* raw pieces: NUL-terminated, at text_blob + text_off[i], text_len[i] bytes */
    char *text_blob;
    uint32_t *text_off;
    uint32_t *text_len;
    /* decoded bytes of each token (see strata_vocab_token_bytes) */
    char *dec_blob;
    uint32_t *dec_off;
    uint32_t *dec_len;
    size_t max_dec;

    float *scores;
    uint8_t *ttype;

    int32_t bos, eos, eot, eom, unk, pad;
    int add_bos, add_eos, add_space_prefix;
    uint8_t *eog; /* per token 0/1 */

    struct vocab_text_map tmap;

    /* specials: control / user-defined / unknown tokens matched as whole strings */
    struct vocab_trie_node *trie;
    int32_t n_trie;
    uint8_t special_first[256]; /* 1 if a special token starts with this byte */

    /* byte-level BPE */
    const struct vocab_pre *pre;
    pcre2_code *re[VOCAB_MAX_STEPS];
    pcre2_code *re_gpt2;    /* ByteLevel(use_regex=true) pattern */
    struct vocab_merge_map merges;
    int32_t byte_id[256];   /* id of the one-char token of each byte's mapped char */
    char b2u[256][3];       /* GPT-2 bytes_to_unicode, UTF-8 */
    uint8_t b2u_len[256];
    int16_t u2b[0x144];     /* inverse for code points below 0x144, -1 none */

    /* SPM */
    int32_t byte_tok[256];  /* <0xNN> token ids, -1 none */
    /* 1 for an ASCII byte that no mergeable piece of two or more characters
     * contains: no merge crosses it, so the text is merged in independent
     * chunks between such bytes (a newline, for most vocabularies) */
    uint8_t spm_barrier[128];
};

uint64_t vocab_hash_bytes(const char *s, size_t n);
/* Id of the token whose raw piece is s[0..n), or -1. */
int32_t vocab_lookup(const struct strata_vocab *v, const char *s, size_t n);

/* Byte-level BPE: set up pre-tokenizer regexes and the merge table. */
int vocab_bpe_init(struct strata_vocab *v, const struct strata_gguf *g, struct strata_err *err);
void vocab_bpe_free(struct strata_vocab *v);
/* Tokenize a text fragment (valid UTF-8, no specials) and append ids. */
int vocab_bpe_tokenize(const struct strata_vocab *v, const char *text, size_t len,
                       struct vocab_ids *out, struct strata_err *err);
/* Decoded bytes of a byte-level piece into dst (room for len bytes); returns length. */
size_t vocab_bpe_decode_piece(const struct strata_vocab *v, const char *s, size_t len,
                              char *dst);

void vocab_spm_init(struct strata_vocab *v);
int vocab_spm_tokenize(const struct strata_vocab *v, const char *text, size_t len,
                       struct vocab_ids *out, struct strata_err *err);

/* Check the UTF-8 sequence starting at s (n >= 1 bytes available), by
 * Unicode 15 table 3-7.  Returns 1 when valid (*len = its length, 1..4), 0
 * when ill-formed (*len = the maximal subpart to replace by one U+FFFD, >= 1),
 * -1 when the n bytes are a valid but incomplete start (*len = n). */
int vocab_utf8_check(const unsigned char *s, size_t n, size_t *len);

#endif
