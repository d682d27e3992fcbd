/* splice.h - image embeddings in a prompt: where a language model takes the
 * rows of an embedding payload (vision.h) in place of token ids.
 *
 * Qwen2-VL / Qwen2.5-VL / Qwen3-VL chat formats write an image as
 * <|vision_start|><|image_pad|><|vision_end|>, and the processor expands
 * <|image_pad|> to one position per image token (Hugging Face
 * Qwen2VLProcessor).  Here every occurrence of a text marker in the prompt
 * (by default the model's <|image_pad|>) becomes n_tokens positions of the
 * next image, whose id is -1 in the returned ids (strata_gen_params.embd
 * takes their rows).  When the vocabulary has <|vision_start|> and
 * <|vision_end|> and the marker is not already between them, they are put
 * around the image.  A prompt without any marker gets the images in front
 * of its text, in order.
 *
 * Positions are consecutive (1-D RoPE), which is what the language models
 * this library runs use.  Architectures that declare M-RoPE sections
 * (ARCH.rope.dimension_sections: qwen2vl, qwen25vl, qwen3vl) give image
 * tokens 3-D positions; strata_splice_check refuses them as not supported.
 */
#ifndef STRATA_SPLICE_H
#define STRATA_SPLICE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct strata_gguf;
struct strata_vocab;

#define STRATA_SPLICE_PAD "<|image_pad|>"
#define STRATA_SPLICE_START "<|vision_start|>"
#define STRATA_SPLICE_END "<|vision_end|>"

/* The default marker: STRATA_SPLICE_PAD when the vocabulary has it, else
 * NULL (the model has no image placeholder token). */
const char *strata_splice_default_marker(const struct strata_vocab *v);

/* Whether the model g (n_embd model_n_embd) can take an image of n_embd
 * columns (name: the payload's name, for messages).  Errors:
 * STRATA_E_FORMAT (n_embd differs: names both numbers),
 * STRATA_E_UNSUPPORTED (the architecture declares M-RoPE sections). */
int strata_splice_check(const struct strata_gguf *g, uint32_t model_n_embd, uint32_t n_embd,
                        const char *name, struct strata_err *err);

/* Count the markers in text[0..len). */
int strata_splice_count(const char *text, size_t len, const char *marker);

/* Tokenize text (specials parsed; BOS first when add_bos) with the
 * n_images images, image k taking n_tokens[k] positions at the k-th marker
 * (see above).  *ids malloc'ed (caller frees), image positions -1.
 * Errors: STRATA_E_FORMAT (markers present but their number differs from
 * n_images: says both), STRATA_E_INVALID (empty marker), STRATA_E_LIMIT (more than 2^24 positions),
 * STRATA_E_NOMEM, tokenizer errors. */
int strata_splice_tokenize(const struct strata_vocab *v, const char *text, size_t len,
                           int add_bos, const char *marker, int n_images,
                           const uint32_t *n_tokens, int32_t **ids, size_t *n_ids,
                           struct strata_err *err);

#endif
