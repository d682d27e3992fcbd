/* bench_expert_cpu.c - how fast the CPU experts (lib/expert_cpu.h) go through expert
 * weights on the 8-bit path of a decode token.
 *
 *   bench_expert_cpu [-t THREADS] [-r REPS] [-m MIB] [-s scalar|avx2|avx512]
 *
 * 1. the worker pool's hand-over: a pool run of trivial work, median microseconds,
 *    back to back and after the pool sat idle for 0.1, 1 and 30 ms;
 * 2. one thread, the rows of every 8-bit weight type at every SIMD level the CPU has
 *    (-s caps it), for the Qwen3-30B-A3B expert shapes (ffn_gate/ffn_up [768, 2048]:
 *    ne0 = 2048, ne1 = 768; ffn_down [2048, 768]: ne0 = 768, ne1 = 2048), the matrix
 *    warm in the caches: median and best GB/s of weight bytes over REPS runs;
 * 3. strata_xcpu_ffn_batch on THREADS threads for 1, 2, 4 and 8 experts of one token
 *    each, Q4_K gate/up and Q6_K down (the Q4_K_M mix of lib/synth.h): "warm" repeats
 *    the same experts (in the caches, as the engine's --pcie-frac auto probe does),
 *    "cold" walks through MIB MiB of distinct experts (from memory, as decode does).
 * Results go to stdout as Markdown tables; the machine is named on the first line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../unit/quant_testutil.h"
#include "expert_cpu.h"
#include "ggml_types.h"
#include "pool.h"

#define N_EMBD 2048
#define N_FF 768

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* median of t[0..n) (sorts t) */
static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static void noop(void *ctx, int ith, int nth)
{
    (void)ctx;
    (void)ith;
    (void)nth;
}

static int parse_level(const char *s)
{
    for (int i = 0; i < STRATA_SIMD_COUNT; i++)
        if (strcmp(s, strata_quant_simd_name(i)) == 0)
            return i;
    return -1;
}

static void cpu_name(char *out, size_t n)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    snprintf(out, n, "unknown CPU");
    while (f && fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && c) {
            snprintf(out, n, "%s", c + 2);
            out[strcspn(out, "\n")] = 0;
            break;
        }
    }
    if (f)
        fclose(f);
}

/* random blocks for the first rows, copied over the rest (faster; speed does not
 * depend on the values) */
static void fill_weights(uint32_t type, uint8_t *w, size_t row, int64_t ne0, int64_t n_rows)
{
    int64_t uniq = n_rows < 64 ? n_rows : 64;
    for (int64_t r = 0; r < uniq; r++)
        qt_random_blocks(type, w + (size_t)r * row, ne0 / strata_ggml_blck_size(type));
    for (int64_t r = uniq; r < n_rows; r++)
        memcpy(w + (size_t)r * row, w + (size_t)(r % uniq) * row, row);
}

static void bench_rows(int max_level, int reps)
{
    static const uint32_t types[] = {STRATA_TYPE_Q4_K, STRATA_TYPE_Q5_K, STRATA_TYPE_Q6_K,
                                     STRATA_TYPE_Q8_0};
    static const int64_t shapes[][2] = {{N_EMBD, N_FF}, {N_FF, N_EMBD}};
    struct strata_err err = {0, ""};
    printf("\n1 thread, one matrix on the 8-bit path, warm (median / best GB/s of weights, "
           "%d runs)\n\n| type | ne0 x ne1 | MB |", reps);
    for (int lv = 0; lv <= max_level; lv++)
        printf(" %s |", strata_quant_simd_name(lv));
    printf("\n|---|---|---|");
    for (int lv = 0; lv <= max_level; lv++)
        printf("---|");
    printf("\n");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        for (size_t si = 0; si < 2; si++) {
            const uint32_t type = types[ti];
            const int64_t ne0 = shapes[si][0], ne1 = shapes[si][1];
            const size_t row = strata_ggml_row_size(type, (uint64_t)ne0);
            uint8_t *w = aligned_alloc(64, (row * (size_t)ne1 + 63) / 64 * 64);
            float *x = malloc(sizeof(float) * (size_t)ne0), *y = malloc(sizeof(float) * ne1);
            void *scr = aligned_alloc(64, (strata_xcpu_scratch_bytes(ne0, 1) + 63) / 64 * 64);
            double *t = malloc(sizeof(double) * (size_t)reps);
            if (!w || !x || !y || !scr || !t) {
                fprintf(stderr, "bench_expert_cpu: out of memory\n");
                exit(1);
            }
            fill_weights(type, w, row, ne0, ne1);
            for (int64_t i = 0; i < ne0; i++)
                x[i] = qt_uniform();
            struct strata_mat m = {type, ne0, ne1, row, w};
            const double mb = (double)(row * (size_t)ne1) / 1e6;
            printf("| %s | %lld x %lld | %.2f |", strata_ggml_type_name(type), (long long)ne0,
                   (long long)ne1, mb);
            for (int lv = 0; lv <= max_level; lv++) {
                /* more runs of the slow scalar rows would only cost time */
                int n = lv == 0 ? (reps + 1) / 2 : reps;
                strata_xcpu_matmul_simd(NULL, STRATA_XCPU_Q8, &m, x, 1, y, scr, lv, &err);
                for (int r = 0; r < n; r++) {
                    double t0 = now();
                    strata_xcpu_matmul_simd(NULL, STRATA_XCPU_Q8, &m, x, 1, y, scr, lv, &err);
                    t[r] = now() - t0;
                }
                double best = t[0];
                for (int r = 1; r < n; r++)
                    best = t[r] < best ? t[r] : best;
                printf(" %.2f / %.2f |", mb / 1e3 / median(t, n), mb / 1e3 / best);
                fflush(stdout);
            }
            printf("\n");
            free(w);
            free(x);
            free(y);
            free(scr);
            free(t);
        }
    }
}

static void bench_ffn(struct strata_pool *pool, int reps, size_t mib)
{
    const size_t rg = strata_ggml_row_size(STRATA_TYPE_Q4_K, N_EMBD);
    const size_t rd = strata_ggml_row_size(STRATA_TYPE_Q6_K, N_FF);
    const size_t bg = rg * N_FF, bd = rd * N_EMBD, per = 2 * bg + bd;
    int n_pool = (int)((mib << 20) / per);
    struct strata_err err = {0, ""};
    if (n_pool < 8)
        n_pool = 8;
    uint8_t *w = aligned_alloc(64, per * (size_t)n_pool);
    float *x = malloc(sizeof(float) * 8 * N_EMBD), *y = malloc(sizeof(float) * 8 * N_EMBD);
    void *work = aligned_alloc(64, (strata_xcpu_ffn_work_bytes(N_EMBD, N_FF, 8) + 63) / 64 * 64);
    double *t = malloc(sizeof(double) * (size_t)reps);
    if (!w || !x || !y || !work || !t) {
        fprintf(stderr, "bench_expert_cpu: out of memory\n");
        exit(1);
    }
    /* one expert of random blocks, copied to the others */
    fill_weights(STRATA_TYPE_Q4_K, w, rg, N_EMBD, 2 * N_FF);
    fill_weights(STRATA_TYPE_Q6_K, w + 2 * bg, rd, N_FF, N_EMBD);
    for (int e = 1; e < n_pool; e++)
        memcpy(w + per * (size_t)e, w, per);
    for (int i = 0; i < N_EMBD; i++)
        x[i] = qt_uniform();
    for (int e = 1; e < 8; e++)
        memcpy(x + e * N_EMBD, x, sizeof(float) * N_EMBD);
    printf("\n%d threads, strata_xcpu_ffn_batch, one token per expert (Q4_K gate/up [%d, %d], "
           "Q6_K down [%d, %d], %.2f MB per expert; median / best of %d runs)\n\n"
           "| experts | warm GB/s | warm us | cold GB/s | cold us |\n|---|---|---|---|---|\n",
           strata_pool_n_threads(pool), N_FF, N_EMBD, N_EMBD, N_FF, (double)per / 1e6, reps);
    static const int n_exs[] = {1, 2, 4, 8};
    int next = 0;
    for (size_t k = 0; k < sizeof n_exs / sizeof n_exs[0]; k++) {
        const int n_ex = n_exs[k];
        struct strata_xcpu_expert ex[8];
        double res[2][2];
        for (int cold = 0; cold < 2; cold++) {
            for (int r = -1; r < reps; r++) {
                for (int e = 0; e < n_ex; e++) {
                    int id = cold ? (next + e) % n_pool : e;
                    uint8_t *base = w + per * (size_t)id;
                    ex[e].gate = (struct strata_mat){STRATA_TYPE_Q4_K, N_EMBD, N_FF, rg, base};
                    ex[e].up = (struct strata_mat){STRATA_TYPE_Q4_K, N_EMBD, N_FF, rg, base + bg};
                    ex[e].down =
                        (struct strata_mat){STRATA_TYPE_Q6_K, N_FF, N_EMBD, rd, base + 2 * bg};
                    ex[e].x = x + e * N_EMBD;
                    ex[e].y = y + e * N_EMBD;
                    ex[e].n_tok = 1;
                }
                if (cold)
                    next = (next + n_ex) % n_pool;
                double t0 = now();
                if (strata_xcpu_ffn_batch(pool, ex, n_ex, 1, 1, work, &err)) {
                    fprintf(stderr, "bench_expert_cpu: %s\n", err.msg);
                    exit(1);
                }
                if (r >= 0)
                    t[r] = now() - t0;
            }
            double best = t[0];
            for (int r = 1; r < reps; r++)
                best = t[r] < best ? t[r] : best;
            res[cold][0] = median(t, reps);
            res[cold][1] = best;
        }
        const double gb = (double)per * n_ex / 1e9;
        printf("| %d | %.1f / %.1f | %.0f | %.1f / %.1f | %.0f |\n", n_ex, gb / res[0][0],
               gb / res[0][1], res[0][0] * 1e6, gb / res[1][0], gb / res[1][1],
               res[1][0] * 1e6);
        fflush(stdout);
    }
    free(w);
    free(x);
    free(y);
    free(work);
    free(t);
}

int main(int argc, char **argv)
{
    int threads = 0, reps = 15, level = -1, c;
    size_t mib = 1024;
    while ((c = getopt(argc, argv, "t:r:m:s:h")) != -1) {
        switch (c) {
        case 't': threads = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 'm': mib = (size_t)atol(optarg); break;
        case 's':
            if ((level = parse_level(optarg)) >= 0)
                break;
            /* fall through */
        default:
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: bench_expert_cpu [-t THREADS] [-r REPS] [-m MIB] "
                    "[-s scalar|avx2|avx512]\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (reps < 1 || optind < argc) {
        fprintf(stderr, "bench_expert_cpu: bad arguments (see -h)\n");
        return 2;
    }
    int max_level = strata_quant_simd_level();
    if (level >= 0 && level < max_level)
        max_level = level;
    struct strata_err err = {0, ""};
    struct strata_pool *pool = NULL;
    if (strata_pool_create(&pool, threads, &err)) {
        fprintf(stderr, "bench_expert_cpu: %s\n", err.msg);
        return 1;
    }
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    const int nth = strata_pool_n_threads(pool);
    printf("%s, %d online CPUs; simd up to %s; pool of %d threads\n", cpu,
           strata_pool_cpu_count(), strata_quant_simd_name(max_level), nth);

    /* 1. hand-over: back to back, as the layers of a decode step run */
    const int nh = 2001;
    double *th = malloc(sizeof(double) * nh);
    if (!th)
        return 1;
    for (int r = 0; r < 100; r++)
        strata_pool_run(pool, noop, NULL);
    for (int r = 0; r < nh; r++) {
        double t0 = now();
        strata_pool_run(pool, noop, NULL);
        th[r] = now() - t0;
    }
    const double med = median(th, nh); /* sorts th */
    printf("pool run of trivial work: median %.2f us, 90th percentile %.2f us back to back",
           med * 1e6, th[nh * 9 / 10] * 1e6);
    /* after the pool sat idle, as between two layers' CPU experts (the workers spin,
     * then yield, then sleep) */
    static const int idle_us[] = {100, 1000, 30000};
    for (size_t k = 0; k < sizeof idle_us / sizeof idle_us[0]; k++) {
        const int n = idle_us[k] >= 30000 ? 15 : 101;
        for (int r = 0; r < n; r++) {
            usleep((useconds_t)idle_us[k]);
            double t0 = now();
            strata_pool_run(pool, noop, NULL);
            th[r] = now() - t0;
        }
        printf("; %.2f us after %d us idle", median(th, n) * 1e6, idle_us[k]);
    }
    printf("\n");
    free(th);

    bench_rows(max_level, reps);
    bench_ffn(pool, reps, mib);
    strata_pool_free(pool);
    return 0;
}
