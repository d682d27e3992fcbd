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

/* kt_u32, kt_unif, kt_fill, kt_router_ref, kt_err, kt_random_rows: kernels/kref.h */
#include "kref.h"

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

#endif
