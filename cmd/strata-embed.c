/* strata-embed - image(s) + mmproj GGUF -> image embeddings for the language model. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "embed_serve.h"
#include "err.h"
#include "gguf.h"
#include "log.h"
#include "pool.h"
#include "vision.h"

static const char usage_text[] =
    "usage: strata-embed -m MMPROJ [options] IMAGE\n"
    "       strata-embed -m MMPROJ --pixel-values FILE --grid HxW [options]\n"
    "       strata-embed -m MMPROJ --serve [--host ADDR] [--port N] [--warmup]\n"
    "\n"
    "  -m, --model FILE       the projector GGUF (mmproj-*.gguf)\n"
    "  -o, --output FILE      write the embedding payload to FILE (default stdout)\n"
    "      --json             print the payload's header fields as JSON instead\n"
    "      --min-pixels N     smallest image area after resizing (default 3136)\n"
    "      --max-pixels N     largest image area after resizing, the image token\n"
    "                         budget (default 1003520: 1280 tokens)\n"
    "      --pixel-values F   encode raw float32 patches from F (already preprocessed)\n"
    "      --grid HxW         the patch grid of --pixel-values\n"
    "  -t, --threads N        CPU threads (default: all)\n"
    "      --backend B        cpu, auto, cuda or hip (default auto: the GPU of a GPU\n"
    "                         build when a device is found, else the CPU)\n"
    "      --device N         GPU ordinal (default 0)\n"
    "      --serve            run the loopback HTTP helper (GET /health, POST /embed)\n"
    "      --host ADDR        address to listen on (default 127.0.0.1)\n"
    "      --port N           port (default 8090; 0 picks a free one)\n"
    "      --warmup           encode a blank image before reporting ready\n"
    "  -h, --help             show this help\n";

enum {
    OPT_JSON = 256, OPT_MINP, OPT_MAXP, OPT_PV, OPT_GRID, OPT_BACKEND, OPT_DEVICE, OPT_SERVE,
    OPT_HOST, OPT_PORT, OPT_WARMUP,
};

static volatile int stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static int parse_i64(const char *s, const char *opt, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) {
        fprintf(stderr, "strata-embed: invalid %s '%s'\n", opt, s);
        return -1;
    }
    *out = v;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float *read_floats(const char *path, size_t *n, struct strata_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        strata_err_set(err, STRATA_E_IO, "cannot open '%s'", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *p = sz > 0 ? malloc((size_t)sz) : NULL;
    if (!p || fread(p, 1, (size_t)sz, f) != (size_t)sz) {
        strata_err_set(err, STRATA_E_IO, "cannot read '%s'", path);
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = sz > 0 ? (size_t)sz / sizeof(float) : 0;
    return p;
}

int main(int argc, char **argv)
{
    strata_log_set_prog("strata-embed");
    static const struct option longopts[] = {
        {"model", required_argument, NULL, 'm'},
        {"output", required_argument, NULL, 'o'},
        {"threads", required_argument, NULL, 't'},
        {"json", no_argument, NULL, OPT_JSON},
        {"min-pixels", required_argument, NULL, OPT_MINP},
        {"max-pixels", required_argument, NULL, OPT_MAXP},
        {"pixel-values", required_argument, NULL, OPT_PV},
        {"grid", required_argument, NULL, OPT_GRID},
        {"backend", required_argument, NULL, OPT_BACKEND},
        {"device", required_argument, NULL, OPT_DEVICE},
        {"serve", no_argument, NULL, OPT_SERVE},
        {"host", required_argument, NULL, OPT_HOST},
        {"port", required_argument, NULL, OPT_PORT},
        {"warmup", no_argument, NULL, OPT_WARMUP},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *model = NULL, *output = NULL, *pv_path = NULL, *backend = "auto";
    int json = 0, serve = 0, warmup = 0, grid_h = 0, grid_w = 0;
    int64_t threads = 0, minp = 3136, maxp = 1003520, port = 8090, device = -1;
    const char *host = "127.0.0.1";
    int c;
    while ((c = getopt_long(argc, argv, "m:o:t:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'o': output = optarg; break;
        case 't':
            if (parse_i64(optarg, "--threads", 1, 512, &threads))
                return STRATA_EXIT_USAGE;
            break;
        case OPT_JSON: json = 1; break;
        case OPT_MINP:
            if (parse_i64(optarg, "--min-pixels", 1, 1ll << 31, &minp))
                return STRATA_EXIT_USAGE;
            break;
        case OPT_MAXP:
            if (parse_i64(optarg, "--max-pixels", 1, 1ll << 31, &maxp))
                return STRATA_EXIT_USAGE;
            break;
        case OPT_PV: pv_path = optarg; break;
        case OPT_GRID:
            if (sscanf(optarg, "%dx%d", &grid_h, &grid_w) != 2 || grid_h <= 0 || grid_w <= 0) {
                fprintf(stderr, "strata-embed: invalid --grid '%s' (expected HxW)\n", optarg);
                return STRATA_EXIT_USAGE;
            }
            break;
        case OPT_BACKEND: backend = optarg; break;
        case OPT_DEVICE:
            if (parse_i64(optarg, "--device", 0, 64, &device))
                return STRATA_EXIT_USAGE;
            break;
        case OPT_SERVE: serve = 1; break;
        case OPT_HOST: host = optarg; break;
        case OPT_PORT:
            if (parse_i64(optarg, "--port", 0, 65535, &port))
                return STRATA_EXIT_USAGE;
            break;
        case OPT_WARMUP: warmup = 1; break;
        case 'h': fputs(usage_text, stdout); return STRATA_EXIT_OK;
        default: fputs(usage_text, stderr); return STRATA_EXIT_USAGE;
        }
    }
    int n_images = argc - optind;
    if (!model || (serve && (n_images || pv_path)) ||
        (!serve && (pv_path ? n_images != 0 || !grid_h : n_images != 1))) {
        fprintf(stderr, "strata-embed: %s\n",
                !model ? "missing -m MMPROJ"
                : serve ? "--serve takes no image"
                : pv_path && !grid_h ? "--pixel-values needs --grid HxW"
                : "give exactly one IMAGE");
        fputs(usage_text, stderr);
        return STRATA_EXIT_USAGE;
    }
    if (minp > maxp) {
        fprintf(stderr, "strata-embed: --min-pixels %lld is above --max-pixels %lld\n",
                (long long)minp, (long long)maxp);
        return STRATA_EXIT_USAGE;
    }
    if (strcmp(backend, "cpu") != 0 && strcmp(backend, "auto") != 0 &&
        strcmp(backend, "cuda") != 0 && strcmp(backend, "hip") != 0) {
        fprintf(stderr, "strata-embed: invalid --backend '%s' (cpu, auto, cuda, hip)\n",
                backend);
        return STRATA_EXIT_USAGE;
    }

    struct strata_err err = {0};
    struct strata_gguf *g = NULL;
    struct strata_vision *v = NULL;
    struct strata_pool *pool = NULL;
    struct strata_image img = {0};
    float *pixels = NULL, *rows = NULL;
    FILE *out = NULL;
    int exit_code = STRATA_EXIT_OK;
    int rc = strata_gguf_open(&g, model, &err);
    if (rc == 0)
        rc = strata_vision_load(&v, g, &err);
    if (rc == 0)
        rc = strata_pool_create(&pool, (int)threads, &err);
    if (rc)
        goto out;
    /* a backend that cannot run is a GPU failure (exit 4), whatever the cause */
    if ((rc = strata_vision_set_backend(v, backend, (int)device, &err))) {
        fprintf(stderr, "strata-embed: %s\n", err.msg);
        exit_code = err.code == STRATA_E_NOMEM ? STRATA_EXIT_NOMEM : STRATA_EXIT_GPU;
        rc = 0;
        goto out;
    }

    if (serve) {
        struct sigaction sa = {0};
        sa.sa_handler = on_signal;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        signal(SIGPIPE, SIG_IGN);
        struct strata_embed_serve_opts so = {
            .host = host, .port = (int)port, .min_pixels = minp, .max_pixels = maxp,
            .warmup = warmup,
        };
        rc = strata_embed_serve(v, pool, &so, &stop_flag, &err);
        goto out;
    }

    const struct strata_vision_hparams *hp = strata_vision_hparams(v);
    int n_tok = 0, tgh = 0, tgw = 0;
    double t0 = now_s();
    const char *src = pv_path ? pv_path : argv[optind];
    if (pv_path) {
        size_t n = 0;
        pixels = read_floats(pv_path, &n, &err);
        size_t dim = (size_t)3 * hp->temporal * hp->patch_size * hp->patch_size;
        if (!pixels) {
            rc = err.code;
            goto out;
        }
        if (n != (size_t)grid_h * grid_w * dim) {
            rc = strata_err_set(&err, STRATA_E_FORMAT,
                                "'%s' holds %zu floats; a %dx%d grid needs %zu", pv_path, n,
                                grid_h, grid_w, (size_t)grid_h * grid_w * dim);
            goto out;
        }
        rc = strata_vision_encode(v, pool, pixels, grid_h, grid_w, &rows, &n_tok, &err);
        tgh = grid_h / hp->merge;
        tgw = grid_w / hp->merge;
    } else {
        rc = strata_image_load(&img, src, &err);
        if (rc == 0)
            rc = strata_vision_encode_image(v, pool, &img, minp, maxp, &rows, &n_tok, &tgh,
                                            &tgw, &err);
    }
    if (rc)
        goto out;
    double dt = now_s() - t0;
    struct strata_embd_header h = {1, (uint32_t)n_tok, (uint32_t)hp->n_out, 1, (uint32_t)tgh,
                                   (uint32_t)tgw, 0};
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "image", src);
        if (!pv_path) {
            cJSON_AddNumberToObject(j, "width", img.w);
            cJSON_AddNumberToObject(j, "height", img.h);
        }
        cJSON_AddNumberToObject(j, "version", h.version);
        cJSON_AddNumberToObject(j, "n_tokens", h.n_tokens);
        cJSON_AddNumberToObject(j, "n_embd", h.n_embd);
        cJSON_AddNumberToObject(j, "grid_t", h.grid_t);
        cJSON_AddNumberToObject(j, "grid_h", h.grid_h);
        cJSON_AddNumberToObject(j, "grid_w", h.grid_w);
        cJSON_AddNumberToObject(j, "seconds", dt);
        cJSON_AddStringToObject(j, "backend", strata_vision_backend(v));
        char *s = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
        if (s)
            puts(s);
        free(s);
        goto out;
    }
    if (output) {
        out = fopen(output, "wb");
        if (!out) {
            rc = strata_err_set(&err, STRATA_E_IO, "cannot create '%s': %s", output,
                                strerror(errno));
            goto out;
        }
    } else if (isatty(1)) {
        rc = strata_err_set(&err, STRATA_E_INVALID,
                            "not writing a binary payload to a terminal: use -o FILE or --json");
        goto out;
    }
    rc = strata_embd_write(out ? out : stdout, &h, rows, &err);
    if (rc == 0)
        strata_log_info("%s: %d tokens (grid %dx%d) in %.3f s on the %s", src, n_tok, tgh, tgw,
                        dt, strata_vision_backend(v));
out:
    if (out && fclose(out) != 0 && rc == 0)
        rc = strata_err_set(&err, STRATA_E_IO, "cannot write '%s'", output);
    if (rc)
        fprintf(stderr, "strata-embed: %s\n", err.msg);
    free(rows);
    free(pixels);
    strata_image_free(&img);
    strata_pool_free(pool);
    strata_vision_free(v);
    strata_gguf_close(g);
    return rc ? strata_err_exit_code(rc) : exit_code;
}
