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
