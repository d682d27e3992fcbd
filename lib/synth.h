/* synth.h - synthetic models: GGUF files with random quantised weights in the exact
 * tensor layout of a named real model shape, so that speed can be measured at real
 * sizes without downloading weights.
 *
 * The weights are random blocks whose scales are calibrated on the block type's own
 * dequantisation: every matrix has mean ~0 and rms ~1/45 (~1/sqrt(n_embd) of the
 * full-size shapes), token_embd rms ~1, the norms are near 1, so activations stay
 * bounded (far below f16's 65504) through any number of layers; the text such a model
 * writes is meaningless.  The tokenizer is a SentencePiece vocabulary of the shape's
 * size whose only pieces that text forms are the 256 byte tokens (byte fallback), so
 * the programs run such a model end to end with the real model's logits row.
 */
#ifndef STRATA_SYNTH_H
#define STRATA_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct strata_synth_opts {
    const char *shape;  /* "qwen3-30b-a3b", "qwen3-moe-tiny", "llama-tiny" */
    int n_layer;        /* <= 0: the shape's own layer count */
    const char *ftype;  /* "Q4_K_M" (llama.cpp's mix), or one block type for every
                           matrix ("Q4_K", "Q8_0", "IQ2_XS", "F16", ...) */
    uint64_t seed;
};

/* The names of the known shapes, NULL-terminated. */
const char *const *strata_synth_shapes(void);

/* Build the model in memory: *buf (malloc'ed, caller frees) of *size bytes, a GGUF
 * file.  Errors: STRATA_E_INVALID (unknown shape or ftype: names it), STRATA_E_NOMEM. */
int strata_synth_build(const struct strata_synth_opts *o, void **buf, size_t *size,
                       struct strata_err *err);

/* The same written to path.  The tensors are made in memory first, so this needs about
 * strata_synth_size's bytes of RAM.  Errors as above plus STRATA_E_IO (names the
 * path). */
int strata_synth_write(const struct strata_synth_opts *o, const char *path,
                       struct strata_err *err);

/* *bytes: the tensor bytes the model of o has (what strata_synth_build and _write hold
 * in memory), without making them.  Errors as strata_synth_build's. */
int strata_synth_size(const struct strata_synth_opts *o, uint64_t *bytes,
                      struct strata_err *err);

#endif
