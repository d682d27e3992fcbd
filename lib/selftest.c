/* selftest.c - the kernel self-test harness (see selftest.h).
 *
 * The cases run in a forked child that writes each result into a shared anonymous
 * mapping as soon as it has it, and the index of the case it is running before it
 * starts it.  The parent polls: a case that outlives its deadline gets the child
 * killed; a child that dies or stops after a runtime fault is replaced by a new one
 * that starts after the failed case. */
#include "selftest.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct shared {
    volatile int current;     /* -1: init; i: running case i */
    volatile int next;        /* cases below next have results */
    volatile int init_failed;
    volatile int faulted;     /* the child stopped after a case's runtime fault */
    struct strata_selftest_result r[STRATA_SELFTEST_MAX];
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

static void child_main(const struct strata_selftest_table *t, int dev, int start,
                       struct shared *sh)
{
    char msg[sizeof(sh->r[0].error)];
    msg[0] = '\0';
    sh->current = -1;
    if (t->init && t->init(dev, msg, sizeof(msg)) != 0) {
        struct strata_selftest_result *r = &sh->r[0];
        copy_str(r->kernel, sizeof(r->kernel), "init");
        snprintf(r->shapes, sizeof(r->shapes), "device %d", dev);
        copy_str(r->error, sizeof(r->error), msg[0] ? msg : "device initialisation failed");
        sh->init_failed = 1;
        return;
    }
    for (int i = start; i < t->n_cases; i++) {
        struct strata_selftest_result *r = &sh->r[i];
        sh->current = i;
        double t0 = now_ms();
        msg[0] = '\0';
        int rc = t->cases[i].run(dev, t->cases[i].arg, r->shapes, sizeof(r->shapes), msg,
                                 sizeof(msg));
        r->ms = now_ms() - t0;
        r->pass = rc == 0;
        if (rc)
            copy_str(r->error, sizeof(r->error),
                     msg[0] ? msg : (rc == STRATA_SELFTEST_FAULT ? "runtime error"
                                                                 : "results differ"));
        sh->next = i + 1;
        if (rc == STRATA_SELFTEST_FAULT) {
            sh->faulted = 1;
            return;
        }
    }
}

/* Append what the child printed to buf, keeping the last cap - 1 bytes. */
static void drain(int fd, char *buf, size_t cap, size_t *n)
{
    char tmp[512];
    ssize_t got;
    while ((got = read(fd, tmp, sizeof(tmp))) > 0) {
        size_t g = (size_t)got;
        if (g > cap - 1) {
            memcpy(buf, tmp + g - (cap - 1), cap - 1);
            *n = cap - 1;
            continue;
        }
        if (*n + g > cap - 1) {
            size_t drop = *n + g - (cap - 1);
            memmove(buf, buf + drop, *n - drop);
            *n -= drop;
        }
        memcpy(buf + *n, tmp, g);
        *n += g;
    }
    buf[*n] = '\0';
}

/* Output tail as one line. */
static const char *one_line(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' ' || s[n - 1] == '\r'))
        s[--n] = '\0';
    for (char *p = s; *p; p++)
        if (*p == '\n' || *p == '\r' || *p == '\t')
            *p = ' ';
    return s;
}

int strata_selftest_run_table(const struct strata_selftest_table *t, int dev,
                              const struct strata_selftest_opts *o,
                              struct strata_selftest_report *rep, struct strata_err *err)
{
    int rc = 0;
    memset(rep, 0, sizeof(*rep));
    rep->device = dev;
    copy_str(rep->api, sizeof(rep->api), t->api);
    int n_cases = t->n_cases < STRATA_SELFTEST_MAX ? t->n_cases : STRATA_SELFTEST_MAX - 1;
    int timeout = o && o->timeout_ms > 0 ? o->timeout_ms : 3000;
    int init_timeout = o && o->init_timeout_ms > 0 ? o->init_timeout_ms : 30000;
    struct shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return strata_err_set(err, STRATA_E_NOMEM, "self-test: cannot map %zu bytes",
                              sizeof(*sh));
    memset(sh, 0, sizeof(*sh));
    for (int i = 0; i < n_cases; i++)
        copy_str(sh->r[i].kernel, sizeof(sh->r[i].kernel), t->cases[i].kernel);
    rep->ran = 1;
    int start = 0;
    while (start < n_cases) {
        int pfd[2];
        if (pipe(pfd) != 0) {
            rc = strata_err_set(err, STRATA_E_IO, "self-test: cannot create a pipe: %s",
                                strerror(errno));
            goto out;
        }
        sh->current = -2;
        sh->next = start;
        sh->faulted = 0;
        rep->r[STRATA_SELFTEST_MAX - 1] = sh->r[0]; /* init failure writes over case 0 */
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            close(pfd[0]);
            close(pfd[1]);
            rc = strata_err_set(err, STRATA_E_IO, "self-test: cannot fork: %s",
                                strerror(errno));
            goto out;
        }
        if (pid == 0) {
            int nul = open("/dev/null", O_RDONLY);
            if (nul >= 0)
                dup2(nul, 0);
            dup2(pfd[1], 1);
            dup2(pfd[1], 2);
            close(pfd[0]);
            child_main(t, dev, start, sh);
            _exit(0);
        }
        close(pfd[1]);
        fcntl(pfd[0], F_SETFL, O_NONBLOCK);
        char out[128];
        size_t n_out = 0;
        out[0] = '\0';
        int seen = -2, status = 0, killed = 0;
        double since = now_ms();
        for (;;) {
            drain(pfd[0], out, sizeof(out), &n_out);
            if (waitpid(pid, &status, WNOHANG) == pid)
                break;
            int cur = sh->current;
            if (cur != seen) {
                seen = cur;
                since = now_ms();
            }
            int limit = cur < 0 ? init_timeout : timeout;
            if (now_ms() - since > limit) {
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                killed = 1;
                break;
            }
            usleep(1000);
        }
        drain(pfd[0], out, sizeof(out), &n_out);
        close(pfd[0]);
        one_line(out);
        int cur = sh->current;
        if (sh->init_failed || (cur < 0 && (killed || WIFSIGNALED(status)))) {
            /* the device could not be started: one result, nothing else ran */
            struct strata_selftest_result *r = &rep->r[0];
            *r = sh->r[0];
            if (start > 0) {
                /* a restart after a fault: keep what ran, the rest did not */
                char why[sizeof(r->error)];
                copy_str(why, sizeof(why), sh->init_failed ? sh->r[0].error : "start-up failed");
                for (int i = start; i < n_cases; i++) {
                    sh->r[i].pass = 0;
                    snprintf(sh->r[i].error, sizeof(sh->r[i].error),
                             "not run: the device did not restart after a fault: %.120s", why);
                }
                if (sh->init_failed) /* the child wrote its message over case 0 */
                    sh->r[0] = rep->r[STRATA_SELFTEST_MAX - 1];
                break;
            }
            if (!sh->init_failed) {
                copy_str(r->kernel, sizeof(r->kernel), "init");
                snprintf(r->shapes, sizeof(r->shapes), "device %d", dev);
                if (killed)
                    snprintf(r->error, sizeof(r->error),
                             "runtime start-up did not finish within %d ms (killed)%s%.80s",
                             init_timeout, out[0] ? "; last output: " : "", out);
                else
                    snprintf(r->error, sizeof(r->error), "runtime start-up crashed (%s)%s%.80s",
                             strsignal(WTERMSIG(status)), out[0] ? "; last output: " : "", out);
            }
            r->pass = 0;
            rep->n = 1;
            rep->n_failed = 1;
            goto out;
        }
        int done = sh->next;
        if (done >= n_cases)
            break;
        /* the child stopped before case `done` had a result, or after its fault */
        if (!sh->faulted) {
            struct strata_selftest_result *r = &sh->r[done];
            r->pass = 0;
            r->ms = now_ms() - since;
            if (killed)
                snprintf(r->error, sizeof(r->error),
                         "did not finish within %d ms (killed)%s%.80s", timeout,
                         out[0] ? "; last output: " : "", out);
            else if (WIFSIGNALED(status))
                snprintf(r->error, sizeof(r->error), "the process died (%s)%s%.80s",
                         strsignal(WTERMSIG(status)), out[0] ? "; last output: " : "", out);
            else
                snprintf(r->error, sizeof(r->error), "the process exited during the case%s%.80s",
                         out[0] ? "; last output: " : "", out);
            done++;
        }
        start = done;
    }
    for (int i = 0; i < n_cases; i++) {
        rep->r[i] = sh->r[i];
        rep->n_failed += !rep->r[i].pass;
    }
    rep->n = n_cases;
    memset(&rep->r[STRATA_SELFTEST_MAX - 1], 0, sizeof(rep->r[0]));
out:
    munmap(sh, sizeof(*sh));
    return rc;
}

#ifdef STRATA_WITH_GPU
/* kernels/selftest.cu */
const struct strata_selftest_table *strata_gpu_selftest_table(void);
#endif

const struct strata_selftest_table *strata_selftest_gpu_table(void)
{
#ifdef STRATA_WITH_GPU
    return strata_gpu_selftest_table();
#else
    return NULL;
#endif
}

int strata_selftest_gpu(int dev, const struct strata_selftest_opts *o,
                        struct strata_selftest_report *rep, struct strata_err *err)
{
    const struct strata_selftest_table *t = strata_selftest_gpu_table();
    if (!t) {
        memset(rep, 0, sizeof(*rep));
        rep->device = dev;
        copy_str(rep->not_run, sizeof(rep->not_run),
                 "this build has no GPU kernels (CPU build; `make cuda` or `make hip`)");
        return 0;
    }
    return strata_selftest_run_table(t, dev, o, rep, err);
}

void strata_selftest_summary(const struct strata_selftest_report *rep, char *buf, size_t cap)
{
    if (!rep->ran) {
        snprintf(buf, cap, "kernel self-test not run: %s", rep->not_run);
        return;
    }
    if (rep->n_failed == 0) {
        snprintf(buf, cap, "kernel self-test passed (%d kernels)", rep->n);
        return;
    }
    const struct strata_selftest_result *f = NULL;
    for (int i = 0; i < rep->n && !f; i++)
        if (!rep->r[i].pass)
            f = &rep->r[i];
    if (!f) {
        snprintf(buf, cap, "kernel self-test failed");
        return;
    }
    if (rep->n_failed > 1)
        snprintf(buf, cap, "kernel self-test failed for %d of %d kernels: %s [%s]: %s "
                 "(and %d more)", rep->n_failed, rep->n, f->kernel, f->shapes, f->error,
                 rep->n_failed - 1);
    else
        snprintf(buf, cap, "kernel self-test failed for %d of %d kernels: %s [%s]: %s",
                 rep->n_failed, rep->n, f->kernel, f->shapes, f->error);
}
