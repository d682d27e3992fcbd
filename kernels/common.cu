/* common.cu - device query, launch checking and the type table of the kernels. */
#include "kernels.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dequant.cuh"

/* The kernels are linked into a plugin without the library, so the error record
 * (a plain struct of lib/err.h) is filled here. */
int strata_k_err(struct strata_err *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return code;
}

int strata_gpu_info_query(int dev, struct strata_gpu_info *info, struct strata_err *err)
{
    cudaDeviceProp p;
    memset(info, 0, sizeof(*info));
    cudaError_t e = cudaGetDeviceProperties(&p, dev);
    if (e != cudaSuccess)
        return strata_k_err(err, STRATA_E_GPU, "cannot query %s device %d: %s: %s",
                       STRATA_GPU_RUNTIME_NAME, dev, cudaGetErrorName(e),
                       cudaGetErrorString(e));
    info->device = dev;
    snprintf(info->name, sizeof(info->name), "%s", p.name);
#ifdef STRATA_GPU_HIP
    snprintf(info->arch, sizeof(info->arch), "%s", p.gcnArchName);
    char *colon = strchr(info->arch, ':'); /* "gfx90a:sramecc+:xnack-" */
    if (colon)
        *colon = 0;
    info->has_mma_f16 = 0;
#else
    snprintf(info->arch, sizeof(info->arch), "sm_%d%d", p.major, p.minor);
    info->has_mma_f16 = p.major >= 8;
#endif
    info->warp_size = p.warpSize;
    info->n_sm = p.multiProcessorCount;
    info->smem_per_block = p.sharedMemPerBlock;
#ifdef STRATA_GPU_HIP
    info->smem_optin = p.sharedMemPerBlock;
#else
    info->smem_optin = p.sharedMemPerBlockOptin;
#endif
    info->vram_total = p.totalGlobalMem;
    size_t fr = 0, tot = 0;
    if (cudaSetDevice(dev) == cudaSuccess && cudaMemGetInfo(&fr, &tot) == cudaSuccess)
        info->vram_free = fr;
    (void)cudaGetLastError();
    if (cudaRuntimeGetVersion(&info->runtime_version) != cudaSuccess)
        info->runtime_version = -1;
    if (cudaDriverGetVersion(&info->driver_version) != cudaSuccess)
        info->driver_version = -1;
    return 0;
}

/* A kernel that does nothing: asking for its attributes tells whether this build holds
 * code the device can run. */
__global__ void image_probe_kernel(int *p)
{
    if (p)
        *p = 0;
}

int strata_gpu_check_image(const struct strata_gpu_info *info, struct strata_err *err)
{
    cudaFuncAttributes fa;
    cudaError_t e = cudaFuncGetAttributes(&fa, reinterpret_cast<const void *>(image_probe_kernel));
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError();
    return strata_k_err(err, STRATA_E_UNSUPPORTED,
                        "this build has no kernels for %s device %d (%s, %s): %s; rebuild "
                        "with %s=%s", STRATA_GPU_RUNTIME_NAME, info->device, info->name,
                        info->arch, cudaGetErrorString(e),
#ifdef STRATA_GPU_HIP
                        "HIP_ARCH", info->arch
#else
                        "CUDA_ARCHS", info->arch + 3
#endif
    );
}

int strata_k_check(struct strata_gpu_ctx *ctx, const char *kernel, dim3 grid, dim3 block,
                   struct strata_err *err, const char *shapes_fmt, ...)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && ctx->sync_debug)
        e = cudaStreamSynchronize(ctx->stream);
    if (e == cudaSuccess)
        return 0;
    char shapes[512];
    va_list ap;
    va_start(ap, shapes_fmt);
    vsnprintf(shapes, sizeof(shapes), shapes_fmt, ap);
    va_end(ap);
    return strata_k_err(err, STRATA_E_GPU,
                   "kernel %s grid (%u,%u,%u) block (%u,%u,%u) [%s] on %s device %d (%s): "
                   "%s: %s",
                   kernel, grid.x, grid.y, grid.z, block.x, block.y, block.z, shapes,
                   STRATA_GPU_RUNTIME_NAME, ctx->info.device, ctx->info.name,
                   cudaGetErrorName(e), cudaGetErrorString(e));
}

int strata_k_type_supported(uint32_t type)
{
    return strata_k_blck(type) != 0;
}

int strata_k_blck(uint32_t type)
{
    switch (type) {
#define CASE(T) case T: return strata_dq<T>::QK;
        STRATA_FOR_EACH_KTYPE(CASE)
#undef CASE
    default:
        return 0;
    }
}

int strata_k_block_bytes(uint32_t type)
{
    switch (type) {
#define CASE(T) case T: return strata_dq<T>::BYTES;
        STRATA_FOR_EACH_KTYPE(CASE)
#undef CASE
    default:
        return 0;
    }
}

int strata_k_code_arch(const void *func)
{
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, func) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return fa.ptxVersion;
}

int strata_k_env_on(const char *name)
{
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0;
}

int strata_k_switch_off(const char *name, int *cache)
{
    if (*cache < 0)
        *cache = strata_k_env_on(name);
    return *cache;
}
