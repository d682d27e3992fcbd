/* embed_serve.h - the vision helper's loopback HTTP API (strata-embed --serve).
 *
 *   GET  /health  -> 200 {"status":"ok","loaded":true,"images":true,"backend":"cpu"}
 *                    (backend: where the encoder runs, strata_vision_backend)
 *                    (503 {"status":"loading",...} until warmed up)
 *   POST /embed   body: the image file's bytes (PNG, JPEG, BMP, GIF ...)
 *                 -> 200 application/octet-stream: the embedding payload
 *                    (vision.h, strata-embed(1))
 *                 -> 400 {"error":{"message":...,"type":"invalid_request_error"}}
 *                    for an image that cannot be decoded or is too large,
 *                 -> 413 for a body above max_body bytes.
 * Optional query parameters of /embed: min_pixels, max_pixels.
 * Requests are served by a small thread pool; encodes run one at a time.
 */
#ifndef STRATA_EMBED_SERVE_H
#define STRATA_EMBED_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "pool.h"
#include "vision.h"

struct strata_embed_serve_opts {
    const char *host;       /* "127.0.0.1" */
    int port;               /* 0 picks a free port */
    size_t max_body;        /* bytes; 0 = 64 MiB */
    int64_t min_pixels, max_pixels;
    int warmup;             /* encode a small blank image before /health says ok */
    /* written once listening, for a parent that asked for port 0 */
    void (*on_listen)(int port, void *ud);
    void *ud;
};

/* Serve until *stop becomes nonzero (checked every 100 ms; e.g. set from a
 * signal handler).  v and pool are borrowed.  Errors: STRATA_E_IO (cannot
 * bind: the message names host and port), STRATA_E_INVALID (bad host). */
int strata_embed_serve(struct strata_vision *v, struct strata_pool *pool,
                       const struct strata_embed_serve_opts *o, volatile int *stop,
                       struct strata_err *err);

#endif
