/* bench_pcie.c - host-to-device bandwidth of pinned host memory, two ways: the copy
 * engine (cudaMemcpyAsync, what the expert cache's fills use) and a kernel reading the
 * mapped pages with 16-byte loads (what a graph decode step's ec_resolve_kernel does
 * with the layer's missed experts), for transfers of a layer's misses (about 1-3 MB)
 * up to 64 MB, over grids of 1/2 to 8 blocks a multiprocessor and 1 to 8 loads in
 * flight per thread.
 *
 *   bench_pcie [--reps R]
 *
 * Prints GB/s (1e9 bytes per second) of each, the best of them per size, and the
 * configuration ec_resolve_kernel uses (4 blocks of 256 threads a multiprocessor, 8
 * loads in flight). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* kernels/bench_bw.cu: GB/s of n bytes, grid 0 = the copy engine */
double strata_gpu_bench_h2d(size_t n, int grid, int unroll, int reps);
int strata_gpu_bench_n_sm(void);

int main(int argc, char **argv)
{
    int reps = 20;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_pcie [--reps R]\n");
            return 2;
        }
    }
    if (reps < 1)
        reps = 1;
    int n_sm = strata_gpu_bench_n_sm();
    if (n_sm <= 0) {
        fprintf(stderr, "bench_pcie: no GPU\n");
        return 1;
    }
    const double mb[] = { 0.5, 1, 2, 4, 8, 16, 64 };
    const int grids[] = { n_sm / 2, n_sm, 2 * n_sm, 4 * n_sm, 8 * n_sm };
    const int unrolls[] = { 1, 2, 4, 8 };
    printf("# host->device GB/s, pinned memory, %d multiprocessors, %d reps\n", n_sm, reps);
    printf("%8s %10s", "MB", "copy");
    for (size_t g = 0; g < sizeof grids / sizeof *grids; g++)
        for (size_t u = 0; u < sizeof unrolls / sizeof *unrolls; u++)
            printf("  g%d/u%d", grids[g], unrolls[u]);
    printf("  %8s %8s\n", "best", "resolve");
    for (size_t i = 0; i < sizeof mb / sizeof *mb; i++) {
        size_t n = (size_t)(mb[i] * 1048576);
        double c = strata_gpu_bench_h2d(n, 0, 0, reps), best = 0, res = 0;
        printf("%8.1f %10.1f", mb[i], c);
        for (size_t g = 0; g < sizeof grids / sizeof *grids; g++)
            for (size_t u = 0; u < sizeof unrolls / sizeof *unrolls; u++) {
                double v = strata_gpu_bench_h2d(n, grids[g], unrolls[u], reps);
                printf(" %7.1f", v);
                if (v > best)
                    best = v;
                if (grids[g] == 4 * n_sm && unrolls[u] == 8)
                    res = v;
            }
        printf("  %8.1f %8.1f\n", best, res);
    }
    return 0;
}
