/* bench_handover.cu - what handing over from one kernel to the next costs on this
 * device: a CUDA graph of a chain of N dependent launches (a decode step is 86 of
 * them), replayed R times, in microseconds a launch.  Each kernel reads bytes_per_block
 * bytes per block (ld.global.cg, a different range per block) and writes one value a
 * block, after waiting for the kernel before in one of three ways:
 *
 *   plain  stream order (the next kernel starts when the one before has ended)
 *   pdl    programmatic dependent launch (sm_90): griddepcontrol.wait, then
 *          launch_dependents, as the decode kernels do (kernels/gpu.h)
 *   flag   launched as pdl but without griddepcontrol.wait: thread 0 of each block
 *          spins (ld.acquire.gpu) on a counter that every block of the kernel before
 *          increments (red.release.gpu) when its writes are done
 *
 * so "pdl" minus the kernel's own work is the hand-over the decode step pays per launch,
 * and "flag" says whether a hand-over through memory would be cheaper.  Results and their
 * use: docs/performance.md ("What a hand-over costs").
 *
 *   bench_handover [--kernels N] [--reps R]   (defaults 96 and 200) */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "bench_handover: %s: %s\n", #call, cudaGetErrorString(e_));      \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

enum { MODE_PLAIN, MODE_PDL, MODE_FLAG, N_MODES };
static const char *const mode_name[N_MODES] = {"plain", "pdl", "flag"};

#define MAX_WORDS 4096 /* 16-byte words a block reads, at most */
#define MAX_GRID 512

/* words 16-byte words of this block's range of src, folded into one value that is
 * written only if it is impossible (so the loads are not removed), and out[block] */
static __device__ __forceinline__ void block_work(const uint4 *src, int words, float *out, int i)
{
    unsigned s = 0;
    for (int j = threadIdx.x; j < words; j += blockDim.x) {
        const uint4 v = __ldcg(src + (size_t)blockIdx.x * words + j);
        s += v.x ^ v.y ^ v.z ^ v.w;
    }
    if (s == 0x9e3779b9u)
        out[MAX_GRID + blockIdx.x] = (float)s;
    if (threadIdx.x == 0)
        out[blockIdx.x] = (float)i;
}

__global__ void handover_pdl_kernel(const uint4 *src, int words, float *out, int i)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    block_work(src, words, out, i);
}

/* kernel i waits until cnt[i - 1] == prev_grid, then counts itself into cnt[i] */
__global__ void handover_flag_kernel(const uint4 *src, int words, float *out, int i,
                                     unsigned *cnt, unsigned prev_grid)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (i > 0) {
        if (threadIdx.x == 0) {
            unsigned v;
            do
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                             : "=r"(v)
                             : "l"(cnt + i - 1)
                             : "memory");
            while (v < prev_grid);
        }
        __syncthreads();
    }
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    block_work(src, words, out, i);
    __syncthreads();
    if (threadIdx.x == 0)
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(cnt + i) : "memory");
#else
    (void)cnt, (void)prev_grid;
    block_work(src, words, out, i);
#endif
}

/* Microseconds a launch of a chain of n_k launches in one graph, replayed reps times */
static double chain_us(cudaStream_t st, int mode, int grid, int words, int n_k, int reps,
                       const uint4 *src, float *out, unsigned *cnt)
{
    cudaGraph_t g;
    cudaGraphExec_t ge;
    cudaEvent_t e0, e1;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    if (mode == MODE_FLAG)
        CHECK(cudaMemsetAsync(cnt, 0, sizeof(unsigned) * n_k, st));
    for (int i = 0; i < n_k; i++) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at = {};
        at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at.val.programmaticStreamSerializationAllowed = mode != MODE_PLAIN;
        cfg.gridDim = dim3((unsigned)grid);
        cfg.blockDim = dim3(128);
        cfg.stream = st;
        cfg.attrs = &at;
        cfg.numAttrs = 1;
        if (mode == MODE_FLAG)
            CHECK(cudaLaunchKernelEx(&cfg, handover_flag_kernel, src, words, out, i, cnt,
                                     (unsigned)grid));
        else
            CHECK(cudaLaunchKernelEx(&cfg, handover_pdl_kernel, src, words, out, i));
    }
    CHECK(cudaStreamEndCapture(st, &g));
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    for (int w = 0; w < 5; w++)
        CHECK(cudaGraphLaunch(ge, st));
    CHECK(cudaEventRecord(e0, st));
    for (int r = 0; r < reps; r++)
        CHECK(cudaGraphLaunch(ge, st));
    CHECK(cudaEventRecord(e1, st));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    CHECK(cudaGraphExecDestroy(ge));
    CHECK(cudaGraphDestroy(g));
    return ms * 1000.0 / reps / n_k;
}

int main(int argc, char **argv)
{
    int n_k = 96, reps = 200;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kernels") && i + 1 < argc)
            n_k = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_handover [--kernels N] [--reps R]\n");
            return 2;
        }
    }
    if (n_k < 2 || n_k > 4096 || reps < 1) {
        fprintf(stderr, "bench_handover: --kernels must be 2..4096 and --reps at least 1\n");
        return 2;
    }
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    if (prop.major < 9) {
        fprintf(stderr, "bench_handover: %s is sm_%d%d; programmatic dependent launch needs "
                        "sm_90 or later\n", prop.name, prop.major, prop.minor);
        return 1;
    }
    uint4 *src;
    float *out;
    unsigned *cnt;
    CHECK(cudaMalloc((void **)&src, sizeof(uint4) * MAX_WORDS * MAX_GRID));
    CHECK(cudaMemset(src, 1, sizeof(uint4) * MAX_WORDS * MAX_GRID));
    CHECK(cudaMalloc((void **)&out, sizeof(float) * 2 * MAX_GRID));
    CHECK(cudaMalloc((void **)&cnt, sizeof(unsigned) * n_k));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    printf("%s, %d SMs: a chain of %d launches of 128-thread blocks, %d replays\n", prop.name,
           prop.multiProcessorCount, n_k, reps);
    printf("%6s %12s %10s %10s %10s   (us a launch)\n", "grid", "bytes/block",
           mode_name[MODE_PLAIN], mode_name[MODE_PDL], mode_name[MODE_FLAG]);
    const int grids[] = {40, 128, 132, 512}, words[] = {0, 256, 1024};
    for (size_t gi = 0; gi < sizeof grids / sizeof grids[0]; gi++)
        for (size_t wi = 0; wi < sizeof words / sizeof words[0]; wi++) {
            double us[N_MODES];
            for (int m = 0; m < N_MODES; m++)
                us[m] = chain_us(st, m, grids[gi], words[wi], n_k, reps, src, out, cnt);
            printf("%6d %12d %10.3f %10.3f %10.3f\n", grids[gi], 16 * words[wi], us[0], us[1],
                   us[2]);
        }
    CHECK(cudaFree(src));
    CHECK(cudaFree(out));
    CHECK(cudaFree(cnt));
    CHECK(cudaStreamDestroy(st));
    return 0;
}
