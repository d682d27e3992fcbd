/* vocab.h - the tokenizer vocabulary of a GGUF model, tokenization and
 * detokenization that reproduce the Hugging Face tokenizer the GGUF was
 * converted from, id for id.
 *
 * The vocabulary comes from the GGUF keys tokenizer.ggml.*:
 *   model                "llama" (SentencePiece-style BPE: score-driven merges,
 *                        byte fallback <0xNN>, U+2581 "▁" for spaces) or
 *                        "gpt2" (byte-level BPE: merge ranks, bytes mapped to
 *                        printable code points as GPT-2's bytes_to_unicode)
 *   pre                  the pre-tokenizer of a gpt2 vocabulary: default,
 *                        gpt-2, llama-bpe, qwen2, deepseek-llm, deepseek-coder,
 *                        deepseek-v3, falcon, starcoder, refact, mpt, gpt-4o,
 *                        kimi-k2, glm4 (and aliases, see vocab_bpe.c); each is the
 *                        regex sequence of the model's tokenizer.json, run with
 *                        PCRE2 (UTF, UCP, JIT).  An unknown name is an error
 *                        naming it.
 *   tokens, scores, token_type, merges,
 *   bos/eos/eot/eom/unknown/padding_token_id, add_bos_token,
 *   add_eos_token, add_space_prefix
 *
 * Input text must be UTF-8.  Invalid UTF-8 is not an error: each maximal
 * ill-formed subsequence is replaced by U+FFFD before tokenizing (the rule of
 * Unicode 15 section 3.9 "U+FFFD Substitution of Maximal Subparts", which is
 * also what Python's bytes.decode(errors="replace") does), so any byte string
 * tokenizes without a crash.
 *
 * A struct strata_vocab is immutable after loading: tokenizing and
 * detokenizing through one vocab from several threads at once is safe.
 * It copies everything it needs, so the GGUF may be closed after loading.
 */
#ifndef STRATA_VOCAB_H
#define STRATA_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct strata_gguf;
struct strata_vocab;

/* tokenizer.ggml.model */
enum strata_vocab_kind {
    STRATA_VOCAB_SPM = 1, /* "llama" */
    STRATA_VOCAB_BPE = 2, /* "gpt2" */
};

/* tokenizer.ggml.token_type values (gguf-py TokenType / llama.cpp). */
enum strata_vocab_ttype {
    STRATA_VOCAB_TT_UNDEFINED = 0,
    STRATA_VOCAB_TT_NORMAL = 1,
    STRATA_VOCAB_TT_UNKNOWN = 2,
    STRATA_VOCAB_TT_CONTROL = 3,
    STRATA_VOCAB_TT_USER_DEFINED = 4,
    STRATA_VOCAB_TT_UNUSED = 5,
    STRATA_VOCAB_TT_BYTE = 6,
};

/* Load the vocabulary of an open GGUF (a vocabulary-only GGUF is enough).
 * *out is owned by the caller (strata_vocab_free).  Errors: STRATA_E_NOTFOUND
 * (a required key is missing: tokenizer.ggml.model, .tokens, .merges for gpt2;
 * names it), STRATA_E_FORMAT (wrong key type, array lengths that disagree, a
 * special token id out of range, a merge that is not "A B"; names the key),
 * STRATA_E_UNSUPPORTED (a tokenizer model or pre-tokenizer name this library
 * does not know; names it), STRATA_E_NOMEM. */
int strata_vocab_load(struct strata_vocab **out, const struct strata_gguf *g,
                      struct strata_err *err);

/* NULL is accepted. */
void strata_vocab_free(struct strata_vocab *v);

int32_t strata_vocab_n_tokens(const struct strata_vocab *v);
enum strata_vocab_kind strata_vocab_kind(const struct strata_vocab *v);
/* tokenizer.ggml.model as stored ("llama", "gpt2"). */
const char *strata_vocab_model_name(const struct strata_vocab *v);
/* tokenizer.ggml.pre as stored ("default" when absent). */
const char *strata_vocab_pre(const struct strata_vocab *v);

/* Tokenize len bytes of text (need not be NUL-terminated; len 0 is fine and
 * gives no tokens, or only BOS).  add_bos: prepend BOS when the vocab has one
 * (callers normally pass strata_vocab_add_bos(v)); an EOS is appended when
 * tokenizer.ggml.add_eos_token is true and add_bos is nonzero (whole-prompt
 * mode, as HF's add_special_tokens).  parse_special: nonzero matches the text
 * of control and user-defined tokens (e.g. "<|im_end|>") as whole strings
 * before BPE; zero treats them as plain text, as untrusted user content
 * must be.  User-defined (non-special added) tokens such as "<tool_call>"
 * are matched either way, as the Hugging Face tokenizer does.  *ids is malloc'ed (caller frees; non-NULL even when *n_ids is 0).
 * Errors: STRATA_E_NOMEM, STRATA_E_INTERNAL (a regex engine failure). */
int strata_vocab_tokenize(const struct strata_vocab *v, const char *text, size_t len,
                          int add_bos, int parse_special, int32_t **ids, size_t *n_ids,
                          struct strata_err *err);

/* Special token ids, -1 if the vocabulary has none. */
int32_t strata_vocab_bos(const struct strata_vocab *v);
int32_t strata_vocab_eos(const struct strata_vocab *v);
int32_t strata_vocab_eot(const struct strata_vocab *v);
int32_t strata_vocab_eom(const struct strata_vocab *v);
int32_t strata_vocab_unk(const struct strata_vocab *v);
int32_t strata_vocab_pad(const struct strata_vocab *v);

/* tokenizer.ggml.add_bos_token / add_eos_token (defaults: 1 for llama, 0
 * for gpt2 when the key is absent). */
int strata_vocab_add_bos(const struct strata_vocab *v);
int strata_vocab_add_eos(const struct strata_vocab *v);

/* End of generation: eos, eot, eom, and control tokens whose text is one of
 * the usual end markers (<|im_end|>, <|endoftext|>, <|eot_id|>, <|eom_id|>,
 * <|end|>, <|return|>, <|call|>, <end_of_turn>, <｜end▁of▁sentence｜>, ...);
 * <|end|> is not one where <|return|> and <|call|> exist (gpt-oss).
 * 0 for ids out of range. */
int strata_vocab_is_eog(const struct strata_vocab *v, int32_t id);

/* Raw piece as stored in tokenizer.ggml.tokens (NUL-terminated; "▁the",
 * "Ġthe", "<0x0A>", "<|im_end|>"); NULL for ids out of range. */
const char *strata_vocab_token_text(const struct strata_vocab *v, int32_t id);
/* Token type (enum strata_vocab_ttype); STRATA_VOCAB_TT_UNDEFINED out of range. */
int strata_vocab_token_type(const struct strata_vocab *v, int32_t id);
/* tokenizer.ggml.scores entry (0 when absent or out of range). */
float strata_vocab_token_score(const struct strata_vocab *v, int32_t id);
/* Id of the token whose raw piece is exactly text[0..len), or -1. */
int32_t strata_vocab_find(const struct strata_vocab *v, const char *text, size_t len);

/* The bytes a token stands for in decoded text: byte-level pieces mapped
 * back to bytes, "▁" -> " ", <0xNN> -> the byte NN, control and user-defined
 * tokens -> their text.  *len gets the length; the pointer stays valid until
 * strata_vocab_free.  NULL (and *len 0) for ids out of range.  Bytes may be
 * an incomplete UTF-8 sequence (byte tokens, split byte-level pieces). */
const char *strata_vocab_token_bytes(const struct strata_vocab *v, int32_t id, size_t *len);
/* Longest strata_vocab_token_bytes of any token. */
size_t strata_vocab_max_token_bytes(const struct strata_vocab *v);

/* Decode a whole id sequence to text (malloc'ed, NUL-terminated, caller
 * frees).  special: nonzero renders control tokens (BOS, <|im_end|>) as their
 * text; zero drops them.  For SPM vocabularies with add_space_prefix the
 * space of the first "▁" is dropped, as the SentencePiece decoder does.
 * Incomplete or invalid UTF-8 in the result is replaced by U+FFFD.
 * Errors: STRATA_E_INVALID (an id out of range; names it), STRATA_E_NOMEM. */
int strata_vocab_detokenize(const struct strata_vocab *v, const int32_t *ids, size_t n_ids,
                            int special, char **text, size_t *len, struct strata_err *err);

/* Streaming detokenizer.  Caller-allocated; init, then push each new token
 * id: the bytes that complete whole UTF-8 characters are written to out, a
 * trailing incomplete sequence (at most 3 bytes) is held back until a later
 * token completes it.  A held sequence that can no longer complete becomes
 * U+FFFD.  Control tokens are rendered only with STRATA_DETOK_SPECIAL.  No
 * leading space is stripped (a stream continues a prompt). */
#define STRATA_DETOK_SPECIAL 1u

struct strata_detok {
    const struct strata_vocab *vocab;
    unsigned flags;
    unsigned char held[4]; /* incomplete UTF-8 sequence carried over */
    size_t n_held;
};

/* Room out must have for any single push or flush (every byte of a token
 * could become a 3-byte U+FFFD). */
#define STRATA_DETOK_OUT_MAX(v) (3 * (strata_vocab_max_token_bytes(v) + 4))

void strata_detok_init(struct strata_detok *d, const struct strata_vocab *v, unsigned flags);

/* Append the decoded bytes of token id.  out must have room for
 * STRATA_DETOK_OUT_MAX(v) bytes; *n_out gets the count written (often 0 while
 * a character is incomplete).  Errors: STRATA_E_INVALID (id out of range),
 * STRATA_E_LIMIT (cap too small). */
int strata_detok_push(struct strata_detok *d, int32_t id, char *out, size_t cap,
                      size_t *n_out, struct strata_err *err);

/* End of stream: a held incomplete sequence is written as U+FFFD (3 bytes;
 * cap >= 3).  *n_out gets 0 or 3.  Leaves d ready for a new stream. */
void strata_detok_flush(struct strata_detok *d, char *out, size_t cap, size_t *n_out);

#endif
