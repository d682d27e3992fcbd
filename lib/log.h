/* log.h - leveled diagnostics with a replaceable sink.
 *
 * The log level and sink are the only global mutable state of the library.
 * The default sink writes "PROG: message\n" to stderr.
 */
#ifndef STRATA_LOG_H
#define STRATA_LOG_H

enum strata_log_level {
    STRATA_LOG_ERROR = 0,
    STRATA_LOG_WARN,
    STRATA_LOG_INFO,
    STRATA_LOG_DEBUG,
};

typedef void (*strata_log_sink_fn)(int level, const char *msg, void *ud);

/* Program name used as the prefix of the default sink (not copied). */
void strata_log_set_prog(const char *prog);
void strata_log_set_level(int level);
int strata_log_get_level(void);
/* Replace the sink; NULL restores the default. */
void strata_log_set_sink(strata_log_sink_fn fn, void *ud);

void strata_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define strata_log_error(...) strata_log(STRATA_LOG_ERROR, __VA_ARGS__)
#define strata_log_warn(...) strata_log(STRATA_LOG_WARN, __VA_ARGS__)
#define strata_log_info(...) strata_log(STRATA_LOG_INFO, __VA_ARGS__)
#define strata_log_debug(...) strata_log(STRATA_LOG_DEBUG, __VA_ARGS__)

#endif
