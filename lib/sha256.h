/* sha256.h - SHA-256 of buffers and files (FIPS 180-4), through OpenSSL's EVP.
 *
 * Packs record the SHA-256 of every data file; downloads are checked against
 * the hash the Hugging Face Hub publishes for LFS files (the X-Linked-Etag
 * header) or one given by the user.  Digests travel as 64 lowercase hex
 * characters plus a NUL.
 */
#ifndef STRATA_SHA256_H
#define STRATA_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define STRATA_SHA256_HEX 65 /* 64 hex digits + NUL */

struct strata_sha256; /* an incremental hash */

/* New hash, or NULL when out of memory.  Free with strata_sha256_free. */
struct strata_sha256 *strata_sha256_new(void);
void strata_sha256_free(struct strata_sha256 *h);
/* Add n bytes.  Returns 0 or STRATA_E_INTERNAL. */
int strata_sha256_update(struct strata_sha256 *h, const void *data, size_t n);
/* Finish: hex receives 64 lowercase hex digits and a NUL; the hash is reset
 * so it can be reused.  Returns 0 or STRATA_E_INTERNAL. */
int strata_sha256_final(struct strata_sha256 *h, char hex[STRATA_SHA256_HEX]);

/* SHA-256 of bytes [0, len) of the file at path (len UINT64_MAX: to its end);
 * *n_read receives the bytes hashed (may be NULL).  Returns 0, STRATA_E_IO
 * naming the file, or STRATA_E_NOMEM. */
int strata_sha256_file(const char *path, uint64_t len, char hex[STRATA_SHA256_HEX],
                       uint64_t *n_read, struct strata_err *err);

/* 1 when s is exactly 64 hex digits (either case), else 0. */
int strata_sha256_is_hex(const char *s);

#endif
