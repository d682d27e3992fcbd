/* common.cu - device query, launch checking and the type table of the kernels. */
#include "kernels.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

#if defined(STRATA_TIMELINE) && defined(STRATA_GPU_CUDA)
/* Timeline builds: see gpu.h and kernels.h. */
enum { TL_SETTERS = 64, TL_HOST = 8192, TL_CAP = 1 << 21 };
/* the record counter, then the phase marks' (sum, count) pairs (gpu.h) */
#define TL_SEQ_BYTES (sizeof(unsigned long long) * (1 + 2 * STRATA_TL_MARKS * STRATA_TL_LANES))
static void (*tl_setters[TL_SETTERS])(void *, void *, unsigned long long);
static int tl_n_setters;
static struct { const void *k; dim3 grid, block; } tl_host[TL_HOST];
static int tl_n_host;
static struct strata_tl_rec *tl_dev;
static unsigned long long *tl_dev_seq;
static int tl_opens; /* backends open (a draft model's and its target's share the buffer) */

extern "C" void strata_tl_register(void (*set)(void *buf, void *seq, unsigned long long cap))
{
    if (tl_n_setters < TL_SETTERS)
        tl_setters[tl_n_setters++] = set;
}

extern "C" void strata_tl_host_launch(const void *k, dim3 grid, dim3 block)
{
    if (tl_dev && tl_n_host < TL_HOST) {
        tl_host[tl_n_host].k = k;
        tl_host[tl_n_host].grid = grid;
        tl_host[tl_n_host].block = block;
        tl_n_host++;
    }
}

enum { TL_MARKS = 8 };
static double tl_m_prev, tl_m_sum[TL_MARKS + 1];
static long tl_m_n[TL_MARKS + 1];
static int tl_m_last = -1;

extern "C" void strata_tl_host_mark(int i)
{
    if (!tl_dev || i < 0 || i >= TL_MARKS)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const double t = ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
    /* slot i: from the mark before to mark i; slot TL_MARKS: from the last mark of a
     * call to the next call's entry (the caller's own time) */
    const int slot = i == 0 ? TL_MARKS : i;
    if (tl_m_last >= 0) {
        tl_m_sum[slot] += t - tl_m_prev;
        tl_m_n[slot]++;
    }
    tl_m_prev = t;
    tl_m_last = i;
}

extern "C" void strata_tl_open(void)
{
    if (tl_opens++ || tl_dev)
        return;
    if (cudaMalloc((void **)&tl_dev, sizeof(struct strata_tl_rec) * (size_t)TL_CAP) != cudaSuccess ||
        cudaMalloc((void **)&tl_dev_seq, TL_SEQ_BYTES) != cudaSuccess ||
        cudaMemset(tl_dev_seq, 0, TL_SEQ_BYTES) != cudaSuccess) {
        fprintf(stderr, "timeline: no device buffer\n");
        tl_dev = NULL;
        return;
    }
    for (int i = 0; i < tl_n_setters; i++)
        tl_setters[i](tl_dev, tl_dev_seq, TL_CAP);
    fprintf(stderr, "timeline: recording (%d units)\n", tl_n_setters);
}

extern "C" void strata_tl_close(void)
{
    if (tl_opens > 0 && --tl_opens)
        return; /* another backend still records */
    if (!tl_dev)
        return;
    unsigned long long n = 0;
    (void)cudaDeviceSynchronize();
    (void)cudaMemcpy(&n, tl_dev_seq, sizeof n, cudaMemcpyDeviceToHost);
    if (n > TL_CAP)
        n = TL_CAP;
    struct strata_tl_rec *r = (struct strata_tl_rec *)malloc(sizeof(*r) * (n ? n : 1));
    const char *path = getenv("STRATA_TIMELINE_FILE");
    FILE *f = fopen(path && *path ? path : "timeline.csv", "w");
    if (r && f && cudaMemcpy(r, tl_dev, sizeof(*r) * n, cudaMemcpyDeviceToHost) == cudaSuccess) {
        for (int i = 0; i < tl_n_host; i++) {
            const char *name = "?";
            if (cudaFuncGetName(&name, tl_host[i].k) != cudaSuccess)
                name = "?";
            fprintf(f, "H,%d,%u,%u,%u,%u,%s\n", i, tl_host[i].grid.x, tl_host[i].grid.y,
                    tl_host[i].grid.z,
                    tl_host[i].block.x * tl_host[i].block.y * tl_host[i].block.z, name);
        }
        for (unsigned long long i = 0; i < n; i++)
            fprintf(f, "D,%llu,%u,%u,%u,%u,%llu,%llu\n", i, r[i].grid[0], r[i].grid[1],
                    r[i].grid[2], r[i].block, r[i].t_pre, r[i].t_wait);
        fprintf(stderr, "timeline: %llu device records, %d host launches written\n", n,
                tl_n_host);
        unsigned long long mk[2 * STRATA_TL_MARKS], ml[2 * STRATA_TL_MARKS * STRATA_TL_LANES];
        int khz = 0;
        (void)cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
        if (cudaMemcpy(ml, tl_dev_seq + 1, sizeof ml, cudaMemcpyDeviceToHost) == cudaSuccess)
            for (int i = 0; i < STRATA_TL_MARKS; i++) {
                mk[2 * i] = mk[2 * i + 1] = 0;
                for (int l = 0; l < STRATA_TL_LANES; l++) {
                    mk[2 * i] += ml[2 * (i + STRATA_TL_MARKS * l)];
                    mk[2 * i + 1] += ml[2 * (i + STRATA_TL_MARKS * l) + 1];
                }
                if (!mk[2 * i + 1])
                    continue;
                const double cyc = (double)mk[2 * i] / (double)mk[2 * i + 1];
                fprintf(stderr, "timeline: phase mark %d: %.0f cycles (%.3f us at %d MHz) "
                        "after the wait (%llu)\n", i, cyc, khz ? cyc / (khz * 1e-3) : 0.0,
                        khz / 1000, mk[2 * i + 1]);
                fprintf(f, "P,%d,%.1f,%llu,%d\n", i, cyc, mk[2 * i + 1], khz);
            }
        for (int i = 1; i <= TL_MARKS; i++) {
            if (!tl_m_n[i])
                continue;
            if (i == TL_MARKS)
                fprintf(stderr, "timeline: host, the last mark to the next call: %.2f us (%ld)\n",
                        tl_m_sum[i] / tl_m_n[i], tl_m_n[i]);
            else
                fprintf(stderr, "timeline: host, to mark %d: %.2f us (%ld)\n", i,
                        tl_m_sum[i] / tl_m_n[i], tl_m_n[i]);
            fprintf(f, "M,%d,%.3f,%ld\n", i, tl_m_sum[i] / tl_m_n[i], tl_m_n[i]);
        }
    }
    (void)cudaGetLastError();
    if (f)
        fclose(f);
    free(r);
    for (int i = 0; i < tl_n_setters; i++) /* no kernel records into freed memory */
        tl_setters[i](NULL, NULL, 0);
    (void)cudaDeviceSynchronize();
    (void)cudaFree(tl_dev);
    (void)cudaFree(tl_dev_seq);
    (void)cudaGetLastError();
    tl_dev = NULL;
    tl_n_host = 0;
    for (int i = 0; i <= TL_MARKS; i++) {
        tl_m_sum[i] = 0.0;
        tl_m_n[i] = 0;
    }
    tl_m_last = -1;
}
#endif
