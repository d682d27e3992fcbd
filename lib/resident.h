/* resident.h - resident images: a pack's data files held in shared memory so
 * that engines start without reading the disk (strata-load(1)).
 *
 * An image is two POSIX shared-memory objects (shm_open(3), under /dev/shm on
 * Linux) named after the pack's identity, not its path:
 *
 *   NAME.meta   a small header: magic, layout version, state (loading, ready),
 *               the identity, the pack directory and name, the loader's pid,
 *               creation time, and per data file its path, role, size,
 *               SHA-256, mtime and offset in the data object;
 *   NAME.data   the data files back to back, each starting at a multiple of
 *               STRATA_RESIDENT_ALIGN (2 MiB, the x86-64 huge page size).
 *
 * NAME is "strata-" followed by the first 16 hex digits of the identity, the
 * SHA-256 of the lines "ROLE SIZE SHA256\n" of the pack's data files in
 * pack.json order (the model sources, then experts.bin when repacked): two
 * packs with the same recorded content share an image wherever they live.
 *
 * A loader (strata_resident_load) fills the data object while hashing every
 * file, and marks the image ready only when every SHA-256 matched pack.json.
 * In a repacked pack the engine reads the routed experts from experts.bin,
 * so the image does not keep them twice: once verified, the pages of the
 * GGUF files that hold only routed experts are released (a hole in the data
 * object), and an engine that attaches maps the file itself over each hole,
 * so the GGUF view stays complete and correct, with only the dense weights
 * and experts.bin in memory.
 *
 * Engines attach (strata_resident_attach) read-only; a mapping stays valid
 * after the objects are unlinked or the loader dies, so unloading never breaks
 * an engine that is running - the memory is freed when the last one exits.
 */
#ifndef STRATA_RESIDENT_H
#define STRATA_RESIDENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"

#define STRATA_RESIDENT_ALIGN (2ull << 20)
#define STRATA_RESIDENT_NAME_MAX 32   /* "strata-" + 16 hex digits + NUL fits */
#define STRATA_RESIDENT_PATH_MAX 4096
#define STRATA_RESIDENT_MAX_FILES 1024

enum strata_resident_state {
    STRATA_RESIDENT_LOADING = 1,
    STRATA_RESIDENT_READY = 2,
};

/* One data file of a pack. */
struct strata_resident_file {
    char path[STRATA_RESIDENT_PATH_MAX]; /* resolved (absolute, or relative to the cwd
                                            when the pack was named so) */
    char role[16];                       /* "model" (a GGUF source) or "experts" */
    uint64_t size;                       /* bytes */
    char sha256[72];                     /* 64 lowercase hex digits recorded in pack.json */
    uint64_t offset;                     /* in the data object (STRATA_RESIDENT_ALIGN) */
    int64_t mtime_sec, mtime_nsec;       /* when loaded (0 before) */
    uint32_t sparse;                     /* the image left out this GGUF's routed experts
                                            (a repacked pack reads them from experts.bin) */
};

/* What an image of a pack is made of: its identity, name and layout. */
struct strata_resident_pack {
    char identity[72];                   /* 64 hex digits */
    char name[STRATA_RESIDENT_NAME_MAX]; /* strata-XXXXXXXXXXXXXXXX */
    char dir[STRATA_RESIDENT_PATH_MAX];  /* the pack directory as given */
    char pack_name[256];                 /* "name" in pack.json, or the directory's */
    uint32_t n_files;
    struct strata_resident_file *files;  /* [n_files], malloc'ed */
    uint64_t data_bytes;                 /* size of the data object */
};

/* Read pack.json of the pack at path (a pack directory or its pack.json) and
 * fill out: identity, name, every data file (sizes and hashes as recorded,
 * offsets laid out).  The files themselves are not read.  Free with
 * strata_resident_pack_free.  Returns 0, STRATA_E_NOTFOUND (no pack.json),
 * STRATA_E_FORMAT (bad pack.json: named), STRATA_E_LIMIT (more than
 * STRATA_RESIDENT_MAX_FILES files), STRATA_E_NOMEM. */
int strata_resident_describe(const char *path, struct strata_resident_pack *out,
                             struct strata_err *err);
void strata_resident_pack_free(struct strata_resident_pack *p);

/* Progress of a load: bytes of file (a path) done of its size, and of the
 * whole image.  Return nonzero to cancel. */
typedef int (*strata_resident_progress_fn)(const char *file, uint64_t done, uint64_t size,
                                           uint64_t all_done, uint64_t all_total, void *ud);

struct strata_resident_load_opts {
    const char *pack;             /* pack directory or its pack.json */
    uint64_t reserve_bytes;       /* MemAvailable that must remain after loading */
    int huge_pages;               /* 1: ask for transparent huge pages (MADV_HUGEPAGE) */
    int direct_io;                /* 1: read with O_DIRECT when the file system allows */
    strata_resident_progress_fn progress;
    void *progress_ud;
};

/* What a load did (filled on success). */
struct strata_resident_load_stats {
    uint64_t bytes;               /* file bytes read and verified */
    uint64_t data_bytes;          /* size of the data object */
    uint64_t released_bytes;      /* GGUF pages of routed experts released (repacked) */
    double seconds;               /* wall time of reading and verifying */
    int direct_io;                /* files read with O_DIRECT */
    char huge_pages[64];          /* what the kernel does for shared memory, e.g.
                                     "transparent (shmem_enabled=advise)" or "no (...)" */
};

/* An image this process created (the loader's handle). */
struct strata_resident_image;

/* Create the image of the pack, read every data file into it verifying its
 * SHA-256, and mark it ready.  Refuses up front when MemAvailable minus
 * reserve_bytes, or the free space of the shared-memory file system, cannot
 * hold the data object (STRATA_E_NOMEM, with the numbers).  An image of the
 * same pack that is ready, or being loaded by a live process, is refused
 * (STRATA_E_INVALID, naming it and its loader); a dead loader's unfinished
 * image is removed and replaced.  On any failure nothing is left behind.
 * Errors: those of describe, STRATA_E_IO (a file: named), STRATA_E_CHECKSUM
 * (a file whose bytes do not match pack.json: named, with both hashes),
 * STRATA_E_NOMEM, STRATA_E_CANCELLED. */
int strata_resident_load(const struct strata_resident_load_opts *o,
                         struct strata_resident_image **out,
                         struct strata_resident_load_stats *stats, struct strata_err *err);
/* The image's name and pack description (owned by img). */
const struct strata_resident_pack *strata_resident_image_pack(
    const struct strata_resident_image *img);
/* Record pid as the image's loader (after the loader forked into the
 * background).  Returns 0 or STRATA_E_IO. */
int strata_resident_image_set_loader(struct strata_resident_image *img, pid_t pid,
                                     struct strata_err *err);
/* Remove the image's objects, but only while it still names this process
 * (pid) as its loader, so a late signal never removes a newer image, and free
 * img.  Attached engines keep their mappings.  NULL is accepted. */
void strata_resident_image_remove(struct strata_resident_image *img);
/* Free img leaving the objects in place.  NULL is accepted. */
void strata_resident_image_close(struct strata_resident_image *img);

/* An image as listed by strata_resident_list. */
struct strata_resident_info {
    char name[STRATA_RESIDENT_NAME_MAX];
    char identity[72];
    char pack_dir[STRATA_RESIDENT_PATH_MAX];
    char pack_name[256];
    int state;                    /* enum strata_resident_state, 0 if unreadable */
    uint64_t data_bytes;          /* size of the data object */
    uint32_t n_files;
    pid_t loader_pid;
    int loader_alive;
    int64_t created;              /* unix seconds */
    uint32_t n_attached;          /* processes other than the loader mapping the data */
    pid_t attached[16];           /* the first of them */
};

/* Every image in the shared-memory directory, sorted by name.  *out is
 * malloc'ed (caller frees), may be NULL with *n 0.  Returns 0 or
 * STRATA_E_NOMEM / STRATA_E_IO. */
int strata_resident_list(struct strata_resident_info **out, size_t *n, struct strata_err *err);

/* Remove the image named what: its NAME (with or without "strata-"), or a
 * pack path whose identity names it.  A live loader is sent SIGTERM and given
 * up to 10 s to exit; the objects are then unlinked.  Attached engines keep
 * running.  info (may be NULL) receives what was removed.  Returns 0,
 * STRATA_E_NOTFOUND (no such image: named), or STRATA_E_IO. */
int strata_resident_unload(const char *what, struct strata_resident_info *info,
                           struct strata_err *err);

/* ---- engines ---- */

/* An engine's read-only mapping of a ready image. */
struct strata_resident_att;

/* Attach to the ready image of the pack described by p, if there is one.
 * Returns 0 with *out set, or 0 with *out NULL when there is no usable
 * image: none exists (silently), or one exists but is stale (still loading,
 * its loader died while loading, or a file of the pack changed size or
 * mtime since it was loaded) or does not match the pack (identity, layout
 * version, file list or sizes differ) - then *why (may be NULL) receives a
 * one-line reason naming the image, and the caller reads the disk as usual.
 * Errors (nonzero) only for STRATA_E_NOMEM. */
int strata_resident_attach(const struct strata_resident_pack *p,
                           struct strata_resident_att **out, char *why, size_t why_size,
                           struct strata_err *err);
/* The bytes of data file i of the pack description attached to (files[i]),
 * or NULL when i is out of range; *size (may be NULL) receives its size. */
const void *strata_resident_att_file(const struct strata_resident_att *a, uint32_t i,
                                     uint64_t *size);
/* The path of data file i as in the description attached with (owned by a),
 * or NULL when i is out of range. */
const char *strata_resident_att_path(const struct strata_resident_att *a, uint32_t i);
/* Bytes of the data object (all files, aligned). */
uint64_t strata_resident_att_bytes(const struct strata_resident_att *a);
const char *strata_resident_att_name(const struct strata_resident_att *a);
/* The whole mapping [*base, *base + *len): the region a GPU backend registers
 * (pins) for DMA, e.g. cudaHostRegister(base, len, cudaHostRegisterReadOnly),
 * so expert copies from an attached image run at pinned speed. */
void strata_resident_att_region(const struct strata_resident_att *a, const void **base,
                                uint64_t *len);
/* Unmap.  NULL is accepted. */
void strata_resident_detach(struct strata_resident_att *a);

#endif
