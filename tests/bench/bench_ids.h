/* bench_ids.h - the clock and the token-id generator the benchmarks share, so that two
 * programs fed the same seed draw the same ids in the same order (bench_offload measures
 * on them, bench_ec_replay replays their routing).  Header-only, one state per program. */
#ifndef STRATA_BENCH_IDS_H
#define STRATA_BENCH_IDS_H

#include <stdint.h>
#include <time.h>

/* seconds on the monotonic clock */
static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* xorshift64 (Marsaglia 2003); set bench_rng_state (odd) to reseed */
static uint64_t bench_rng_state = 0x2545f4914f6cdd1dull;

static inline uint32_t bench_rnd(void)
{
    bench_rng_state ^= bench_rng_state << 13;
    bench_rng_state ^= bench_rng_state >> 7;
    bench_rng_state ^= bench_rng_state << 17;
    return (uint32_t)(bench_rng_state >> 32);
}

/* uniform in [0, n) */
static inline int32_t bench_rnd_below(int32_t n)
{
    return (int32_t)(((uint64_t)bench_rnd() * (uint64_t)n) >> 32);
}

#endif
