/* bench_ec_replay - hit rates of expert-cache replacement, admission and prefetch
 * rules on recorded routing, with two bounds (a static oracle and Belady's MIN).
 *
 *   bench_ec_replay --record FILE [--layers N] [--tokens N] [--prompt N] [--skip N] [-t N]
 *       builds the synthetic Qwen3-30B-A3B shape (lib/synth.h, Q4_K_M, seed 42, as
 *       tests/gpu/bench_offload.c), evaluates a prompt of N uniformly random token ids
 *       as one batch (bench_offload's warm-up), rolls the kv cache back and decodes
 *       --tokens more random ids one at a time on the CPU engine, and writes the
 *       routing it recorded (strata_engine_opts.route_trace) to FILE.  The ids come
 *       from bench_offload's generator and seed; --skip N draws N first (the ids of a
 *       later bench_offload configuration).
 *   bench_ec_replay [--tg N] [--budgets 25,50] [--fracs 1,0.5]
 *                   [--prefetch none|prev|next|ACC] [--fills-done layer|token] FILE...
 *       replays each FILE through lib/expert_cache.c in the GPU backend's order
 *       (kernels/backend_experts.cu strata_gpu_ec_moe: copies of the previous layer
 *       done, re-balance at the first MoE layer, lookup, dispatch, prefetch of the next
 *       layer, release) for each budget (% of the routed experts), pcie_frac and policy,
 *       and prints a table of the decode hit rate (hits / distinct experts demanded
 *       over the decode steps, the first --tg of them when given; the mean over the
 *       files) with the PCIe copies per decode token.  --prefetch ACC: each predicted
 *       candidate is the expert the token takes at the next layer with probability ACC,
 *       else the one the token before took there (prev = 0, next = 1).
 *
 * Trace file (text): "strata-route-trace 1 n_layer n_expert n_expert_used" then one
 * line per MoE layer and batch: "il n_tok e_0 ... e_{n_tok*k-1}". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "err.h"
#include "expert_cache.h"
#include "gguf.h"
#include "log.h"
#include "model.h"
#include "synth.h"

#include "bench_ids.h"

/* ---- traces ---- */

struct trace {
    int L, X, K;
    int n, cap;              /* records */
    int32_t *il, *n_tok, *off;
    int32_t *sel;
    size_t n_sel, cap_sel;
};

static int trace_push(struct trace *t, int il, int n_tok, const int32_t *sel)
{
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 1024;
        int32_t *a = realloc(t->il, sizeof(int32_t) * cap);
        if (a)
            t->il = a;
        int32_t *b = realloc(t->n_tok, sizeof(int32_t) * cap);
        if (b)
            t->n_tok = b;
        int32_t *c = realloc(t->off, sizeof(int32_t) * cap);
        if (c)
            t->off = c;
        if (!a || !b || !c)
            return -1;
        t->cap = cap;
    }
    size_t need = (size_t)n_tok * t->K;
    while (t->n_sel + need > t->cap_sel) {
        size_t cap = t->cap_sel ? 2 * t->cap_sel : 65536;
        int32_t *s = realloc(t->sel, sizeof(int32_t) * cap);
        if (!s)
            return -1;
        t->sel = s;
        t->cap_sel = cap;
    }
    t->il[t->n] = il;
    t->n_tok[t->n] = n_tok;
    t->off[t->n] = (int32_t)t->n_sel;
    memcpy(t->sel + t->n_sel, sel, sizeof(int32_t) * need);
    t->n_sel += need;
    t->n++;
    return 0;
}

static void trace_free(struct trace *t)
{
    free(t->il); free(t->n_tok); free(t->off); free(t->sel);
    memset(t, 0, sizeof *t);
}

struct rec_ctx {
    struct trace *t;
    int failed;
};

static void on_route(void *ctx, int il, int32_t pos0, int n_tok, int k, const int32_t *sel)
{
    struct rec_ctx *c = ctx;
    (void)pos0;
    if (k != c->t->K || trace_push(c->t, il, n_tok, sel))
        c->failed = 1;
}

static int trace_save(const struct trace *t, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return -1;
    }
    fprintf(f, "strata-route-trace 1 %d %d %d\n", t->L, t->X, t->K);
    for (int r = 0; r < t->n; r++) {
        fprintf(f, "%d %d", t->il[r], t->n_tok[r]);
        for (int i = 0; i < t->n_tok[r] * t->K; i++)
            fprintf(f, " %d", t->sel[t->off[r] + i]);
        fputc('\n', f);
    }
    if (fclose(f) != 0) {
        perror(path);
        return -1;
    }
    return 0;
}

static int trace_load(struct trace *t, const char *path)
{
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        return -1;
    }
    int v = 0, rc = -1;
    int32_t *sel = NULL;
    if (fscanf(f, "strata-route-trace %d %d %d %d", &v, &t->L, &t->X, &t->K) != 4 || v != 1 ||
        t->L < 1 || t->X < 1 || t->K < 1 || t->K > t->X || t->X > 65536) {
        fprintf(stderr, "bench_ec_replay: '%s': not a routing trace\n", path);
        goto out;
    }
    int il, n_tok;
    while (fscanf(f, "%d %d", &il, &n_tok) == 2) {
        if (il < 0 || il >= t->L || n_tok < 1 || n_tok > 1 << 16) {
            fprintf(stderr, "bench_ec_replay: '%s': record %d: layer %d, %d tokens\n", path,
                    t->n, il, n_tok);
            goto out;
        }
        int32_t *s = realloc(sel, sizeof(int32_t) * (size_t)n_tok * t->K);
        if (!s)
            goto out;
        sel = s;
        for (int i = 0; i < n_tok * t->K; i++)
            if (fscanf(f, "%d", &sel[i]) != 1 || sel[i] < 0 || sel[i] >= t->X) {
                fprintf(stderr, "bench_ec_replay: '%s': record %d: bad expert id\n", path,
                        t->n);
                goto out;
            }
        if (trace_push(t, il, n_tok, sel))
            goto out;
    }
    rc = t->n > 0 ? 0 : -1;
    if (rc)
        fprintf(stderr, "bench_ec_replay: '%s': no records\n", path);
out:
    free(sel);
    fclose(f);
    if (rc)
        trace_free(t);
    return rc;
}

static int record(const char *path, int layers, int n_prompt, int n_tok, int n_threads,
                  long skip)
{
    struct strata_err err = {0, ""};
    struct strata_synth_opts so = {"qwen3-30b-a3b", layers, "Q4_K_M", 42};
    void *buf = NULL;
    size_t size = 0;
    struct strata_gguf *g = NULL;
    struct strata_engine *e = NULL;
    struct trace t = {0};
    struct rec_ctx rc_ctx = {&t, 0};
    int32_t *ids = NULL;
    double t0 = bench_now();
    int rc = strata_synth_build(&so, &buf, &size, &err);
    if (!rc)
        rc = strata_gguf_open_mem(&g, buf, size, so.shape, &err);
    if (rc)
        goto out;
    fprintf(stderr, "synthetic %s, %d layers, %s: %.2f GB built in %.1f s\n", so.shape,
            layers, so.ftype, size / 1e9, bench_now() - t0);
    struct strata_engine_opts o;
    strata_engine_opts_init(&o);
    o.n_threads = n_threads;
    o.n_ctx = (n_prompt > n_tok ? n_prompt : n_tok) + 16;
    o.n_prefill = n_prompt > 0 ? n_prompt : 1;
    o.route_trace = on_route;
    o.route_trace_ctx = &rc_ctx;
    if ((rc = strata_engine_open_gguf(&e, g, &o, &err)))
        goto out;
    const struct strata_model *m = strata_engine_model(e);
    t.L = (int)m->hp.n_layer;
    t.X = (int)m->hp.n_expert;
    t.K = (int)m->hp.n_expert_used;
    int nv = strata_engine_n_vocab(e);
    int n_ids = n_prompt > n_tok ? n_prompt : n_tok;
    ids = malloc(sizeof(int32_t) * (size_t)(n_ids > 0 ? n_ids : 1));
    if (!ids) {
        rc = strata_err_set(&err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    for (long i = 0; i < skip; i++)
        (void)bench_rnd_below(nv);
    for (int i = 0; i < n_prompt; i++)
        ids[i] = bench_rnd_below(nv);
    t0 = bench_now();
    if (n_prompt > 0 &&
        ((rc = strata_engine_eval(e, ids, n_prompt, STRATA_LOGITS_NONE, NULL, &err)) ||
         (rc = strata_engine_rollback(e, 0, &err))))
        goto out;
    fprintf(stderr, "prompt of %d tokens: %.1f s\n", n_prompt, bench_now() - t0);
    for (int i = 0; i < n_tok; i++)
        ids[i] = bench_rnd_below(nv);
    t0 = bench_now();
    for (int i = 0; i < n_tok && !rc; i++) {
        rc = strata_engine_eval(e, ids + i, 1, STRATA_LOGITS_NONE, NULL, &err);
        if (i == 0 || (i + 1) % 32 == 0)
            fprintf(stderr, "decoded %d tokens: %.2f s/token\n", i + 1, (bench_now() - t0) / (i + 1));
    }
    if (rc)
        goto out;
    if (rc_ctx.failed) {
        rc = strata_err_set(&err, STRATA_E_NOMEM, "out of memory recording the routing");
        goto out;
    }
    if (trace_save(&t, path))
        rc = STRATA_E_IO;
    else
        fprintf(stderr, "%d routing records (%d layers, top-%d of %d) written to %s\n", t.n,
                t.L, t.K, t.X, path);
out:
    if (rc && err.msg[0])
        fprintf(stderr, "bench_ec_replay: %s\n", err.msg);
    free(ids);
    strata_engine_close(e);
    strata_gguf_close(g);
    free(buf);
    trace_free(&t);
    return rc ? 1 : 0;
}

/* ---- replay through the cache ---- */

#define MATVEC_MAX 17 /* kernels/backend.cu: larger batches copy every miss */

/* Prefetch prediction: none (< 0), or each of the next layer's K candidates is the
 * expert the token will take there with probability acc, else the one the token
 * before took in that place (acc 0: "prev", 1: "next", a perfect predictor). */
#define PF_NONE (-1.0)

struct variant {
    const char *name;
    int policy, adapt_every;
    double decay;
    int admit; /* enum strata_ec_admit */
    int prefetch_evict;
};

/* MoE layers of a trace: the distinct layers of its first records */
static int n_moe_of(const struct trace *t)
{
    int n = 0;
    for (int l = 0; l < t->L; l++)
        for (int r = 0; r < t->n && r < 4 * t->L; r++)
            if (t->il[r] == l) {
                n++;
                break;
            }
    return n ? n : 1;
}

struct window {
    int r0, r1; /* records [r0, r1) are measured */
};

/* The GPU backend's order per MoE layer and batch (strata_gpu_ec_moe): the copies
 * of the previous layer are done, re-balance at the first MoE layer (2 K copies at
 * most), lookup with pcie_frac 1 for mat-mat batches, dispatch, prefetch of the next
 * layer's predicted experts (decode only), release.  fill_late: copies complete at
 * the next token's first MoE layer rather than at the next layer (the backend marks
 * them done only when the copy stream's last event passed, and the prefetch re-records
 * it after every layer but the last).  Returns the hit rate over the window's records,
 * or -1 on an error. */
static double replay(const struct trace *t, const struct variant *v, int n_slots, double frac,
                     double pf, int fill_late, const struct window *w, double *copies)
{
    struct strata_err err = {0, ""};
    struct strata_ec_opts o;
    struct strata_expert_cache *ec = NULL;
    strata_ec_opts_init(&o);
    o.n_layer = t->L;
    o.n_expert = t->X;
    o.n_expert_used = t->K;
    o.n_slots = n_slots;
    o.expert_bytes = 1;
    o.policy = v->policy;
    o.adapt_every = v->adapt_every;
    o.decay = v->decay;
    o.admit = v->admit;
    o.prefetch_evict = v->prefetch_evict;
    o.pcie_frac = frac;
    size_t LX = (size_t)t->L * t->X;
    int32_t *fl = malloc(sizeof(int32_t) * 3 * (LX + 1));
    int32_t *pend = malloc(sizeof(int32_t) * (LX + 1));
    int n_pend = 0, first = t->il[0];
    uint64_t dem = 0, hit = 0, n_copy = 0, x = 0x9e3779b97f4a7c15ull;
    double rate = -1;
    if (!fl || !pend || strata_ec_create(&ec, &o, &err))
        goto out;
    for (int r = 0; r < t->n; r++)
        first = t->il[r] < first ? t->il[r] : first;
    int n = strata_ec_initial_fill(ec, n_slots, fl, fl + LX, fl + 2 * LX);
    for (int i = 0; i < n; i++)
        if (strata_ec_fill_done(ec, fl[2 * LX + i], &err))
            goto out;
    for (int r = 0; r < w->r1; r++) {
        int il = t->il[r], nt = t->n_tok[r];
        for (int i = 0; i < n_pend && (!fill_late || il == first); i++)
            if (strata_ec_fill_done(ec, pend[i], &err))
                goto out;
        if (!fill_late || il == first)
            n_pend = 0;
        if (il == first) {
            int max = 2 * t->K < 64 ? 2 * t->K : 64;
            int nr = strata_ec_rebalance(ec, max, fl, fl + max, fl + 2 * max);
            for (int i = 0; i < nr; i++)
                pend[n_pend++] = fl[2 * max + i];
            if (r >= w->r0)
                n_copy += (uint64_t)nr;
        }
        strata_ec_set_pcie_frac(ec, nt > MATVEC_MAX ? 1.0 : frac);
        struct strata_ec_plan p;
        if (strata_ec_lookup(ec, il, nt, t->sel + t->off[r], &p, &err))
            goto out;
        for (int i = 0; i < p.n_items; i++)
            if (p.items[i].where == STRATA_EC_FILL)
                pend[n_pend++] = p.items[i].slot;
        if (r >= w->r0) {
            dem += (uint64_t)p.n_items;
            hit += (uint64_t)p.n_hit;
            n_copy += (uint64_t)(p.n_fill + p.n_stream);
        }
        /* the next record is the next layer of the same token when its layer is
         * higher; the token before: L records back */
        int prev = r + 1 - t->L;
        if (pf >= 0 && nt == 1 && r + 1 < t->n && t->il[r + 1] > il && prev >= 0 &&
            t->il[prev] == t->il[r + 1] && t->n_tok[prev] == 1 && t->K <= 64) {
            int32_t cand[64], ie[64], sl[64];
            for (int k = 0; k < t->K; k++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                int right = (double)(x >> 11) / 9007199254740992.0 < pf;
                cand[k] = t->sel[t->off[right ? r + 1 : prev] + k];
            }
            int np = strata_ec_prefetch(ec, t->il[r + 1], cand, t->K, ie, sl);
            for (int i = 0; i < np; i++)
                pend[n_pend++] = sl[i];
            if (r >= w->r0)
                n_copy += (uint64_t)np;
        }
        strata_ec_release(ec, &p);
    }
    rate = dem ? (double)hit / dem : 0;
    if (copies)
        *copies = (double)n_copy / ((w->r1 - w->r0) / (double)n_moe_of(t));
out:
    if (rate < 0)
        fprintf(stderr, "bench_ec_replay: %s: %s\n", v->name, err.msg);
    strata_ec_free(ec);
    free(fl);
    free(pend);
    return rate;
}

/* The requests of records [0, r1): the distinct experts of each, as keys il * X + e. */
static int requests(const struct trace *t, int r1, int32_t **keys, int32_t **rec)
{
    size_t cap = 0, n = 0;
    for (int r = 0; r < r1; r++)
        cap += (size_t)t->n_tok[r] * t->K;
    *keys = malloc(sizeof(int32_t) * (cap + 1));
    *rec = malloc(sizeof(int32_t) * (cap + 1));
    uint8_t *seen = calloc((size_t)t->X, 1);
    if (!*keys || !*rec || !seen) {
        free(seen);
        return -1;
    }
    for (int r = 0; r < r1; r++) {
        const int32_t *s = t->sel + t->off[r];
        for (int i = 0; i < t->n_tok[r] * t->K; i++)
            if (!seen[s[i]]) {
                seen[s[i]] = 1;
                (*keys)[n] = t->il[r] * t->X + s[i];
                (*rec)[n++] = r;
            }
        for (int i = 0; i < t->n_tok[r] * t->K; i++)
            seen[s[i]] = 0;
    }
    free(seen);
    return (int)n;
}

/* Static oracle: the n_slots keys demanded most often in the window, never changed. */
static double bound_static(const struct trace *t, int n_slots, const struct window *w)
{
    int32_t *keys = NULL, *rec = NULL;
    size_t LX = (size_t)t->L * t->X;
    int n = requests(t, w->r1, &keys, &rec);
    int64_t *cnt = calloc(LX, sizeof(int64_t));
    uint8_t *in = calloc(LX, 1);
    double rate = -1;
    if (n < 0 || !cnt || !in)
        goto out;
    for (int i = 0; i < n; i++)
        if (rec[i] >= w->r0)
            cnt[keys[i]]++;
    for (int s = 0; s < n_slots; s++) {
        size_t best = LX;
        for (size_t k = 0; k < LX; k++)
            if (!in[k] && (best == LX || cnt[k] > cnt[best]))
                best = k;
        if (best == LX)
            break;
        in[best] = 1;
    }
    uint64_t dem = 0, hit = 0;
    for (int i = 0; i < n; i++)
        if (rec[i] >= w->r0) {
            dem++;
            hit += in[keys[i]];
        }
    rate = dem ? (double)hit / dem : 0;
out:
    free(keys); free(rec); free(cnt); free(in);
    return rate;
}

/* Belady's MIN with bypass over the window's requests: on a miss, of the residents
 * and the missed key, the one used furthest in the future is not kept.  The cache
 * starts with the n_slots keys the window uses first (the best contents at its
 * start, whatever came before), as the static oracle picks its set freely. */
static double bound_belady(const struct trace *t, int n_slots, const struct window *w)
{
    int32_t *keys = NULL, *rec = NULL;
    size_t LX = (size_t)t->L * t->X;
    int n = requests(t, w->r1, &keys, &rec);
    int32_t *next = n > 0 ? malloc(sizeof(int32_t) * (size_t)n) : NULL;
    int32_t *last = malloc(sizeof(int32_t) * LX);
    int32_t *slot = malloc(sizeof(int32_t) * LX);       /* key -> slot or -1 */
    int32_t *s_key = malloc(sizeof(int32_t) * (size_t)(n_slots + 1));
    int32_t *s_next = malloc(sizeof(int32_t) * (size_t)(n_slots + 1));
    double rate = -1;
    if (n <= 0 || !next || !last || !slot || !s_key || !s_next)
        goto out;
    for (size_t k = 0; k < LX; k++) {
        last[k] = n; /* never again */
        slot[k] = -1;
    }
    for (int i = n - 1; i >= 0; i--) {
        next[i] = last[keys[i]];
        last[keys[i]] = i;
    }
    /* initial fill: the keys in order of first use in the window */
    int used = 0;
    for (int i = 0; i < n && used < n_slots; i++)
        if (rec[i] >= w->r0 && slot[keys[i]] < 0) {
            slot[keys[i]] = used;
            s_key[used] = keys[i];
            s_next[used] = i;
            used++;
        }
    uint64_t dem = 0, hit = 0;
    for (int i = 0; i < n; i++) {
        int k = keys[i], s = slot[k], h = s >= 0;
        if (rec[i] < w->r0)
            continue;
        if (h) {
            s_next[s] = next[i];
        } else if (used < n_slots) {
            slot[k] = used;
            s_key[used] = k;
            s_next[used++] = next[i];
        } else if (n_slots > 0) {
            int far = 0;
            for (int j = 1; j < n_slots; j++)
                if (s_next[j] > s_next[far])
                    far = j;
            if (s_next[far] > next[i]) {
                slot[s_key[far]] = -1;
                slot[k] = far;
                s_key[far] = k;
                s_next[far] = next[i];
            }
        }
        dem++;
        hit += h;
    }
    rate = dem ? (double)hit / dem : 0;
out:
    free(keys); free(rec); free(next); free(last); free(slot); free(s_key); free(s_next);
    return rate;
}

static const struct variant variants[] = {
    {"default: lfru, adapt 32, decay 0.995, admit score, prefetch evicts", STRATA_EC_LFRU, 32,
     0.995, 0, 1},
    {"before: the same, prefetch by count only", STRATA_EC_LFRU, 32, 0.995, 0, 0},
    {"lru", STRATA_EC_LRU, 32, 0.995, 0, 1},
    {"lfru, static (adapt 0)", STRATA_EC_LFRU, 0, 0.995, 0, 1},
    {"lfru, adapt 1", STRATA_EC_LFRU, 1, 0.995, 0, 1},
    {"lfru, adapt 8", STRATA_EC_LFRU, 8, 0.995, 0, 1},
    {"lfru, adapt 128", STRATA_EC_LFRU, 128, 0.995, 0, 1},
    {"lfru, decay 0.9", STRATA_EC_LFRU, 32, 0.9, 0, 1},
    {"lfru, decay 0.95", STRATA_EC_LFRU, 32, 0.95, 0, 1},
    {"lfru, decay 0.97", STRATA_EC_LFRU, 32, 0.97, 0, 1},
    {"lfru, decay 0.98", STRATA_EC_LFRU, 32, 0.98, 0, 1},
    {"lfru, decay 0.99", STRATA_EC_LFRU, 32, 0.99, 0, 1},
    {"lfru, decay 0.999", STRATA_EC_LFRU, 32, 0.999, 0, 1},
    {"lfru, decay 1 (lfu)", STRATA_EC_LFRU, 32, 1.0, 0, 1},
    {"lfru, admit seen", STRATA_EC_LFRU, 32, 0.995, STRATA_EC_ADMIT_SEEN, 1},
    {"lfru, admit seen, decay 0.98 adapt 1", STRATA_EC_LFRU, 1, 0.98, STRATA_EC_ADMIT_SEEN, 1},
    {"lfru, admit none (re-balance only)", STRATA_EC_LFRU, 32, 0.995, STRATA_EC_ADMIT_NONE, 1},
    {"lfru, admit none, adapt 1", STRATA_EC_LFRU, 1, 0.995, STRATA_EC_ADMIT_NONE, 1},
    {"lfru, admit none, adapt 1, decay 0.98", STRATA_EC_LFRU, 1, 0.98, STRATA_EC_ADMIT_NONE, 1},
};

#define MAX_TRACES 16

/* Replay every trace; each cell is the mean of the traces' hit rates. */
static int replay_main(char **paths, int n_tr, const char *budgets, const char *fracs, int tg,
                       double pf, int fill_late)
{
    struct trace t[MAX_TRACES];
    struct window w[MAX_TRACES];
    int n_moe = 0, rc = 0, nt = 0;
    for (; nt < n_tr; nt++) {
        struct trace *u = &t[nt];
        if (trace_load(u, paths[nt])) {
            rc = 1;
            goto out;
        }
        int n_prompt = 0, nm = 0;
        while (n_prompt < u->n && u->n_tok[n_prompt] > 1)
            n_prompt++;
        for (int l = 0; l < u->L; l++)
            for (int r = 0; r < u->n && r < 4 * u->L; r++)
                if (u->il[r] == l) {
                    nm++;
                    break;
                }
        if (nt > 0 && (u->L != t[0].L || u->X != t[0].X || u->K != t[0].K || nm != n_moe)) {
            fprintf(stderr, "bench_ec_replay: '%s': another shape than '%s'\n", paths[nt],
                    paths[0]);
            trace_free(u);
            rc = 1;
            goto out;
        }
        n_moe = nm;
        int n_dec = (u->n - n_prompt) / (nm ? nm : 1);
        int tokens = tg > 0 && tg < n_dec ? tg : n_dec;
        w[nt] = (struct window){n_prompt, n_prompt + tokens * nm};
        printf("trace %s: %d MoE layers x %d experts, top-%d; prompt %d records, %d decode "
               "tokens replayed (%d recorded)\n", paths[nt], nm, u->X, u->K, n_prompt, tokens,
               n_dec);
    }
    if (pf < 0)
        printf("no prefetch");
    else
        printf("prefetch: each candidate right with probability %.2f", pf);
    printf("; copies done at the next %s; mean over %d trace(s) of the decode hit rate "
           "(PCIe copies per token in brackets)\n", fill_late ? "token" : "layer", n_tr);
    double bs[8], fr[8];
    int nb = 0, nf = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", budgets);
    for (char *p = strtok(buf, ","); p && nb < 8; p = strtok(NULL, ","))
        bs[nb++] = atof(p);
    snprintf(buf, sizeof buf, "%s", fracs);
    for (char *p = strtok(buf, ","); p && nf < 8; p = strtok(NULL, ","))
        fr[nf++] = atof(p);
    printf("| policy |");
    for (int b = 0; b < nb; b++)
        for (int f = 0; f < nf; f++)
            printf(" %g%% / %g |", bs[b], fr[f]);
    printf("\n|---|");
    for (int i = 0; i < nb * nf; i++)
        printf("---|");
    printf("\n");
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        printf("| %s |", variants[v].name);
        for (int b = 0; b < nb; b++) {
            int S = (int)(bs[b] / 100.0 * n_moe * t[0].X + 0.5);
            for (int f = 0; f < nf; f++) {
                double sum = 0, cp = 0;
                for (int k = 0; k < n_tr; k++) {
                    double c = 0;
                    double h = replay(&t[k], &variants[v], S, fr[f], pf, fill_late, &w[k], &c);
                    rc |= h < 0;
                    sum += h;
                    cp += c;
                }
                printf(" %.1f%% (%.1f) |", 100 * sum / n_tr, cp / n_tr);
            }
        }
        printf("\n");
        fflush(stdout);
    }
    const char *bn[2] = {"bound: static oracle", "bound: Belady MIN"};
    for (int k = 0; k < 2; k++) {
        printf("| %s |", bn[k]);
        for (int b = 0; b < nb; b++) {
            int S = (int)(bs[b] / 100.0 * n_moe * t[0].X + 0.5);
            double sum = 0;
            for (int j = 0; j < n_tr; j++)
                sum += k ? bound_belady(&t[j], S, &w[j]) : bound_static(&t[j], S, &w[j]);
            for (int f = 0; f < nf; f++)
                printf(" %.1f%% |", 100 * sum / n_tr);
        }
        printf("\n");
    }
out:
    for (int k = 0; k < nt; k++)
        trace_free(&t[k]);
    return rc;
}

static const char usage[] =
    "usage: bench_ec_replay --record FILE [--layers N] [--tokens N] [--prompt N] [--skip N] "
    "[-t N]\n"
    "       bench_ec_replay [--tg N] [--budgets P,...] [--fracs F,...]\n"
    "                       [--prefetch none|prev|next|ACC] [--fills-done layer|token] FILE...\n";

int main(int argc, char **argv)
{
    const char *rec_path = NULL;
    const char *budgets = "25,50", *fracs = "1,0.5";
    char *traces[MAX_TRACES];
    int n_tr = 0;
    int layers = 12, n_prompt = 64, n_tok = 256, n_threads = 2, tg = 0;
    double pf = PF_NONE;
    int fill_late = 0;
    long skip = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--record") && v) {
            rec_path = v;
            i++;
        } else if (!strcmp(a, "--layers") && v) {
            layers = atoi(v);
            i++;
        } else if (!strcmp(a, "--tokens") && v) {
            n_tok = atoi(v);
            i++;
        } else if (!strcmp(a, "--prompt") && v) {
            n_prompt = atoi(v);
            i++;
        } else if (!strcmp(a, "-t") && v) {
            n_threads = atoi(v);
            i++;
        } else if (!strcmp(a, "--tg") && v) {
            tg = atoi(v);
            i++;
        } else if (!strcmp(a, "--budgets") && v) {
            budgets = v;
            i++;
        } else if (!strcmp(a, "--fracs") && v) {
            fracs = v;
            i++;
        } else if (!strcmp(a, "--prefetch") && v) {
            pf = !strcmp(v, "next") ? 1.0 : !strcmp(v, "prev") ? 0.0
                 : !strcmp(v, "none") ? PF_NONE : atof(v);
            i++;
        } else if (!strcmp(a, "--skip") && v) {
            skip = atol(v);
            i++;
        } else if (!strcmp(a, "--fills-done") && v) {
            fill_late = !strcmp(v, "token");
            i++;
        } else if (a[0] != '-' && n_tr < MAX_TRACES) {
            traces[n_tr++] = argv[i];
        } else {
            int help = !strcmp(a, "--help");
            fputs(usage, help ? stdout : stderr);
            return help ? 0 : 2;
        }
    }
    if (rec_path)
        return record(rec_path, layers, n_prompt, n_tok, n_threads, skip);
    if (!n_tr) {
        fprintf(stderr, "bench_ec_replay: no trace file (see --help)\n");
        return 2;
    }
    return replay_main(traces, n_tr, budgets, fracs, tg, pf, fill_late);
}
