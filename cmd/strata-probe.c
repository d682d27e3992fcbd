/* strata-probe - will this machine run Strata, and how fast? */
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "log.h"
#include "probe.h"

static const char usage_text[] =
    "usage: strata-probe [--json] [--quick] [--timeout MS] [--no-selftest]\n"
    "                    [--selftest-timeout MS]\n"
    "\n"
    "  --json        print the report as JSON (schema strata-probe/1)\n"
    "  --quick       skip the bandwidth measurements\n"
    "  --timeout MS  watchdog for the GPU runtime queries (default 20000)\n"
    "  --no-selftest skip the kernel self-test of GPU builds\n"
    "  --selftest-timeout MS\n"
    "                deadline of each self-test kernel (default 3000)\n"
    "  -h, --help    show this help\n"
    "\n"
    "exit status: 0 a usable GPU, or no GPU at all (CPU backend); 4 a GPU is\n"
    "present but none is usable (unsupported, or failed the kernel self-test), or\n"
    "the GPU runtime crashed or hung; 1 the probe\n"
    "itself failed.\n";

int main(int argc, char **argv)
{
    strata_log_set_prog("strata-probe");
    static const struct option longopts[] = {
        {"json", no_argument, NULL, 'j'},
        {"quick", no_argument, NULL, 'q'},
        {"timeout", required_argument, NULL, 't'},
        {"no-selftest", no_argument, NULL, 'n'},
        {"selftest-timeout", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int json = 0;
    struct strata_probe_opts opts = {0};
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'j': json = 1; break;
        case 'q': opts.quick = 1; break;
        case 'n': opts.no_selftest = 1; break;
        case 's':
        case 't': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v <= 0 || v > 600000) {
                fprintf(stderr, "strata-probe: invalid --%s '%s'\n",
                        c == 't' ? "timeout" : "selftest-timeout", optarg);
                return STRATA_EXIT_USAGE;
            }
            if (c == 't')
                opts.timeout_ms = (int)v;
            else
                opts.selftest_timeout_ms = (int)v;
            break;
        }
        case 'h': fputs(usage_text, stdout); return STRATA_EXIT_OK;
        default: fputs(usage_text, stderr); return STRATA_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "strata-probe: unexpected argument '%s'\n", argv[optind]);
        fputs(usage_text, stderr);
        return STRATA_EXIT_USAGE;
    }

    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        opts.exe_dir = dirname(exe);
    }

    static struct strata_probe_report report;
    struct strata_err err = {0};
    if (strata_probe_run(&report, &opts, &err) != 0) {
        fprintf(stderr, "strata-probe: %s\n", err.msg);
        return STRATA_EXIT_FAILURE;
    }
    if (json) {
        char *s = strata_probe_json(&report);
        if (!s) {
            fprintf(stderr, "strata-probe: out of memory\n");
            return STRATA_EXIT_NOMEM;
        }
        puts(s);
        free(s);
    } else {
        strata_probe_print(stdout, &report);
    }
    if ((report.n_devices > 0 || report.child_error[0]) && report.usable_devices == 0)
        return STRATA_EXIT_GPU;
    return STRATA_EXIT_OK;
}
