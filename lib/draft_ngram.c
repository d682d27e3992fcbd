/* draft_ngram.c - prompt-lookup drafts: continue the text the way it
 * continued after an earlier occurrence of its last few tokens. */
#include <stdlib.h>
#include <string.h>

#include "spec.h"

int32_t strata_draft_ngram(const int32_t *hist, int32_t n_hist, int ngram_min, int ngram_max,
                           int32_t n_max, int32_t *out)
{
    if (n_max <= 0 || ngram_min < 1)
        return 0;
    for (int n = ngram_max; n >= ngram_min; n--) {
        if (n >= n_hist)
            continue;
        const int32_t *pat = hist + n_hist - n;
        int bad = 0;
        for (int i = 0; i < n; i++)
            bad |= pat[i] < 0;
        if (bad)
            continue;
        /* the latest earlier occurrence: start j < n_hist - n */
        for (int32_t j = n_hist - n - 1; j >= 0; j--) {
            if (hist[j] != pat[0] || memcmp(hist + j, pat, (size_t)n * sizeof *pat) != 0)
                continue;
            int32_t k = 0;
            while (k < n_max && j + n + k < n_hist && hist[j + n + k] >= 0) {
                out[k] = hist[j + n + k];
                k++;
            }
            if (k > 0)
                return k;
        }
    }
    return 0;
}

struct ngram_state {
    int lo, hi;
};

static int ngram_propose(void *state, const int32_t *hist, int32_t n_hist, int32_t n_max,
                         int32_t *out, int32_t *n_out, struct strata_err *err)
{
    (void)err;
    const struct ngram_state *st = state;
    *n_out = strata_draft_ngram(hist, n_hist, st->lo, st->hi, n_max, out);
    return 0;
}

int strata_draft_ngram_init(struct strata_spec_draft *d, int ngram_min, int ngram_max,
                            struct strata_err *err)
{
    memset(d, 0, sizeof *d);
    if (ngram_min < 1 || ngram_max > 64 || ngram_min > ngram_max)
        return strata_err_set(err, STRATA_E_INVALID, "n-gram lengths %d..%d outside 1..64",
                              ngram_min, ngram_max);
    struct ngram_state *st = malloc(sizeof *st);
    if (!st)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    st->lo = ngram_min;
    st->hi = ngram_max;
    d->name = "ngram";
    d->state = st;
    d->propose = ngram_propose;
    d->free = free;
    d->cheap = 1;
    return 0;
}
