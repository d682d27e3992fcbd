/* strata-generate - run a model: generate text, score perplexity, dump logits. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "chat.h"
#include "engine.h"
#include "err.h"
#include "generate.h"
#include "gguf.h"
#include "log.h"
#include "pack.h"
#include "expert_cache.h"
#include "model.h"
#include "pool.h"
#include "sampler.h"
#include "selftest.h"
#include "serve_stdio.h"
#include "spec.h"
#include "splice.h"
#include "vision.h"
#include "quant.h"
#include "vocab.h"

static const char usage_text[] =
    "usage: strata-generate -m MODEL [-p TEXT | -f FILE] [-n N] [options]\n"
    "       strata-generate -m MODEL --perplexity FILE [--ctx N] [--chunks K]\n"
    "       strata-generate -m MODEL -p TEXT --dump-logits FILE\n"
    "       strata-generate -m MODEL --bench PP,TG [-t N]\n"
    "       strata-generate -m MODEL --tokenize TEXT|- [--add-bos] [--no-special] [--json]\n"
    "       strata-generate -m MODEL --detokenize \"ID ID ...\"\n"
    "       strata-generate [-m MODEL] --render-chat FILE.json [--chat-template FILE] [--json]\n"
    "\n"
    "  -m, --model MODEL       GGUF model file or pack directory\n"
    "  -p, --prompt TEXT       prompt text (default: read stdin)\n"
    "  -f, --file FILE         read the prompt from FILE\n"
    "      --prompt-ids LIST   prompt as comma-separated token ids\n"
    "  -n, --n-predict N       tokens to generate (default -1: until EOS or ctx full)\n"
    "      --echo              print the prompt before the continuation\n"
    "      --chat              the prompt is a user message: render it with the\n"
    "                          model's chat template (or --chat-template FILE)\n"
    "      --system TEXT       --chat with a system message first\n"
    "      --json              one JSON object per line: each token, then a summary\n"
    "      --temp T            temperature (default 0.8; 0 = greedy)\n"
    "      --top-k K           top-k (default 40; <= 0 disables)\n"
    "      --top-p P           top-p (default 0.95; 1 disables)\n"
    "      --min-p P           min-p (default 0.05; 0 disables)\n"
    "      --repeat-penalty F  repetition penalty (default 1 = off)\n"
    "      --repeat-last-n N   tokens the penalties look at (default 64; -1 all)\n"
    "      --presence-penalty F, --frequency-penalty F  (default 0 = off)\n"
    "      --seed S            RNG seed (default 0)\n"
    "      --stop TEXT         stop string (repeatable)\n"
    "      --ignore-eos        do not stop at end-of-generation tokens\n"
    "      --logprobs          each token's logprob in --json (a pass over the\n"
    "                          vocabulary per token)\n"
    "      --top-logprobs N    alternatives per token in --json (0..20; implies\n"
    "                          --logprobs)\n"
    "      --spec T            speculative decoding: verify up to T drafted tokens per\n"
    "                          step (0..16; default 0 = plain decoding); same output\n"
    "      --spec-mode M       ngram (prompt lookup), draft (--draft), mtp, auto\n"
    "                          (default: draft when --draft is given, else ngram)\n"
    "      --draft MODEL       draft model GGUF with the same vocabulary\n"
    "      --spec-fixed        always draft up to T (no back-off when acceptance is low)\n"
    "      --stats             print speculative statistics to stderr\n"
    "      --vram-budget-mib N VRAM to plan for (emulates a smaller card); default the\n"
    "                          device's free VRAM minus --vram-reserve-mib\n"
    "      --vram-reserve-mib N  VRAM left free for others (default 512)\n"
    "      --adapt-every N     expert cache re-balance period in tokens (0 = static;\n"
    "                          default 32)\n"
    "      --pcie-frac auto|F  share of missed experts copied over PCIe, the rest on the\n"
    "                          CPU (default auto: from the measured bandwidths)\n"
    "      --pool-workers N    CPU threads computing missed experts (default --threads)\n"
    "      --plan-only         print the memory plan for the budget and exit\n"
    "      --save-profile FILE write the routing counts of this run (routing-profile.json)\n"
    "  -t, --threads N         worker threads (default: all CPUs)\n"
    "  -c, --ctx N             context size (default min(model's, 4096))\n"
    "      --prefill N         prompt chunk size (default 512)\n"
    "      --kv-type f16|f32   kv cache type (default f16)\n"
    "      --backend NAME      cpu (default), auto\n"
    "      --no-selftest       skip the GPU kernel self-test run at start\n"
    "      --perplexity FILE   perplexity of FILE as llama-perplexity computes it\n"
    "      --chunks K          perplexity: first K chunks (default all)\n"
    "      --dump-logits FILE  write float32 logits after every prompt position\n"
    "      --bench PP,TG       time a PP-token prompt and TG decode steps\n"
    "      --tokenize TEXT     print the token ids of TEXT ('-': stdin, verbatim); no BOS\n"
    "                          unless --add-bos; --json adds each token's piece and text\n"
    "      --add-bos           --tokenize: prepend BOS as the model would\n"
    "      --no-special        --tokenize: special-token text (<|im_end|>) is plain text\n"
    "      --detokenize IDS    print the text of space-separated ids (specials rendered)\n"
    "      --render-chat FILE  print the prompt the model's chat template makes of an\n"
    "                          OpenAI-style request body (messages, tools,\n"
    "                          add_generation_prompt, chat_template_kwargs; '-': stdin);\n"
    "                          --json also gives the tool-call format; strftime_now()\n"
    "                          uses $SOURCE_DATE_EPOCH when set\n"
    "      --chat-template FILE  Jinja chat template to use instead of the model's\n"
    "      --image FILE        an image for the prompt (repeatable; needs --mmproj)\n"
    "      --mmproj FILE       the vision projector GGUF (mmproj-*.gguf) for --image\n"
    "      --image-max-pixels N  image token budget in pixels (default 1003520)\n"
    "      --image-embd FILE   an embedding payload (strata-embed -o; '-': stdin) as the\n"
    "                          first image\n"
    "      --image-marker STR  where images go in the prompt (default <|image_pad|> when\n"
    "                          the vocabulary has it; no marker: images come first)\n"
    "      --token-embd IDS    write the embedding rows of token ids as a payload\n"
    "      --serve-stdio       speak the engine protocol on stdin/stdout (for strata-serve)\n"
    "  -v, --verbose           more diagnostics on stderr\n"
    "  -h, --help              show this help\n"
    "\n"
    "exit status: 0 ok; 1 failure; 2 usage; 3 bad input (model file, empty\n"
    "prompt, prompt longer than --ctx); 4 GPU error; 5 out of memory.\n";

#define PROG "strata-generate"
#define MAX_STOP 16
#define MAX_IMAGES 16

/* The images of a prompt: payloads in prompt order. */
struct img_set {
    int n;
    struct strata_embd_header h[MAX_IMAGES + 1];
    float *rows[MAX_IMAGES + 1];
    const char *marker;
};

struct opts {
    const char *model, *prompt, *prompt_file, *prompt_ids;
    const char *perplexity, *dump_logits;
    int chunks, echo, json, verbose;
    int bench_pp, bench_tg, bench;
    const char *tokenize, *detokenize;
    int add_bos, no_special;
    int serve_stdio;
    int no_selftest;
    const char *render_chat, *chat_template;
    int chat;                      /* --chat: the prompt is a user message */
    const char *system;            /* --system TEXT */
    int spec_n, spec_mode, stats;  /* --spec T, --spec-mode, --stats */
    int spec_fixed;                /* --spec-fixed */
    struct strata_ec_cfg ec_cfg;   /* expert cache options, for a GPU backend */
    int plan_only;                 /* --plan-only */
    const char *pcie_frac, *save_profile; /* --pcie-frac, --save-profile */
    struct strata_ec_profile profile;     /* --save-profile counts */
    const char *draft;             /* --draft MODEL */
    const char *images[MAX_IMAGES]; /* --image FILE */
    int n_images;
    const char *mmproj, *image_embd, *image_marker, *token_embd;
    int image_max_pixels;          /* --image-max-pixels */
    struct img_set *imgs;          /* loaded images, NULL when none */
    const struct strata_gguf *gguf; /* the open model, for --chat */
    const char *stop[MAX_STOP];
    size_t n_stop;
    struct strata_gen_params gp;
    struct strata_engine_opts eo;
};

/* ---- helpers ---- */

static int parse_int(const char *opt, const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, PROG ": invalid %s '%s' (%ld..%ld)\n", opt, s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_float(const char *opt, const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || v != v) {
        fprintf(stderr, PROG ": invalid %s '%s'\n", opt, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int read_all(FILE *f, char **out, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    if (!b)
        return -1;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            char *q = realloc(b, cap * 2);
            if (!q) {
                free(b);
                return -1;
            }
            b = q;
            cap *= 2;
        }
        size_t r = fread(b + n, 1, 4096, f);
        n += r;
        if (r == 0)
            break;
    }
    if (ferror(f)) {
        free(b);
        return -1;
    }
    b[n] = 0;
    *out = b;
    *len = n;
    return 0;
}

static int read_file(const char *path, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, PROG ": cannot open '%s': %s\n", path, strerror(errno));
        return -1;
    }
    int rc = read_all(f, out, len);
    if (rc)
        fprintf(stderr, PROG ": cannot read '%s': %s\n", path, strerror(errno));
    fclose(f);
    return rc;
}

static int fail(const struct strata_err *err)
{
    fprintf(stderr, PROG ": %s\n", err->msg);
    return strata_err_exit_code(err->code);
}

/* Parse "1,2,3" into ids. */
static int parse_ids(const char *s, int32_t **ids, size_t *n)
{
    size_t cap = 16, k = 0;
    int32_t *a = malloc(cap * sizeof *a);
    if (!a)
        return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX) {
            fprintf(stderr, PROG ": invalid --prompt-ids '%s'\n", s);
            free(a);
            return -1;
        }
        if (k == cap) {
            int32_t *q = realloc(a, cap * 2 * sizeof *q);
            if (!q) {
                free(a);
                return -1;
            }
            a = q;
            cap *= 2;
        }
        a[k++] = (int32_t)v;
        p = end;
        while (*p == ',' || *p == ' ')
            p++;
    }
    *ids = a;
    *n = k;
    return 0;
}

/* The user content of --chat with images: an image part per image, then
 * the text (the OpenAI / transformers content-part form). */
static cJSON *chat_image_parts(int n, const char *text)
{
    cJSON *a = cJSON_CreateArray(), *p;
    for (int i = 0; a && i < n; i++) {
        p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "image");
        cJSON_AddItemToArray(a, p);
    }
    p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "text");
    cJSON_AddStringToObject(p, "text", text);
    cJSON_AddItemToArray(a, p);
    return a;
}

/* A template that places no image marker for image parts: render again
 * with the markers written in front of the user's text. */
static int chat_images_inline(struct strata_chat *chat, cJSON *req, cJSON *user_msg,
                              const struct img_set *s, const char *text, char **out,
                              size_t *out_len, struct strata_err *err)
{
    size_t ml = strlen(s->marker), tl = strlen(text);
    char *c = malloc(ml * (size_t)s->n + tl + 1);
    if (!c)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    for (int i = 0; i < s->n; i++)
        memcpy(c + ml * (size_t)i, s->marker, ml);
    memcpy(c + ml * (size_t)s->n, text, tl + 1);
    cJSON_ReplaceItemInObject(user_msg, "content", cJSON_CreateString(c));
    free(c);
    free(*out);
    *out = NULL;
    return strata_chat_render(chat, req, NULL, out, out_len, err);
}

/* --chat: render {system?, user: text} with the model's chat template (or
 * --chat-template FILE) and an open assistant turn; *out is malloc'ed. */
static int chat_prompt(const struct opts *o, const char *text, size_t len, char **out,
                       size_t *out_len, struct strata_err *err)
{
    struct strata_chat *chat = NULL;
    char *tmpl = NULL, *user = NULL;
    size_t tmpl_n = 0;
    cJSON *req = NULL, *msgs, *m;
    int rc;
    if (o->chat_template && read_file(o->chat_template, &tmpl, &tmpl_n))
        return strata_err_set(err, STRATA_E_IO, "cannot read '%s'", o->chat_template);
    if ((rc = strata_chat_create_gguf(&chat, o->gguf, tmpl, tmpl_n, err)))
        goto out;
    user = malloc(len + 1);
    req = cJSON_CreateObject();
    msgs = req ? cJSON_AddArrayToObject(req, "messages") : NULL;
    if (!user || !msgs) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    memcpy(user, text, len);
    user[len] = 0;
    if (o->system) {
        m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", o->system);
        cJSON_AddItemToArray(msgs, m);
    }
    m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    if (o->imgs)
        cJSON_AddItemToObject(m, "content", chat_image_parts(o->imgs->n, user));
    else
        cJSON_AddStringToObject(m, "content", user);
    cJSON_AddItemToArray(msgs, m);
    cJSON_AddBoolToObject(req, "add_generation_prompt", 1);
    rc = strata_chat_render(chat, req, NULL, out, out_len, err);
    /* a template that fails on content parts or places no marker for them */
    if (o->imgs && (rc || strata_splice_count(*out, *out_len, o->imgs->marker) != o->imgs->n))
        rc = chat_images_inline(chat, req, m, o->imgs, user, out, out_len, err);
    if (rc)
        strata_err_wrap(err, "chat template error");
out:
    cJSON_Delete(req);
    free(user);
    free(tmpl);
    strata_chat_free(chat);
    return rc;
}

/* The prompt's token ids from --prompt-ids, -p, -f or stdin. */
static int get_prompt(const struct opts *o, const struct strata_vocab *v, int32_t **ids,
                      size_t *n_ids, struct strata_err *err)
{
    char *text = NULL;
    size_t len = 0;
    int rc;
    if (o->prompt_ids) {
        if (parse_ids(o->prompt_ids, ids, n_ids))
            return strata_err_set(err, STRATA_E_INVALID, "invalid --prompt-ids");
        if (*n_ids == 0) {
            free(*ids);
            *ids = NULL;
            return strata_err_set(err, STRATA_E_FORMAT, "empty prompt");
        }
        return 0;
    }
    if (o->prompt) {
        text = strdup(o->prompt);
        len = strlen(o->prompt);
        if (!text)
            return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    } else if (o->prompt_file) {
        if (read_file(o->prompt_file, &text, &len))
            return strata_err_set(err, STRATA_E_IO, "cannot read the prompt file '%s'",
                                  o->prompt_file);
    } else {
        if (read_all(stdin, &text, &len))
            return strata_err_set(err, STRATA_E_IO, "cannot read the prompt from stdin");
    }
    if (len == 0) {
        free(text);
        return strata_err_set(err, STRATA_E_FORMAT, "empty prompt (give -p TEXT, -f FILE or "
                              "text on stdin)");
    }
    int add_bos = strata_vocab_add_bos(v);
    if (o->chat) {
        char *rendered = NULL;
        size_t rn = 0;
        rc = chat_prompt(o, text, len, &rendered, &rn, err);
        free(text);
        if (rc)
            return rc;
        text = rendered;
        len = rn;
        /* a template that writes the BOS text itself must not get a second one */
        int32_t bos = strata_vocab_bos(v);
        const char *bt = bos >= 0 ? strata_vocab_token_text(v, bos) : NULL;
        if (bt && *bt && strncmp(text, bt, strlen(bt)) == 0)
            add_bos = 0;
    }
    if (o->imgs) {
        uint32_t nt[MAX_IMAGES + 1];
        for (int i = 0; i < o->imgs->n; i++)
            nt[i] = o->imgs->h[i].n_tokens;
        rc = strata_splice_tokenize(v, text, len, add_bos, o->imgs->marker, o->imgs->n, nt,
                                    ids, n_ids, err);
    } else {
        rc = strata_vocab_tokenize(v, text, len, add_bos, 1, ids, n_ids, err);
    }
    free(text);
    return rc;
}

/* ---- images: --image, --image-embd ---- */

static void images_free(struct img_set *s)
{
    for (int i = 0; s && i < s->n; i++)
        free(s->rows[i]);
    free(s);
}

/* Encode each --image with the --mmproj encoder (on the engine's pool). */
static int images_encode(const struct opts *o, struct strata_engine *e, struct img_set *s,
                         struct strata_err *err)
{
    struct strata_gguf *g = NULL;
    struct strata_vision *vis = NULL;
    int rc = strata_gguf_open(&g, o->mmproj, err);
    if (rc == 0)
        rc = strata_vision_load(&vis, g, err);
    if (rc)
        strata_err_wrap(err, "--mmproj '%s'", o->mmproj);
    for (int i = 0; rc == 0 && i < o->n_images; i++) {
        struct strata_image img = { 0 };
        int n_tok = 0, gh = 0, gw = 0;
        float *rows = NULL;
        rc = strata_image_load(&img, o->images[i], err);
        if (rc == 0)
            rc = strata_vision_encode_image(vis, strata_engine_pool(e), &img, 3136,
                                            o->image_max_pixels ? o->image_max_pixels : 1003520,
                                            &rows, &n_tok, &gh, &gw, err);
        strata_image_free(&img);
        if (rc) {
            strata_err_wrap(err, "--image '%s'", o->images[i]);
            break;
        }
        struct strata_embd_header *h = &s->h[s->n];
        h->version = 1;
        h->n_tokens = (uint32_t)n_tok;
        h->n_embd = (uint32_t)strata_vision_hparams(vis)->n_out;
        h->grid_t = 1;
        h->grid_h = (uint32_t)gh;
        h->grid_w = (uint32_t)gw;
        s->rows[s->n++] = rows;
    }
    strata_vision_free(vis);
    strata_gguf_close(g);
    return rc;
}

/* Load the images of the prompt (--image-embd first, then each --image),
 * check them against the model and choose the marker.  *out NULL when no
 * image was given. */
static int images_load(const struct opts *o, struct strata_engine *e,
                       const struct strata_vocab *v, struct img_set **out,
                       struct strata_err *err)
{
    int rc = 0;
    *out = NULL;
    if (!o->image_embd && !o->n_images)
        return 0;
    struct img_set *s = calloc(1, sizeof *s);
    if (!s)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    s->marker = o->image_marker ? o->image_marker : strata_splice_default_marker(v);
    if (!s->marker) {
        rc = strata_err_set(err, STRATA_E_UNSUPPORTED, "the model has no image placeholder "
                            "token (%s is not in its vocabulary); give --image-marker STR "
                            "to mark where the images go", STRATA_SPLICE_PAD);
        goto out;
    }
    if (o->image_embd) {
        int is_stdin = strcmp(o->image_embd, "-") == 0;
        const char *name = is_stdin ? "<stdin>" : o->image_embd;
        FILE *f = is_stdin ? stdin : fopen(o->image_embd, "rb");
        if (!f) {
            rc = strata_err_set(err, STRATA_E_IO, "cannot open --image-embd '%s': %s",
                                o->image_embd, strerror(errno));
            goto out;
        }
        rc = strata_embd_read(f, name, &s->h[0], &s->rows[0], err);
        if (!is_stdin)
            fclose(f);
        if (rc)
            goto out;
        s->n = 1;
    }
    if (o->n_images && (rc = images_encode(o, e, s, err)))
        goto out;
    const uint32_t n_embd = strata_engine_model(e)->hp.n_embd;
    for (int i = 0; i < s->n; i++) {
        const char *name = i == 0 && o->image_embd ? o->image_embd
                                                   : o->images[i - (o->image_embd != NULL)];
        if ((rc = strata_splice_check(o->gguf, n_embd, s->h[i].n_embd, name, err)))
            goto out;
    }
out:
    if (rc)
        images_free(s);
    else
        *out = s;
    return rc;
}

/* The rows of all images of s, concatenated in prompt order. */
static float *images_rows(const struct img_set *s)
{
    size_t n = 0, k = 0;
    for (int i = 0; i < s->n; i++)
        n += (size_t)s->h[i].n_tokens * s->h[i].n_embd;
    float *r = malloc((n ? n : 1) * sizeof *r);
    for (int i = 0; r && i < s->n; i++) {
        size_t m = (size_t)s->h[i].n_tokens * s->h[i].n_embd;
        memcpy(r + k, s->rows[i], m * sizeof *r);
        k += m;
    }
    return r;
}

/* --token-embd IDS: the embedding rows of tokens as a payload on stdout. */
static int run_token_embd(const struct opts *o, struct strata_engine *e)
{
    struct strata_err err = { 0 };
    int32_t *ids = NULL;
    size_t n = 0;
    float *rows = NULL;
    int rc = 0;
    const struct strata_model *m = strata_engine_model(e);
    const uint32_t n_embd = m->hp.n_embd;
    if (parse_ids(o->token_embd, &ids, &n) || n == 0) {
        fprintf(stderr, PROG ": invalid --token-embd '%s'\n", o->token_embd);
        free(ids);
        return STRATA_EXIT_USAGE;
    }
    rows = malloc(n * n_embd * sizeof *rows);
    if (!rows) {
        rc = strata_err_set(&err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= strata_engine_n_vocab(e)) {
            rc = strata_err_set(&err, STRATA_E_INVALID, "--token-embd: token id %d outside "
                                "0..%d", ids[i], strata_engine_n_vocab(e) - 1);
            goto out;
        }
        strata_quant_dequant_row(m->tok_embd.type,
                                 (const char *)m->tok_embd.data + (size_t)ids[i] * m->tok_embd.nb1,
                                 rows + i * n_embd, n_embd);
    }
    struct strata_embd_header h = { 1, (uint32_t)n, n_embd, 1, 1, (uint32_t)n, 0 };
    rc = strata_embd_write(stdout, &h, rows, &err);
    if (rc == 0 && fflush(stdout) != 0)
        rc = strata_err_set(&err, STRATA_E_IO, "cannot write the payload to stdout");
out:
    free(ids);
    free(rows);
    return rc ? fail(&err) : 0;
}

/* ---- mode: generate ---- */

struct gen_out {
    const struct opts *o;
};

static int on_token(const struct strata_gen_token *t, void *ud)
{
    struct gen_out *g = ud;
    if (!g->o->json) {
        if (t->text_len)
            fwrite(t->text, 1, t->text_len, stdout);
        fflush(stdout);
        return 0;
    }
    if (t->index < 0) { /* text released at the end */
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "text", t->text);
        char *s = cJSON_PrintUnformatted(j);
        if (s)
            printf("%s\n", s);
        free(s);
        cJSON_Delete(j);
        return 0;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "id", t->id);
    char *txt = malloc(t->text_len + 1);
    if (txt) {
        memcpy(txt, t->text, t->text_len);
        txt[t->text_len] = 0;
        cJSON_AddStringToObject(j, "text", txt);
        free(txt);
    }
    if (g->o->gp.logprobs || t->n_top > 0)
        cJSON_AddNumberToObject(j, "logprob", t->logprob);
    if (t->n_top > 0) {
        cJSON *a = cJSON_AddArrayToObject(j, "top_logprobs");
        for (int i = 0; i < t->n_top; i++) {
            if (t->top[i].id < 0)
                continue;
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "id", t->top[i].id);
            cJSON_AddNumberToObject(e, "logprob", t->top[i].logprob);
            cJSON_AddItemToArray(a, e);
        }
    }
    char *s = cJSON_PrintUnformatted(j);
    if (s)
        printf("%s\n", s);
    free(s);
    cJSON_Delete(j);
    fflush(stdout);
    return 0;
}

static int echo_prompt(const struct strata_vocab *v, const int32_t *ids, size_t n)
{
    struct strata_detok d;
    struct strata_err err = { 0 };
    size_t cap = STRATA_DETOK_OUT_MAX(v), k;
    char *buf = malloc(cap);
    if (!buf)
        return -1;
    strata_detok_init(&d, v, 0);
    for (size_t i = 0; i < n; i++) {
        if (strata_detok_push(&d, ids[i], buf, cap, &k, &err) == 0)
            fwrite(buf, 1, k, stdout);
    }
    strata_detok_flush(&d, buf, cap, &k);
    fwrite(buf, 1, k, stdout);
    free(buf);
    return 0;
}

static int write_logits(struct strata_engine *e, const int32_t *ids, size_t n,
                        const char *path, struct strata_err *err)
{
    const int32_t nv = strata_engine_n_vocab(e);
    int rc = 0;
    if (n > (size_t)strata_engine_n_ctx(e))
        return strata_err_set(err, STRATA_E_LIMIT, "prompt of %zu tokens does not fit the "
                              "context of %d tokens (raise --ctx)", n,
                              strata_engine_n_ctx(e));
    float *l = malloc(n * (size_t)nv * sizeof *l);
    if (!l)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    if ((rc = strata_engine_rollback(e, 0, err)) ||
        (rc = strata_engine_eval(e, ids, (int32_t)n, STRATA_LOGITS_ALL, l, err)))
        goto out;
    FILE *f = fopen(path, "wb");
    if (!f) {
        rc = strata_err_set(err, STRATA_E_IO, "cannot create '%s': %s", path, strerror(errno));
        goto out;
    }
    size_t w = fwrite(l, sizeof *l, n * (size_t)nv, f);
    if (fclose(f) != 0 || w != n * (size_t)nv)
        rc = strata_err_set(err, STRATA_E_IO, "cannot write '%s'", path);
out:
    free(l);
    return rc;
}

/* --spec: the speculative state, with the draft model's engine for --draft. */
static int spec_open(const struct opts *o, struct strata_engine *e, struct strata_engine **de,
                     struct strata_spec **sp, struct strata_err *err)
{
    struct strata_spec_opts so;
    int rc;
    strata_spec_opts_init(&so);
    so.n_max = o->spec_n;
    so.mode = o->spec_mode;
    so.adaptive = !o->spec_fixed;
    if (o->draft && o->spec_n > 0 &&
        (o->spec_mode == STRATA_SPEC_AUTO || o->spec_mode == STRATA_SPEC_DRAFT)) {
        struct strata_engine_opts eo = o->eo;
        eo.n_ctx = strata_engine_n_ctx(e);
        eo.pack = NULL;
        eo.pool = strata_engine_pool(e); /* the two take turns: one set of workers */
        if ((rc = strata_engine_open(de, o->draft, &eo, err))) {
            strata_err_wrap(err, "draft model '%s': ", o->draft);
            return rc;
        }
        so.draft = *de;
    }
    return strata_spec_create(sp, e, &so, err);
}

/* Acceptance, tokens and time per verify step, for --json and --stats. */
static void spec_report(const struct strata_spec *sp, cJSON *j)
{
    struct strata_spec_stats st;
    strata_spec_stats_get(sp, &st);
    double acc = st.n_drafted ? (double)st.n_accepted / st.n_drafted : 0;
    double tps = st.n_steps ? (double)st.n_tokens / st.n_steps : 0;
    double ms = st.n_steps ? (st.t_verify_ms + st.t_draft_ms) / st.n_steps : 0;
    if (j) {
        cJSON *x = cJSON_AddObjectToObject(j, "spec");
        cJSON_AddNumberToObject(x, "n_max", strata_spec_n_max(sp));
        cJSON_AddStringToObject(x, "draft", strata_spec_draft_name(sp));
        cJSON_AddNumberToObject(x, "steps", (double)st.n_steps);
        cJSON_AddNumberToObject(x, "drafted", (double)st.n_drafted);
        cJSON_AddNumberToObject(x, "accepted", (double)st.n_accepted);
        cJSON_AddNumberToObject(x, "acceptance", acc);
        cJSON_AddNumberToObject(x, "tokens_per_step", tps);
        cJSON_AddNumberToObject(x, "ms_per_step", ms);
        cJSON_AddNumberToObject(x, "draft_ms", st.t_draft_ms);
        cJSON_AddNumberToObject(x, "verify_ms", st.t_verify_ms);
        return;
    }
    fprintf(stderr, PROG ": spec T %d, draft %s: %llu steps, %llu drafted, %llu accepted "
            "(%.1f%%), %.2f tokens/step, %.3f ms/step (draft %.1f ms, verify %.1f ms)\n",
            strata_spec_n_max(sp), strata_spec_draft_name(sp), (unsigned long long)st.n_steps,
            (unsigned long long)st.n_drafted, (unsigned long long)st.n_accepted, 100 * acc,
            tps, ms, st.t_draft_ms, st.t_verify_ms);
}

static int run_generate(struct opts *o, struct strata_engine *e, const struct strata_vocab *v)
{
    struct strata_err err = { 0 };
    struct strata_engine *draft = NULL;
    struct strata_spec *sp = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    struct strata_gen_result res = { 0 };
    float *img_rows = NULL;
    int rc;
    if ((rc = images_load(o, e, v, &o->imgs, &err)))
        goto out;
    if ((rc = get_prompt(o, v, &ids, &n_ids, &err)))
        goto out;
    if (o->imgs) {
        if (!(img_rows = images_rows(o->imgs))) {
            rc = strata_err_set(&err, STRATA_E_NOMEM, "out of memory");
            goto out;
        }
        o->gp.embd = img_rows;
    }
    if (n_ids == 0) {
        rc = strata_err_set(&err, STRATA_E_FORMAT, "empty prompt");
        goto out;
    }
    if (n_ids > (size_t)strata_engine_n_ctx(e)) {
        rc = strata_err_set(&err, STRATA_E_FORMAT, "prompt of %zu tokens does not fit the "
                            "context of %d tokens (raise --ctx)", n_ids,
                            strata_engine_n_ctx(e));
        goto out;
    }
    if (o->dump_logits && (rc = write_logits(e, ids, n_ids, o->dump_logits, &err)))
        goto out;
    if (o->dump_logits && o->gp.n_predict < 0)
        goto out; /* only the logits were asked for */
    if (o->echo && !o->json) {
        echo_prompt(v, ids, n_ids);
        fflush(stdout);
    }
    o->gp.stop = o->stop;
    o->gp.n_stop = o->n_stop;
    if ((o->spec_n > 0 || o->stats) && (rc = spec_open(o, e, &draft, &sp, &err)))
        goto out;
    o->gp.spec = sp;
    struct gen_out g = { o };
    rc = strata_generate(e, v, ids, n_ids, &o->gp, on_token, &g, &res, &err);
    if (rc)
        goto out;
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddBoolToObject(j, "done", 1);
        cJSON_AddNumberToObject(j, "n_prompt", res.n_prompt);
        cJSON_AddNumberToObject(j, "n_cached", res.n_cached);
        cJSON_AddNumberToObject(j, "n_gen", res.n_gen);
        cJSON_AddNumberToObject(j, "prefill_ms", res.t_prefill_ms);
        cJSON_AddNumberToObject(j, "decode_ms", res.t_decode_ms);
        cJSON_AddNumberToObject(j, "prefill_tps", res.prefill_tps);
        cJSON_AddNumberToObject(j, "decode_tps", res.decode_tps);
        cJSON_AddStringToObject(j, "stop_reason", strata_stop_reason_name(res.stop_reason));
        if (res.stop_index >= 0)
            cJSON_AddNumberToObject(j, "stop_index", res.stop_index);
        cJSON_AddStringToObject(j, "text", res.text);
        if (sp)
            spec_report(sp, j);
        struct strata_expert_cache *ec = NULL;
        struct strata_ec_times et;
        if (strata_engine_expert_stats(e, &ec, &et)) {
            /* per-layer hit rates, PCIe bytes and CPU experts per token, time split */
            cJSON *x = (cJSON *)strata_ec_stats_json(ec, &et);
            if (x)
                cJSON_AddItemToObject(j, "experts", x);
        }
        char *s = cJSON_PrintUnformatted(j);
        if (s)
            printf("%s\n", s);
        free(s);
        cJSON_Delete(j);
    } else if ((res.n_gen > 0 || o->echo) && isatty(STDOUT_FILENO)) {
        printf("\n"); /* end the line on a terminal; pipes get the exact text */
    }
    fflush(stdout);
    if (o->verbose || !o->json)
        strata_log_info("prompt %d tokens (%d cached) %.1f tok/s; generated %d tokens "
                        "%.1f tok/s; stop: %s", res.n_prompt, res.n_cached, res.prefill_tps,
                        res.n_gen, res.decode_tps, strata_stop_reason_name(res.stop_reason));
    if (sp && o->stats)
        spec_report(sp, NULL);
out:
    strata_gen_result_free(&res);
    free(ids);
    free(img_rows);
    images_free(o->imgs);
    o->imgs = NULL;
    o->gp.embd = NULL;
    o->gp.spec = NULL;
    strata_spec_free(sp);
    strata_engine_close(draft);
    if (rc) {
        /* a prompt that does not fit is bad input */
        if (err.code == STRATA_E_LIMIT && strstr(err.msg, "does not fit"))
            err.code = STRATA_E_FORMAT;
        return fail(&err);
    }
    return 0;
}

/* ---- mode: perplexity ---- */

static void ppl_progress(int chunk, int n_chunk, double ppl, void *ud)
{
    (void)ud;
    fprintf(stderr, "[%d]%.4f,", chunk + 1, ppl);
    if (chunk + 1 == n_chunk)
        fprintf(stderr, "\n");
}

static int run_perplexity(struct opts *o, struct strata_engine *e,
                          const struct strata_vocab *v)
{
    struct strata_err err = { 0 };
    char *text = NULL;
    size_t len = 0;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc;
    if (read_file(o->perplexity, &text, &len))
        return STRATA_EXIT_FAILURE;
    int add_bos = strata_vocab_add_bos(v);
    if ((rc = strata_vocab_tokenize(v, text, len, add_bos, 1, &ids, &n_ids, &err)))
        goto out;
    double ppl = 0, pe = 0;
    if ((rc = strata_perplexity(e, ids, n_ids, strata_engine_n_ctx(e), o->chunks, add_bos,
                                strata_vocab_bos(v), ppl_progress, NULL, &ppl, &pe, &err)))
        goto out;
    printf("PPL = %.4f +/- %.5f\n", ppl, pe);
out:
    free(text);
    free(ids);
    return rc ? fail(&err) : 0;
}

/* ---- mode: bench ---- */

static double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

struct bw_job {
    const uint64_t *buf;
    size_t n;
    uint64_t sum[64];
};

static void bw_worker(void *ctx, int ith, int nth)
{
    struct bw_job *j = ctx;
    size_t a = j->n * (size_t)ith / (size_t)nth, b = j->n * (size_t)(ith + 1) / (size_t)nth;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = a; i + 4 <= b; i += 4) {
        s0 += j->buf[i];
        s1 += j->buf[i + 1];
        s2 += j->buf[i + 2];
        s3 += j->buf[i + 3];
    }
    j->sum[ith % 64] = s0 + s1 + s2 + s3;
}

/* Read bandwidth of a 256 MiB buffer with the engine's threads, GB/s. */
static double measure_bandwidth(struct strata_pool *pool)
{
    const size_t bytes = (size_t)256 << 20;
    uint64_t *buf = malloc(bytes);
    if (!buf)
        return 0;
    memset(buf, 1, bytes);
    struct bw_job j = { buf, bytes / 8, { 0 } };
    double best = 0;
    for (int r = 0; r < 4; r++) {
        double t0 = bench_now();
        strata_pool_run(pool, bw_worker, &j);
        double dt = bench_now() - t0;
        if (dt > 0 && bytes / dt / 1e9 > best)
            best = bytes / dt / 1e9;
    }
    free(buf);
    return best;
}

/* llama-bench style: a prompt of pp random ids from an empty kv cache, then tg
 * single-token decode steps from an empty kv cache; the mean of reps runs
 * after one warm-up. */
static int run_bench(struct opts *o, struct strata_engine *e)
{
    struct strata_err err = { 0 };
    const int32_t nv = strata_engine_n_vocab(e);
    int pp = o->bench_pp, tg = o->bench_tg, reps = 3, rc = 0;
    if (pp + tg > strata_engine_n_ctx(e)) {
        err.code = STRATA_E_INVALID;
        snprintf(err.msg, sizeof err.msg, "--bench %d,%d needs --ctx >= %d", pp, tg, pp + tg);
        return fail(&err);
    }
    int32_t *ids = malloc(sizeof *ids * (size_t)(pp > tg ? pp : tg));
    float *logits = malloc(sizeof *logits * (size_t)nv);
    if (!ids || !logits) {
        free(ids);
        free(logits);
        fprintf(stderr, PROG ": out of memory\n");
        return STRATA_EXIT_NOMEM;
    }
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < (pp > tg ? pp : tg); i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)nv);
    }
    double t_pp = 0, t_tg = 0;
    for (int r = 0; r <= reps && !rc; r++) {
        double t0 = bench_now();
        if (pp > 0 && ((rc = strata_engine_rollback(e, 0, &err)) ||
                       (rc = strata_engine_eval(e, ids, pp, STRATA_LOGITS_LAST, logits, &err))))
            break;
        double t1 = bench_now();
        if ((rc = strata_engine_rollback(e, 0, &err)))
            break;
        for (int i = 0; i < tg && !rc; i++)
            rc = strata_engine_eval(e, ids + i, 1, STRATA_LOGITS_LAST, logits, &err);
        double t2 = bench_now();
        if (r > 0) {
            t_pp += t1 - t0;
            t_tg += t2 - t1;
        }
    }
    free(ids);
    free(logits);
    if (rc)
        return fail(&err);
    const struct strata_model *m = strata_engine_model(e);
    double active = (double)strata_model_active_bytes(m);
    double bw = measure_bandwidth(strata_engine_pool(e));
    double pp_tps = pp && t_pp > 0 ? pp * reps / t_pp : 0;
    double tg_tps = tg && t_tg > 0 ? tg * reps / t_tg : 0;
    double floor_ms = bw > 0 ? active / (bw * 1e9) * 1e3 : 0;
    const char *name = strrchr(o->model, '/');
    name = name ? name + 1 : o->model;
    printf("%-28s threads %d  pp%d %9.1f tok/s  tg%d %8.1f tok/s  decode %.3f ms/token"
           "  floor %.3f ms (%.2f MiB active at %.1f GB/s)\n", name,
           strata_engine_n_threads(e), pp, pp_tps, tg, tg_tps, tg_tps > 0 ? 1e3 / tg_tps : 0,
           floor_ms, active / 1048576.0, bw);
    return 0;
}

/* ---- mode: --serve-stdio (the engine protocol, lib/serve_stdio.h) ---- */

static int run_serve_stdio(const struct opts *o, struct strata_engine *e,
                           const struct strata_vocab *v)
{
    struct strata_err err = { 0 };
    struct strata_serve_stdio_opts so;
    struct strata_engine *draft = NULL;
    struct strata_spec *sp = NULL;
    int ret = STRATA_EXIT_OK;
    strata_serve_stdio_opts_init(&so);
    /* --spec T: every request decodes speculatively; done events carry the counters */
    if (o->spec_n > 0 && spec_open(o, e, &draft, &sp, &err)) {
        (void)strata_serve_stdio_error(1, err.code, err.msg, NULL); /* the server shows it */
        ret = fail(&err);
    }
    so.spec = sp;
    if (ret == STRATA_EXIT_OK && strata_serve_stdio(e, v, &so, &err))
        ret = fail(&err);
    strata_spec_free(sp);
    strata_engine_close(draft);
    return ret;
}

/* ---- start-up: the GPU kernel self-test (selftest.h) ---- */

/* On a GPU backend, run the kernel self-test on the device before the model goes
 * there; refuse a device that fails it (exit 4, and an error event in --serve-stdio
 * mode).  A device that cannot even start is left to the engine, which names the
 * reason (or falls back to the CPU), so only kernel failures refuse it here.
 * Nothing happens in CPU builds. */
static int run_selftest(const struct opts *o)
{
    struct strata_err err = { 0 };
    const struct strata_backend_ops *ops = o->eo.backend_ops;
    if (!ops && strata_engine_find_backend(o->eo.backend, &ops, &err))
        return 0; /* the engine names the bad backend */
    if (!ops || ops == &strata_backend_cpu_ops || !strata_selftest_gpu_table())
        return 0;
    int dev = o->eo.device < 0 ? 0 : o->eo.device;
    static struct strata_selftest_report rep;
    if (strata_selftest_gpu(dev, NULL, &rep, &err))
        return fail(&err);
    char sum[400], msg[512];
    strata_selftest_summary(&rep, sum, sizeof sum);
    if (!rep.ran || rep.n_failed == 0) {
        strata_log_info("%s device %d: %s", rep.api, dev, sum);
        return 0;
    }
    if (rep.n == 1 && strcmp(rep.r[0].kernel, "init") == 0)
        return 0; /* the device cannot start: the engine says why (or falls back) */
    snprintf(msg, sizeof msg, "%s device %d: %s; strata-probe lists every kernel "
             "(--no-selftest skips the test)", rep.api, dev, sum);
    if (o->serve_stdio)
        strata_serve_stdio_error(1, STRATA_E_GPU, msg, NULL);
    fprintf(stderr, PROG ": %s\n", msg);
    return STRATA_EXIT_GPU;
}

/* ---- the expert cache's memory plan and routing profiles ---- */

/* Print the memory plan for the model's figures and the VRAM budget.  In a
 * build without a GPU there is no free VRAM to read: --vram-budget-mib gives
 * the card to plan for.  Returns an exit code. */
static int run_plan(const struct opts *o, const struct strata_pack *pk)
{
    struct strata_err err = { 0 };
    struct strata_pack_info pi;
    struct strata_ec_plan_in in = { 0 };
    struct strata_ec_mem_plan plan;
    strata_pack_get_info(pk, 0, &pi);
    uint32_t n_ctx = o->eo.n_ctx > 0 ? (uint32_t)o->eo.n_ctx
                                     : (pi.n_ctx_train && pi.n_ctx_train < 4096 ? pi.n_ctx_train
                                                                                : 4096);
    strata_pack_get_info(pk, n_ctx, &pi);
    in.dense_bytes = pi.dense_bytes;
    in.expert_bytes = pi.expert_bytes_max;
    in.kv_bytes_per_token = pi.kv_bytes_per_token;
    in.scratch_bytes = pi.scratch_bytes;
    in.n_ctx = n_ctx;
    in.n_experts_total = pi.n_moe_layers * pi.n_expert;
    in.n_expert_used = pi.n_expert_used;
    in.vram_reserve = (uint64_t)o->ec_cfg.vram_reserve_mib << 20;
    in.vram_budget = (uint64_t)o->ec_cfg.vram_budget_mib << 20;
    if (!in.vram_budget) {
        fprintf(stderr, PROG ": --plan-only: no GPU to read free VRAM from in this build; "
                "give --vram-budget-mib\n");
        return STRATA_EXIT_USAGE;
    }
    if (strata_ec_plan_compute(&in, &plan, &err))
        return fail(&err);
    fprintf(stderr, PROG ": memory plan at ctx %u (information: the CPU backend keeps every "
            "weight in RAM)\n", n_ctx);
    strata_ec_plan_print(stderr, &plan);
    char line[160];
    if (o->ec_cfg.pcie_frac >= 0)
        fprintf(stderr, "pcie_frac %.2f (fixed)\n", o->ec_cfg.pcie_frac);
    else
        fprintf(stderr, "PCIe probe: not run (no GPU) -> pcie_frac from the probe at start\n");
    strata_ec_fmt_filling(line, sizeof line, plan.n_slots, plan.cache);
    fprintf(stderr, "%s\n", line);
    return 0;
}

static void profile_trace(void *ctx, int il, int32_t pos0, int n_tok, int k, const int32_t *sel)
{
    (void)pos0;
    strata_ec_profile_add(ctx, il, n_tok, k, sel);
}

/* --save-profile: count the routing of this run through the engine's trace. */
static int profile_begin(struct opts *o, const struct strata_pack *pk, struct strata_err *err)
{
    struct strata_pack_info pi;
    strata_pack_get_info(pk, 0, &pi);
    if (!pi.n_expert)
        return strata_err_set(err, STRATA_E_INVALID,
                              "--save-profile: '%s' has no routed experts", o->model);
    int rc = strata_ec_profile_init(&o->profile, (int)pi.n_layer, (int)pi.n_expert, err);
    if (rc)
        return rc;
    o->eo.route_trace = profile_trace;
    o->eo.route_trace_ctx = &o->profile;
    return 0;
}

static int profile_end(struct opts *o, struct strata_err *err)
{
    int rc = strata_ec_profile_save(&o->profile, o->save_profile, err);
    if (!rc)
        fprintf(stderr, PROG ": routing profile of %llu tokens written to '%s'\n",
                (unsigned long long)o->profile.tokens, o->save_profile);
    return rc;
}

/* ---- mode: render a chat request with the chat template ---- */

static int run_render_chat(const struct opts *o)
{
    struct strata_err err = { 0 };
    struct strata_gguf *g = NULL;
    struct strata_chat *chat = NULL;
    struct strata_jinja_opts jo = { 0 };
    cJSON *req = NULL, *js = NULL;
    char *body = NULL, *tmpl = NULL, *prompt = NULL, *text = NULL;
    size_t body_n = 0, tmpl_n = 0, prompt_n = 0;
    int ret = STRATA_EXIT_BAD_INPUT;
    const char *sde = getenv("SOURCE_DATE_EPOCH");
    if (!o->model && !o->chat_template) {
        fprintf(stderr, PROG ": --render-chat needs -m MODEL or --chat-template FILE\n");
        return STRATA_EXIT_USAGE;
    }
    if (strcmp(o->render_chat, "-") == 0) {
        if (read_all(stdin, &body, &body_n)) {
            fprintf(stderr, PROG ": cannot read the request from stdin\n");
            goto out;
        }
    } else if (read_file(o->render_chat, &body, &body_n)) {
        goto out;
    }
    if (!(req = cJSON_ParseWithLength(body, body_n)) || !cJSON_IsObject(req)) {
        fprintf(stderr, PROG ": '%s' is not a JSON object\n", o->render_chat);
        goto out;
    }
    if (o->chat_template && read_file(o->chat_template, &tmpl, &tmpl_n))
        goto out;
    if (o->model && strata_gguf_open(&g, o->model, &err)) {
        ret = fail(&err);
        goto out;
    }
    if (g ? strata_chat_create_gguf(&chat, g, tmpl, tmpl_n, &err)
          : strata_chat_create(&chat, tmpl, tmpl_n, o->chat_template, NULL, NULL, &err)) {
        ret = fail(&err);
        goto out;
    }
    if (sde && *sde)
        jo.now = (time_t)strtoll(sde, NULL, 10);
    if (strata_chat_render(chat, req, &jo, &prompt, &prompt_n, &err)) {
        if (err.code == STRATA_E_TEMPLATE)
            strata_err_wrap(&err, "chat template error");
        ret = fail(&err);
        goto out;
    }
    if (o->json) {
        enum strata_chat_format f = strata_chat_get_format(chat);
        if (!(js = cJSON_CreateObject()) || !cJSON_AddStringToObject(js, "prompt", prompt)
            || !cJSON_AddStringToObject(js, "format", strata_chat_format_name(f))
            || !cJSON_AddBoolToObject(js, "reasoning_open",
                                      strata_chat_prompt_opens_reasoning(prompt, prompt_n))
            || !(text = cJSON_PrintUnformatted(js))) {
            fprintf(stderr, PROG ": out of memory\n");
            ret = STRATA_EXIT_NOMEM;
            goto out;
        }
        printf("%s\n", text);
    } else {
        fwrite(prompt, 1, prompt_n, stdout);
    }
    ret = fflush(stdout) == 0 ? STRATA_EXIT_OK : STRATA_EXIT_FAILURE;
out:
    free(text);
    cJSON_Delete(js);
    free(prompt);
    strata_chat_free(chat);
    strata_gguf_close(g);
    free(tmpl);
    cJSON_Delete(req);
    free(body);
    return ret;
}

/* ---- main ---- */

enum {
    OPT_ECHO = 256, OPT_JSON, OPT_TEMP, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_RPEN, OPT_RLAST,
    OPT_PPEN, OPT_FPEN, OPT_SEED, OPT_STOP, OPT_IGNORE_EOS, OPT_TOPLP, OPT_LOGPROBS, OPT_PREFILL, OPT_KV,
    OPT_BACKEND, OPT_PPL, OPT_CHUNKS, OPT_DUMP, OPT_IDS, OPT_BENCH,
    OPT_TOKENIZE, OPT_DETOKENIZE, OPT_ADD_BOS, OPT_NO_SPECIAL,
    OPT_SERVE_STDIO,
    OPT_RENDER_CHAT, OPT_CHAT_TEMPLATE, OPT_CHAT, OPT_SYSTEM,
    OPT_SPEC, OPT_SPEC_MODE, OPT_DRAFT, OPT_STATS, OPT_SPEC_FIXED,
    OPT_VRAM_BUDGET, OPT_VRAM_RESERVE, OPT_ADAPT_EVERY, OPT_PCIE_FRAC, OPT_POOL_WORKERS,
    OPT_PLAN_ONLY, OPT_SAVE_PROFILE,
    OPT_IMAGE, OPT_IMAGE_MAXP, OPT_MMPROJ, OPT_IMAGE_EMBD, OPT_IMAGE_MARKER, OPT_TOKEN_EMBD,
    OPT_NO_SELFTEST,
};

/* ---- mode: tokenize / detokenize (needs only the vocabulary) ---- */

/* One token as JSON: id, raw piece, and the text it decodes to (or its
 * bytes in hex when they are not whole UTF-8 characters). */
static cJSON *token_json(const struct strata_vocab *v, int32_t id)
{
    cJSON *t = cJSON_CreateObject();
    size_t n;
    const char *b = strata_vocab_token_bytes(v, id, &n);
    char *s = malloc(2 * n + 1);
    if (!t || !s) {
        cJSON_Delete(t);
        free(s);
        return NULL;
    }
    cJSON_AddNumberToObject(t, "id", id);
    cJSON_AddStringToObject(t, "piece", strata_vocab_token_text(v, id));
    int valid = memchr(b, 0, n) == NULL;
    for (size_t i = 0; valid && i < n;) {
        unsigned char c = (unsigned char)b[i];
        size_t l = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!l || i + l > n)
            valid = 0;
        for (size_t k = 1; valid && k < l; k++)
            if (((unsigned char)b[i + k] & 0xC0) != 0x80)
                valid = 0;
        i += l ? l : 1;
    }
    if (valid) {
        memcpy(s, b, n);
        s[n] = 0;
        cJSON_AddStringToObject(t, "text", s);
    } else {
        for (size_t i = 0; i < n; i++)
            sprintf(s + 2 * i, "%02x", (unsigned char)b[i]);
        s[2 * n] = 0;
        cJSON_AddStringToObject(t, "bytes", s);
    }
    free(s);
    return t;
}

static int run_tokenize(const struct opts *o, const struct strata_vocab *v)
{
    struct strata_err err = { 0 };
    char *text = NULL;
    size_t len = 0, n_ids = 0;
    int32_t *ids = NULL;
    int ret = STRATA_EXIT_OK;

    if (strcmp(o->tokenize, "-") == 0) {
        if (read_all(stdin, &text, &len)) {
            fprintf(stderr, PROG ": cannot read the text to tokenize from stdin\n");
            return STRATA_EXIT_FAILURE;
        }
    } else {
        len = strlen(o->tokenize);
    }
    if (strata_vocab_tokenize(v, text ? text : o->tokenize, len, o->add_bos, !o->no_special,
                              &ids, &n_ids, &err)) {
        ret = fail(&err);
        goto out;
    }
    if (o->json) {
        cJSON *root = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(root, "ids");
        cJSON *toks = cJSON_AddArrayToObject(root, "tokens");
        for (size_t i = 0; a && toks && i < n_ids; i++) {
            cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
            cJSON_AddItemToArray(toks, token_json(v, ids[i]));
        }
        char *js = cJSON_PrintUnformatted(root);
        if (!js) {
            fprintf(stderr, PROG ": out of memory\n");
            ret = STRATA_EXIT_NOMEM;
        } else {
            printf("%s\n", js);
        }
        free(js);
        cJSON_Delete(root);
    } else {
        for (size_t i = 0; i < n_ids; i++)
            printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    }
out:
    free(ids);
    free(text);
    return ret;
}

static int run_detokenize(const struct opts *o, const struct strata_vocab *v)
{
    struct strata_err err = { 0 };
    int32_t *ids = NULL;
    size_t n_ids = 0, len = 0;
    char *text = NULL;
    int ret = STRATA_EXIT_OK;

    for (const char *p = o->detokenize; *p;) {
        char *end;
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n')
            p++;
        if (!*p)
            break;
        errno = 0;
        long id = strtol(p, &end, 10);
        if (errno || end == p || id < 0 || id > INT32_MAX) {
            fprintf(stderr, PROG ": invalid token id in --detokenize '%s'\n", o->detokenize);
            ret = STRATA_EXIT_USAGE;
            goto out;
        }
        int32_t *na = realloc(ids, (n_ids + 1) * sizeof(*na));
        if (!na) {
            ret = STRATA_EXIT_NOMEM;
            goto out;
        }
        ids = na;
        ids[n_ids++] = (int32_t)id;
        p = end;
    }
    if (strata_vocab_detokenize(v, ids, n_ids, 1, &text, &len, &err)) {
        ret = fail(&err);
        goto out;
    }
    fwrite(text, 1, len, stdout);
out:
    free(ids);
    free(text);
    return ret;
}

/* Whether the pack is read from a resident image (strata-load), or why an
 * image of it was ignored. */
static void say_resident(const struct strata_pack *pk)
{
    uint64_t bytes = 0;
    const char *name = strata_pack_resident(pk, &bytes);
    if (name)
        fprintf(stderr, PROG ": attached to resident image %s (%.2f GiB)\n", name,
                (double)bytes / (double)(1ull << 30));
    else if (strata_pack_resident_note(pk)[0])
        fprintf(stderr, PROG ": %s\n", strata_pack_resident_note(pk));
}

/* Option combinations the image options do not support. */
static int image_usage(const struct opts *o)
{
    const char *why = NULL;
    int img = o->n_images || o->image_embd;
    if (o->n_images && !o->mmproj)
        why = "--image needs --mmproj MMPROJ (the model's vision projector)";
    else if (o->image_marker && !*o->image_marker)
        why = "--image-marker must not be empty";
    else if (img && (o->prompt_ids || o->dump_logits || o->perplexity || o->bench ||
                     o->serve_stdio))
        why = "images go with -p, -f or stdin text (not --prompt-ids, --dump-logits, "
              "--perplexity, --bench or --serve-stdio)";
    else if (img && o->image_embd && strcmp(o->image_embd, "-") == 0 && !o->prompt &&
             !o->prompt_file)
        why = "--image-embd - reads stdin: give the prompt with -p or -f";
    else if (img && o->draft && o->spec_n > 0)
        why = "images cannot be used with --draft (the draft model has no image input)";
    if (why)
        fprintf(stderr, PROG ": %s\n", why);
    return why != NULL;
}

int main(int argc, char **argv)
{
    strata_log_set_prog(PROG);
    static const struct option longopts[] = {
        {"model", required_argument, NULL, 'm'},
        {"prompt", required_argument, NULL, 'p'},
        {"file", required_argument, NULL, 'f'},
        {"prompt-ids", required_argument, NULL, OPT_IDS},
        {"n-predict", required_argument, NULL, 'n'},
        {"echo", no_argument, NULL, OPT_ECHO},
        {"json", no_argument, NULL, OPT_JSON},
        {"temp", required_argument, NULL, OPT_TEMP},
        {"top-k", required_argument, NULL, OPT_TOPK},
        {"top-p", required_argument, NULL, OPT_TOPP},
        {"min-p", required_argument, NULL, OPT_MINP},
        {"repeat-penalty", required_argument, NULL, OPT_RPEN},
        {"repeat-last-n", required_argument, NULL, OPT_RLAST},
        {"presence-penalty", required_argument, NULL, OPT_PPEN},
        {"frequency-penalty", required_argument, NULL, OPT_FPEN},
        {"seed", required_argument, NULL, OPT_SEED},
        {"stop", required_argument, NULL, OPT_STOP},
        {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
        {"top-logprobs", required_argument, NULL, OPT_TOPLP},
        {"logprobs", no_argument, NULL, OPT_LOGPROBS},
        {"threads", required_argument, NULL, 't'},
        {"ctx", required_argument, NULL, 'c'},
        {"prefill", required_argument, NULL, OPT_PREFILL},
        {"kv-type", required_argument, NULL, OPT_KV},
        {"backend", required_argument, NULL, OPT_BACKEND},
        {"perplexity", required_argument, NULL, OPT_PPL},
        {"chunks", required_argument, NULL, OPT_CHUNKS},
        {"dump-logits", required_argument, NULL, OPT_DUMP},
        {"bench", required_argument, NULL, OPT_BENCH},
        {"tokenize", required_argument, NULL, OPT_TOKENIZE},
        {"detokenize", required_argument, NULL, OPT_DETOKENIZE},
        {"add-bos", no_argument, NULL, OPT_ADD_BOS},
        {"no-special", no_argument, NULL, OPT_NO_SPECIAL},
        {"serve-stdio", no_argument, NULL, OPT_SERVE_STDIO},
        {"render-chat", required_argument, NULL, OPT_RENDER_CHAT},
        {"chat-template", required_argument, NULL, OPT_CHAT_TEMPLATE},
        {"chat", no_argument, NULL, OPT_CHAT},
        {"system", required_argument, NULL, OPT_SYSTEM},
        {"spec", required_argument, NULL, OPT_SPEC},
        {"spec-mode", required_argument, NULL, OPT_SPEC_MODE},
        {"draft", required_argument, NULL, OPT_DRAFT},
        {"stats", no_argument, NULL, OPT_STATS},
        {"spec-fixed", no_argument, NULL, OPT_SPEC_FIXED},
        {"vram-budget-mib", required_argument, NULL, OPT_VRAM_BUDGET},
        {"vram-reserve-mib", required_argument, NULL, OPT_VRAM_RESERVE},
        {"adapt-every", required_argument, NULL, OPT_ADAPT_EVERY},
        {"pcie-frac", required_argument, NULL, OPT_PCIE_FRAC},
        {"pool-workers", required_argument, NULL, OPT_POOL_WORKERS},
        {"plan-only", no_argument, NULL, OPT_PLAN_ONLY},
        {"save-profile", required_argument, NULL, OPT_SAVE_PROFILE},
        {"image", required_argument, NULL, OPT_IMAGE},
        {"mmproj", required_argument, NULL, OPT_MMPROJ},
        {"image-max-pixels", required_argument, NULL, OPT_IMAGE_MAXP},
        {"image-embd", required_argument, NULL, OPT_IMAGE_EMBD},
        {"image-marker", required_argument, NULL, OPT_IMAGE_MARKER},
        {"token-embd", required_argument, NULL, OPT_TOKEN_EMBD},
        {"no-selftest", no_argument, NULL, OPT_NO_SELFTEST},
        {"verbose", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct opts o;
    memset(&o, 0, sizeof o);
    strata_gen_params_init(&o.gp);
    strata_engine_opts_init(&o.eo);
    strata_ec_cfg_init(&o.ec_cfg);
    int c, bad = 0;
    while (!bad && (c = getopt_long(argc, argv, "m:p:f:n:t:c:vh", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': o.model = optarg; break;
        case 'p': o.prompt = optarg; break;
        case 'f': o.prompt_file = optarg; break;
        case OPT_IDS: o.prompt_ids = optarg; break;
        case 'n': bad = parse_int("-n", optarg, -1, INT_MAX, &o.gp.n_predict); break;
        case OPT_ECHO: o.echo = 1; break;
        case OPT_JSON: o.json = 1; break;
        case OPT_TEMP: bad = parse_float("--temp", optarg, &o.gp.sampling.temperature); break;
        case OPT_TOPK: bad = parse_int("--top-k", optarg, INT_MIN, INT_MAX,
                                       &o.gp.sampling.top_k); break;
        case OPT_TOPP: bad = parse_float("--top-p", optarg, &o.gp.sampling.top_p); break;
        case OPT_MINP: bad = parse_float("--min-p", optarg, &o.gp.sampling.min_p); break;
        case OPT_RPEN: bad = parse_float("--repeat-penalty", optarg,
                                         &o.gp.sampling.repeat_penalty); break;
        case OPT_RLAST: bad = parse_int("--repeat-last-n", optarg, -1, INT_MAX,
                                        &o.gp.sampling.penalty_last_n); break;
        case OPT_PPEN: bad = parse_float("--presence-penalty", optarg,
                                         &o.gp.sampling.presence_penalty); break;
        case OPT_FPEN: bad = parse_float("--frequency-penalty", optarg,
                                         &o.gp.sampling.frequency_penalty); break;
        case OPT_SEED: {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end || optarg[0] == '-') {
                fprintf(stderr, PROG ": invalid --seed '%s'\n", optarg);
                bad = 1;
            }
            o.gp.sampling.seed = s;
            break;
        }
        case OPT_STOP:
            if (o.n_stop == MAX_STOP || !*optarg) {
                fprintf(stderr, PROG ": --stop: at most %d non-empty strings\n", MAX_STOP);
                bad = 1;
            } else {
                o.stop[o.n_stop++] = optarg;
            }
            break;
        case OPT_IGNORE_EOS: o.gp.ignore_eog = 1; break;
        case OPT_LOGPROBS: o.gp.logprobs = 1; break;
        case OPT_TOPLP: bad = parse_int("--top-logprobs", optarg, 0, STRATA_GEN_MAX_TOP,
                                        &o.gp.n_top_logprobs); break;
        case 't': bad = parse_int("--threads", optarg, 1, 512, &o.eo.n_threads); break;
        case 'c': bad = parse_int("--ctx", optarg, 1, 1 << 24, &o.eo.n_ctx); break;
        case OPT_PREFILL: bad = parse_int("--prefill", optarg, 1, 1 << 16, &o.eo.n_prefill);
            break;
        case OPT_KV:
            if (strcmp(optarg, "f16") == 0)
                o.eo.kv_type = STRATA_KV_F16;
            else if (strcmp(optarg, "f32") == 0)
                o.eo.kv_type = STRATA_KV_F32;
            else {
                fprintf(stderr, PROG ": invalid --kv-type '%s' (f16, f32)\n", optarg);
                bad = 1;
            }
            break;
        case OPT_BACKEND:
            o.eo.backend = optarg;
            if (strcmp(optarg, "cpu") && strcmp(optarg, "auto") && strcmp(optarg, "cuda") &&
                strcmp(optarg, "hip")) {
                fprintf(stderr, "%s: invalid --backend '%s' (cpu, auto, cuda, hip)\n", PROG,
                        optarg);
                bad = 1;
            }
            break;
        case OPT_PPL: o.perplexity = optarg; break;
        case OPT_CHUNKS: bad = parse_int("--chunks", optarg, 1, INT_MAX, &o.chunks); break;
        case OPT_DUMP: o.dump_logits = optarg; break;
        case OPT_BENCH:
            if (sscanf(optarg, "%d,%d", &o.bench_pp, &o.bench_tg) != 2 || o.bench_pp < 0 ||
                o.bench_tg < 0 || o.bench_pp + o.bench_tg < 1) {
                fprintf(stderr, PROG ": invalid --bench '%s' (PP,TG)\n", optarg);
                bad = 1;
            }
            o.bench = 1;
            break;
        case OPT_TOKENIZE: o.tokenize = optarg; break;
        case OPT_DETOKENIZE: o.detokenize = optarg; break;
        case OPT_ADD_BOS: o.add_bos = 1; break;
        case OPT_NO_SPECIAL: o.no_special = 1; break;
        case OPT_SERVE_STDIO: o.serve_stdio = 1; break;
        case OPT_RENDER_CHAT: o.render_chat = optarg; break;
        case OPT_CHAT: o.chat = 1; break;
        case OPT_SYSTEM: o.system = optarg; o.chat = 1; break;
        case OPT_CHAT_TEMPLATE: o.chat_template = optarg; break;
        case OPT_SPEC: bad = parse_int("--spec", optarg, 0, STRATA_SPEC_MAX, &o.spec_n); break;
        case OPT_SPEC_MODE:
            if ((o.spec_mode = strata_spec_mode_parse(optarg)) < 0) {
                fprintf(stderr, PROG ": invalid --spec-mode '%s' (ngram, draft, mtp, auto)\n",
                        optarg);
                bad = 1;
            }
            break;
        case OPT_DRAFT: o.draft = optarg; break;
        case OPT_STATS: o.stats = 1; break;
        case OPT_SPEC_FIXED: o.spec_fixed = 1; break;
        case OPT_VRAM_BUDGET:
            bad = parse_int("--vram-budget-mib", optarg, 1, 1 << 24,
                            &o.ec_cfg.vram_budget_mib);
            break;
        case OPT_VRAM_RESERVE:
            bad = parse_int("--vram-reserve-mib", optarg, 0, 1 << 24,
                            &o.ec_cfg.vram_reserve_mib);
            break;
        case OPT_ADAPT_EVERY:
            bad = parse_int("--adapt-every", optarg, 0, 1 << 30, &o.ec_cfg.adapt_every);
            break;
        case OPT_PCIE_FRAC: {
            struct strata_err pe = { 0 };
            double f = 1;
            o.pcie_frac = optarg;
            if (strata_ec_parse_pcie_frac(optarg, -1, -1, &f, &pe)) {
                fprintf(stderr, PROG ": %s\n", pe.msg);
                bad = 1;
            }
            o.ec_cfg.pcie_frac = strcmp(optarg, "auto") ? f : -1;
            break;
        }
        case OPT_POOL_WORKERS:
            bad = parse_int("--pool-workers", optarg, 0, 512, &o.ec_cfg.pool_workers);
            break;
        case OPT_PLAN_ONLY: o.plan_only = 1; break;
        case OPT_SAVE_PROFILE: o.save_profile = optarg; break;
        case OPT_IMAGE:
            if (o.n_images == MAX_IMAGES) {
                fprintf(stderr, PROG ": --image: at most %d images\n", MAX_IMAGES);
                bad = 1;
            } else {
                o.images[o.n_images++] = optarg;
            }
            break;
        case OPT_MMPROJ: o.mmproj = optarg; break;
        case OPT_IMAGE_MAXP: bad = parse_int("--image-max-pixels", optarg, 3136, 1 << 30,
                                             &o.image_max_pixels); break;
        case OPT_IMAGE_EMBD: o.image_embd = optarg; break;
        case OPT_IMAGE_MARKER: o.image_marker = optarg; break;
        case OPT_TOKEN_EMBD: o.token_embd = optarg; break;
        case OPT_NO_SELFTEST: o.no_selftest = 1; break;
        case 'v': o.verbose = 1; break;
        case 'h': fputs(usage_text, stdout); return STRATA_EXIT_OK;
        default: bad = 1; break;
        }
    }
    if (bad) {
        fputs(usage_text, stderr);
        return STRATA_EXIT_USAGE;
    }
    if (optind < argc) {
        fprintf(stderr, PROG ": unexpected argument '%s'\n", argv[optind]);
        fputs(usage_text, stderr);
        return STRATA_EXIT_USAGE;
    }
    if (image_usage(&o))
        return STRATA_EXIT_USAGE;
    if (o.render_chat)
        return run_render_chat(&o);
    if (!o.model) {
        fprintf(stderr, PROG ": no model given (-m MODEL)\n");
        fputs(usage_text, stderr);
        return STRATA_EXIT_USAGE;
    }
    strata_log_set_level(o.verbose ? STRATA_LOG_DEBUG : STRATA_LOG_WARN);

    struct strata_err err = { 0 };
    struct strata_pack *pk = NULL; /* a pack directory, or a bare GGUF */
    const struct strata_gguf *g = NULL;
    struct strata_vocab *v = NULL;
    struct strata_engine *e = NULL;
    int ret;
    if (strata_pack_open(&pk, o.model, &err)) {
        ret = fail(&err);
        goto out;
    }
    say_resident(pk);
    g = strata_pack_gguf(pk);
    o.eo.pack = pk;
    if (strata_vocab_load(&v, g, &err)) {
        strata_err_wrap(&err, "'%s'", o.model);
        ret = fail(&err);
        goto out;
    }
    if (o.tokenize || o.detokenize) {
        ret = o.tokenize ? run_tokenize(&o, v) : run_detokenize(&o, v);
        goto out;
    }
    o.gguf = g;
    o.ec_cfg.stats = o.stats;
    o.eo.backend_cfg = &o.ec_cfg;
    if (o.plan_only || o.ec_cfg.vram_budget_mib) {
        ret = run_plan(&o, pk);
        if (ret || o.plan_only)
            goto out;
    }
    if (o.save_profile) {
        if (profile_begin(&o, pk, &err)) {
            ret = fail(&err);
            goto out;
        }
    }
    if (!o.no_selftest && (ret = run_selftest(&o)) != 0)
        goto out;
    if (strata_engine_open_gguf(&e, g, &o.eo, &err)) {
        strata_err_wrap(&err, "'%s'", o.model);
        ret = fail(&err);
        goto out;
    }
    if (o.token_embd)
        ret = run_token_embd(&o, e);
    else if (o.serve_stdio)
        ret = run_serve_stdio(&o, e, v);
    else if (o.bench)
        ret = run_bench(&o, e);
    else if (o.perplexity)
        ret = run_perplexity(&o, e, v);
    else
        ret = run_generate(&o, e, v);
    if (o.save_profile && ret == 0 && profile_end(&o, &err))
        ret = fail(&err);
out:
    strata_ec_profile_free(&o.profile);
    strata_engine_close(e);
    strata_vocab_free(v);
    strata_pack_close(pk);
    /* text that never reached its destination (a full disk, a closed pipe) is
     * a failure, not a success */
    int had_error = ferror(stdout);
    if ((fflush(stdout) != 0 || had_error) && ret == 0) {
        fprintf(stderr, "%s: cannot write the output: %s\n", PROG,
                had_error ? "a write to standard output failed" : strerror(errno));
        ret = STRATA_EXIT_FAILURE;
    }
    return ret;
}
