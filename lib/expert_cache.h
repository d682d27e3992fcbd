/* expert_cache.h - the bookkeeping of a VRAM cache of routed experts, and the
 * memory plan that sizes it.
 *
 * A model larger than VRAM keeps its dense weights, kv cache and scratch in
 * VRAM; the routed experts live in host memory (the pack's experts.bin) and a
 * pool of n_slots VRAM slots, each one expert record (gate, up, down), holds
 * the experts the routing uses most.  This module decides, per batch and
 * layer, which experts are hits, which are copied over PCIe (into a slot, or
 * into a staging buffer when the policy does not want to keep them) and
 * which are computed by the CPU; it never touches memory itself.  The backend
 * supplies the copy and compute callbacks (struct strata_ec_ops) and reports
 * finished copies back.
 *
 * Per batch (a decode token, a prefill chunk or a verify window) and layer:
 *
 *   strata_ec_lookup(ec, il, n_tok, sel, &plan)   each distinct expert once
 *   strata_ec_dispatch(ec, &plan, ops, ctx)       copies first, then CPU work
 *   ... backend waits for its copies, calls strata_ec_fill_done(slot) ...
 *   ... GPU computes the hits and fills from their slots ...
 *   strata_ec_release(ec, &plan)                  unpins the batch's slots
 *
 * and every adapt_every tokens strata_ec_rebalance() swaps hot experts in.
 * strata_ec_predict() + strata_ec_prefetch() start copies of the next
 * layer's likely experts while the current layer computes.
 *
 * Slot states: FREE, FILLING (a copy in flight), RESIDENT.  An expert is in
 * at most one slot, so it is never both resident and in flight.  A slot used
 * by an unreleased plan is pinned and is never chosen as a victim.
 *
 * Replacement (enum strata_ec_policy):
 *   LRU  - every PCIe miss is copied into the least recently used unpinned
 *          slot (no adaptation; CPU-computed misses do not enter).
 *   LFRU - frequency with recency: each (layer, expert) keeps a hit count that
 *          decays by a factor `decay` per token (an exponentially weighted
 *          count, half-life ln 2 / -ln decay tokens).  A PCIe miss enters a
 *          slot only when a slot is free or its score beats the lowest-scored
 *          unpinned resident (opts.admit: or never, or counting only the tokens
 *          before this batch); otherwise it is streamed through staging.  Every
 *          adapt_every tokens (0 = never: the initial fill stays) the hottest
 *          non-resident experts replace colder residents (hysteresis margin).
 *          A prefetched expert takes the coldest slot whatever its count while
 *          the predictions prove right (prefetch_evict; a replay of recorded
 *          routing, docs/performance.md "Expert cache (simulated)": 74% -> 88%
 *          of the experts demanded hit with a quarter of them in VRAM and a
 *          predictor right two times in three).
 * A miss costs O(1) at any size: free slots are found by a cursor, and above
 * 1024 slots the victim is the coldest of a moving window of 256 slots (an
 * approximate minimum, as sampled eviction does) rather than of all of them.
 *
 * Not thread-safe; one cache per model and device.
 */
#ifndef STRATA_EXPERT_CACHE_H
#define STRATA_EXPERT_CACHE_H

#include <stdint.h>
#include <stdio.h>

#include "err.h"

enum strata_ec_policy {
    STRATA_EC_LFRU = 0, /* decayed frequency (default) */
    STRATA_EC_LRU = 1,
};

/* LFRU: which PCIe misses of a lookup may evict a resident expert (a free slot is
 * always taken; prefetch and re-balance follow their own rules). */
enum strata_ec_admit {
    STRATA_EC_ADMIT_SCORE = 0, /* default: its count, this batch's tokens included,
                                  beats the victim's */
    STRATA_EC_ADMIT_SEEN = 1,  /* its count before this batch beats the victim's (an
                                  expert seen for the first time is streamed) */
    STRATA_EC_ADMIT_NONE = 2,  /* never: misses are streamed, only re-balance swaps */
};

/* Where one demanded expert of a batch is computed. */
enum strata_ec_where {
    STRATA_EC_HIT = 0,    /* resident (or already in flight) in slot */
    STRATA_EC_FILL = 1,   /* copy over PCIe into slot, then compute on the GPU */
    STRATA_EC_STREAM = 2, /* copy over PCIe into staging buffer `slot`, not kept */
    STRATA_EC_CPU = 3,    /* the CPU worker pool computes it from host memory */
};

enum strata_ec_slot_state {
    STRATA_EC_SLOT_FREE = 0,
    STRATA_EC_SLOT_FILLING = 1,
    STRATA_EC_SLOT_RESIDENT = 2,
};

struct strata_ec_opts {
    int n_layer;               /* layers of the model */
    int n_expert;              /* routed experts per layer (GGUF expert_count) */
    int n_expert_used;         /* experts per token (GGUF expert_used_count) */
    const uint8_t *is_moe;     /* [n_layer] 1 = layer has routed experts; NULL = all */
    int n_slots;               /* VRAM slots, 0 .. n_moe_layers * n_expert */
    uint64_t expert_bytes;     /* bytes of one expert record (all parts) */
    int policy;                /* enum strata_ec_policy */
    int adapt_every;           /* LFRU: tokens between re-balances; 0 = static */
    double decay;              /* LFRU: per-token factor of the counts, (0, 1]; 0 = 0.995 */
    double pcie_frac;          /* share of the missed experts copied over PCIe, [0, 1] */
    int admit;                 /* LFRU: enum strata_ec_admit (default SCORE) */
    int prefetch_evict;        /* LFRU: 1 (default) a prefetch takes the coldest unpinned
                                  slot whatever the counts while at least 40% of the
                                  recent prefetches were hit; 0: only a slot whose count
                                  is below the predicted expert's */
    const double *profile;     /* [n_layer * n_expert] routing counts for the initial
                                  fill and scores, or NULL (spread evenly) */
};

/* Fill o with the defaults (LFRU, adapt_every 32, decay 0.995, pcie_frac 1,
 * admit SCORE, prefetch_evict 1). */
void strata_ec_opts_init(struct strata_ec_opts *o);

/* One demanded expert of a batch. */
struct strata_ec_item {
    int32_t expert;   /* expert id in the layer */
    int32_t slot;     /* HIT/FILL: cache slot; CPU: -1; STREAM: the ordinal of the
                         stream in this plan (0, 1, ...): a prefill batch may stream
                         more experts than the plan's 2 * n_expert_used staging
                         buffers, so the backend cycles them (slot % its count),
                         reusing a buffer once its expert's compute is done */
    int32_t n_tok;    /* tokens of the batch routed to it */
    int32_t where;    /* enum strata_ec_where */
};

/* The result of one lookup; owned by the caller, filled by strata_ec_lookup
 * (items points into storage owned by the cache, valid until the next lookup
 * of any layer or strata_ec_free). */
struct strata_ec_plan {
    int layer;
    int n_items;
    struct strata_ec_item *items; /* [n_items] distinct experts, hits first */
    int n_hit, n_fill, n_stream, n_cpu;
    int released;
};

/* Per-layer statistics (cumulative since create or strata_ec_stats_reset). */
struct strata_ec_layer_stats {
    uint64_t tokens;        /* tokens that went through the layer */
    uint64_t demanded;      /* distinct experts demanded, summed over batches */
    uint64_t hits, misses;  /* hits + misses == demanded */
    uint64_t pair_hits, pairs; /* (token, expert) pairs served from VRAM / all pairs */
    uint64_t fills, streams, cpu; /* misses by path: fills + streams + cpu == misses */
    uint64_t prefetches, prefetch_used; /* prefetch copies, and those later hit */
    uint64_t rebalance_fills;
    uint64_t pcie_bytes;    /* fills, streams, prefetches and re-balance copies */
};

/* Callbacks of the backend.  Return 0 or an error code with err filled. */
struct strata_ec_ops {
    /* Start an asynchronous copy of expert (il, ie)'s record into VRAM slot
     * `slot` (staging = 0) or staging buffer `slot` (staging = 1).  The
     * backend calls strata_ec_fill_done() for a slot when the copy completed. */
    int (*copy)(void *ctx, int il, int ie, int slot, int staging, struct strata_err *err);
    /* Compute expert (il, ie) on the CPU for the n_tok tokens routed to it. */
    int (*cpu)(void *ctx, int il, int ie, int n_tok, struct strata_err *err);
};

/* The expert cache's options as a GPU backend reads them from
 * strata_engine_opts.backend_cfg (strata-generate sets them from
 * --vram-budget-mib, --vram-reserve-mib, --adapt-every, --pcie-frac,
 * --pool-workers, --stats). */
struct strata_ec_cfg {
    int vram_budget_mib;  /* > 0: plan for this much VRAM; 0: free - reserve */
    int vram_reserve_mib; /* default 512 */
    int adapt_every;      /* default 32; 0 = static */
    double pcie_frac;     /* [0, 1], or < 0 = auto (the probe's bandwidths) */
    int pool_workers;     /* CPU expert threads; 0 = the engine's threads */
    int stats;            /* print strata_ec_stats_print() at the end */
    int slots;            /* >= 0: exactly this many expert slots (at most every
                             expert), the offload path even when every expert would
                             fit (tests, benchmarks); -1 (default): the memory plan */
    int prefetch;         /* 1: host-planned decode steps predict the next MoE layer's
                             experts (its router on this layer's input) and copy the
                             missing ones ahead; 0 (default): the copies would share
                             PCIe with the demand misses, and on the 12-layer synthetic
                             Qwen3-30B-A3B with 25% of the experts in VRAM they cost
                             more than the 37-45% of them later hit saved
                             (docs/performance.md) */
    int staging;          /* > 0: exactly this many staging buffers (tests: a batch that
                             streams more experts cycles them in rounds); 0: the plan's */
};

/* Fill c with the defaults above (pcie_frac auto). */
void strata_ec_cfg_init(struct strata_ec_cfg *c);

struct strata_expert_cache;

/* Create a cache and do its initial fill plan (slots start FREE; the fills to
 * issue come from strata_ec_initial_fill).  Errors: STRATA_E_INVALID (a field
 * of o out of range: named), STRATA_E_NOMEM. */
int strata_ec_create(struct strata_expert_cache **out, const struct strata_ec_opts *o,
                     struct strata_err *err);
/* NULL is accepted. */
void strata_ec_free(struct strata_expert_cache *ec);

/* The initial fill: assigns up to max (<= n_slots) experts to slots, the
 * highest profile counts first, or spread evenly over the MoE layers and the
 * experts (round-robin over layers, expert ids staggered per layer) without a
 * profile.  Writes the (layer, expert, slot) triples to il[], ie[], slot[]
 * (each [max]) and returns how many; those slots are FILLING until
 * strata_ec_fill_done(). */
int strata_ec_initial_fill(struct strata_expert_cache *ec, int max, int32_t *il, int32_t *ie,
                           int32_t *slot);

/* Look up the experts of a batch of n_tok tokens at layer il: sel is
 * [n_tok, n_expert_used] expert ids (the router's top-k per token).  Each
 * distinct expert appears once in plan->items, whatever n_tok.  Misses are
 * split by pcie_frac (the experts with the most tokens go over PCIe first: a
 * copy costs the same for any token count, CPU work grows with it); PCIe misses
 * take a slot per the policy, else a staging buffer.  Slots of HIT and FILL
 * items are pinned until strata_ec_release(plan).  A previous plan must have
 * been released.  Errors: STRATA_E_INVALID (il not a MoE layer, an id out of
 * range: named; nothing changed), STRATA_E_INTERNAL (a plan not released). */
int strata_ec_lookup(struct strata_expert_cache *ec, int il, int n_tok, const int32_t *sel,
                     struct strata_ec_plan *plan, struct strata_err *err);

/* Call ops->copy for every FILL and STREAM item, then ops->cpu for every CPU
 * item (so the copies overlap the CPU work).  Returns the first error. */
int strata_ec_dispatch(const struct strata_expert_cache *ec, const struct strata_ec_plan *plan,
                       const struct strata_ec_ops *ops, void *ctx, struct strata_err *err);

/* Change the share of missed experts copied over PCIe (in [0, 1]; clipped)
 * for the following lookups, e.g. per batch size. */
void strata_ec_set_pcie_frac(struct strata_expert_cache *ec, double pcie_frac);

/* Change the admission rule of LFRU demand misses (enum strata_ec_admit; another
 * value is ignored) for the following lookups, e.g. none for prefill chunks, whose
 * many experts would evict the ones decode uses; get returns the rule in force. */
void strata_ec_set_admit(struct strata_expert_cache *ec, int admit);
int strata_ec_get_admit(const struct strata_expert_cache *ec);
/* Unpin the plan's slots.  Twice is a no-op. */
void strata_ec_release(struct strata_expert_cache *ec, struct strata_ec_plan *plan);

/* A copy into slot finished: FILLING -> RESIDENT.  Errors: STRATA_E_INVALID
 * (slot out of range or not FILLING). */
int strata_ec_fill_done(struct strata_expert_cache *ec, int slot, struct strata_err *err);

/* Tokens seen so far; LFRU re-balance: if adapt_every > 0 and at least
 * adapt_every tokens passed since the last one, choose up to max swaps of a
 * hotter non-resident expert into the slot of a colder unpinned resident one
 * (its score below the candidate's by more than 1 decayed hit) and write the
 * (layer, expert, slot) copies to issue; the slots become FILLING.  Returns
 * how many (0 for LRU or when not due). */
int strata_ec_rebalance(struct strata_expert_cache *ec, int max, int32_t *il, int32_t *ie,
                        int32_t *slot);

/* The n_cand experts with the highest router logits ([n_expert] of the next
 * layer applied to the current hidden state), highest first (lower id on
 * ties), written to out[n_cand].  Returns n_cand clipped to n_expert. */
int strata_ec_predict(const float *logits, int n_expert, int n_cand, int32_t *out);

/* Prefetch: for each candidate of layer il not resident or in flight, take a
 * slot when the policy would admit it (a free slot; LRU - the least recently
 * used unpinned slot; LFRU - the coldest unpinned slot, with prefetch_evict
 * while at least 40% of the recent prefetches were hit before eviction, else
 * only one colder than the candidate), and write the copies to issue to ie[] /
 * slot[] (each [n_cand]).  Returns how many. */
int strata_ec_prefetch(struct strata_expert_cache *ec, int il, const int32_t *cand, int n_cand,
                       int32_t *ie, int32_t *slot);

/* Introspection for tests and statistics. */
int strata_ec_n_slots(const struct strata_expert_cache *ec);
/* Slot of (il, ie), or -1; *state gets its enum strata_ec_slot_state. */
int strata_ec_slot_of(const struct strata_expert_cache *ec, int il, int ie, int *state);
/* What slot holds: layer and expert (-1 when free), its state and pin count. */
void strata_ec_slot_info(const struct strata_expert_cache *ec, int slot, int *il, int *ie,
                         int *state, int *pins);
const struct strata_ec_layer_stats *strata_ec_stats(const struct strata_expert_cache *ec,
                                                    int il);
void strata_ec_stats_reset(struct strata_expert_cache *ec);

/* What the backend measured around the cache (GPU backend). */
struct strata_ec_times {
    double moe_s;       /* wall time in the routed-expert step of the MoE layers */
    double gpu_s;       /* of which waiting for the GPU's forward pass up to each routing */
    double copy_wait_s; /* GPU time the compute stream waited for expert copies */
    double cpu_s;       /* of which computing CPU experts */
    uint64_t bytes_copied, n_copies, n_cpu_experts;
    /* decode steps run as graphs (their time is in none of the above: no host work
     * inside them) and the expert bytes their kernels read in place over PCIe */
    uint64_t graph_steps, bytes_in_place;
    /* experts the graph steps prefetched for their next MoE layer (a side stream,
     * during the layer before; STRATA_EC_GRAPH_PREFETCH), how many of them that layer
     * then used, and how many of its routed experts had been asked for (used, or not
     * yet complete when the layer needed them) */
    uint64_t graph_prefetched, graph_prefetch_used, graph_prefetch_asked;
};

struct cJSON;
/* The statistics as a JSON object (cJSON, caller frees): slots, policy, tokens,
 * hit_rate and pair_hit_rate (0..1), pcie_bytes_per_token, cpu_experts_per_token,
 * "layers": [{layer, hit_rate, pair_hit_rate, pcie_bytes_per_token,
 * cpu_experts_per_token, prefetch_hit_rate}], and with t the "time_s" split {moe,
 * gpu, copy_wait, cpu, host}, copies, bytes_copied, cpu_experts, graph_steps,
 * bytes_in_place, graph_prefetched and graph_prefetch_used.  NULL when out of memory. */
struct cJSON *strata_ec_stats_json(const struct strata_expert_cache *ec,
                                   const struct strata_ec_times *t);
/* Print per-layer hit rate, bytes over PCIe per token and CPU experts per
 * token, then the totals, to f. */
void strata_ec_stats_print(FILE *f, const struct strata_expert_cache *ec);

/* ---- routing profiles ----
 *
 * A routing profile counts how often each (layer, expert) was routed, so a
 * new run can fill the cache with the experts that matter before the first
 * token.  File format (routing-profile.json in the pack directory):
 *   {"format": "strata-routing-profile", "version": 1,
 *    "n_layer": L, "n_expert": X, "tokens": N,
 *    "counts": [[c_0_0, ..., c_0_{X-1}], ..., [c_{L-1}_0, ...]]}
 * counts[l][e] = tokens routed to expert e at layer l (0 rows for dense layers). */
struct strata_ec_profile {
    int n_layer, n_expert;
    uint64_t tokens;
    double *counts; /* [n_layer * n_expert], malloc'ed */
};

/* Allocate an empty profile.  Errors: STRATA_E_INVALID, STRATA_E_NOMEM. */
int strata_ec_profile_init(struct strata_ec_profile *p, int n_layer, int n_expert,
                           struct strata_err *err);
void strata_ec_profile_free(struct strata_ec_profile *p);
/* Count a layer's routing: sel [n_tok, k] expert ids (ids out of range are
 * ignored).  p->tokens grows by n_tok when no lower layer has counts yet
 * (the first routed layer: layers are added in order). */
void strata_ec_profile_add(struct strata_ec_profile *p, int il, int n_tok, int k,
                           const int32_t *sel);
/* Write / read the JSON above.  Errors: STRATA_E_IO (names the path),
 * STRATA_E_FORMAT (names the field), STRATA_E_NOMEM.  Reading checks that
 * n_layer/n_expert match want_layer/want_expert when those are > 0. */
int strata_ec_profile_save(const struct strata_ec_profile *p, const char *path,
                           struct strata_err *err);
int strata_ec_profile_load(struct strata_ec_profile *p, const char *path, int want_layer,
                           int want_expert, struct strata_err *err);

/* The pack's profile: dir/routing-profile.json.  *found = 0 (and 0
 * returned, p empty) when the pack has none or dir is NULL (a bare GGUF);
 * other errors as strata_ec_profile_load. */
int strata_ec_profile_find(struct strata_ec_profile *p, const char *dir, int want_layer,
                           int want_expert, int *found, struct strata_err *err);

/* ---- memory plan ----
 *
 * VRAM budget = vram_budget (when > 0, to emulate a smaller card) else
 * vram_free - vram_reserve.  From it come, in order: dense weights, the kv
 * cache at n_ctx (kv_bytes_per_token * n_ctx), scratch, staging (2 *
 * n_expert_used expert records: one layer's misses, double-buffered), and the
 * rest, in whole expert records, is the expert cache (at most every expert).
 * The experts stay in host RAM (pinned) either way: the cache is a copy. */
struct strata_ec_plan_in {
    uint64_t dense_bytes, expert_bytes /* one record */, kv_bytes_per_token, scratch_bytes;
    uint32_t n_ctx, n_experts_total /* routed experts of all layers */, n_expert_used;
    uint64_t vram_free, vram_reserve, vram_budget; /* bytes; budget 0 = free - reserve */
};

struct strata_ec_mem_plan {
    uint64_t budget, dense, kv, scratch, staging, cache;
    uint32_t n_slots, n_experts_total;
    uint64_t ram_experts; /* expert bytes kept in host RAM */
    uint64_t unused;      /* budget left after everything */
};

/* Compute the plan.  Errors: STRATA_E_LIMIT when the budget cannot hold the
 * dense weights, kv cache, scratch and staging (says by how many MiB),
 * STRATA_E_INVALID (reserve above free VRAM). */
int strata_ec_plan_compute(const struct strata_ec_plan_in *in, struct strata_ec_mem_plan *out,
                           struct strata_err *err);
/* Print the plan as lines `memory plan: ...` to f. */
void strata_ec_plan_print(FILE *f, const struct strata_ec_mem_plan *p);

/* The load-time log lines, written to buf (NUL-terminated, truncated to n):
 *   experts loaded: X GiB at Y GiB/s
 *   filling the GPU's expert cache (N experts, M GiB of VRAM)
 *   PCIe probe: X GB/s host->device -> pcie_frac F */
void strata_ec_fmt_loaded(char *buf, size_t n, uint64_t bytes, double seconds);
void strata_ec_fmt_filling(char *buf, size_t n, uint32_t n_experts, uint64_t bytes);
void strata_ec_fmt_probe(char *buf, size_t n, double pcie_gbs, double pcie_frac);

/* --pcie-frac: "auto" takes strata_probe_pcie_frac(pcie_gbs, cpu_gbs) (1 when
 * either bandwidth is unknown: no CPU share without a measurement), or a
 * number in [0, 1].  Errors: STRATA_E_INVALID naming the value. */
int strata_ec_parse_pcie_frac(const char *s, double pcie_gbs, double cpu_gbs, double *out,
                              struct strata_err *err);

#endif
