/* sampler.h - choose the next token from logits.
 *
 * The chain, in llama.cpp's default order: penalties (repetition, presence,
 * frequency over the last penalty_last_n tokens of prompt plus output) ->
 * top-k -> top-p -> min-p -> temperature -> draw with a seeded RNG.
 * temperature <= 0 is greedy: the argmax of the penalised logits (the first
 * index on ties), with no randomness.
 *
 * Definitions (as llama.cpp's sampler chain):
 *   repetition: a seen token's logit l becomes l / rp when l > 0, l * rp else
 *   frequency/presence: l -= count * freq + (count > 0) * presence
 *   top-k: keep the k largest logits (k <= 0 disables; k >= n_vocab keeps all)
 *          (without top-k only the tokens top-p and min-p can keep are sorted, and
 *          with neither the draw walks the vocabulary in id order)
 *   top-p: keep the smallest prefix of tokens sorted by probability whose
 *          cumulative probability reaches top_p (at least one token; 1 disables)
 *   min-p: keep tokens with p >= min_p * p_max (0 disables)
 *   temperature: logits / temperature before the final softmax
 * The draw uses a 64-bit xoshiro256** stream seeded with splitmix64(seed), so
 * one seed reproduces the same tokens on every machine.
 *
 * The logprob reported for a token is log softmax of the raw logits (before
 * penalties and filtering), as OpenAI-style APIs report it.
 */
#ifndef STRATA_SAMPLER_H
#define STRATA_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct strata_sampler_params {
    float temperature;       /* <= 0: greedy (default 0.8 as llama.cpp; callers set) */
    int32_t top_k;           /* <= 0 disables (default 40) */
    float top_p;             /* 1 disables (default 0.95) */
    float min_p;             /* 0 disables (default 0.05) */
    float repeat_penalty;    /* 1 disables (default 1) */
    float presence_penalty;  /* 0 disables */
    float frequency_penalty; /* 0 disables */
    int32_t penalty_last_n;  /* tokens of history the penalties look at (default 64;
                                -1 = all of it, 0 disables) */
    uint64_t seed;           /* RNG seed */
};

/* llama.cpp's defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
 * penalties off, penalty_last_n 64, seed 0). */
void strata_sampler_params_init(struct strata_sampler_params *p);

/* One candidate with its log-probability. */
struct strata_token_prob {
    int32_t id;
    float logprob;
};

struct strata_sampler;

/* Create a sampler for a vocabulary of n_vocab logits.  *out is owned by the
 * caller (strata_sampler_free).  Errors: STRATA_E_INVALID (n_vocab < 1,
 * top_p or min_p outside [0,1], repeat_penalty <= 0, non-finite values;
 * names the field), STRATA_E_NOMEM. */
int strata_sampler_create(struct strata_sampler **out, const struct strata_sampler_params *p,
                          int32_t n_vocab, struct strata_err *err);
void strata_sampler_free(struct strata_sampler *s);

/* Restart the RNG with seed and forget the history. */
void strata_sampler_reset(struct strata_sampler *s, uint64_t seed);

/* Append tokens to the penalty history (the prompt, then each accepted token). */
void strata_sampler_accept(struct strata_sampler *s, const int32_t *ids, size_t n);

/* Choose a token from logits [n_vocab] (not modified).  *logprob (may be
 * NULL) gets its log-probability under the raw logits; top (may be NULL)
 * gets the n_top most likely tokens under the raw logits, best first.
 * Does not add the token to the history (call strata_sampler_accept). */
int32_t strata_sampler_sample(struct strata_sampler *s, const float *logits, float *logprob,
                              struct strata_token_prob *top, int n_top);

/* 1 if every choice of s is the argmax of the raw logits, whatever the history
 * (temperature <= 0 and no penalty that can change a logit): a caller may then take
 * the argmax where the logits are (strata_engine_eval_argmax). */
int strata_sampler_is_argmax(const struct strata_sampler *s);

/* The most candidates strata_sampler_topk and strata_sampler_sample_topk take. */
#define STRATA_SAMPLER_TOPK_MAX 64

/* k (1..STRATA_SAMPLER_TOPK_MAX) if every choice of s depends only on the k largest
 * raw logits (temperature > 0, top_k = k, no penalty that can change a logit), else 0:
 * a caller may then find those where the logits are (strata_engine_eval_topk) and
 * draw with strata_sampler_sample_topk. */
int strata_sampler_topk_k(const struct strata_sampler *s);
/* Draw from the k largest raw logits of a step, best first (ids [k], vals [k], as
 * strata_sampler_topk orders them; k = strata_sampler_topk_k(s)): the same token, and
 * the same draw from the RNG, as strata_sampler_sample on the whole row.  Returns -1
 * when k < 1. */
int32_t strata_sampler_sample_topk(struct strata_sampler *s, const int32_t *ids,
                                   const float *vals, int32_t k);
/* The k largest of logits [n] (k clamped to 1..min(n, STRATA_SAMPLER_TOPK_MAX)) into
 * ids [k] and vals [k], best first: larger logit first, the lower id among equal ones
 * (-0 equals +0); NaN never: a place with no number left gets id -1 and -inf (as the
 * device's strata_k_topk). */
void strata_sampler_topk(const float *logits, int32_t n, int32_t k, int32_t *ids, float *vals);
/* Index of the largest logit (the first on ties; NaN never wins unless every logit is
 * NaN: then 0). */
int32_t strata_sampler_argmax(const float *logits, int32_t n_vocab);

/* log sum_i exp(logits[i]) over n_vocab logits: the largest plus the log of the sum
 * of float exponentials relative to it, summed in double (logprob of a token = its
 * logit minus this); NaN logits are left out. */
double strata_sampler_log_sum_exp(const float *logits, int32_t n_vocab);
/* log softmax of logits[id] over n_vocab logits, computed in double. */
float strata_sampler_logprob(const float *logits, int32_t n_vocab, int32_t id);

#endif
