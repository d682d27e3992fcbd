/* bench_quant.c - matvec throughput of every block type next to the
 * machine's streaming-read bandwidth, and the multi-token (prefill) rate.
 *
 *   bench_quant [-t THREADS] [-m MIB] [-T TYPE]... [-n NTOK] [-s simd-level]
 *
 * For each type: a weight matrix of about MIB MiB (ne0 = 4096, larger than
 * the caches), random blocks; the best of several matvecs (one token) gives
 * GB/s of weight bytes read.  Then n_tok tokens through a 4096 x 4096 matrix
 * give the prefill rate.  Results go to stdout as a Markdown table.
 */
#include <getopt.h>
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../unit/quant_testutil.h"
#include "matmul.h"
#include "pool.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct bw_job {
    const uint8_t *buf;
    size_t n;
    long long sink[64];
};

__attribute__((target("avx2"))) static void bw_worker(void *vctx, int ith, int nth)
{
    struct bw_job *j = vctx;
    size_t per = j->n / (size_t)nth / 128 * 128;
    const uint8_t *p = j->buf + per * (size_t)ith;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < per; i += 128) {
        /* the same software prefetch the matvec uses (8 KiB ahead, into L2):
         * without it one core cannot keep enough misses in flight */
        __builtin_prefetch(p + i + 8192, 0, 2);
        __builtin_prefetch(p + i + 8192 + 64, 0, 2);
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    j->sink[ith % 64] = _mm256_extract_epi64(a0, 0);
}

/* Best of several passes of an AVX2 read over a buffer of mib MiB. */
static double stream_bw(struct strata_pool *pool, size_t mib)
{
    size_t n = mib << 20;
    uint8_t *buf = aligned_alloc(64, n);
    if (!buf)
        return 0;
    memset(buf, 1, n);
    struct bw_job j = {buf, n, {0}};
    double best = 1e30;
    for (int r = 0; r < 8; r++) {
        double t = now();
        strata_pool_run(pool, bw_worker, &j);
        t = now() - t;
        best = t < best ? t : best;
    }
    free(buf);
    return (double)n / best / 1e9;
}

static int parse_level(const char *s)
{
    for (int i = 0; i < STRATA_SIMD_COUNT; i++)
        if (strcmp(s, strata_quant_simd_name(i)) == 0)
            return i;
    return -1;
}

int main(int argc, char **argv)
{
    int threads = 0, level = -1, n_tok = 64;
    size_t mib = 256;
    uint32_t types[64];
    int n_types = 0;
    int c;
    while ((c = getopt(argc, argv, "t:m:T:n:s:h")) != -1) {
        switch (c) {
        case 't': threads = atoi(optarg); break;
        case 'm': mib = (size_t)atol(optarg); break;
        case 'n': n_tok = atoi(optarg); break;
        case 's': level = parse_level(optarg); break;
        case 'T': {
            int t = strata_ggml_type_from_name(optarg);
            if (t < 0 || !strata_quant_supported((uint32_t)t) || n_types == 64) {
                fprintf(stderr, "bench_quant: unknown type '%s'\n", optarg);
                return 2;
            }
            types[n_types++] = (uint32_t)t;
            break;
        }
        default:
            fprintf(stderr, "usage: bench_quant [-t THREADS] [-m MIB] [-T TYPE]... [-n NTOK] "
                            "[-s scalar|avx2|avx512]\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (n_types == 0)
        for (size_t i = 0; i < QT_N_TYPES; i++)
            types[n_types++] = qt_types[i];
    if (level < 0)
        level = strata_quant_simd_level();
    struct strata_err err = {0};
    struct strata_pool *pool = NULL;
    if (strata_pool_create(&pool, threads, &err)) {
        fprintf(stderr, "bench_quant: %s\n", err.msg);
        return 1;
    }
    int nth = strata_pool_n_threads(pool);
    double bw = stream_bw(pool, mib);
    printf("threads %d, simd %s, streaming read %.1f GB/s (%zu MiB buffer)\n\n", nth,
           strata_quant_simd_name(level), bw, mib);
    printf("| type | bits/weight | matvec GB/s | %% of stream | matvec ms (%zu MiB) | "
           "prefill %d tok: tok/s (4096x4096) |\n|---|---|---|---|---|---|\n", mib, n_tok);
    fflush(stdout);
    const int64_t ne0 = 4096;
    for (int ti = 0; ti < n_types; ti++) {
        uint32_t type = types[ti];
        size_t row = strata_ggml_row_size(type, (uint64_t)ne0);
        int64_t ne1 = (int64_t)((mib << 20) / row);
        uint8_t *wd = malloc(row * (size_t)ne1);
        float *x = malloc(sizeof(float) * (size_t)ne0 * (size_t)n_tok);
        float *y = malloc(sizeof(float) * (size_t)ne1 * (size_t)(n_tok > 1 ? n_tok : 1));
        if (!wd || !x || !y) {
            fprintf(stderr, "bench_quant: out of memory\n");
            return 1;
        }
        /* random blocks for the first rows, copied over the rest (faster) */
        int64_t uniq = ne1 < 256 ? ne1 : 256;
        for (int64_t r = 0; r < uniq; r++)
            qt_random_blocks(type, wd + (size_t)r * row, ne0 / strata_ggml_blck_size(type));
        for (int64_t r = uniq; r < ne1; r++)
            memcpy(wd + (size_t)r * row, wd + (size_t)(r % uniq) * row, row);
        for (int64_t i = 0; i < ne0 * n_tok; i++)
            x[i] = qt_uniform();
        struct strata_mat w = {type, ne0, ne1, row, wd};
        double best = 1e30;
        for (int r = 0; r < 6; r++) {
            double t = now();
            strata_matmul_rows(pool, &w, x, 1, y, 0, ne1, level, &err);
            t = now() - t;
            best = t < best ? t : best;
        }
        double gbs = (double)(row * (size_t)ne1) / best / 1e9;
        /* prefill: 4096 rows */
        struct strata_mat wp = {type, ne0, ne1 < 4096 ? ne1 : 4096, row, wd};
        double bp = 1e30;
        for (int r = 0; r < 3; r++) {
            double t = now();
            strata_matmul_rows(pool, &wp, x, n_tok, y, 0, wp.ne1, level, &err);
            t = now() - t;
            bp = t < bp ? t : bp;
        }
        printf("| %s | %.2f | %.1f | %.0f%% | %.2f | %.0f |\n", strata_ggml_type_name(type),
               8.0 * (double)row / (double)ne0, gbs, 100.0 * gbs / bw, best * 1e3,
               (double)n_tok / bp * ((double)wp.ne1 / 4096.0));
        fflush(stdout);
        free(wd);
        free(x);
        free(y);
    }
    /* small shapes, as in a small model's layers: per-call cost dominates */
    static const int64_t shapes[][2] = {{256, 256}, {256, 4096}, {2048, 2048}};
    static const uint32_t stypes[] = {STRATA_TYPE_Q4_K, STRATA_TYPE_Q6_K, STRATA_TYPE_Q8_0,
                                      STRATA_TYPE_IQ4_XS, STRATA_TYPE_F16};
    static const int stoks[] = {1, 128};
    printf("\n| type | ne0 x ne1 | n_tok | us per call | GMAC/s |\n|---|---|---|---|---|\n");
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        for (size_t ti = 0; ti < sizeof(stypes) / sizeof(stypes[0]); ti++) {
            uint32_t type = stypes[ti];
            int64_t ne0 = shapes[si][0], ne1 = shapes[si][1];
            size_t row = strata_ggml_row_size(type, (uint64_t)ne0);
            uint8_t *wd = malloc(row * (size_t)ne1);
            float *x = malloc(sizeof(float) * (size_t)ne0 * 128);
            float *y = malloc(sizeof(float) * (size_t)ne1 * 128);
            if (!wd || !x || !y)
                return 1;
            for (int64_t r = 0; r < ne1; r++)
                qt_random_blocks(type, wd + (size_t)r * row, ne0 / strata_ggml_blck_size(type));
            for (int64_t i = 0; i < ne0 * 128; i++)
                x[i] = qt_uniform();
            struct strata_mat w = {type, ne0, ne1, row, wd};
            for (size_t k = 0; k < sizeof(stoks) / sizeof(stoks[0]); k++) {
                int nt = stoks[k];
                int reps = (int)(2e8 / ((double)ne0 * (double)ne1 * nt)) + 3;
                double best = 1e30;
                for (int r = 0; r < 3; r++) {
                    double t = now();
                    for (int q = 0; q < reps; q++)
                        strata_matmul_rows(pool, &w, x, nt, y, 0, ne1, level, &err);
                    t = (now() - t) / reps;
                    best = t < best ? t : best;
                }
                printf("| %s | %lldx%lld | %d | %.1f | %.1f |\n", strata_ggml_type_name(type),
                       (long long)ne0, (long long)ne1, nt, best * 1e6,
                       (double)ne0 * (double)ne1 * nt / best / 1e9);
                fflush(stdout);
            }
            free(wd);
            free(x);
            free(y);
        }
    }
    strata_pool_free(pool);
    return 0;
}
