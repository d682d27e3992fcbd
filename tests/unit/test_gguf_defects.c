/* test_gguf_defects.c - hostile GGUF files: each crafted defect is refused
 * with its own message, through memory and through a mapped file; every
 * prefix of a valid file is refused, and byte corruptions never crash.
 *
 *   test_gguf_defects            run the tests (TAP)
 *   test_gguf_defects DIR        also write each crafted file into DIR
 *                                (the fuzzer's seed corpus)
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_craft.h"
#include "gguf_write.h"
#include "tap.h"

#define U32 4
#define STR 8
#define ARR 9
#define BOOL 7
#define F32T 0 /* tensor types */
#define F64T 28
#define Q4KT 12

static const uint64_t NE1[1] = {8}, NE2[2] = {8, 2};

/* A valid start: header claiming nt tensors and nk keys. */
static void hdr(struct craft *b, uint64_t nt, uint64_t nk)
{
    cr_hdr(b, 3, nt, nk);
}

/* One F32 tensor "w" of ne given, after one key, with its data. */
static void one_tensor(struct craft *b, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                       uint64_t off, size_t data)
{
    hdr(b, 1, 1);
    cr_kv_str(b, "general.architecture", "llama");
    cr_tensor(b, "w", n_dims, ne, type, off);
    cr_pad(b, 32);
    cr_zeros(b, data);
}

static void d_empty(struct craft *b)
{
    (void)b;
}
static void d_short(struct craft *b)
{
    cr_put(b, "GGU", 3);
}
static void d_magic(struct craft *b)
{
    cr_put(b, "GGML\3\0\0\0", 8);
    cr_zeros(b, 32);
}
static void d_text(struct craft *b)
{
    cr_put(b, "hello, this is not a model\n", 27);
}
static void d_trunc_hdr(struct craft *b)
{
    cr_put(b, "GGUF", 4);
}
static void d_v1(struct craft *b)
{
    cr_hdr(b, 1, 0, 0);
}
static void d_v7(struct craft *b)
{
    cr_hdr(b, 7, 0, 0);
}
static void d_bigendian(struct craft *b)
{
    cr_hdr(b, 0x03000000u, 0, 0);
}
static void d_trunc_nkv(struct craft *b)
{
    cr_put(b, "GGUF\3\0\0\0", 8);
    cr_u64(b, 0);
    cr_u32(b, 0);
}
static void d_nkv_absurd(struct craft *b)
{
    hdr(b, 0, 1ull << 40);
    cr_zeros(b, 64);
}
static void d_nt_absurd(struct craft *b)
{
    hdr(b, 1ull << 50, 0);
    cr_zeros(b, 64);
}
static void d_key_past_eof(struct craft *b)
{
    hdr(b, 0, 1);
    cr_u64(b, 1ull << 40);
    cr_put(b, "abcdefgh", 8);
}
static void d_key_huge(struct craft *b)
{
    hdr(b, 0, 1);
    cr_u64(b, UINT64_MAX);
    cr_zeros(b, 16);
}
static void d_key_empty(struct craft *b)
{
    hdr(b, 0, 1);
    cr_kv_u32(b, "", 1);
}
static void d_key_nul(struct craft *b)
{
    hdr(b, 0, 1);
    cr_u64(b, 3);
    cr_put(b, "a\0b", 3);
    cr_u32(b, U32);
    cr_u32(b, 1);
}
static void d_key_dup(struct craft *b)
{
    hdr(b, 0, 2);
    cr_kv_u32(b, "a.b", 1);
    cr_kv_u32(b, "a.b", 2);
}
static void d_vtype(struct craft *b)
{
    hdr(b, 0, 1);
    cr_key(b, "k", 13);
    cr_u64(b, 0);
}
static void d_trunc_value(struct craft *b)
{
    hdr(b, 0, 1);
    cr_key(b, "k", 10 /* u64 */);
    cr_u32(b, 5);
}
static void d_str_past_eof(struct craft *b)
{
    hdr(b, 0, 1);
    cr_key(b, "k", STR);
    cr_u64(b, 99);
    cr_put(b, "short", 5);
}
static void d_bool(struct craft *b)
{
    hdr(b, 0, 1);
    cr_key(b, "k", BOOL);
    cr_u8(b, 2);
}
static void d_arr_etype(struct craft *b)
{
    hdr(b, 0, 1);
    cr_key(b, "k", ARR);
    cr_u32(b, 42);
    cr_u64(b, 1);
    cr_u32(b, 0);
}
static void d_arr_count(struct craft *b)
{
    hdr(b, 0, 1);
    cr_key(b, "k", ARR);
    cr_u32(b, U32);
    cr_u64(b, 1ull << 60);
    cr_u32(b, 7);
}
static void d_arr_count_wrap(struct craft *b)
{
    /* 2^62 u32 elements: the byte count 2^64 wraps to 0 if multiplied naively */
    hdr(b, 0, 1);
    cr_key(b, "k", ARR);
    cr_u32(b, U32);
    cr_u64(b, 1ull << 62);
    cr_zeros(b, 8);
}
static void d_strarr_elem(struct craft *b)
{
    hdr(b, 0, 1);
    cr_key(b, "tokenizer.ggml.tokens", ARR);
    cr_u32(b, STR);
    cr_u64(b, 2);
    cr_str(b, "ok");
    cr_u64(b, 1000);
    cr_put(b, "no", 2);
}
static void d_strarr_count(struct craft *b)
{
    hdr(b, 0, 1);
    cr_key(b, "tokenizer.ggml.tokens", ARR);
    cr_u32(b, STR);
    cr_u64(b, 1ull << 40);
    cr_str(b, "a");
}
static void d_nested_deep(struct craft *b)
{
    hdr(b, 0, 1);
    cr_key(b, "k", ARR);
    for (int i = 0; i < 12; i++) {
        cr_u32(b, ARR);
        cr_u64(b, 1);
    }
    cr_u32(b, U32);
    cr_u64(b, 0);
}
static void d_arr_bool(struct craft *b)
{
    hdr(b, 0, 1);
    cr_key(b, "k", ARR);
    cr_u32(b, BOOL);
    cr_u64(b, 3);
    cr_put(b, "\1\5\0", 3);
}
static void d_align_zero(struct craft *b)
{
    hdr(b, 0, 1);
    cr_kv_u32(b, "general.alignment", 0);
}
static void d_align_48(struct craft *b)
{
    hdr(b, 0, 1);
    cr_kv_u32(b, "general.alignment", 48);
}
static void d_align_str(struct craft *b)
{
    hdr(b, 0, 1);
    cr_kv_str(b, "general.alignment", "32");
}
static void d_ndims0(struct craft *b)
{
    one_tensor(b, 0, NE1, F32T, 0, 32);
}
static void d_ndims5(struct craft *b)
{
    one_tensor(b, 5, (uint64_t[]){8, 1, 1, 1, 1}, F32T, 0, 32);
}
static void d_ne_zero(struct craft *b)
{
    one_tensor(b, 2, (uint64_t[]){8, 0}, F32T, 0, 32);
}
static void d_ne_neg(struct craft *b)
{
    one_tensor(b, 2, (uint64_t[]){8, 1ull << 63}, F32T, 0, 32);
}
static void d_nelem_wrap(struct craft *b)
{
    one_tensor(b, 3, (uint64_t[]){1ull << 32, 1ull << 32, 4}, F32T, 0, 32);
}
static void d_nbytes_wrap(struct craft *b)
{
    one_tensor(b, 1, (uint64_t[]){1ull << 62}, F64T, 0, 32);
}
static void d_type_unknown(struct craft *b)
{
    one_tensor(b, 1, NE1, 99, 0, 32);
}
static void d_type_removed(struct craft *b)
{
    one_tensor(b, 1, NE1, 4 /* Q4_2, removed */, 0, 32);
}
static void d_block(struct craft *b)
{
    one_tensor(b, 1, (uint64_t[]){100}, Q4KT, 0, 512);
}
static void d_unaligned(struct craft *b)
{
    one_tensor(b, 1, NE1, F32T, 4, 64);
}
static void d_past_eof(struct craft *b)
{
    one_tensor(b, 2, NE2, F32T, 0, 32); /* needs 64 */
}
static void d_offset_huge(struct craft *b)
{
    one_tensor(b, 1, NE1, F32T, UINT64_MAX - 31, 32);
}
static void d_overlap(struct craft *b)
{
    hdr(b, 2, 0);
    cr_tensor(b, "a", 2, NE2, F32T, 0);
    cr_tensor(b, "b", 1, NE1, F32T, 32); /* a spans [0, 64) */
    cr_pad(b, 32);
    cr_zeros(b, 96);
}
static void d_tensor_dup(struct craft *b)
{
    hdr(b, 2, 0);
    cr_tensor(b, "w", 1, NE1, F32T, 0);
    cr_tensor(b, "w", 1, NE1, F32T, 32);
    cr_pad(b, 32);
    cr_zeros(b, 64);
}
static void d_tensor_noname(struct craft *b)
{
    hdr(b, 1, 0);
    cr_tensor(b, "", 1, NE1, F32T, 0);
    cr_pad(b, 32);
    cr_zeros(b, 32);
}
static void d_trunc_tinfo(struct craft *b)
{
    /* the file ends after ne[0] of a 2-d tensor */
    hdr(b, 1, 0);
    cr_str(b, "blk.0.attn_output.weight.with.a.long.name");
    cr_u32(b, 2);
    cr_u64(b, 8);
}
static void d_data_start(struct craft *b)
{
    /* tensor infos end off the alignment and the file ends there */
    hdr(b, 1, 1);
    cr_kv_u32(b, "general.alignment", 1u << 20);
    cr_tensor(b, "w", 1, NE1, F32T, 0);
}
static void d_align_big_offset(struct craft *b)
{
    /* alignment 64: offset 32 is a multiple of 32 but not of 64 */
    hdr(b, 1, 1);
    cr_kv_u32(b, "general.alignment", 64);
    cr_tensor(b, "w", 1, NE1, F32T, 32);
    cr_pad(b, 64);
    cr_zeros(b, 128);
}

struct defect {
    const char *name;
    void (*build)(struct craft *);
    int code;
    const char *msg;
};

#define FMT STRATA_E_FORMAT
#define UNS STRATA_E_UNSUPPORTED
static const struct defect defects[] = {
    {"empty", d_empty, FMT, "not a gguf file (empty)"},
    {"short", d_short, FMT, "shorter than the 4-byte magic"},
    {"magic", d_magic, FMT, "no 'GGUF' magic"},
    {"text", d_text, FMT, "not a gguf file (no 'GGUF' magic)"},
    {"trunc-hdr", d_trunc_hdr, FMT, "file truncated: version at offset 4"},
    {"v1", d_v1, UNS, "gguf version 1 is not supported"},
    {"v7", d_v7, UNS, "unknown gguf version 7"},
    {"big-endian", d_bigendian, UNS, "big-endian gguf"},
    {"trunc-nkv", d_trunc_nkv, FMT, "file truncated: n_kv"},
    {"nkv-absurd", d_nkv_absurd, FMT, "n_kv 1099511627776 is more than the file can hold"},
    {"nt-absurd", d_nt_absurd, FMT, "n_tensors 1125899906842624 is more than the file can hold"},
    {"key-past-eof", d_key_past_eof, FMT, "key #0: string length 1099511627776"},
    {"key-huge", d_key_huge, FMT, "key #0: string length 18446744073709551615"},
    {"key-empty", d_key_empty, FMT, "key #0 has an empty name"},
    {"key-nul", d_key_nul, FMT, "key #0: name contains a nul byte"},
    {"key-dup", d_key_dup, FMT, "duplicate key 'a.b'"},
    {"vtype", d_vtype, FMT, "key 'k': value type 13 is not a gguf value type"},
    {"trunc-value", d_trunc_value, FMT, "file truncated: value of key 'k'"},
    {"str-past-eof", d_str_past_eof, FMT, "value of key 'k': string length 99"},
    {"bool", d_bool, FMT, "key 'k': bool value 2 is not 0 or 1"},
    {"arr-etype", d_arr_etype, FMT, "array element type 42 is not a gguf value type"},
    {"arr-count", d_arr_count, FMT, "array of 1152921504606846976 u32 elements"},
    {"arr-count-wrap", d_arr_count_wrap, FMT, "array of 4611686018427387904 u32 elements"},
    {"strarr-elem", d_strarr_elem, FMT,
     "key 'tokenizer.ggml.tokens' element 1: string length 1000"},
    {"strarr-count", d_strarr_count, FMT, "array of 1099511627776 string elements"},
    {"nested-deep", d_nested_deep, FMT, "arrays nested more than 8 deep"},
    {"arr-bool", d_arr_bool, FMT, "bool element 1 has value 5"},
    {"align-zero", d_align_zero, FMT, "general.alignment is 0"},
    {"align-48", d_align_48, FMT, "general.alignment 48 is not a power of two"},
    {"align-str", d_align_str, FMT, "general.alignment is a string, expected u32"},
    {"ndims0", d_ndims0, FMT, "tensor 'w': n_dims is 0"},
    {"ndims5", d_ndims5, FMT, "tensor 'w': n_dims 5 is more than 4"},
    {"ne-zero", d_ne_zero, FMT, "tensor 'w': ne[1] is 0"},
    {"ne-neg", d_ne_neg, FMT, "tensor 'w': ne[1] = 9223372036854775808 is larger than 2^63-1"},
    {"nelem-wrap", d_nelem_wrap, FMT, "tensor 'w': element count overflows"},
    {"nbytes-wrap", d_nbytes_wrap, FMT, "tensor 'w': byte size of 4611686018427387904 F64"},
    {"type-unknown", d_type_unknown, UNS, "tensor 'w' has unknown type id 99"},
    {"type-removed", d_type_removed, UNS, "tensor 'w' has unknown type id 4"},
    {"block", d_block, FMT, "ne[0] = 100 is not a multiple of the Q4_K block size 256"},
    {"unaligned", d_unaligned, FMT, "data offset 4 is not a multiple of the alignment 32"},
    {"past-eof", d_past_eof, FMT, "tensor 'w': data at offset 0 (64 bytes) runs past the end"},
    {"offset-huge", d_offset_huge, FMT, "tensor 'w': data at offset 18446744073709551584"},
    {"overlap", d_overlap, FMT, "tensor 'b' overlaps tensor 'a'"},
    {"tensor-dup", d_tensor_dup, FMT, "duplicate tensor name 'w'"},
    {"tensor-noname", d_tensor_noname, FMT, "tensor #0 has an empty name"},
    {"trunc-tinfo", d_trunc_tinfo, FMT, "file truncated: ne[1] of tensor #0"},
    {"data-start", d_data_start, FMT, "tensor data section starts at 1048576, past the end"},
    {"align-64", d_align_big_offset, FMT, "data offset 32 is not a multiple of the alignment 64"},
};
#define N_DEFECTS (sizeof(defects) / sizeof(defects[0]))

static int write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int rc = fwrite(p, 1, n, f) == n ? 0 : -1;
    return fclose(f) == 0 ? rc : -1;
}

static void test_defects(const char *tmpdir, const char *seed_dir)
{
    int distinct = 1;
    for (size_t i = 0; i < N_DEFECTS; i++) {
        const struct defect *d = &defects[i];
        struct craft b = {0};
        struct strata_err e = {0};
        struct strata_gguf *g = NULL;
        char name[64], path[4200];
        d->build(&b);
        if (!b.p && !(b.p = malloc(1)))
            return;
        snprintf(name, sizeof(name), "crafted-%s.gguf", d->name);
        int rc = strata_gguf_open_mem(&g, b.p, b.len, name, &e);
        ok(rc == d->code && g == NULL && strstr(e.msg, d->msg) && strstr(e.msg, name),
           "%s: refused (%d): %s", d->name, rc, e.msg);
        strata_gguf_close(g);
        for (size_t j = 0; j < i; j++)
            if (strcmp(defects[j].msg, d->msg) == 0 || strstr(e.msg, defects[j].msg))
                if (!(strcmp(d->name, "text") == 0 && strcmp(defects[j].name, "magic") == 0)) {
                    diag("%s: message also matches '%s'", d->name, defects[j].name);
                    distinct = 0;
                }
        /* the same bytes through open(): mmap, file size from fstat */
        snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
        if (write_file(path, b.p, b.len) == 0) {
            struct strata_err e2 = {0};
            rc = strata_gguf_open(&g, path, &e2);
            ok(rc == d->code && g == NULL && strstr(e2.msg, d->msg) && strstr(e2.msg, path),
               "%s: refused from a file: %s", d->name, e2.msg);
            strata_gguf_close(g);
            unlink(path);
        }
        if (seed_dir) {
            snprintf(path, sizeof(path), "%s/%s", seed_dir, name);
            if (write_file(path, b.p, b.len) != 0)
                diag("cannot write %s", path);
        }
        free(b.p);
    }
    ok(N_DEFECTS >= 20 && distinct, "%zu defects, each with its own message", N_DEFECTS);
}

/* A small valid file with every key type and a few tensors. */
static int make_valid(void **buf, size_t *len)
{
    struct strata_err e = {0};
    struct strata_gguf_writer *w = NULL;
    int rc = strata_gguf_writer_create(&w, &e);
    static const float data[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    const char *toks[3] = {"a", "bc", "<s>"};
    int32_t ids[3] = {3, 1, 2};
    struct strata_gguf_arr inner[2] = {{STRATA_GGUF_INT32, 3, ids, NULL, NULL},
                                       {STRATA_GGUF_UINT8, 0, NULL, NULL, NULL}};
    struct strata_gguf_arr nested = {STRATA_GGUF_ARRAY, 2, NULL, NULL, inner};
    rc = rc ? rc : strata_gguf_writer_add_str(w, "general.architecture", "llama", &e);
    rc = rc ? rc : strata_gguf_writer_add_u32(w, "llama.block_count", 1, &e);
    rc = rc ? rc : strata_gguf_writer_add_f32(w, "llama.rope.freq_base", 10000.0f, &e);
    rc = rc ? rc : strata_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 1, &e);
    rc = rc ? rc : strata_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 3, &e);
    rc = rc ? rc
            : strata_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", STRATA_GGUF_INT32, ids, 3,
                                         &e);
    rc = rc ? rc : strata_gguf_writer_add_arr_value(w, "x.nested", &nested, &e);
    rc = rc ? rc
            : strata_gguf_writer_add_tensor(w, "a", STRATA_TYPE_F32, 2, (uint64_t[]){4, 2}, data,
                                            &e);
    rc = rc ? rc
            : strata_gguf_writer_add_tensor(w, "b", STRATA_TYPE_F16, 1, (uint64_t[]){16}, data, &e);
    rc = rc ? rc : strata_gguf_writer_write_mem(w, buf, len, &e);
    strata_gguf_writer_free(w);
    return rc;
}

static void test_prefixes_and_flips(const char *seed_dir)
{
    void *buf = NULL;
    size_t len = 0;
    struct strata_err e = {0};
    struct strata_gguf *g = NULL;
    if (!ok(make_valid(&buf, &len) == 0, "valid base file (%zu bytes)", len))
        return;
    int rc = strata_gguf_open_mem(&g, buf, len, "base", &e);
    ok(rc == 0, "base file opens: %s", e.msg);
    uint64_t need = 0;
    for (uint64_t i = 0; !rc && i < strata_gguf_n_tensors(g); i++) {
        const struct strata_gguf_tensor *t = strata_gguf_tensor_at(g, i);
        if (t->offset + t->n_bytes > need)
            need = t->offset + t->n_bytes;
    }
    strata_gguf_close(g);
    if (seed_dir) {
        char path[4200];
        snprintf(path, sizeof(path), "%s/valid.gguf", seed_dir);
        write_file(path, buf, len);
    }

    /* every prefix shorter than the last tensor's end is refused; each copy
     * is heap-exact so ASan catches any read past it */
    int refused = 0, cut = 0;
    for (size_t n = 0; n < need; n++) {
        uint8_t *p = malloc(n ? n : 1);
        memcpy(p, buf, n);
        g = NULL;
        if (strata_gguf_open_mem(&g, p, n, "prefix", &e) != 0 && e.msg[0])
            refused++;
        cut++;
        strata_gguf_close(g);
        free(p);
    }
    ok(refused == cut, "%d of %d truncations refused", refused, cut);

    /* every byte set to a few values: any result but a crash or a leak */
    static const uint8_t vals[] = {0x00, 0x01, 0x7f, 0x80, 0xff};
    int opened = 0, runs = 0;
    uint8_t *p = malloc(len);
    for (size_t i = 0; i < len; i++)
        for (size_t v = 0; v < sizeof(vals); v++) {
            memcpy(p, buf, len);
            p[i] = vals[v];
            g = NULL;
            e.msg[0] = 0;
            if (strata_gguf_open_mem(&g, p, len, "flip", &e) == 0) {
                opened++;
                /* walk what was accepted */
                for (uint64_t k = 0; k < strata_gguf_n_kv(g); k++)
                    (void)strata_gguf_find_kv(g, strata_gguf_kv_at(g, k)->key);
                for (uint64_t k = 0; k < strata_gguf_n_tensors(g); k++) {
                    const struct strata_gguf_tensor *t = strata_gguf_tensor_at(g, k);
                    volatile uint8_t sink = ((const uint8_t *)t->data)[t->n_bytes - 1];
                    (void)sink;
                }
            } else if (!e.msg[0]) {
                diag("byte %zu = %#x refused without a message", i, vals[v]);
            }
            runs++;
            strata_gguf_close(g);
        }
    ok(runs == (int)(len * sizeof(vals)), "%d corrupted copies survived (%d still valid)", runs,
       opened);
    free(p);
    free(buf);
}

/* ASan's count of live heap bytes (weak: absent without ASan). */
size_t __sanitizer_get_current_allocated_bytes(void) __attribute__((weak));

/* Heap kept by an open handle, relative to the file size: files made of
 * nothing but minimal keys or tensors (the worst case per byte), and a real
 * vocabulary. */
static void test_memory(void)
{
    struct strata_err e = {0};
    struct strata_gguf *g = NULL;
    struct craft b = {0}, c = {0};
    char k[16];
    if (!__sanitizer_get_current_allocated_bytes) {
        ok(1, "# SKIP memory bound: not built with ASan");
        return;
    }
    int n = 40000;
    cr_hdr(&b, 3, 0, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        snprintf(k, sizeof(k), "%x", i);
        cr_key(&b, k, 0 /* u8 */);
        cr_u8(&b, 1);
    }
    size_t b0 = __sanitizer_get_current_allocated_bytes();
    int rc = strata_gguf_open_mem(&g, b.p, b.len, "keys", &e);
    size_t used = __sanitizer_get_current_allocated_bytes() - b0;
    ok(rc == 0 && used < 8 * b.len, "%d one-byte keys: %zu heap bytes for a %zu-byte file", n, used,
       b.len);
    strata_gguf_close(g);

    cr_hdr(&c, 3, (uint64_t)n, 0);
    for (int i = 0; i < n; i++) {
        snprintf(k, sizeof(k), "%x", i);
        cr_tensor(&c, k, 1, (uint64_t[]){1}, 24 /* I8 */, (uint64_t)i * 32);
    }
    cr_pad(&c, 32);
    cr_zeros(&c, (size_t)n * 32);
    b0 = __sanitizer_get_current_allocated_bytes();
    rc = strata_gguf_open_mem(&g, c.p, c.len, "tensors", &e);
    used = __sanitizer_get_current_allocated_bytes() - b0;
    ok(rc == 0 && used < 8 * c.len, "%d one-byte tensors: %zu heap bytes for a %zu-byte file: %s",
       n, used, c.len, e.msg);
    strata_gguf_close(g);

    char path[4096];
    snprintf(path, sizeof(path), "%s/vocab/ggml-vocab-llama-bpe.gguf", tap_fixtures());
    b0 = __sanitizer_get_current_allocated_bytes();
    rc = strata_gguf_open(&g, path, &e);
    used = __sanitizer_get_current_allocated_bytes() - b0;
    ok(rc == 0 && used < strata_gguf_shard_size(g, 0) * 3 / 2,
       "llama-bpe vocabulary: %zu heap bytes for %llu file bytes", used,
       rc ? 0ull : (unsigned long long)strata_gguf_shard_size(g, 0));
    strata_gguf_close(g);
    free(b.p);
    free(c.p);
}

/* Inputs the fuzzer once found (tests/data/gguf-fuzz/): no crash, no leak,
 * and a refusal always carries a message. */
static void test_regressions(void)
{
    const char *root = getenv("STRATA_ROOT");
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s/tests/data/gguf-fuzz", root && *root ? root : ".");
    DIR *d = opendir(dir);
    int n = 0, good = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char path[8300];
        struct strata_err e = {0};
        struct strata_gguf *g = NULL;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        int rc = strata_gguf_open(&g, path, &e);
        n++;
        if (rc == 0 || e.msg[0])
            good++;
        else
            diag("%s: refused without a message", path);
        strata_gguf_close(g);
    }
    if (d)
        closedir(d);
    ok(good == n, "%d fuzzer regression inputs handled", n);
}

int main(int argc, char **argv)
{
    char tmpdir[] = "/tmp/strata-defects-XXXXXX";
    const char *seed_dir = argc > 1 ? argv[1] : NULL;
    if (!mkdtemp(tmpdir)) {
        ok(0, "mkdtemp");
        return tap_done();
    }
    test_defects(tmpdir, seed_dir);
    test_prefixes_and_flips(seed_dir);
    test_regressions();
    test_memory();
    rmdir(tmpdir);
    return tap_done();
}
