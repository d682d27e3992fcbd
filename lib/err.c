/* err.c - error records and the code tables. */
#include "err.h"

#include <stdio.h>
#include <string.h>

static const struct {
    int code;
    const char *text;
    int exit_code;
} code_table[] = {
    {STRATA_OK, "ok", STRATA_EXIT_OK},
    {STRATA_E_IO, "i/o error", STRATA_EXIT_FAILURE},
    {STRATA_E_FORMAT, "malformed input", STRATA_EXIT_BAD_INPUT},
    {STRATA_E_INVALID, "invalid argument", STRATA_EXIT_USAGE},
    {STRATA_E_NOTFOUND, "not found", STRATA_EXIT_BAD_INPUT},
    {STRATA_E_UNSUPPORTED, "unsupported", STRATA_EXIT_BAD_INPUT},
    {STRATA_E_NOMEM, "out of memory", STRATA_EXIT_NOMEM},
    {STRATA_E_GPU, "gpu error", STRATA_EXIT_GPU},
    {STRATA_E_LIMIT, "limit exceeded", STRATA_EXIT_FAILURE},
    {STRATA_E_CHECKSUM, "checksum mismatch", STRATA_EXIT_BAD_INPUT},
    {STRATA_E_NETWORK, "network error", STRATA_EXIT_FAILURE},
    {STRATA_E_TIMEOUT, "timed out", STRATA_EXIT_FAILURE},
    {STRATA_E_CANCELLED, "cancelled", STRATA_EXIT_FAILURE},
    {STRATA_E_TEMPLATE, "template error", STRATA_EXIT_BAD_INPUT},
    {STRATA_E_INTERNAL, "internal error", STRATA_EXIT_FAILURE},
};

_Static_assert(sizeof(code_table) / sizeof(code_table[0]) == STRATA_E_COUNT,
               "code_table must list every enum strata_code value");

int strata_err_vset(struct strata_err *err, int code, const char *fmt, va_list ap)
{
    if (err) {
        err->code = code;
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    }
    return code;
}

int strata_err_set(struct strata_err *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    strata_err_vset(err, code, fmt, ap);
    va_end(ap);
    return code;
}

int strata_err_wrap(struct strata_err *err, const char *fmt, ...)
{
    if (!err)
        return STRATA_E_INTERNAL;
    if (err->code == STRATA_OK)
        err->code = STRATA_E_INTERNAL;
    char prefix[STRATA_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    char old[STRATA_ERR_MSG_MAX];
    memcpy(old, err->msg, sizeof(old));
    old[sizeof(old) - 1] = '\0';
    /* prefix + ": " + old, truncated to the record's size */
    size_t cap = sizeof(err->msg) - 1, n = 0;
    for (const char *parts[3] = {prefix, ": ", old}, **p = parts; p < parts + 3; p++)
        for (const char *c = *p; *c && n < cap; c++)
            err->msg[n++] = *c;
    err->msg[n] = '\0';
    return err->code;
}

void strata_err_clear(struct strata_err *err)
{
    if (err) {
        err->code = STRATA_OK;
        err->msg[0] = '\0';
    }
}

const char *strata_err_str(int code)
{
    if (code >= 0 && code < STRATA_E_COUNT)
        return code_table[code].text;
    return "unknown error";
}

int strata_err_exit_code(int code)
{
    if (code >= 0 && code < STRATA_E_COUNT)
        return code_table[code].exit_code;
    return STRATA_EXIT_FAILURE;
}
