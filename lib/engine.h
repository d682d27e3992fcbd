/* engine.h - run a model: evaluate batches of consecutive positions into the
 * kv cache and return logits; roll the kv cache back.
 *
 * An engine owns one model (opened from a GGUF path, or an already-open GGUF),
 * one kv cache of n_ctx positions, a worker pool and one backend.  Every batch
 * of consecutive positions goes through the same forward pass: a prompt
 * (split into chunks of n_prefill tokens), a single decode token, or a
 * speculative verify window.  The logits of a position are bitwise identical
 * whether it was computed alone or inside a batch of any size, and with any
 * thread count (on the CPU backend; tested) - speculative decoding relies on it.
 *
 * The engine remembers the token ids whose keys/values are in the kv cache
 * (its history), so a caller can reuse a common prefix: roll back to the
 * prefix length and evaluate only the rest.
 *
 * Not thread-safe: one caller at a time per engine.
 */
#ifndef STRATA_ENGINE_H
#define STRATA_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct strata_gguf;
struct strata_model;
struct strata_pool;

enum strata_kv_type {
    STRATA_KV_F16 = 0, /* default, as llama.cpp */
    STRATA_KV_F32 = 1,
};

struct strata_pack;

struct strata_engine_opts {
    int n_threads;           /* worker threads; <= 0: the number of online CPUs */
    int n_ctx;               /* kv cache positions; <= 0: min(n_ctx_train, 4096) */
    int n_prefill;           /* positions per forward call (ubatch); <= 0: 512 */
    int kv_type;             /* enum strata_kv_type */
    const char *backend;     /* "cpu", "auto", or a GPU backend's name; NULL = "cpu" */
    int device;              /* GPU ordinal for GPU backends; -1 = default */
    const struct strata_backend_ops *backend_ops; /* overrides backend when non-NULL */
    void *backend_cfg;       /* backend-specific options (e.g. expert cache), opaque here */
    const struct strata_pack *pack; /* routed experts from this pack (lib/pack.h: its
                                       experts.bin when repacked); NULL: from the GGUF */
    /* Routing trace (CPU backend): called after each MoE layer's routing of a
     * forward call with sel [n_tok, n_expert_used] expert ids of positions
     * pos0 .. pos0 + n_tok - 1 (valid during the call only).  NULL = none.
     * Routing profiles and the expert cache's replay tests are built on it. */
    void (*route_trace)(void *ctx, int il, int32_t pos0, int n_tok, int n_expert_used,
                        const int32_t *sel);
    void *route_trace_ctx;
    /* A worker pool to share (not owned; must outlive the engine; n_threads is then its
     * size), or NULL: the engine makes its own.  Engines that share a pool must not run
     * at the same time - a speculative draft model and its target take turns, and one
     * pool keeps the idle one's spinning workers off the busy one's cores. */
    struct strata_pool *pool;
    /* strata_engine_eval_topk asks the backend for the top-k (its device, where the
     * logits are) from this vocabulary size on; below it the row comes back and the
     * host selects them (4,096 logits: 16 KB and a few microseconds, less than the
     * device's two sorts took on an H200).  Default 32768; 0 always.  The environment's
     * STRATA_TOPK_MIN_VOCAB overrides it (measurements). */
    int32_t topk_min_vocab;
};

/* Fill o with the defaults above. */
void strata_engine_opts_init(struct strata_engine_opts *o);

/* Which rows of logits a forward call returns. */
enum strata_logits_mode {
    STRATA_LOGITS_NONE = 0, /* none (prefill chunks before the last) */
    STRATA_LOGITS_LAST = 1, /* the last position of the batch only */
    STRATA_LOGITS_ALL = 2,  /* every position: [n_tok, n_vocab] */
    STRATA_LOGITS_ARGMAX = 3, /* the last position's argmax only (a backend whose ops
                                 have argmax = 1): the logits pointer is an int32_t *
                                 that receives the id (strata_engine_eval_argmax) */
    STRATA_LOGITS_TOPK = 4,   /* the last position's top_k largest logits only (a
                                 backend whose ops have topk_max >= top_k): the logits
                                 pointer receives top_k int32_t ids, then top_k floats
                                 (strata_engine_eval_topk) */
};

/* A batch of n_tok consecutive positions pos0 .. pos0+n_tok-1. */
struct strata_batch {
    int32_t n_tok;
    const int32_t *ids; /* [n_tok] token ids; NULL when embd is used */
    const float *embd;  /* [n_tok, n_embd] input embeddings (image tokens), or NULL */
    int32_t pos0;       /* position of the first token; the kv cache holds 0..pos0-1 */
    int logits;         /* enum strata_logits_mode */
    int32_t top_k;      /* with STRATA_LOGITS_TOPK: how many */
    int lse;            /* with STRATA_LOGITS_TOPK: 1 = also the row's log-sum-exp */
};

/* ---- backend interface ----
 *
 * A backend implements the forward pass of a struct strata_model.  The engine
 * validates batches (ids in range, pos0 + n_tok <= n_ctx, n_tok <= n_prefill)
 * before calling forward, so backends may assume them.  All functions return
 * 0 or an error code with err filled (naming the kernel/tensor at fault); a
 * failed forward leaves the kv cache valid for positions < pos0.
 */
struct strata_expert_cache;
struct strata_ec_times;

struct strata_backend_ops {
    const char *name; /* "cpu", "cuda", "hip" */

    /* Create the backend's state for model m (weights upload, kv cache of
     * o->n_ctx positions, scratch for o->n_prefill positions).  pool is the
     * engine's CPU worker pool (may be used by a GPU backend for CPU experts).
     * *state is freed with free().  Errors: STRATA_E_NOMEM, STRATA_E_GPU,
     * STRATA_E_UNSUPPORTED (a tensor type the backend cannot run; names it). */
    int (*init)(void **state, const struct strata_model *m,
                const struct strata_engine_opts *o, struct strata_pool *pool,
                struct strata_err *err);
    void (*free)(void *state);

    /* Evaluate batch b: write keys/values of its positions to the kv cache,
     * attend causally over positions 0 .. pos0 + i, and write logits per
     * b->logits to logits ([1 or n_tok, n_vocab] float32; NULL with
     * STRATA_LOGITS_NONE; with STRATA_LOGITS_ARGMAX, on a backend whose argmax is 1,
     * one int32_t: the last position's argmax; with STRATA_LOGITS_TOPK, on a backend
     * whose topk_max >= b->top_k, the last position's b->top_k largest logits in
     * strata_sampler_topk's order: b->top_k int32_t ids, then their b->top_k float
     * values, then with b->lse one double: strata_sampler_log_sum_exp of the row). */
    int (*forward)(void *state, const struct strata_batch *b, float *logits,
                   struct strata_err *err);

    /* Forget the kv cache from position n_past on (the next batch starts
     * there).  May be a no-op for backends that overwrite in place. */
    int (*kv_rollback)(void *state, int32_t n_past, struct strata_err *err);

    /* Number of devices this backend can see (a runtime that fails to load or
     * to answer counts as 0); NULL for the CPU backend.  "auto" uses it. */
    int (*n_devices)(void);

    /* The expert cache of a backend that offloads routed experts: *ec and the
     * time split *t so far; reset = 1 instead zeroes both (ec, t unused).  Returns
     * 0 when it has none.  NULL for backends without one. */
    int (*expert_stats)(void *state, int reset, struct strata_expert_cache **ec,
                        struct strata_ec_times *t);

    /* 1: forward takes STRATA_LOGITS_ARGMAX, finding the id where the logits are (a
     * GPU: 4 bytes back instead of n_vocab floats) */
    int argmax;
    /* > 0: forward takes STRATA_LOGITS_TOPK with top_k up to this many, found where
     * the logits are (a GPU: 8 top_k bytes back instead of 4 n_vocab) */
    int topk_max;

    /* The backend's own host buffer of one logits row (n_vocab floats, owned by the
     * state), or NULL.  forward with STRATA_LOGITS_LAST into it needs no copy on the
     * host (a GPU: pinned memory the device writes or copies the row into); the engine
     * evaluates strata_engine_eval_row into it.  NULL: the engine's buffer. */
    float *(*host_row)(void *state);
};

/* The CPU backend (always available). */
extern const struct strata_backend_ops strata_backend_cpu_ops;

/* The backend named name ("cpu"; "auto" = the GPU backend compiled in when
 * its runtime sees a device, else cpu, with an info line saying so).  GPU builds define STRATA_WITH_GPU and
 * provide strata_backend_gpu_ops.  Errors: STRATA_E_UNSUPPORTED (unknown
 * name, or a GPU backend in a build without one; names it). */
int strata_engine_find_backend(const char *name, const struct strata_backend_ops **out,
                               struct strata_err *err);

struct strata_engine;

/* Open the GGUF model at path and create an engine for it.  o NULL = defaults.
 * *out is owned by the caller (strata_engine_close).  Errors: those of
 * strata_gguf_open (STRATA_E_IO, STRATA_E_FORMAT, ...), strata_model_load
 * (STRATA_E_NOTFOUND naming a missing key/tensor, STRATA_E_UNSUPPORTED),
 * STRATA_E_INVALID (bad option: names it), STRATA_E_NOMEM, backend errors. */
int strata_engine_open(struct strata_engine **out, const char *path,
                       const struct strata_engine_opts *o, struct strata_err *err);

/* The same on an already-open GGUF (not owned; must outlive the engine). */
int strata_engine_open_gguf(struct strata_engine **out, const struct strata_gguf *g,
                            const struct strata_engine_opts *o, struct strata_err *err);

/* NULL is accepted. */
void strata_engine_close(struct strata_engine *e);

const struct strata_model *strata_engine_model(const struct strata_engine *e);
const struct strata_gguf *strata_engine_gguf(const struct strata_engine *e);
struct strata_pool *strata_engine_pool(const struct strata_engine *e);
const char *strata_engine_backend_name(const struct strata_engine *e);
int32_t strata_engine_n_vocab(const struct strata_engine *e);
int32_t strata_engine_n_ctx(const struct strata_engine *e);
int32_t strata_engine_n_prefill(const struct strata_engine *e);
int strata_engine_n_threads(const struct strata_engine *e);

/* Positions now in the kv cache, and their token ids ([n_past]; an image
 * position records -1).  The pointer is valid until the next eval/rollback. */
int32_t strata_engine_n_past(const struct strata_engine *e);
const int32_t *strata_engine_history(const struct strata_engine *e);

/* Evaluate n_tok token ids at positions n_past .. n_past + n_tok - 1 (split
 * into forward calls of at most n_prefill positions) and append them to the
 * kv cache.  logits: per mode, [1, n_vocab] (the last position) or
 * [n_tok, n_vocab] (every position), float32, caller-owned; may be NULL with
 * STRATA_LOGITS_NONE.  Errors: STRATA_E_INVALID (n_tok < 1, an id outside
 * 0..n_vocab-1: names it; STRATA_LOGITS_ARGMAX and STRATA_LOGITS_TOPK, which are
 * strata_engine_eval_argmax's and strata_engine_eval_topk's), STRATA_E_LIMIT (n_past +
 * n_tok > n_ctx: says both),
 * backend errors.  On error the kv cache keeps its old n_past. */
int strata_engine_eval(struct strata_engine *e, const int32_t *ids, int32_t n_tok,
                       int logits_mode, float *logits, struct strata_err *err);

/* strata_engine_eval of the last position's logits into a row the engine owns:
 * *row is set to its n_vocab floats, valid until the next call on e.  On a GPU backend
 * the row is the backend's pinned host memory, written by the device, so no copy of
 * 4 n_vocab bytes follows on the host (llama_get_logits' way).  Errors: those of
 * strata_engine_eval, STRATA_E_INVALID (NULL ids or row), STRATA_E_NOMEM; *row is left
 * alone on error. */
int strata_engine_eval_row(struct strata_engine *e, const int32_t *ids, int32_t n_tok,
                           const float **row, struct strata_err *err);

/* strata_engine_eval whose last position's logits are reduced to the id of the
 * largest (the lowest id among equal ones, strata_sampler_argmax's choice) in *next:
 * greedy decoding without the logits.  On a GPU backend the id is found on the device
 * and only it comes back (a row of a 151,936-token vocabulary is 608 KB a token, and
 * the host's pass over it); elsewhere the engine evaluates the row into its own buffer
 * and finds it.  NaN logits never win on the device (the host's argmax may stop at
 * one); a row with no logit that is not NaN is STRATA_E_GPU there, naming the
 * position.  Errors: those of strata_engine_eval, STRATA_E_INVALID (NULL next),
 * STRATA_E_NOMEM. */
int strata_engine_eval_argmax(struct strata_engine *e, const int32_t *ids, int32_t n_tok,
                              int32_t *next, struct strata_err *err);

/* strata_engine_eval whose last position's logits are reduced to their top_k largest
 * (1 <= top_k <= STRATA_SAMPLER_TOPK_MAX), best first in strata_sampler_topk's order:
 * ids [top_k] and vals [top_k], what strata_sampler_sample_topk draws from, and into
 * *lse (unless NULL) the row's log-sum-exp (strata_sampler_log_sum_exp; a token's
 * logprob is its logit minus it).  Sampling with top-k and no penalties needs no more,
 * nor do a greedy step's or a sampled one's logprob and top logprobs; on a GPU backend
 * they are found on the device and 8 top_k (+ 8) bytes come back instead of the row;
 * elsewhere the engine evaluates the row into its own buffer and computes them
 * (strata_sampler_topk), so the result is the same (the log-sum-exp up to the order of
 * its sum).  NaN logits never win; a row without a logit that is not NaN is
 * STRATA_E_GPU on the device.  Errors: those of strata_engine_eval, STRATA_E_INVALID
 * (NULL ids or outputs, top_k outside 1..STRATA_SAMPLER_TOPK_MAX or above n_vocab),
 * STRATA_E_NOMEM. */
int strata_engine_eval_topk(struct strata_engine *e, const int32_t *ids, int32_t n_tok,
                            int32_t top_k, int32_t *top_ids, float *top_vals, double *lse,
                            struct strata_err *err);

/* The same with input embeddings [n_tok, n_embd] instead of ids (image
 * tokens spliced into the prompt); history records -1 for them. */
int strata_engine_eval_embd(struct strata_engine *e, const float *embd, int32_t n_tok,
                            int logits_mode, float *logits, struct strata_err *err);

/* Roll the kv cache back to n_past positions (0 <= n_past <= current n_past).
 * Errors: STRATA_E_INVALID (n_past out of range), backend errors. */
int strata_engine_rollback(struct strata_engine *e, int32_t n_past, struct strata_err *err);

/* The backend's expert cache (lib/expert_cache.h: per-layer hit rates, PCIe bytes,
 * CPU experts) and time split since open or the last reset: returns 1 and fills *ec
 * (owned by the backend, valid until close) and *t; 0 (nothing filled) when the
 * experts are not offloaded.  _reset zeroes the counts and times. */
int strata_engine_expert_stats(struct strata_engine *e, struct strata_expert_cache **ec,
                               struct strata_ec_times *t);
void strata_engine_expert_stats_reset(struct strata_engine *e);

/* Length of the common prefix of the history and ids[0..n). */
int32_t strata_engine_common_prefix(const struct strata_engine *e, const int32_t *ids,
                                    int32_t n);

#endif
