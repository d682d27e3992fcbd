/* err.h - error codes and the caller-owned error record.
 *
 * Every library function that can fail returns 0 (STRATA_OK) or one of the
 * codes below, and fills a caller-owned struct strata_err whose message names
 * the file, key, tensor, kernel or request field at fault.  The library never
 * exits or aborts on bad input or a device fault.
 */
#ifndef STRATA_ERR_H
#define STRATA_ERR_H

#include <stdarg.h>

enum strata_code {
    STRATA_OK = 0,
    STRATA_E_IO,          /* open/read/write/mmap failed */
    STRATA_E_FORMAT,      /* input file is malformed (GGUF, pack, JSON, image) */
    STRATA_E_INVALID,     /* bad argument or option value */
    STRATA_E_NOTFOUND,    /* a key, tensor, file or name does not exist */
    STRATA_E_UNSUPPORTED, /* well-formed but not supported (type, arch, feature) */
    STRATA_E_NOMEM,       /* allocation failed or a size limit would be exceeded */
    STRATA_E_GPU,         /* GPU runtime or kernel failure */
    STRATA_E_LIMIT,       /* a safety bound was exceeded (steps, depth, size) */
    STRATA_E_CHECKSUM,    /* checksum mismatch */
    STRATA_E_NETWORK,     /* download or socket failure */
    STRATA_E_TIMEOUT,     /* a watchdog or timeout fired */
    STRATA_E_CANCELLED,   /* the operation was cancelled by the caller */
    STRATA_E_TEMPLATE,    /* a chat template raised an error (raise_exception) */
    STRATA_E_INTERNAL,    /* a bug: an invariant was broken */
    STRATA_E_COUNT
};

/* Exit codes of every program (DESIGN.md "Errors and exit codes"). */
enum strata_exit {
    STRATA_EXIT_OK = 0,
    STRATA_EXIT_FAILURE = 1,
    STRATA_EXIT_USAGE = 2,
    STRATA_EXIT_BAD_INPUT = 3,
    STRATA_EXIT_GPU = 4,
    STRATA_EXIT_NOMEM = 5,
};

#define STRATA_ERR_MSG_MAX 1024

/* Caller-owned error record.  Zero-initialise it; a function that fails sets
 * both fields.  A NULL record is accepted everywhere and means "don't care". */
struct strata_err {
    int code;
    char msg[STRATA_ERR_MSG_MAX];
};

/* Set code and a printf-style message; returns code so callers can write
 * `return strata_err_set(err, STRATA_E_FORMAT, "...")`.  err may be NULL. */
int strata_err_set(struct strata_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int strata_err_vset(struct strata_err *err, int code, const char *fmt, va_list ap);

/* Prepend context to an existing message ("loading 'x': " + old message),
 * keeping the code.  Returns err->code (or STRATA_E_INTERNAL if unset). */
int strata_err_wrap(struct strata_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Reset to STRATA_OK with an empty message. */
void strata_err_clear(struct strata_err *err);

/* Short fixed text for a code ("malformed input"); never NULL. */
const char *strata_err_str(int code);

/* The program exit code for a library error code (see enum strata_exit). */
int strata_err_exit_code(int code);

#endif
