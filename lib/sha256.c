/* sha256.c - SHA-256 through OpenSSL EVP (uses the CPU's SHA extensions). */
#include "sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>

struct strata_sha256 {
    EVP_MD_CTX *ctx;
};

struct strata_sha256 *strata_sha256_new(void)
{
    struct strata_sha256 *h = calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    h->ctx = EVP_MD_CTX_new();
    if (!h->ctx || EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) != 1) {
        strata_sha256_free(h);
        return NULL;
    }
    return h;
}

void strata_sha256_free(struct strata_sha256 *h)
{
    if (!h)
        return;
    EVP_MD_CTX_free(h->ctx);
    free(h);
}

int strata_sha256_update(struct strata_sha256 *h, const void *data, size_t n)
{
    if (n && EVP_DigestUpdate(h->ctx, data, n) != 1)
        return STRATA_E_INTERNAL;
    return 0;
}

int strata_sha256_final(struct strata_sha256 *h, char hex[STRATA_SHA256_HEX])
{
    static const char digits[] = "0123456789abcdef";
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(h->ctx, md, &n) != 1 || n != 32)
        return STRATA_E_INTERNAL;
    for (unsigned i = 0; i < 32; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[64] = 0;
    if (EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) != 1)
        return STRATA_E_INTERNAL;
    return 0;
}

int strata_sha256_file(const char *path, uint64_t len, char hex[STRATA_SHA256_HEX],
                       uint64_t *n_read, struct strata_err *err)
{
    enum { CHUNK = 8 << 20 };
    int rc = 0, fd = -1;
    uint64_t done = 0;
    unsigned char *buf = NULL;
    struct strata_sha256 *h = strata_sha256_new();
    buf = malloc(CHUNK);
    if (!h || !buf) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "hashing '%s': out of memory", path);
        goto out;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot open '%s': %s", path, strerror(errno));
        goto out;
    }
#ifdef POSIX_FADV_SEQUENTIAL
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    while (done < len) {
        size_t want = len - done < CHUNK ? (size_t)(len - done) : CHUNK;
        ssize_t got = read(fd, buf, want);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            rc = strata_err_set(err, STRATA_E_IO, "cannot read '%s': %s", path,
                                strerror(errno));
            goto out;
        }
        if (got == 0)
            break;
        if (strata_sha256_update(h, buf, (size_t)got)) {
            rc = strata_err_set(err, STRATA_E_INTERNAL, "hashing '%s' failed", path);
            goto out;
        }
        done += (uint64_t)got;
    }
    if (strata_sha256_final(h, hex)) {
        rc = strata_err_set(err, STRATA_E_INTERNAL, "hashing '%s' failed", path);
        goto out;
    }
    if (n_read)
        *n_read = done;
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    strata_sha256_free(h);
    return rc;
}

int strata_sha256_is_hex(const char *s)
{
    if (!s)
        return 0;
    for (int i = 0; i < 64; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
            return 0;
    }
    return s[64] == 0;
}
