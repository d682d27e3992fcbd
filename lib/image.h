/* image.h - decoding images and preparing them for a vision encoder.
 *
 * Decoding uses stb_image (PNG, JPEG, BMP, GIF first frame, ...).  Every
 * image becomes 8-bit RGB: grayscale and palette images are expanded, 16-bit
 * samples reduced to 8 bits, and alpha composited over a white background
 * (as Hugging Face's convert_to_rgb does).
 *
 * Resizing is the antialiased bicubic resampling of 8-bit images that the
 * Hugging Face image processors run (Pillow's algorithm, as torchvision's
 * resize(antialias=True) computes it for uint8): separable, the filter
 * support growing with the downscale factor, Keys' cubic with a = -0.5,
 * 16-bit fixed-point weights, a horizontal pass then a vertical one, each
 * rounded and clamped to 8 bits.
 */
#ifndef STRATA_IMAGE_H
#define STRATA_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* Limits that keep a hostile file from allocating without bound. */
#define STRATA_IMAGE_MAX_SIDE 32768
#define STRATA_IMAGE_MAX_PIXELS (100ll * 1000 * 1000)

struct strata_image {
    int w, h;
    uint8_t *rgb; /* [h][w][3], owned (strata_image_free) */
};

/* Decode an image file / a buffer (name used in messages).  Errors:
 * STRATA_E_IO (cannot read; path a directory or not a regular file),
 * STRATA_E_FORMAT (not an image, truncated or
 * corrupt: the message has the decoder's reason), STRATA_E_LIMIT (larger
 * than STRATA_IMAGE_MAX_SIDE / _MAX_PIXELS), STRATA_E_NOMEM. */
int strata_image_load(struct strata_image *img, const char *path, struct strata_err *err);
int strata_image_load_mem(struct strata_image *img, const void *buf, size_t size,
                          const char *name, struct strata_err *err);
void strata_image_free(struct strata_image *img);

/* Resize to out_w x out_h (bicubic with antialiasing, above).  dst is
 * overwritten and owned by the caller.  Errors: STRATA_E_INVALID, NOMEM. */
int strata_image_resize(const struct strata_image *src, int out_w, int out_h,
                        struct strata_image *dst, struct strata_err *err);

/* Qwen2-VL's smart_resize (Qwen2VLImageProcessor): the size closest to
 * (h, w) whose sides are multiples of factor (patch * merge) and whose area
 * lies in [min_pixels, max_pixels], keeping the aspect ratio.  Aspect ratios
 * above 200 are refused (STRATA_E_INVALID), as the reference does. */
int strata_image_smart_resize(int h, int w, int factor, int64_t min_pixels, int64_t max_pixels,
                              int *out_h, int *out_w, struct strata_err *err);

/* Patches in Qwen2-VL order.  img must already have sides that are
 * multiples of patch * merge.  Each patch is the vector
 * [3 channels][temporal][patch][patch] of (x / 255 - mean[c]) / std[c]
 * (the single image repeated temporal times), and patches are ordered by
 * merge block (row-major over the grid of merge x merge blocks), then row
 * and column inside the block.  *out: malloc'ed [n_patches][3 * temporal *
 * patch * patch], owned by the caller; grid in patches. */
int strata_image_patches(const struct strata_image *img, const float mean[3],
                         const float std[3], int patch, int merge, int temporal, float **out,
                         int *n_patches, int *grid_h, int *grid_w, struct strata_err *err);

#endif
