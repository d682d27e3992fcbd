/* bench_bw.cu - the device's copy bandwidth (bytes read + written per second), the
 * ceiling the benchmarks report their decode speed against. */
#include "kernels.h"

#ifdef STRATA_GPU_HOST_PASS
extern "C" double strata_gpu_bench_copy_bw(void)
{
    size_t n = (size_t)1 << 31; /* 2 GiB each way */
    void *a = NULL, *b = NULL;
    cudaEvent_t e0, e1;
    float ms = 0.0f;
    double bw = 0.0;
    if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess)
        goto out;
    if (cudaMemset(a, 1, n) != cudaSuccess || cudaEventCreate(&e0) != cudaSuccess ||
        cudaEventCreate(&e1) != cudaSuccess)
        goto out;
    if (cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice) != cudaSuccess)
        goto out;
    if (cudaEventRecord(e0, 0) != cudaSuccess)
        goto out;
    for (int i = 0; i < 10; i++)
        if (cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, 0) != cudaSuccess)
            goto out;
    if (cudaEventRecord(e1, 0) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
        cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
        goto out;
    bw = 2.0 * n * 10 / (ms * 1e-3);
    (void)cudaEventDestroy(e0);
    (void)cudaEventDestroy(e1);
out:
    if (a)
        (void)cudaFree(a);
    if (b)
        (void)cudaFree(b);
    (void)cudaGetLastError();
    return bw;
}
#endif

/* One pass over n16 16-byte units of src (mapped host memory, or VRAM) into dst,
 * U loads in flight per thread: the shape of ec_resolve_kernel's copy. */
template <int U>
__global__ void h2d_read_kernel(const uint4 *__restrict__ src, uint4 *__restrict__ dst,
                                size_t n16)
{
    const size_t gs = (size_t)gridDim.x * blockDim.x;
    for (size_t base = (size_t)blockIdx.x * blockDim.x + threadIdx.x; base < n16;
         base += U * gs) {
        uint4 v[U];
#pragma unroll
        for (int j = 0; j < U; j++)
            if (base + j * gs < n16)
                v[j] = src[base + j * gs];
#pragma unroll
        for (int j = 0; j < U; j++)
            if (base + j * gs < n16)
                dst[base + j * gs] = v[j];
    }
}

/* instantiated in every pass: the launches below are in the host pass only */
template __global__ void h2d_read_kernel<1>(const uint4 *, uint4 *, size_t);
template __global__ void h2d_read_kernel<2>(const uint4 *, uint4 *, size_t);
template __global__ void h2d_read_kernel<4>(const uint4 *, uint4 *, size_t);
template __global__ void h2d_read_kernel<8>(const uint4 *, uint4 *, size_t);

#ifdef STRATA_GPU_HOST_PASS
extern "C" double strata_gpu_bench_h2d(size_t n, int grid, int unroll, int reps)
{
    void *h = NULL, *hd = NULL, *d = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = 0.0f;
    double bw = 0.0;
    n &= ~(size_t)15;
    if (!n || reps < 1 || cudaHostAlloc(&h, n, cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer(&hd, h, 0) != cudaSuccess || cudaMalloc(&d, n) != cudaSuccess ||
        cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
        goto out;
    memset(h, 1, n);
    for (int r = -1; r < reps; r++) { /* one untimed pass */
        if (r == 0 && cudaEventRecord(e0, 0) != cudaSuccess)
            goto out;
        if (grid <= 0) {
            if (cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, 0) != cudaSuccess)
                goto out;
        } else if (unroll >= 8)
            h2d_read_kernel<8><<<grid, 256>>>((const uint4 *)hd, (uint4 *)d, n / 16);
        else if (unroll >= 4)
            h2d_read_kernel<4><<<grid, 256>>>((const uint4 *)hd, (uint4 *)d, n / 16);
        else if (unroll >= 2)
            h2d_read_kernel<2><<<grid, 256>>>((const uint4 *)hd, (uint4 *)d, n / 16);
        else
            h2d_read_kernel<1><<<grid, 256>>>((const uint4 *)hd, (uint4 *)d, n / 16);
        if (cudaGetLastError() != cudaSuccess)
            goto out;
    }
    if (cudaEventRecord(e1, 0) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
        cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess || !(ms > 0))
        goto out;
    bw = (double)n * reps / (ms * 1e-3) / 1e9;
out:
    if (e0)
        (void)cudaEventDestroy(e0);
    if (e1)
        (void)cudaEventDestroy(e1);
    if (d)
        (void)cudaFree(d);
    if (h)
        (void)cudaFreeHost(h);
    (void)cudaGetLastError();
    return bw;
}
#endif

#ifdef STRATA_GPU_HOST_PASS
/* Multiprocessors of the current device, 0 if it cannot be queried. */
extern "C" int strata_gpu_bench_n_sm(void)
{
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}
#endif
