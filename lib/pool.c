/* pool.c - pthread worker pool (see pool.h).
 *
 * A job is published by bumping a generation counter; workers spin on it for
 * a while after each job (decode runs hundreds of tiny jobs per token, and a
 * futex wake-up per job would cost more than the job) and then sleep on a
 * condition variable.  Completion is an atomic count the caller spins on.
 */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define POOL_MAX_THREADS 512
#define SPIN_BEFORE_SLEEP 20000 /* pause iterations, roughly 0.1-1 ms */
/* Spinning only pays while every thread has a CPU: past this many pauses a
 * waiting thread yields, so an oversubscribed machine (more threads than free
 * cores) still hands each job over within a scheduler round, not a tick. */
#define SPIN_BEFORE_YIELD 2000

struct worker {
    struct strata_pool *pool;
    int ith;
    pthread_t th;
};

struct strata_pool {
    int n_threads;
    struct worker *workers; /* n_threads - 1 */
    int n_started;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;  /* bumped once per job */
    atomic_int done;  /* workers finished with the current job */
    atomic_int stop;
    void (*fn)(void *ctx, int ith, int nth);
    void *ctx;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct strata_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&p->stop, memory_order_acquire)) {
            if (++spins < SPIN_BEFORE_SLEEP) {
                if (spins < SPIN_BEFORE_YIELD)
                    cpu_relax();
                else
                    sched_yield();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen &&
                   !atomic_load_explicit(&p->stop, memory_order_acquire))
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            break;
        seen = g;
        p->fn(p->ctx, w->ith, p->n_threads);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel);
    }
    return NULL;
}

int strata_pool_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 1 ? (int)n : 1;
}

int strata_pool_create(struct strata_pool **out, int n_threads, struct strata_err *err)
{
    int rc = STRATA_OK;
    *out = NULL;
    if (n_threads <= 0)
        n_threads = strata_pool_cpu_count();
    if (n_threads > POOL_MAX_THREADS)
        return strata_err_set(err, STRATA_E_INVALID, "thread pool: %d threads (at most %d)",
                              n_threads, POOL_MAX_THREADS);
    struct strata_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return strata_err_set(err, STRATA_E_NOMEM, "thread pool: out of memory");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof(*p->workers));
        if (!p->workers) {
            rc = strata_err_set(err, STRATA_E_NOMEM, "thread pool: out of memory");
            goto out;
        }
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker *w = &p->workers[i - 1];
        w->pool = p;
        w->ith = i;
        if (pthread_create(&w->th, NULL, worker_main, w) != 0) {
            rc = strata_err_set(err, STRATA_E_INTERNAL,
                                "thread pool: cannot start worker %d of %d", i, n_threads);
            goto out;
        }
        p->n_started++;
    }
out:
    if (rc != STRATA_OK) {
        strata_pool_free(p);
        return rc;
    }
    *out = p;
    return STRATA_OK;
}

void strata_pool_free(struct strata_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->stop, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++)
        pthread_join(p->workers[i].th, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}

int strata_pool_n_threads(const struct strata_pool *p)
{
    return p ? p->n_threads : 1;
}

void strata_pool_run(struct strata_pool *p, void (*fn)(void *ctx, int ith, int nth), void *ctx)
{
    if (!p || p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    /* bump under the mutex so a worker about to sleep cannot miss it */
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);

    fn(ctx, 0, p->n_threads);

    int spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < p->n_threads - 1) {
        if (++spins < SPIN_BEFORE_YIELD)
            cpu_relax();
        else
            sched_yield();
    }
}
