/* image.c - image decoding (stb_image), resizing and patch extraction. */
#include "image.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <stb/stb_image.h>

void strata_image_free(struct strata_image *img)
{
    if (img) {
        free(img->rgb);
        img->rgb = NULL;
        img->w = img->h = 0;
    }
}

/* RGBA -> RGB over white: out = a * c + (1 - a) * 255, rounded. */
static void composite_white(const uint8_t *rgba, uint8_t *rgb, size_t n_px)
{
    for (size_t i = 0; i < n_px; i++) {
        unsigned a = rgba[4 * i + 3];
        for (int c = 0; c < 3; c++)
            rgb[3 * i + c] = (uint8_t)((rgba[4 * i + c] * a + 255 * (255 - a) + 127) / 255);
    }
}

int strata_image_load_mem(struct strata_image *img, const void *buf, size_t size,
                          const char *name, struct strata_err *err)
{
    memset(img, 0, sizeof(*img));
    if (size > (size_t)INT32_MAX)
        return strata_err_set(err, STRATA_E_LIMIT, "image '%s' is too large (%zu bytes)", name,
                              size);
    int w = 0, h = 0, ch = 0;
    if (!stbi_info_from_memory(buf, (int)size, &w, &h, &ch)) {
        const char *why = stbi_failure_reason();
        return strata_err_set(err, STRATA_E_FORMAT, "'%s' is not a readable image: %s", name,
                              why ? why : "unknown format");
    }
    if (w <= 0 || h <= 0 || w > STRATA_IMAGE_MAX_SIDE || h > STRATA_IMAGE_MAX_SIDE ||
        (int64_t)w * h > STRATA_IMAGE_MAX_PIXELS)
        return strata_err_set(err, STRATA_E_LIMIT,
                              "image '%s' is %dx%d; the limit is %d pixels a side and %lld in all",
                              name, w, h, STRATA_IMAGE_MAX_SIDE,
                              (long long)STRATA_IMAGE_MAX_PIXELS);
    uint8_t *rgba = stbi_load_from_memory(buf, (int)size, &w, &h, &ch, 4);
    if (!rgba) {
        const char *why = stbi_failure_reason();
        return strata_err_set(err, STRATA_E_FORMAT, "cannot decode image '%s': %s", name,
                              why ? why : "corrupt data");
    }
    size_t n_px = (size_t)w * (size_t)h;
    img->rgb = malloc(n_px * 3);
    if (!img->rgb) {
        stbi_image_free(rgba);
        return strata_err_set(err, STRATA_E_NOMEM, "no memory for a %dx%d image", w, h);
    }
    composite_white(rgba, img->rgb, n_px);
    stbi_image_free(rgba);
    img->w = w;
    img->h = h;
    return 0;
}

int strata_image_load(struct strata_image *img, const char *path, struct strata_err *err)
{
    memset(img, 0, sizeof(*img));
    FILE *f = fopen(path, "rb");
    if (!f)
        return strata_err_set(err, STRATA_E_IO, "cannot open '%s': %s", path, strerror(errno));
    int rc = 0;
    uint8_t *buf = NULL;
    long size = -1;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && !S_ISREG(st.st_mode)) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot read image '%s': %s", path,
                            S_ISDIR(st.st_mode) ? strerror(EISDIR) : "not a regular file");
        goto out;
    }
    if (fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot read '%s': %s", path, strerror(errno));
        goto out;
    }
    if (size > INT32_MAX) {
        rc = strata_err_set(err, STRATA_E_LIMIT, "image '%s' is too large (%ld bytes)", path,
                            size);
        goto out;
    }
    buf = malloc(size ? (size_t)size : 1);
    if (!buf) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "no memory to read '%s'", path);
        goto out;
    }
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot read '%s'", path);
        goto out;
    }
    rc = strata_image_load_mem(img, buf, (size_t)size, path, err);
out:
    free(buf);
    fclose(f);
    return rc;
}

/* ---- resizing ----------------------------------------------------------
 * The antialiased separable resampling of Pillow's Resample.c, with the
 * fixed-point weights of PyTorch's uint8 path (UpSampleKernelAVXAntialias.h):
 * 16-bit weights whose precision is the largest that keeps the largest
 * weight below 2^15.  This reproduces the reference processor's pixels
 * exactly (see tests/unit/test_image.c). */

static double bicubic(double x)
{
    const double a = -0.5;
    if (x < 0)
        x = -x;
    if (x < 1)
        return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2)
        return (((x - 5) * x + 8) * x - 4) * a;
    return 0;
}

/* Coefficients for resizing in_size -> out_size: for each output i, the
 * first input index bounds[2i], the count bounds[2i+1], and ksize fixed-point
 * weights at kk[i * ksize]. */
static int precompute(int in_size, int out_size, int **bounds_out, int32_t **kk_out,
                      int *ksize_out, int *precision_out)
{
    double scale = (double)in_size / out_size;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 2.0 * filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    int *bounds = malloc(sizeof(int) * 2 * (size_t)out_size);
    int32_t *kk = malloc(sizeof(int32_t) * (size_t)out_size * (size_t)ksize);
    double *k = malloc(sizeof(double) * (size_t)ksize);
    if (!bounds || !kk || !k) {
        free(bounds);
        free(kk);
        free(k);
        return -1;
    }
    double ss = 1.0 / filterscale;
    double *norm = malloc(sizeof(double) * (size_t)out_size * (size_t)ksize);
    if (!norm) {
        free(bounds);
        free(kk);
        free(k);
        return -1;
    }
    double max_w = 0;
    for (int xx = 0; xx < out_size; xx++) {
        double center = (xx + 0.5) * scale;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0)
            xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > in_size)
            xmax = in_size;
        xmax -= xmin;
        double ww = 0;
        for (int x = 0; x < xmax; x++) {
            double w = bicubic((x + xmin - center + 0.5) * ss);
            k[x] = w;
            ww += w;
        }
        for (int x = 0; x < ksize; x++) {
            double w = x < xmax && ww != 0 ? k[x] / ww : 0;
            norm[(size_t)xx * ksize + x] = w;
            if (w > max_w)
                max_w = w;
        }
        bounds[2 * xx] = xmin;
        bounds[2 * xx + 1] = xmax;
    }
    int precision = 0;
    while (precision < 15 && (int)(0.5 + max_w * (1 << (precision + 1))) < (1 << 15))
        precision++;
    for (size_t i = 0; i < (size_t)out_size * (size_t)ksize; i++) {
        double w = norm[i] * (1 << precision);
        kk[i] = (int32_t)(w < 0 ? w - 0.5 : w + 0.5);
    }
    free(norm);
    *precision_out = precision;
    free(k);
    *bounds_out = bounds;
    *kk_out = kk;
    *ksize_out = ksize;
    return 0;
}

static uint8_t clip8(int64_t v, int precision)
{
    v >>= precision;
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/* One pass along x (horizontal) or y, 3 channels. */
static void resample_pass(const uint8_t *in, int in_w, int in_h, uint8_t *out, int out_w,
                          int out_h, int horizontal, const int *bounds, const int32_t *kk,
                          int ksize, int precision)
{
    for (int y = 0; y < out_h; y++) {
        for (int x = 0; x < out_w; x++) {
            int i = horizontal ? x : y;
            int lo = bounds[2 * i], n = bounds[2 * i + 1];
            const int32_t *k = kk + (size_t)i * ksize;
            for (int c = 0; c < 3; c++) {
                int64_t acc = precision > 0 ? (int64_t)1 << (precision - 1) : 0;
                for (int j = 0; j < n; j++) {
                    size_t src = horizontal ? ((size_t)y * in_w + (size_t)(lo + j))
                                            : ((size_t)(lo + j) * in_w + (size_t)x);
                    acc += (int64_t)in[src * 3 + c] * k[j];
                }
                out[((size_t)y * out_w + x) * 3 + c] = clip8(acc, precision);
            }
        }
    }
    (void)in_h;
}

int strata_image_resize(const struct strata_image *src, int out_w, int out_h,
                        struct strata_image *dst, struct strata_err *err)
{
    memset(dst, 0, sizeof(*dst));
    if (out_w <= 0 || out_h <= 0 || out_w > STRATA_IMAGE_MAX_SIDE ||
        out_h > STRATA_IMAGE_MAX_SIDE || (int64_t)out_w * out_h > STRATA_IMAGE_MAX_PIXELS)
        return strata_err_set(err, STRATA_E_INVALID, "invalid resize target %dx%d", out_w, out_h);
    int rc = 0;
    int *bx = NULL, *by = NULL;
    int32_t *kx = NULL, *ky = NULL;
    int ksx = 0, ksy = 0, px = 0, py = 0;
    uint8_t *tmp = NULL;
    const uint8_t *cur = src->rgb;
    int cur_w = src->w;
    dst->rgb = malloc((size_t)out_w * out_h * 3);
    if (!dst->rgb)
        goto oom;
    if (out_w == src->w && out_h == src->h) {
        memcpy(dst->rgb, src->rgb, (size_t)out_w * out_h * 3);
        goto done;
    }
    if (out_w != src->w) {
        if (precompute(src->w, out_w, &bx, &kx, &ksx, &px) != 0)
            goto oom;
        uint8_t *target = out_h == src->h ? dst->rgb : (tmp = malloc((size_t)out_w * src->h * 3));
        if (!target)
            goto oom;
        resample_pass(src->rgb, src->w, src->h, target, out_w, src->h, 1, bx, kx, ksx, px);
        cur = target;
        cur_w = out_w;
    }
    if (out_h != src->h) {
        if (precompute(src->h, out_h, &by, &ky, &ksy, &py) != 0)
            goto oom;
        resample_pass(cur, cur_w, src->h, dst->rgb, out_w, out_h, 0, by, ky, ksy, py);
    }
done:
    dst->w = out_w;
    dst->h = out_h;
    goto out;
oom:
    strata_image_free(dst);
    rc = strata_err_set(err, STRATA_E_NOMEM, "no memory to resize to %dx%d", out_w, out_h);
out:
    free(bx);
    free(by);
    free(kx);
    free(ky);
    free(tmp);
    return rc;
}

/* Python's round(): halves to even, as the reference processor uses. */
static double round_half_even(double x)
{
    double r = nearbyint(x); /* default rounding mode: to nearest, ties to even */
    return r;
}

int strata_image_smart_resize(int h, int w, int factor, int64_t min_pixels, int64_t max_pixels,
                              int *out_h, int *out_w, struct strata_err *err)
{
    if (h <= 0 || w <= 0 || factor <= 0 || min_pixels < 0 || max_pixels < min_pixels)
        return strata_err_set(err, STRATA_E_INVALID,
                              "invalid image size %dx%d or pixel budget [%lld, %lld]", w, h,
                              (long long)min_pixels, (long long)max_pixels);
    int big = h > w ? h : w, small = h > w ? w : h;
    if ((double)big / small > 200)
        return strata_err_set(err, STRATA_E_INVALID,
                              "image %dx%d: aspect ratio %.0f is above the limit of 200", w, h,
                              (double)big / small);
    double hb = round_half_even((double)h / factor) * factor;
    double wb = round_half_even((double)w / factor) * factor;
    if (hb < factor)
        hb = factor;
    if (wb < factor)
        wb = factor;
    if (hb * wb > (double)max_pixels) {
        double beta = sqrt((double)h * w / (double)max_pixels);
        hb = floor(h / beta / factor) * factor;
        wb = floor(w / beta / factor) * factor;
        if (hb < factor)
            hb = factor;
        if (wb < factor)
            wb = factor;
    } else if (hb * wb < (double)min_pixels) {
        double beta = sqrt((double)min_pixels / ((double)h * w));
        hb = ceil(h * beta / factor) * factor;
        wb = ceil(w * beta / factor) * factor;
    }
    if (hb > STRATA_IMAGE_MAX_SIDE || wb > STRATA_IMAGE_MAX_SIDE)
        return strata_err_set(err, STRATA_E_LIMIT, "resized image %gx%g is too large", wb, hb);
    *out_h = (int)hb;
    *out_w = (int)wb;
    return 0;
}

int strata_image_patches(const struct strata_image *img, const float mean[3],
                         const float std[3], int patch, int merge, int temporal, float **out,
                         int *n_patches, int *grid_h, int *grid_w, struct strata_err *err)
{
    *out = NULL;
    int unit = patch * merge;
    if (patch <= 0 || merge <= 0 || temporal <= 0 || img->w % unit || img->h % unit)
        return strata_err_set(err, STRATA_E_INVALID,
                              "image %dx%d is not a multiple of patch %d x merge %d", img->w,
                              img->h, patch, merge);
    int gh = img->h / patch, gw = img->w / patch;
    size_t dim = (size_t)3 * temporal * patch * patch;
    size_t n = (size_t)gh * gw;
    float *p = malloc(n * dim * sizeof(float));
    if (!p)
        return strata_err_set(err, STRATA_E_NOMEM, "no memory for %zu patches", n);
    size_t k = 0;
    for (int bh = 0; bh < gh / merge; bh++)
        for (int bw = 0; bw < gw / merge; bw++)
            for (int i = 0; i < merge; i++)
                for (int j = 0; j < merge; j++, k++) {
                    int py = (bh * merge + i) * patch, px = (bw * merge + j) * patch;
                    float *v = p + k * dim;
                    for (int c = 0; c < 3; c++)
                        for (int t = 0; t < temporal; t++)
                            for (int y = 0; y < patch; y++)
                                for (int x = 0; x < patch; x++) {
                                    size_t at = (size_t)(py + y) * img->w + (size_t)(px + x);
                                    uint8_t s = img->rgb[at * 3 + c];
                                    /* (s / 255 - mean) / std, in the reference's order */
                                    float f = ((float)s / 255.0f - mean[c]) / std[c];
                                    *v++ = f;
                                }
                }
    *out = p;
    *n_patches = (int)n;
    *grid_h = gh;
    *grid_w = gw;
    return 0;
}
