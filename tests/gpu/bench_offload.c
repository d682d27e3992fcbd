/* bench_offload.c - speed of the GPU backend when only part of the routed experts fit
 * in VRAM (the expert cache), on a synthetic model (lib/synth.h):
 *
 *   bench_offload [--shape S] [--layers N] [--ftype F] [--pp P[,P...]] [--tg T]
 *                 [--prefill CHUNK] [--budget PCT[,PCT...]] [--pcie-frac auto|F[,...]]
 *                 [--route model|uniform[,...]] [--pcie-gbs G] [--seed N] [--file PATH]
 *                 [--reps N] [--thp]
 *
 * Every prompt and decode token is a uniformly random token id (as llama-bench feeds
 * them), so routing follows the model, not a repeated token.  For each budget (percent
 * of the routed experts in VRAM slots), pcie_frac and routing: after a 64-token
 * warm-up, each ppP is one prompt of P tokens from an empty kv cache (in chunks of
 * --prefill), and tgT is T decode steps from an empty kv cache (run first), each
 * phase run --reps times in a row (lines tgT#1, tgT#2, ...; new token ids each time;
 * then their mean and sample standard deviation, as llama-bench reports repetitions),
 * each measured on its own with the expert cache's statistics of that phase: hit rate (distinct experts
 * per batch, and token-expert pairs), bytes that missed the cache per token, bytes
 * copied over PCIe and CPU experts per token, and the floor of the phase - the missed
 * bytes over the combined bandwidth of PCIe (--pcie-gbs, default 55 GB/s, the measured
 * pinned H2D of the reference host) and the CPU (its measured memory read bandwidth);
 * then this run's own split: its PCIe bytes over --pcie-gbs and its CPU experts'
 * bytes over the rate the CPU experts ran at (their bytes over their measured time).
 *
 * --route uniform replaces the router's choice by uniformly random distinct experts
 * (STRATA_EC_ROUTE=uniform, read by the GPU backend): the logits are then meaningless,
 * but the traffic is that of a model whose routing has no locality at all - the worst
 * case for a cache, and what a per-layer placement (llama.cpp --n-cpu-moe) sees
 * whatever the routing.  Prefetch (off by default; STRATA_EC_PREFETCH=1) stays off
 * there: it predicts the router's choice, not the random one.
 *
 * --thp: the model built in memory is moved into memory advised for transparent huge
 * pages (MADV_HUGEPAGE, which strata-load asks for its resident images), so the CPU experts read
 * 2 MB pages; without it the pages are whatever the host's THP setting gives. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "engine.h"
#include "expert_cache.h"
#include "gguf.h"
#include "log.h"
#include "model.h"
#include "pool.h"
#include "probe.h"
#include "synth.h"

#include "../bench/bench_ids.h"

static void sink(int level, const char *msg, void *ud)
{
    (void)ud;
    if (level <= STRATA_LOG_WARN || getenv("BENCH_VERBOSE") ||
        strstr(msg, "PCIe probe") || strstr(msg, "memory plan: cache") ||
        strstr(msg, "cannot pin") || strstr(msg, "host-planned decode") ||
        strstr(msg, "decode steps:"))
        fprintf(stderr, "%s\n", msg);
}

struct phase {
    double tok_s, hit, pair_hit, miss_mb, pcie_mb, cpu_exp, cpu_mb, floor_ms, ms,
        run_pcie_ms, run_cpu_ms, cpu_rate;
    double moe_ms, sync_ms, wait_ms, pf_per_tok, pf_used; /* per token; prefetch use % */
    double graph_pct, in_place_mb; /* steps seen as graphs (%), their bytes read in place */
    /* experts graph steps prefetched per step, % used, % of them routed (used or late) */
    double gpf_per_step, gpf_used, gpf_asked;
};

/* kB of a "Name:   N kB" line of /proc/self/status; -1 when absent */
static long status_kb(const char *name)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(name);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, name, n) && line[n] == ':') {
            v = atol(line + n + 1);
            break;
        }
    if (f)
        fclose(f);
    return v;
}

/* The statistics of the phase just run (n tokens in t seconds). */
static void phase_stats(struct strata_engine *e, const double *rec, int n, double t,
                        double pcie_gbs, double cpu_gbs, struct phase *ph)
{
    struct strata_expert_cache *ec = NULL;
    struct strata_ec_times tm;
    memset(ph, 0, sizeof *ph);
    ph->tok_s = n / t;
    ph->ms = t / n * 1e3;
    if (!strata_engine_expert_stats(e, &ec, &tm))
        return;
    const struct strata_model *m = strata_engine_model(e);
    uint64_t dem = 0, hit = 0, pairs = 0, phit = 0, pcie = 0, cpu = 0, pf = 0, pfu = 0;
    double miss_b = 0, cpu_b = 0;
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        if (!m->layers[il].is_moe)
            continue;
        const struct strata_ec_layer_stats *s = strata_ec_stats(ec, (int)il);
        dem += s->demanded;
        hit += s->hits;
        pairs += s->pairs;
        phit += s->pair_hits;
        pcie += s->pcie_bytes;
        cpu += s->cpu;
        pf += s->prefetches;
        pfu += s->prefetch_used;
        miss_b += (double)(s->demanded - s->hits) * rec[il];
        cpu_b += (double)s->cpu * rec[il];
    }
    ph->hit = dem ? 100.0 * hit / dem : 0;
    ph->pair_hit = pairs ? 100.0 * phit / pairs : 0;
    ph->miss_mb = miss_b / n / 1e6;
    ph->pcie_mb = pcie / (double)n / 1e6;
    ph->cpu_exp = cpu / (double)n;
    ph->cpu_mb = cpu_b / n / 1e6;
    ph->floor_ms = miss_b / n / ((pcie_gbs + (cpu_gbs > 0 ? cpu_gbs : 0)) * 1e9) * 1e3;
    ph->run_pcie_ms = pcie / (double)n / (pcie_gbs * 1e9) * 1e3;
    ph->cpu_rate = tm.cpu_s > 0 ? cpu_b / tm.cpu_s / 1e9 : 0;
    ph->run_cpu_ms = tm.cpu_s / n * 1e3;
    ph->moe_ms = tm.moe_s / n * 1e3;
    ph->sync_ms = tm.gpu_s / n * 1e3;
    ph->wait_ms = tm.copy_wait_s / n * 1e3;
    ph->pf_per_tok = pf / (double)n;
    ph->pf_used = pf ? 100.0 * pfu / pf : 0;
    ph->graph_pct = 100.0 * (double)tm.graph_steps / n;
    ph->in_place_mb = tm.graph_steps ? (double)tm.bytes_in_place / tm.graph_steps / 1e6 : 0;
    ph->gpf_per_step = tm.graph_steps ? (double)tm.graph_prefetched / tm.graph_steps : 0;
    ph->gpf_used = tm.graph_prefetched ? 100.0 * tm.graph_prefetch_used / tm.graph_prefetched : 0;
    ph->gpf_asked = tm.graph_prefetched ? 100.0 * tm.graph_prefetch_asked / tm.graph_prefetched
                                        : 0;
}

static void print_phase(const char *name, const struct phase *p)
{
    double fl = p->run_pcie_ms > p->run_cpu_ms ? p->run_pcie_ms : p->run_cpu_ms;
    printf("  %-7s %9.1f tok/s (%.3f ms/token) | hit %5.1f%% (pairs %5.1f%%) | missed %7.2f "
           "MB/token | PCIe %7.2f MB/token | CPU %5.2f experts (%.2f MB)/token at %.1f GB/s | "
           "floor %.3f ms = %.0f tok/s (best split), this split %.3f ms = %.0f tok/s\n",
           name, p->tok_s, p->ms, p->hit, p->pair_hit, p->miss_mb, p->pcie_mb, p->cpu_exp,
           p->cpu_mb, p->cpu_rate, p->floor_ms, p->floor_ms > 0 ? 1e3 / p->floor_ms : 0, fl,
           fl > 0 ? 1e3 / fl : 0);
    printf("          time per token: routed experts %.3f ms (waiting for the forward pass "
           "%.3f, GPU waiting for copies %.3f, CPU experts %.3f) | prefetch %.2f experts/token, "
           "%.0f%% used | graph steps %.0f%% (%.2f MB read in place each, %.2f experts "
           "prefetched, %.0f%% used, %.0f%% routed)\n", p->moe_ms, p->sync_ms, p->wait_ms,
           p->run_cpu_ms, p->pf_per_tok, p->pf_used, p->graph_pct, p->in_place_mb,
           p->gpf_per_step, p->gpf_used, p->gpf_asked);
}

int main(int argc, char **argv)
{
    const char *shape = "qwen3-30b-a3b", *ftype = "Q4_K_M", *budgets = "25,50",
               *fracs = "1,auto", *pps = "512,2048", *routes = "model,uniform", *file = NULL;
    int layers = 12, tg = 128, prefill = 2048, reps = 1, thp = 0;
    double pcie_gbs = 55;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--shape")) shape = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--layers")) layers = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--ftype")) ftype = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--pp")) pps = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--tg")) tg = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--prefill")) prefill = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--budget")) budgets = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--pcie-frac")) fracs = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--route")) routes = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--pcie-gbs")) pcie_gbs = atof(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--file")) file = argv[++i];
        else if (!strcmp(argv[i], "--thp")) thp = 1;
        else if (i + 1 < argc && !strcmp(argv[i], "--seed"))
            bench_rng_state = strtoull(argv[++i], NULL, 0) | 1;
        else {
            fprintf(stderr, "usage: bench_offload [--shape S] [--layers N] [--ftype F] "
                    "[--pp P,...] [--tg T] [--prefill CHUNK] [--budget PCT,...] "
                    "[--pcie-frac auto|F,...] [--route model|uniform,...] [--pcie-gbs G] "
                    "[--seed N] [--file PATH] [--reps N] [--thp]\n");
            return 2;
        }
    }
    int pp_list[8], n_pp = 0, pp_max = 64;
    {
        char pl[128];
        snprintf(pl, sizeof pl, "%s", pps);
        for (char *p = strtok(pl, ","); p && n_pp < 8; p = strtok(NULL, ",")) {
            pp_list[n_pp] = atoi(p);
            if (pp_list[n_pp] > 0) {
                pp_max = pp_list[n_pp] > pp_max ? pp_list[n_pp] : pp_max;
                n_pp++;
            }
        }
    }
    if (prefill < 1 || tg < 1 || reps < 1) {
        fprintf(stderr, "bench_offload: --prefill, --tg and --reps must be >= 1\n");
        return 2;
    }
    struct strata_err err = {0, ""};
    struct strata_synth_opts so = {shape, layers, ftype, 42};
    void *buf = NULL;
    size_t size = 0, thp_len = 0;
    struct strata_gguf *g = NULL;
    struct strata_model *mm = NULL;
    double t0 = bench_now();
    int rc;
    if (file) {
        FILE *f = fopen(file, "rb");
        rc = 0;
        if (f)
            fclose(f);
        else
            rc = strata_synth_write(&so, file, &err);
        if (!rc)
            rc = strata_gguf_open(&g, file, &err);
        if (!rc)
            size = (size_t)strata_gguf_shard_size(g, 0);
    } else {
        rc = strata_synth_build(&so, &buf, &size, &err);
        if (!rc && thp) {
            size_t len = (size + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
            void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED || madvise(m, len, MADV_HUGEPAGE) != 0) {
                fprintf(stderr, "bench_offload: --thp: no memory advised for huge pages\n");
                return 1;
            }
            memcpy(m, buf, size);
            free(buf);
            buf = m;
            thp_len = len;
        }
        if (!rc)
            rc = strata_gguf_open_mem(&g, buf, size, shape, &err);
    }
    if (!rc)
        rc = strata_model_load(&mm, g, &err);
    if (rc) {
        fprintf(stderr, "bench_offload: %s\n", err.msg);
        return 1;
    }
    printf("synthetic %s, %d layers, %s: %.2f GB built in %.1f s\n", shape, layers, ftype,
           size / 1e9, bench_now() - t0);
    /* bytes of one expert record per layer, and the routed experts in all */
    double *rec = calloc(mm->hp.n_layer, sizeof(double));
    int n_moe = 0;
    for (uint32_t il = 0; rec && il < mm->hp.n_layer; il++) {
        const struct strata_layer *L = &mm->layers[il];
        if (!L->is_moe)
            continue;
        n_moe++;
        rec[il] = (double)(L->ffn_gate_exps.nb1 * L->ffn_gate_exps.ne[1] +
                           L->ffn_up_exps.nb1 * L->ffn_up_exps.ne[1] +
                           L->ffn_down_exps.nb1 * L->ffn_down_exps.ne[1]);
    }
    const int n_expert = (int)mm->hp.n_expert;
    int n_threads = strata_pool_cpu_count();
    double cpu_gbs = strata_probe_mem_read_gbs(256u << 20, n_threads);
    printf("CPU memory read bandwidth %.1f GB/s (%d threads); PCIe %.1f GB/s assumed for the "
           "floor; %d MoE layers x %d experts, top-%u; random token ids (seed %#llx)\n",
           cpu_gbs, n_threads, pcie_gbs, n_moe, n_expert, mm->hp.n_expert_used,
           (unsigned long long)bench_rng_state);
    char bl[256], fl[256], rl[256];
    int failed = 0;
    snprintf(bl, sizeof bl, "%s", budgets);
    char *bsave = NULL;
    for (char *bs = strtok_r(bl, ",", &bsave); bs && rec; bs = strtok_r(NULL, ",", &bsave)) {
        snprintf(rl, sizeof rl, "%s", routes);
        char *rsave = NULL;
        for (char *rs = strtok_r(rl, ",", &rsave); rs; rs = strtok_r(NULL, ",", &rsave)) {
            snprintf(fl, sizeof fl, "%s", fracs);
            char *fsave = NULL;
            for (char *fs = strtok_r(fl, ",", &fsave); fs; fs = strtok_r(NULL, ",", &fsave)) {
                struct strata_ec_cfg cfg;
                strata_ec_cfg_init(&cfg);
                cfg.pcie_frac = strcmp(fs, "auto") ? atof(fs) : -1;
                cfg.slots = (int)(atof(bs) / 100.0 * n_moe * n_expert + 0.5);
                struct strata_engine_opts o;
                strata_engine_opts_init(&o);
                o.backend = getenv("STRATA_BACKEND") ? getenv("STRATA_BACKEND") : "cuda";
                o.n_ctx = (pp_max > tg ? pp_max : tg) + 16;
                o.n_prefill = prefill;
                o.n_threads = n_threads;
                o.backend_cfg = &cfg;
                if (!strcmp(rs, "uniform"))
                    setenv("STRATA_EC_ROUTE", "uniform", 1);
                else
                    unsetenv("STRATA_EC_ROUTE");
                struct strata_engine *e = NULL;
                strata_log_set_sink(sink, NULL);
                t0 = bench_now();
                rc = strata_engine_open_gguf(&e, g, &o, &err);
                double t_open = bench_now() - t0;
                int nv = rc ? 0 : strata_engine_n_vocab(e);
                int n_ids = pp_max > tg ? pp_max : tg;
                int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_ids);
                float *logits = malloc(sizeof(float) * (size_t)(nv ? nv : 1));
                if (!rc && (!ids || !logits))
                    rc = strata_err_set(&err, STRATA_E_NOMEM, "out of memory");
                printf("budget %s%% (%d of %d experts), pcie_frac %s, %s routing: open %.1f s\n",
                       bs, cfg.slots, n_moe * n_expert, fs, rs, t_open);
                for (int i = 0; !rc && i < 64; i++)
                    ids[i] = bench_rnd_below(nv);
                if (!rc)
                    rc = strata_engine_eval(e, ids, 64, STRATA_LOGITS_LAST, logits, &err);
                /* decode first, then the prompts: a phase that fails is reported and the
                 * next configuration runs */
                double sum = 0, sum2 = 0; /* a phase's tokens/s over its repetitions */
                for (int q = 0; q < (n_pp + 1) * reps && !rc; q++) {
                    const int p = q / reps - 1, r = q % reps;
                    struct phase ph;
                    char name[32];
                    int n = p < 0 ? tg : pp_list[p];
                    snprintf(name, sizeof name, p < 0 ? "tg%d" : "pp%d", n);
                    if (reps > 1)
                        snprintf(name + strlen(name), sizeof name - strlen(name), "#%d", r + 1);
                    for (int i = 0; i < n; i++)
                        ids[i] = bench_rnd_below(nv);
                    if ((rc = strata_engine_rollback(e, 0, &err)))
                        break;
                    strata_engine_expert_stats_reset(e);
                    double a = bench_now();
                    if (p < 0)
                        for (int i = 0; i < n && !rc; i++)
                            rc = strata_engine_eval(e, ids + i, 1, STRATA_LOGITS_LAST, logits,
                                                    &err);
                    else
                        rc = strata_engine_eval(e, ids, n, STRATA_LOGITS_LAST, logits, &err);
                    double t = bench_now() - a;
                    if (rc) {
                        printf("  %-7s failed: %s\n", name, err.msg);
                        break;
                    }
                    phase_stats(e, rec, n, t, pcie_gbs, cpu_gbs, &ph);
                    print_phase(name, &ph);
                    if (r == 0)
                        sum = sum2 = 0; /* a new phase */
                    sum += ph.tok_s;
                    sum2 += ph.tok_s * ph.tok_s;
                    if (reps > 1 && r == reps - 1) {
                        /* the mean and sample standard deviation, as llama-bench reports
                         * its repetitions */
                        double m = sum / reps, v = (sum2 - reps * m * m) / (reps - 1);
                        printf("  %s%d   mean %9.1f tok/s, sd %.1f over %d repetitions\n",
                               p < 0 ? "tg" : "pp", n, m, v > 0 ? sqrt(v) : 0.0, reps);
                    }
                    if (file) {
                        double exp_b = 0;
                        for (uint32_t il = 0; il < mm->hp.n_layer; il++)
                            exp_b += rec[il] * n_expert;
                        long rss = status_kb("VmRSS"), fb = status_kb("RssFile"),
                             an = status_kb("RssAnon"), sh = status_kb("RssShmem"),
                             pin = status_kb("VmPin"), hwm = status_kb("VmHWM");
                        printf("          host memory: VmRSS %.2f GB (file-backed %.2f, "
                               "shared memory %.2f, anonymous %.2f; peak %.2f, pinned %.2f); "
                               "routed experts %.2f GB: RSS / experts = %.3f\n",
                               rss * 1024e-9, fb * 1024e-9, sh * 1024e-9, an * 1024e-9,
                               hwm * 1024e-9, pin * 1024e-9, exp_b / 1e9, rss * 1024.0 / exp_b);
                    }
                }
                strata_engine_close(e);
                strata_log_set_sink(NULL, NULL);
                free(ids);
                free(logits);
                if (rc) {
                    fprintf(stderr, "bench_offload: %s\n", err.msg);
                    failed = 1;
                    rc = 0;
                }
                fflush(stdout);
            }
        }
    }
    unsetenv("STRATA_EC_ROUTE");
    free(rec);
    strata_model_free(mm);
    strata_gguf_close(g);
    if (thp_len)
        munmap(buf, thp_len);
    else
        free(buf);
    return failed ? 1 : 0;
}
