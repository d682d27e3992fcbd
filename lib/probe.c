/* probe.c - machine report: CPU, memory, GPU runtimes and devices, PCIe.
 *
 * GPU runtime calls happen only in a forked child (gpu_child) that writes
 * its findings into a shared anonymous mapping; the parent waits with a
 * watchdog.  Runtime entry points are looked up with dlsym by name, so the
 * probe builds and runs on machines with no GPU software at all.
 * Attribute ids are those of the CUDA driver API (cuda.h, CUdevice_attribute).
 */
#include "probe.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GB 1e9

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int injected(const char *what)
{
    const char *env = getenv("STRATA_PROBE_INJECT");
    if (!env)
        return 0;
    size_t n = strlen(what);
    for (const char *p = env; (p = strstr(p, what)) != NULL; p += n)
        if ((p == env || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
            return 1;
    return 0;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strnlen(src, cap - 1) : 0;
    if (n)
        memcpy(dst, src, n);
    dst[n] = '\0';
}

/* ---- CPU and memory --------------------------------------------------- */

static uint64_t meminfo_kib(const char *text, const char *key)
{
    const char *p = strstr(text, key);
    if (!p)
        return 0;
    p += strlen(key);
    while (*p == ' ' || *p == ':')
        p++;
    return strtoull(p, NULL, 10);
}

static size_t read_file(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    return n;
}

static void probe_cpu(struct strata_probe_cpu *c)
{
    static char buf[1 << 16];
    if (read_file("/proc/cpuinfo", buf, sizeof(buf))) {
        const char *p = strstr(buf, "model name");
        if (p && (p = strchr(p, ':')) != NULL) {
            p++;
            while (*p == ' ')
                p++;
            size_t n = strcspn(p, "\n");
            if (n >= sizeof(c->model))
                n = sizeof(c->model) - 1;
            memcpy(c->model, p, n);
            c->model[n] = '\0';
        }
    }
    if (!c->model[0])
        copy_str(c->model, sizeof(c->model), "unknown");
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    c->n_cpus = n > 0 ? (int)n : 1;

    __builtin_cpu_init();
    c->sse42 = __builtin_cpu_supports("sse4.2") != 0;
    c->avx = __builtin_cpu_supports("avx") != 0;
    c->avx2 = __builtin_cpu_supports("avx2") != 0;
    c->fma = __builtin_cpu_supports("fma") != 0;
    c->avx512f = __builtin_cpu_supports("avx512f") != 0;
    c->avx512bw = __builtin_cpu_supports("avx512bw") != 0;
    c->avx512vl = __builtin_cpu_supports("avx512vl") != 0;
    c->avx512vnni = __builtin_cpu_supports("avx512vnni") != 0;
    c->avx512bf16 = __builtin_cpu_supports("avx512bf16") != 0;
    /* f16c has no __builtin_cpu_supports name in older compilers: cpuinfo */
    c->f16c = strstr(buf, " f16c") != NULL;

    if (read_file("/proc/meminfo", buf, sizeof(buf))) {
        c->ram_total = meminfo_kib(buf, "MemTotal") * 1024;
        c->ram_available = meminfo_kib(buf, "MemAvailable") * 1024;
        c->hugepages_total = meminfo_kib(buf, "HugePages_Total");
        c->hugepages_free = meminfo_kib(buf, "HugePages_Free");
        c->hugepage_size = meminfo_kib(buf, "Hugepagesize") * 1024;
    }
    if (read_file("/sys/kernel/mm/transparent_hugepage/enabled", buf, sizeof(buf))) {
        const char *a = strchr(buf, '['), *b = a ? strchr(a, ']') : NULL;
        if (a && b && b - a - 1 < (long)sizeof(c->thp)) {
            memcpy(c->thp, a + 1, (size_t)(b - a - 1));
            c->thp[b - a - 1] = '\0';
        }
    }
    if (!c->thp[0])
        copy_str(c->thp, sizeof(c->thp), "unknown");
    c->mem_read_gbs = -1;
}

struct read_job {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
};

static void *read_worker(void *arg)
{
    struct read_job *j = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= j->n; i += 4) {
        s0 += j->p[i];
        s1 += j->p[i + 1];
        s2 += j->p[i + 2];
        s3 += j->p[i + 3];
    }
    for (; i < j->n; i++)
        s0 += j->p[i];
    j->sum = s0 + s1 + s2 + s3;
    return NULL;
}

double strata_probe_mem_read_gbs(uint64_t bytes, int n_threads)
{
    if (n_threads < 1)
        n_threads = 1;
    if (n_threads > 256)
        n_threads = 256;
    size_t n = bytes / sizeof(uint64_t);
    uint64_t *buf = malloc(n * sizeof(uint64_t));
    if (!buf || n < (size_t)n_threads)
        return free(buf), -1;
    for (size_t i = 0; i < n; i++)
        buf[i] = i;
    double best = -1;
    uint64_t sink = 0;
    struct read_job jobs[256];
    pthread_t tid[256];
    for (int rep = 0; rep < 3; rep++) {
        size_t per = n / (size_t)n_threads;
        double t0 = now_s();
        for (int t = 0; t < n_threads; t++) {
            jobs[t].p = buf + per * (size_t)t;
            jobs[t].n = t == n_threads - 1 ? n - per * (size_t)t : per;
            tid[t] = 0;
            if (t > 0 && pthread_create(&tid[t], NULL, read_worker, &jobs[t]) != 0) {
                tid[t] = 0;
                read_worker(&jobs[t]);
            }
        }
        read_worker(&jobs[0]);
        for (int t = 1; t < n_threads; t++)
            if (tid[t])
                pthread_join(tid[t], NULL);
        double dt = now_s() - t0;
        for (int t = 0; t < n_threads; t++)
            sink += jobs[t].sum;
        double gbs = (double)(n * sizeof(uint64_t)) / dt / GB;
        if (gbs > best)
            best = gbs;
    }
    free(buf);
    /* a volatile store keeps the sums, and so the reads, from being elided */
    volatile uint64_t keep = sink;
    (void)keep;
    return best;
}

double strata_probe_pcie_frac(double pcie_gbs, double cpu_gbs)
{
    if (!(pcie_gbs > 0) || !(cpu_gbs > 0))
        return -1;
    return pcie_gbs / (pcie_gbs + cpu_gbs);
}

const char *strata_probe_status_name(int status)
{
    switch (status) {
    case STRATA_PROBE_SUPPORTED: return "supported";
    case STRATA_PROBE_UNSUPPORTED: return "unsupported";
    case STRATA_PROBE_NOT_VISIBLE: return "not visible";
    case STRATA_PROBE_FAILED: return "failed";
    default: return "unknown";
    }
}

/* ---- GPU runtimes (in the child) -------------------------------------- */

struct child_out {
    struct strata_probe_lib libs[STRATA_PROBE_MAX_LIBS];
    int n_libs;
    int cuda_driver_version, cuda_runtime_version, hip_runtime_version;
    struct strata_probe_device devices[STRATA_PROBE_MAX_DEVICES];
    int n_devices;
    int done;
};

/* Load the first of names that loads; record it, or the first name's failure. */
static void *try_dlopen(struct child_out *o, const char *const *names)
{
    if (o->n_libs >= STRATA_PROBE_MAX_LIBS)
        return NULL;
    struct strata_probe_lib *l = &o->libs[o->n_libs++];
    copy_str(l->name, sizeof(l->name), names[0]);
    if (injected("no-runtime")) {
        copy_str(l->error, sizeof(l->error), "not loaded (injected fault)");
        return NULL;
    }
    for (const char *const *n = names; *n; n++) {
        void *h = dlopen(*n, RTLD_NOW | RTLD_LOCAL);
        if (h) {
            copy_str(l->name, sizeof(l->name), *n);
            l->loaded = 1;
            l->error[0] = '\0';
            struct link_map *lm = NULL;
            if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name)
                copy_str(l->path, sizeof(l->path), lm->l_name);
            return h;
        }
        const char *e = dlerror();
        if (n == names)
            copy_str(l->error, sizeof(l->error), e ? e : "cannot load");
    }
    return NULL;
}

#define SYM(h, name) dlsym(h, name)

static void link_from_sysfs(struct strata_probe_device *d)
{
    if (!d->pci_bus_id[0])
        return;
    char path[256], speed[64] = "", width[32] = "";
    char bus[32];
    copy_str(bus, sizeof(bus), d->pci_bus_id);
    for (char *p = bus; *p; p++)
        if (*p >= 'A' && *p <= 'F')
            *p = (char)(*p - 'A' + 'a');
    /* CUDA prints an 8-digit domain ("00000000:3B:00.0"); sysfs uses 4 */
    const char *b = bus;
    if (strlen(bus) == 16 && strncmp(bus, "0000", 4) == 0)
        b = bus + 4;
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/current_link_speed", b);
    if (!read_file(path, speed, sizeof(speed)))
        return;
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/current_link_width", b);
    read_file(path, width, sizeof(width));
    double gts = strtod(speed, NULL);
    int gen = gts >= 60 ? 6 : gts >= 30 ? 5 : gts >= 15 ? 4 : gts >= 7 ? 3 : gts >= 4 ? 2 : 1;
    snprintf(d->link, sizeof(d->link), "PCIe gen %d x%d", gen, atoi(width));
}

/* A common shape for the CUDA runtime and HIP entry points we time with. */
struct copy_api {
    int (*set_device)(int);
    int (*malloc_dev)(void **, size_t);
    int (*free_dev)(void *);
    int (*malloc_host)(void **, size_t, unsigned);
    int (*malloc_host_cuda)(void **, size_t);
    int (*free_host)(void *);
    int (*memcpy_sync)(void *, const void *, size_t, int);
    int (*memcpy_async)(void *, const void *, size_t, int, void *);
    int (*stream_create)(void **);
    int (*stream_destroy)(void *);
    int (*device_sync)(void);
};

static int api_host_alloc(const struct copy_api *a, void **p, size_t n)
{
    if (a->malloc_host_cuda)
        return a->malloc_host_cuda(p, n);
    return a->malloc_host(p, n, 0);
}

static double time_copy(const struct copy_api *a, void *dst, const void *src, size_t n, int kind)
{
    double best = -1;
    if (a->memcpy_sync(dst, src, n, kind) != 0) /* warm-up */
        return -1;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_s();
        if (a->memcpy_sync(dst, src, n, kind) != 0)
            return -1;
        double gbs = (double)n / (now_s() - t0) / GB;
        if (gbs > best)
            best = gbs;
    }
    return best;
}

/* Pinned and pageable copies in both directions, then both at once. */
static void measure_bandwidth(const struct copy_api *a, int dev, struct strata_probe_device *d)
{
    const size_t n = 256u << 20;
    void *dbuf = NULL, *dbuf2 = NULL, *pin = NULL, *pin2 = NULL, *page = NULL;
    void *s1 = NULL, *s2 = NULL;
    if (!a->set_device || !a->malloc_dev || !a->memcpy_sync || a->set_device(dev) != 0)
        return;
    if (a->malloc_dev(&dbuf, n) != 0 || a->malloc_dev(&dbuf2, n) != 0)
        goto out;
    if (api_host_alloc(a, &pin, n) == 0 && api_host_alloc(a, &pin2, n) == 0) {
        memset(pin, 1, n);
        memset(pin2, 2, n);
        d->h2d_pinned = time_copy(a, dbuf, pin, n, 1);
        d->d2h_pinned = time_copy(a, pin, dbuf, n, 2);
        if (a->memcpy_async && a->stream_create && a->stream_create(&s1) == 0 &&
            a->stream_create(&s2) == 0) {
            double t0 = now_s();
            int rc = a->memcpy_async(dbuf, pin, n, 1, s1);
            rc |= a->memcpy_async(pin2, dbuf2, n, 2, s2);
            rc |= a->device_sync();
            double dt = now_s() - t0;
            if (rc == 0) {
                d->h2d_both = (double)n / dt / GB;
                d->d2h_both = (double)n / dt / GB;
            }
        }
    }
    page = malloc(n);
    if (page) {
        memset(page, 3, n);
        d->h2d_pageable = time_copy(a, dbuf, page, n, 1);
        d->d2h_pageable = time_copy(a, page, dbuf, n, 2);
    }
out:
    if (s1)
        a->stream_destroy(s1);
    if (s2)
        a->stream_destroy(s2);
    if (pin)
        a->free_host(pin);
    if (pin2)
        a->free_host(pin2);
    free(page);
    if (dbuf)
        a->free_dev(dbuf);
    if (dbuf2)
        a->free_dev(dbuf2);
}

static struct strata_probe_device *new_device(struct child_out *o, const char *api, int index)
{
    if (o->n_devices >= STRATA_PROBE_MAX_DEVICES)
        return NULL;
    struct strata_probe_device *d = &o->devices[o->n_devices++];
    memset(d, 0, sizeof(*d));
    copy_str(d->api, sizeof(d->api), api);
    d->index = index;
    d->vram_total = d->vram_free = -1;
    d->n_sm = d->warp_size = d->integrated = -1;
    d->h2d_pinned = d->d2h_pinned = d->h2d_pageable = d->d2h_pageable = -1;
    d->h2d_both = d->d2h_both = -1;
    d->status = STRATA_PROBE_UNKNOWN;
    return d;
}

static void probe_cuda(struct child_out *o, int quick)
{
    static const char *const drv_names[] = {"libcuda.so.1", "libcuda.so", NULL};
    static const char *const rt_names[] = {"libcudart.so.13", "libcudart.so.12",
                                           "libcudart.so.11.0", "libcudart.so", NULL};
    void *rt = try_dlopen(o, rt_names);
    if (rt) {
        int (*rt_ver)(int *) = (int (*)(int *))SYM(rt, "cudaRuntimeGetVersion");
        int v = -1;
        if (rt_ver && rt_ver(&v) == 0)
            o->cuda_runtime_version = v;
    }
    if (injected("fake-cuda")) {
        struct strata_probe_device *d = new_device(o, "cuda", 0);
        if (injected("query-fail")) {
            copy_str(d->query_error, sizeof(d->query_error),
                     "cuDeviceGet failed (injected fault)");
            return;
        }
        copy_str(d->name, sizeof(d->name), "Fake GPU (injected)");
        copy_str(d->arch, sizeof(d->arch), "sm_90");
        d->vram_total = 8ll << 30;
        d->vram_free = 7ll << 30;
        d->n_sm = 132;
        d->warp_size = 32;
        d->integrated = 0;
        return;
    }
    void *drv = try_dlopen(o, drv_names);
    if (!drv)
        return;
    int (*cu_init)(unsigned) = (int (*)(unsigned))SYM(drv, "cuInit");
    int (*cu_drv_ver)(int *) = (int (*)(int *))SYM(drv, "cuDriverGetVersion");
    int (*cu_count)(int *) = (int (*)(int *))SYM(drv, "cuDeviceGetCount");
    int (*cu_get)(int *, int) = (int (*)(int *, int))SYM(drv, "cuDeviceGet");
    int (*cu_name)(char *, int, int) = (int (*)(char *, int, int))SYM(drv, "cuDeviceGetName");
    int (*cu_attr)(int *, int, int) = (int (*)(int *, int, int))SYM(drv, "cuDeviceGetAttribute");
    int (*cu_mem)(size_t *, int) = (int (*)(size_t *, int))SYM(drv, "cuDeviceTotalMem_v2");
    int (*cu_busid)(char *, int, int) =
        (int (*)(char *, int, int))SYM(drv, "cuDeviceGetPCIBusId");
    int (*cu_err)(int, const char **) =
        (int (*)(int, const char **))SYM(drv, "cuGetErrorString");
    int v = -1;
    if (cu_drv_ver && cu_drv_ver(&v) == 0)
        o->cuda_driver_version = v;
    if (!cu_init || !cu_count || !cu_get)
        return;
    int rc = cu_init(0);
    int count = 0;
    if (rc != 0 || cu_count(&count) != 0) {
        /* no device, or a driver/runtime problem: say which */
        const char *msg = NULL;
        if (cu_err)
            cu_err(rc, &msg);
        if (rc != 100 /* CUDA_ERROR_NO_DEVICE */) {
            struct strata_probe_device *d = new_device(o, "cuda", -1);
            if (d)
                snprintf(d->query_error, sizeof(d->query_error), "cuInit failed: %s (%d)",
                         msg ? msg : "unknown error", rc);
        }
        return;
    }
    struct copy_api api = {0};
    if (rt) {
        api.set_device = (int (*)(int))SYM(rt, "cudaSetDevice");
        api.malloc_dev = (int (*)(void **, size_t))SYM(rt, "cudaMalloc");
        api.free_dev = (int (*)(void *))SYM(rt, "cudaFree");
        api.malloc_host_cuda = (int (*)(void **, size_t))SYM(rt, "cudaMallocHost");
        api.free_host = (int (*)(void *))SYM(rt, "cudaFreeHost");
        api.memcpy_sync = (int (*)(void *, const void *, size_t, int))SYM(rt, "cudaMemcpy");
        api.memcpy_async =
            (int (*)(void *, const void *, size_t, int, void *))SYM(rt, "cudaMemcpyAsync");
        api.stream_create = (int (*)(void **))SYM(rt, "cudaStreamCreate");
        api.stream_destroy = (int (*)(void *))SYM(rt, "cudaStreamDestroy");
        api.device_sync = (int (*)(void))SYM(rt, "cudaDeviceSynchronize");
    }
    int (*rt_meminfo)(size_t *, size_t *) =
        rt ? (int (*)(size_t *, size_t *))SYM(rt, "cudaMemGetInfo") : NULL;
    for (int i = 0; i < count; i++) {
        struct strata_probe_device *d = new_device(o, "cuda", i);
        if (!d)
            break;
        int dev = -1;
        int fail = injected("query-fail");
        if (fail || cu_get(&dev, i) != 0) {
            copy_str(d->query_error, sizeof(d->query_error),
                     fail ? "cuDeviceGet failed (injected fault)" : "cuDeviceGet failed");
            continue;
        }
        if (cu_name && cu_name(d->name, sizeof(d->name), dev) != 0)
            d->name[0] = '\0';
        int major = -1, minor = -1, val = 0;
        if (cu_attr && cu_attr(&major, 75, dev) == 0 && cu_attr(&minor, 76, dev) == 0)
            snprintf(d->arch, sizeof(d->arch), "sm_%d%d", major, minor);
        if (cu_attr && cu_attr(&val, 16, dev) == 0)
            d->n_sm = val;
        if (cu_attr && cu_attr(&val, 10, dev) == 0)
            d->warp_size = val;
        if (cu_attr && cu_attr(&val, 18, dev) == 0)
            d->integrated = val;
        size_t total = 0;
        if (cu_mem && cu_mem(&total, dev) == 0)
            d->vram_total = (int64_t)total;
        if (cu_busid && cu_busid(d->pci_bus_id, sizeof(d->pci_bus_id), dev) != 0)
            d->pci_bus_id[0] = '\0';
        link_from_sysfs(d);
        size_t fr = 0, tot = 0;
        if (api.set_device && api.set_device(i) == 0 && rt_meminfo && rt_meminfo(&fr, &tot) == 0)
            d->vram_free = (int64_t)fr;
        if (!quick)
            measure_bandwidth(&api, i, d);
    }
}

/* Integrated AMD GPUs (APUs) share system RAM; listed by gfx target. */
static int amd_integrated(const char *arch)
{
    static const char *const apus[] = {"gfx902", "gfx909", "gfx90c", "gfx1013", "gfx1033",
                                       "gfx1035", "gfx1036", "gfx1037", "gfx1103", "gfx1150",
                                       "gfx1151", "gfx1152", NULL};
    for (const char *const *a = apus; *a; a++)
        if (strcmp(arch, *a) == 0)
            return 1;
    return 0;
}

static void probe_hip(struct child_out *o, int quick)
{
    static const char *const names[] = {"libamdhip64.so.6", "libamdhip64.so.5",
                                        "libamdhip64.so", NULL};
    void *h = try_dlopen(o, names);
    if (!h)
        return;
    int (*ver)(int *) = (int (*)(int *))SYM(h, "hipRuntimeGetVersion");
    int (*count_fn)(int *) = (int (*)(int *))SYM(h, "hipGetDeviceCount");
    int (*name_fn)(char *, int, int) = (int (*)(char *, int, int))SYM(h, "hipDeviceGetName");
    int (*props_fn)(void *, int) = (int (*)(void *, int))SYM(h, "hipGetDevicePropertiesR0600");
    if (!props_fn)
        props_fn = (int (*)(void *, int))SYM(h, "hipGetDeviceProperties");
    int (*busid_fn)(char *, int, int) = (int (*)(char *, int, int))SYM(h, "hipDeviceGetPCIBusId");
    int (*meminfo)(size_t *, size_t *) = (int (*)(size_t *, size_t *))SYM(h, "hipMemGetInfo");
    int v = -1;
    if (ver && ver(&v) == 0)
        o->hip_runtime_version = v;
    int count = 0;
    if (!count_fn || count_fn(&count) != 0 || count <= 0)
        return;
    struct copy_api api = {
        .set_device = (int (*)(int))SYM(h, "hipSetDevice"),
        .malloc_dev = (int (*)(void **, size_t))SYM(h, "hipMalloc"),
        .free_dev = (int (*)(void *))SYM(h, "hipFree"),
        .malloc_host = (int (*)(void **, size_t, unsigned))SYM(h, "hipHostMalloc"),
        .free_host = (int (*)(void *))SYM(h, "hipHostFree"),
        .memcpy_sync = (int (*)(void *, const void *, size_t, int))SYM(h, "hipMemcpy"),
        .memcpy_async = (int (*)(void *, const void *, size_t, int, void *))SYM(h, "hipMemcpyAsync"),
        .stream_create = (int (*)(void **))SYM(h, "hipStreamCreate"),
        .stream_destroy = (int (*)(void *))SYM(h, "hipStreamDestroy"),
        .device_sync = (int (*)(void))SYM(h, "hipDeviceSynchronize"),
    };
    static unsigned char props[16384];
    for (int i = 0; i < count; i++) {
        struct strata_probe_device *d = new_device(o, "hip", i);
        if (!d)
            break;
        if (injected("query-fail")) {
            copy_str(d->query_error, sizeof(d->query_error),
                     "hipGetDeviceProperties failed (injected fault)");
            continue;
        }
        if (name_fn && name_fn(d->name, sizeof(d->name), i) != 0)
            d->name[0] = '\0';
        /* The properties struct changed layout between ROCm releases; the
         * gcnArchName string ("gfx1100:sramecc-:xnack-") is found by its
         * prefix rather than by a version-specific offset. */
        memset(props, 0, sizeof(props));
        if (props_fn && props_fn(props, i) == 0) {
            for (size_t k = 256; k + 8 < sizeof(props); k++) {
                if (memcmp(props + k, "gfx", 3) == 0 && props[k + 3] >= '0' &&
                    props[k + 3] <= '9') {
                    size_t n = strcspn((const char *)props + k, ":");
                    if (n >= sizeof(d->arch))
                        n = sizeof(d->arch) - 1;
                    memcpy(d->arch, props + k, n);
                    d->arch[n] = '\0';
                    break;
                }
            }
        }
        if (d->arch[0]) {
            /* wave64 on GCN/CDNA (gfx9), wave32 by default on RDNA (gfx10+) */
            d->warp_size = strncmp(d->arch, "gfx9", 4) == 0 ? 64 : 32;
            d->integrated = amd_integrated(d->arch);
        }
        if (busid_fn && busid_fn(d->pci_bus_id, sizeof(d->pci_bus_id), i) != 0)
            d->pci_bus_id[0] = '\0';
        link_from_sysfs(d);
        size_t fr = 0, tot = 0;
        if (api.set_device && api.set_device(i) == 0 && meminfo && meminfo(&fr, &tot) == 0) {
            d->vram_free = (int64_t)fr;
            d->vram_total = (int64_t)tot;
        }
        if (!quick)
            measure_bandwidth(&api, i, d);
    }
}

static void gpu_child(struct child_out *o, int quick, int unmasked)
{
    if (injected("crash"))
        raise(SIGSEGV);
    if (injected("hang"))
        for (;;)
            pause();
    if (unmasked) {
        unsetenv("CUDA_VISIBLE_DEVICES");
        unsetenv("HIP_VISIBLE_DEVICES");
        unsetenv("ROCR_VISIBLE_DEVICES");
        quick = 1;
    }
    o->cuda_driver_version = o->cuda_runtime_version = o->hip_runtime_version = -1;
    probe_cuda(o, quick);
    probe_hip(o, quick);
    o->done = 1;
}

/* Run gpu_child in a fork with a watchdog.  Returns 0 when it finished;
 * otherwise fills msg with what happened and what it printed last. */
static int run_child(struct child_out *o, int quick, int unmasked, int timeout_ms, char *msg,
                     size_t cap)
{
    int pfd[2];
    if (pipe(pfd) != 0)
        return snprintf(msg, cap, "cannot create pipe: %s", strerror(errno)), -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return snprintf(msg, cap, "cannot fork: %s", strerror(errno)), -1;
    }
    if (pid == 0) {
        close(pfd[0]);
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        gpu_child(o, quick, unmasked);
        _exit(0);
    }
    close(pfd[1]);
    fcntl(pfd[0], F_SETFL, O_NONBLOCK);
    char out[4096];
    size_t n_out = 0;
    int status = 0, finished = 0;
    double deadline = now_s() + timeout_ms / 1000.0;
    while (!finished) {
        ssize_t r;
        char tmp[512];
        while ((r = read(pfd[0], tmp, sizeof(tmp))) > 0) {
            /* keep the tail of what the child printed */
            if (n_out + (size_t)r > sizeof(out) - 1) {
                size_t drop = n_out + (size_t)r - (sizeof(out) - 1);
                memmove(out, out + drop, n_out - drop);
                n_out -= drop;
            }
            memcpy(out + n_out, tmp, (size_t)r);
            n_out += (size_t)r;
        }
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) {
            finished = 1;
            break;
        }
        if (now_s() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            out[n_out] = '\0';
            snprintf(msg, cap, "GPU runtime query did not finish within %d ms (killed)%s%.120s",
                     timeout_ms, n_out ? "; last output: " : "", out);
            close(pfd[0]);
            return -1;
        }
        usleep(5000);
    }
    close(pfd[0]);
    out[n_out] = '\0';
    while (n_out && (out[n_out - 1] == '\n' || out[n_out - 1] == ' '))
        out[--n_out] = '\0';
    for (char *p = out; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    if (WIFSIGNALED(status) || !o->done) {
        snprintf(msg, cap, "GPU runtime query crashed (%s)%s%.120s",
                 WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "exited early",
                 n_out ? "; last output: " : "", out);
        return -1;
    }
    return 0;
}

/* ---- build information ------------------------------------------------ */

static void collect_archs(const cJSON *j, char *archs, size_t cap, char *backends, size_t bcap)
{
    if (!j)
        return;
    if (cJSON_IsString(j)) {
        const char *s = j->valuestring;
        int is_arch = strncmp(s, "sm_", 3) == 0 || strncmp(s, "compute_", 8) == 0 ||
                      strncmp(s, "gfx", 3) == 0;
        if (is_arch && strlen(archs) + strlen(s) + 2 < cap && !strstr(archs, s)) {
            if (archs[0])
                strcat(archs, " ");
            strcat(archs, s);
        }
        if ((strcmp(s, "cuda") == 0 || strcmp(s, "hip") == 0) &&
            strlen(backends) + strlen(s) + 2 < bcap && !strstr(backends, s)) {
            strcat(backends, " ");
            strcat(backends, s);
        }
        return;
    }
    for (const cJSON *c = j->child; c; c = c->next)
        collect_archs(c, archs, cap, backends, bcap);
}

/* Which backends and archs this build has kernels for: what the program
 * itself was compiled with (its self-test table names them), then any
 * BUILD.json files next to the programs (written by `make cuda`/`make hip`;
 * they matter only when the programs were moved without them). */
static void read_build_info(struct strata_probe_report *r, const char *dir)
{
    copy_str(r->build_backends, sizeof(r->build_backends), "cpu");
    const struct strata_selftest_table *t = strata_selftest_gpu_table();
    if (t) {
        cJSON *j = cJSON_CreateArray();
        cJSON_AddItemToArray(j, cJSON_CreateString(t->api));
        char archs[sizeof(r->build_archs)];
        copy_str(archs, sizeof(archs), t->archs ? t->archs : "");
        for (char *save = NULL, *a = strtok_r(archs, " ", &save); a; a = strtok_r(NULL, " ", &save))
            cJSON_AddItemToArray(j, cJSON_CreateString(a));
        collect_archs(j, r->build_archs, sizeof(r->build_archs), r->build_backends,
                      sizeof(r->build_backends));
        cJSON_Delete(j);
    }
    if (!dir)
        return;
    static const char *const files[] = {"BUILD.json", "BUILD-cuda.json", "BUILD-hip.json", NULL};
    for (const char *const *f = files; *f; f++) {
        char path[1024], buf[1 << 16];
        snprintf(path, sizeof(path), "%s/%s", dir, *f);
        if (!read_file(path, buf, sizeof(buf)))
            continue;
        cJSON *j = cJSON_Parse(buf);
        collect_archs(j, r->build_archs, sizeof(r->build_archs), r->build_backends,
                      sizeof(r->build_backends));
        cJSON_Delete(j);
    }
}

static int has_word(const char *list, const char *w)
{
    size_t n = strlen(w);
    for (const char *p = list; (p = strstr(p, w)) != NULL; p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == '\0' || p[n] == ' '))
            return 1;
    return 0;
}

static void classify(const struct strata_probe_report *r, struct strata_probe_device *d)
{
    char why[sizeof(d->reason)];
    if (d->status == STRATA_PROBE_NOT_VISIBLE)
        return;
    if (d->index < 0 || !d->arch[0]) {
        d->status = STRATA_PROBE_UNKNOWN;
        copy_str(d->reason, sizeof(d->reason),
                 d->query_error[0] ? d->query_error : "architecture could not be queried");
        return;
    }
    int is_cuda = strcmp(d->api, "cuda") == 0;
    if (d->integrated == 1) {
        d->status = STRATA_PROBE_UNSUPPORTED;
        snprintf(why, sizeof(why),
                 "integrated GPU (%s) shares system RAM; Strata needs a discrete GPU", d->arch);
        copy_str(d->reason, sizeof(d->reason), why);
        return;
    }
    if (!has_word(r->build_backends, d->api)) {
        d->status = STRATA_PROBE_UNSUPPORTED;
        snprintf(why, sizeof(why), "this build has no %s kernels: rebuild with `make %s`",
                 is_cuda ? "CUDA" : "HIP", d->api);
        copy_str(d->reason, sizeof(d->reason), why);
        return;
    }
    int ok = has_word(r->build_archs, d->arch);
    if (!ok && is_cuda) {
        /* PTX for compute_XY runs on sm_XY and newer through the JIT */
        int want = atoi(d->arch + 3);
        for (const char *p = r->build_archs; (p = strstr(p, "compute_")) != NULL; p += 8)
            if (atoi(p + 8) <= want)
                ok = 1;
    }
    if (ok) {
        d->status = STRATA_PROBE_SUPPORTED;
        d->reason[0] = '\0';
    } else {
        d->status = STRATA_PROBE_UNSUPPORTED;
        int n = snprintf(why, sizeof(why),
                         "%s is not compiled into this build (it has: %.80s); rebuild with %s",
                         d->arch, r->build_archs[0] ? r->build_archs : "none",
                         is_cuda ? "`make cuda` (CUDA_ARCH=... to add it)"
                                 : "`make hip HIP_ARCH=...`");
        (void)n;
        copy_str(d->reason, sizeof(d->reason), why);
    }
}

static int run_selftests(struct strata_probe_report *r, const struct strata_probe_opts *o,
                         struct strata_err *err);

int strata_probe_run(struct strata_probe_report *r, const struct strata_probe_opts *o,
                     struct strata_err *err)
{
    memset(r, 0, sizeof(*r));
    r->cuda_driver_version = r->cuda_runtime_version = r->hip_runtime_version = -1;
    r->pcie_frac = -1;
    probe_cpu(&r->cpu);
    read_build_info(r, o ? o->exe_dir : NULL);
    int quick = o && o->quick;
    int timeout_ms = o && o->timeout_ms > 0 ? o->timeout_ms : 20000;
    if (!quick) {
        int threads = r->cpu.n_cpus;
        r->cpu.mem_read_gbs = strata_probe_mem_read_gbs(512ull << 20, threads);
    }

    struct child_out *co = mmap(NULL, sizeof(*co), PROT_READ | PROT_WRITE,
                                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (co == MAP_FAILED)
        return strata_err_set(err, STRATA_E_NOMEM, "cannot map %zu bytes for the GPU query",
                              sizeof(*co));
    memset(co, 0, sizeof(*co));
    if (run_child(co, quick, 0, timeout_ms, r->child_error, sizeof(r->child_error)) == 0) {
        memcpy(r->libs, co->libs, sizeof(r->libs));
        r->n_libs = co->n_libs;
        r->cuda_driver_version = co->cuda_driver_version;
        r->cuda_runtime_version = co->cuda_runtime_version;
        r->hip_runtime_version = co->hip_runtime_version;
        memcpy(r->devices, co->devices, sizeof(r->devices));
        r->n_devices = co->n_devices;
        /* devices hidden by *_VISIBLE_DEVICES: enumerate again without it */
        if (getenv("CUDA_VISIBLE_DEVICES") || getenv("HIP_VISIBLE_DEVICES") ||
            getenv("ROCR_VISIBLE_DEVICES")) {
            char ignored[256];
            memset(co, 0, sizeof(*co));
            if (run_child(co, 1, 1, timeout_ms, ignored, sizeof(ignored)) == 0) {
                for (int i = 0; i < co->n_devices && r->n_devices < STRATA_PROBE_MAX_DEVICES;
                     i++) {
                    struct strata_probe_device *u = &co->devices[i];
                    int seen = 0;
                    for (int k = 0; k < r->n_devices; k++)
                        if (strcmp(r->devices[k].api, u->api) == 0 &&
                            strcmp(r->devices[k].pci_bus_id, u->pci_bus_id) == 0)
                            seen = 1;
                    if (seen || !u->pci_bus_id[0])
                        continue;
                    struct strata_probe_device *d = &r->devices[r->n_devices++];
                    *d = *u;
                    d->index = -1;
                    d->status = STRATA_PROBE_NOT_VISIBLE;
                    snprintf(d->reason, sizeof(d->reason), "masked by %s_VISIBLE_DEVICES",
                             strcmp(u->api, "cuda") == 0 ? "CUDA" : "HIP");
                }
            }
        }
    }
    munmap(co, sizeof(*co));

    double best_h2d = -1;
    for (int i = 0; i < r->n_devices; i++)
        classify(r, &r->devices[i]);
    int rc = run_selftests(r, o, err);
    if (rc)
        return rc;
    for (int i = 0; i < r->n_devices; i++) {
        if (r->devices[i].status == STRATA_PROBE_SUPPORTED) {
            r->usable_devices++;
            if (r->devices[i].h2d_pinned > best_h2d)
                best_h2d = r->devices[i].h2d_pinned;
        }
    }
    r->pcie_frac = strata_probe_pcie_frac(best_h2d, r->cpu.mem_read_gbs);
    return 0;
}

/* ---- kernel self-test ------------------------------------------------- */

/* The fake table of the selftest-pass / selftest-fail injections. */
static int fake_kernel(int dev, int arg, char *shapes, size_t sc, char *msg, size_t mc)
{
    snprintf(shapes, sc, "n=%d dev=%d", 64 + arg, dev);
    if (arg == 1 && injected("selftest-fail")) {
        snprintf(msg, mc, "differs from the CPU reference: at 3 gpu 1.5 ref -0.25 (injected "
                 "fault)");
        return STRATA_SELFTEST_WRONG;
    }
    return 0;
}

static const struct strata_selftest_case fake_cases[] = {
    {"rms_norm", fake_kernel, 0},
    {"matvec Q4_K", fake_kernel, 1},
};

/* Run the self-test on every supported device of the table's API; a device that fails
 * becomes STRATA_PROBE_FAILED. */
static int run_selftests(struct strata_probe_report *r, const struct strata_probe_opts *o,
                         struct strata_err *err)
{
    static const struct strata_selftest_table fake = {"cuda", fake_cases, 2, NULL, NULL};
    const struct strata_selftest_table *t = strata_selftest_gpu_table();
    if (injected("selftest-pass") || injected("selftest-fail"))
        t = &fake;
    const char *why = NULL;
    if (o && o->no_selftest)
        why = "skipped (--no-selftest)";
    else if (!t)
        why = "this build has no GPU kernels (CPU build; `make cuda` or `make hip`)";
    struct strata_selftest_opts so = {o ? o->selftest_timeout_ms : 0, 0};
    for (int i = 0; i < r->n_devices; i++) {
        struct strata_probe_device *d = &r->devices[i];
        struct strata_selftest_report *st = &d->selftest;
        memset(st, 0, sizeof(*st));
        if (why)
            copy_str(st->not_run, sizeof(st->not_run), why);
        else if (d->status != STRATA_PROBE_SUPPORTED)
            copy_str(st->not_run, sizeof(st->not_run), "the device is not supported");
        else if (strcmp(d->api, t->api) != 0)
            snprintf(st->not_run, sizeof(st->not_run), "the self-test of this build is for %s",
                     t->api);
        if (st->not_run[0])
            continue;
        int rc = strata_selftest_run_table(t, d->index, &so, st, err);
        if (rc)
            return rc;
        r->selftest_ran = 1;
        if (st->n_failed) {
            d->status = STRATA_PROBE_FAILED;
            strata_selftest_summary(st, d->reason, sizeof(d->reason));
        }
    }
    if (!r->selftest_ran)
        copy_str(r->selftest_note, sizeof(r->selftest_note),
                 why ? why : "no supported GPU device of this build's API");
    return 0;
}

/* ---- output ----------------------------------------------------------- */

static void fmt_bytes(char *buf, size_t cap, int64_t b)
{
    if (b < 0)
        snprintf(buf, cap, "unknown");
    else
        snprintf(buf, cap, "%.1f GiB", (double)b / (1024.0 * 1024 * 1024));
}

static void fmt_gbs(char *buf, size_t cap, double v)
{
    if (v < 0)
        snprintf(buf, cap, "not measured");
    else
        snprintf(buf, cap, "%.1f GB/s", v);
}

static void fmt_version(char *buf, size_t cap, int v)
{
    if (v < 0)
        snprintf(buf, cap, "unknown");
    else
        snprintf(buf, cap, "%d.%d", v / 1000, v % 1000 / 10);
}

/* "selftest: passed (N kernels)" and the kernels, failures one per line. */
static void print_selftest(FILE *f, const struct strata_selftest_report *st)
{
    if (!st->ran) {
        fprintf(f, "    selftest: not run: %s\n", st->not_run);
        return;
    }
    double ms = 0;
    for (int i = 0; i < st->n; i++)
        ms += st->r[i].ms;
    if (st->n_failed)
        fprintf(f, "    selftest: FAILED for %d of %d kernels (%.2f s)\n", st->n_failed, st->n,
                ms / 1000);
    else
        fprintf(f, "    selftest: passed (%d kernels, %.2f s)\n", st->n, ms / 1000);
    for (int i = 0; i < st->n; i++)
        if (!st->r[i].pass)
            fprintf(f, "      FAIL %s [%s]: %s\n", st->r[i].kernel, st->r[i].shapes,
                    st->r[i].error);
    int col = 0;
    for (int i = 0; i < st->n; i++) {
        if (!st->r[i].pass)
            continue;
        size_t n = strlen(st->r[i].kernel);
        if (col == 0 || col + n + 2 > 92) {
            fprintf(f, "%s      ok: %s", col ? "\n" : "", st->r[i].kernel);
            col = 10 + (int)n;
        } else {
            fprintf(f, ", %s", st->r[i].kernel);
            col += 2 + (int)n;
        }
    }
    if (col)
        fprintf(f, "\n");
}

void strata_probe_print(FILE *f, const struct strata_probe_report *r)
{
    const struct strata_probe_cpu *c = &r->cpu;
    char a[64], b[64];
    fprintf(f, "CPU\n");
    fprintf(f, "  model:       %s\n", c->model);
    fprintf(f, "  cpus:        %d\n", c->n_cpus);
    fprintf(f, "  simd:       %s%s%s%s%s%s%s%s%s%s\n", c->sse42 ? " sse4.2" : "",
            c->avx ? " avx" : "", c->avx2 ? " avx2" : "", c->fma ? " fma" : "",
            c->f16c ? " f16c" : "", c->avx512f ? " avx512f" : "", c->avx512bw ? " avx512bw" : "",
            c->avx512vl ? " avx512vl" : "", c->avx512vnni ? " avx512vnni" : "",
            c->avx512bf16 ? " avx512bf16" : "");
    fmt_bytes(a, sizeof(a), (int64_t)c->ram_total);
    fmt_bytes(b, sizeof(b), (int64_t)c->ram_available);
    fprintf(f, "  ram:         %s total, %s available\n", a, b);
    fprintf(f, "  hugepages:   %llu of %llu free (%llu KiB pages), transparent: %s\n",
            (unsigned long long)c->hugepages_free, (unsigned long long)c->hugepages_total,
            (unsigned long long)(c->hugepage_size / 1024), c->thp);
    fmt_gbs(a, sizeof(a), c->mem_read_gbs);
    fprintf(f, "  memory read: %s\n", a);

    fprintf(f, "\nGPU runtime libraries\n");
    if (r->n_libs == 0)
        fprintf(f, "  none tried%s\n", r->child_error[0] ? " (the query did not finish)" : "");
    for (int i = 0; i < r->n_libs; i++) {
        const struct strata_probe_lib *l = &r->libs[i];
        if (l->loaded)
            fprintf(f, "  %-18s loaded from %s\n", l->name, l->path[0] ? l->path : "?");
        else
            fprintf(f, "  %-18s missing: %s\n", l->name, l->error);
    }
    fmt_version(a, sizeof(a), r->cuda_driver_version);
    fmt_version(b, sizeof(b), r->cuda_runtime_version);
    fprintf(f, "  cuda driver %s, cuda runtime %s", a, b);
    /* HIP_VERSION = major * 10^7 + minor * 10^5 + patch (hip_version.h) */
    if (r->hip_runtime_version < 0)
        snprintf(a, sizeof(a), "unknown");
    else
        snprintf(a, sizeof(a), "%d.%d.%d", r->hip_runtime_version / 10000000,
                 r->hip_runtime_version / 100000 % 100, r->hip_runtime_version % 100000);
    fprintf(f, ", hip runtime %s\n", a);
    if (r->child_error[0])
        fprintf(f, "  error: %s\n", r->child_error);
    fprintf(f, "  this build: %s%s%s\n", r->build_backends, r->build_archs[0] ? "; archs " : "",
            r->build_archs);

    fprintf(f, "\nDevices\n");
    if (r->n_devices == 0)
        fprintf(f, "  no GPU found: Strata will use the CPU backend\n");
    for (int i = 0; i < r->n_devices; i++) {
        const struct strata_probe_device *d = &r->devices[i];
        fprintf(f, "  [%s %d] %s\n", d->api, d->index, d->name[0] ? d->name : "(name unknown)");
        fprintf(f, "    status:   %s%s%s\n", strata_probe_status_name(d->status),
                d->reason[0] ? ": " : "", d->reason);
        fprintf(f, "    arch:     %s, %s multiprocessors, warp size %s\n",
                d->arch[0] ? d->arch : "unknown", d->n_sm < 0 ? "?" : (snprintf(a, 16, "%d", d->n_sm), a),
                d->warp_size < 0 ? "?" : (snprintf(b, 16, "%d", d->warp_size), b));
        fmt_bytes(a, sizeof(a), d->vram_total);
        fmt_bytes(b, sizeof(b), d->vram_free);
        fprintf(f, "    vram:     %s total, %s free\n", a, b);
        if (d->pci_bus_id[0] || d->link[0])
            fprintf(f, "    pci:      %s %s\n", d->pci_bus_id, d->link);
        if (d->query_error[0] && d->status != STRATA_PROBE_UNKNOWN)
            fprintf(f, "    error:    %s\n", d->query_error);
        print_selftest(f, &d->selftest);
        if (d->h2d_pinned >= 0 || d->h2d_pageable >= 0) {
            fmt_gbs(a, sizeof(a), d->h2d_pinned);
            fmt_gbs(b, sizeof(b), d->d2h_pinned);
            fprintf(f, "    pinned:   host->device %s, device->host %s\n", a, b);
            fmt_gbs(a, sizeof(a), d->h2d_pageable);
            fmt_gbs(b, sizeof(b), d->d2h_pageable);
            fprintf(f, "    pageable: host->device %s, device->host %s\n", a, b);
            fmt_gbs(a, sizeof(a), d->h2d_both);
            fmt_gbs(b, sizeof(b), d->d2h_both);
            fprintf(f, "    both at once: host->device %s, device->host %s\n", a, b);
        }
    }
    fprintf(f, "\nVerdict\n");
    if (r->usable_devices > 0) {
        fprintf(f, "  %d usable GPU(s)", r->usable_devices);
        if (r->pcie_frac >= 0)
            fprintf(f, "; --pcie-frac auto would choose %.2f", r->pcie_frac);
        fprintf(f, "\n");
    } else if (r->n_devices > 0) {
        fprintf(f, "  a GPU is present but none is usable by this build; see the reasons above\n");
        if (!r->selftest_ran && r->selftest_note[0])
            fprintf(f, "  kernel self-test not run: %s\n", r->selftest_note);
    } else if (r->child_error[0]) {
        fprintf(f, "  the GPU runtime failed (see the error above): GPUs cannot be used\n");
    } else {
        fprintf(f, "  no GPU: the CPU backend will be used\n");
    }
}

static cJSON *num_or_null(double v, int known)
{
    return known ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}

char *strata_probe_json(const struct strata_probe_report *r)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    const struct strata_probe_cpu *c = &r->cpu;
    cJSON_AddStringToObject(root, "schema", "strata-probe/1");
    cJSON *cpu = cJSON_AddObjectToObject(root, "cpu");
    cJSON_AddStringToObject(cpu, "model", c->model);
    cJSON_AddNumberToObject(cpu, "cpus", c->n_cpus);
    cJSON *simd = cJSON_AddArrayToObject(cpu, "simd");
    const struct { int on; const char *name; } levels[] = {
        {c->sse42, "sse4.2"}, {c->avx, "avx"}, {c->avx2, "avx2"}, {c->fma, "fma"},
        {c->f16c, "f16c"}, {c->avx512f, "avx512f"}, {c->avx512bw, "avx512bw"},
        {c->avx512vl, "avx512vl"}, {c->avx512vnni, "avx512vnni"}, {c->avx512bf16, "avx512bf16"},
    };
    for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++)
        if (levels[i].on)
            cJSON_AddItemToArray(simd, cJSON_CreateString(levels[i].name));
    cJSON_AddNumberToObject(cpu, "ram_total_bytes", (double)c->ram_total);
    cJSON_AddNumberToObject(cpu, "ram_available_bytes", (double)c->ram_available);
    cJSON *hp = cJSON_AddObjectToObject(cpu, "hugepages");
    cJSON_AddNumberToObject(hp, "total", (double)c->hugepages_total);
    cJSON_AddNumberToObject(hp, "free", (double)c->hugepages_free);
    cJSON_AddNumberToObject(hp, "page_bytes", (double)c->hugepage_size);
    cJSON_AddStringToObject(hp, "transparent", c->thp);
    cJSON_AddItemToObject(cpu, "mem_read_gbs", num_or_null(c->mem_read_gbs, c->mem_read_gbs >= 0));

    cJSON *libs = cJSON_AddArrayToObject(root, "libraries");
    for (int i = 0; i < r->n_libs; i++) {
        cJSON *l = cJSON_CreateObject();
        cJSON_AddStringToObject(l, "name", r->libs[i].name);
        cJSON_AddBoolToObject(l, "loaded", r->libs[i].loaded);
        if (r->libs[i].loaded)
            cJSON_AddStringToObject(l, "path", r->libs[i].path);
        else
            cJSON_AddStringToObject(l, "error", r->libs[i].error);
        cJSON_AddItemToArray(libs, l);
    }
    cJSON *rt = cJSON_AddObjectToObject(root, "runtime");
    cJSON_AddItemToObject(rt, "cuda_driver", num_or_null(r->cuda_driver_version, r->cuda_driver_version >= 0));
    cJSON_AddItemToObject(rt, "cuda_runtime", num_or_null(r->cuda_runtime_version, r->cuda_runtime_version >= 0));
    cJSON_AddItemToObject(rt, "hip_runtime", num_or_null(r->hip_runtime_version, r->hip_runtime_version >= 0));
    if (r->child_error[0])
        cJSON_AddStringToObject(rt, "error", r->child_error);
    else
        cJSON_AddNullToObject(rt, "error");
    cJSON *build = cJSON_AddObjectToObject(root, "build");
    cJSON_AddStringToObject(build, "backends", r->build_backends);
    cJSON_AddStringToObject(build, "archs", r->build_archs);

    cJSON *devs = cJSON_AddArrayToObject(root, "devices");
    for (int i = 0; i < r->n_devices; i++) {
        const struct strata_probe_device *d = &r->devices[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "api", d->api);
        cJSON_AddNumberToObject(o, "index", d->index);
        cJSON_AddStringToObject(o, "name", d->name);
        cJSON_AddStringToObject(o, "arch", d->arch);
        cJSON_AddStringToObject(o, "status", strata_probe_status_name(d->status));
        cJSON_AddStringToObject(o, "reason", d->reason);
        cJSON_AddItemToObject(o, "vram_total_bytes", num_or_null((double)d->vram_total, d->vram_total >= 0));
        cJSON_AddItemToObject(o, "vram_free_bytes", num_or_null((double)d->vram_free, d->vram_free >= 0));
        cJSON_AddItemToObject(o, "multiprocessors", num_or_null(d->n_sm, d->n_sm >= 0));
        cJSON_AddItemToObject(o, "warp_size", num_or_null(d->warp_size, d->warp_size >= 0));
        cJSON_AddStringToObject(o, "pci_bus_id", d->pci_bus_id);
        cJSON_AddStringToObject(o, "link", d->link);
        cJSON *bw = cJSON_AddObjectToObject(o, "bandwidth_gbs");
        cJSON_AddItemToObject(bw, "h2d_pinned", num_or_null(d->h2d_pinned, d->h2d_pinned >= 0));
        cJSON_AddItemToObject(bw, "d2h_pinned", num_or_null(d->d2h_pinned, d->d2h_pinned >= 0));
        cJSON_AddItemToObject(bw, "h2d_pageable", num_or_null(d->h2d_pageable, d->h2d_pageable >= 0));
        cJSON_AddItemToObject(bw, "d2h_pageable", num_or_null(d->d2h_pageable, d->d2h_pageable >= 0));
        cJSON_AddItemToObject(bw, "h2d_both", num_or_null(d->h2d_both, d->h2d_both >= 0));
        cJSON_AddItemToObject(bw, "d2h_both", num_or_null(d->d2h_both, d->d2h_both >= 0));
        if (d->query_error[0])
            cJSON_AddStringToObject(o, "error", d->query_error);
        cJSON *st = cJSON_AddArrayToObject(o, "selftest");
        for (int k = 0; k < d->selftest.n; k++) {
            const struct strata_selftest_result *sr = &d->selftest.r[k];
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "kernel", sr->kernel);
            cJSON_AddStringToObject(e, "shapes", sr->shapes);
            cJSON_AddBoolToObject(e, "pass", sr->pass);
            cJSON_AddNumberToObject(e, "ms", sr->ms);
            if (sr->pass)
                cJSON_AddNullToObject(e, "error");
            else
                cJSON_AddStringToObject(e, "error", sr->error);
            cJSON_AddItemToArray(st, e);
        }
        if (d->selftest.ran)
            cJSON_AddNullToObject(o, "selftest_not_run");
        else
            cJSON_AddStringToObject(o, "selftest_not_run", d->selftest.not_run);
        cJSON_AddItemToArray(devs, o);
    }
    cJSON *sto = cJSON_AddObjectToObject(root, "selftest");
    cJSON_AddBoolToObject(sto, "run", r->selftest_ran);
    if (r->selftest_ran)
        cJSON_AddNullToObject(sto, "reason");
    else
        cJSON_AddStringToObject(sto, "reason", r->selftest_note);
    cJSON_AddNumberToObject(root, "usable_devices", r->usable_devices);
    cJSON_AddItemToObject(root, "pcie_frac", num_or_null(r->pcie_frac, r->pcie_frac >= 0));
    const char *backend = "cpu";
    for (int i = 0; i < r->n_devices; i++)
        if (r->devices[i].status == STRATA_PROBE_SUPPORTED) {
            backend = r->devices[i].api;
            break;
        }
    cJSON_AddStringToObject(root, "backend", backend);
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}
