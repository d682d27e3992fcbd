/* proto.c - engine protocol framing, UTF-8 repair and stop-string rules. */
#include "proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void strata_proto_reader_init(struct strata_proto_reader *r, int fd)
{
    memset(r, 0, sizeof(*r));
    r->fd = fd;
}

void strata_proto_reader_free(struct strata_proto_reader *r)
{
    free(r->buf);
    r->buf = NULL;
    r->len = r->cap = 0;
}

int strata_proto_reader_fill(struct strata_proto_reader *r, struct strata_err *err)
{
    if (r->cap - r->len < 65536) {
        if (r->len > STRATA_PROTO_LINE_MAX && !memchr(r->buf, '\n', r->len)) {
            strata_err_set(err, STRATA_E_LIMIT, "protocol line longer than %u bytes",
                           STRATA_PROTO_LINE_MAX);
            return -2;
        }
        size_t cap = r->cap ? r->cap * 2 : 131072;
        char *nb = realloc(r->buf, cap);
        if (!nb) {
            strata_err_set(err, STRATA_E_NOMEM, "protocol line buffer of %zu bytes", cap);
            return -2;
        }
        r->buf = nb;
        r->cap = cap;
    }
    ssize_t n = read(r->fd, r->buf + r->len, r->cap - r->len);
    if (n > 0) {
        r->len += (size_t)n;
        return 1;
    }
    if (n == 0) {
        r->eof = 1;
        return 0;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        return -1;
    strata_err_set(err, STRATA_E_IO, "reading protocol stream: %s", strerror(errno));
    return -2;
}

char *strata_proto_reader_line(struct strata_proto_reader *r)
{
    if (!r->len)
        return NULL;
    char *nl = memchr(r->buf, '\n', r->len);
    size_t n, take;
    if (nl) {
        n = (size_t)(nl - r->buf);
        take = n + 1;
    } else if (r->eof) {
        n = take = r->len;
    } else {
        return NULL;
    }
    size_t keep = n;
    if (keep && r->buf[keep - 1] == '\r')
        keep--;
    char *line = malloc(keep + 1);
    if (!line)
        return NULL;
    memcpy(line, r->buf, keep);
    line[keep] = '\0';
    memmove(r->buf, r->buf + take, r->len - take);
    r->len -= take;
    return line;
}

char *strata_proto_encode(const cJSON *obj, size_t *len)
{
    char *s = cJSON_PrintUnformatted(obj);
    if (!s)
        return NULL;
    size_t n = strlen(s);
    char *out = realloc(s, n + 2);
    if (!out) {
        free(s);
        return NULL;
    }
    out[n] = '\n';
    out[n + 1] = '\0';
    if (len)
        *len = n + 1;
    return out;
}

int strata_proto_write_all(int fd, const char *buf, size_t len, const char *what,
                           struct strata_err *err)
{
    while (len) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return strata_err_set(err, STRATA_E_IO, "writing %s: %s", what, strerror(errno));
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Length of the valid UTF-8 sequence at s[0..n), 0 if it is not one
 * (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t k;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        k = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        k = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (n < k)
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < k; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return k;
}

char *strata_proto_utf8_fix(const char *s, size_t len, size_t *out_len)
{
    /* worst case: every byte becomes 3 bytes of U+FFFD */
    char *out = malloc(len * 3 + 1);
    if (!out)
        return NULL;
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_seq(u + i, len - i);
        if (k && !(k == 1 && u[i] == 0)) {
            memcpy(out + o, u + i, k);
            o += k;
            i += k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    out[o] = '\0';
    if (out_len)
        *out_len = o;
    return out;
}

size_t strata_proto_stop_find(const char *text, size_t len, const char *const *stop,
                              size_t n_stop, int *which)
{
    size_t best = len, best_len = 0;
    int best_i = -1;
    for (size_t i = 0; i < n_stop; i++) {
        size_t sl = stop[i] ? strlen(stop[i]) : 0;
        if (!sl || sl > len)
            continue;
        const char *p = memmem(text, len, stop[i], sl);
        if (!p)
            continue;
        size_t pos = (size_t)(p - text);
        if (pos < best || (pos == best && sl > best_len)) {
            best = pos;
            best_len = sl;
            best_i = (int)i;
        }
    }
    if (which)
        *which = best_i;
    return best;
}

size_t strata_proto_stop_holdback(const char *text, size_t len, const char *const *stop,
                                  size_t n_stop)
{
    size_t hold = 0;
    for (size_t i = 0; i < n_stop; i++) {
        size_t sl = stop[i] ? strlen(stop[i]) : 0;
        if (sl < 2)
            continue;
        /* suffixes of length k < sl that equal the stop string's first k bytes */
        size_t kmax = sl - 1 < len ? sl - 1 : len;
        for (size_t k = kmax; k > hold; k--) {
            if (!memcmp(text + len - k, stop[i], k)) {
                hold = k;
                break;
            }
        }
    }
    return hold;
}
