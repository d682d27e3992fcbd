/* gpu.h - the one place that knows whether the kernels are built for CUDA or HIP.
 *
 * Kernels are written in CUDA spelling.  Under hipcc (__HIP_PLATFORM_AMD__ or
 * __HIPCC__) the runtime API, types and intrinsics below are mapped to HIP.
 * Nothing else in kernels/ tests the vendor: it tests the feature macros defined here.
 *
 * Feature macros (device code):
 *   STRATA_GPU_MMA_F16   mma.sync m16n8k16 f16 -> f32 is available (NVIDIA sm_80+)
 * The warp/wavefront size is never a constant: device code reads warpSize (32 on
 * NVIDIA, 32 or 64 on AMD), host code reads strata_gpu_info.warp_size, which the
 * backend fills from the device properties at start.
 */
#ifndef STRATA_KERNELS_GPU_H
#define STRATA_KERNELS_GPU_H

#include <stddef.h>
#include <stdint.h>

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#define STRATA_GPU_HIP 1
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>

#define STRATA_GPU_RUNTIME_NAME "hip"
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorNotReady hipErrorNotReady
#define cudaStream_t hipStream_t
#define cudaEvent_t hipEvent_t
#define cudaGraph_t hipGraph_t
#define cudaGraphExec_t hipGraphExec_t
#define cudaDeviceProp hipDeviceProp_t
#define cudaGetErrorString hipGetErrorString
#define cudaGetErrorName hipGetErrorName
#define cudaGetLastError hipGetLastError
#define cudaPeekAtLastError hipPeekAtLastError
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaSetDevice hipSetDevice
#define cudaGetDevice hipGetDevice
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaDriverGetVersion hipDriverGetVersion
#define cudaRuntimeGetVersion hipRuntimeGetVersion
#define cudaMemGetInfo hipMemGetInfo
#define cudaHostRegister hipHostRegister
#define cudaHostUnregister hipHostUnregister
#define cudaHostGetDevicePointer hipHostGetDevicePointer
#define cudaHostRegisterMapped hipHostRegisterMapped
#define cudaHostAlloc hipHostMalloc
#define cudaHostAllocMapped hipHostMallocMapped
#define cudaStreamWaitEvent hipStreamWaitEvent
#define cudaEventQuery hipEventQuery
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
/* registering a read-only mapping (the experts of a GGUF/pack) needs the flag where the
 * runtime has it; without it registration of such a mapping fails and the caller falls
 * back to bounce buffers */
#ifdef hipHostRegisterReadOnly
#define STRATA_GPU_HOST_REGISTER_READ_ONLY hipHostRegisterReadOnly
#else
#define STRATA_GPU_HOST_REGISTER_READ_ONLY hipHostRegisterDefault
#endif
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMallocHost hipHostMalloc
#define cudaFreeHost hipHostFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemset hipMemset
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaMemcpyToSymbol hipMemcpyToSymbol
#define cudaStreamCreate hipStreamCreate
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamCreateWithPriority hipStreamCreateWithPriority
#define cudaDeviceGetStreamPriorityRange hipDeviceGetStreamPriorityRange
#define cudaGraphInstantiateFlagUseNodePriority 0
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStreamQuery hipStreamQuery
#define cudaStreamBeginCapture hipStreamBeginCapture
#define cudaStreamEndCapture hipStreamEndCapture
#define cudaStreamCaptureModeRelaxed hipStreamCaptureModeRelaxed
#define cudaGraphInstantiate(e, g, f) hipGraphInstantiate((e), (g), NULL, NULL, 0)
#define cudaGraphLaunch hipGraphLaunch
#define cudaGraphExecDestroy hipGraphExecDestroy
#define cudaGraphDestroy hipGraphDestroy
#define cudaEventCreate hipEventCreate
#define cudaEventDestroy hipEventDestroy
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaFuncSetAttribute hipFuncSetAttribute
#define cudaFuncAttributes hipFuncAttributes
#define cudaFuncGetAttributes hipFuncGetAttributes
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor
#define cudaDevAttrCooperativeLaunch hipDeviceAttributeCooperativeLaunch

/* Full-wavefront shuffles: HIP's shuffles take no mask. */
#define STRATA_SHFL_XOR(v, m) __shfl_xor((v), (m), warpSize)
/* a barrier with ordering of shared-memory accesses, for the warp's own (the block's
 * here: no wavefront-level barrier is assumed) */
#define STRATA_SYNC_WARP() __syncthreads()
#define STRATA_SHFL(v, l) __shfl((v), (l), warpSize)

#else /* CUDA */
#define STRATA_GPU_CUDA 1
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define STRATA_GPU_RUNTIME_NAME "cuda"
#define STRATA_GPU_HOST_REGISTER_READ_ONLY cudaHostRegisterReadOnly
#define STRATA_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), warpSize)
/* the warp's barrier, with ordering of its shared-memory accesses */
#define STRATA_SYNC_WARP() __syncwarp()
#define STRATA_SHFL(v, l) __shfl_sync(0xffffffffu, (v), (l), warpSize)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define STRATA_GPU_MMA_F16 1
#endif
#endif

/* Defined in the host pass of the compilation only (both compilers run a host pass and
 * one device pass per target): host-only definitions that reference host functions
 * go under it. */
#if !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define STRATA_GPU_HOST_PASS 1
#endif

/* The largest warp/wavefront any supported device has; sizes shared-memory arrays
 * of per-warp partial results.  The actual size is read at run time. */
#define STRATA_GPU_MAX_WARP 64
/* Threads per block of the element-wise and row kernels: a multiple of 64, so that it
 * holds whole wavefronts on every vendor. */
#define STRATA_GPU_BLOCK 256

/* What the kernels need to know about the device they run on; read once from the
 * device properties by strata_gpu_info_query(). */
struct strata_gpu_info {
    int device;             /* runtime device index */
    char name[256];         /* marketing name */
    char arch[32];          /* "sm_90" or "gfx1100" */
    int warp_size;          /* 32 or 64 */
    int n_sm;               /* multiprocessors / compute units */
    size_t smem_per_block;  /* default shared memory per block, bytes */
    size_t smem_optin;      /* opt-in maximum shared memory per block, bytes */
    int has_mma_f16;        /* matrix units usable by the mat-mat kernel */
    size_t vram_total;      /* bytes */
    size_t vram_free;       /* bytes, at query time */
    int runtime_version;
    int driver_version;
};

/* Sum of v over the calling warp/wavefront; every lane gets the result.  The
 * reduction tree is fixed, so the result is the same for the same inputs. */
static __device__ __forceinline__ float strata_warp_sum(float v)
{
    for (int m = warpSize / 2; m > 0; m >>= 1)
        v += STRATA_SHFL_XOR(v, m);
    return v;
}

static __device__ __forceinline__ float strata_warp_max(float v)
{
    for (int m = warpSize / 2; m > 0; m >>= 1)
        v = fmaxf(v, STRATA_SHFL_XOR(v, m));
    return v;
}

/* Block-wide sum of v (blockDim.x a multiple of warpSize, at most 1024 threads).
 * scratch: STRATA_GPU_MAX_WARP floats of shared memory.  All threads get the sum. */
static __device__ __forceinline__ float strata_block_sum(float v, float *scratch)
{
    int lane = threadIdx.x % warpSize, wid = threadIdx.x / warpSize;
    int nw = blockDim.x / warpSize;
    v = strata_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        scratch[wid] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < nw; i++)
        s += scratch[i];
    return s;
}

static __device__ __forceinline__ float strata_block_max(float v, float *scratch)
{
    int lane = threadIdx.x % warpSize, wid = threadIdx.x / warpSize;
    int nw = blockDim.x / warpSize;
    v = strata_warp_max(v);
    __syncthreads();
    if (lane == 0)
        scratch[wid] = v;
    __syncthreads();
    float s = scratch[0];
    for (int i = 1; i < nw; i++)
        s = fmaxf(s, scratch[i]);
    return s;
}

/* c + the sum of the products of the four signed bytes of a and b: NVIDIA's dp4a
 * (sm_61+), AMD's v_dot4_i32_i8 where the target has it, else byte by byte. */
static __device__ __forceinline__ int strata_dp4a(int a, int b, int c)
{
#if defined(STRATA_GPU_CUDA) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 610)
    return __dp4a(a, b, c);
#elif defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) || \
    defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || \
    defined(__gfx1030__) || defined(__gfx1031__) || defined(__gfx1032__) || \
    defined(__gfx1034__) || defined(__gfx1035__) || defined(__gfx1036__)
    return __builtin_amdgcn_sdot4(a, b, c, false);
#elif defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) || \
    defined(__gfx1103__) || defined(__gfx1150__) || defined(__gfx1151__) || \
    defined(__gfx1200__) || defined(__gfx1201__)
    return __builtin_amdgcn_sudot4(true, a, true, b, c, false);
#else
    return c + (int)(int8_t)a * (int)(int8_t)b + (int)(int8_t)(a >> 8) * (int)(int8_t)(b >> 8) +
           (int)(int8_t)(a >> 16) * (int)(int8_t)(b >> 16) + (a >> 24) * (b >> 24);
#endif
}

#if defined(STRATA_TIMELINE) && defined(STRATA_GPU_CUDA)
/* Timeline builds (make ... STRATA_TIMELINE=1; CUDA only, never a release): thread 0 of
 * block 0 of every kernel that calls strata_pdl_wait() appends one record - %globaltimer
 * just before the wait and just after it, the grid and the block size - to a device
 * buffer that the backend sets up (strata_tl_open) and writes out when it is freed.  The
 * record's index is taken before the wait, so the atomic's round trip overlaps it.
 * Each translation unit has its own copy of the pointers; strata_tl_register collects
 * their setters (kernels.h). */
struct strata_tl_rec {
    unsigned long long t_pre, t_wait;
    unsigned grid[3], block;
};
static __device__ struct strata_tl_rec *strata_tl_buf;
static __device__ unsigned long long *strata_tl_seq;
static __device__ unsigned long long strata_tl_cap;
/* Phase marks (strata_tl_mark): STRATA_TL_MARKS pairs (clock cycles summed, count) after
 * the sequence counter; each block's thread 0 keeps the cycle its wait ended */
#define STRATA_TL_MARKS 32
#define STRATA_TL_LANES 8
static __shared__ long long strata_tl_w0;
extern "C" void strata_tl_register(void (*set)(void *buf, void *seq, unsigned long long cap));
static void strata_tl_set_here(void *buf, void *seq, unsigned long long cap)
{
    (void)cudaMemcpyToSymbol(strata_tl_buf, &buf, sizeof buf);
    (void)cudaMemcpyToSymbol(strata_tl_seq, &seq, sizeof seq);
    (void)cudaMemcpyToSymbol(strata_tl_cap, &cap, sizeof cap);
}
static const int strata_tl_registered = (strata_tl_register(strata_tl_set_here), 0);
#endif

/* Programmatic dependent launch (NVIDIA sm_90+; strata_k_launch with ctx->pdl): a
 * kernel may be scheduled while the kernel before it on the stream still runs, and
 * strata_pdl_wait() blocks until that one has finished and its writes are visible;
 * strata_pdl_trigger() lets the next kernel be scheduled.  No-ops elsewhere. */
static __device__ __forceinline__ void strata_pdl_wait(void)
{
#if defined(STRATA_TIMELINE) && defined(STRATA_GPU_CUDA) && defined(__CUDA_ARCH__)
    const bool tl = threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 &&
                    blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && strata_tl_buf;
    unsigned long long tl_i = 0, tl_t0 = 0;
    if (tl) {
        tl_i = atomicAdd(strata_tl_seq, 1ull);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(tl_t0));
    }
#endif
#if defined(STRATA_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if defined(STRATA_TIMELINE) && defined(STRATA_GPU_CUDA) && defined(__CUDA_ARCH__)
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0)
        strata_tl_w0 = clock64();
    if (tl) {
        unsigned long long t1;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
        if (tl_i < strata_tl_cap) {
            struct strata_tl_rec r = {tl_t0, t1, {gridDim.x, gridDim.y, gridDim.z},
                                      blockDim.x * blockDim.y * blockDim.z};
            strata_tl_buf[tl_i] = r;
        }
    }
#endif
}

/* Timeline builds: when sel, thread 0 of the block adds the cycles since its
 * strata_pdl_wait() returned to phase mark id's sum (strata_tl_close prints the mean
 * of every mark used).  No-op elsewhere. */
static __device__ __forceinline__ void strata_tl_mark(int id, bool sel)
{
#if defined(STRATA_TIMELINE) && defined(STRATA_GPU_CUDA) && defined(__CUDA_ARCH__)
    if (sel && threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 && strata_tl_seq &&
        id >= 0 && id < STRATA_TL_MARKS) {
        /* STRATA_TL_LANES copies of the marks, 512 bytes apart, taken by blockIdx.x: the
         * atomics of a mark every block reaches do not queue on one line */
        const long long d = clock64() - strata_tl_w0;
        unsigned long long *m =
            strata_tl_seq + 1 + 2 * (id + STRATA_TL_MARKS * (blockIdx.x % STRATA_TL_LANES));
        atomicAdd(m, (unsigned long long)d);
        atomicAdd(m + 1, 1ull);
    }
#else
    (void)id;
    (void)sel;
#endif
}

static __device__ __forceinline__ void strata_pdl_trigger(void)
{
#if defined(STRATA_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Asynchronous copies global -> shared (NVIDIA sm_80+ cp.async.cg; elsewhere a plain
 * copy, complete when the call returns).  strata_cp_async16: 16 bytes to dst (16-byte
 * aligned), of which src_bytes (16, or 0: none read) come from src and the rest are
 * zero; strata_cp_async_commit closes the group of copies issued so far;
 * strata_cp_async_wait<N> waits until at most N groups are still in flight (their data
 * is visible to the issuing thread; other threads need a barrier after). */
static __device__ __forceinline__ void strata_cp_async16(void *dst, const void *src,
                                                         int src_bytes)
{
#if defined(STRATA_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(src_bytes));
#else
    *(uint4 *)dst = src_bytes ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
#endif
}

static __device__ __forceinline__ void strata_cp_async_commit(void)
{
#if defined(STRATA_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;");
#endif
}

template <int N> static __device__ __forceinline__ void strata_cp_async_wait(void)
{
#if defined(STRATA_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

/* The bulk copy engine (NVIDIA sm_90+: cp.async.bulk, completing on an mbarrier in
 * shared memory; PTX ISA, "Data Movement and Conversion Instructions: cp.async.bulk" and
 * "mbarrier").  STRATA_GPU_BULK is 1 in the device passes that have it; elsewhere these
 * functions do nothing and a caller takes another path (`if (STRATA_GPU_BULK && ...)`).
 * strata_mbar_init: the barrier at bar (8 bytes of shared memory) expects count arrivals
 * a phase; the block synchronises after it before any thread waits on it.
 * strata_bulk_copy (one thread): bytes (a multiple of 16; dst and src 16-byte aligned)
 * from global src to shared dst, this thread's arrival on bar counting them; the copy
 * may overwrite what the block read before its last barrier (the proxy fence orders
 * those reads first).  strata_mbar_wait: until bar's phase of the given parity (0 for
 * its first phase, then 1, 0, ...) is complete: the copy's bytes are then visible to the
 * waiting thread. */
#if defined(STRATA_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define STRATA_GPU_BULK 1
#else
#define STRATA_GPU_BULK 0
#endif

static __device__ __forceinline__ void strata_mbar_init(uint64_t *bar, unsigned count)
{
#if STRATA_GPU_BULK
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n\t"
                 "fence.mbarrier_init.release.cluster;" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(bar)),
                 "r"(count)
                 : "memory");
#else
    (void)bar, (void)count;
#endif
}

static __device__ __forceinline__ void strata_bulk_copy(void *dst, const void *src,
                                                        unsigned bytes, uint64_t *bar)
{
#if STRATA_GPU_BULK
    const uint32_t b = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("fence.proxy.async.shared::cta;\n\t"
                 "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n\t"
                 "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%2], [%3], %1, [%0];" ::"r"(b),
                 "r"(bytes), "r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
#else
    (void)dst, (void)src, (void)bytes, (void)bar;
#endif
}

static __device__ __forceinline__ void strata_mbar_wait(uint64_t *bar, unsigned parity)
{
#if STRATA_GPU_BULK
    const uint32_t b = (uint32_t)__cvta_generic_to_shared(bar);
    uint32_t done;
    do
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(b), "r"(parity)
                     : "memory");
    while (!done);
#else
    (void)bar, (void)parity;
#endif
}

/* Ask for the 128-byte line at p in L2 (NVIDIA; a no-op elsewhere): for weights a
 * kernel reads after its strata_pdl_wait(), which do not depend on the kernel before. */
static __device__ __forceinline__ void strata_prefetch_l2(const void *p)
{
#if defined(STRATA_GPU_CUDA) && defined(__CUDA_ARCH__)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
    (void)p;
#endif
}

/* Ask for the 128-byte lines that hold bytes [p, p + n) in L2, spread over nt
 * threads: thread t (< nt) asks for lines t, t + nt, ... (a no-op elsewhere). */
static __device__ __forceinline__ void strata_prefetch_l2_bytes(const void *p, size_t n,
                                                                size_t t, size_t nt)
{
#if defined(STRATA_GPU_CUDA) && defined(__CUDA_ARCH__)
    const uintptr_t a = (uintptr_t)p & ~(uintptr_t)127, e = (uintptr_t)p + n;
    for (uintptr_t l = a + 128 * t; l < e; l += 128 * nt)
        strata_prefetch_l2((const void *)l);
#else
    (void)p, (void)n, (void)t, (void)nt;
#endif
}

/* Loads that bypass the multiprocessor's L1 (NVIDIA ld.global.cg; a volatile read
 * elsewhere): for data other blocks of the running kernel wrote, which a stale L1 line
 * of this multiprocessor could otherwise shadow. */
static __device__ __forceinline__ float strata_ldcg_f(const float *p)
{
#ifdef STRATA_GPU_CUDA
    return __ldcg(p);
#else
    return *(const volatile float *)p;
#endif
}
static __device__ __forceinline__ float4 strata_ldcg_f4(const float4 *p)
{
#ifdef STRATA_GPU_CUDA
    return __ldcg(p);
#else
    const volatile float *v = (const volatile float *)p;
    return make_float4(v[0], v[1], v[2], v[3]);
#endif
}
static __device__ __forceinline__ uint4 strata_ldcg_u4(const uint4 *p)
{
#ifdef STRATA_GPU_CUDA
    return __ldcg(p);
#else
    const volatile uint32_t *v = (const volatile uint32_t *)p;
    return make_uint4(v[0], v[1], v[2], v[3]);
#endif
}
/* Stop the kernel with an error the runtime reports to the host (a device-side
 * watchdog: never a silent hang). */
static __device__ __forceinline__ void strata_dev_trap(void)
{
#ifdef STRATA_GPU_CUDA
    __trap();
#else
    __builtin_trap();
#endif
}
/* A device clock for tracing: nanoseconds (NVIDIA %globaltimer), or core clock cycles
 * elsewhere. */
static __device__ __forceinline__ unsigned long long strata_dev_clock(void)
{
#ifdef STRATA_GPU_CUDA
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#else
    return (unsigned long long)clock64();
#endif
}
/* A value and its index as one 64-bit key whose order is (value, then the lower index):
 * the value's bits mapped to an unsigned order << 32 | ~index, so that the largest key
 * is the largest value, or the lowest index of an equal one; -0 is taken as +0 (equal,
 * as the host compares them); NaN is key 0, below every number.  Used by the top-k
 * sort and the argmax folded into the output projection (atomicMax of keys). */
static __device__ __forceinline__ unsigned long long strata_argmax_key(float v, int i)
{
    if (v != v)
        return 0;
    const uint32_t b = v == 0.0f ? 0u : __float_as_uint(v);
    const uint32_t o = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((unsigned long long)o << 32) | (uint32_t)~(uint32_t)i;
}

static __device__ __forceinline__ float strata_h2f(uint16_t h)
{
    __half_raw r;
    r.x = h;
    return __half2float(__half(r));
}

static __device__ __forceinline__ float strata_bf2f(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

#endif
