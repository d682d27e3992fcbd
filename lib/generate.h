/* generate.h - the generation loop and perplexity.
 *
 * strata_generate: prompt ids -> prefill (reusing the kv cache's common
 * prefix with the engine's history) -> decode one token at a time -> sample
 * -> callback per token, until a stop string, an end-of-generation token,
 * max tokens, a full context or a cancel.
 *
 * Stop strings are searched in all new text (across token boundaries).  Text
 * that could still be the start of a stop string is held back from the
 * callback until it is decided; when a stop string matches, the text is cut
 * just before it and the rest is never shown.  So a callback's text may be
 * empty, or hold bytes of earlier tokens; the concatenation of all callback
 * texts equals the result's text.
 *
 * strata_perplexity: exactly as llama.cpp's llama-perplexity computes it (see
 * the function's contract).
 */
#ifndef STRATA_GENERATE_H
#define STRATA_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "sampler.h"

struct strata_engine;
struct strata_vocab;
struct strata_spec;

enum strata_stop_reason {
    STRATA_STOP_NONE = 0,
    STRATA_STOP_LENGTH,  /* max tokens reached ("length") */
    STRATA_STOP_EOG,     /* an end-of-generation token (EOS/EOT) ("eos") */
    STRATA_STOP_STRING,  /* a stop string matched ("stop") */
    STRATA_STOP_CTX,     /* the context is full ("context") */
    STRATA_STOP_CANCEL,  /* the callback asked to stop ("cancelled") */
};

/* "length", "eos", "stop", "context", "cancelled", "none". */
const char *strata_stop_reason_name(int reason);

#define STRATA_GEN_MAX_TOP 20

struct strata_gen_params {
    struct strata_sampler_params sampling;
    int32_t n_predict;        /* max new tokens; < 0: until the context is full */
    const char *const *stop;  /* stop strings (not copied), may be NULL */
    size_t n_stop;
    int ignore_eog;           /* keep going past EOS/EOT */
    int n_top_logprobs;       /* 0 .. STRATA_GEN_MAX_TOP alternatives per token */
    int logprobs;             /* 1: each token's own logprob (strata_gen_token.logprob,
                                 else 0; also with n_top_logprobs > 0).  Off by
                                 default: it is a pass over the vocabulary's logits per
                                 token (log-sum-exp), about 0.7 ms on one core for
                                 151,936 tokens, as long as a whole decode step of a
                                 large MoE on a GPU */
    int special;              /* render control tokens as text in the output */
    struct strata_spec *spec; /* speculative decoding (spec.h; not owned), or NULL:
                                 one token per forward call */
    const float *embd;        /* image embeddings spliced into the prompt: the prompt
                                 positions whose id is -1 take these rows in order,
                                 [number of -1 ids, n_embd] float32 (not copied); NULL
                                 when the prompt has no -1 ids.  A prompt position after
                                 an image is never reused from the kv cache. */
};

/* strata_sampler_params_init defaults, n_predict -1, no stop strings. */
void strata_gen_params_init(struct strata_gen_params *p);

/* One generated token as the callback sees it.  Pointers are valid during
 * the call only. */
struct strata_gen_token {
    int32_t id;
    const char *text;  /* bytes released now (may be empty, see above) */
    size_t text_len;
    float logprob;     /* log-probability of id under the raw logits (0 unless
                          strata_gen_params.logprobs or n_top_logprobs) */
    const struct strata_token_prob *top; /* [n_top] best alternatives */
    int n_top;
    int32_t index;     /* 0 for the first generated token */
};

/* Return nonzero to cancel (the loop stops with STRATA_STOP_CANCEL). */
typedef int (*strata_gen_token_fn)(const struct strata_gen_token *t, void *ud);

struct strata_gen_result {
    int32_t n_prompt;      /* prompt tokens */
    int32_t n_cached;      /* prompt tokens reused from the kv cache */
    int32_t n_gen;         /* tokens generated (sampled and accepted) */
    double t_prefill_ms;   /* time of the prompt's forward passes */
    double t_decode_ms;    /* time of the generation steps (forward + sample) */
    double prefill_tps;    /* (n_prompt - n_cached) / prefill seconds */
    double decode_tps;     /* n_gen / decode seconds (0 when n_gen < 2) */
    int stop_reason;       /* enum strata_stop_reason */
    int stop_index;        /* which stop string matched, else -1 */
    char *text;            /* all released text, malloc'ed, NUL-terminated */
    size_t text_len;
    int32_t *ids;          /* [n_gen] generated ids, malloc'ed */
};

/* Run the loop.  prompt: n_prompt >= 1 ids (with BOS if the caller wants
 * it).  cb may be NULL.  res is filled on success and on error (partial
 * counts); free it with strata_gen_result_free.  Errors: STRATA_E_INVALID
 * (empty prompt, bad sampling parameter: names it), STRATA_E_LIMIT (the
 * prompt does not fit the context: says both lengths), engine errors. */
int strata_generate(struct strata_engine *e, const struct strata_vocab *v,
                    const int32_t *prompt, size_t n_prompt,
                    const struct strata_gen_params *p, strata_gen_token_fn cb, void *ud,
                    struct strata_gen_result *res, struct strata_err *err);

void strata_gen_result_free(struct strata_gen_result *r);

/* Perplexity as llama.cpp's llama-perplexity: the text's ids (tokenized as a
 * whole, with BOS when the vocabulary adds one) are cut into
 * n_chunk = min(n_ids / n_ctx, n_chunks > 0 ? n_chunks : all) chunks of n_ctx
 * tokens; the first id of each chunk is replaced by BOS when add_bos; each
 * chunk is evaluated from an empty kv cache and the positions
 * first = n_ctx/2 .. n_ctx-2 score the next id: nll += -log softmax.
 * ppl = exp(mean nll); its error is ppl * sqrt((mean nll^2 - mean nll^2) /
 * (count - 1)).  progress (may be NULL) is called after each chunk with the
 * running ppl.  Errors: STRATA_E_INVALID (n_ids < 2 * n_ctx, as llama.cpp
 * requires; n_ctx larger than the engine's context), engine errors. */
int strata_perplexity(struct strata_engine *e, const int32_t *ids, size_t n_ids,
                      int32_t n_ctx, int32_t n_chunks, int add_bos, int32_t bos,
                      void (*progress)(int chunk, int n_chunk, double ppl, void *ud),
                      void *ud, double *ppl, double *ppl_err, struct strata_err *err);

#endif
