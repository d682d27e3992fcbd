/* kt_common.h - helpers of the GPU kernel tests: random inputs, device buffers,
 * comparison.  Inputs are random and never zero; outputs are poisoned (NaN) before
 * each launch so that an unwritten element fails. */
#ifndef STRATA_TESTS_KT_COMMON_H
#define STRATA_TESTS_KT_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

extern "C" {
#include "ggml_types.h"
#include "quant.h"
#include "tap.h"
}

static uint64_t kt_rng = 0x9e3779b97f4a7c15ull;

static uint32_t kt_u32(void)
{
    kt_rng ^= kt_rng << 13;
    kt_rng ^= kt_rng >> 7;
    kt_rng ^= kt_rng << 17;
    return (uint32_t)(kt_rng >> 16);
}

/* Uniform in [lo, hi). */
static float kt_unif(float lo, float hi)
{
    return lo + (hi - lo) * (float)(kt_u32() & 0xffffff) / 16777216.0f;
}

/* Random, never exactly zero: |v| in [0.05, 1) * scale, random sign. */
static void kt_fill(float *v, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) {
        float a = kt_unif(0.05f, 1.0f) * scale;
        v[i] = (kt_u32() & 1) ? -a : a;
    }
}

#define KT_CUDA(call)                                                                        \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            printf("Bail out! %s:%d %s: %s\n", __FILE__, __LINE__, #call,                    \
                   cudaGetErrorString(e_));                                                  \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static void *kt_dev(size_t bytes)
{
    void *p = NULL;
    KT_CUDA(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

static void *kt_up(const void *h, size_t bytes)
{
    void *d = kt_dev(bytes);
    KT_CUDA(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void kt_down(void *h, const void *d, size_t bytes)
{
    KT_CUDA(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* Fill a device float buffer with NaN. */
static void kt_poison(void *d, size_t bytes)
{
    KT_CUDA(cudaMemset(d, 0xff, bytes));
}

/* Max of |a - b| / (atol + rtol * |b|) over n values; NaN in a counts as infinite. */
static double kt_err(const float *a, const float *b, size_t n, double atol, double rtol,
                     size_t *worst)
{
    double m = 0;
    *worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = isfinite(a[i]) ? fabs((double)a[i] - b[i]) / (atol + rtol * fabs(b[i]))
                                  : INFINITY;
        if (e > m || (isinf(e) && !isinf(m))) {
            m = e;
            *worst = i;
        }
    }
    return m;
}

#endif
