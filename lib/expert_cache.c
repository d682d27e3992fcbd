/* expert_cache.c - slot bookkeeping of the VRAM expert cache, routing
 * profiles and the memory plan (see expert_cache.h). */
#include "expert_cache.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "probe.h"

#define SCAN_ALL 1024   /* caches up to this many slots search every victim */
#define SCAN_WINDOW 256
/* prefetch_evict: the share of prefetched experts hit before eviction is a moving
 * average (step 1/32 per outcome); below PF_MIN_RATE prefetches only take slots
 * by count, and the share drifts back to 1 by PF_RECOVER per token (about 150
 * tokens from 0.2 to 0.4) so the predictor is tried again.  In the replay a
 * predictor right one time in four stays below (0.4 of its guesses hit: wrong
 * ones cost a copy each), one right half the time above (0.6). */
#define PF_STEP (1.0 / 32)
#define PF_MIN_RATE 0.4
#define PF_RECOVER 0.998

struct strata_expert_cache {
    struct strata_ec_opts o;
    int L, X, K, S;
    int first_moe;       /* lowest MoE layer: its lookups advance the clock */
    uint8_t *is_moe;     /* [L] */
    int32_t *slot_of;    /* [L * X] slot or -1 */
    double *score;       /* [L * X] decayed hit count times w (see advance) */
    double w;            /* decay^-(clock - base): the weight of a hit now */
    uint64_t base;
    uint8_t *prefetched; /* [L * X] copied by a prefetch, not yet hit */
    int32_t *s_key;      /* [S] il * X + ie, or -1 */
    uint8_t *s_state;    /* [S] enum strata_ec_slot_state */
    int32_t *s_pins;     /* [S] */
    uint64_t *s_last;    /* [S] tick of the last use (LRU) */
    uint64_t clock;      /* tokens seen */
    uint64_t tick;       /* lookups, for LRU order inside a token */
    uint64_t last_rebalance;
    double pf_rate;      /* moving share of prefetched experts hit before eviction */
    double carry;        /* pcie_frac remainder carried between batches */
    int plan_open;       /* a plan is pinned and not yet released */
    int free_cursor;     /* slots below it are all in use */
    int scan;            /* start of the next victim window (large caches) */
    int32_t *cnt;        /* [X] tokens per expert of the current batch */
    struct strata_ec_item *items; /* [X] */
    struct strata_ec_item *tmp;   /* [X] */
    struct strata_ec_layer_stats *st; /* [L] */
};

void strata_ec_opts_init(struct strata_ec_opts *o)
{
    memset(o, 0, sizeof *o);
    o->policy = STRATA_EC_LFRU;
    o->adapt_every = 32;
    o->decay = 0.995;
    o->pcie_frac = 1.0;
    o->prefetch_evict = 1;
}

void strata_ec_cfg_init(struct strata_ec_cfg *c)
{
    memset(c, 0, sizeof *c);
    c->vram_reserve_mib = 512;
    c->adapt_every = 32;
    c->pcie_frac = -1;
    c->slots = -1;
}

/* Every count decays by the same factor per token, so instead of decaying
 * all of them, a new hit weighs w = decay^-(tokens since base): the stored
 * values keep their order and eff() is one division (no per-lookup pow over
 * every slot).  When w grows large the stored values are rescaled. */
static double eff(const struct strata_expert_cache *ec, int key)
{
    return ec->score[key] / ec->w;
}

static void bump(struct strata_expert_cache *ec, int key, double by)
{
    ec->score[key] += by * ec->w;
}

static void advance(struct strata_expert_cache *ec, uint64_t n_tok)
{
    /* a predictor judged useless gets another trial after a few hundred tokens */
    ec->pf_rate = 1 - (1 - ec->pf_rate) * pow(PF_RECOVER, (double)n_tok);
    ec->clock += n_tok;
    ec->w = pow(ec->o.decay, -(double)(ec->clock - ec->base));
    if (ec->w > 1e100 || !isfinite(ec->w)) {
        double f = pow(ec->o.decay, (double)(ec->clock - ec->base));
        for (size_t k = 0; k < (size_t)ec->L * ec->X; k++)
            ec->score[k] *= f;
        ec->base = ec->clock;
        ec->w = 1;
    }
}

int strata_ec_create(struct strata_expert_cache **out, const struct strata_ec_opts *o,
                     struct strata_err *err)
{
    struct strata_expert_cache *ec = NULL;
    int rc = 0;
    *out = NULL;
    if (o->n_layer < 1 || o->n_expert < 1 || o->n_expert_used < 1 ||
        o->n_expert_used > o->n_expert)
        return strata_err_set(err, STRATA_E_INVALID,
                              "expert cache: bad shape n_layer %d n_expert %d n_expert_used %d",
                              o->n_layer, o->n_expert, o->n_expert_used);
    if (o->n_layer > 4096 || o->n_expert > 65536)
        return strata_err_set(err, STRATA_E_INVALID,
                              "expert cache: n_layer %d or n_expert %d too large", o->n_layer,
                              o->n_expert);
    if (o->policy != STRATA_EC_LFRU && o->policy != STRATA_EC_LRU)
        return strata_err_set(err, STRATA_E_INVALID, "expert cache: unknown policy %d",
                              o->policy);
    if (o->admit < STRATA_EC_ADMIT_SCORE || o->admit > STRATA_EC_ADMIT_NONE)
        return strata_err_set(err, STRATA_E_INVALID, "expert cache: unknown admission rule %d",
                              o->admit);
    if (o->prefetch_evict < 0 || o->prefetch_evict > 1)
        return strata_err_set(err, STRATA_E_INVALID, "expert cache: prefetch_evict %d is not 0 "
                              "or 1", o->prefetch_evict);
    if (o->adapt_every < 0)
        return strata_err_set(err, STRATA_E_INVALID, "adapt-every %d is negative",
                              o->adapt_every);
    if (!(o->pcie_frac >= 0 && o->pcie_frac <= 1))
        return strata_err_set(err, STRATA_E_INVALID, "pcie-frac %g outside [0, 1]",
                              o->pcie_frac);
    if (o->decay < 0 || o->decay > 1)
        return strata_err_set(err, STRATA_E_INVALID, "expert cache: decay %g outside (0, 1]",
                              o->decay);
    int n_moe = 0;
    for (int l = 0; l < o->n_layer; l++)
        n_moe += !o->is_moe || o->is_moe[l];
    if (o->n_slots < 0 || (int64_t)o->n_slots > (int64_t)n_moe * o->n_expert)
        return strata_err_set(err, STRATA_E_INVALID,
                              "expert cache: %d slots outside 0..%lld (every routed expert)",
                              o->n_slots, (long long)n_moe * o->n_expert);
    ec = calloc(1, sizeof *ec);
    if (!ec)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    ec->o = *o;
    if (ec->o.decay == 0)
        ec->o.decay = 0.995;
    ec->o.is_moe = NULL;
    ec->o.profile = NULL;
    ec->L = o->n_layer;
    ec->X = o->n_expert;
    ec->K = o->n_expert_used;
    ec->S = o->n_slots;
    size_t LX = (size_t)ec->L * ec->X, S = ec->S ? (size_t)ec->S : 1;
    ec->is_moe = calloc((size_t)ec->L, 1);
    ec->slot_of = malloc(sizeof(int32_t) * LX);
    ec->score = calloc(LX, sizeof(double));
    ec->w = 1;
    ec->pf_rate = 1;
    ec->prefetched = calloc(LX, 1);
    ec->s_key = malloc(sizeof(int32_t) * S);
    ec->s_state = calloc(S, 1);
    ec->s_pins = calloc(S, sizeof(int32_t));
    ec->s_last = calloc(S, sizeof(uint64_t));
    ec->cnt = calloc((size_t)ec->X, sizeof(int32_t));
    ec->items = calloc((size_t)ec->X, sizeof *ec->items);
    ec->tmp = calloc((size_t)ec->X, sizeof *ec->tmp);
    ec->st = calloc((size_t)ec->L, sizeof *ec->st);
    if (!ec->is_moe || !ec->slot_of || !ec->score || !ec->prefetched ||
        !ec->s_key || !ec->s_state || !ec->s_pins || !ec->s_last || !ec->cnt || !ec->items ||
        !ec->tmp || !ec->st) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    ec->first_moe = -1;
    for (int l = 0; l < ec->L; l++) {
        ec->is_moe[l] = !o->is_moe || o->is_moe[l];
        if (ec->is_moe[l] && ec->first_moe < 0)
            ec->first_moe = l;
    }
    for (size_t i = 0; i < LX; i++)
        ec->slot_of[i] = -1;
    for (size_t i = 0; i < S; i++)
        ec->s_key[i] = -1;
    if (o->profile) {
        /* counts -> routing rate per token (a layer's counts sum to K per
         * token), scaled to the steady state of the decayed count, so a
         * profile weighs like a long history and fades as routing differs */
        double horizon = ec->o.decay < 1 ? 1.0 / (1.0 - ec->o.decay) : 1000.0;
        for (int l = 0; l < ec->L; l++) {
            double sum = 0;
            for (int e = 0; e < ec->X; e++) {
                double c = o->profile[(size_t)l * ec->X + e];
                sum += c > 0 ? c : 0;
            }
            if (!ec->is_moe[l] || sum <= 0)
                continue;
            for (int e = 0; e < ec->X; e++) {
                double c = o->profile[(size_t)l * ec->X + e];
                ec->score[(size_t)l * ec->X + e] = (c > 0 ? c : 0) / sum * ec->K * horizon;
            }
        }
    }
    *out = ec;
    ec = NULL;
out:
    strata_ec_free(ec);
    return rc;
}

void strata_ec_free(struct strata_expert_cache *ec)
{
    if (!ec)
        return;
    free(ec->is_moe); free(ec->slot_of); free(ec->score);
    free(ec->prefetched); free(ec->s_key); free(ec->s_state); free(ec->s_pins);
    free(ec->s_last); free(ec->cnt); free(ec->items); free(ec->tmp); free(ec->st);
    free(ec);
}

static void assign(struct strata_expert_cache *ec, int slot, int key)
{
    int old = ec->s_key[slot];
    if (old >= 0) {
        if (ec->prefetched[old])
            ec->pf_rate -= ec->pf_rate * PF_STEP; /* evicted unused */
        ec->slot_of[old] = -1;
        ec->prefetched[old] = 0;
    }
    ec->s_key[slot] = key;
    ec->s_state[slot] = STRATA_EC_SLOT_FILLING;
    ec->s_last[slot] = ec->tick;
    ec->slot_of[key] = slot;
}

struct rank {
    double score;
    int key;
    int order; /* tie-break, lower first */
};

static int rank_desc(const void *a, const void *b)
{
    const struct rank *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    if (x->order != y->order)
        return x->order - y->order;
    return x->key - y->key;
}

int strata_ec_initial_fill(struct strata_expert_cache *ec, int max, int32_t *il, int32_t *ie,
                           int32_t *slot)
{
    int n = 0, n_moe = 0;
    if (max > ec->S)
        max = ec->S;
    for (int l = 0; l < ec->L; l++)
        n_moe += ec->is_moe[l];
    size_t LX = (size_t)ec->L * ec->X;
    struct rank *r = malloc(sizeof *r * LX);
    if (!r || max <= 0 || n_moe == 0)
        goto out;
    size_t nr = 0;
    int lm = 0; /* index among the MoE layers */
    for (int l = 0; l < ec->L; l++) {
        if (!ec->is_moe[l])
            continue;
        for (int e = 0; e < ec->X; e++) {
            /* without a profile: round-robin over layers, and each layer starts
             * at a different expert so a partial round does not favour ids 0.. */
            int rr = (e - lm * 7 % ec->X + ec->X) % ec->X;
            r[nr].key = l * ec->X + e;
            r[nr].score = eff(ec, r[nr].key);
            r[nr].order = rr * n_moe + lm;
            nr++;
        }
        lm++;
    }
    qsort(r, nr, sizeof *r, rank_desc);
    int s = 0;
    for (size_t j = 0; j < nr && n < max; j++) {
        int key = r[j].key;
        if (ec->slot_of[key] >= 0)
            continue;
        while (s < ec->S && ec->s_key[s] >= 0)
            s++;
        if (s == ec->S)
            break;
        assign(ec, s, key);
        il[n] = key / ec->X;
        ie[n] = key % ec->X;
        slot[n] = s;
        n++;
    }
out:
    free(r);
    return n;
}

/* A slot for key, or -1: a free slot first; then per policy a victim among
 * the unpinned resident slots (an in-flight slot is never reused).  by: the
 * tokens of this batch already counted in key's score (a demand miss), 0 for
 * a prefetch. */
static int admit(struct strata_expert_cache *ec, int key, int may_evict, double by)
{
    /* slots are never freed again, so a monotone cursor finds the free ones */
    while (ec->free_cursor < ec->S && ec->s_key[ec->free_cursor] >= 0)
        ec->free_cursor++;
    if (ec->free_cursor < ec->S)
        return ec->free_cursor;
    if (!may_evict || ec->S == 0)
        return -1;
    if (ec->o.policy == STRATA_EC_LFRU && by > 0 && ec->o.admit == STRATA_EC_ADMIT_NONE)
        return -1;
    /* the coldest unpinned resident slot: all of them in a small cache, else
     * a window of SCAN_WINDOW slots that moves on every call (an approximate
     * minimum, as sampled eviction does, so a miss costs O(1) at any size) */
    int n = ec->S <= SCAN_ALL ? ec->S : SCAN_WINDOW;
    int s0 = ec->S <= SCAN_ALL ? 0 : ec->scan;
    if (ec->S > SCAN_ALL)
        ec->scan = (ec->scan + SCAN_WINDOW) % ec->S;
    int best = -1;
    double best_s = 0;
    for (int i = 0; i < n; i++) {
        int s = (s0 + i) % ec->S;
        if (ec->s_pins[s] || ec->s_state[s] != STRATA_EC_SLOT_RESIDENT)
            continue;
        double v = ec->o.policy == STRATA_EC_LRU ? (double)ec->s_last[s] : ec->score[ec->s_key[s]];
        if (best < 0 || v < best_s) {
            best = s;
            best_s = v;
        }
    }
    double ks = ec->score[key];
    if (ec->o.admit == STRATA_EC_ADMIT_SEEN)
        ks -= by * ec->w;
    /* a prefetch (by 0) of a predictor that is mostly right takes the coldest
     * slot whatever its count: under pcie_frac 1 every expert that beats the
     * coldest count is resident already, so the count test alone never lets a
     * prefetch in; a wrong guess has no count and is the next victim */
    int pf_free = by == 0 && ec->o.prefetch_evict && ec->pf_rate >= PF_MIN_RATE;
    if (best >= 0 && ec->o.policy == STRATA_EC_LFRU && !pf_free && !(ks > best_s))
        return -1;
    return best;
}

static int may_evict(const struct strata_expert_cache *ec)
{
    return ec->o.policy == STRATA_EC_LRU || ec->o.adapt_every > 0;
}

static int by_tokens_desc(const void *a, const void *b)
{
    const struct strata_ec_item *x = a, *y = b;
    if (x->n_tok != y->n_tok)
        return y->n_tok - x->n_tok;
    return x->expert - y->expert;
}

int strata_ec_lookup(struct strata_expert_cache *ec, int il, int n_tok, const int32_t *sel,
                     struct strata_ec_plan *plan, struct strata_err *err)
{
    if (ec->plan_open)
        return strata_err_set(err, STRATA_E_INTERNAL,
                              "expert cache: lookup at layer %d before the previous plan was "
                              "released", il);
    if (il < 0 || il >= ec->L || !ec->is_moe[il])
        return strata_err_set(err, STRATA_E_INVALID, "expert cache: layer %d has no experts",
                              il);
    if (n_tok < 0)
        return strata_err_set(err, STRATA_E_INVALID, "expert cache: n_tok %d", n_tok);
    for (int i = 0; i < n_tok * ec->K; i++)
        if (sel[i] < 0 || sel[i] >= ec->X)
            return strata_err_set(err, STRATA_E_INVALID,
                                  "expert cache: layer %d token %d selects expert %d of %d", il,
                                  i / ec->K, sel[i], ec->X);
    memset(plan, 0, sizeof *plan);
    if (il == ec->first_moe)
        advance(ec, (uint64_t)n_tok);
    ec->tick++;
    /* distinct experts, first-seen order */
    int nd = 0;
    for (int i = 0; i < n_tok * ec->K; i++) {
        if (ec->cnt[sel[i]]++ == 0) {
            ec->tmp[nd].expert = sel[i];
            nd++;
        }
    }
    struct strata_ec_layer_stats *st = &ec->st[il];
    st->tokens += (uint64_t)n_tok;
    st->demanded += (uint64_t)nd;
    st->pairs += (uint64_t)n_tok * ec->K;
    int nh = 0, nm = 0;
    struct strata_ec_item *it = ec->items, *miss = ec->tmp;
    for (int d = 0; d < nd; d++) {
        int e = ec->tmp[d].expert, key = il * ec->X + e;
        int n = ec->cnt[e];
        ec->cnt[e] = 0;
        bump(ec, key, n);
        int s = ec->slot_of[key];
        if (s >= 0) {
            it[nh] = (struct strata_ec_item){e, s, n, STRATA_EC_HIT};
            nh++;
            ec->s_pins[s]++;
            ec->s_last[s] = ec->tick;
            st->pair_hits += (uint64_t)n;
            if (ec->prefetched[key]) {
                ec->prefetched[key] = 0;
                ec->pf_rate += (1 - ec->pf_rate) * PF_STEP;
                st->prefetch_used++;
            }
        } else {
            /* tmp is read at index d >= nm, so writing miss[nm] is safe */
            miss[nm] = (struct strata_ec_item){e, -1, n, STRATA_EC_CPU};
            nm++;
        }
    }
    st->hits += (uint64_t)nh;
    st->misses += (uint64_t)nm;
    qsort(miss, (size_t)nm, sizeof *miss, by_tokens_desc);
    double want = ec->carry + ec->o.pcie_frac * nm;
    int n_pcie = (int)floor(want + 1e-9);
    if (n_pcie > nm)
        n_pcie = nm;
    ec->carry = want - n_pcie;
    int n = nh, n_stream = 0;
    for (int i = 0; i < nm; i++) {
        struct strata_ec_item m = miss[i];
        if (i < n_pcie) {
            int key = il * ec->X + m.expert;
            int s = admit(ec, key, may_evict(ec), m.n_tok);
            if (s >= 0) {
                assign(ec, s, key);
                ec->s_pins[s]++;
                m.slot = s;
                m.where = STRATA_EC_FILL;
                plan->n_fill++;
                st->fills++;
            } else {
                m.slot = n_stream++;
                m.where = STRATA_EC_STREAM;
                plan->n_stream++;
                st->streams++;
            }
            st->pcie_bytes += ec->o.expert_bytes;
        } else {
            plan->n_cpu++;
            st->cpu++;
        }
        it[n++] = m;
    }
    /* hits, fills, streams, cpu */
    int w = nh;
    for (int pass = STRATA_EC_FILL; pass <= STRATA_EC_CPU; pass++)
        for (int i = nh; i < n; i++)
            if (it[i].where == pass)
                miss[w++ - nh] = it[i];
    memcpy(it + nh, miss, sizeof *it * (size_t)(n - nh));
    plan->layer = il;
    plan->n_items = n;
    plan->items = it;
    plan->n_hit = nh;
    plan->released = 0;
    ec->plan_open = 1;
    return 0;
}

int strata_ec_dispatch(const struct strata_expert_cache *ec, const struct strata_ec_plan *plan,
                       const struct strata_ec_ops *ops, void *ctx, struct strata_err *err)
{
    int rc = 0;
    (void)ec;
    for (int i = 0; i < plan->n_items && !rc; i++) {
        const struct strata_ec_item *m = &plan->items[i];
        if (m->where == STRATA_EC_FILL || m->where == STRATA_EC_STREAM)
            rc = ops->copy(ctx, plan->layer, m->expert, m->slot, m->where == STRATA_EC_STREAM,
                           err);
    }
    for (int i = 0; i < plan->n_items && !rc; i++) {
        const struct strata_ec_item *m = &plan->items[i];
        if (m->where == STRATA_EC_CPU)
            rc = ops->cpu(ctx, plan->layer, m->expert, m->n_tok, err);
    }
    return rc;
}

void strata_ec_set_pcie_frac(struct strata_expert_cache *ec, double pcie_frac)
{
    ec->o.pcie_frac = pcie_frac < 0 ? 0 : pcie_frac > 1 ? 1 : pcie_frac;
}

void strata_ec_set_admit(struct strata_expert_cache *ec, int admit)
{
    if (admit >= STRATA_EC_ADMIT_SCORE && admit <= STRATA_EC_ADMIT_NONE)
        ec->o.admit = admit;
}

int strata_ec_get_admit(const struct strata_expert_cache *ec)
{
    return ec->o.admit;
}

void strata_ec_release(struct strata_expert_cache *ec, struct strata_ec_plan *plan)
{
    if (plan->released)
        return;
    for (int i = 0; i < plan->n_items; i++) {
        const struct strata_ec_item *m = &plan->items[i];
        if ((m->where == STRATA_EC_HIT || m->where == STRATA_EC_FILL) && m->slot >= 0 &&
            ec->s_pins[m->slot] > 0)
            ec->s_pins[m->slot]--;
    }
    plan->released = 1;
    ec->plan_open = 0;
}

int strata_ec_fill_done(struct strata_expert_cache *ec, int slot, struct strata_err *err)
{
    if (slot < 0 || slot >= ec->S)
        return strata_err_set(err, STRATA_E_INVALID, "expert cache: slot %d outside 0..%d",
                              slot, ec->S - 1);
    if (ec->s_state[slot] != STRATA_EC_SLOT_FILLING)
        return strata_err_set(err, STRATA_E_INVALID,
                              "expert cache: slot %d finished a copy it was not waiting for",
                              slot);
    ec->s_state[slot] = STRATA_EC_SLOT_RESIDENT;
    return 0;
}

int strata_ec_rebalance(struct strata_expert_cache *ec, int max, int32_t *il, int32_t *ie,
                        int32_t *slot)
{
    if (ec->o.policy != STRATA_EC_LFRU || ec->o.adapt_every <= 0 || ec->S == 0 || max <= 0 ||
        ec->clock - ec->last_rebalance < (uint64_t)ec->o.adapt_every)
        return 0;
    ec->last_rebalance = ec->clock;
    size_t LX = (size_t)ec->L * ec->X;
    struct rank *cand = malloc(sizeof *cand * LX), *vict = malloc(sizeof *vict * (size_t)ec->S);
    int n = 0, nc = 0, nv = 0;
    if (!cand || !vict)
        goto out;
    for (size_t k = 0; k < LX; k++)
        if (ec->is_moe[k / ec->X] && ec->slot_of[k] < 0 && ec->score[k] > 0)
            cand[nc++] = (struct rank){eff(ec, (int)k), (int)k, 0};
    for (int s = 0; s < ec->S; s++)
        if (ec->s_key[s] < 0)
            vict[nv++] = (struct rank){-1, s, 0};
        else if (!ec->s_pins[s] && ec->s_state[s] == STRATA_EC_SLOT_RESIDENT)
            vict[nv++] = (struct rank){eff(ec, ec->s_key[s]), s, 0};
    qsort(cand, (size_t)nc, sizeof *cand, rank_desc);
    qsort(vict, (size_t)nv, sizeof *vict, rank_desc); /* coldest last */
    for (int i = 0; i < nc && i < nv && n < max; i++) {
        const struct rank *v = &vict[nv - 1 - i];
        if (!(cand[i].score > v->score + 1.0))
            break;
        assign(ec, v->key, cand[i].key);
        il[n] = cand[i].key / ec->X;
        ie[n] = cand[i].key % ec->X;
        slot[n] = v->key;
        ec->st[il[n]].rebalance_fills++;
        ec->st[il[n]].pcie_bytes += ec->o.expert_bytes;
        n++;
    }
out:
    free(cand);
    free(vict);
    return n;
}

int strata_ec_predict(const float *logits, int n_expert, int n_cand, int32_t *out)
{
    if (n_cand > n_expert)
        n_cand = n_expert;
    int n = 0;
    for (int e = 0; e < n_expert; e++) {
        /* insertion into the sorted top list; strict > keeps the lower id first */
        int j = n < n_cand ? n : n_cand;
        if (j == n_cand && !(logits[e] > logits[out[n_cand - 1]]))
            continue;
        if (j == n_cand)
            j--;
        while (j > 0 && logits[e] > logits[out[j - 1]]) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = e;
        if (n < n_cand)
            n++;
    }
    return n;
}

int strata_ec_prefetch(struct strata_expert_cache *ec, int il, const int32_t *cand, int n_cand,
                       int32_t *ie, int32_t *slot)
{
    int n = 0;
    if (il < 0 || il >= ec->L || !ec->is_moe[il])
        return 0;
    for (int i = 0; i < n_cand; i++) {
        if (cand[i] < 0 || cand[i] >= ec->X)
            continue;
        int key = il * ec->X + cand[i];
        if (ec->slot_of[key] >= 0)
            continue;
        int s = admit(ec, key, may_evict(ec), 0);
        if (s < 0)
            continue;
        assign(ec, s, key);
        ec->prefetched[key] = 1;
        ec->st[il].prefetches++;
        ec->st[il].pcie_bytes += ec->o.expert_bytes;
        ie[n] = cand[i];
        slot[n] = s;
        n++;
    }
    return n;
}

int strata_ec_n_slots(const struct strata_expert_cache *ec)
{
    return ec->S;
}

int strata_ec_slot_of(const struct strata_expert_cache *ec, int il, int ie, int *state)
{
    int s = -1;
    if (il >= 0 && il < ec->L && ie >= 0 && ie < ec->X)
        s = ec->slot_of[il * ec->X + ie];
    if (state)
        *state = s >= 0 ? ec->s_state[s] : STRATA_EC_SLOT_FREE;
    return s;
}

void strata_ec_slot_info(const struct strata_expert_cache *ec, int slot, int *il, int *ie,
                         int *state, int *pins)
{
    int key = slot >= 0 && slot < ec->S ? ec->s_key[slot] : -1;
    *il = key >= 0 ? key / ec->X : -1;
    *ie = key >= 0 ? key % ec->X : -1;
    *state = key >= 0 ? ec->s_state[slot] : STRATA_EC_SLOT_FREE;
    *pins = slot >= 0 && slot < ec->S ? ec->s_pins[slot] : 0;
}

const struct strata_ec_layer_stats *strata_ec_stats(const struct strata_expert_cache *ec, int il)
{
    return il >= 0 && il < ec->L ? &ec->st[il] : NULL;
}

void strata_ec_stats_reset(struct strata_expert_cache *ec)
{
    memset(ec->st, 0, sizeof *ec->st * (size_t)ec->L);
}

void strata_ec_stats_print(FILE *f, const struct strata_expert_cache *ec)
{
    struct strata_ec_layer_stats t;
    memset(&t, 0, sizeof t);
    fprintf(f, "expert cache: %d slots, %s, adapt every %d tokens, pcie_frac %.2f\n", ec->S,
            ec->o.policy == STRATA_EC_LRU ? "lru" : "lfru", ec->o.adapt_every, ec->o.pcie_frac);
    fprintf(f, "%5s %8s %8s %10s %12s %10s\n", "layer", "hit%", "pair%", "pcie MB/t",
            "cpu exp/t", "prefetch%");
    for (int l = 0; l < ec->L; l++) {
        const struct strata_ec_layer_stats *s = &ec->st[l];
        if (!ec->is_moe[l] || !s->tokens)
            continue;
        fprintf(f, "%5d %8.2f %8.2f %10.3f %12.3f %10.2f\n", l,
                100.0 * s->hits / (s->demanded ? s->demanded : 1),
                100.0 * s->pair_hits / (s->pairs ? s->pairs : 1),
                s->pcie_bytes / 1e6 / s->tokens, (double)s->cpu / s->tokens,
                100.0 * s->prefetch_used / (s->prefetches ? s->prefetches : 1));
        t.tokens += s->tokens; t.demanded += s->demanded; t.hits += s->hits;
        t.pairs += s->pairs; t.pair_hits += s->pair_hits; t.cpu += s->cpu;
        t.pcie_bytes += s->pcie_bytes;
    }
    uint64_t tok = ec->first_moe >= 0 ? ec->st[ec->first_moe].tokens : 0;
    if (!tok)
        return;
    fprintf(f, "%5s %8.2f %8.2f %10.3f %12.3f\n", "all",
            100.0 * t.hits / (t.demanded ? t.demanded : 1),
            100.0 * t.pair_hits / (t.pairs ? t.pairs : 1), t.pcie_bytes / 1e6 / tok,
            (double)t.cpu / tok);
}

struct cJSON *strata_ec_stats_json(const struct strata_expert_cache *ec,
                                   const struct strata_ec_times *t)
{
    cJSON *o = cJSON_CreateObject(), *layers = cJSON_CreateArray();
    struct strata_ec_layer_stats a;
    memset(&a, 0, sizeof a);
    if (!o || !layers)
        goto fail;
    cJSON_AddItemToObject(o, "layers", layers);
    uint64_t tok = ec->first_moe >= 0 ? ec->st[ec->first_moe].tokens : 0;
    double dt = tok ? (double)tok : 1;
    for (int l = 0; l < ec->L; l++) {
        const struct strata_ec_layer_stats *s = &ec->st[l];
        if (!ec->is_moe[l])
            continue;
        cJSON *r = cJSON_CreateObject();
        if (!r)
            goto fail;
        cJSON_AddItemToArray(layers, r);
        double lt = s->tokens ? (double)s->tokens : 1;
        if (!cJSON_AddNumberToObject(r, "layer", l) ||
            !cJSON_AddNumberToObject(r, "hit_rate",
                                     s->demanded ? (double)s->hits / s->demanded : 0) ||
            !cJSON_AddNumberToObject(r, "pair_hit_rate",
                                     s->pairs ? (double)s->pair_hits / s->pairs : 0) ||
            !cJSON_AddNumberToObject(r, "pcie_bytes_per_token", s->pcie_bytes / lt) ||
            !cJSON_AddNumberToObject(r, "cpu_experts_per_token", s->cpu / lt) ||
            !cJSON_AddNumberToObject(r, "prefetch_hit_rate",
                                     s->prefetches ? (double)s->prefetch_used / s->prefetches
                                                   : 0))
            goto fail;
        a.demanded += s->demanded;
        a.hits += s->hits;
        a.pairs += s->pairs;
        a.pair_hits += s->pair_hits;
        a.cpu += s->cpu;
        a.pcie_bytes += s->pcie_bytes;
    }
    if (!cJSON_AddNumberToObject(o, "slots", ec->S) ||
        !cJSON_AddStringToObject(o, "policy", ec->o.policy == STRATA_EC_LRU ? "lru" : "lfru") ||
        !cJSON_AddNumberToObject(o, "pcie_frac", ec->o.pcie_frac) ||
        !cJSON_AddNumberToObject(o, "tokens", (double)tok) ||
        !cJSON_AddNumberToObject(o, "hit_rate", a.demanded ? (double)a.hits / a.demanded : 0) ||
        !cJSON_AddNumberToObject(o, "pair_hit_rate",
                                 a.pairs ? (double)a.pair_hits / a.pairs : 0) ||
        !cJSON_AddNumberToObject(o, "pcie_bytes_per_token", a.pcie_bytes / dt) ||
        !cJSON_AddNumberToObject(o, "cpu_experts_per_token", a.cpu / dt))
        goto fail;
    if (t) {
        cJSON *ts = cJSON_AddObjectToObject(o, "time_s");
        double host = t->moe_s - t->gpu_s - t->cpu_s;
        if (!ts || !cJSON_AddNumberToObject(ts, "moe", t->moe_s) ||
            !cJSON_AddNumberToObject(ts, "gpu", t->gpu_s) ||
            !cJSON_AddNumberToObject(ts, "copy_wait", t->copy_wait_s) ||
            !cJSON_AddNumberToObject(ts, "cpu", t->cpu_s) ||
            !cJSON_AddNumberToObject(ts, "host", host > 0 ? host : 0) ||
            !cJSON_AddNumberToObject(o, "copies", (double)t->n_copies) ||
            !cJSON_AddNumberToObject(o, "bytes_copied", (double)t->bytes_copied) ||
            !cJSON_AddNumberToObject(o, "cpu_experts", (double)t->n_cpu_experts) ||
            !cJSON_AddNumberToObject(o, "graph_steps", (double)t->graph_steps) ||
            !cJSON_AddNumberToObject(o, "bytes_in_place", (double)t->bytes_in_place) ||
            !cJSON_AddNumberToObject(o, "graph_prefetched", (double)t->graph_prefetched) ||
            !cJSON_AddNumberToObject(o, "graph_prefetch_used", (double)t->graph_prefetch_used) ||
            !cJSON_AddNumberToObject(o, "graph_prefetch_asked", (double)t->graph_prefetch_asked))
            goto fail;
    }
    return o;
fail:
    if (o)
        cJSON_Delete(o);
    else
        cJSON_Delete(layers);
    return NULL;
}

/* ---- routing profiles ---- */

int strata_ec_profile_init(struct strata_ec_profile *p, int n_layer, int n_expert,
                           struct strata_err *err)
{
    memset(p, 0, sizeof *p);
    if (n_layer < 1 || n_expert < 1 || n_layer > 4096 || n_expert > 65536)
        return strata_err_set(err, STRATA_E_INVALID,
                              "routing profile: n_layer %d n_expert %d out of range", n_layer,
                              n_expert);
    p->counts = calloc((size_t)n_layer * n_expert, sizeof(double));
    if (!p->counts)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    p->n_layer = n_layer;
    p->n_expert = n_expert;
    return 0;
}

void strata_ec_profile_free(struct strata_ec_profile *p)
{
    free(p->counts);
    memset(p, 0, sizeof *p);
}

void strata_ec_profile_add(struct strata_ec_profile *p, int il, int n_tok, int k,
                           const int32_t *sel)
{
    if (il < 0 || il >= p->n_layer)
        return;
    /* routing goes through the layers in order: count tokens at the lowest
     * layer that routes (the first one ever added is lowest after one token) */
    int lowest = 1;
    for (int l = 0; l < il && lowest; l++)
        for (int e = 0; e < p->n_expert; e++)
            if (p->counts[(size_t)l * p->n_expert + e] > 0) {
                lowest = 0;
                break;
            }
    if (lowest)
        p->tokens += (uint64_t)n_tok;
    for (int i = 0; i < n_tok * k; i++)
        if (sel[i] >= 0 && sel[i] < p->n_expert)
            p->counts[(size_t)il * p->n_expert + sel[i]] += 1;
}

int strata_ec_profile_save(const struct strata_ec_profile *p, const char *path,
                           struct strata_err *err)
{
    int rc = 0;
    char *txt = NULL;
    FILE *f = NULL;
    cJSON *o = cJSON_CreateObject(), *rows = NULL;
    if (!o)
        goto nomem;
    if (!cJSON_AddStringToObject(o, "format", "strata-routing-profile") ||
        !cJSON_AddNumberToObject(o, "version", 1) ||
        !cJSON_AddNumberToObject(o, "n_layer", p->n_layer) ||
        !cJSON_AddNumberToObject(o, "n_expert", p->n_expert) ||
        !cJSON_AddNumberToObject(o, "tokens", (double)p->tokens) ||
        !(rows = cJSON_AddArrayToObject(o, "counts")))
        goto nomem;
    for (int l = 0; l < p->n_layer; l++) {
        cJSON *row = cJSON_CreateDoubleArray(p->counts + (size_t)l * p->n_expert, p->n_expert);
        if (!row || !cJSON_AddItemToArray(rows, row)) {
            cJSON_Delete(row);
            goto nomem;
        }
    }
    txt = cJSON_PrintUnformatted(o);
    if (!txt)
        goto nomem;
    f = fopen(path, "w");
    if (!f) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot open '%s': %s", path, strerror(errno));
        goto out;
    }
    if (fputs(txt, f) < 0 || fputc('\n', f) < 0 || fclose(f) != 0) {
        f = NULL;
        rc = strata_err_set(err, STRATA_E_IO, "cannot write '%s': %s", path, strerror(errno));
        goto out;
    }
    f = NULL;
    goto out;
nomem:
    rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
out:
    if (f)
        fclose(f);
    cJSON_free(txt);
    cJSON_Delete(o);
    return rc;
}

int strata_ec_profile_load(struct strata_ec_profile *p, const char *path, int want_layer,
                           int want_expert, struct strata_err *err)
{
    int rc = 0;
    char *buf = NULL;
    cJSON *o = NULL;
    memset(p, 0, sizeof *p);
    FILE *f = fopen(path, "rb");
    if (!f)
        return strata_err_set(err, STRATA_E_IO, "cannot open '%s': %s", path, strerror(errno));
    long sz = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        sz = ftell(f);
    if (sz < 0 || sz > (64l << 20) || fseek(f, 0, SEEK_SET) != 0) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s': not a readable file under 64 MiB",
                            path);
        goto out;
    }
    buf = malloc((size_t)sz + 1);
    if (!buf) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    if (fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot read '%s'", path);
        goto out;
    }
    buf[sz] = 0;
    o = cJSON_Parse(buf);
    if (!o) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s': not JSON", path);
        goto out;
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    const cJSON *nl = cJSON_GetObjectItemCaseSensitive(o, "n_layer");
    const cJSON *nx = cJSON_GetObjectItemCaseSensitive(o, "n_expert");
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(o, "tokens");
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(o, "counts");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "strata-routing-profile") != 0) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s': 'format' is not "
                            "\"strata-routing-profile\"", path);
        goto out;
    }
    if (!cJSON_IsNumber(nl) || !cJSON_IsNumber(nx) || !cJSON_IsArray(rows)) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s': missing 'n_layer', 'n_expert' or "
                            "'counts'", path);
        goto out;
    }
    int L = (int)nl->valuedouble, X = (int)nx->valuedouble;
    if ((want_layer > 0 && L != want_layer) || (want_expert > 0 && X != want_expert)) {
        rc = strata_err_set(err, STRATA_E_FORMAT,
                            "'%s': profile of %d layers x %d experts, the model has %d x %d",
                            path, L, X, want_layer, want_expert);
        goto out;
    }
    if ((rc = strata_ec_profile_init(p, L, X, err)))
        goto out;
    p->tokens = cJSON_IsNumber(tk) && tk->valuedouble > 0 ? (uint64_t)tk->valuedouble : 0;
    if (cJSON_GetArraySize(rows) != L) {
        rc = strata_err_set(err, STRATA_E_FORMAT, "'%s': 'counts' has %d rows, n_layer is %d",
                            path, cJSON_GetArraySize(rows), L);
        goto out;
    }
    int l = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, rows) {
        if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) != X) {
            rc = strata_err_set(err, STRATA_E_FORMAT,
                                "'%s': 'counts'[%d] is not an array of %d numbers", path, l, X);
            goto out;
        }
        int e = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, row) {
            if (!cJSON_IsNumber(c) || !(c->valuedouble >= 0)) {
                rc = strata_err_set(err, STRATA_E_FORMAT,
                                    "'%s': 'counts'[%d][%d] is not a count", path, l, e);
                goto out;
            }
            p->counts[(size_t)l * X + e] = c->valuedouble;
            e++;
        }
        l++;
    }
out:
    if (rc)
        strata_ec_profile_free(p);
    cJSON_Delete(o);
    free(buf);
    fclose(f);
    return rc;
}

int strata_ec_profile_find(struct strata_ec_profile *p, const char *dir, int want_layer,
                           int want_expert, int *found, struct strata_err *err)
{
    char path[4096];
    memset(p, 0, sizeof *p);
    *found = 0;
    if (!dir)
        return 0;
    int n = snprintf(path, sizeof path, "%s/routing-profile.json", dir);
    if (n < 0 || (size_t)n >= sizeof path)
        return strata_err_set(err, STRATA_E_INVALID, "pack directory name too long: '%s'", dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        return errno == ENOENT ? 0
                               : strata_err_set(err, STRATA_E_IO, "cannot open '%s': %s", path,
                                                strerror(errno));
    fclose(f);
    int rc = strata_ec_profile_load(p, path, want_layer, want_expert, err);
    *found = rc == 0;
    return rc;
}

/* ---- memory plan ---- */

#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * 1024.0 * 1024.0)

int strata_ec_plan_compute(const struct strata_ec_plan_in *in, struct strata_ec_mem_plan *out,
                           struct strata_err *err)
{
    memset(out, 0, sizeof *out);
    uint64_t budget;
    if (in->vram_budget > 0) {
        budget = in->vram_budget;
    } else {
        if (in->vram_reserve > in->vram_free)
            return strata_err_set(err, STRATA_E_INVALID,
                                  "vram-reserve-mib %.0f exceeds the free VRAM (%.0f MiB)",
                                  in->vram_reserve / MIB, in->vram_free / MIB);
        budget = in->vram_free - in->vram_reserve;
    }
    out->budget = budget;
    out->dense = in->dense_bytes;
    out->kv = in->kv_bytes_per_token * in->n_ctx;
    out->scratch = in->scratch_bytes;
    out->staging = in->n_experts_total ? 2ull * in->n_expert_used * in->expert_bytes : 0;
    out->n_experts_total = in->n_experts_total;
    uint64_t fixed = out->dense + out->kv + out->scratch + out->staging;
    if (fixed > budget)
        return strata_err_set(err, STRATA_E_LIMIT,
                              "VRAM budget of %.0f MiB cannot hold the dense weights (%.0f MiB), "
                              "kv cache at ctx %u (%.0f MiB), scratch (%.0f MiB) and expert "
                              "staging (%.0f MiB): %.1f MiB short",
                              budget / MIB, out->dense / MIB, in->n_ctx, out->kv / MIB,
                              out->scratch / MIB, out->staging / MIB, (fixed - budget) / MIB);
    uint64_t left = budget - fixed;
    uint64_t n = in->expert_bytes ? left / in->expert_bytes : 0;
    if (n > in->n_experts_total)
        n = in->n_experts_total;
    /* every expert fits: no staging needed */
    if (n == in->n_experts_total && out->staging) {
        left += out->staging;
        out->staging = 0;
    }
    out->n_slots = (uint32_t)n;
    out->cache = n * in->expert_bytes;
    out->unused = left - out->cache;
    out->ram_experts = (uint64_t)in->n_experts_total * in->expert_bytes;
    return 0;
}

/* bytes as GiB, or MiB below 1 GiB (small models stay readable) */
static const char *human(char *buf, size_t n, uint64_t b)
{
    if (b >= (uint64_t)GIB)
        snprintf(buf, n, "%.2f GiB", b / GIB);
    else
        snprintf(buf, n, "%.1f MiB", b / MIB);
    return buf;
}

void strata_ec_plan_print(FILE *f, const struct strata_ec_mem_plan *p)
{
    char b[32];
    fprintf(f, "memory plan: VRAM budget %s\n", human(b, sizeof b, p->budget));
    fprintf(f, "memory plan:   dense weights %12s\n", human(b, sizeof b, p->dense));
    fprintf(f, "memory plan:   kv cache      %12s\n", human(b, sizeof b, p->kv));
    fprintf(f, "memory plan:   scratch       %12s\n", human(b, sizeof b, p->scratch));
    fprintf(f, "memory plan:   staging       %12s\n", human(b, sizeof b, p->staging));
    fprintf(f, "memory plan:   expert cache  %12s (%u of %u experts, %.1f%%)\n",
            human(b, sizeof b, p->cache), p->n_slots, p->n_experts_total,
            p->n_experts_total ? 100.0 * p->n_slots / p->n_experts_total : 0.0);
    fprintf(f, "memory plan:   unused        %12s\n", human(b, sizeof b, p->unused));
    fprintf(f, "memory plan: host RAM: routed experts %s (pinned; %u not in VRAM)\n",
            human(b, sizeof b, p->ram_experts), p->n_experts_total - p->n_slots);
}

void strata_ec_fmt_loaded(char *buf, size_t n, uint64_t bytes, double seconds)
{
    snprintf(buf, n, "experts loaded: %.2f GiB at %.2f GiB/s", bytes / GIB,
             seconds > 0 ? bytes / GIB / seconds : 0.0);
}

void strata_ec_fmt_filling(char *buf, size_t n, uint32_t n_experts, uint64_t bytes)
{
    snprintf(buf, n, "filling the GPU's expert cache (%u experts, %.2f GiB of VRAM)", n_experts,
             bytes / GIB);
}

void strata_ec_fmt_probe(char *buf, size_t n, double pcie_gbs, double pcie_frac)
{
    snprintf(buf, n, "PCIe probe: %.1f GB/s host->device -> pcie_frac %.2f", pcie_gbs,
             pcie_frac);
}

int strata_ec_parse_pcie_frac(const char *s, double pcie_gbs, double cpu_gbs, double *out,
                              struct strata_err *err)
{
    if (!strcmp(s, "auto")) {
        double f = strata_probe_pcie_frac(pcie_gbs, cpu_gbs);
        *out = f < 0 ? 1.0 : f;
        return 0;
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0 && v <= 1))
        return strata_err_set(err, STRATA_E_INVALID,
                              "--pcie-frac '%s': expected auto or a number in [0, 1]", s);
    *out = v;
    return 0;
}
