/* strata-load - keep a pack's weights resident in shared memory for engines. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "err.h"
#include "log.h"
#include "resident.h"

#define PROG "strata-load"

static const char usage_text[] =
    "usage: strata-load [-d] [--pid-file FILE] [--reserve-mib N] [--no-huge-pages]\n"
    "                   [--no-direct] [-q] PACK\n"
    "       strata-load --status [--json]\n"
    "       strata-load --unload NAME|PACK\n"
    "\n"
    "Reads a pack's data files into a resident shared-memory image, verifying\n"
    "every SHA-256, and keeps it there; strata-generate -m PACK attaches to it.\n"
    "\n"
    "  -d, --detach          once the image is ready, stay resident in the background\n"
    "      --pid-file FILE   with --detach: where to write the pid (default\n"
    "                        /dev/shm/NAME.pid)\n"
    "      --reserve-mib N   memory that must stay available after loading (default 1024)\n"
    "      --no-huge-pages   do not ask for transparent huge pages\n"
    "      --no-direct       read through the page cache instead of O_DIRECT\n"
    "  -q, --quiet           no progress lines\n"
    "      --status          list the images: pack, size, state, loader, engines, age\n"
    "      --json            with --status: one JSON array\n"
    "      --unload X        remove the image named X, or the image of pack X\n"
    "  -h, --help            show this help\n"
    "\n"
    "exit status: 0 ok; 1 failure (already loaded, i/o); 2 usage; 3 bad pack or a\n"
    "checksum mismatch; 5 not enough memory.\n";

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double gib(uint64_t b)
{
    return (double)b / (double)(1ull << 30);
}

struct progress {
    int quiet, tty;
    double t0, last;
};

static int on_progress(const char *file, uint64_t done, uint64_t size, uint64_t all_done,
                       uint64_t all_total, void *ud)
{
    struct progress *p = ud;
    double t = now_s();
    if (g_stop)
        return 1;
    if (p->quiet || (t - p->last < (p->tty ? 0.2 : 2.0) && done < size))
        return 0;
    p->last = t;
    const char *b = strrchr(file, '/');
    double rate = t > p->t0 ? gib(all_done) / (t - p->t0) : 0;
    fprintf(stderr, "%s" PROG ": %.2f GiB of %.2f GiB at %.2f GiB/s (%s)%s",
            p->tty ? "\r" : "", gib(all_done), gib(all_total), rate, b ? b + 1 : file,
            p->tty ? "\033[K" : "\n");
    return 0;
}

static const char *state_name(int s)
{
    return s == STRATA_RESIDENT_READY ? "ready" : s == STRATA_RESIDENT_LOADING ? "loading"
                                                                               : "unreadable";
}

static void fmt_age(char *dst, size_t cap, int64_t created)
{
    int64_t a = (int64_t)time(NULL) - created;
    if (a < 0)
        a = 0;
    if (a < 3600)
        snprintf(dst, cap, "%" PRId64 "m%02" PRId64 "s", a / 60, a % 60);
    else
        snprintf(dst, cap, "%" PRId64 "h%02" PRId64 "m", a / 3600, a / 60 % 60);
}

static int run_status(int json)
{
    struct strata_resident_info *v = NULL;
    size_t n = 0;
    struct strata_err err = {0};
    int ret = STRATA_EXIT_OK;
    if (strata_resident_list(&v, &n, &err)) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        return strata_err_exit_code(err.code);
    }
    if (json) {
        cJSON *arr = cJSON_CreateArray();
        char *text = NULL;
        for (size_t i = 0; arr && i < n; i++) {
            cJSON *o = cJSON_CreateObject(), *at;
            cJSON_AddItemToArray(arr, o);
            cJSON_AddStringToObject(o, "name", v[i].name);
            cJSON_AddStringToObject(o, "identity", v[i].identity);
            cJSON_AddStringToObject(o, "pack", v[i].pack_dir);
            cJSON_AddStringToObject(o, "pack_name", v[i].pack_name);
            cJSON_AddStringToObject(o, "state", state_name(v[i].state));
            cJSON_AddNumberToObject(o, "bytes", (double)v[i].data_bytes);
            cJSON_AddNumberToObject(o, "n_files", v[i].n_files);
            cJSON_AddNumberToObject(o, "loader_pid", v[i].loader_pid);
            cJSON_AddBoolToObject(o, "loader_alive", v[i].loader_alive);
            cJSON_AddNumberToObject(o, "n_attached", v[i].n_attached);
            at = cJSON_AddArrayToObject(o, "attached");
            for (uint32_t k = 0; at && k < v[i].n_attached && k < 16; k++)
                cJSON_AddItemToArray(at, cJSON_CreateNumber(v[i].attached[k]));
            cJSON_AddNumberToObject(o, "created", (double)v[i].created);
            cJSON_AddNumberToObject(o, "age_s", (double)((int64_t)time(NULL) - v[i].created));
        }
        if (!arr || !(text = cJSON_PrintUnformatted(arr))) {
            fprintf(stderr, PROG ": out of memory\n");
            ret = STRATA_EXIT_NOMEM;
        } else {
            printf("%s\n", text);
        }
        free(text);
        cJSON_Delete(arr);
    } else if (n == 0) {
        printf("no resident images\n");
    } else {
        printf("%-24s %-8s %10s  %-16s %-20s %-7s %s\n", "NAME", "STATE", "SIZE", "LOADER",
               "ENGINES", "AGE", "PACK");
        for (size_t i = 0; i < n; i++) {
            char loader[48], eng[64] = "", age[32];
            snprintf(loader, sizeof(loader), "%d %s", (int)v[i].loader_pid,
                     v[i].loader_alive ? "running" : "gone");
            int k = snprintf(eng, sizeof(eng), "%u", v[i].n_attached);
            for (uint32_t j = 0; j < v[i].n_attached && j < 16 && k < (int)sizeof(eng) - 12;
                 j++)
                k += snprintf(eng + k, sizeof(eng) - (size_t)k, "%s%d", j ? "," : " (",
                              (int)v[i].attached[j]);
            if (v[i].n_attached)
                snprintf(eng + k, sizeof(eng) - (size_t)k, ")");
            fmt_age(age, sizeof(age), v[i].created);
            printf("%-24s %-8s %6.2f GiB  %-16s %-20s %-7s %s\n", v[i].name,
                   state_name(v[i].state), gib(v[i].data_bytes), loader, eng, age,
                   v[i].pack_dir);
        }
    }
    if (fflush(stdout))
        ret = STRATA_EXIT_FAILURE;
    free(v);
    return ret;
}

static int run_unload(const char *what)
{
    struct strata_resident_info in;
    struct strata_err err = {0};
    if (strata_resident_unload(what, &in, &err)) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        return STRATA_EXIT_FAILURE;
    }
    fprintf(stderr, PROG ": removed %s%s%s%s\n", in.name, in.pack_dir[0] ? " ('" : "",
            in.pack_dir, in.pack_dir[0] ? "')" : "");
    if (in.n_attached)
        fprintf(stderr, PROG ": %u attached engine%s keep%s the memory until they exit\n",
                in.n_attached, in.n_attached == 1 ? "" : "s", in.n_attached == 1 ? "s" : "");
    return STRATA_EXIT_OK;
}

static int write_pid_file(const char *path, pid_t pid)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "%d\n", (int)pid);
    return fclose(f);
}

/* Turn into the background: the parent prints the name and exits once the
 * child has recorded itself as the loader and written the pid file. */
static int daemonize(struct strata_resident_image *img, const char *pid_file)
{
    int pfd[2];
    char ok = 0;
    if (pipe(pfd))
        return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid > 0) {
        close(pfd[1]);
        while (read(pfd[0], &ok, 1) < 0 && errno == EINTR)
            ;
        close(pfd[0]);
        if (ok != 'k') {
            fprintf(stderr, PROG ": the background loader failed to start\n");
            _exit(STRATA_EXIT_FAILURE);
        }
        printf("%s\n", strata_resident_image_pack(img)->name);
        fflush(stdout);
        _exit(STRATA_EXIT_OK);
    }
    close(pfd[0]);
    setsid();
    struct strata_err err = {0};
    if (strata_resident_image_set_loader(img, getpid(), &err) ||
        write_pid_file(pid_file, getpid())) {
        close(pfd[1]);
        return -1;
    }
    int nul = open("/dev/null", O_RDWR);
    if (nul >= 0) {
        dup2(nul, 0);
        dup2(nul, 1);
        dup2(nul, 2);
        if (nul > 2)
            close(nul);
    }
    if (chdir("/")) {
        /* not fatal: the image does not depend on the working directory */
    }
    ok = 'k';
    if (write(pfd[1], &ok, 1) != 1) {
        /* the parent is gone; keep serving */
    }
    close(pfd[1]);
    return 0;
}

static int run_load(const char *pack, int detach, const char *pid_file_opt,
                    struct strata_resident_load_opts *lo, int quiet)
{
    struct strata_err err = {0};
    struct strata_resident_image *img = NULL;
    struct strata_resident_load_stats st;
    struct progress pr = {.quiet = quiet, .tty = isatty(2)};
    char pid_file[4200] = "";
    struct sigaction sa;
    sigset_t block, old;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    pr.t0 = pr.last = now_s();
    lo->pack = pack;
    lo->progress = on_progress;
    lo->progress_ud = &pr;
    if (strata_resident_load(lo, &img, &st, &err)) {
        if (pr.tty && !quiet)
            fputc('\n', stderr);
        if (err.code == STRATA_E_CANCELLED) {
            fprintf(stderr, PROG ": interrupted; the image was removed\n");
            return STRATA_EXIT_FAILURE;
        }
        fprintf(stderr, PROG ": %s\n", err.msg);
        return err.code == STRATA_E_INVALID ? STRATA_EXIT_FAILURE : strata_err_exit_code(err.code);
    }
    const struct strata_resident_pack *p = strata_resident_image_pack(img);
    if (pr.tty && !quiet)
        fputc('\n', stderr);
    fprintf(stderr,
            PROG ": %s ready: %.2f GiB of '%s' (%u file%s) in %.1f s, %.2f GiB/s, every "
                 "sha256 verified; O_DIRECT %d/%u; huge pages: %s\n",
            p->name, gib(st.bytes), p->pack_name, p->n_files, p->n_files == 1 ? "" : "s",
            st.seconds, st.seconds > 0 ? gib(st.bytes) / st.seconds : 0.0, st.direct_io,
            p->n_files, st.huge_pages);
    if (st.released_bytes)
        fprintf(stderr, PROG ": %.2f GiB of routed experts in the GGUF files released from the "
                        "image (engines read them from experts.bin)\n", gib(st.released_bytes));
    if (detach) {
        if (pid_file_opt)
            snprintf(pid_file, sizeof(pid_file), "%s", pid_file_opt);
        else
            snprintf(pid_file, sizeof(pid_file), "/dev/shm/%s.pid", p->name);
        if (daemonize(img, pid_file)) {
            fprintf(stderr, PROG ": cannot go into the background: %s\n", strerror(errno));
            strata_resident_image_remove(img);
            return STRATA_EXIT_FAILURE;
        }
    } else {
        printf("%s\n", p->name);
        fflush(stdout);
        fprintf(stderr, PROG ": resident in the foreground (pid %d); Ctrl-C or "
                        "'strata-load --unload %s' removes it\n", (int)getpid(), p->name);
    }
    /* wait for a signal with it blocked between the check and the wait */
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, &old);
    while (!g_stop)
        sigsuspend(&old);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (!detach)
        fprintf(stderr, PROG ": removing %s\n", p->name);
    if (pid_file_opt && detach)
        unlink(pid_file_opt);
    strata_resident_image_remove(img);
    return STRATA_EXIT_OK;
}

int main(int argc, char **argv)
{
    strata_log_set_prog(PROG);
    static const struct option longopts[] = {
        {"detach", no_argument, NULL, 'd'},
        {"pid-file", required_argument, NULL, 'p'},
        {"reserve-mib", required_argument, NULL, 'r'},
        {"no-huge-pages", no_argument, NULL, 'H'},
        {"no-direct", no_argument, NULL, 'D'},
        {"quiet", no_argument, NULL, 'q'},
        {"status", no_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},
        {"unload", required_argument, NULL, 'u'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct strata_resident_load_opts lo = {.reserve_bytes = 1024ull << 20, .huge_pages = 1,
                                           .direct_io = 1};
    int detach = 0, quiet = 0, status = 0, json = 0, c;
    const char *pid_file = NULL, *unload = NULL;
    while ((c = getopt_long(argc, argv, "dqh", longopts, NULL)) != -1) {
        switch (c) {
        case 'd': detach = 1; break;
        case 'p': pid_file = optarg; break;
        case 'r': {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (errno || *end || !*optarg || optarg[0] == '-' || v > (1ull << 40)) {
                fprintf(stderr, PROG ": invalid --reserve-mib '%s'\n", optarg);
                return STRATA_EXIT_USAGE;
            }
            lo.reserve_bytes = (uint64_t)v << 20;
            break;
        }
        case 'H': lo.huge_pages = 0; break;
        case 'D': lo.direct_io = 0; break;
        case 'q': quiet = 1; break;
        case 's': status = 1; break;
        case 'j': json = 1; break;
        case 'u': unload = optarg; break;
        case 'h': fputs(usage_text, stdout); return STRATA_EXIT_OK;
        default: fputs(usage_text, stderr); return STRATA_EXIT_USAGE;
        }
    }
    int n_args = argc - optind;
    if (status + !!unload > 1 || ((status || unload) && n_args) || (!status && !unload &&
                                                                     n_args != 1) ||
        (json && !status) || (pid_file && !detach)) {
        fputs(usage_text, stderr);
        return STRATA_EXIT_USAGE;
    }
    if (status)
        return run_status(json);
    if (unload)
        return run_unload(unload);
    return run_load(argv[optind], detach, pid_file, &lo, quiet);
}
