/* download.c - resumable, checked downloads with libcurl. */
#include "download.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "log.h"
#include "pack.h"

#define USER_AGENT "strata-prepare/1"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int strata_download_is_remote(const char *src)
{
    return strncmp(src, "http://", 7) == 0 || strncmp(src, "https://", 8) == 0 ||
           strncmp(src, "hf:", 3) == 0;
}

int strata_download_resolve(const char *src, char **url, struct strata_err *err)
{
    *url = NULL;
    if (strncmp(src, "hf:", 3)) {
        *url = strdup(src);
        return *url ? 0 : strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    }
    /* hf:OWNER/REPO[@REV]/PATH */
    const char *s = src + 3, *s1 = strchr(s, '/'), *s2 = s1 ? strchr(s1 + 1, '/') : NULL;
    if (!s1 || s1 == s || !s2 || s2 == s1 + 1 || !s2[1])
        return strata_err_set(err, STRATA_E_INVALID,
                              "'%s': expected hf:OWNER/REPO/PATH", src);
    const char *at = memchr(s1, '@', (size_t)(s2 - s1));
    const char *ep = getenv("HF_ENDPOINT");
    if (!ep || !*ep)
        ep = "https://huggingface.co";
    size_t epl = strlen(ep);
    while (epl > 0 && ep[epl - 1] == '/')
        epl--;
    int repo_len = (int)((at ? at : s2) - s);
    const char *rev = "main";
    int rev_len = 4;
    if (at) {
        rev = at + 1;
        rev_len = (int)(s2 - rev);
        if (!rev_len)
            return strata_err_set(err, STRATA_E_INVALID, "'%s': empty revision", src);
    }
    size_t n = epl + strlen(src) + 32;
    *url = malloc(n);
    if (!*url)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    snprintf(*url, n, "%.*s/%.*s/resolve/%.*s/%s", (int)epl, ep, repo_len, s, rev_len, rev,
             s2 + 1);
    return 0;
}

char *strata_download_file_name(const char *src)
{
    size_t n = strcspn(src, "?#");
    const char *b = src;
    for (size_t i = 0; i < n; i++)
        if (src[i] == '/' || src[i] == ':')
            b = src + i + 1;
    return strndup(b, (size_t)(src + n - b));
}

/* ---- one transfer ------------------------------------------------------ */

struct xfer {
    CURL *c;
    const char *url;
    const char *path;      /* the part file */
    int fd;
    uint64_t have;         /* bytes present when the attempt started */
    uint64_t off;          /* next write offset */
    struct strata_sha256 *h;
    int started;
    int write_failed;
    struct strata_err *err;
    long status;           /* of the last response */
    uint64_t range_start;  /* from Content-Range of the last response */
    uint64_t range_total;  /* total size from Content-Range, 0 unknown */
    char linked_etag[80];  /* X-Linked-Etag (kept across redirects) */
    char etag[80];         /* ETag of the last response */
    uint64_t linked_size;
    const struct strata_download_opts *o;
    const char *name;
    double t0, last_cb;
    double last_data;      /* when the last byte arrived */
    curl_off_t last_now;
    int stalled;
};

static void header_value(char *dst, size_t cap, const char *v, size_t n)
{
    while (n && (*v == ' ' || *v == '\t')) {
        v++;
        n--;
    }
    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
        n--;
    if (n >= 2 && v[0] == 'W' && v[1] == '/') {
        v += 2;
        n -= 2;
    }
    if (n >= 2 && v[0] == '"' && v[n - 1] == '"') {
        v++;
        n -= 2;
    }
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = 0;
}

static size_t on_header(char *buf, size_t size, size_t nitems, void *ud)
{
    struct xfer *x = ud;
    size_t n = size * nitems;
    char val[80];
    if (n > 5 && strncmp(buf, "HTTP/", 5) == 0) {
        const char *sp = memchr(buf, ' ', n);
        x->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        x->range_start = 0;
        x->range_total = 0;
        x->etag[0] = 0;
        return n;
    }
#define HDR(name) (n > sizeof(name) - 1 && strncasecmp(buf, name, sizeof(name) - 1) == 0)
    if (HDR("x-linked-etag:")) {
        header_value(x->linked_etag, sizeof(x->linked_etag), buf + 14, n - 14);
    } else if (HDR("etag:")) {
        header_value(x->etag, sizeof(x->etag), buf + 5, n - 5);
    } else if (HDR("x-linked-size:")) {
        header_value(val, sizeof(val), buf + 14, n - 14);
        x->linked_size = strtoull(val, NULL, 10);
    } else if (HDR("content-range:")) {
        /* "bytes START-END/TOTAL" or "bytes * /TOTAL" (RFC 9110 14.4) */
        header_value(val, sizeof(val), buf + 14, n - 14);
        const char *p = strncasecmp(val, "bytes", 5) == 0 ? val + 5 : val;
        while (*p == ' ')
            p++;
        x->range_start = strtoull(p, NULL, 10);
        const char *sl = strchr(p, '/');
        x->range_total = sl ? strtoull(sl + 1, NULL, 10) : 0;
    }
#undef HDR
    return n;
}

/* Feed bytes [0, n) of fd into h. */
static int hash_prefix(int fd, uint64_t n, struct strata_sha256 *h, const char *path,
                       struct strata_err *err)
{
    enum { CHUNK = 8 << 20 };
    unsigned char *buf = malloc(CHUNK);
    uint64_t done = 0;
    int rc = 0;
    if (!buf)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    while (done < n) {
        size_t want = n - done < CHUNK ? (size_t)(n - done) : CHUNK;
        ssize_t r = pread(fd, buf, want, (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = strata_err_set(err, STRATA_E_IO, "cannot read '%s': %s", path,
                                r < 0 ? strerror(errno) : "unexpected end of file");
            break;
        }
        strata_sha256_update(h, buf, (size_t)r);
        done += (uint64_t)r;
    }
    free(buf);
    return rc;
}

static size_t on_write(char *buf, size_t size, size_t nmemb, void *ud)
{
    struct xfer *x = ud;
    size_t n = size * nmemb;
    if (x->status < 200 || x->status >= 300)
        return n;  /* an error page: not part of the file */
    if (!x->started) {
        x->started = 1;
        if (x->off > 0 && (x->status != 206 || x->range_start != x->off)) {
            /* the server ignored the Range request: start over */
            if (ftruncate(x->fd, 0)) {
                strata_err_set(x->err, STRATA_E_IO, "cannot truncate '%s': %s", x->path,
                               strerror(errno));
                x->write_failed = 1;
                return 0;
            }
            strata_sha256_free(x->h);
            x->h = strata_sha256_new();
            x->off = 0;
            x->have = 0;
            if (!x->h) {
                strata_err_set(x->err, STRATA_E_NOMEM, "out of memory");
                x->write_failed = 1;
                return 0;
            }
        }
    }
    if (strata_pack_pwrite_all(x->fd, buf, n, x->off, x->path, x->err)) {
        x->write_failed = 1;
        return 0;
    }
    strata_sha256_update(x->h, buf, n);
    x->off += n;
    return n;
}

static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    struct xfer *x = ud;
    (void)ultotal;
    (void)ulnow;
    double t = now_s();
    /* curl's own low-speed check averages over several seconds; a stall is
     * "no byte for stall_s", so it is measured here (curl calls this at
     * least once a second) */
    if (dlnow != x->last_now || x->last_data == 0) {
        x->last_now = dlnow;
        x->last_data = t;
    } else if (t - x->last_data >= (x->o->stall_s ? x->o->stall_s : 60)) {
        x->stalled = 1;
        return 1;
    }
    if (!x->o->progress || t - x->last_cb < 0.2)
        return 0;
    x->last_cb = t;
    double rate = t > x->t0 ? (double)dlnow / (t - x->t0) : 0;
    x->o->progress(x->name, x->have + (uint64_t)dlnow,
                   dltotal > 0 ? x->have + (uint64_t)dltotal : 0, rate, 0, x->o->progress_ud);
    return 0;
}

static struct curl_slist *auth_headers(const char *src, const char *url)
{
    const char *tok = getenv("HF_TOKEN");
    const char *ep = getenv("HF_ENDPOINT");
    char *h;
    struct curl_slist *l;
    if (!tok || !*tok)
        return NULL;
    if (strncmp(src, "hf:", 3) && !strstr(url, "huggingface.co/") &&
        !(ep && *ep && strncmp(url, ep, strlen(ep)) == 0))
        return NULL;
    h = malloc(strlen(tok) + 32);
    if (!h)
        return NULL;
    sprintf(h, "Authorization: Bearer %s", tok);
    l = curl_slist_append(NULL, h);
    free(h);
    return l;
}

static void setup(CURL *c, struct xfer *x, const struct strata_download_opts *o,
                  struct curl_slist *hdrs)
{
    curl_easy_setopt(c, CURLOPT_URL, x->url);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_USERAGENT, USER_AGENT);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, (long)(o->connect_s ? o->connect_s : 30));
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)(o->stall_s ? o->stall_s : 60));
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
}

static const char *published_hash(const struct xfer *x)
{
    if (strata_sha256_is_hex(x->linked_etag))
        return x->linked_etag;
    if (strata_sha256_is_hex(x->etag))
        return x->etag;
    return NULL;
}

static int http_error(const char *url, long status, struct strata_err *err)
{
    if (status == 404)
        return strata_err_set(err, STRATA_E_NOTFOUND, "'%s': HTTP 404 not found", url);
    if (status == 401 || status == 403)
        return strata_err_set(err, STRATA_E_NETWORK,
                              "'%s': HTTP %ld: access denied (gated repository? set HF_TOKEN)",
                              url, status);
    return strata_err_set(err, STRATA_E_NETWORK, "'%s': HTTP %ld", url, status);
}

int strata_download_head(const char *src, const struct strata_download_opts *o,
                         uint64_t *size, char sha256[STRATA_SHA256_HEX],
                         struct strata_err *err)
{
    int rc = 0;
    char *url = NULL;
    CURL *c = NULL;
    struct curl_slist *hdrs = NULL;
    struct xfer x = {0};
    *size = 0;
    sha256[0] = 0;
    if (o->offline)
        return strata_err_set(err, STRATA_E_INVALID, "'%s': offline", src);
    if ((rc = strata_download_resolve(src, &url, err)))
        return rc;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    c = curl_easy_init();
    if (!c) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "cannot start libcurl");
        goto out;
    }
    x.url = url;
    x.o = o;
    hdrs = auth_headers(src, url);
    setup(c, &x, o, hdrs);
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    CURLcode cr = curl_easy_perform(c);
    if (cr != CURLE_OK) {
        rc = strata_err_set(err, cr == CURLE_OPERATION_TIMEDOUT ? STRATA_E_TIMEOUT
                                                                 : STRATA_E_NETWORK,
                            "'%s': %s", url, curl_easy_strerror(cr));
        goto out;
    }
    if (x.status >= 400) {
        rc = http_error(url, x.status, err);
        goto out;
    }
    curl_off_t cl = -1;
    curl_easy_getinfo(c, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
    *size = x.linked_size ? x.linked_size : cl > 0 ? (uint64_t)cl : 0;
    const char *ph = published_hash(&x);
    if (ph) {
        for (int i = 0; i < 64; i++)
            sha256[i] = (char)(ph[i] | 0x20); /* hex digits to lower case */
        sha256[64] = 0;
    }
out:
    curl_slist_free_all(hdrs);
    if (c)
        curl_easy_cleanup(c);
    curl_global_cleanup();
    free(url);
    return rc;
}

static int file_size(const char *path, uint64_t *size)
{
    struct stat st;
    if (stat(path, &st))
        return -1;
    *size = (uint64_t)st.st_size;
    return 0;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

int strata_download_fetch(const char *src, const char *dest,
                          const struct strata_download_opts *o,
                          struct strata_download_result *res, struct strata_err *err)
{
    int rc = 0, fd = -1, curl_started = 0;
    char *url = NULL, *part = NULL, *name = NULL;
    CURL *c = NULL;
    struct curl_slist *hdrs = NULL;
    struct xfer x = {0};
    uint64_t sz;
    int retries = o->retries < 0 ? 4 : o->retries;
    unsigned delay = o->backoff_ms ? o->backoff_ms : 1000;
    const char *want = o->sha256 && *o->sha256 ? o->sha256 : NULL;

    memset(res, 0, sizeof(*res));
    if (want && !strata_sha256_is_hex(want))
        return strata_err_set(err, STRATA_E_INVALID, "'%s' is not a sha256 (64 hex digits)",
                              want);
    if ((rc = strata_download_resolve(src, &url, err)))
        return rc;
    name = strata_download_file_name(dest);
    part = malloc(strlen(dest) + 6);
    if (!part || !name) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    sprintf(part, "%s.part", dest);

    if (file_size(dest, &sz) == 0) {
        rc = strata_sha256_file(dest, UINT64_MAX, res->sha256, &res->size, err);
        if (rc)
            goto out;
        if (!want || strcasecmp(want, res->sha256) == 0) {
            res->cached = 1;
            res->checked = want != NULL;
            goto out;
        }
        if (o->offline) {
            rc = strata_err_set(err, STRATA_E_CHECKSUM,
                                "'%s': sha256 %s, expected %s (offline: not downloading "
                                "it again)", dest, res->sha256, want);
            goto out;
        }
        unlink(dest);
    }
    if (o->offline) {
        rc = strata_err_set(err, STRATA_E_NOTFOUND,
                            "offline: '%s' is not downloaded yet (from '%s')", dest, url);
        goto out;
    }

    curl_global_init(CURL_GLOBAL_DEFAULT);
    curl_started = 1;
    c = curl_easy_init();
    if (!c) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "cannot start libcurl");
        goto out;
    }
    hdrs = auth_headers(src, url);
    fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot create '%s': %s", part, strerror(errno));
        goto out;
    }
    for (int attempt = 0;; attempt++) {
        struct stat st;
        char range[48];
        if (fstat(fd, &st)) {
            rc = strata_err_set(err, STRATA_E_IO, "cannot stat '%s': %s", part,
                                strerror(errno));
            goto out;
        }
        strata_sha256_free(x.h);
        memset(&x, 0, sizeof(x));
        x.c = c;
        x.url = url;
        x.path = part;
        x.fd = fd;
        x.err = err;
        x.o = o;
        x.name = name;
        x.have = x.off = (uint64_t)st.st_size;
        x.t0 = now_s();
        x.h = strata_sha256_new();
        if (!x.h) {
            rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
            goto out;
        }
        if (x.have && (rc = hash_prefix(fd, x.have, x.h, part, err)))
            goto out;
        if (x.have)
            res->resumed = 1;
        curl_easy_reset(c);
        setup(c, &x, o, hdrs);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_write);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, &x);
        if (x.have) {
            snprintf(range, sizeof(range), "%" PRIu64 "-", x.have);
            curl_easy_setopt(c, CURLOPT_RANGE, range);
        }
        CURLcode cr = curl_easy_perform(c);
        int transient = 0;
        if (x.write_failed) {
            rc = err ? err->code : STRATA_E_IO;
            goto out;
        }
        if (cr == CURLE_OK && (x.status == 200 || x.status == 206)) {
            rc = 0;
            break;
        }
        if (cr == CURLE_OK && x.status == 416 && x.have > 0) {
            if (x.range_total == x.have) { /* the part file was already complete */
                rc = 0;
                break;
            }
            if (ftruncate(fd, 0)) { /* stale part: start over */
                rc = strata_err_set(err, STRATA_E_IO, "cannot truncate '%s': %s", part,
                                    strerror(errno));
                goto out;
            }
            rc = strata_err_set(err, STRATA_E_NETWORK, "'%s': HTTP 416", url);
            transient = 1;
        } else if (cr == CURLE_OK) {
            rc = http_error(url, x.status, err);
            transient = x.status >= 500 || x.status == 429 || x.status == 408;
        } else if (cr == CURLE_OPERATION_TIMEDOUT || x.stalled) {
            rc = strata_err_set(err, STRATA_E_TIMEOUT,
                                "'%s': stalled: no data for %u s (at byte %" PRIu64 ")", url,
                                o->stall_s ? o->stall_s : 60, x.off);
            transient = 1;
        } else {
            rc = strata_err_set(err, STRATA_E_NETWORK, "'%s': %s (at byte %" PRIu64 ")", url,
                                curl_easy_strerror(cr), x.off);
            transient = cr != CURLE_UNSUPPORTED_PROTOCOL && cr != CURLE_URL_MALFORMAT;
        }
        if (!transient || attempt >= retries) {
            if (attempt > 0)
                strata_err_wrap(err, "after %d attempts", attempt + 1);
            goto out;
        }
        strata_log_warn("%s; retrying in %.1f s", err ? err->msg : url, delay / 1000.0);
        sleep_ms(delay);
        delay = delay > 60000 ? 120000 : delay * 2;
    }
    if (o->progress)
        o->progress(name, x.off, x.off, now_s() > x.t0 ? (x.off - x.have) / (now_s() - x.t0)
                                                        : 0, 1, o->progress_ud);
    strata_sha256_final(x.h, res->sha256);
    res->size = x.off;
    if (x.linked_size && x.linked_size != x.off) {
        rc = strata_err_set(err, STRATA_E_NETWORK, "'%s': got %" PRIu64 " bytes, the server "
                            "announced %" PRIu64, url, x.off, x.linked_size);
        unlink(part);
        goto out;
    }
    if (!want)
        want = published_hash(&x);
    if (want && strcasecmp(want, res->sha256)) {
        rc = strata_err_set(err, STRATA_E_CHECKSUM,
                            "'%s': sha256 %s does not match the expected %s%s; removed the "
                            "download", url, res->sha256, want,
                            o->sha256 && *o->sha256 ? "" : " (published by the server)");
        unlink(part);
        goto out;
    }
    res->checked = want != NULL;
    if (fsync(fd) || rename(part, dest)) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot rename '%s': %s", part, strerror(errno));
        goto out;
    }
out:
    if (fd >= 0)
        close(fd);
    strata_sha256_free(x.h);
    curl_slist_free_all(hdrs);
    if (c)
        curl_easy_cleanup(c);
    if (curl_started)
        curl_global_cleanup();
    free(url);
    free(part);
    free(name);
    return rc;
}

static void fmt_bytes(char *b, size_t n, double v)
{
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (v >= 1024 && i < 4) {
        v /= 1024;
        i++;
    }
    snprintf(b, n, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

void strata_download_progress_stderr(const char *name, uint64_t done, uint64_t total,
                                     double rate, int final, void *ud)
{
    struct strata_download_stderr *st = ud;
    char d[32], t[32], r[32], eta[32] = "";
    fmt_bytes(d, sizeof(d), (double)done);
    fmt_bytes(t, sizeof(t), (double)total);
    fmt_bytes(r, sizeof(r), rate);
    if (total > done && rate > 0) {
        double s = (double)(total - done) / rate;
        snprintf(eta, sizeof(eta), " ETA %d:%02d:%02d", (int)(s / 3600), (int)(s / 60) % 60,
                 (int)s % 60);
    }
    int pct = total ? (int)(done * 100 / total) : 0;
    if (isatty(2)) {
        char bar[31];
        int fill = total ? (int)(done * 30 / total) : 0;
        for (int i = 0; i < 30; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\r%-24.24s [%s] %3d%% %s / %s  %s%s%s\033[K%s", name, bar, pct, d,
                total ? t : "?", rate > 0 ? r : "", rate > 0 ? "/s" : "", eta,
                final ? "\n" : "");
        return;
    }
    double now = now_s();
    if (!final && st && now - st->last_line < 5)
        return;
    if (st)
        st->last_line = now;
    fprintf(stderr, "%s%s%s: %s / %s (%d%%)%s%s%s%s\n", st && st->prog ? st->prog : "",
            st && st->prog ? ": " : "", name, d, total ? t : "?", pct, rate > 0 ? ", " : "",
            rate > 0 ? r : "", rate > 0 ? "/s" : "", final ? ", done" : eta);
}
