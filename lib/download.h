/* download.h - fetch model files over http(s) with libcurl: resumable,
 * retried, stall-detected and checked against a SHA-256.
 *
 * Sources are http(s):// URLs or hf:OWNER/REPO/PATH (optionally
 * hf:OWNER/REPO@REVISION/PATH), which resolves to the Hugging Face Hub's
 * download URL $HF_ENDPOINT/OWNER/REPO/resolve/REVISION/PATH (endpoint
 * https://huggingface.co, revision main by default).  $HF_TOKEN, when set,
 * is sent as a bearer token to the Hub (curl does not forward it when the
 * Hub redirects to its CDN).
 *
 * The expected hash is the caller's, else the one the Hub publishes for LFS
 * files: the X-Linked-Etag header of the resolve response (the file's
 * SHA-256), or an ETag that is 64 hex digits.  A file with neither is
 * accepted with its computed hash reported as unchecked.
 */
#ifndef STRATA_DOWNLOAD_H
#define STRATA_DOWNLOAD_H

#include <stdint.h>

#include "err.h"
#include "sha256.h"

/* Progress: bytes done of total (0 when unknown), bytes per second. */
typedef void (*strata_download_progress_fn)(const char *name, uint64_t done, uint64_t total,
                                            double rate, int final, void *ud);

struct strata_download_opts {
    int offline;            /* never touch the network: only a complete local file */
    int retries;            /* further attempts after a transient failure (< 0: 4) */
    unsigned backoff_ms;    /* delay before the first retry, doubling (0: 1000) */
    unsigned stall_s;       /* an attempt fails when no byte arrives for this long (0: 60) */
    unsigned connect_s;     /* connect timeout (0: 30) */
    const char *sha256;     /* expected hash (64 hex), or NULL: the server's */
    strata_download_progress_fn progress; /* or NULL */
    void *progress_ud;
};

struct strata_download_result {
    uint64_t size;
    char sha256[STRATA_SHA256_HEX];  /* the file's hash */
    int checked;    /* 1: matched the caller's or the server's hash; 0: none known */
    int resumed;    /* 1: an earlier partial download was continued */
    int cached;     /* 1: dest already existed and was kept */
};

/* 1 for "http://", "https://" or "hf:" sources, else 0. */
int strata_download_is_remote(const char *src);

/* The download URL of a source (malloc'ed, caller frees).  Returns 0, or
 * STRATA_E_INVALID for a malformed hf: source ("hf:OWNER/REPO/PATH"). */
int strata_download_resolve(const char *src, char **url, struct strata_err *err);

/* Last path component of a source ("a/b/m.gguf?x" -> "m.gguf"), malloc'ed. */
char *strata_download_file_name(const char *src);

/* Ask the server for the size and published hash of src without fetching
 * it (HEAD, redirects followed).  *size is 0 and sha256 "" when unknown.
 * Returns 0, STRATA_E_NOTFOUND (HTTP 404), STRATA_E_NETWORK, STRATA_E_TIMEOUT,
 * or STRATA_E_INVALID in offline mode. */
int strata_download_head(const char *src, const struct strata_download_opts *o,
                         uint64_t *size, char sha256[STRATA_SHA256_HEX],
                         struct strata_err *err);

/* Fetch src into the file dest.  Bytes arrive in dest.part, which a later
 * call continues with a Range request; dest appears (rename) only complete
 * and checked.  An existing dest is kept when its hash matches the expected
 * one (any hash when none is given and offline).  Transient failures (connection
 * errors, cut transfers, stalls, HTTP 5xx/429) are retried with back-off;
 * the part file is kept for resuming.
 * Returns 0, or STRATA_E_NOTFOUND (HTTP 404, or offline without the file),
 * STRATA_E_NETWORK (HTTP 401/403 and other failures, with the HTTP status or
 * curl's reason), STRATA_E_TIMEOUT (stalled), STRATA_E_CHECKSUM (the file
 * differs from the expected hash: the part file is removed), STRATA_E_IO
 * (cannot write dest, e.g. a full disk).  Messages name the URL or file. */
int strata_download_fetch(const char *src, const char *dest,
                          const struct strata_download_opts *o,
                          struct strata_download_result *res, struct strata_err *err);

/* A ready-made progress reporter for stderr: a redrawn bar (bytes, rate,
 * ETA) when stderr is a terminal, else a plain line at most every 5 s and
 * at the end.  ud: a zeroed struct strata_download_stderr owned by the
 * caller (it keeps the time of the last line). */
struct strata_download_stderr {
    double last_line;
    const char *prog; /* prefix of plain lines, or NULL */
};
void strata_download_progress_stderr(const char *name, uint64_t done, uint64_t total,
                                     double rate, int final, void *ud);

#endif
