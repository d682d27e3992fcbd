/* tap.h - a minimal TAP producer for the C unit tests (run by prove).
 *
 *   ok(cond, "name %d", i);      one test point
 *   diag("...");                 a comment line
 *   return tap_done();           prints the plan, returns the exit code
 */
#ifndef STRATA_TAP_H
#define STRATA_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int tap_n, tap_failed;

__attribute__((format(printf, 2, 3), unused))
static int ok(int cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%sok %d - ", cond ? "" : "not ", ++tap_n);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (!cond)
        tap_failed++;
    return cond;
}

__attribute__((format(printf, 1, 2), unused))
static void diag(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("# ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

__attribute__((unused))
static int tap_done(void)
{
    printf("1..%d\n", tap_n);
    return tap_failed ? 1 : 0;
}

/* Fixture directory: $STRATA_FIXTURES or ../shared/fixtures. */
__attribute__((unused))
static const char *tap_fixtures(void)
{
    const char *f = getenv("STRATA_FIXTURES");
    return f && *f ? f : "../shared/fixtures";
}

/* The whole file at path plus a terminating NUL, malloc'ed (the caller
 * frees); *len (may be NULL) gets its size in bytes.  NULL when the file
 * cannot be opened or read. */
__attribute__((unused))
static void *tap_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *b = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0)
        b = (char *)malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (!b)
        return NULL;
    b[n] = '\0';
    if (len)
        *len = (size_t)n;
    return b;
}

#endif
