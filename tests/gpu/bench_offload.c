/* bench_offload.c - speed of the GPU backend when only part of the routed experts fit
 * in VRAM (the expert cache), on a synthetic model (lib/synth.h):
 *
 *   bench_offload [--shape S] [--layers N] [--ftype F] [--pp P] [--tg T]
 *                 [--budget PCT[,PCT...]] [--pcie-frac auto|F[,...]] [--pcie-gbs G]
 *
 * For each budget (percent of the routed experts in VRAM slots) and pcie_frac: pp = one
 * prompt of P tokens from an empty kv cache, tg = T decode steps after it; then the
 * expert cache's statistics (hit rates, PCIe bytes and CPU experts per token, time
 * split) and the floor of decoding: the bytes of the missed experts per token over the
 * combined bandwidth of PCIe (--pcie-gbs, default 55 GB/s, the measured pinned H2D of
 * the reference host) and the CPU's memory reads (measured here). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "expert_cache.h"
#include "gguf.h"
#include "log.h"
#include "model.h"
#include "pool.h"
#include "probe.h"
#include "synth.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char logbuf[1 << 16];
static size_t loglen;

static void sink(int level, const char *msg, void *ud)
{
    (void)level;
    (void)ud;
    size_t n = strlen(msg);
    fprintf(stderr, "%s\n", msg);
    if (loglen + n + 2 < sizeof logbuf) {
        memcpy(logbuf + loglen, msg, n);
        loglen += n;
        logbuf[loglen++] = '\n';
        logbuf[loglen] = 0;
    }
}

static double after(const char *key)
{
    const char *p = strstr(logbuf, key);
    return p ? atof(p + strlen(key)) : -1;
}

int main(int argc, char **argv)
{
    const char *shape = "qwen3-30b-a3b", *ftype = "Q4_K_M", *budgets = "25,50",
               *fracs = "auto,1";
    int layers = 12, pp = 512, tg = 64;
    double pcie_gbs = 55;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--shape")) shape = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--layers")) layers = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--ftype")) ftype = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--pp")) pp = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--tg")) tg = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--budget")) budgets = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--pcie-frac")) fracs = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--pcie-gbs")) pcie_gbs = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_offload [--shape S] [--layers N] [--ftype F] [--pp P] "
                    "[--tg T] [--budget PCT,...] [--pcie-frac auto|F,...] [--pcie-gbs G]\n");
            return 2;
        }
    }
    struct strata_err err = {0, ""};
    struct strata_synth_opts so = {shape, layers, ftype, 42};
    void *buf = NULL;
    size_t size = 0;
    struct strata_gguf *g = NULL;
    double t0 = now();
    int rc = strata_synth_build(&so, &buf, &size, &err);
    if (!rc)
        rc = strata_gguf_open_mem(&g, buf, size, shape, &err);
    if (rc) {
        fprintf(stderr, "bench_offload: %s\n", err.msg);
        return 1;
    }
    printf("synthetic %s, %d layers, %s: %.2f GB built in %.1f s\n", shape, layers, ftype,
           size / 1e9, now() - t0);
    int n_threads = strata_pool_cpu_count();
    double cpu_gbs = strata_probe_mem_read_gbs(256u << 20, n_threads);
    printf("CPU memory read bandwidth %.1f GB/s (%d threads); PCIe %.1f GB/s assumed for the "
           "floor\n", cpu_gbs, n_threads, pcie_gbs);
    char bl[256], fl[256];
    snprintf(bl, sizeof bl, "%s", budgets);
    for (char *bs = strtok(bl, ","); bs; bs = strtok(NULL, ",")) {
        snprintf(fl, sizeof fl, "%s", fracs);
        char *fsave = NULL;
        for (char *fs = strtok_r(fl, ",", &fsave); fs; fs = strtok_r(NULL, ",", &fsave)) {
            struct strata_ec_cfg cfg;
            strata_ec_cfg_init(&cfg);
            cfg.stats = 1;
            cfg.pcie_frac = strcmp(fs, "auto") ? atof(fs) : -1;
            struct strata_engine_opts o;
            strata_engine_opts_init(&o);
            o.backend = getenv("STRATA_BACKEND") ? getenv("STRATA_BACKEND") : "cuda";
            o.n_ctx = pp + tg + 16;
            o.n_prefill = pp;
            o.n_threads = n_threads;
            o.backend_cfg = &cfg;
            struct strata_engine *e = NULL;
            int n_moe = 0, k_used = 0;
            double rec = 0; /* mean bytes of one expert */
            /* the slot count needs the model: open once to count, as the backend does */
            {
                struct strata_model *mm = NULL;
                if (strata_model_load(&mm, g, &err)) {
                    fprintf(stderr, "bench_offload: %s\n", err.msg);
                    return 1;
                }
                n_moe = 0;
                rec = 0;
                for (uint32_t il = 0; il < mm->hp.n_layer; il++) {
                    const struct strata_layer *L = &mm->layers[il];
                    if (!L->is_moe)
                        continue;
                    n_moe++;
                    rec += (double)(L->ffn_gate_exps.nb1 * L->ffn_gate_exps.ne[1] +
                                    L->ffn_up_exps.nb1 * L->ffn_up_exps.ne[1] +
                                    L->ffn_down_exps.nb1 * L->ffn_down_exps.ne[1]);
                }
                rec /= n_moe ? n_moe : 1;
                k_used = (int)mm->hp.n_expert_used;
                cfg.slots = (int)(atof(bs) / 100.0 * n_moe * mm->hp.n_expert + 0.5);
                strata_model_free(mm);
            }
            loglen = 0;
            logbuf[0] = 0;
            strata_log_set_sink(sink, NULL);
            t0 = now();
            rc = strata_engine_open_gguf(&e, g, &o, &err);
            if (rc) {
                strata_log_set_sink(NULL, NULL);
                fprintf(stderr, "bench_offload: %s\n", err.msg);
                return 1;
            }
            double t_open = now() - t0;
            int nv = strata_engine_n_vocab(e);
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)(pp + tg));
            float *logits = malloc(sizeof(float) * (size_t)nv);
            for (int i = 0; i < pp + tg; i++)
                ids[i] = (int32_t)((i * 2654435761u) % (unsigned)nv);
            /* a warm-up prompt, then the measured one */
            rc = strata_engine_eval(e, ids, pp < 64 ? pp : 64, STRATA_LOGITS_LAST, logits, &err);
            if (!rc)
                rc = strata_engine_rollback(e, 0, &err);
            double a = now();
            if (!rc)
                rc = strata_engine_eval(e, ids, pp, STRATA_LOGITS_LAST, logits, &err);
            double t_pp = now() - a;
            a = now();
            for (int i = 0; i < tg && !rc; i++)
                rc = strata_engine_eval(e, ids + pp + i, 1, STRATA_LOGITS_LAST, logits, &err);
            double t_tg = now() - a;
            strata_engine_close(e);
            strata_log_set_sink(NULL, NULL);
            free(ids);
            free(logits);
            if (rc) {
                fprintf(stderr, "bench_offload: %s\n", err.msg);
                return 1;
            }
            /* the statistics cover warm-up, prompt and decode; the floor uses the
             * decode-heavy per-token figures they give */
            double hit = -1;
            const char *all = strstr(logbuf, "\n  all ");
            if (all)
                hit = atof(all + 7);
            const char *cp = strstr(logbuf, "expert copies: ");
            double mb_tok = cp && strchr(cp, '(') ? atof(strchr(cp, '(') + 1) : -1;
            double cpu_tok = after("CPU experts ");
            /* decode floor: the missed experts' bytes of one token over both paths */
            double miss_b = hit >= 0 ? n_moe * k_used * (1 - hit / 100) * rec : 0;
            double floor_ms = miss_b / ((pcie_gbs + (cpu_gbs > 0 ? cpu_gbs : 0)) * 1e9) * 1e3;
            double pcie_ms = miss_b / (pcie_gbs * 1e9) * 1e3;
            printf("budget %s%% (%d slots), pcie_frac %s: open %.1f s, pp%d %.0f tok/s, "
                   "tg%d %.1f tok/s (%.3f ms/token); expert hit rate %.1f%%, %.2f MB over "
                   "PCIe and %.2f CPU experts per token (whole run); decode misses %.1f MB/token: "
                   "floor %.3f ms = %.0f tok/s (PCIe + CPU), %.3f ms = %.0f tok/s (PCIe only)\n",
                   bs, cfg.slots, fs, t_open, pp, pp / t_pp, tg, tg / t_tg, t_tg / tg * 1e3, hit,
                   mb_tok, cpu_tok, miss_b / 1e6, floor_ms, floor_ms > 0 ? 1e3 / floor_ms : 0,
                   pcie_ms, pcie_ms > 0 ? 1e3 / pcie_ms : 0);
            fflush(stdout);
        }
    }
    strata_gguf_close(g);
    free(buf);
    return 0;
}
