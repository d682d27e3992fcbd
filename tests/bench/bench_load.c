/* bench_load - engine start with and without a resident image (strata-load).
 *
 *   bench_load make DIR N_LAYER   write DIR/synth.gguf (the qwen3-30b-a3b shape,
 *                                 N_LAYER layers, Q4_K_M) and the native pack
 *                                 DIR/synth.strata
 *   bench_load start PACK         open the pack and an engine on it (ready), copy
 *                                 every tensor byte once through a 64 MiB staging
 *                                 buffer (what a GPU backend's upload does), and
 *                                 evaluate one token; prints the times
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "engine.h"
#include "gguf.h"
#include "pack.h"
#include "synth.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmd_make(const char *dir, int n_layer)
{
    struct strata_err err = {0};
    char gguf[4096], pack[4096];
    snprintf(gguf, sizeof(gguf), "%s/synth.gguf", dir);
    snprintf(pack, sizeof(pack), "%s/synth.strata", dir);
    struct strata_synth_opts so = {.shape = "qwen3-30b-a3b", .n_layer = n_layer,
                                   .ftype = "Q4_K_M", .seed = 1};
    mkdir(dir, 0755);
    if (strata_synth_write(&so, gguf, &err))
        goto fail;
    mkdir(pack, 0755);
    struct strata_pack_build_opts bo = {.dir = pack, .gguf = gguf, .name = "synth",
                                        .low_ram = 0};
    if (strata_pack_build(&bo, &err))
        goto fail;
    printf("%s\n", pack);
    return 0;
fail:
    fprintf(stderr, "bench_load: %s\n", err.msg);
    return 1;
}

static int cmd_start(const char *path)
{
    struct strata_err err = {0};
    struct strata_pack *pk = NULL;
    struct strata_engine *e = NULL;
    struct strata_engine_opts o;
    float *logits = NULL;
    unsigned char *stage = malloc(64u << 20);
    int rc = 1;
    double t0 = now_ms();
    if (!stage || strata_pack_open(&pk, path, &err))
        goto out;
    double t_open = now_ms();
    strata_engine_opts_init(&o);
    o.n_ctx = 512;
    if (strata_engine_open_gguf(&e, strata_pack_gguf(pk), &o, &err))
        goto out;
    double t_ready = now_ms();
    const struct strata_gguf *g = strata_pack_gguf(pk);
    uint64_t bytes = 0;
    for (uint64_t i = 0; i < strata_gguf_n_tensors(g); i++) {
        const struct strata_gguf_tensor *t = strata_gguf_tensor_at(g, i);
        for (uint64_t off = 0; off < t->n_bytes; off += 64u << 20) {
            uint64_t n = t->n_bytes - off < (64u << 20) ? t->n_bytes - off : (64u << 20);
            memcpy(stage, (const unsigned char *)t->data + off, n);
        }
        bytes += t->n_bytes;
    }
    double t_touch = now_ms();
    int32_t id = 1;
    if (!(logits = malloc(sizeof(float) * (size_t)strata_engine_n_vocab(e))) ||
        strata_engine_eval(e, &id, 1, STRATA_LOGITS_LAST, logits, &err))
        goto out;
    double t_tok = now_ms();
    uint64_t rb = 0;
    const char *res = strata_pack_resident(pk, &rb);
    printf("%-9s ready %8.1f ms  copy %.2f GiB %9.1f ms (%.2f GiB/s)  first token %8.1f ms"
           "  total %8.1f ms  (open %.1f ms)\n",
           res ? "attached" : "files", t_ready - t0, (double)bytes / (1 << 30), t_touch - t_ready,
           (double)bytes / (1 << 30) / ((t_touch - t_ready) / 1e3), t_tok - t_touch, t_tok - t0,
           t_open - t0);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "bench_load: %s\n", err.msg);
    free(logits);
    free(stage);
    strata_engine_close(e);
    strata_pack_close(pk);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "make") == 0)
        return cmd_make(argv[2], atoi(argv[3]));
    if (argc == 3 && strcmp(argv[1], "start") == 0)
        return cmd_start(argv[2]);
    fprintf(stderr, "usage: bench_load make DIR N_LAYER | start PACK\n");
    return 2;
}
