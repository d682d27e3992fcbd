/* spec.h - speculative decoding: drafts and the verify window.
 *
 * A draft proposes up to T tokens that may follow the text so far.  The
 * target engine evaluates the last accepted token plus the drafted tokens as
 * one batch of consecutive positions (strata_engine_eval with
 * STRATA_LOGITS_ALL: the same forward path as prefill), which yields the
 * logits after every window position.  The generation loop (generate.c)
 * samples from those rows one at a time exactly as it samples after a
 * one-token decode; as long as the sampled token equals the drafted one the
 * next row is already computed, and at the first difference the kv cache is
 * rolled back past the rejected positions and the next window starts with
 * the token the sampler chose.
 *
 * Why the output is exactly that of plain decoding:
 *   - the engine computes every position's logits bitwise identically alone
 *     or inside a batch (engine.h; docs/speculative.md lists the kernels and
 *     why), so the rows of a window are the logits plain decoding would see;
 *   - greedy: accepting the longest prefix of drafts equal to the argmax is
 *     then byte-identical to plain decoding;
 *   - sampling: the drafts here are deterministic (a point mass q at the
 *     drafted token x).  Rejection sampling with such a q accepts x with
 *     probability min(1, p(x)/q(x)) = p(x) and on rejection draws from
 *     norm(max(0, p - q)) = p restricted to tokens != x.  Drawing one token
 *     from p (the sampler's full chain: penalties, top-k, top-p, min-p,
 *     temperature) and accepting when it equals x realises exactly that
 *     coupling, with the same one uniform per position that plain decoding
 *     uses - so a fixed seed gives the same tokens with and without
 *     speculation.  strata_spec_accept_reject is the general step for a
 *     draft distribution q that is not a point mass.
 *
 * Drafts:
 *   ngram  prompt lookup: the longest suffix (ngram_max down to ngram_min
 *          tokens) of the text so far that occurred before; propose what
 *          followed its latest earlier occurrence.  No extra model; strong
 *          for code edits that repeat their input.
 *   draft  a small model with the same vocabulary, run greedily through its
 *          own strata_engine (its kv cache keeps the common prefix).
 *   mtp    the target's own multi-token-prediction (nextn) layers: reported
 *          as unavailable (STRATA_E_UNSUPPORTED, naming why).
 *
 * Back-off (adaptive, the default; docs/speculative.md).  A cost model per
 * window size k (drafts): c_k, the cost of a window of k drafts in plain steps
 * (the draft's own time included; the median of the last 8 windows of that
 * size, each over the plain step's median time then), and alpha, the
 * acceptance per drafted token (geometric model, decayed, prior 1/2).  A
 * window of k drafts yields at most k + 1 tokens, on average
 * E_k = 1 + alpha + ... + alpha^k.  With M = 1.10 (the margin):
 *   - a window pays when E_k / c_k >= M; each window takes the paying k with
 *     the most tokens per plain step, else none (plain decoding), and none
 *     below an acceptance of 1/4;
 *   - k is hopeless when M * c_k >= k + 1: it cannot pay even if every draft
 *     is accepted, so it is never taken, and while every size open to
 *     exploration is hopeless there is no probe for 4096 plain steps;
 *   - exploration starts with k = 1 alone; k + 1 opens once a measured k
 *     breaks even (E_k >= c_k) at an acceptance learnt from about 5 windows
 *     or more; the newest open size is taken until it has 2
 *     timed windows, hopeless or not; the first window of each size is not
 *     timed (one-time costs), and 4 plain steps are timed before any window;
 *   - after w plain steps in a row one window probes with the best open size
 *     that is not hopeless: w = 16, doubled each time drafting stops without
 *     having paid for itself, up to 4096, and at least 400 times the draft's
 *     catch-ups (in plain steps) since drafting last paid; a probe that pays is
 *     followed by another at once while the acceptance has less evidence than
 *     growing needs; 4 steps when the draft proposed nothing (an
 *     n-gram search without a match is all such a probe costs);
 *   - after 64 drafting windows in a row one plain step re-times the plain
 *     step.
 * The draft does not run during plain steps: before a probe a draft model
 * catches up on them (propose with n_max 0), timed apart as the probe's cost.
 * With a draft model on the CPU, c_1 is timed before the generation
 * (strata_spec_create) and seeded as if explored: where it is hopeless no
 * window drafts at all.
 * The choice depends on timings; the output never does.
 */
#ifndef STRATA_SPEC_H
#define STRATA_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct strata_engine;
struct strata_gguf;
struct strata_spec_draft;

#define STRATA_SPEC_MAX 16 /* largest T */

enum strata_spec_mode {
    STRATA_SPEC_AUTO = 0, /* draft model when one is given, else n-gram */
    STRATA_SPEC_NGRAM = 1,
    STRATA_SPEC_DRAFT = 2,
    STRATA_SPEC_MTP = 3,
};

/* "auto", "ngram", "draft", "mtp" -> enum strata_spec_mode; -1 if unknown. */
int strata_spec_mode_parse(const char *name);
const char *strata_spec_mode_name(int mode);

struct strata_spec_opts {
    int n_max;                  /* T: drafted tokens per window, 0..STRATA_SPEC_MAX;
                                   0 = plain decoding (default 4) */
    int mode;                   /* enum strata_spec_mode (default AUTO) */
    struct strata_engine *draft; /* the draft model's engine (mode DRAFT/AUTO); not
                                    owned, must outlive the spec object */
    int ngram_min, ngram_max;   /* suffix lengths tried, longest first (default 2, 5) */
    int adaptive;               /* 1: back off when windows do not pay (default 1);
                                   0: always draft as much as the draft offers, up to T */
    const struct strata_spec_draft *user; /* a caller's draft, used instead of the mode's
                                             (copied; strata_spec_free calls its free) */
};

void strata_spec_opts_init(struct strata_spec_opts *o);

/* Counters since creation (or strata_spec_stats_reset).  A step is one
 * forward call of the target engine on a verify window. */
struct strata_spec_stats {
    uint64_t n_steps;    /* verify windows evaluated */
    uint64_t n_tokens;   /* tokens whose logits came from windows (1 + accepted per step) */
    uint64_t n_drafted;  /* drafted tokens sent to verification */
    uint64_t n_accepted; /* drafted tokens accepted */
    double t_draft_ms;   /* time spent drafting */
    double t_verify_ms;  /* time of the windows' forward calls */
    uint64_t n_checked;    /* a cheap draft's proposed tokens checked at plain steps */
    uint64_t n_checked_ok; /* of them, those the plain steps then produced */
};

/* ---- drafts ---- */

/* A draft proposes up to n_max tokens that follow hist[0..n_hist) (the
 * target's token history including the last accepted token; -1 marks an
 * image position).  It writes them to out and their count to *n_out (0 is
 * fine: nothing to propose).  n_max 0 asks for nothing: a draft with state
 * (a draft model's kv cache) brings it up to hist then, so the catch-up after
 * a run of plain steps is timed apart from the window that follows (the loop
 * passes the history without the accepted token then, which the window's call
 * reads, as every window's does).  Errors
 * are the draft's (engine errors of a draft model). */
struct strata_spec_draft {
    const char *name;
    void *state;
    int (*propose)(void *state, const int32_t *hist, int32_t n_hist, int32_t n_max,
                   int32_t *out, int32_t *n_out, struct strata_err *err);
    void (*free)(void *state); /* may be NULL */
    double step_ms; /* ms one drafted token costs, measured when the draft was made
                       (a draft model's single step); 0: not measured */
    /* 1: proposing costs no forward pass and depends on the history only (prompt
     * lookup), so the back-off asks it at plain steps too and checks its proposals
     * against the tokens that follow (strata_spec_backoff_evidence) instead of
     * exploring and probing with windows */
    int cheap;
};

/* Prompt lookup over hist (see above): *n_out tokens copied from after the
 * latest earlier occurrence of the longest matching suffix of ngram_max ..
 * ngram_min tokens (never -1 tokens).  Returns *n_out. */
int32_t strata_draft_ngram(const int32_t *hist, int32_t n_hist, int ngram_min, int ngram_max,
                           int32_t n_max, int32_t *out);

/* A draft backed by the n-gram lookup.  Errors: STRATA_E_INVALID (lengths
 * outside 1..64 or min > max), STRATA_E_NOMEM. */
int strata_draft_ngram_init(struct strata_spec_draft *d, int ngram_min, int ngram_max,
                            struct strata_err *err);

/* Most tokens a draft model catches up on after a run of plain steps (the
 * n_max 0 call above, before a probe of the back-off), during which it did not
 * run.  Past this its context becomes what it had seen up to where it fell behind,
 * followed by the last STRATA_SPEC_CATCHUP tokens: a probe then costs at most this
 * many positions, however long the wait before it (a full catch-up costs about 4%
 * of the wait's plain steps on an H200 with tinydraft: 6 us a token against 0.14 ms
 * a step, so doubling the wait would not make probing cheaper).  The drafts
 * depend on it, the target's output never does. */
#define STRATA_SPEC_CATCHUP 32

/* A draft backed by a model's engine (not owned).  Greedy: each drafted
 * token is the argmax after the previous one.  Its context is the target's
 * history, except that a catch-up after plain steps keeps only the last
 * STRATA_SPEC_CATCHUP tokens of the run (above), and that a draft whose kv cache
 * is full continues from at most the first half of its context and the last
 * STRATA_SPEC_CATCHUP tokens.  Another history (a new generation) is read whole.  A draft engine with an empty
 * kv cache is warmed up here (a few forward calls of the shapes drafting uses,
 * then rolled back to empty), so one-time backend costs fall at open, not on
 * the first drafting windows.  Errors: STRATA_E_INVALID (the vocabularies'
 * sizes differ: says both), STRATA_E_NOMEM, the draft engine's errors (wrapped
 * "draft model warm-up: "). */
int strata_draft_model_init(struct strata_spec_draft *d, struct strata_engine *draft,
                            const struct strata_engine *target, struct strata_err *err);

/* Multi-token prediction from the target's own nextn layers.  Always fails
 * with STRATA_E_UNSUPPORTED: with a message saying the GGUF has no
 * '<arch>.nextn_predict_layers' (or it is 0), or that it has N such layers
 * and drafting with them is not implemented. */
int strata_draft_mtp_init(struct strata_spec_draft *d, const struct strata_gguf *g,
                          struct strata_err *err);

/* ---- the verify loop ---- */

struct strata_spec;

/* Create the speculative state for target (not owned, must outlive it).
 * o NULL = defaults.  The draft follows o->mode (AUTO: draft model if
 * o->draft, else n-gram).  *out is owned by the caller (strata_spec_free).
 * On a backend other than "cpu" with n_max > 0 each window size 2..n_max + 1
 * is evaluated once past target's kv cache and rolled back (a GPU backend
 * captures a graph per size on first use); on the CPU, with the back-off on, a
 * window of one draft is timed against a plain step the same way
 * (strata_spec_backoff_seed): target's kv cache and history are left as they
 * were.  Errors: STRATA_E_INVALID (n_max outside 0..16, mode
 * DRAFT without a draft engine, mismatched vocabularies; names it),
 * STRATA_E_UNSUPPORTED (mtp), STRATA_E_NOMEM, engine errors of the warm-ups
 * (wrapped "speculative warm-up"). */
int strata_spec_create(struct strata_spec **out, struct strata_engine *target,
                       const struct strata_spec_opts *o, struct strata_err *err);
void strata_spec_free(struct strata_spec *s); /* NULL is accepted */

/* The draft in use ("ngram", "draft", "none" when n_max is 0). */
const char *strata_spec_draft_name(const struct strata_spec *s);
int strata_spec_n_max(const struct strata_spec *s);

/* Start a generation: forget any window (the caller has set up the kv cache
 * itself, e.g. after a prefill). */
void strata_spec_begin(struct strata_spec *s);

/* The loop's decode step: id is the token just accepted (it follows the
 * positions the loop has logically evaluated).  Points *logits at the
 * [n_vocab] float32 logits after id - a row of the current window when id
 * equals its next drafted token, else the first row of a new window that
 * starts with id (after rolling back rejected positions and drafting up to
 * the current window size, bounded by the free context).  *logits is valid
 * until the next call.  Errors: engine and draft errors; after one the
 * state is as after strata_spec_begin with the kv cache unchanged or rolled
 * back to the logical position. */
int strata_spec_next(struct strata_spec *s, int32_t id, const float **logits,
                     struct strata_err *err);

/* Steps whose choice needs only the top_k largest logits (1..STRATA_SAMPLER_TOPK_MAX;
 * 0: whole rows, the default) and, with lse, the row's log-sum-exp: a window without
 * drafts then asks the engine for those alone (strata_engine_eval_topk: on a GPU the
 * row stays on the device) and strata_spec_next sets *logits to NULL; the caller reads
 * them with strata_spec_topk.  Windows with drafts keep whole rows. */
void strata_spec_set_topk(struct strata_spec *s, int32_t top_k, int lse);
/* After a strata_spec_next that set *logits to NULL: the step's top_k ids and values
 * (best first) and log-sum-exp (0 unless asked for), valid until the next call. */
void strata_spec_topk(const struct strata_spec *s, const int32_t **ids, const float **vals,
                      double *lse);

/* Positions logically evaluated (the kv cache may also hold drafted
 * positions not yet decided). */
int32_t strata_spec_n_past(const struct strata_spec *s);

/* End a generation: roll the kv cache back to strata_spec_n_past, so the
 * engine's history is what plain decoding would have left.  Errors: engine
 * errors. */
int strata_spec_end(struct strata_spec *s, struct strata_err *err);

/* Counters (for --stats, --json and server metrics); st is filled. */
void strata_spec_stats_get(const struct strata_spec *s, struct strata_spec_stats *st);
void strata_spec_stats_reset(struct strata_spec *s);

/* ---- the back-off's cost model ----
 *
 * strata_spec_next drives one of these per speculative state; it is public so
 * its rule (above) can be tested with synthetic timings.  The fields are the
 * model's own: set them through these functions only. */
struct strata_spec_backoff {
    int n_max;    /* T */
    int adaptive; /* 0: every window drafts up to T */
    double t_plain;                   /* ms of a plain step (median of recent ones) */
    double cost[STRATA_SPEC_MAX + 1]; /* a window of k >= 1 drafts, in plain steps
                                         (median of recent windows) */
    double samp[STRATA_SPEC_MAX + 1][8]; /* the last 8 samples of each (a ring) */
    int n_win[STRATA_SPEC_MAX + 1];   /* timed windows of k drafts (n_win[0]: plain
                                         steps); 8..15 once the ring is full */
    unsigned char seen[STRATA_SPEC_MAX + 1]; /* a window of k drafts ran */
    double acc, rej;  /* decayed counts: drafts accepted, windows with a rejection */
    int plain_run;    /* windows chosen without drafts in a row */
    int draft_run;    /* windows chosen with drafts in a row */
    int probe_every;  /* plain steps in a row before a probe (w) */
    double probe_loss; /* plain steps drafting lost since it last paid for itself */
    double catchup;    /* plain steps of the draft's catch-ups in that time */
    double catchup_ms_est; /* ms a probe's catch-up is expected to take before one was
                              measured (a draft model's, from its step time; 0 none):
                              the first wait after drafting stopped is at least that
                              over the probes' share, as later ones are */
    int probing;      /* the window being chosen/learnt is a probe */
    int shadow;       /* acceptance also learnt from proposals checked at plain steps
                         (strata_spec_backoff_evidence): no probes */
};

/* Start a model for T = n_max (0..STRATA_SPEC_MAX) drafts; adaptive 0 makes
 * every choice n_max. */
void strata_spec_backoff_init(struct strata_spec_backoff *b, int n_max, int adaptive);

/* The most drafts (0..n_max) the next window should hold.  Call it once per
 * window and report the window's outcome with strata_spec_backoff_learn before
 * the next call: it advances the model's run and probe counters. */
int strata_spec_backoff_choose(struct strata_spec_backoff *b);

/* Seed the cost of a window of k drafts (1..n_max), in plain steps, from a
 * measurement made before the generation: it counts as that size's exploring
 * windows.  On the CPU strata_spec_create times a window of one draft (plus a draft
 * model's step, step_ms) against a plain step, so a CPU where such a window is
 * hopeless never drafts, not even to explore (whose first window would catch a
 * draft model up on the whole prompt). */
void strata_spec_backoff_seed(struct strata_spec_backoff *b, int k, double cost);

/* The window that followed the last choice held k drafts (0..n_max; fewer than
 * chosen when the draft proposed fewer), a of them were accepted (0..k; -1: the
 * generation ended inside the window, nothing learnt about acceptance), and it
 * took ms milliseconds, draft and verify together; catchup_ms is what the draft
 * spent before it catching up on the plain run (a probe's: not a window's cost,
 * but the probe's). */
void strata_spec_backoff_learn(struct strata_spec_backoff *b, int k, int a, double ms,
                               double catchup_ms);

/* Acceptance evidence without a window: a cheap draft's k proposals (1..n_max) made at
 * a plain step, of which the tokens that followed matched the first a (0..k), counted
 * as a window's drafts are (the same decayed counts).  It turns on b->shadow: from then
 * on drafting stops and resumes on this evidence, and no window probes. */
void strata_spec_backoff_evidence(struct strata_spec_backoff *b, int k, int a);

/* ---- the general rejection-sampling step ----
 *
 * Target probabilities p[n] and draft probabilities q[n] (each summing to 1),
 * the drafted token x (drawn from q), two uniforms u1, u2 in [0, 1).  Accept
 * x when u1 * q[x] < p[x] (probability min(1, p(x)/q(x))); otherwise draw
 * from norm(max(0, p - q)) by inverse CDF with u2 (p itself when that is all
 * zero).  *accepted (may be NULL) is set to 1 or 0.  The result is
 * distributed exactly as p (Leviathan et al. 2023, Chen et al. 2023). */
int32_t strata_spec_accept_reject(const float *p, const float *q, int32_t n, int32_t x,
                                  double u1, double u2, int *accepted);

#endif
