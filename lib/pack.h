/* pack.h - Strata packs: a verified, load-ready model directory.
 *
 * A pack is a directory NAME.strata/ holding pack.json (format in
 * man/strata-pack.5): format version, source GGUF files with size and
 * SHA-256, architecture and hyper-parameters, tokenizer summary and chat
 * template, an index of every tensor, an index of every routed expert and the
 * memory figures.  Two modes:
 *
 *   native    the tensors are read in place from the GGUF file(s) (mmap);
 *   repacked  additionally experts.bin holds one record per (layer, expert)
 *             with that expert's gate, up and down bytes (and any per-expert
 *             bias) back to back, each record aligned to
 *             STRATA_PACK_RECORD_ALIGN, so one expert is one contiguous read
 *             or one DMA transfer.
 *
 * How the engine consumes a pack
 *
 *   struct strata_pack *p;
 *   strata_pack_open(&p, path, &err);        // NAME.strata/, its pack.json, or a .gguf
 *   const struct strata_gguf *g = strata_pack_gguf(p);   // metadata + every tensor
 *   for each layer l: const struct strata_pack_layer *L = strata_pack_layer(p, l);
 *       if (L) strata_pack_expert(p, l, e, &x);  // where expert e's bytes are
 *
 * An engine whose weights are (data, bytes per expert) pairs reads a
 * repacked pack by taking both from strata_pack_expert_tensor() for every
 * *_exps tensor after loading the model from strata_pack_gguf(); nothing
 * else changes.
 *
 * strata_pack_gguf() is the same view a bare GGUF gives: dense tensors (and,
 * in native packs, the routed experts) are read through it unchanged.  For a
 * repacked pack, x.record points at the whole contiguous record in the
 * mmap of experts.bin (x.record_offset/x.record_size for pread or DMA from
 * x.fd), and x.part[i] at each part inside it; for a native pack (or a bare
 * GGUF) x.part[i] points into the GGUF mmap and x.record is NULL.  The parts
 * are ordered gate, up, down, then any other per-expert tensor of the layer
 * (e.g. gpt-oss biases); strata_pack_layer() names each part's tensor and
 * type and gives its per-expert shape [ne0, ne1].
 *
 * Opening checks structure, not content: every source and experts.bin must
 * exist with the recorded size and the index must match the GGUF; a missing
 * shard, a truncated file or a mismatched index is refused with a message
 * naming the file.  strata_pack_verify() re-hashes every byte.
 */
#ifndef STRATA_PACK_H
#define STRATA_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "gguf.h"

#define STRATA_PACK_FORMAT_VERSION 1
#define STRATA_PACK_RECORD_ALIGN 4096 /* experts.bin record alignment (page, O_DIRECT) */
#define STRATA_PACK_PART_ALIGN 256    /* part alignment inside a record */
#define STRATA_PACK_MAX_PARTS 8       /* per-expert tensors per layer */

enum strata_pack_mode {
    STRATA_PACK_NATIVE = 0,
    STRATA_PACK_REPACKED = 1,
};

/* One per-expert tensor of a MoE layer, e.g. blk.3.ffn_up_exps.weight whose
 * GGUF shape is [n_embd, n_ff_exp, n_expert]: one expert's slice is
 * [ne0 = n_embd, ne1 = n_ff_exp], n_bytes long. */
struct strata_pack_part {
    const char *tensor;   /* GGUF tensor name */
    uint32_t type;        /* enum strata_ggml_type */
    uint64_t ne0, ne1;    /* per-expert shape, ne0 contiguous */
    uint64_t n_bytes;     /* bytes of one expert's slice */
    uint64_t rec_offset;  /* repacked: offset of the part inside a record */
    const struct strata_gguf_tensor *src; /* the whole tensor in the GGUF view */
};

/* The routed experts of one layer. */
struct strata_pack_layer {
    uint32_t layer;
    uint32_t n_expert;
    uint32_t n_parts;
    struct strata_pack_part part[STRATA_PACK_MAX_PARTS];
    uint64_t record_size;   /* repacked: bytes between records (aligned) */
    uint64_t record_offset; /* repacked: offset in experts.bin of expert 0 */
};

/* Where one expert's bytes are. */
struct strata_pack_expert {
    uint32_t n_parts;
    const void *part[STRATA_PACK_MAX_PARTS]; /* part i's bytes (mmap) */
    const void *record;     /* repacked: the whole record; NULL when native */
    uint64_t record_offset; /* repacked: file offset of the record in experts.bin */
    uint64_t record_size;
    int fd;                 /* repacked: read-only fd of experts.bin; else -1 */
};

/* Hyper-parameters and memory figures (recorded in pack.json "memory").
 * kv_bytes_per_token assumes an F16 kv cache; the estimates use context n_ctx:
 *   vram_min   = dense_bytes + kv_bytes_per_token * n_ctx + scratch_bytes
 *   vram_full  = vram_min + expert_bytes           (every expert in VRAM)
 *   ram_bytes  = expert_bytes (resident, pinned) + dense_bytes (load staging)
 *                or, with low_ram, dense_bytes only (experts stay in the page
 *                cache and are read on demand). */
struct strata_pack_info {
    char arch[64];
    uint32_t n_layer, n_embd, n_head, n_head_kv, n_vocab;
    uint32_t n_expert, n_expert_used, n_moe_layers;
    uint32_t n_ctx_train;
    uint64_t n_params;          /* elements of all tensors */
    uint64_t total_bytes;       /* bytes of all tensors */
    uint64_t dense_bytes;       /* tensors that are not routed experts */
    uint64_t expert_bytes;      /* all routed experts */
    uint64_t expert_bytes_max;  /* largest single expert (all parts) */
    uint64_t kv_bytes_per_token;
    uint64_t scratch_bytes;
    uint32_t n_ctx;             /* context the estimates below are for */
    uint64_t vram_min, vram_full, ram_bytes;
    int low_ram;
};

struct strata_pack;

/* Open path: a pack directory, its pack.json, or a bare GGUF file (any shard
 * of a split set; then the expert index is built in memory, native mode).
 * Returns 0, STRATA_E_IO / STRATA_E_NOTFOUND (a file is missing: named),
 * STRATA_E_FORMAT (bad pack.json, truncated file, index mismatch: named),
 * STRATA_E_UNSUPPORTED (newer format version) or STRATA_E_NOMEM. */
int strata_pack_open(struct strata_pack **out, const char *path, struct strata_err *err);
void strata_pack_close(struct strata_pack *p);

/* The GGUF view: metadata and every tensor (owned by p). */
const struct strata_gguf *strata_pack_gguf(const struct strata_pack *p);
int strata_pack_mode(const struct strata_pack *p);
/* Directory of the pack; NULL for a bare GGUF. */
const char *strata_pack_dir(const struct strata_pack *p);
/* Figures for n_ctx (0: the context recorded when the pack was made, else
 * the model's training context). */
void strata_pack_get_info(const struct strata_pack *p, uint32_t n_ctx,
                          struct strata_pack_info *out);
/* The routed experts of layer il, or NULL when the layer has none. */
const struct strata_pack_layer *strata_pack_layer(const struct strata_pack *p, uint32_t il);
/* Where expert ie of layer il is.  Returns 0, or STRATA_E_INVALID (layer
 * without experts, expert out of range; named). */
int strata_pack_expert(const struct strata_pack *p, uint32_t il, uint32_t ie,
                       struct strata_pack_expert *out, struct strata_err *err);

/* Where the routed-expert tensor named tensor (e.g. "blk.3.ffn_up_exps.weight")
 * has expert 0's bytes, and the stride from one expert to the next: in a
 * repacked pack inside the mapping of experts.bin (stride = the layer's
 * record_size), else inside the GGUF mapping (stride = one expert's slice).
 * A drop-in for a weight's (data, bytes per expert matrix): expert e's rows
 * start at data + e * stride and are laid out as in the GGUF.
 * Returns 0, or STRATA_E_NOTFOUND (not a routed-expert tensor; named). */
int strata_pack_expert_tensor(const struct strata_pack *p, const char *tensor,
                              const void **data, size_t *stride, struct strata_err *err);

/* Resident images (strata-load(1), lib/resident.h): strata_pack_open of a
 * pack directory attaches to a ready image of the same pack (matched by the
 * recorded checksums, not the path) and reads every data file from it
 * instead of the disk; STRATA_NO_RESIDENT=1 in the environment turns this
 * off.  The image's name and size (bytes: may be NULL), or NULL when the
 * pack is read from its files. */
const char *strata_pack_resident(const struct strata_pack *p, uint64_t *bytes);
/* Why an image of this pack exists but was ignored (stale, mismatched), one
 * line naming it; "" when none was ignored.  Owned by p. */
const char *strata_pack_resident_note(const struct strata_pack *p);
/* GPU hook: the part of the attached image that expert copies read - the
 * experts.bin records of a repacked pack, else the whole mapping - which a
 * GPU backend registers (pins) for DMA once (cudaHostRegister /
 * hipHostRegister with the read-only flag) so copies from it run at pinned
 * speed.  (In a repacked pack's image the GGUF's routed experts are mapped
 * from the file; pinning them would read them from disk.)  Returns 1 with
 * *base, *len set, or 0 (not attached; both zeroed). */
int strata_pack_resident_region(const struct strata_pack *p, const void **base, uint64_t *len);

/* Progress of long operations: done/total bytes of what (a file name).
 * Return nonzero to cancel (the operation fails with STRATA_E_CANCELLED). */
typedef int (*strata_pack_progress_fn)(const char *what, uint64_t done, uint64_t total,
                                       void *ud);

/* A source file whose SHA-256 is already known (checked while downloading),
 * so building does not hash it again. */
struct strata_pack_source {
    const char *path;   /* as passed to the GGUF reader (shard path) */
    const char *sha256; /* 64 hex digits, or NULL: hash it */
    const char *url;    /* where it came from, or NULL */
};

struct strata_pack_build_opts {
    const char *dir;       /* the (partial) pack directory; must exist */
    const char *gguf;      /* first shard (or the only file) */
    const char *name;      /* pack name recorded in pack.json */
    int repack;            /* 1: write experts.bin */
    uint32_t n_ctx;        /* context for the memory figures (0: training context) */
    int low_ram;           /* -1 auto (from MemAvailable), 0 no, 1 yes */
    const char *mmproj;    /* vision projector GGUF to record, or NULL */
    const struct strata_pack_source *known; /* sources with known hashes */
    size_t n_known;
    strata_pack_progress_fn progress;
    void *progress_ud;
};

/* Write pack.json (and experts.bin when repack) into opts->dir from the GGUF
 * set.  Sources inside dir are recorded relative to it, others absolute.
 * experts.bin is written as experts.bin.tmp and renamed; pack.json is written
 * last (write-then-rename), so an interrupted build never leaves a complete
 * looking directory.  Returns 0, or the GGUF reader's errors, STRATA_E_IO
 * (write failure such as a full disk: names the file), STRATA_E_LIMIT (too
 * many per-expert tensors in a layer), STRATA_E_CANCELLED. */
int strata_pack_build(const struct strata_pack_build_opts *opts, struct strata_err *err);

/* Re-check a pack: every source's and experts.bin's size and SHA-256, the
 * index against the GGUF.  Returns 0, STRATA_E_CHECKSUM naming the file whose hash
 * differs, or open's errors. */
int strata_pack_verify(const char *dir, strata_pack_progress_fn progress, void *ud,
                       struct strata_err *err);

/* Move dir_partial to dir_final.  An existing dir_final is replaced only when
 * force (it is moved aside first and removed after the rename), else
 * STRATA_E_INVALID "already exists".  Returns 0 or STRATA_E_IO. */
int strata_pack_commit(const char *dir_partial, const char *dir_final, int force,
                       struct strata_err *err);

/* Remove a directory tree (a failed or replaced pack).  Returns 0 or
 * STRATA_E_IO. */
int strata_pack_remove_tree(const char *dir, struct strata_err *err);

/* Memory figures of a GGUF set for n_ctx (0: training context), without
 * writing anything: for the plan printed before building. */
int strata_pack_plan_gguf(const struct strata_gguf *g, uint32_t n_ctx, int low_ram,
                          struct strata_pack_info *out, struct strata_err *err);

/* MemAvailable of /proc/meminfo in bytes, or 0 when it cannot be read. */
uint64_t strata_mem_available(void);

/* Write n bytes at offset to fd, retrying short writes.  The test hook
 * STRATA_FAULT_ENOSPC_AT=N (environment) makes any write that would reach
 * past file offset N fail with ENOSPC, as a full disk does.  Returns 0 or
 * STRATA_E_IO naming path. */
int strata_pack_pwrite_all(int fd, const void *buf, size_t n, uint64_t offset,
                           const char *path, struct strata_err *err);

#endif
