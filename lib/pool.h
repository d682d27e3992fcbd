/* pool.h - a pthread worker pool with an explicit size.
 *
 * strata_pool_run(p, fn, ctx) calls fn(ctx, ith, nth) once for every
 * ith < nth = n_threads, the calling thread taking ith 0 and the workers the
 * rest, and returns when every call has returned.  Workers spin briefly after
 * a job (so back-to-back small jobs, as in decoding, skip the wake-up cost)
 * and then sleep on a condition variable.  A pool runs one job at a time: run
 * is not reentrant and must not be called concurrently on the same pool.
 */
#ifndef STRATA_POOL_H
#define STRATA_POOL_H

#include "err.h"

struct strata_pool;

/* Create a pool of n_threads threads in total (n_threads - 1 workers plus the
 * caller); n_threads <= 0 means the number of online CPUs.  At most 512.
 * *out is owned by the caller (strata_pool_free).  Errors: STRATA_E_INVALID
 * (n_threads > 512), STRATA_E_NOMEM, STRATA_E_INTERNAL (pthread_create). */
int strata_pool_create(struct strata_pool **out, int n_threads, struct strata_err *err);

/* Join the workers and free the pool; NULL is accepted. */
void strata_pool_free(struct strata_pool *p);

/* Total threads (the nth passed to each job), >= 1. */
int strata_pool_n_threads(const struct strata_pool *p);

/* Run fn(ctx, ith, nth) for ith = 0 .. nth-1 in parallel; blocks until all
 * returned.  The caller is ith 0.  p may be NULL: fn(ctx, 0, 1) runs inline. */
void strata_pool_run(struct strata_pool *p, void (*fn)(void *ctx, int ith, int nth),
                     void *ctx);

/* Online CPUs (sysconf), >= 1. */
int strata_pool_cpu_count(void);

#endif
