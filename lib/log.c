/* log.c - leveled diagnostics. */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

static const char *log_prog = "strata";
static int log_level = STRATA_LOG_INFO;
static strata_log_sink_fn log_sink;
static void *log_sink_ud;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

void strata_log_set_prog(const char *prog) { log_prog = prog ? prog : "strata"; }
void strata_log_set_level(int level) { log_level = level; }
int strata_log_get_level(void) { return log_level; }

void strata_log_set_sink(strata_log_sink_fn fn, void *ud)
{
    pthread_mutex_lock(&log_lock);
    log_sink = fn;
    log_sink_ud = ud;
    pthread_mutex_unlock(&log_lock);
}

void strata_log(int level, const char *fmt, ...)
{
    if (level > log_level)
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&log_lock);
    if (log_sink)
        log_sink(level, msg, log_sink_ud);
    else
        fprintf(stderr, "%s: %s%s\n", log_prog,
                level == STRATA_LOG_ERROR ? "error: " : level == STRATA_LOG_WARN ? "warning: " : "",
                msg);
    pthread_mutex_unlock(&log_lock);
}
