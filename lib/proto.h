/* proto.h - the engine protocol between strata-serve and
 * `strata-generate --serve-stdio`.
 *
 * Newline-delimited JSON, one object per line, each with a "type" member.
 * Requests on the engine's stdin: generate, cancel, tokenize, detokenize,
 * health, shutdown.  Events on its stdout: ready, token, done, error, log.
 * docs/engine-protocol.md is the full reference; these are the helpers both
 * sides share: line framing over a file descriptor, UTF-8 repair of text that
 * goes into JSON strings, and the stop-string hold-back rule.
 */
#ifndef STRATA_PROTO_H
#define STRATA_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "err.h"

/* Longest line either side accepts (a prompt of 10 MB of JSON-escaped text
 * fits); longer lines are an error naming the limit. */
#define STRATA_PROTO_LINE_MAX (64u << 20)

/* Version written in the ready event; bumped on incompatible changes. */
#define STRATA_PROTO_VERSION 1

/* Buffered line reader over a file descriptor (blocking or non-blocking). */
struct strata_proto_reader {
    int fd;
    char *buf;
    size_t len, cap;
    int eof;
};

void strata_proto_reader_init(struct strata_proto_reader *r, int fd);
void strata_proto_reader_free(struct strata_proto_reader *r);

/* Read what is available from r->fd once (one read(2) call) into the buffer.
 * Returns 1 when bytes were read, 0 at end of file (r->eof set), -1 when the
 * read would block or was interrupted.  Errors: STRATA_E_IO (read failed),
 * STRATA_E_LIMIT (a line longer than STRATA_PROTO_LINE_MAX) - returned as
 * -2 with err filled. */
int strata_proto_reader_fill(struct strata_proto_reader *r, struct strata_err *err);

/* Take the next complete line out of the buffer (without its '\n'; a '\r'
 * before it is dropped too).  Returns a malloc'ed NUL-terminated string the
 * caller frees, or NULL when no complete line is buffered.  At end of file a
 * final unterminated line is returned as well. */
char *strata_proto_reader_line(struct strata_proto_reader *r);

/* Serialise obj unformatted plus '\n' into a malloc'ed string (*len gets its
 * length).  Returns NULL when out of memory. */
char *strata_proto_encode(const cJSON *obj, size_t *len);

/* Write all len bytes of buf to the blocking descriptor fd, retrying on EINTR
 * and short writes.  Errors: STRATA_E_IO (write failed, e.g. EPIPE: names
 * what). */
int strata_proto_write_all(int fd, const char *buf, size_t len, const char *what,
                           struct strata_err *err);

/* Copy of s[0..len) in which every byte that is not part of a valid UTF-8
 * sequence is replaced by U+FFFD, so it can go into a JSON string.  malloc'ed,
 * NUL-terminated; *out_len (may be NULL) gets the length.  NULL when out of
 * memory. */
char *strata_proto_utf8_fix(const char *s, size_t len, size_t *out_len);

/* Position of the earliest occurrence of any of the n_stop stop strings in
 * text[0..len) (empty stop strings are ignored); len when there is none.
 * *which (may be NULL) gets the index of the stop string found there (the
 * longest, when several start at the same position), or -1. */
size_t strata_proto_stop_find(const char *text, size_t len, const char *const *stop,
                              size_t n_stop, int *which);

/* Bytes at the end of text[0..len) that must be held back because they are a
 * proper prefix of some stop string and could still become one: the length
 * of the longest such suffix, 0 when none. */
size_t strata_proto_stop_holdback(const char *text, size_t len, const char *const *stop,
                                  size_t n_stop);

#endif
