/* jinja.c - lexer, parser and evaluator for the Jinja2 subset of chat templates.
 *
 * Semantics follow Python jinja2 3.1 as Hugging Face's apply_chat_template configures
 * it (trim_blocks, lstrip_blocks, default Undefined, no autoescape) and Python's own
 * str()/repr()/json.dumps() for printing values.  All values live in one arena per
 * render, so nothing is freed until the render ends; the arena has a byte cap, which
 * together with the step, loop, depth and output caps bounds a hostile template.
 */
#include "jinja.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#define DEF_MAX_STEPS 20000000ull
#define DEF_MAX_LOOP 5000000ull
#define DEF_MAX_DEPTH 200
#define DEF_MAX_OUTPUT (64u << 20)
#define DEF_MAX_MEMORY (256u << 20)
#define PARSE_MAX_DEPTH 2000 /* parser recursion: about 9 levels per parenthesis */
#define ARENA_CHUNK (64u << 10)

/* ---------------------------------------------------------------- arena */

struct chunk {
    struct chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

struct arena {
    struct chunk *head;
    size_t total, cap; /* bytes obtained from malloc, and the limit */
    int capped;        /* an allocation was refused because of cap */
};

static void *arena_alloc(struct arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > ARENA_CHUNK ? n : ARENA_CHUNK;
        if (a->total + cap > a->cap || a->total + cap < a->total) {
            a->capped = 1;
            return NULL;
        }
        struct chunk *c = malloc(sizeof *c + cap);
        if (!c)
            return NULL;
        c->used = 0;
        c->cap = cap;
        c->next = a->head;
        a->head = c;
        a->total += cap;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void arena_free(struct arena *a)
{
    struct chunk *c = a->head;
    while (c) {
        struct chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->total = 0;
}

/* ---------------------------------------------------------------- values */

enum vtype { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS,
             V_MACRO, V_FUNC, V_LOOP };

struct list;
struct dict;
struct node;
struct loopctx;
struct scope;

struct val {
    unsigned char t;
    size_t n; /* V_STR: byte length */
    union {
        int64_t i;         /* V_INT, V_BOOL, V_FUNC (builtin id) */
        double f;          /* V_FLOAT */
        const char *s;     /* V_STR (NUL-terminated), V_UNDEF (hint or NULL) */
        struct list *l;    /* V_LIST */
        struct dict *d;    /* V_DICT, V_NS */
        struct macro *m;   /* V_MACRO */
        struct loopctx *lp;/* V_LOOP */
    } u;
};

struct list {
    size_t n, cap;
    struct val *v;
    int tuple; /* prints as (a, b) */
};

struct dict {
    size_t n, cap;
    struct val *k, *v;
};

struct macro {
    const struct node *def;
    struct scope *closure;
};

struct loopctx {
    int64_t index0, length;
    struct list *items;
    int64_t depth0;
};

enum builtin { F_RANGE, F_NAMESPACE, F_DICT, F_RAISE, F_STRFTIME, F_CALLER_NONE };

static const struct val UNDEF = { .t = V_UNDEF };
static const struct val NONE = { .t = V_NONE };

/* ---------------------------------------------------------------- tokens, nodes */

enum tk { T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP,
          T_EOF };

enum { OP_EQ = 256, OP_NE, OP_LE, OP_GE, OP_FLOORDIV, OP_POW };

struct tok {
    enum tk t;
    int line, col;
    int op;
    const char *s; /* T_TEXT/T_NAME/T_STR: text (arena copy for STR) */
    size_t n;
    int64_t i;
    double f;
};

enum nkind {
    /* expressions */
    E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_POS,
    E_NOT, E_AND, E_OR, E_BIN, E_CMP, E_COND, E_LIST, E_DICT,
    /* statements */
    S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_CALLBLOCK, S_BREAK,
    S_CONTINUE, S_FILTERBLOCK, S_WITH, S_BODY
};

struct node {
    int kind, line, col;
    int op;                   /* E_BIN operator; E_TEST negated; S_FOR recursive */
    const char *name;         /* NAME/ATTR/FILTER/TEST name; SET target; MACRO name */
    size_t name_len;          /* S_TEXT length */
    struct val lit;           /* E_LIT */
    struct node *a, *b, *c;   /* operands / bodies */
    struct node **args;       /* call args, list items, body statements, if conds */
    int n_args;
    struct node **kw;         /* keyword arg values, dict values, if bodies */
    const char **kw_names;    /* keyword names; macro param names; for/set targets */
    int n_kw;
    int *ops;                 /* E_CMP operators */
    int unknown;              /* E_FILTER/E_TEST: not a jinja2 filter/test name */
};

struct strata_jinja {
    struct arena ar;
    struct node *root;
    char *name;
};

/* ---------------------------------------------------------------- helpers */

static char *arena_strdup(struct arena *a, const char *s, size_t n)
{
    char *p = arena_alloc(a, n + 1);
    if (!p)
        return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

static int is_ws(int ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

/* ---------------------------------------------------------------- lexer */

struct lexer {
    struct arena *ar;
    const char *src;
    size_t len, pos;
    int line, col;
    const char *name;
    struct tok *toks;
    size_t n, cap;
    struct strata_err *err;
};

static void lx_pos(const struct lexer *lx, size_t pos, int *line, int *col)
{
    int l = 1, c = 1;
    for (size_t i = 0; i < pos && i < lx->len; i++) {
        if (lx->src[i] == '\n') {
            l++;
            c = 1;
        } else if (((unsigned char)lx->src[i] & 0xC0) != 0x80) {
            c++;
        }
    }
    *line = l;
    *col = c;
}

static int lx_fail(struct lexer *lx, size_t pos, const char *msg)
{
    int line, col;
    lx_pos(lx, pos, &line, &col);
    return strata_err_set(lx->err, STRATA_E_FORMAT, "template '%s' line %d column %d: %s",
                          lx->name, line, col, msg);
}

static struct tok *lx_push(struct lexer *lx, enum tk t, size_t pos)
{
    if (lx->n == lx->cap) {
        size_t nc = lx->cap ? lx->cap * 2 : 256;
        struct tok *nt = realloc(lx->toks, nc * sizeof *nt);
        if (!nt)
            return NULL;
        lx->toks = nt;
        lx->cap = nc;
    }
    struct tok *k = &lx->toks[lx->n++];
    memset(k, 0, sizeof *k);
    k->t = t;
    /* line/col filled lazily by a running counter */
    k->line = (int)pos; /* temporarily the byte offset */
    return k;
}

static int lx_string(struct lexer *lx, size_t *pp, struct tok *k)
{
    size_t p = *pp;
    char q = lx->src[p++];
    size_t cap = 16, n = 0;
    char *buf = malloc(cap);
    if (!buf)
        return strata_err_set(lx->err, STRATA_E_NOMEM, "out of memory");
    int rc = 0;
    for (;;) {
        if (p >= lx->len) {
            rc = lx_fail(lx, *pp, "unterminated string literal");
            goto out;
        }
        char ch = lx->src[p++];
        char tmp[8];
        size_t tn = 1;
        tmp[0] = ch;
        if (ch == q)
            break;
        if (ch == '\\' && p < lx->len) {
            char e = lx->src[p++];
            unsigned long cp = 0;
            int hex = 0;
            switch (e) {
            case 'n': tmp[0] = '\n'; break;
            case 't': tmp[0] = '\t'; break;
            case 'r': tmp[0] = '\r'; break;
            case '0': tmp[0] = '\0'; break;
            case 'a': tmp[0] = '\a'; break;
            case 'b': tmp[0] = '\b'; break;
            case 'f': tmp[0] = '\f'; break;
            case 'v': tmp[0] = '\v'; break;
            case '\\': tmp[0] = '\\'; break;
            case '\'': tmp[0] = '\''; break;
            case '"': tmp[0] = '"'; break;
            case '\n': tn = 0; break;
            case 'x': hex = 2; break;
            case 'u': hex = 4; break;
            case 'U': hex = 8; break;
            default: tmp[0] = '\\'; tmp[1] = e; tn = 2; break;
            }
            if (hex) {
                for (int i = 0; i < hex; i++) {
                    if (p >= lx->len || !isxdigit((unsigned char)lx->src[p])) {
                        rc = lx_fail(lx, p, "bad escape in string literal");
                        goto out;
                    }
                    char h = lx->src[p++];
                    cp = cp * 16 + (unsigned long)(isdigit((unsigned char)h)
                                                       ? h - '0'
                                                       : (tolower((unsigned char)h) - 'a' + 10));
                }
                utf8proc_ssize_t w = utf8proc_encode_char((utf8proc_int32_t)cp,
                                                          (utf8proc_uint8_t *)tmp);
                if (w <= 0) {
                    rc = lx_fail(lx, p, "bad escape in string literal");
                    goto out;
                }
                tn = (size_t)w;
            }
        }
        if (n + tn + 1 > cap) {
            cap = (n + tn + 1) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                rc = strata_err_set(lx->err, STRATA_E_NOMEM, "out of memory");
                goto out;
            }
            buf = nb;
        }
        memcpy(buf + n, tmp, tn);
        n += tn;
    }
    k->s = arena_strdup(lx->ar, buf ? buf : "", n);
    k->n = n;
    if (!k->s)
        rc = strata_err_set(lx->err, STRATA_E_NOMEM, "out of memory");
    *pp = p;
out:
    free(buf);
    return rc;
}

/* Lex the expression part of a tag until its end marker.  Returns 0 and sets *endpos
 * to just after the end marker (with trim/strip applied). */
static int lx_tag(struct lexer *lx, size_t p, int kind, size_t *endpos, int *line_start)
{
    const char *s = lx->src;
    size_t len = lx->len;
    size_t start = p;
    int depth = 0;
    for (;;) {
        while (p < len && is_ws(s[p]))
            p++;
        if (p >= len)
            return lx_fail(lx, start - 2, kind == T_VBEGIN ? "unterminated '{{' tag"
                                                          : "unterminated '{%' tag");
        /* end marker */
        char e1 = kind == T_VBEGIN ? '}' : '%';
        if (depth == 0) {
            size_t q = p;
            int sign = 0;
            if ((s[q] == '-' || s[q] == '+') && q + 2 < len + 1 && q + 1 < len && s[q + 1] == e1
                && q + 2 < len && s[q + 2] == '}') {
                sign = s[q];
                q++;
            }
            if (q + 1 < len && s[q] == e1 && s[q + 1] == '}') {
                struct tok *k = lx_push(lx, kind == T_VBEGIN ? T_VEND : T_BEND, p);
                if (!k)
                    return strata_err_set(lx->err, STRATA_E_NOMEM, "out of memory");
                q += 2;
                *line_start = 0;
                if (sign == '-') {
                    while (q < len && is_ws(s[q]))
                        q++;
                    if (q > p + 3 && s[q - 1] == '\n')
                        *line_start = 1;
                } else if (sign == 0 && kind == T_BBEGIN && q < len && s[q] == '\n') {
                    q++;
                    *line_start = 1;
                }
                *endpos = q;
                return 0;
            }
        }
        char ch = s[p];
        if (isalpha((unsigned char)ch) || ch == '_') {
            size_t b = p;
            while (p < len && (isalnum((unsigned char)s[p]) || s[p] == '_'))
                p++;
            struct tok *k = lx_push(lx, T_NAME, b);
            if (!k)
                return strata_err_set(lx->err, STRATA_E_NOMEM, "out of memory");
            k->s = s + b;
            k->n = p - b;
        } else if (isdigit((unsigned char)ch)) {
            size_t b = p;
            int isf = 0;
            while (p < len && (isdigit((unsigned char)s[p]) || s[p] == '_'))
                p++;
            if (p + 1 < len && s[p] == '.' && isdigit((unsigned char)s[p + 1])) {
                isf = 1;
                p++;
                while (p < len && (isdigit((unsigned char)s[p]) || s[p] == '_'))
                    p++;
            }
            if (p < len && (s[p] == 'e' || s[p] == 'E')) {
                size_t q = p + 1;
                if (q < len && (s[q] == '+' || s[q] == '-'))
                    q++;
                if (q < len && isdigit((unsigned char)s[q])) {
                    isf = 1;
                    p = q;
                    while (p < len && isdigit((unsigned char)s[p]))
                        p++;
                }
            }
            char buf[64];
            size_t bn = 0;
            for (size_t i = b; i < p && bn < sizeof buf - 1; i++)
                if (s[i] != '_')
                    buf[bn++] = s[i];
            buf[bn] = 0;
            struct tok *k = lx_push(lx, isf ? T_FLOAT : T_INT, b);
            if (!k)
                return strata_err_set(lx->err, STRATA_E_NOMEM, "out of memory");
            if (isf)
                k->f = strtod(buf, NULL);
            else
                k->i = strtoll(buf, NULL, 10);
        } else if (ch == '\'' || ch == '"') {
            struct tok *k = lx_push(lx, T_STR, p);
            if (!k)
                return strata_err_set(lx->err, STRATA_E_NOMEM, "out of memory");
            size_t b = p;
            int rc = lx_string(lx, &p, k);
            if (rc)
                return rc;
            k = &lx->toks[lx->n - 1];
            k->line = (int)b;
        } else {
            int op = ch;
            size_t b = p;
            char c2 = p + 1 < len ? s[p + 1] : 0;
            if (ch == '=' && c2 == '=') op = OP_EQ;
            else if (ch == '!' && c2 == '=') op = OP_NE;
            else if (ch == '<' && c2 == '=') op = OP_LE;
            else if (ch == '>' && c2 == '=') op = OP_GE;
            else if (ch == '/' && c2 == '/') op = OP_FLOORDIV;
            else if (ch == '*' && c2 == '*') op = OP_POW;
            else if (!strchr("+-*/%~<>=.,:|()[]{}", ch))
                return lx_fail(lx, p, "unexpected character in tag");
            p += op >= 256 ? 2 : 1;
            if (ch == '(' || ch == '[' || ch == '{')
                depth++;
            else if ((ch == ')' || ch == ']' || ch == '}') && depth > 0)
                depth--;
            struct tok *k = lx_push(lx, T_OP, b);
            if (!k)
                return strata_err_set(lx->err, STRATA_E_NOMEM, "out of memory");
            k->op = op;
        }
    }
}

static int lx_text(struct lexer *lx, size_t a, size_t b)
{
    if (b <= a)
        return 0;
    struct tok *k = lx_push(lx, T_TEXT, a);
    if (!k)
        return strata_err_set(lx->err, STRATA_E_NOMEM, "out of memory");
    k->s = lx->src + a;
    k->n = b - a;
    return 0;
}

/* Is the tag at p "{% raw %}" (any sign)?  Sets *after to the end of its end marker. */
static int match_word_tag(const char *s, size_t len, size_t p, const char *word, size_t *after,
                          int *open_sign, int *close_sign)
{
    size_t q = p + 2;
    *open_sign = 0;
    if (q < len && (s[q] == '-' || s[q] == '+'))
        *open_sign = s[q++];
    while (q < len && is_ws(s[q]))
        q++;
    size_t wl = strlen(word);
    if (q + wl > len || memcmp(s + q, word, wl) != 0)
        return 0;
    q += wl;
    if (q < len && (isalnum((unsigned char)s[q]) || s[q] == '_'))
        return 0;
    while (q < len && is_ws(s[q]))
        q++;
    *close_sign = 0;
    if (q < len && (s[q] == '-' || s[q] == '+'))
        *close_sign = s[q++];
    if (q + 1 < len && s[q] == '%' && s[q + 1] == '}') {
        *after = q + 2;
        return 1;
    }
    return 0;
}

static int lex(struct lexer *lx)
{
    const char *s = lx->src;
    size_t len = lx->len;
    size_t p = 0;
    int line_start = 1;
    int rc;
    while (p < len) {
        /* find next tag start */
        size_t q = p;
        while (q + 1 < len && !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%'
                                                 || s[q + 1] == '#')))
            q++;
        if (q + 1 >= len) {
            if ((rc = lx_text(lx, p, len)))
                return rc;
            break;
        }
        char kind = s[q + 1];
        char sign = q + 2 < len ? s[q + 2] : 0;
        if (sign != '-' && sign != '+')
            sign = 0;
        size_t te = q; /* end of the text before the tag */
        if (sign == '-') {
            while (te > p && is_ws(s[te - 1]))
                te--;
        } else if (sign != '+' && kind != '{') {
            /* lstrip_blocks: drop spaces/tabs between a line start and the tag */
            size_t l = te;
            while (l > p && s[l - 1] != '\n')
                l--;
            if (l > p || line_start) {
                size_t i = l;
                while (i < te && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\f'
                                  || s[i] == '\v'))
                    i++;
                if (i == te)
                    te = l;
            }
        }
        if ((rc = lx_text(lx, p, te)))
            return rc;
        size_t body = q + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t e = body;
            while (e + 1 < len && !(s[e] == '#' && s[e + 1] == '}'))
                e++;
            if (e + 1 >= len)
                return lx_fail(lx, q, "unterminated comment");
            size_t after = e + 2;
            line_start = 0;
            if (e > body && s[e - 1] == '-') {
                while (after < len && is_ws(s[after]))
                    after++;
                if (after > e + 2 && s[after - 1] == '\n')
                    line_start = 1;
            } else if (!(e > body && s[e - 1] == '+') && after < len && s[after] == '\n') {
                after++;
                line_start = 1;
            }
            p = after;
            continue;
        }
        int os, cs;
        size_t after;
        if (kind == '%' && match_word_tag(s, len, q, "raw", &after, &os, &cs) && cs != '+') {
            /* raw: everything up to {% endraw %} is text.  jinja2 trims no newline
             * after "{% raw %}" (only "-%}" strips), and knows no "+%}" there */
            size_t r = after;
            int raw_line_start = 0;
            if (cs == '-') {
                while (r < len && is_ws(s[r]))
                    r++;
                raw_line_start = r > after && s[r - 1] == '\n';
            }
            size_t e = r;
            for (;;) {
                while (e + 1 < len && !(s[e] == '{' && s[e + 1] == '%'))
                    e++;
                if (e + 1 >= len)
                    return lx_fail(lx, q, "unterminated raw block");
                size_t a2;
                int os2, cs2;
                if (match_word_tag(s, len, e, "endraw", &a2, &os2, &cs2)) {
                    size_t te2 = e;
                    if (os2 == '-')
                        while (te2 > r && is_ws(s[te2 - 1]))
                            te2--;
                    else if (os2 == 0) {
                        size_t l = te2;
                        while (l > r && s[l - 1] != '\n')
                            l--;
                        size_t i = l;
                        while (i < te2 && (s[i] == ' ' || s[i] == '\t'))
                            i++;
                        if (i == te2 && i > l && (l > r || raw_line_start))
                            te2 = l;
                    }
                    if ((rc = lx_text(lx, r, te2)))
                        return rc;
                    p = a2;
                    line_start = 0;
                    if (cs2 == '-') {
                        while (p < len && is_ws(s[p]))
                            p++;
                    } else if (cs2 == 0 && p < len && s[p] == '\n') {
                        p++;
                        line_start = 1;
                    }
                    break;
                }
                e++;
            }
            continue;
        }
        struct tok *k = lx_push(lx, kind == '{' ? T_VBEGIN : T_BBEGIN, q);
        if (!k)
            return strata_err_set(lx->err, STRATA_E_NOMEM, "out of memory");
        if ((rc = lx_tag(lx, body, kind == '{' ? T_VBEGIN : T_BBEGIN, &p, &line_start)))
            return rc;
    }
    struct tok *k = lx_push(lx, T_EOF, len);
    if (!k)
        return strata_err_set(lx->err, STRATA_E_NOMEM, "out of memory");
    /* byte offsets -> line/column, in one pass */
    int line = 1, col = 1;
    size_t at = 0;
    for (size_t i = 0; i < lx->n; i++) {
        size_t off = (size_t)lx->toks[i].line;
        for (; at < off && at < len; at++) {
            if (s[at] == '\n') {
                line++;
                col = 1;
            } else if (((unsigned char)s[at] & 0xC0) != 0x80) {
                col++;
            }
        }
        lx->toks[i].line = line;
        lx->toks[i].col = col;
    }
    return 0;
}

/* ---------------------------------------------------------------- parser */

/* jinja2's built-in filters and tests (plus transformers' tojson).  jinja2 refuses a
 * template that names any other at compile time, even in a branch never taken. */
static const char *const filter_names[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e",
    "escape", "filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent",
    "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "pprint",
    "random", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select",
    "selectattr", "slice", "sort", "string", "striptags", "sum", "title", "tojson", "trim",
    "truncate", "unique", "upper", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr",
    NULL
};
static const char *const test_names[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even",
    "false", "filter", "float", "ge", "gt", "greaterthan", "in", "integer", "iterable", "le",
    "lower", "lt", "lessthan", "mapping", "ne", "none", "number", "odd", "sameas", "sequence",
    "string", "test", "true", "undefined", "upper", NULL
};

static int name_in(const char *const *tab, const char *name, size_t n)
{
    for (int i = 0; tab[i]; i++)
        if (strlen(tab[i]) == n && memcmp(tab[i], name, n) == 0)
            return 1;
    return 0;
}

struct parser {
    struct arena *ar;
    struct tok *t;
    size_t i, n;
    const char *name;
    int depth;
    struct strata_err *err;
};

static struct tok *pk(struct parser *p) { return &p->t[p->i]; }

static int p_fail(struct parser *p, const struct tok *k, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int p_fail(struct parser *p, const struct tok *k, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return strata_err_set(p->err, STRATA_E_FORMAT, "template '%s' line %d column %d: %s",
                          p->name, k->line, k->col, msg);
}

static int is_op(const struct tok *k, int op) { return k->t == T_OP && k->op == op; }

static int is_name(const struct tok *k, const char *w)
{
    return k->t == T_NAME && k->n == strlen(w) && memcmp(k->s, w, k->n) == 0;
}

static struct node *mk(struct parser *p, int kind, const struct tok *k)
{
    struct node *n = arena_alloc(p->ar, sizeof *n);
    if (!n)
        return NULL;
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->line = k->line;
    n->col = k->col;
    return n;
}

/* growable node-pointer array in the arena */
struct nvec {
    struct node **v;
    int n, cap;
};

static int nv_push(struct parser *p, struct nvec *v, struct node *x)
{
    if (v->n == v->cap) {
        int nc = v->cap ? v->cap * 2 : 4;
        struct node **nn = arena_alloc(p->ar, (size_t)nc * sizeof *nn);
        if (!nn)
            return -1;
        if (v->n)
            memcpy(nn, v->v, (size_t)v->n * sizeof *nn);
        v->v = nn;
        v->cap = nc;
    }
    v->v[v->n++] = x;
    return 0;
}

struct svec {
    const char **v;
    int n, cap;
};

static int sv_push(struct parser *p, struct svec *v, const char *x)
{
    if (v->n == v->cap) {
        int nc = v->cap ? v->cap * 2 : 4;
        const char **nn = arena_alloc(p->ar, (size_t)nc * sizeof *nn);
        if (!nn)
            return -1;
        if (v->n)
            memcpy(nn, v->v, (size_t)v->n * sizeof *nn);
        v->v = nn;
        v->cap = nc;
    }
    v->v[v->n++] = x;
    return 0;
}

#define NOMEM_P(p) strata_err_set((p)->err, STRATA_E_NOMEM, "out of memory")

static int parse_expr(struct parser *p, struct node **out);
static int parse_unary(struct parser *p, struct node **out, int with_filter);
static int parse_ternary_noif(struct parser *p, struct node **out);

static const char *tokname(struct parser *p, const struct tok *k)
{
    return arena_strdup(p->ar, k->s, k->n);
}

static int expect_op(struct parser *p, int op)
{
    struct tok *k = pk(p);
    if (!is_op(k, op)) {
        if (k->t == T_BEND || k->t == T_VEND || k->t == T_EOF)
            return p_fail(p, k, "expected '%c', found end of tag", op);
        return p_fail(p, k, "expected '%c'", op);
    }
    p->i++;
    return 0;
}

/* call arguments after '(' : positional then keyword */
static int parse_args(struct parser *p, struct node *call)
{
    struct nvec args = { 0 }, kw = { 0 };
    struct svec names = { 0 };
    int rc;
    while (!is_op(pk(p), ')')) {
        struct tok *k = pk(p);
        if (k->t == T_NAME && is_op(&p->t[p->i + 1], '=')) {
            const char *nm = tokname(p, k);
            p->i += 2;
            struct node *v;
            if ((rc = parse_expr(p, &v)))
                return rc;
            if (!nm || sv_push(p, &names, nm) || nv_push(p, &kw, v))
                return NOMEM_P(p);
        } else {
            struct node *v;
            if ((rc = parse_expr(p, &v)))
                return rc;
            if (nv_push(p, &args, v))
                return NOMEM_P(p);
        }
        if (is_op(pk(p), ','))
            p->i++;
        else if (!is_op(pk(p), ')'))
            return p_fail(p, pk(p), "expected ',' or ')' in argument list");
    }
    p->i++;
    call->args = args.v;
    call->n_args = args.n;
    call->kw = kw.v;
    call->kw_names = names.v;
    call->n_kw = kw.n;
    return 0;
}

static int parse_primary(struct parser *p, struct node **out)
{
    struct tok *k = pk(p);
    struct node *n;
    int rc;
    if (k->t == T_NAME) {
        p->i++;
        if (is_name(k, "true") || is_name(k, "True") || is_name(k, "false")
            || is_name(k, "False")) {
            if (!(n = mk(p, E_LIT, k)))
                return NOMEM_P(p);
            n->lit.t = V_BOOL;
            n->lit.u.i = k->s[0] == 't' || k->s[0] == 'T';
        } else if (is_name(k, "none") || is_name(k, "None")) {
            if (!(n = mk(p, E_LIT, k)))
                return NOMEM_P(p);
            n->lit.t = V_NONE;
        } else {
            if (!(n = mk(p, E_NAME, k)) || !(n->name = tokname(p, k)))
                return NOMEM_P(p);
        }
    } else if (k->t == T_STR) {
        /* adjacent string literals concatenate */
        size_t total = 0, j = p->i;
        while (p->t[j].t == T_STR)
            total += p->t[j++].n;
        char *buf = arena_alloc(p->ar, total + 1);
        if (!buf || !(n = mk(p, E_LIT, k)))
            return NOMEM_P(p);
        size_t at = 0;
        while (pk(p)->t == T_STR) {
            memcpy(buf + at, pk(p)->s, pk(p)->n);
            at += pk(p)->n;
            p->i++;
        }
        buf[at] = 0;
        n->lit.t = V_STR;
        n->lit.u.s = buf;
        n->lit.n = at;
    } else if (k->t == T_INT || k->t == T_FLOAT) {
        p->i++;
        if (!(n = mk(p, E_LIT, k)))
            return NOMEM_P(p);
        if (k->t == T_INT) {
            n->lit.t = V_INT;
            n->lit.u.i = k->i;
        } else {
            n->lit.t = V_FLOAT;
            n->lit.u.f = k->f;
        }
    } else if (is_op(k, '(')) {
        p->i++;
        if (is_op(pk(p), ')')) {
            p->i++;
            if (!(n = mk(p, E_LIST, k)))
                return NOMEM_P(p);
            n->op = 1;
        } else {
            if ((rc = parse_expr(p, &n)))
                return rc;
            if (is_op(pk(p), ',')) {
                /* tuple: a list value */
                struct nvec items = { 0 };
                struct node *t = mk(p, E_LIST, k);
                if (!t || nv_push(p, &items, n))
                    return NOMEM_P(p);
                while (is_op(pk(p), ',')) {
                    p->i++;
                    if (is_op(pk(p), ')'))
                        break;
                    struct node *x;
                    if ((rc = parse_expr(p, &x)))
                        return rc;
                    if (nv_push(p, &items, x))
                        return NOMEM_P(p);
                }
                t->args = items.v;
                t->n_args = items.n;
                t->op = 1;
                n = t;
            }
            if ((rc = expect_op(p, ')')))
                return rc;
        }
    } else if (is_op(k, '[')) {
        p->i++;
        struct nvec items = { 0 };
        if (!(n = mk(p, E_LIST, k)))
            return NOMEM_P(p);
        while (!is_op(pk(p), ']')) {
            struct node *x;
            if ((rc = parse_expr(p, &x)))
                return rc;
            if (nv_push(p, &items, x))
                return NOMEM_P(p);
            if (is_op(pk(p), ','))
                p->i++;
            else if (!is_op(pk(p), ']'))
                return p_fail(p, pk(p), "expected ',' or ']' in list");
        }
        p->i++;
        n->args = items.v;
        n->n_args = items.n;
    } else if (is_op(k, '{')) {
        p->i++;
        struct nvec keys = { 0 }, vals = { 0 };
        if (!(n = mk(p, E_DICT, k)))
            return NOMEM_P(p);
        while (!is_op(pk(p), '}')) {
            struct node *kx, *vx;
            if ((rc = parse_expr(p, &kx)))
                return rc;
            if ((rc = expect_op(p, ':')))
                return rc;
            if ((rc = parse_expr(p, &vx)))
                return rc;
            if (nv_push(p, &keys, kx) || nv_push(p, &vals, vx))
                return NOMEM_P(p);
            if (is_op(pk(p), ','))
                p->i++;
            else if (!is_op(pk(p), '}'))
                return p_fail(p, pk(p), "expected ',' or '}' in dict");
        }
        p->i++;
        n->args = keys.v;
        n->kw = vals.v;
        n->n_args = keys.n;
    } else if (k->t == T_BEND || k->t == T_VEND || k->t == T_EOF) {
        return p_fail(p, k, "expected an expression, found end of tag");
    } else {
        return p_fail(p, k, "unexpected token in expression");
    }
    *out = n;
    return 0;
}

static int parse_postfix(struct parser *p, struct node **io)
{
    int rc;
    for (;;) {
        struct tok *k = pk(p);
        if (is_op(k, '.')) {
            p->i++;
            struct tok *a = pk(p);
            struct node *n = mk(p, E_ATTR, k);
            if (!n)
                return NOMEM_P(p);
            if (a->t == T_NAME) {
                n->name = tokname(p, a);
            } else if (a->t == T_INT) {
                char buf[32];
                snprintf(buf, sizeof buf, "%lld", (long long)a->i);
                n->name = arena_strdup(p->ar, buf, strlen(buf));
                n->op = 1; /* numeric attribute: item lookup */
                n->lit.t = V_INT;
                n->lit.u.i = a->i;
            } else {
                return p_fail(p, a, "expected a name after '.'");
            }
            if (!n->name)
                return NOMEM_P(p);
            p->i++;
            n->a = *io;
            *io = n;
        } else if (is_op(k, '[')) {
            p->i++;
            struct node *parts[3] = { NULL, NULL, NULL };
            int slice = 0, idx = 0;
            while (!is_op(pk(p), ']')) {
                if (is_op(pk(p), ':')) {
                    slice = 1;
                    if (++idx > 2)
                        return p_fail(p, pk(p), "too many ':' in subscript");
                    p->i++;
                    continue;
                }
                if (parts[idx])
                    return p_fail(p, pk(p), "expected ']'");
                if ((rc = parse_expr(p, &parts[idx])))
                    return rc;
            }
            p->i++;
            struct node *n = mk(p, slice ? E_SLICE : E_ITEM, k);
            if (!n)
                return NOMEM_P(p);
            if (!slice && !parts[0])
                return p_fail(p, k, "empty subscript");
            n->a = *io;
            n->b = parts[0];
            n->c = parts[1];
            if (slice) {
                n->args = arena_alloc(p->ar, sizeof(struct node *));
                if (!n->args)
                    return NOMEM_P(p);
                n->args[0] = parts[2];
            }
            *io = n;
        } else if (is_op(k, '(')) {
            p->i++;
            struct node *n = mk(p, E_CALL, k);
            if (!n)
                return NOMEM_P(p);
            n->a = *io;
            if ((rc = parse_args(p, n)))
                return rc;
            *io = n;
        } else {
            return 0;
        }
    }
}

/* filters "|name(args)" and tests "is [not] name args" */
static int parse_filter_expr(struct parser *p, struct node **io)
{
    int rc;
    for (;;) {
        struct tok *k = pk(p);
        if (is_op(k, '|')) {
            p->i++;
            struct tok *nk = pk(p);
            if (nk->t != T_NAME)
                return p_fail(p, nk, "expected a filter name after '|'");
            struct node *n = mk(p, E_FILTER, nk);
            if (!n || !(n->name = tokname(p, nk)))
                return NOMEM_P(p);
            n->unknown = !name_in(filter_names, nk->s, nk->n);
            p->i++;
            /* dotted filter names are not used by chat templates */
            if (is_op(pk(p), '(')) {
                p->i++;
                if ((rc = parse_args(p, n)))
                    return rc;
            }
            n->a = *io;
            *io = n;
        } else if (is_name(k, "is")) {
            p->i++;
            int neg = 0;
            if (is_name(pk(p), "not")) {
                neg = 1;
                p->i++;
            }
            struct tok *nk = pk(p);
            if (nk->t != T_NAME)
                return p_fail(p, nk, "expected a test name after 'is'");
            struct node *n = mk(p, E_TEST, nk);
            if (!n || !(n->name = tokname(p, nk)))
                return NOMEM_P(p);
            n->unknown = !name_in(test_names, nk->s, nk->n);
            p->i++;
            n->op = neg;
            struct tok *a = pk(p);
            if (is_op(a, '(')) {
                p->i++;
                if ((rc = parse_args(p, n)))
                    return rc;
            } else if ((a->t == T_NAME && !is_name(a, "else") && !is_name(a, "or")
                        && !is_name(a, "and") && !is_name(a, "if") && !is_name(a, "is")
                        && !is_name(a, "in") && !is_name(a, "not"))
                       || a->t == T_STR || a->t == T_INT || a->t == T_FLOAT || is_op(a, '[')
                       || is_op(a, '{')) {
                /* one argument without parentheses: "x is divisibleby 3" */
                struct node *arg;
                if ((rc = parse_primary(p, &arg)))
                    return rc;
                if ((rc = parse_postfix(p, &arg)))
                    return rc;
                n->args = arena_alloc(p->ar, sizeof(struct node *));
                if (!n->args)
                    return NOMEM_P(p);
                n->args[0] = arg;
                n->n_args = 1;
            }
            n->a = *io;
            *io = n;
        } else {
            return 0;
        }
    }
}

static int parse_unary(struct parser *p, struct node **out, int with_filter)
{
    struct tok *k = pk(p);
    struct node *n;
    int rc;
    if (++p->depth > PARSE_MAX_DEPTH)
        return strata_err_set(p->err, STRATA_E_LIMIT,
                              "template '%s' line %d column %d: expression nested too deeply",
                              p->name, k->line, k->col);
    if (is_op(k, '-') || is_op(k, '+')) {
        p->i++;
        struct node *x;
        if ((rc = parse_unary(p, &x, 0)))
            return rc;
        if (!(n = mk(p, is_op(k, '-') ? E_NEG : E_POS, k)))
            return NOMEM_P(p);
        n->a = x;
    } else {
        if ((rc = parse_primary(p, &n)))
            return rc;
    }
    if ((rc = parse_postfix(p, &n)))
        return rc;
    if (with_filter && (rc = parse_filter_expr(p, &n)))
        return rc;
    p->depth--;
    *out = n;
    return 0;
}

static int parse_bin_level(struct parser *p, struct node **out, int level);

/* levels: 0 or, 1 and, 2 not, 3 compare, 4 + -, 5 ~, 6 * / // %, 7 **, 8 unary */
static int parse_bin_level(struct parser *p, struct node **out, int level)
{
    int rc;
    struct node *l, *r;
    struct tok *k;
    if (++p->depth > PARSE_MAX_DEPTH) {
        k = pk(p);
        return strata_err_set(p->err, STRATA_E_LIMIT,
                              "template '%s' line %d column %d: expression nested too deeply",
                              p->name, k->line, k->col);
    }
    switch (level) {
    case 0:
    case 1:
        if ((rc = parse_bin_level(p, &l, level + 1)))
            return rc;
        while (is_name(k = pk(p), level == 0 ? "or" : "and")) {
            p->i++;
            if ((rc = parse_bin_level(p, &r, level + 1)))
                return rc;
            struct node *n = mk(p, level == 0 ? E_OR : E_AND, k);
            if (!n)
                return NOMEM_P(p);
            n->a = l;
            n->b = r;
            l = n;
        }
        break;
    case 2:
        k = pk(p);
        if (is_name(k, "not")) {
            p->i++;
            if ((rc = parse_bin_level(p, &r, 2)))
                return rc;
            if (!(l = mk(p, E_NOT, k)))
                return NOMEM_P(p);
            l->a = r;
        } else if ((rc = parse_bin_level(p, &l, 3))) {
            return rc;
        }
        break;
    case 3: {
        if ((rc = parse_bin_level(p, &l, 4)))
            return rc;
        struct nvec rhs = { 0 };
        int ops[64];
        int nops = 0;
        struct tok *first = pk(p);
        for (;;) {
            k = pk(p);
            int op = 0;
            if (k->t == T_OP && (k->op == OP_EQ || k->op == OP_NE || k->op == OP_LE
                                 || k->op == OP_GE || k->op == '<' || k->op == '>')) {
                op = k->op;
                p->i++;
            } else if (is_name(k, "in")) {
                op = 'i';
                p->i++;
            } else if (is_name(k, "not") && is_name(&p->t[p->i + 1], "in")) {
                op = 'n';
                p->i += 2;
            } else {
                break;
            }
            if (nops == 64)
                return p_fail(p, k, "comparison chain too long");
            if ((rc = parse_bin_level(p, &r, 4)))
                return rc;
            ops[nops++] = op;
            if (nv_push(p, &rhs, r))
                return NOMEM_P(p);
        }
        if (nops) {
            struct node *n = mk(p, E_CMP, first);
            if (!n || !(n->ops = arena_alloc(p->ar, sizeof(int) * (size_t)nops)))
                return NOMEM_P(p);
            memcpy(n->ops, ops, sizeof(int) * (size_t)nops);
            n->a = l;
            n->args = rhs.v;
            n->n_args = nops;
            l = n;
        }
        break;
    }
    case 4:
    case 5:
    case 6:
        if ((rc = parse_bin_level(p, &l, level + 1)))
            return rc;
        for (;;) {
            k = pk(p);
            if (k->t != T_OP)
                break;
            int op = k->op;
            int ok = level == 4 ? (op == '+' || op == '-')
                   : level == 5 ? op == '~'
                                : (op == '*' || op == '/' || op == OP_FLOORDIV || op == '%');
            if (!ok)
                break;
            p->i++;
            if ((rc = parse_bin_level(p, &r, level + 1)))
                return rc;
            struct node *n = mk(p, E_BIN, k);
            if (!n)
                return NOMEM_P(p);
            n->op = op;
            n->a = l;
            n->b = r;
            l = n;
        }
        break;
    case 7:
        if ((rc = parse_unary(p, &l, 1)))
            return rc;
        while (is_op(k = pk(p), OP_POW)) {
            p->i++;
            if ((rc = parse_unary(p, &r, 1)))
                return rc;
            struct node *n = mk(p, E_BIN, k);
            if (!n)
                return NOMEM_P(p);
            n->op = OP_POW;
            n->a = l;
            n->b = r;
            l = n;
        }
        break;
    }
    p->depth--;
    *out = l;
    return 0;
}

static int parse_ternary_noif(struct parser *p, struct node **out)
{
    return parse_bin_level(p, out, 0);
}

/* expr [if cond [else expr]] */
static int parse_expr(struct parser *p, struct node **out)
{
    int rc;
    struct node *a;
    if ((rc = parse_ternary_noif(p, &a)))
        return rc;
    while (is_name(pk(p), "if")) {
        struct tok *k = pk(p);
        p->i++;
        struct node *n = mk(p, E_COND, k);
        if (!n)
            return NOMEM_P(p);
        if ((rc = parse_ternary_noif(p, &n->a)))
            return rc;
        n->b = a;
        if (is_name(pk(p), "else")) {
            p->i++;
            if ((rc = parse_expr(p, &n->c)))
                return rc;
        }
        a = n;
    }
    *out = a;
    return 0;
}

/* statements */

static int parse_body(struct parser *p, struct node **out, const char *const *ends,
                      const char **found);

static int expect_bend(struct parser *p)
{
    struct tok *k = pk(p);
    if (k->t != T_BEND)
        return p_fail(p, k, "expected end of statement '%%}'");
    p->i++;
    return 0;
}

static int parse_targets(struct parser *p, struct svec *names)
{
    for (;;) {
        struct tok *k = pk(p);
        if (k->t != T_NAME)
            return p_fail(p, k, "expected a variable name");
        const char *nm = tokname(p, k);
        if (!nm || sv_push(p, names, nm))
            return NOMEM_P(p);
        p->i++;
        if (!is_op(pk(p), ','))
            return 0;
        p->i++;
    }
}

static int parse_stmt(struct parser *p, struct node **out, const char *const *ends,
                      const char **found, int *is_end)
{
    struct tok *k = pk(p); /* the statement name, after BBEGIN */
    int rc;
    *is_end = 0;
    if (k->t != T_NAME)
        return p_fail(p, k, "expected a statement name");
    for (int i = 0; ends && ends[i]; i++) {
        if (is_name(k, ends[i])) {
            *found = ends[i];
            *is_end = 1;
            p->i++;
            return 0;
        }
    }
    struct node *n;
    if (is_name(k, "if")) {
        p->i++;
        struct nvec conds = { 0 }, bodies = { 0 };
        if (!(n = mk(p, S_IF, k)))
            return NOMEM_P(p);
        static const char *const if_ends[] = { "elif", "else", "endif", NULL };
        for (;;) {
            struct node *c, *body;
            const char *f = NULL;
            if ((rc = parse_expr(p, &c)) || (rc = expect_bend(p)))
                return rc;
            if ((rc = parse_body(p, &body, if_ends, &f)))
                return rc;
            if (nv_push(p, &conds, c) || nv_push(p, &bodies, body))
                return NOMEM_P(p);
            if (!strcmp(f, "elif"))
                continue;
            if (!strcmp(f, "else")) {
                static const char *const else_ends[] = { "endif", NULL };
                if ((rc = expect_bend(p)) || (rc = parse_body(p, &n->c, else_ends, &f)))
                    return rc;
            }
            if ((rc = expect_bend(p)))
                return rc;
            break;
        }
        n->args = conds.v;
        n->kw = bodies.v;
        n->n_args = conds.n;
    } else if (is_name(k, "for")) {
        p->i++;
        struct svec names = { 0 };
        if (!(n = mk(p, S_FOR, k)))
            return NOMEM_P(p);
        if ((rc = parse_targets(p, &names)))
            return rc;
        n->kw_names = names.v;
        n->n_kw = names.n;
        if (!is_name(pk(p), "in"))
            return p_fail(p, pk(p), "expected 'in' in for statement");
        p->i++;
        if ((rc = parse_ternary_noif(p, &n->a)))
            return rc;
        if (is_name(pk(p), "if")) {
            p->i++;
            if (!(n->args = arena_alloc(p->ar, sizeof(struct node *))))
                return NOMEM_P(p);
            n->n_args = 1;
            if ((rc = parse_ternary_noif(p, &n->args[0])))
                return rc;
        }
        if (is_name(pk(p), "recursive")) {
            p->i++;
            n->op = 1;
        }
        if ((rc = expect_bend(p)))
            return rc;
        static const char *const for_ends[] = { "else", "endfor", NULL };
        const char *f = NULL;
        if ((rc = parse_body(p, &n->b, for_ends, &f)))
            return rc;
        if (!strcmp(f, "else")) {
            static const char *const e2[] = { "endfor", NULL };
            if ((rc = expect_bend(p)) || (rc = parse_body(p, &n->c, e2, &f)))
                return rc;
        }
        if ((rc = expect_bend(p)))
            return rc;
    } else if (is_name(k, "set")) {
        p->i++;
        struct tok *t = pk(p);
        if (t->t != T_NAME)
            return p_fail(p, t, "expected a variable name after 'set'");
        if (is_op(&p->t[p->i + 1], '.')) {
            /* namespace attribute */
            if (!(n = mk(p, S_SET, k)))
                return NOMEM_P(p);
            n->name = tokname(p, t);
            struct tok *a = &p->t[p->i + 2];
            if (a->t != T_NAME)
                return p_fail(p, a, "expected an attribute name");
            n->lit.t = V_STR;
            n->lit.u.s = tokname(p, a);
            if (!n->name || !n->lit.u.s)
                return NOMEM_P(p);
            p->i += 3;
            if ((rc = expect_op(p, '=')) || (rc = parse_expr(p, &n->a)) || (rc = expect_bend(p)))
                return rc;
        } else {
            struct svec names = { 0 };
            if ((rc = parse_targets(p, &names)))
                return rc;
            if (is_op(pk(p), '=')) {
                if (!(n = mk(p, S_SET, k)))
                    return NOMEM_P(p);
                n->kw_names = names.v;
                n->n_kw = names.n;
                p->i++;
                if ((rc = parse_expr(p, &n->a)))
                    return rc;
                if (is_op(pk(p), ',')) {
                    /* set a, b = x, y */
                    struct nvec items = { 0 };
                    struct node *t2 = mk(p, E_LIST, pk(p));
                    if (!t2 || nv_push(p, &items, n->a))
                        return NOMEM_P(p);
                    while (is_op(pk(p), ',')) {
                        p->i++;
                        struct node *x;
                        if ((rc = parse_expr(p, &x)))
                            return rc;
                        if (nv_push(p, &items, x))
                            return NOMEM_P(p);
                    }
                    t2->args = items.v;
                    t2->n_args = items.n;
                    n->a = t2;
                }
                if ((rc = expect_bend(p)))
                    return rc;
            } else {
                /* block set, with optional filters */
                if (!(n = mk(p, S_SETBLOCK, k)))
                    return NOMEM_P(p);
                n->name = names.v[0];
                struct node *holder = NULL;
                if (is_op(pk(p), '|')) {
                    if (!(holder = mk(p, E_LIT, pk(p))))
                        return NOMEM_P(p);
                    holder->lit.t = V_UNDEF;
                    struct node *f = holder;
                    if ((rc = parse_filter_expr(p, &f)))
                        return rc;
                    n->a = f;
                    n->c = holder;
                }
                static const char *const se[] = { "endset", NULL };
                const char *f = NULL;
                if ((rc = expect_bend(p)) || (rc = parse_body(p, &n->b, se, &f))
                    || (rc = expect_bend(p)))
                    return rc;
            }
        }
    } else if (is_name(k, "macro")) {
        p->i++;
        struct tok *t = pk(p);
        if (t->t != T_NAME)
            return p_fail(p, t, "expected a macro name");
        if (!(n = mk(p, S_MACRO, k)) || !(n->name = tokname(p, t)))
            return NOMEM_P(p);
        p->i++;
        if ((rc = expect_op(p, '(')))
            return rc;
        struct svec names = { 0 };
        struct nvec defs = { 0 };
        while (!is_op(pk(p), ')')) {
            struct tok *a = pk(p);
            if (a->t != T_NAME)
                return p_fail(p, a, "expected a parameter name");
            const char *nm = tokname(p, a);
            if (!nm || sv_push(p, &names, nm))
                return NOMEM_P(p);
            p->i++;
            struct node *d = NULL;
            if (is_op(pk(p), '=')) {
                p->i++;
                if ((rc = parse_expr(p, &d)))
                    return rc;
            }
            if (nv_push(p, &defs, d))
                return NOMEM_P(p);
            if (is_op(pk(p), ','))
                p->i++;
            else if (!is_op(pk(p), ')'))
                return p_fail(p, pk(p), "expected ',' or ')' in macro parameters");
        }
        p->i++;
        n->kw_names = names.v;
        n->kw = defs.v;
        n->n_kw = names.n;
        static const char *const me[] = { "endmacro", NULL };
        const char *f = NULL;
        if ((rc = expect_bend(p)) || (rc = parse_body(p, &n->b, me, &f)))
            return rc;
        if (pk(p)->t == T_NAME)
            p->i++; /* {% endmacro name %} */
        if ((rc = expect_bend(p)))
            return rc;
    } else if (is_name(k, "call")) {
        p->i++;
        if (!(n = mk(p, S_CALLBLOCK, k)))
            return NOMEM_P(p);
        struct svec names = { 0 };
        struct nvec defs = { 0 };
        if (is_op(pk(p), '(')) {
            p->i++;
            while (!is_op(pk(p), ')')) {
                struct tok *a = pk(p);
                if (a->t != T_NAME)
                    return p_fail(p, a, "expected a parameter name");
                const char *nm = tokname(p, a);
                if (!nm || sv_push(p, &names, nm) || nv_push(p, &defs, NULL))
                    return NOMEM_P(p);
                p->i++;
                if (is_op(pk(p), '=')) {
                    p->i++;
                    if ((rc = parse_expr(p, &defs.v[defs.n - 1])))
                        return rc;
                }
                if (is_op(pk(p), ','))
                    p->i++;
            }
            p->i++;
        }
        n->kw_names = names.v;
        n->kw = defs.v;
        n->n_kw = names.n;
        if ((rc = parse_expr(p, &n->a)))
            return rc;
        if (n->a->kind != E_CALL)
            return p_fail(p, k, "expected a macro call after 'call'");
        static const char *const ce[] = { "endcall", NULL };
        const char *f = NULL;
        if ((rc = expect_bend(p)) || (rc = parse_body(p, &n->b, ce, &f)) || (rc = expect_bend(p)))
            return rc;
    } else if (is_name(k, "filter")) {
        p->i++;
        if (!(n = mk(p, S_FILTERBLOCK, k)))
            return NOMEM_P(p);
        struct node *holder = mk(p, E_LIT, k);
        if (!holder)
            return NOMEM_P(p);
        holder->lit.t = V_UNDEF;
        /* "filter upper | trim": parse as if it were "x|upper|trim" */
        struct tok *nk = pk(p);
        if (nk->t != T_NAME)
            return p_fail(p, nk, "expected a filter name");
        struct node *f = mk(p, E_FILTER, nk);
        if (!f || !(f->name = tokname(p, nk)))
            return NOMEM_P(p);
        f->unknown = !name_in(filter_names, nk->s, nk->n);
        p->i++;
        if (is_op(pk(p), '(')) {
            p->i++;
            if ((rc = parse_args(p, f)))
                return rc;
        }
        f->a = holder;
        if ((rc = parse_filter_expr(p, &f)))
            return rc;
        n->a = f;
        n->c = holder;
        static const char *const fe[] = { "endfilter", NULL };
        const char *fo = NULL;
        if ((rc = expect_bend(p)) || (rc = parse_body(p, &n->b, fe, &fo)) || (rc = expect_bend(p)))
            return rc;
    } else if (is_name(k, "with")) {
        /* {% with a = x, b = y %}...{% endwith %}: a scope with those names */
        p->i++;
        if (!(n = mk(p, S_WITH, k)))
            return NOMEM_P(p);
        struct svec names = { 0 };
        struct nvec vals = { 0 };
        while (pk(p)->t == T_NAME) {
            struct tok *a = pk(p);
            const char *nm = tokname(p, a);
            if (!nm || sv_push(p, &names, nm))
                return NOMEM_P(p);
            p->i++;
            struct node *v;
            if ((rc = expect_op(p, '=')) || (rc = parse_expr(p, &v)))
                return rc;
            if (nv_push(p, &vals, v))
                return NOMEM_P(p);
            if (!is_op(pk(p), ','))
                break;
            p->i++;
        }
        n->kw_names = names.v;
        n->kw = vals.v;
        n->n_kw = names.n;
        static const char *const we[] = { "endwith", NULL };
        const char *f = NULL;
        if ((rc = expect_bend(p)) || (rc = parse_body(p, &n->b, we, &f)) || (rc = expect_bend(p)))
            return rc;
    } else if (is_name(k, "generation")) {
        /* transformers' AssistantTracker extension: renders its body unchanged */
        p->i++;
        static const char *const ge[] = { "endgeneration", NULL };
        const char *f = NULL;
        if ((rc = expect_bend(p)) || (rc = parse_body(p, &n, ge, &f)) || (rc = expect_bend(p)))
            return rc;
    } else if (is_name(k, "break") || is_name(k, "continue")) {
        p->i++;
        if (!(n = mk(p, is_name(k, "break") ? S_BREAK : S_CONTINUE, k)))
            return NOMEM_P(p);
        if ((rc = expect_bend(p)))
            return rc;
    } else {
        return p_fail(p, k, "unknown statement '%.*s'", (int)k->n, k->s);
    }
    *out = n;
    return 0;
}

static int parse_body(struct parser *p, struct node **out, const char *const *ends,
                      const char **found)
{
    struct nvec items = { 0 };
    int rc;
    struct tok *start = pk(p);
    struct node *body = mk(p, S_BODY, start);
    if (!body)
        return NOMEM_P(p);
    if (++p->depth > PARSE_MAX_DEPTH)
        return strata_err_set(p->err, STRATA_E_LIMIT,
                              "template '%s' line %d column %d: blocks nested too deeply",
                              p->name, start->line, start->col);
    for (;;) {
        struct tok *k = pk(p);
        struct node *n = NULL;
        if (k->t == T_EOF) {
            if (ends) {
                /* name the innermost open block */
                int last = 0;
                while (ends[last + 1])
                    last++;
                return p_fail(p, k, "unexpected end of template, expected '%s'", ends[last]);
            }
            break;
        }
        if (k->t == T_TEXT) {
            if (!(n = mk(p, S_TEXT, k)))
                return NOMEM_P(p);
            n->name = k->s;
            n->name_len = k->n;
            p->i++;
        } else if (k->t == T_VBEGIN) {
            p->i++;
            if (!(n = mk(p, S_OUT, k)))
                return NOMEM_P(p);
            if ((rc = parse_expr(p, &n->a)))
                return rc;
            if (pk(p)->t != T_VEND)
                return p_fail(p, pk(p), "expected end of print statement '}}'");
            p->i++;
        } else if (k->t == T_BBEGIN) {
            p->i++;
            int is_end = 0;
            if ((rc = parse_stmt(p, &n, ends, found, &is_end)))
                return rc;
            if (is_end)
                break;
        } else {
            return p_fail(p, k, "unexpected token");
        }
        if (nv_push(p, &items, n))
            return NOMEM_P(p);
    }
    p->depth--;
    body->args = items.v;
    body->n_args = items.n;
    *out = body;
    return 0;
}

/* ---------------------------------------------------------------- evaluator */

struct buf {
    char *p;
    size_t n, cap;
};

struct scope {
    struct scope *parent;
    struct dict vars;
};

struct ctx {
    struct arena ar;
    const struct strata_jinja *t;
    struct strata_err *err;
    struct strata_jinja_limits lim;
    time_t now;
    uint64_t steps, iters;
    int depth, call_depth, edepth;
    struct buf *out;
    int brk; /* 1 break, 2 continue */
    struct val hole; /* the value a block-level filter applies to */
    struct val pending_caller;
};

static int rt_fail(struct ctx *c, const struct node *n, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int rt_fail(struct ctx *c, const struct node *n, int code, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n)
        return strata_err_set(c->err, code, "template '%s' line %d column %d: %s", c->t->name,
                              n->line, n->col, msg);
    return strata_err_set(c->err, code, "template '%s': %s", c->t->name, msg);
}

static int oom(struct ctx *c, const struct node *n)
{
    if (c->ar.capped)
        return rt_fail(c, n, STRATA_E_LIMIT, "template used more than %zu bytes of memory",
                       c->lim.max_memory);
    return rt_fail(c, n, STRATA_E_NOMEM, "out of memory");
}

static void *xalloc(struct ctx *c, size_t n) { return arena_alloc(&c->ar, n); }

static int buf_add(struct ctx *c, const struct node *at, struct buf *b, const char *s, size_t n)
{
    if (n == 0)
        return 0;
    if (b->n + n > c->lim.max_output)
        return rt_fail(c, at, STRATA_E_LIMIT, "rendered output exceeds %zu bytes",
                       c->lim.max_output);
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1)
            nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np)
            return rt_fail(c, at, STRATA_E_NOMEM, "out of memory");
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static int buf_addc(struct ctx *c, const struct node *at, struct buf *b, char ch)
{
    return buf_add(c, at, b, &ch, 1);
}

static int buf_addf(struct ctx *c, const struct node *at, struct buf *b, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int buf_addf(struct ctx *c, const struct node *at, struct buf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0)
        k = 0;
    return buf_add(c, at, b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

static struct val mkint(int64_t i) { struct val v = { .t = V_INT }; v.u.i = i; return v; }
static struct val mkbool(int b) { struct val v = { .t = V_BOOL }; v.u.i = !!b; return v; }
static struct val mkfloat(double f) { struct val v = { .t = V_FLOAT }; v.u.f = f; return v; }

static int mkstr(struct ctx *c, const struct node *at, const char *s, size_t n, struct val *out)
{
    char *p = xalloc(c, n + 1);
    if (!p)
        return oom(c, at);
    memcpy(p, s, n);
    p[n] = 0;
    out->t = V_STR;
    out->n = n;
    out->u.s = p;
    return 0;
}

static struct val strlit(const char *s)
{
    struct val v = { .t = V_STR };
    v.u.s = s;
    v.n = strlen(s);
    return v;
}

static struct val undef_hint(const char *hint)
{
    struct val v = { .t = V_UNDEF };
    v.u.s = hint;
    return v;
}

static int mklist(struct ctx *c, const struct node *at, size_t cap, struct val *out)
{
    struct list *l = xalloc(c, sizeof *l);
    if (!l)
        return oom(c, at);
    l->n = 0;
    l->cap = cap;
    l->v = NULL;
    l->tuple = 0;
    if (cap && !(l->v = xalloc(c, cap * sizeof *l->v)))
        return oom(c, at);
    out->t = V_LIST;
    out->u.l = l;
    return 0;
}

static int list_push(struct ctx *c, const struct node *at, struct list *l, struct val v)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        struct val *nv = xalloc(c, nc * sizeof *nv);
        if (!nv)
            return oom(c, at);
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = v;
    return 0;
}

static int mkdict(struct ctx *c, const struct node *at, int type, struct val *out)
{
    struct dict *d = xalloc(c, sizeof *d);
    if (!d)
        return oom(c, at);
    memset(d, 0, sizeof *d);
    out->t = (unsigned char)type;
    out->u.d = d;
    return 0;
}

static int is_num(const struct val *v) { return v->t == V_INT || v->t == V_BOOL || v->t == V_FLOAT; }
static double num_f(const struct val *v) { return v->t == V_FLOAT ? v->u.f : (double)v->u.i; }

static int val_eq(const struct val *a, const struct val *b);

static int dict_find(const struct dict *d, const struct val *k)
{
    if (k->t == V_STR) {
        for (size_t i = 0; i < d->n; i++)
            if (d->k[i].t == V_STR && d->k[i].n == k->n && memcmp(d->k[i].u.s, k->u.s, k->n) == 0)
                return (int)i;
        return -1;
    }
    for (size_t i = 0; i < d->n; i++)
        if (val_eq(&d->k[i], k))
            return (int)i;
    return -1;
}

static int dict_find_cstr(const struct dict *d, const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == V_STR && d->k[i].n == n && memcmp(d->k[i].u.s, s, n) == 0)
            return (int)i;
    return -1;
}

static int dict_set(struct ctx *c, const struct node *at, struct dict *d, struct val k,
                    struct val v)
{
    int i = dict_find(d, &k);
    if (i >= 0) {
        d->v[i] = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 8;
        struct val *nk = xalloc(c, nc * sizeof *nk), *nv = xalloc(c, nc * sizeof *nv);
        if (!nk || !nv)
            return oom(c, at);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return 0;
}

/* Values built by a template can nest arbitrarily deep ({% set ns.l = [ns.l] %} in a
 * loop); comparisons stop descending here instead of exhausting the C stack. */
#define CMP_MAX_DEPTH 256

static int val_eq_d(const struct val *a, const struct val *b, int depth);

static int val_eq(const struct val *a, const struct val *b)
{
    return val_eq_d(a, b, 0);
}

static int val_eq_d(const struct val *a, const struct val *b, int depth)
{
    if (depth > CMP_MAX_DEPTH)
        return 0;
    if (is_num(a) && is_num(b)) {
        if (a->t != V_FLOAT && b->t != V_FLOAT)
            return a->u.i == b->u.i;
        return num_f(a) == num_f(b);
    }
    if (a->t != b->t)
        return 0;
    switch (a->t) {
    case V_UNDEF:
    case V_NONE:
        return 1;
    case V_STR:
        return a->n == b->n && memcmp(a->u.s, b->u.s, a->n) == 0;
    case V_LIST:
        if (a->u.l->n != b->u.l->n)
            return 0;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!val_eq_d(&a->u.l->v[i], &b->u.l->v[i], depth + 1))
                return 0;
        return 1;
    case V_DICT:
        if (a->u.d->n != b->u.d->n)
            return 0;
        for (size_t i = 0; i < a->u.d->n; i++) {
            int j = dict_find(b->u.d, &a->u.d->k[i]);
            if (j < 0 || !val_eq_d(&a->u.d->v[i], &b->u.d->v[j], depth + 1))
                return 0;
        }
        return 1;
    case V_NS:
    case V_LOOP:
        return a->u.d == b->u.d;
    case V_MACRO:
        return a->u.m == b->u.m;
    case V_FUNC:
        return a->u.i == b->u.i;
    default:
        return 0;
    }
}

static int truthy(const struct val *v)
{
    switch (v->t) {
    case V_UNDEF:
    case V_NONE:
        return 0;
    case V_BOOL:
    case V_INT:
        return v->u.i != 0;
    case V_FLOAT:
        return v->u.f != 0;
    case V_STR:
        return v->n > 0;
    case V_LIST:
        return v->u.l->n > 0;
    case V_DICT:
        return v->u.d->n > 0;
    default:
        return 1;
    }
}

static const char *type_name(const struct val *v)
{
    switch (v->t) {
    case V_UNDEF: return "Undefined";
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "str";
    case V_LIST: return "list";
    case V_DICT: return "dict";
    case V_NS: return "Namespace";
    case V_MACRO: return "Macro";
    case V_FUNC: return "builtin_function_or_method";
    case V_LOOP: return "LoopContext";
    }
    return "object";
}

/* --- UTF-8 helpers */

static size_t u8_len(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            k++;
    return k;
}

static int is_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80)
            return 0;
    return 1;
}

/* byte offset of code point index ci (clamped to n) */
static size_t u8_off(const char *s, size_t n, size_t ci)
{
    size_t i = 0;
    while (i < n && ci > 0) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80)
            i++;
        ci--;
    }
    return i;
}

/* decode one code point at s[*i], advancing; invalid bytes decode as themselves */
static int32_t u8_next(const char *s, size_t n, size_t *i)
{
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + *i,
                                          (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) {
        cp = (unsigned char)s[*i];
        k = 1;
    }
    *i += (size_t)k;
    return cp;
}

static int py_isspace(int32_t cp)
{
    if (cp == ' ' || (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85)
        return 1;
    if (cp < 0x80)
        return 0;
    utf8proc_category_t cat = utf8proc_category(cp);
    return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL
        || cat == UTF8PROC_CATEGORY_ZP;
}

static int py_isalnum(int32_t cp)
{
    if (cp < 0x80)
        return isalnum(cp) || cp == '_';
    utf8proc_category_t cat = utf8proc_category(cp);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO)
        || (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

static int py_isalpha(int32_t cp)
{
    if (cp < 0x80)
        return isalpha(cp);
    utf8proc_category_t cat = utf8proc_category(cp);
    return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}

/* case mapping; mode 0 lower, 1 upper, 2 capitalize, 3 str.title, 4 jinja title */
static int case_map(struct ctx *c, const struct node *at, const struct val *s, int mode,
                    struct val *out)
{
    size_t cap = s->n * 3 + 8;
    char *p = xalloc(c, cap);
    if (!p)
        return oom(c, at);
    size_t i = 0, o = 0;
    int prev_cased = 0, first = 1, word_start = 1;
    while (i < s->n) {
        int32_t cp = u8_next(s->u.s, s->n, &i);
        int32_t m = cp;
        switch (mode) {
        case 0: m = utf8proc_tolower(cp); break;
        case 1: m = utf8proc_toupper(cp); break;
        case 2: m = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp); break;
        case 3:
            m = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
            prev_cased = py_isalpha(cp);
            break;
        case 4:
            if (cp == '-' || py_isspace(cp) || cp == '(' || cp == '{' || cp == '['
                || cp == '<') {
                word_start = 1;
            } else {
                m = word_start ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
                word_start = 0;
            }
            break;
        }
        first = 0;
        utf8proc_ssize_t w = utf8proc_encode_char(m, (utf8proc_uint8_t *)p + o);
        o += (size_t)(w > 0 ? w : 0);
    }
    p[o] = 0;
    out->t = V_STR;
    out->u.s = p;
    out->n = o;
    return 0;
}

/* --- printing: Python str() and repr() */

static int fmt_float(char *dst, size_t cap, double f)
{
    if (isnan(f))
        return snprintf(dst, cap, "nan");
    if (isinf(f))
        return snprintf(dst, cap, f < 0 ? "-inf" : "inf");
    char digs[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(digs, sizeof digs, "%.*e", prec - 1, f);
        if (strtod(digs, NULL) == f)
            break;
    }
    /* digs: [-]d.ddde[+-]XX */
    int neg = digs[0] == '-';
    const char *d = digs + neg;
    char mant[32];
    int mn = 0;
    const char *e = strchr(d, 'e');
    for (const char *q = d; q < e; q++)
        if (*q != '.')
            mant[mn++] = *q;
    mant[mn] = 0;
    while (mn > 1 && mant[mn - 1] == '0')
        mant[--mn] = 0;
    int exp = atoi(e + 1);
    char out[64];
    int o = 0;
    if (neg)
        out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -exp - 1; i++)
                out[o++] = '0';
            for (int i = 0; i < mn; i++)
                out[o++] = mant[i];
        } else {
            for (int i = 0; i <= exp; i++)
                out[o++] = i < mn ? mant[i] : '0';
            out[o++] = '.';
            if (mn > exp + 1)
                for (int i = exp + 1; i < mn; i++)
                    out[o++] = mant[i];
            else
                out[o++] = '0';
        }
        out[o] = 0;
    } else {
        out[o++] = mant[0];
        if (mn > 1) {
            out[o++] = '.';
            for (int i = 1; i < mn; i++)
                out[o++] = mant[i];
        }
        o += snprintf(out + o, sizeof out - (size_t)o, "e%c%02d", exp < 0 ? '-' : '+',
                      exp < 0 ? -exp : exp);
    }
    return snprintf(dst, cap, "%s", out);
}

static int write_val(struct ctx *c, const struct node *at, struct buf *b, const struct val *v,
                     int repr);

static int write_repr_str(struct ctx *c, const struct node *at, struct buf *b, const char *s,
                          size_t n)
{
    char q = '\'';
    if (memchr(s, '\'', n) && !memchr(s, '"', n))
        q = '"';
    int rc = buf_addc(c, at, b, q);
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == (unsigned char)q || ch == '\\') {
            char e[2] = { '\\', (char)ch };
            rc = buf_add(c, at, b, e, 2);
        } else if (ch == '\n') {
            rc = buf_add(c, at, b, "\\n", 2);
        } else if (ch == '\r') {
            rc = buf_add(c, at, b, "\\r", 2);
        } else if (ch == '\t') {
            rc = buf_add(c, at, b, "\\t", 2);
        } else if (ch < 0x20 || ch == 0x7f) {
            rc = buf_addf(c, at, b, "\\x%02x", ch);
        } else {
            rc = buf_addc(c, at, b, (char)ch);
        }
    }
    return rc ? rc : buf_addc(c, at, b, q);
}

static int write_val(struct ctx *c, const struct node *at, struct buf *b, const struct val *v,
                     int repr)
{
    char tmp[64];
    int rc = 0;
    if ((v->t == V_LIST || v->t == V_DICT || v->t == V_NS) && repr > c->lim.max_depth)
        return rt_fail(c, at, STRATA_E_LIMIT, "value nested too deeply to print (a cycle?)");
    switch (v->t) {
    case V_UNDEF:
        return 0;
    case V_NONE:
        return buf_add(c, at, b, "None", 4);
    case V_BOOL:
        return v->u.i ? buf_add(c, at, b, "True", 4) : buf_add(c, at, b, "False", 5);
    case V_INT:
        return buf_addf(c, at, b, "%lld", (long long)v->u.i);
    case V_FLOAT:
        fmt_float(tmp, sizeof tmp, v->u.f);
        return buf_add(c, at, b, tmp, strlen(tmp));
    case V_STR:
        return repr ? write_repr_str(c, at, b, v->u.s, v->n) : buf_add(c, at, b, v->u.s, v->n);
    case V_LIST:
        rc = buf_addc(c, at, b, v->u.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v->u.l->n && !rc; i++) {
            if (i)
                rc = buf_add(c, at, b, ", ", 2);
            if (!rc)
                rc = write_val(c, at, b, &v->u.l->v[i], repr + 1);
        }
        if (!rc && v->u.l->tuple && v->u.l->n == 1)
            rc = buf_addc(c, at, b, ',');
        return rc ? rc : buf_addc(c, at, b, v->u.l->tuple ? ')' : ']');
    case V_DICT:
    case V_NS:
        if (v->t == V_NS)
            rc = buf_add(c, at, b, "<Namespace ", 11);
        if (!rc)
            rc = buf_addc(c, at, b, '{');
        for (size_t i = 0; i < v->u.d->n && !rc; i++) {
            if (i)
                rc = buf_add(c, at, b, ", ", 2);
            if (!rc)
                rc = write_val(c, at, b, &v->u.d->k[i], repr + 1);
            if (!rc)
                rc = buf_add(c, at, b, ": ", 2);
            if (!rc)
                rc = write_val(c, at, b, &v->u.d->v[i], repr + 1);
        }
        if (!rc)
            rc = buf_addc(c, at, b, '}');
        if (!rc && v->t == V_NS)
            rc = buf_addc(c, at, b, '>');
        return rc;
    case V_MACRO:
        return buf_addf(c, at, b, "<Macro '%s'>", v->u.m->def->name);
    case V_FUNC:
        return buf_add(c, at, b, "<built-in function>", 19);
    case V_LOOP:
        return buf_add(c, at, b, "<LoopContext>", 13);
    }
    return 0;
}

static int to_str(struct ctx *c, const struct node *at, const struct val *v, struct val *out)
{
    if (v->t == V_STR) {
        *out = *v;
        return 0;
    }
    if (v->t == V_UNDEF) {
        *out = strlit("");
        return 0;
    }
    struct buf b = { 0 };
    int rc = write_val(c, at, &b, v, 0);
    if (!rc)
        rc = mkstr(c, at, b.p ? b.p : "", b.n, out);
    free(b.p);
    return rc;
}

/* --- JSON (Python json.dumps) */

struct jopts {
    int indent; /* -1: none */
    const char *indent_str;
    const char *item_sep, *key_sep;
    int ensure_ascii, sort_keys;
};

static int json_str(struct ctx *c, const struct node *at, struct buf *b, const char *s, size_t n,
                    int ensure_ascii)
{
    int rc = buf_addc(c, at, b, '"');
    size_t i = 0;
    while (i < n && !rc) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"') { rc = buf_add(c, at, b, "\\\"", 2); i++; }
        else if (ch == '\\') { rc = buf_add(c, at, b, "\\\\", 2); i++; }
        else if (ch == '\n') { rc = buf_add(c, at, b, "\\n", 2); i++; }
        else if (ch == '\r') { rc = buf_add(c, at, b, "\\r", 2); i++; }
        else if (ch == '\t') { rc = buf_add(c, at, b, "\\t", 2); i++; }
        else if (ch == '\b') { rc = buf_add(c, at, b, "\\b", 2); i++; }
        else if (ch == '\f') { rc = buf_add(c, at, b, "\\f", 2); i++; }
        else if (ch < 0x20) { rc = buf_addf(c, at, b, "\\u%04x", ch); i++; }
        else if (ch < 0x80 || !ensure_ascii) {
            size_t j = i + 1;
            while (j < n && (unsigned char)s[j] >= 0x20 && s[j] != '"' && s[j] != '\\'
                   && ((unsigned char)s[j] < 0x80 || !ensure_ascii))
                j++;
            rc = buf_add(c, at, b, s + i, j - i);
            i = j;
        } else {
            int32_t cp = u8_next(s, n, &i);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                rc = buf_addf(c, at, b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                              0xDC00 + (cp & 0x3FF));
            } else {
                rc = buf_addf(c, at, b, "\\u%04x", cp);
            }
        }
    }
    return rc ? rc : buf_addc(c, at, b, '"');
}

static int json_nl(struct ctx *c, const struct node *at, struct buf *b, const struct jopts *o,
                   int level)
{
    int rc = buf_addc(c, at, b, '\n');
    for (int i = 0; i < level && !rc; i++) {
        if (o->indent_str)
            rc = buf_add(c, at, b, o->indent_str, strlen(o->indent_str));
        else
            for (int k = 0; k < o->indent && !rc; k++)
                rc = buf_addc(c, at, b, ' ');
    }
    return rc;
}


static void msort(struct val *items, struct val *keys, struct val *ti, struct val *tk, size_t n,
                  int ci, int reverse);

static int json_write(struct ctx *c, const struct node *at, struct buf *b, const struct val *v,
                      const struct jopts *o, int level)
{
    char tmp[64];
    int rc = 0;
    if (level > c->lim.max_depth)
        return rt_fail(c, at, STRATA_E_LIMIT, "tojson: value nested too deeply");
    switch (v->t) {
    case V_NONE:
        return buf_add(c, at, b, "null", 4);
    case V_BOOL:
        return v->u.i ? buf_add(c, at, b, "true", 4) : buf_add(c, at, b, "false", 5);
    case V_INT:
        return buf_addf(c, at, b, "%lld", (long long)v->u.i);
    case V_FLOAT:
        if (isnan(v->u.f))
            return buf_add(c, at, b, "NaN", 3);
        if (isinf(v->u.f))
            return v->u.f < 0 ? buf_add(c, at, b, "-Infinity", 9)
                              : buf_add(c, at, b, "Infinity", 8);
        fmt_float(tmp, sizeof tmp, v->u.f);
        return buf_add(c, at, b, tmp, strlen(tmp));
    case V_STR:
        return json_str(c, at, b, v->u.s, v->n, o->ensure_ascii);
    case V_LIST:
        if (v->u.l->n == 0)
            return buf_add(c, at, b, "[]", 2);
        rc = buf_addc(c, at, b, '[');
        for (size_t i = 0; i < v->u.l->n && !rc; i++) {
            if (i)
                rc = buf_add(c, at, b, o->item_sep, strlen(o->item_sep));
            if (!rc && o->indent >= 0)
                rc = json_nl(c, at, b, o, level + 1);
            if (!rc)
                rc = json_write(c, at, b, &v->u.l->v[i], o, level + 1);
        }
        if (!rc && o->indent >= 0)
            rc = json_nl(c, at, b, o, level);
        return rc ? rc : buf_addc(c, at, b, ']');
    case V_DICT: {
        struct dict *d = v->u.d;
        if (d->n == 0)
            return buf_add(c, at, b, "{}", 2);
        if (o->sort_keys) {
            struct dict *sd = xalloc(c, sizeof *sd);
            struct val *ks = xalloc(c, d->n * sizeof *ks), *vs = xalloc(c, d->n * sizeof *vs);
            struct val *t1 = xalloc(c, d->n * sizeof *t1), *t2 = xalloc(c, d->n * sizeof *t2);
            if (!sd || !ks || !vs || !t1 || !t2)
                return oom(c, at);
            memcpy(ks, d->k, d->n * sizeof *ks);
            memcpy(vs, d->v, d->n * sizeof *vs);
            msort(vs, ks, t1, t2, d->n, 0, 0);
            sd->n = sd->cap = d->n;
            sd->k = ks;
            sd->v = vs;
            d = sd;
        }
        rc = buf_addc(c, at, b, '{');
        for (size_t i = 0; i < d->n && !rc; i++) {
            if (i)
                rc = buf_add(c, at, b, o->item_sep, strlen(o->item_sep));
            if (!rc && o->indent >= 0)
                rc = json_nl(c, at, b, o, level + 1);
            const struct val *k = &d->k[i];
            if (rc)
                break;
            if (k->t == V_STR) {
                rc = json_str(c, at, b, k->u.s, k->n, o->ensure_ascii);
            } else if (k->t == V_INT || k->t == V_FLOAT || k->t == V_BOOL || k->t == V_NONE) {
                struct buf kb = { 0 };
                rc = json_write(c, at, &kb, k, o, level + 1);
                if (!rc) {
                    rc = buf_addc(c, at, b, '"');
                    if (!rc)
                        rc = buf_add(c, at, b, kb.p, kb.n);
                    if (!rc)
                        rc = buf_addc(c, at, b, '"');
                }
                free(kb.p);
            } else {
                rc = rt_fail(c, at, STRATA_E_INVALID,
                             "tojson: keys must be str, int, float, bool or None, not %s",
                             type_name(k));
            }
            if (!rc)
                rc = buf_add(c, at, b, o->key_sep, strlen(o->key_sep));
            if (!rc)
                rc = json_write(c, at, b, &d->v[i], o, level + 1);
        }
        if (!rc && o->indent >= 0)
            rc = json_nl(c, at, b, o, level);
        return rc ? rc : buf_addc(c, at, b, '}');
    }
    default:
        return rt_fail(c, at, STRATA_E_INVALID, "tojson: Object of type %s is not JSON serializable",
                       type_name(v));
    }
}

/* --- comparisons */

static int val_cmp_d(struct ctx *c, const struct node *at, const struct val *a,
                     const struct val *b, int *res, int depth);

static int val_cmp(struct ctx *c, const struct node *at, const struct val *a, const struct val *b,
                   int *res)
{
    return val_cmp_d(c, at, a, b, res, 0);
}

static int val_cmp_d(struct ctx *c, const struct node *at, const struct val *a,
                     const struct val *b, int *res, int depth)
{
    if (depth > CMP_MAX_DEPTH)
        return rt_fail(c, at, STRATA_E_LIMIT, "values nested too deeply to compare");
    if (is_num(a) && is_num(b)) {
        if (a->t != V_FLOAT && b->t != V_FLOAT)
            *res = a->u.i < b->u.i ? -1 : a->u.i > b->u.i;
        else
            *res = num_f(a) < num_f(b) ? -1 : num_f(a) > num_f(b);
        return 0;
    }
    if (a->t == V_STR && b->t == V_STR) {
        size_t m = a->n < b->n ? a->n : b->n;
        int r = memcmp(a->u.s, b->u.s, m);
        *res = r ? (r < 0 ? -1 : 1) : (a->n < b->n ? -1 : a->n > b->n);
        return 0;
    }
    if (a->t == V_LIST && b->t == V_LIST) {
        size_t m = a->u.l->n < b->u.l->n ? a->u.l->n : b->u.l->n;
        for (size_t i = 0; i < m; i++) {
            if (val_eq(&a->u.l->v[i], &b->u.l->v[i]))
                continue;
            return val_cmp_d(c, at, &a->u.l->v[i], &b->u.l->v[i], res, depth + 1);
        }
        *res = a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n;
        return 0;
    }
    if (a->t == V_UNDEF || b->t == V_UNDEF)
        return rt_fail(c, at, STRATA_E_INVALID, "%s",
                       (a->t == V_UNDEF ? a : b)->u.s ? (a->t == V_UNDEF ? a : b)->u.s
                                                      : "comparison with an undefined value");
    return rt_fail(c, at, STRATA_E_INVALID,
                   "'<' not supported between instances of '%s' and '%s'", type_name(a),
                   type_name(b));
}

/* plain comparison for sorting (no errors: incomparable types order by type) */
static int sort_cmp_d(const struct val *a, const struct val *b, int ci, int depth);

static int sort_cmp_plain(const struct val *a, const struct val *b, int ci)
{
    return sort_cmp_d(a, b, ci, 0);
}

static int sort_cmp_d(const struct val *a, const struct val *b, int ci, int depth)
{
    if (depth > CMP_MAX_DEPTH)
        return 0;
    if (is_num(a) && is_num(b))
        return num_f(a) < num_f(b) ? -1 : num_f(a) > num_f(b);
    if (a->t == V_STR && b->t == V_STR) {
        size_t m = a->n < b->n ? a->n : b->n;
        int r = 0;
        if (ci) {
            for (size_t i = 0; i < m && !r; i++)
                r = tolower((unsigned char)a->u.s[i]) - tolower((unsigned char)b->u.s[i]);
        } else {
            r = memcmp(a->u.s, b->u.s, m);
        }
        return r ? (r < 0 ? -1 : 1) : (a->n < b->n ? -1 : a->n > b->n);
    }
    if (a->t == V_LIST && b->t == V_LIST) {
        size_t m = a->u.l->n < b->u.l->n ? a->u.l->n : b->u.l->n;
        for (size_t i = 0; i < m; i++) {
            int r = sort_cmp_d(&a->u.l->v[i], &b->u.l->v[i], ci, depth + 1);
            if (r)
                return r;
        }
        return a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n;
    }
    return a->t < b->t ? -1 : a->t > b->t;
}

/* Stable merge sort of items[0..n) by keys[0..n) (Python's sort is stable). */
static void msort(struct val *items, struct val *keys, struct val *ti, struct val *tk, size_t n,
                  int ci, int reverse)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    msort(items, keys, ti, tk, h, ci, reverse);
    msort(items + h, keys + h, ti, tk, n - h, ci, reverse);
    size_t i = 0, j = h, o = 0;
    while (i < h || j < n) {
        int take_right;
        if (i >= h)
            take_right = 1;
        else if (j >= n)
            take_right = 0;
        else {
            int r = sort_cmp_plain(&keys[j], &keys[i], ci);
            take_right = reverse ? r > 0 : r < 0;
        }
        size_t k = take_right ? j++ : i++;
        ti[o] = items[k];
        tk[o] = keys[k];
        o++;
    }
    memcpy(items, ti, n * sizeof *items);
    memcpy(keys, tk, n * sizeof *keys);
}

/* ---------------------------------------------------------------- evaluation */

static int eval(struct ctx *c, struct scope *sc, const struct node *n, struct val *out);
static int exec_body(struct ctx *c, struct scope *sc, const struct node *body);

static int step(struct ctx *c, const struct node *n)
{
    if (++c->steps > c->lim.max_steps)
        return rt_fail(c, n, STRATA_E_LIMIT, "template exceeded %llu evaluation steps",
                       (unsigned long long)c->lim.max_steps);
    return 0;
}

static int lookup(struct scope *sc, const char *name, struct val *out)
{
    size_t n = strlen(name);
    for (; sc; sc = sc->parent) {
        struct dict *d = &sc->vars;
        for (size_t i = d->n; i-- > 0;)
            if (d->k[i].n == n && memcmp(d->k[i].u.s, name, n) == 0) {
                *out = d->v[i];
                return 1;
            }
    }
    return 0;
}

static int scope_set(struct ctx *c, const struct node *at, struct scope *sc, const char *name,
                     struct val v)
{
    return dict_set(c, at, &sc->vars, strlit(name), v);
}

static int undefined_error(struct ctx *c, const struct node *at, const struct val *u)
{
    return rt_fail(c, at, STRATA_E_INVALID, "%s",
                   u->u.s ? u->u.s : "value is undefined");
}

static int make_hint(struct ctx *c, const struct node *at, const struct val *obj,
                     const char *attr, struct val *out)
{
    char msg[256];
    snprintf(msg, sizeof msg, "'%s object' has no attribute '%s'", type_name(obj), attr);
    char *p = arena_strdup(&c->ar, msg, strlen(msg));
    if (!p)
        return oom(c, at);
    *out = undef_hint(p);
    return 0;
}

static int iterate(struct ctx *c, const struct node *at, const struct val *v, struct list **out)
{
    struct val lv;
    int rc;
    switch (v->t) {
    case V_LIST:
        *out = v->u.l;
        return 0;
    case V_UNDEF:
        if ((rc = mklist(c, at, 0, &lv)))
            return rc;
        *out = lv.u.l;
        return 0;
    case V_DICT:
        if ((rc = mklist(c, at, v->u.d->n, &lv)))
            return rc;
        for (size_t i = 0; i < v->u.d->n; i++)
            lv.u.l->v[i] = v->u.d->k[i];
        lv.u.l->n = v->u.d->n;
        *out = lv.u.l;
        return 0;
    case V_STR: {
        if ((rc = mklist(c, at, v->n, &lv)))
            return rc;
        size_t i = 0;
        while (i < v->n) {
            size_t b = i;
            u8_next(v->u.s, v->n, &i);
            struct val ch;
            if ((rc = mkstr(c, at, v->u.s + b, i - b, &ch)))
                return rc;
            lv.u.l->v[lv.u.l->n++] = ch;
        }
        *out = lv.u.l;
        return 0;
    }
    default:
        return rt_fail(c, at, STRATA_E_INVALID, "'%s' object is not iterable", type_name(v));
    }
}

static int val_length(const struct val *v, int64_t *len)
{
    switch (v->t) {
    case V_UNDEF: *len = 0; return 0;
    case V_STR: *len = (int64_t)u8_len(v->u.s, v->n); return 0;
    case V_LIST: *len = (int64_t)v->u.l->n; return 0;
    case V_DICT: *len = (int64_t)v->u.d->n; return 0;
    default: return -1;
    }
}

static int contains(struct ctx *c, const struct node *at, const struct val *needle,
                    const struct val *hay, int *res)
{
    switch (hay->t) {
    case V_STR:
        if (needle->t != V_STR)
            return rt_fail(c, at, STRATA_E_INVALID,
                           "'in <string>' requires string as left operand, not %s",
                           type_name(needle));
        *res = needle->n == 0 || memmem(hay->u.s, hay->n, needle->u.s, needle->n) != NULL;
        return 0;
    case V_LIST:
        *res = 0;
        for (size_t i = 0; i < hay->u.l->n && !*res; i++)
            *res = val_eq(needle, &hay->u.l->v[i]);
        return 0;
    case V_DICT:
        *res = dict_find(hay->u.d, needle) >= 0;
        return 0;
    case V_UNDEF:
        *res = 0;
        return 0;
    default:
        return rt_fail(c, at, STRATA_E_INVALID, "argument of type '%s' is not iterable",
                       type_name(hay));
    }
}

static int get_attr(struct ctx *c, const struct node *at, const struct val *obj,
                    const char *name, struct val *out);

static int get_item(struct ctx *c, const struct node *at, const struct val *obj,
                    const struct val *key, struct val *out)
{
    if (obj->t == V_UNDEF)
        return undefined_error(c, at, obj);
    if ((obj->t == V_LIST || obj->t == V_STR) && (key->t == V_INT || key->t == V_BOOL)) {
        int64_t i = key->u.i;
        if (obj->t == V_LIST) {
            int64_t n = (int64_t)obj->u.l->n;
            if (i < 0)
                i += n;
            if (i < 0 || i >= n) {
                *out = undef_hint("list index out of range");
                return 0;
            }
            *out = obj->u.l->v[i];
            return 0;
        }
        int64_t n = (int64_t)u8_len(obj->u.s, obj->n);
        if (i < 0)
            i += n;
        if (i < 0 || i >= n) {
            *out = undef_hint("string index out of range");
            return 0;
        }
        size_t b = u8_off(obj->u.s, obj->n, (size_t)i), e = b;
        u8_next(obj->u.s, obj->n, &e);
        return mkstr(c, at, obj->u.s + b, e - b, out);
    }
    if (obj->t == V_DICT || obj->t == V_NS) {
        int i = dict_find(obj->u.d, key);
        if (i >= 0) {
            *out = obj->u.d->v[i];
            return 0;
        }
    }
    if (key->t == V_STR && obj->t != V_DICT)
        return get_attr(c, at, obj, key->u.s, out);
    if (key->t == V_STR)
        return make_hint(c, at, obj, key->u.s, out);
    *out = undef_hint("no such item");
    return 0;
}

static int get_attr(struct ctx *c, const struct node *at, const struct val *obj,
                    const char *name, struct val *out)
{
    if (obj->t == V_UNDEF)
        return undefined_error(c, at, obj);
    if (obj->t == V_DICT || obj->t == V_NS) {
        int i = dict_find_cstr(obj->u.d, name);
        if (i >= 0) {
            *out = obj->u.d->v[i];
            return 0;
        }
    } else if (obj->t == V_LOOP) {
        struct loopctx *lp = obj->u.lp;
        if (!strcmp(name, "index")) *out = mkint(lp->index0 + 1);
        else if (!strcmp(name, "index0")) *out = mkint(lp->index0);
        else if (!strcmp(name, "revindex")) *out = mkint(lp->length - lp->index0);
        else if (!strcmp(name, "revindex0")) *out = mkint(lp->length - lp->index0 - 1);
        else if (!strcmp(name, "first")) *out = mkbool(lp->index0 == 0);
        else if (!strcmp(name, "last")) *out = mkbool(lp->index0 == lp->length - 1);
        else if (!strcmp(name, "length")) *out = mkint(lp->length);
        else if (!strcmp(name, "depth")) *out = mkint(lp->depth0 + 1);
        else if (!strcmp(name, "depth0")) *out = mkint(lp->depth0);
        else if (!strcmp(name, "previtem"))
            *out = lp->index0 > 0 ? lp->items->v[lp->index0 - 1]
                                  : undef_hint("there is no previous item");
        else if (!strcmp(name, "nextitem"))
            *out = lp->index0 + 1 < lp->length ? lp->items->v[lp->index0 + 1]
                                               : undef_hint("there is no next item");
        else
            return make_hint(c, at, obj, name, out);
        return 0;
    }
    return make_hint(c, at, obj, name, out);
}

/* Python slice semantics over n elements */
static void slice_idx(int64_t n, const struct val *a, const struct val *b, int64_t step,
                      int64_t *start, int64_t *stop)
{
    int has_a = a && a->t != V_NONE && a->t != V_UNDEF;
    int has_b = b && b->t != V_NONE && b->t != V_UNDEF;
    int64_t s, e;
    if (step > 0) {
        s = has_a ? a->u.i : 0;
        e = has_b ? b->u.i : n;
        if (s < 0) { s += n; if (s < 0) s = 0; }
        if (s > n) s = n;
        if (e < 0) { e += n; if (e < 0) e = 0; }
        if (e > n) e = n;
    } else {
        s = has_a ? a->u.i : n - 1;
        e = has_b ? b->u.i : -1 - n;
        if (s < 0) { s += n; if (s < -1) s = -1; }
        if (s >= n) s = n - 1;
        if (e < 0) { e += n; if (e < -1) e = -1; }
        if (e >= n) e = n - 1;
    }
    *start = s;
    *stop = e;
}

static int do_slice(struct ctx *c, const struct node *at, const struct val *obj,
                    const struct val *a, const struct val *b, const struct val *st,
                    struct val *out)
{
    int64_t step = 1;
    if (st && st->t != V_NONE && st->t != V_UNDEF) {
        if (st->t != V_INT)
            return rt_fail(c, at, STRATA_E_INVALID, "slice step must be an integer");
        step = st->u.i;
    }
    if (step == 0)
        return rt_fail(c, at, STRATA_E_INVALID, "slice step cannot be zero");
    if ((a && a->t != V_INT && a->t != V_NONE && a->t != V_UNDEF)
        || (b && b->t != V_INT && b->t != V_NONE && b->t != V_UNDEF))
        return rt_fail(c, at, STRATA_E_INVALID, "slice indices must be integers or None");
    if (obj->t == V_UNDEF)
        return undefined_error(c, at, obj);
    int rc;
    if (obj->t == V_LIST) {
        int64_t n = (int64_t)obj->u.l->n, s, e;
        slice_idx(n, a, b, step, &s, &e);
        if ((rc = mklist(c, at, 0, out)))
            return rc;
        for (int64_t i = s; step > 0 ? i < e : i > e; i += step)
            if ((rc = list_push(c, at, out->u.l, obj->u.l->v[i])))
                return rc;
        return 0;
    }
    if (obj->t == V_STR) {
        int ascii = is_ascii(obj->u.s, obj->n);
        int64_t n = ascii ? (int64_t)obj->n : (int64_t)u8_len(obj->u.s, obj->n), s, e;
        slice_idx(n, a, b, step, &s, &e);
        if (ascii && step == 1)
            return mkstr(c, at, obj->u.s + s, e > s ? (size_t)(e - s) : 0, out);
        /* collect code point offsets */
        size_t *offs = xalloc(c, (size_t)(n + 1) * sizeof *offs);
        char *p = xalloc(c, obj->n + 1);
        if (!offs || !p)
            return oom(c, at);
        size_t i = 0;
        for (int64_t k = 0; k < n; k++) {
            offs[k] = i;
            u8_next(obj->u.s, obj->n, &i);
        }
        offs[n] = obj->n;
        size_t o = 0;
        for (int64_t k = s; step > 0 ? k < e : k > e; k += step) {
            memcpy(p + o, obj->u.s + offs[k], offs[k + 1] - offs[k]);
            o += offs[k + 1] - offs[k];
        }
        p[o] = 0;
        out->t = V_STR;
        out->u.s = p;
        out->n = o;
        return 0;
    }
    return rt_fail(c, at, STRATA_E_INVALID, "'%s' object is not subscriptable", type_name(obj));
}

/* arguments of a call, evaluated */
struct args {
    int n, nk;
    struct val *v;
    const char **kn;
    struct val *kv;
};

static int eval_args(struct ctx *c, struct scope *sc, const struct node *n, struct args *a)
{
    int rc;
    a->n = n->n_args;
    a->nk = n->n_kw;
    a->v = NULL;
    a->kv = NULL;
    a->kn = n->kw_names;
    if (a->n && !(a->v = xalloc(c, (size_t)a->n * sizeof *a->v)))
        return oom(c, n);
    if (a->nk && !(a->kv = xalloc(c, (size_t)a->nk * sizeof *a->kv)))
        return oom(c, n);
    for (int i = 0; i < a->n; i++)
        if ((rc = eval(c, sc, n->args[i], &a->v[i])))
            return rc;
    for (int i = 0; i < a->nk; i++)
        if ((rc = eval(c, sc, n->kw[i], &a->kv[i])))
            return rc;
    return 0;
}

/* argument by position or keyword name; NULL if absent */
static const struct val *arg(const struct args *a, int pos, const char *name)
{
    if (pos >= 0 && pos < a->n)
        return &a->v[pos];
    for (int i = 0; name && i < a->nk; i++)
        if (!strcmp(a->kn[i], name))
            return &a->kv[i];
    return NULL;
}

static int call_value(struct ctx *c, struct scope *sc, const struct node *at,
                      const struct val *fn, struct args *a, struct val *out);

static int call_macro(struct ctx *c, const struct node *at, const struct macro *m,
                      struct args *a, const struct val *caller, struct val *out)
{
    const struct node *def = m->def;
    int rc = 0;
    if (++c->call_depth > c->lim.max_depth) {
        c->call_depth--;
        return rt_fail(c, at, STRATA_E_LIMIT,
                       "macro calls nested deeper than %d (runaway recursion?)",
                       c->lim.max_depth);
    }
    struct scope *ms = xalloc(c, sizeof *ms);
    struct buf cap = { 0 };
    struct buf *saved = c->out;
    int saved_brk = c->brk;
    if (!ms) {
        rc = oom(c, at);
        goto out;
    }
    memset(ms, 0, sizeof *ms);
    ms->parent = m->closure;
    struct val varargs, kwargs;
    if ((rc = mklist(c, at, 0, &varargs)) || (rc = mkdict(c, at, V_DICT, &kwargs)))
        goto out;
    for (int i = 0; i < a->n; i++) {
        if (i < def->n_kw) {
            if ((rc = scope_set(c, at, ms, def->kw_names[i], a->v[i])))
                goto out;
        } else if ((rc = list_push(c, at, varargs.u.l, a->v[i]))) {
            goto out;
        }
    }
    for (int k = 0; k < a->nk; k++) {
        int pi = -1;
        for (int i = 0; i < def->n_kw; i++)
            if (!strcmp(def->kw_names[i], a->kn[k]))
                pi = i;
        if (pi >= 0 && pi < a->n) {
            rc = rt_fail(c, at, STRATA_E_INVALID, "macro '%s' got multiple values for argument '%s'",
                         def->name, a->kn[k]);
            goto out;
        }
        if (pi >= 0)
            rc = scope_set(c, at, ms, def->kw_names[pi], a->kv[k]);
        else
            rc = dict_set(c, at, kwargs.u.d, strlit(a->kn[k]), a->kv[k]);
        if (rc)
            goto out;
    }
    for (int i = a->n; i < def->n_kw; i++) {
        struct val tmp;
        if (lookup(ms, def->kw_names[i], &tmp) && dict_find_cstr(&ms->vars, def->kw_names[i]) >= 0)
            continue;
        struct val dv = undef_hint(NULL);
        if (def->kw[i] && (rc = eval(c, ms, def->kw[i], &dv)))
            goto out;
        if (!def->kw[i]) {
            char msg[200];
            snprintf(msg, sizeof msg, "parameter '%s' was not provided", def->kw_names[i]);
            char *p = arena_strdup(&c->ar, msg, strlen(msg));
            if (!p) {
                rc = oom(c, at);
                goto out;
            }
            dv = undef_hint(p);
        }
        if ((rc = scope_set(c, at, ms, def->kw_names[i], dv)))
            goto out;
    }
    varargs.u.l->tuple = 1;
    if ((rc = scope_set(c, at, ms, "varargs", varargs)) || (rc = scope_set(c, at, ms, "kwargs", kwargs)))
        goto out;
    if (caller && (rc = scope_set(c, at, ms, "caller", *caller)))
        goto out;
    c->out = &cap;
    c->brk = 0;
    rc = exec_body(c, ms, def->b);
    c->out = saved;
    c->brk = saved_brk;
    if (!rc)
        rc = mkstr(c, at, cap.p ? cap.p : "", cap.n, out);
out:
    free(cap.p);
    c->call_depth--;
    return rc;
}

static int split_ws(struct ctx *c, const struct node *at, const struct val *s, int64_t maxsplit,
                    struct val *out)
{
    int rc = mklist(c, at, 0, out);
    size_t i = 0, n = s->n;
    while (!rc) {
        /* skip whitespace */
        size_t j = i;
        while (j < n) {
            size_t k = j;
            if (!py_isspace(u8_next(s->u.s, n, &k)))
                break;
            j = k;
        }
        if (j >= n)
            break;
        size_t b = j;
        if (maxsplit >= 0 && (int64_t)out->u.l->n >= maxsplit) {
            /* rest, with trailing whitespace removed */
            size_t e = n;
            while (e > b && is_ws(s->u.s[e - 1]))
                e--;
            struct val w;
            if (!(rc = mkstr(c, at, s->u.s + b, e - b, &w)))
                rc = list_push(c, at, out->u.l, w);
            break;
        }
        while (j < n) {
            size_t k = j;
            if (py_isspace(u8_next(s->u.s, n, &k)))
                break;
            j = k;
        }
        struct val w;
        if (!(rc = mkstr(c, at, s->u.s + b, j - b, &w)))
            rc = list_push(c, at, out->u.l, w);
        i = j;
    }
    return rc;
}

static int do_strip(struct ctx *c, const struct node *at, const struct val *s,
                    const struct val *chars, int left, int right, struct val *out)
{
    if (chars && chars->t != V_NONE && chars->t != V_UNDEF && chars->t != V_STR)
        return rt_fail(c, at, STRATA_E_INVALID, "strip arg must be None or str");
    int use_chars = chars && chars->t == V_STR;
    size_t b = 0, e = s->n;
    while (left && b < e) {
        size_t k = b;
        int32_t cp = u8_next(s->u.s, e, &k);
        int hit = 0;
        if (use_chars) {
            size_t q = 0;
            while (q < chars->n && !hit)
                hit = u8_next(chars->u.s, chars->n, &q) == cp;
        } else {
            hit = py_isspace(cp);
        }
        if (!hit)
            break;
        b = k;
    }
    while (right && e > b) {
        size_t k = e - 1;
        while (k > b && ((unsigned char)s->u.s[k] & 0xC0) == 0x80)
            k--;
        size_t q2 = k;
        int32_t cp = u8_next(s->u.s, e, &q2);
        int hit = 0;
        if (use_chars) {
            size_t q = 0;
            while (q < chars->n && !hit)
                hit = u8_next(chars->u.s, chars->n, &q) == cp;
        } else {
            hit = py_isspace(cp);
        }
        if (!hit)
            break;
        e = k;
    }
    out->t = V_STR;
    out->n = e - b;
    if (e == s->n) {
        out->u.s = s->u.s + b;
        return 0;
    }
    return mkstr(c, at, s->u.s + b, e - b, out);
}

static int do_replace(struct ctx *c, const struct node *at, const struct val *s,
                      const struct val *old, const struct val *new, int64_t count,
                      struct val *out)
{
    if (old->t != V_STR || new->t != V_STR)
        return rt_fail(c, at, STRATA_E_INVALID, "replace() arguments must be str");
    struct buf b = { 0 };
    int rc = 0;
    size_t i = 0;
    int64_t done = 0;
    if (old->n == 0) {
        /* Python inserts new between every character */
        while (!rc && (count < 0 || done < count) && i <= s->n) {
            rc = buf_add(c, at, &b, new->u.s, new->n);
            done++;
            if (i == s->n)
                break;
            size_t k = i;
            u8_next(s->u.s, s->n, &k);
            if (!rc)
                rc = buf_add(c, at, &b, s->u.s + i, k - i);
            i = k;
        }
        if (!rc && i < s->n)
            rc = buf_add(c, at, &b, s->u.s + i, s->n - i);
    } else {
        while (!rc) {
            const char *h = (count < 0 || done < count)
                                ? memmem(s->u.s + i, s->n - i, old->u.s, old->n)
                                : NULL;
            if (!h) {
                rc = buf_add(c, at, &b, s->u.s + i, s->n - i);
                break;
            }
            size_t pos = (size_t)(h - s->u.s);
            rc = buf_add(c, at, &b, s->u.s + i, pos - i);
            if (!rc)
                rc = buf_add(c, at, &b, new->u.s, new->n);
            i = pos + old->n;
            done++;
        }
    }
    if (!rc)
        rc = mkstr(c, at, b.p ? b.p : "", b.n, out);
    free(b.p);
    return rc;
}

static int str_method(struct ctx *c, const struct node *at, const struct val *s,
                      const char *name, struct args *a, struct val *out)
{
    int rc;
    const struct val *a0 = arg(a, 0, NULL), *a1 = arg(a, 1, NULL);
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip"))
        return do_strip(c, at, s, a0, name[0] != 'r', name[0] != 'l', out);
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        const struct val *sep = arg(a, 0, "sep"), *ms = arg(a, 1, "maxsplit");
        int64_t maxsplit = ms && ms->t == V_INT ? ms->u.i : -1;
        if (!sep || sep->t == V_NONE)
            return split_ws(c, at, s, maxsplit, out);
        if (sep->t != V_STR)
            return rt_fail(c, at, STRATA_E_INVALID, "must be str or None, not %s", type_name(sep));
        if (sep->n == 0)
            return rt_fail(c, at, STRATA_E_INVALID, "empty separator");
        if ((rc = mklist(c, at, 0, out)))
            return rc;
        if (name[0] == 'r' && maxsplit >= 0) {
            /* rsplit with a limit: split from the right, then reverse */
            size_t e = s->n;
            struct val parts;
            if ((rc = mklist(c, at, 0, &parts)))
                return rc;
            int64_t done = 0;
            while (done < maxsplit) {
                const char *hit = NULL;
                for (size_t k = e; k >= sep->n; k--)
                    if (memcmp(s->u.s + k - sep->n, sep->u.s, sep->n) == 0) {
                        hit = s->u.s + k - sep->n;
                        break;
                    }
                if (!hit)
                    break;
                struct val w;
                size_t hp = (size_t)(hit - s->u.s);
                if ((rc = mkstr(c, at, hit + sep->n, e - hp - sep->n, &w))
                    || (rc = list_push(c, at, parts.u.l, w)))
                    return rc;
                e = hp;
                done++;
            }
            struct val w;
            if ((rc = mkstr(c, at, s->u.s, e, &w)) || (rc = list_push(c, at, out->u.l, w)))
                return rc;
            for (size_t k = parts.u.l->n; k-- > 0;)
                if ((rc = list_push(c, at, out->u.l, parts.u.l->v[k])))
                    return rc;
            return 0;
        }
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *h = (maxsplit < 0 || done < maxsplit)
                                ? memmem(s->u.s + i, s->n - i, sep->u.s, sep->n)
                                : NULL;
            size_t e = h ? (size_t)(h - s->u.s) : s->n;
            struct val w;
            if ((rc = mkstr(c, at, s->u.s + i, e - i, &w)) || (rc = list_push(c, at, out->u.l, w)))
                return rc;
            if (!h)
                break;
            i = e + sep->n;
            done++;
        }
        return 0;
    }
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        int ends = name[0] == 'e';
        if (!a0)
            return rt_fail(c, at, STRATA_E_INVALID, "%s() takes at least 1 argument", name);
        const struct val *cands = a0;
        size_t nc = 1;
        if (a0->t == V_LIST) {
            nc = a0->u.l->n;
            cands = a0->u.l->v;
        }
        int hit = 0;
        for (size_t k = 0; k < nc && !hit; k++) {
            const struct val *p = &cands[k];
            if (p->t != V_STR)
                return rt_fail(c, at, STRATA_E_INVALID, "%s first arg must be str", name);
            if (p->n <= s->n)
                hit = memcmp(ends ? s->u.s + s->n - p->n : s->u.s, p->u.s, p->n) == 0;
        }
        *out = mkbool(hit);
        return 0;
    }
    if (!strcmp(name, "upper")) return case_map(c, at, s, 1, out);
    if (!strcmp(name, "lower")) return case_map(c, at, s, 0, out);
    if (!strcmp(name, "capitalize")) return case_map(c, at, s, 2, out);
    if (!strcmp(name, "title")) return case_map(c, at, s, 3, out);
    if (!strcmp(name, "replace")) {
        if (!a0 || !a1)
            return rt_fail(c, at, STRATA_E_INVALID, "replace() takes at least 2 arguments");
        const struct val *cnt = arg(a, 2, "count");
        return do_replace(c, at, s, a0, a1, cnt && cnt->t == V_INT ? cnt->u.i : -1, out);
    }
    if (!strcmp(name, "find") || !strcmp(name, "index") || !strcmp(name, "rfind")
        || !strcmp(name, "count")) {
        if (!a0 || a0->t != V_STR)
            return rt_fail(c, at, STRATA_E_INVALID, "%s() argument must be str", name);
        if (!strcmp(name, "count")) {
            int64_t k = 0;
            if (a0->n == 0) {
                k = (int64_t)u8_len(s->u.s, s->n) + 1;
            } else {
                const char *p = s->u.s, *e = s->u.s + s->n;
                while ((p = memmem(p, (size_t)(e - p), a0->u.s, a0->n))) {
                    k++;
                    p += a0->n;
                }
            }
            *out = mkint(k);
            return 0;
        }
        const char *h = NULL;
        if (name[0] == 'r') {
            for (size_t k = s->n + 1; k-- > 0 && !h;)
                if (k + a0->n <= s->n && memcmp(s->u.s + k, a0->u.s, a0->n) == 0)
                    h = s->u.s + k;
        } else {
            h = memmem(s->u.s, s->n, a0->u.s, a0->n);
        }
        if (!h && !strcmp(name, "index"))
            return rt_fail(c, at, STRATA_E_INVALID, "substring not found");
        *out = mkint(h ? (int64_t)u8_len(s->u.s, (size_t)(h - s->u.s)) : -1);
        return 0;
    }
    if (!strcmp(name, "join")) {
        struct list *l;
        if (!a0)
            return rt_fail(c, at, STRATA_E_INVALID, "join() takes exactly one argument");
        if ((rc = iterate(c, at, a0, &l)))
            return rc;
        struct buf b = { 0 };
        for (size_t i = 0; i < l->n && !rc; i++) {
            if (l->v[i].t != V_STR)
                rc = rt_fail(c, at, STRATA_E_INVALID, "sequence item %zu: expected str instance",
                             i);
            if (!rc && i)
                rc = buf_add(c, at, &b, s->u.s, s->n);
            if (!rc)
                rc = buf_add(c, at, &b, l->v[i].u.s, l->v[i].n);
        }
        if (!rc)
            rc = mkstr(c, at, b.p ? b.p : "", b.n, out);
        free(b.p);
        return rc;
    }
    if (!strcmp(name, "splitlines")) {
        if ((rc = mklist(c, at, 0, out)))
            return rc;
        size_t i = 0;
        while (i < s->n) {
            size_t e = i;
            while (e < s->n && s->u.s[e] != '\n' && s->u.s[e] != '\r')
                e++;
            struct val w;
            if ((rc = mkstr(c, at, s->u.s + i, e - i, &w)) || (rc = list_push(c, at, out->u.l, w)))
                return rc;
            if (e < s->n && s->u.s[e] == '\r' && e + 1 < s->n && s->u.s[e + 1] == '\n')
                e++;
            i = e + 1;
        }
        return 0;
    }
    if (!strcmp(name, "isdigit") || !strcmp(name, "isalpha") || !strcmp(name, "isspace")
        || !strcmp(name, "isalnum") || !strcmp(name, "isupper") || !strcmp(name, "islower")) {
        int ok = s->n > 0, cased = 0;
        size_t i = 0;
        while (i < s->n && ok) {
            int32_t cp = u8_next(s->u.s, s->n, &i);
            switch (name[2]) {
            case 'd': ok = cp < 0x80 ? isdigit(cp) != 0 : utf8proc_category(cp) == UTF8PROC_CATEGORY_ND; break;
            case 'a': ok = name[3] == 'p' ? py_isalpha(cp) : (py_isalnum(cp) && cp != '_'); break;
            case 's': ok = py_isspace(cp); break;
            case 'u':
                if (utf8proc_tolower(cp) != cp) cased = 1;
                else if (utf8proc_toupper(cp) != cp) ok = 0;
                break;
            case 'l':
                if (utf8proc_toupper(cp) != cp) cased = 1;
                else if (utf8proc_tolower(cp) != cp) ok = 0;
                break;
            }
        }
        if (name[2] == 'u' || name[2] == 'l')
            ok = ok && cased;
        *out = mkbool(ok);
        return 0;
    }
    if (!strcmp(name, "format")) {
        /* "{}" and "{N}" fields only */
        struct buf b = { 0 };
        rc = 0;
        int auto_i = 0;
        for (size_t i = 0; i < s->n && !rc; i++) {
            char ch = s->u.s[i];
            if (ch == '{' && i + 1 < s->n && s->u.s[i + 1] == '{') {
                rc = buf_addc(c, at, &b, '{');
                i++;
            } else if (ch == '}' && i + 1 < s->n && s->u.s[i + 1] == '}') {
                rc = buf_addc(c, at, &b, '}');
                i++;
            } else if (ch == '{') {
                size_t e = i + 1;
                while (e < s->n && s->u.s[e] != '}')
                    e++;
                if (e >= s->n) {
                    rc = rt_fail(c, at, STRATA_E_INVALID, "single '{' encountered in format string");
                    break;
                }
                const struct val *v = NULL;
                if (e == i + 1) {
                    v = arg(a, auto_i++, NULL);
                } else if (isdigit((unsigned char)s->u.s[i + 1])) {
                    v = arg(a, atoi(s->u.s + i + 1), NULL);
                } else {
                    char key[64];
                    size_t kl = e - i - 1 < sizeof key - 1 ? e - i - 1 : sizeof key - 1;
                    memcpy(key, s->u.s + i + 1, kl);
                    key[kl] = 0;
                    v = arg(a, -1, key);
                }
                if (!v) {
                    rc = rt_fail(c, at, STRATA_E_INVALID, "format(): missing argument");
                    break;
                }
                rc = write_val(c, at, &b, v, 0);
                i = e;
            } else {
                rc = buf_addc(c, at, &b, ch);
            }
        }
        if (!rc)
            rc = mkstr(c, at, b.p ? b.p : "", b.n, out);
        free(b.p);
        return rc;
    }
    return rt_fail(c, at, STRATA_E_INVALID, "'str object' has no attribute '%s'", name);
}

static int dict_items(struct ctx *c, const struct node *at, const struct dict *d, struct val *out)
{
    int rc = mklist(c, at, d->n, out);
    for (size_t i = 0; i < d->n && !rc; i++) {
        struct val pair;
        if ((rc = mklist(c, at, 2, &pair)))
            return rc;
        pair.u.l->v[0] = d->k[i];
        pair.u.l->v[1] = d->v[i];
        pair.u.l->n = 2;
        pair.u.l->tuple = 1;
        out->u.l->v[out->u.l->n++] = pair;
    }
    return rc;
}

static int dict_method(struct ctx *c, const struct node *at, const struct val *d,
                       const char *name, struct args *a, struct val *out)
{
    int rc;
    if (!strcmp(name, "items"))
        return dict_items(c, at, d->u.d, out);
    if (!strcmp(name, "keys") || !strcmp(name, "values")) {
        if ((rc = mklist(c, at, d->u.d->n, out)))
            return rc;
        for (size_t i = 0; i < d->u.d->n; i++)
            out->u.l->v[i] = name[0] == 'k' ? d->u.d->k[i] : d->u.d->v[i];
        out->u.l->n = d->u.d->n;
        return 0;
    }
    if (!strcmp(name, "get")) {
        const struct val *k = arg(a, 0, NULL), *dv = arg(a, 1, "default");
        if (!k)
            return rt_fail(c, at, STRATA_E_INVALID, "get expected at least 1 argument");
        int i = dict_find(d->u.d, k);
        *out = i >= 0 ? d->u.d->v[i] : dv ? *dv : NONE;
        return 0;
    }
    if (!strcmp(name, "copy")) {
        if ((rc = mkdict(c, at, V_DICT, out)))
            return rc;
        for (size_t i = 0; i < d->u.d->n && !rc; i++)
            rc = dict_set(c, at, out->u.d, d->u.d->k[i], d->u.d->v[i]);
        return rc;
    }
    if (!strcmp(name, "update") || !strcmp(name, "pop") || !strcmp(name, "setdefault")
        || !strcmp(name, "clear") || !strcmp(name, "popitem"))
        return rt_fail(c, at, STRATA_E_INVALID,
                       "access to attribute '%s' of 'dict' object is unsafe", name);
    return rt_fail(c, at, STRATA_E_INVALID, "'dict object' has no attribute '%s'", name);
}

static int list_method(struct ctx *c, const struct node *at, const struct val *l,
                       const char *name, struct args *a, struct val *out)
{
    (void)c;
    if (!strcmp(name, "index") || !strcmp(name, "count")) {
        const struct val *x = arg(a, 0, NULL);
        if (!x)
            return rt_fail(c, at, STRATA_E_INVALID, "%s() takes exactly one argument", name);
        int64_t k = 0, idx = -1;
        for (size_t i = 0; i < l->u.l->n; i++)
            if (val_eq(&l->u.l->v[i], x)) {
                if (idx < 0)
                    idx = (int64_t)i;
                k++;
            }
        if (name[0] == 'i' && idx < 0)
            return rt_fail(c, at, STRATA_E_INVALID, "value is not in list");
        *out = mkint(name[0] == 'i' ? idx : k);
        return 0;
    }
    if (!strcmp(name, "append") || !strcmp(name, "pop") || !strcmp(name, "extend")
        || !strcmp(name, "insert") || !strcmp(name, "remove") || !strcmp(name, "sort")
        || !strcmp(name, "reverse") || !strcmp(name, "clear"))
        return rt_fail(c, at, STRATA_E_INVALID,
                       "access to attribute '%s' of 'list' object is unsafe", name);
    return rt_fail(c, at, STRATA_E_INVALID, "'list object' has no attribute '%s'", name);
}

static int call_builtin(struct ctx *c, const struct node *at, int id, struct args *a,
                        struct val *out)
{
    int rc;
    switch (id) {
    case F_RANGE: {
        int64_t start = 0, stop, st = 1;
        for (int i = 0; i < a->n; i++)
            if (a->v[i].t != V_INT && a->v[i].t != V_BOOL)
                return rt_fail(c, at, STRATA_E_INVALID, "range() arguments must be integers");
        if (a->n == 1) {
            stop = a->v[0].u.i;
        } else if (a->n == 2 || a->n == 3) {
            start = a->v[0].u.i;
            stop = a->v[1].u.i;
            if (a->n == 3)
                st = a->v[2].u.i;
        } else {
            return rt_fail(c, at, STRATA_E_INVALID, "range expected 1 to 3 arguments");
        }
        if (st == 0)
            return rt_fail(c, at, STRATA_E_INVALID, "range() arg 3 must not be zero");
        double cnt = st > 0 ? ceil(((double)stop - (double)start) / (double)st)
                            : ceil(((double)start - (double)stop) / (double)-st);
        if (cnt < 0)
            cnt = 0;
        if (cnt > (double)c->lim.max_loop_iters)
            return rt_fail(c, at, STRATA_E_LIMIT, "range() of %.0f items exceeds the loop limit %llu",
                           cnt, (unsigned long long)c->lim.max_loop_iters);
        if ((rc = mklist(c, at, (size_t)cnt, out)))
            return rc;
        for (int64_t i = 0; i < (int64_t)cnt; i++)
            out->u.l->v[i] = mkint(start + i * st);
        out->u.l->n = (size_t)cnt;
        return 0;
    }
    case F_NAMESPACE:
    case F_DICT:
        if ((rc = mkdict(c, at, id == F_NAMESPACE ? V_NS : V_DICT, out)))
            return rc;
        for (int i = 0; i < a->n; i++) {
            if (a->v[i].t == V_DICT || a->v[i].t == V_NS) {
                for (size_t k = 0; k < a->v[i].u.d->n; k++)
                    if ((rc = dict_set(c, at, out->u.d, a->v[i].u.d->k[k], a->v[i].u.d->v[k])))
                        return rc;
            } else if (a->v[i].t == V_LIST) {
                for (size_t k = 0; k < a->v[i].u.l->n; k++) {
                    const struct val *p = &a->v[i].u.l->v[k];
                    if (p->t != V_LIST || p->u.l->n != 2)
                        return rt_fail(c, at, STRATA_E_INVALID, "dictionary update sequence element has wrong length");
                    if ((rc = dict_set(c, at, out->u.d, p->u.l->v[0], p->u.l->v[1])))
                        return rc;
                }
            } else {
                return rt_fail(c, at, STRATA_E_INVALID, "'%s' object is not iterable", type_name(&a->v[i]));
            }
        }
        for (int k = 0; k < a->nk; k++)
            if ((rc = dict_set(c, at, out->u.d, strlit(a->kn[k]), a->kv[k])))
                return rc;
        return 0;
    case F_RAISE: {
        struct val m = strlit("");
        const struct val *a0 = arg(a, 0, NULL);
        if (a0 && (rc = to_str(c, at, a0, &m)))
            return rc;
        /* the template's own message, verbatim: the server returns it to the client */
        strata_err_set(c->err, STRATA_E_TEMPLATE, "%.*s", (int)m.n, m.u.s);
        return STRATA_E_TEMPLATE;
    }
    case F_STRFTIME: {
        const struct val *f = arg(a, 0, NULL);
        if (!f || f->t != V_STR)
            return rt_fail(c, at, STRATA_E_INVALID, "strftime_now() needs a format string");
        time_t now = c->now ? c->now : time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char tmp[512];
        char fmt[256];
        size_t fl = f->n < sizeof fmt - 1 ? f->n : sizeof fmt - 1;
        memcpy(fmt, f->u.s, fl);
        fmt[fl] = 0;
        size_t k = fl ? strftime(tmp, sizeof tmp, fmt, &tm) : 0;
        return mkstr(c, at, tmp, k, out);
    }
    }
    return rt_fail(c, at, STRATA_E_INTERNAL, "unknown builtin");
}

static int call_value(struct ctx *c, struct scope *sc, const struct node *at,
                      const struct val *fn, struct args *a, struct val *out)
{
    (void)sc;
    if (fn->t == V_MACRO) {
        struct val caller = c->pending_caller;
        c->pending_caller.t = V_UNDEF;
        return call_macro(c, at, fn->u.m, a, caller.t == V_MACRO ? &caller : NULL, out);
    }
    if (fn->t == V_FUNC)
        return call_builtin(c, at, (int)fn->u.i, a, out);
    if (fn->t == V_UNDEF)
        return undefined_error(c, at, fn);
    return rt_fail(c, at, STRATA_E_INVALID, "'%s' object is not callable", type_name(fn));
}

/* --- tests */

static int apply_test(struct ctx *c, const struct node *at, const char *name,
                      const struct val *v, const struct val *args, int nargs, int *res)
{
    const struct val *x = nargs > 0 ? &args[0] : NULL;
    int r = 0, rc;
    if (!strcmp(name, "defined")) r = v->t != V_UNDEF;
    else if (!strcmp(name, "undefined")) r = v->t == V_UNDEF;
    else if (!strcmp(name, "none")) r = v->t == V_NONE;
    else if (!strcmp(name, "boolean")) r = v->t == V_BOOL;
    else if (!strcmp(name, "true")) r = v->t == V_BOOL && v->u.i;
    else if (!strcmp(name, "false")) r = v->t == V_BOOL && !v->u.i;
    else if (!strcmp(name, "integer")) r = v->t == V_INT;
    else if (!strcmp(name, "float")) r = v->t == V_FLOAT;
    else if (!strcmp(name, "number")) r = is_num(v);
    else if (!strcmp(name, "string")) r = v->t == V_STR;
    else if (!strcmp(name, "mapping")) r = v->t == V_DICT;
    else if (!strcmp(name, "iterable"))
        r = v->t == V_STR || v->t == V_LIST || v->t == V_DICT || v->t == V_UNDEF;
    else if (!strcmp(name, "sequence"))
        r = v->t == V_STR || v->t == V_LIST || v->t == V_DICT || v->t == V_UNDEF;
    else if (!strcmp(name, "callable")) r = v->t == V_MACRO || v->t == V_FUNC;
    else if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (v->t != V_INT && v->t != V_BOOL)
            return rt_fail(c, at, STRATA_E_INVALID, "test '%s' needs an integer", name);
        r = (v->u.i % 2 != 0) == (name[0] == 'o');
    } else if (!strcmp(name, "divisibleby")) {
        if (!x || (x->t != V_INT) || (v->t != V_INT) || x->u.i == 0)
            return rt_fail(c, at, STRATA_E_INVALID, "test 'divisibleby' needs integers");
        r = v->u.i % x->u.i == 0;
    } else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        /* str(value).islower() / .isupper(): needs a cased character */
        struct val sv;
        if ((rc = to_str(c, at, v, &sv)))
            return rc;
        int cased = 0, good = 1;
        size_t i = 0;
        while (i < sv.n && good) {
            int32_t cp = u8_next(sv.u.s, sv.n, &i);
            int32_t lo = utf8proc_tolower(cp), up = utf8proc_toupper(cp);
            if (lo == up)
                continue;
            cased = 1;
            good = name[0] == 'l' ? cp == lo : cp == up;
        }
        r = cased && good;
    } else if (!strcmp(name, "sameas")) {
        /* identity: singletons, small ints and the same container */
        r = x && v->t == x->t
            && (v->t == V_NONE || v->t == V_UNDEF || ((v->t == V_BOOL || v->t == V_INT) && v->u.i == x->u.i)
                || (v->t >= V_LIST && v->t != V_STR && val_eq(v, x)));
    } else if (!strcmp(name, "escaped")) {
        r = 0;
    } else if (!strcmp(name, "filter") || !strcmp(name, "test")) {
        r = v->t == V_STR && name_in(name[0] == 'f' ? filter_names : test_names, v->u.s, v->n);
    } else if (!strcmp(name, "in")) {
        if (!x)
            return rt_fail(c, at, STRATA_E_INVALID, "test 'in' needs an argument");
        return contains(c, at, v, x, res);
    } else {
        int op = 0;
        if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) op = OP_EQ;
        else if (!strcmp(name, "ne") || !strcmp(name, "!=")) op = OP_NE;
        else if (!strcmp(name, "lt") || !strcmp(name, "lessthan") || !strcmp(name, "<")) op = '<';
        else if (!strcmp(name, "le") || !strcmp(name, "<=")) op = OP_LE;
        else if (!strcmp(name, "gt") || !strcmp(name, "greaterthan") || !strcmp(name, ">")) op = '>';
        else if (!strcmp(name, "ge") || !strcmp(name, ">=")) op = OP_GE;
        else
            return rt_fail(c, at, STRATA_E_INVALID, "no test named '%s'", name);
        if (!x)
            return rt_fail(c, at, STRATA_E_INVALID, "test '%s' needs an argument", name);
        if (op == OP_EQ || op == OP_NE) {
            r = val_eq(v, x) == (op == OP_EQ);
        } else {
            int cr;
            if ((rc = val_cmp(c, at, v, x, &cr)))
                return rc;
            r = op == '<' ? cr < 0 : op == OP_LE ? cr <= 0 : op == '>' ? cr > 0 : cr >= 0;
        }
    }
    *res = r;
    return 0;
}

/* attribute path "a.b.0" for map/selectattr/sort/join */
static int attr_path(struct ctx *c, const struct node *at, const struct val *v,
                     const struct val *path, struct val *out)
{
    if (path->t == V_INT)
        return get_item(c, at, v, path, out);
    if (path->t != V_STR)
        return rt_fail(c, at, STRATA_E_INVALID, "attribute name must be a string");
    struct val cur = *v;
    const char *p = path->u.s, *e = path->u.s + path->n;
    while (p <= e) {
        const char *d = memchr(p, '.', (size_t)(e - p));
        if (!d)
            d = e;
        char part[128];
        size_t pl = (size_t)(d - p) < sizeof part - 1 ? (size_t)(d - p) : sizeof part - 1;
        memcpy(part, p, pl);
        part[pl] = 0;
        struct val key, nx;
        int rc;
        if (pl && isdigit((unsigned char)part[0]))
            key = mkint(strtoll(part, NULL, 10));
        else if ((rc = mkstr(c, at, part, pl, &key)))
            return rc;
        if (cur.t == V_UNDEF) {
            *out = cur;
            return 0;
        }
        if ((rc = get_item(c, at, &cur, &key, &nx)))
            return rc;
        cur = nx;
        p = d + 1;
    }
    *out = cur;
    return 0;
}

static int apply_filter(struct ctx *c, struct scope *sc, const struct node *at, const char *name,
                        const struct val *v, struct args *a, struct val *out);
static int percent_format(struct ctx *c, const struct node *at, const struct val *fmt,
                          const struct val *args, int nargs, const struct val *mapping,
                          struct val *out);

static int filter_select(struct ctx *c, struct scope *sc, const struct node *at,
                         const struct val *v, struct args *a, int by_attr, int reject,
                         struct val *out)
{
    struct list *l;
    int rc;
    if (!truthy(v)) /* jinja2 starts with "if seq:" */
        return mklist(c, at, 0, out);
    if ((rc = iterate(c, at, v, &l)) || (rc = mklist(c, at, 0, out)))
        return rc;
    int first = by_attr ? 1 : 0;
    if (by_attr && a->n < 1)
        return rt_fail(c, at, STRATA_E_INVALID, "selectattr needs an attribute name");
    const char *test = a->n > first && a->v[first].t == V_STR ? a->v[first].u.s : NULL;
    int nt = a->n - first - 1;
    for (size_t i = 0; i < l->n; i++) {
        struct val item = l->v[i];
        if (by_attr && (rc = attr_path(c, at, &l->v[i], &a->v[0], &item)))
            return rc;
        int r;
        if (test) {
            if ((rc = apply_test(c, at, test, &item, nt > 0 ? &a->v[first + 1] : NULL, nt, &r)))
                return rc;
        } else {
            r = truthy(&item);
        }
        if (r != reject && (rc = list_push(c, at, out->u.l, l->v[i])))
            return rc;
    }
    (void)sc;
    return 0;
}

static int apply_filter(struct ctx *c, struct scope *sc, const struct node *at, const char *name,
                        const struct val *v, struct args *a, struct val *out)
{
    int rc;
    const struct val *a0 = arg(a, 0, NULL);
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        const struct val *dv = arg(a, 0, "default_value");
        const struct val *bo = arg(a, 1, "boolean");
        int use_default = v->t == V_UNDEF || (bo && truthy(bo) && !truthy(v));
        *out = use_default ? (dv ? *dv : strlit("")) : *v;
        return 0;
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        int64_t n;
        if (val_length(v, &n))
            return rt_fail(c, at, STRATA_E_INVALID, "object of type '%s' has no len()", type_name(v));
        *out = mkint(n);
        return 0;
    }
    if (!strcmp(name, "tojson")) {
        struct jopts o = { -1, NULL, ", ", ": ", 0, 0 };
        const struct val *ea = arg(a, 0, "ensure_ascii"), *ind = arg(a, 1, "indent"),
                         *sep = arg(a, 2, "separators"), *sk = arg(a, 3, "sort_keys");
        if (ea)
            o.ensure_ascii = truthy(ea);
        if (ind && ind->t == V_INT)
            o.indent = (int)(ind->u.i < 0 ? 0 : ind->u.i > 64 ? 64 : ind->u.i);
        else if (ind && ind->t == V_STR) {
            o.indent = 0;
            o.indent_str = ind->u.s;
        }
        if (o.indent >= 0)
            o.item_sep = ",";
        if (sep && sep->t == V_LIST && sep->u.l->n == 2 && sep->u.l->v[0].t == V_STR
            && sep->u.l->v[1].t == V_STR) {
            o.item_sep = sep->u.l->v[0].u.s;
            o.key_sep = sep->u.l->v[1].u.s;
        }
        if (sk)
            o.sort_keys = truthy(sk);
        struct buf b = { 0 };
        rc = json_write(c, at, &b, v, &o, 0);
        if (!rc)
            rc = mkstr(c, at, b.p ? b.p : "", b.n, out);
        free(b.p);
        return rc;
    }
    if (!strcmp(name, "safe") || !strcmp(name, "e") || !strcmp(name, "escape")
        || !strcmp(name, "forceescape")) {
        if (name[0] == 's') /* Markup(value): a string */
            return to_str(c, at, v, out);
        struct val s;
        if ((rc = to_str(c, at, v, &s)))
            return rc;
        struct buf b = { 0 };
        for (size_t i = 0; i < s.n && !rc; i++) {
            switch (s.u.s[i]) {
            case '&': rc = buf_add(c, at, &b, "&amp;", 5); break;
            case '<': rc = buf_add(c, at, &b, "&lt;", 4); break;
            case '>': rc = buf_add(c, at, &b, "&gt;", 4); break;
            case '"': rc = buf_add(c, at, &b, "&#34;", 5); break;
            case '\'': rc = buf_add(c, at, &b, "&#39;", 5); break;
            default: rc = buf_addc(c, at, &b, s.u.s[i]);
            }
        }
        if (!rc)
            rc = mkstr(c, at, b.p ? b.p : "", b.n, out);
        free(b.p);
        return rc;
    }
    if (!strcmp(name, "string"))
        return to_str(c, at, v, out);
    if (!strcmp(name, "trim")) {
        struct val s;
        if ((rc = to_str(c, at, v, &s)))
            return rc;
        return do_strip(c, at, &s, arg(a, 0, "chars"), 1, 1, out);
    }
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "capitalize")
        || !strcmp(name, "title")) {
        struct val s;
        if ((rc = to_str(c, at, v, &s)))
            return rc;
        int mode = name[0] == 'u' ? 1 : name[0] == 'l' ? 0 : name[0] == 'c' ? 2 : 4;
        return case_map(c, at, &s, mode, out);
    }
    if (!strcmp(name, "replace")) {
        struct val s;
        const struct val *o1 = arg(a, 0, "old"), *n1 = arg(a, 1, "new"), *cnt = arg(a, 2, "count");
        if (!o1 || !n1)
            return rt_fail(c, at, STRATA_E_INVALID, "replace filter needs 2 arguments");
        struct val os, ns;
        if ((rc = to_str(c, at, v, &s)) || (rc = to_str(c, at, o1, &os)) || (rc = to_str(c, at, n1, &ns)))
            return rc;
        return do_replace(c, at, &s, &os, &ns, cnt && cnt->t == V_INT ? cnt->u.i : -1, out);
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        struct list *l;
        if ((rc = iterate(c, at, v, &l)))
            return rc;
        if (l->n == 0)
            *out = undef_hint(name[0] == 'f' ? "No first item, sequence was empty."
                                             : "No last item, sequence was empty.");
        else
            *out = l->v[name[0] == 'f' ? 0 : l->n - 1];
        return 0;
    }
    if (!strcmp(name, "list")) {
        struct list *l;
        if ((rc = iterate(c, at, v, &l)) || (rc = mklist(c, at, l->n, out)))
            return rc;
        if (l->n)
            memcpy(out->u.l->v, l->v, l->n * sizeof *l->v);
        out->u.l->n = l->n;
        return 0;
    }
    if (!strcmp(name, "items")) {
        if (v->t == V_UNDEF)
            return mklist(c, at, 0, out);
        if (v->t != V_DICT)
            return rt_fail(c, at, STRATA_E_INVALID, "can only get item pairs from a mapping");
        return dict_items(c, at, v->u.d, out);
    }
    if (!strcmp(name, "join")) {
        struct list *l;
        const struct val *sep = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
        struct val ss = strlit("");
        if (sep && (rc = to_str(c, at, sep, &ss)))
            return rc;
        if ((rc = iterate(c, at, v, &l)))
            return rc;
        struct buf b = { 0 };
        for (size_t i = 0; i < l->n && !rc; i++) {
            struct val item = l->v[i];
            if (attr && (rc = attr_path(c, at, &l->v[i], attr, &item)))
                break;
            if (i)
                rc = buf_add(c, at, &b, ss.u.s, ss.n);
            if (!rc)
                rc = write_val(c, at, &b, &item, 0);
        }
        if (!rc)
            rc = mkstr(c, at, b.p ? b.p : "", b.n, out);
        free(b.p);
        return rc;
    }
    if (!strcmp(name, "map")) {
        struct list *l;
        if (!truthy(v)) /* jinja2 starts with "if value:" */
            return mklist(c, at, 0, out);
        if ((rc = iterate(c, at, v, &l)) || (rc = mklist(c, at, l->n, out)))
            return rc;
        const struct val *attr = arg(a, -1, "attribute"), *dflt = arg(a, -1, "default");
        for (size_t i = 0; i < l->n; i++) {
            struct val r;
            if (attr) {
                if ((rc = attr_path(c, at, &l->v[i], attr, &r)))
                    return rc;
                if (r.t == V_UNDEF && dflt)
                    r = *dflt;
            } else {
                if (!a0 || a0->t != V_STR)
                    return rt_fail(c, at, STRATA_E_INVALID, "map needs a filter name or attribute=");
                struct args sub = { a->n - 1, a->nk, a->v + 1, a->kn, a->kv };
                if ((rc = apply_filter(c, sc, at, a0->u.s, &l->v[i], &sub, &r)))
                    return rc;
            }
            out->u.l->v[out->u.l->n++] = r;
        }
        return 0;
    }
    if (!strcmp(name, "select") || !strcmp(name, "reject"))
        return filter_select(c, sc, at, v, a, 0, name[0] == 'r', out);
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        return filter_select(c, sc, at, v, a, 1, name[0] == 'r', out);
    if (!strcmp(name, "int")) {
        const struct val *dv = arg(a, 0, "default");
        struct val d = dv ? *dv : mkint(0);
        if (v->t == V_INT || v->t == V_BOOL) *out = mkint(v->u.i);
        else if (v->t == V_FLOAT) *out = isfinite(v->u.f) && fabs(v->u.f) < 9.2e18 ? mkint((int64_t)v->u.f) : d;
        else if (v->t == V_STR) {
            char *e;
            char tmp[64];
            size_t k = v->n < 63 ? v->n : 63;
            memcpy(tmp, v->u.s, k);
            tmp[k] = 0;
            long long iv = strtoll(tmp, &e, 10);
            while (*e && is_ws(*e))
                e++;
            if (k && !*e) {
                *out = mkint(iv);
            } else {
                double f = strtod(tmp, &e);
                while (*e && is_ws(*e))
                    e++;
                *out = k && !*e && isfinite(f) ? mkint((int64_t)f) : d;
            }
        } else *out = d;
        return 0;
    }
    if (!strcmp(name, "float")) {
        const struct val *dv = arg(a, 0, "default");
        struct val d = dv ? *dv : mkfloat(0);
        if (is_num(v)) *out = mkfloat(num_f(v));
        else if (v->t == V_STR) {
            char tmp[64], *e;
            size_t k = v->n < 63 ? v->n : 63;
            memcpy(tmp, v->u.s, k);
            tmp[k] = 0;
            double f = strtod(tmp, &e);
            while (*e && is_ws(*e))
                e++;
            *out = k && !*e ? mkfloat(f) : d;
        } else *out = d;
        return 0;
    }
    if (!strcmp(name, "abs")) {
        if (v->t == V_INT || v->t == V_BOOL) *out = mkint(v->u.i < 0 ? -v->u.i : v->u.i);
        else if (v->t == V_FLOAT) *out = mkfloat(fabs(v->u.f));
        else return rt_fail(c, at, STRATA_E_INVALID, "bad operand type for abs(): '%s'", type_name(v));
        return 0;
    }
    if (!strcmp(name, "round")) {
        const struct val *pr = arg(a, 0, "precision"), *me = arg(a, 1, "method");
        if (!is_num(v))
            return rt_fail(c, at, STRATA_E_INVALID, "round needs a number");
        int64_t p = pr && pr->t == V_INT ? pr->u.i : 0;
        double x = num_f(v), m = pow(10.0, (double)p), r;
        const char *meth = me && me->t == V_STR ? me->u.s : "common";
        if (v->t != V_FLOAT && !strcmp(meth, "common") && p >= 0) {
            *out = mkint(v->u.i); /* Python's round(int, n) is the int */
            return 0;
        }
        if (!strcmp(meth, "ceil")) r = ceil(x * m) / m;
        else if (!strcmp(meth, "floor")) r = floor(x * m) / m;
        else r = nearbyint(x * m) / m;
        *out = mkfloat(r);
        return 0;
    }
    if (!strcmp(name, "reverse")) {
        if (v->t == V_STR) {
            struct val s;
            struct val mone = mkint(-1);
            rc = do_slice(c, at, v, NULL, NULL, &mone, &s);
            *out = s;
            return rc;
        }
        struct list *l;
        if ((rc = iterate(c, at, v, &l)) || (rc = mklist(c, at, l->n, out)))
            return rc;
        for (size_t i = 0; i < l->n; i++)
            out->u.l->v[i] = l->v[l->n - 1 - i];
        out->u.l->n = l->n;
        return 0;
    }
    if (!strcmp(name, "unique")) {
        struct list *l;
        const struct val *cs = arg(a, 0, "case_sensitive"), *attr = arg(a, 1, "attribute");
        int ci = !(cs && truthy(cs));
        if ((rc = iterate(c, at, v, &l)) || (rc = mklist(c, at, 0, out)))
            return rc;
        struct val keys;
        if ((rc = mklist(c, at, 0, &keys)))
            return rc;
        for (size_t i = 0; i < l->n; i++) {
            struct val k = l->v[i];
            if (attr && (rc = attr_path(c, at, &l->v[i], attr, &k)))
                return rc;
            if (k.t == V_DICT || k.t == V_LIST || k.t == V_NS)
                return rt_fail(c, at, STRATA_E_INVALID, "unhashable type: '%s'", type_name(&k));
            if (ci && k.t == V_STR && (rc = case_map(c, at, &k, 0, &k)))
                return rc;
            int seen = 0;
            for (size_t j = 0; j < keys.u.l->n && !seen; j++)
                seen = val_eq(&keys.u.l->v[j], &k);
            if (!seen && ((rc = list_push(c, at, keys.u.l, k)) || (rc = list_push(c, at, out->u.l, l->v[i]))))
                return rc;
        }
        return 0;
    }
    if (!strcmp(name, "sort") || !strcmp(name, "dictsort")) {
        int dsort = name[0] == 'd';
        const struct val *rv = arg(a, dsort ? 2 : 0, "reverse"),
                         *cs = arg(a, dsort ? 0 : 1, "case_sensitive"),
                         *attr = dsort ? NULL : arg(a, 2, "attribute"),
                         *by = dsort ? arg(a, 1, "by") : NULL;
        struct list *l;
        struct val items;
        if (dsort) {
            if (v->t != V_DICT)
                return rt_fail(c, at, STRATA_E_INVALID, "dictsort needs a mapping");
            if ((rc = dict_items(c, at, v->u.d, &items)))
                return rc;
            l = items.u.l;
        } else {
            if ((rc = iterate(c, at, v, &l)) || (rc = mklist(c, at, l->n, &items)))
                return rc;
            memcpy(items.u.l->v, l->v, l->n * sizeof *l->v);
            items.u.l->n = l->n;
            l = items.u.l;
        }
        size_t n = l->n;
        struct val *keys = xalloc(c, (n + 1) * sizeof *keys), *t1 = xalloc(c, (n + 1) * sizeof *t1),
                   *t2 = xalloc(c, (n + 1) * sizeof *t2);
        if (!keys || !t1 || !t2)
            return oom(c, at);
        int by_value = by && by->t == V_STR && !strcmp(by->u.s, "value");
        for (size_t i = 0; i < n; i++) {
            keys[i] = dsort ? l->v[i].u.l->v[by_value ? 1 : 0] : l->v[i];
            if (attr && (rc = attr_path(c, at, &l->v[i], attr, &keys[i])))
                return rc;
        }
        msort(l->v, keys, t1, t2, n, !(cs && truthy(cs)), rv && truthy(rv));
        *out = items;
        return 0;
    }
    if (!strcmp(name, "min") || !strcmp(name, "max") || !strcmp(name, "sum")) {
        struct list *l;
        if ((rc = iterate(c, at, v, &l)))
            return rc;
        const struct val *attr = arg(a, name[1] == 'u' ? 0 : 1, "attribute");
        if (name[1] == 'u') {
            const struct val *st = arg(a, 1, "start");
            struct val acc = st ? *st : mkint(0);
            for (size_t i = 0; i < l->n; i++) {
                struct val x = l->v[i];
                if (attr && (rc = attr_path(c, at, &l->v[i], attr, &x)))
                    return rc;
                if (!is_num(&x) || !is_num(&acc))
                    return rt_fail(c, at, STRATA_E_INVALID, "sum needs numbers");
                if (acc.t == V_FLOAT || x.t == V_FLOAT)
                    acc = mkfloat(num_f(&acc) + num_f(&x));
                else
                    acc = mkint(acc.u.i + x.u.i);
            }
            *out = acc;
            return 0;
        }
        if (l->n == 0) {
            *out = undef_hint("no items");
            return 0;
        }
        for (size_t i = 0; i < l->n; i++)
            if (l->v[i].t == V_DICT || l->v[i].t == V_NS)
                return rt_fail(c, at, STRATA_E_INVALID,
                               "'<' not supported between instances of 'dict' and 'dict'");
        size_t best = 0;
        for (size_t i = 1; i < l->n; i++) {
            struct val x = l->v[i], y = l->v[best];
            if (attr && ((rc = attr_path(c, at, &l->v[i], attr, &x)) || (rc = attr_path(c, at, &l->v[best], attr, &y))))
                return rc;
            int r = sort_cmp_plain(&x, &y, 1);
            if (name[1] == 'i' ? r < 0 : r > 0)
                best = i;
        }
        *out = l->v[best];
        return 0;
    }
    if (!strcmp(name, "indent")) {
        struct val s;
        if (v->t == V_UNDEF)
            return undefined_error(c, at, v);
        if (v->t != V_STR) /* jinja2 appends "\n" to the value itself */
            return rt_fail(c, at, STRATA_E_INVALID, "unsupported operand type(s) for +=: '%s' and 'str'",
                           type_name(v));
        if ((rc = to_str(c, at, v, &s)))
            return rc;
        const struct val *w = arg(a, 0, "width"), *fi = arg(a, 1, "first"), *bl = arg(a, 2, "blank");
        struct val ind;
        if (w && w->t == V_STR)
            ind = *w;
        else {
            int64_t k = w && w->t == V_INT ? w->u.i : 4;
            if (k < 0)
                k = 0;
            if (k > 1024)
                k = 1024;
            char sp[1025];
            memset(sp, ' ', (size_t)k);
            if ((rc = mkstr(c, at, sp, (size_t)k, &ind)))
                return rc;
        }
        struct buf b = { 0 };
        int first = fi && truthy(fi), blank = bl && truthy(bl);
        size_t i = 0;
        int lineno = 0;
        rc = 0;
        /* split into lines the way str.splitlines does for \n, \r\n and \r */
        while (i < s.n && !rc) {
            size_t e = i;
            while (e < s.n && s.u.s[e] != '\n' && s.u.s[e] != '\r')
                e++;
            int empty = e == i;
            if (lineno)
                rc = buf_addc(c, at, &b, '\n');
            if (!rc && ((lineno == 0 && first) || (lineno > 0 && (!empty || blank))))
                rc = buf_add(c, at, &b, ind.u.s, ind.n);
            if (!rc)
                rc = buf_add(c, at, &b, s.u.s + i, e - i);
            if (e < s.n && s.u.s[e] == '\r' && e + 1 < s.n && s.u.s[e + 1] == '\n')
                e++;
            i = e + 1;
            lineno++;
        }
        if (!rc && lineno == 0 && first)
            rc = buf_add(c, at, &b, ind.u.s, ind.n);
        if (!rc)
            rc = mkstr(c, at, b.p ? b.p : "", b.n, out);
        free(b.p);
        return rc;
    }
    if (!strcmp(name, "wordcount")) {
        struct val s;
        if ((rc = to_str(c, at, v, &s)))
            return rc;
        int64_t k = 0;
        int in = 0;
        size_t i = 0;
        while (i < s.n) {
            int32_t cp = u8_next(s.u.s, s.n, &i);
            int w = py_isalnum(cp);
            if (w && !in)
                k++;
            in = w;
        }
        *out = mkint(k);
        return 0;
    }
    if (!strcmp(name, "batch")) {
        const struct val *cnt = arg(a, 0, "linecount"), *fill = arg(a, 1, "fill_with");
        struct list *l;
        if (!cnt || cnt->t != V_INT || cnt->u.i <= 0)
            return rt_fail(c, at, STRATA_E_INVALID, "batch needs a positive count");
        if ((rc = iterate(c, at, v, &l)) || (rc = mklist(c, at, 0, out)))
            return rc;
        struct val cur = { .t = V_UNDEF };
        for (size_t i = 0; i < l->n; i++) {
            if (cur.t == V_UNDEF && (rc = mklist(c, at, (size_t)cnt->u.i, &cur)))
                return rc;
            cur.u.l->v[cur.u.l->n++] = l->v[i];
            if ((int64_t)cur.u.l->n == cnt->u.i) {
                if ((rc = list_push(c, at, out->u.l, cur)))
                    return rc;
                cur.t = V_UNDEF;
            }
        }
        if (cur.t == V_LIST) {
            while (fill && fill->t != V_NONE && (int64_t)cur.u.l->n < cnt->u.i)
                cur.u.l->v[cur.u.l->n++] = *fill;
            if ((rc = list_push(c, at, out->u.l, cur)))
                return rc;
        }
        return 0;
    }
    if (!strcmp(name, "attr")) {
        if (!a0 || a0->t != V_STR)
            return rt_fail(c, at, STRATA_E_INVALID, "attr needs a name");
        return get_attr(c, at, v, a0->u.s, out);
    }
    if (!strcmp(name, "format")) {
        struct val s, kw;
        if ((rc = to_str(c, at, v, &s)) || (rc = mkdict(c, at, V_DICT, &kw)))
            return rc;
        for (int i = 0; i < a->nk; i++)
            if ((rc = dict_set(c, at, kw.u.d, strlit(a->kn[i]), a->kv[i])))
                return rc;
        if (a->nk && a->n)
            return rt_fail(c, at, STRATA_E_INVALID, "can't handle positional and keyword arguments");
        return a->nk ? percent_format(c, at, &s, &kw, 1, &kw, out)
                     : percent_format(c, at, &s, a->v, a->n, NULL, out);
    }
    if (!strcmp(name, "center") || !strcmp(name, "truncate")
        || !strcmp(name, "slice") || !strcmp(name, "pprint")
        || !strcmp(name, "xmlattr") || !strcmp(name, "urlencode") || !strcmp(name, "urlize")
        || !strcmp(name, "striptags") || !strcmp(name, "filesizeformat") || !strcmp(name, "groupby"))
        return rt_fail(c, at, STRATA_E_UNSUPPORTED, "filter '%s' is not supported", name);
    return rt_fail(c, at, STRATA_E_INVALID, "no filter named '%s'", name);
}


/* Python's printf-style formatting: "fmt % args" and the format filter.  args[0..n) are
 * the positional values; mapping (may be NULL) serves "%(name)s". */
static int percent_format(struct ctx *c, const struct node *at, const struct val *fmt,
                          const struct val *args, int nargs, const struct val *mapping,
                          struct val *out)
{
    struct buf b = { 0 };
    int rc = 0, ai = 0, used_map = 0;
    const char *s = fmt->u.s, *e = fmt->u.s + fmt->n;
    while (s < e && !rc) {
        const char *pc = memchr(s, '%', (size_t)(e - s));
        if (!pc) {
            rc = buf_add(c, at, &b, s, (size_t)(e - s));
            break;
        }
        if ((rc = buf_add(c, at, &b, s, (size_t)(pc - s))))
            break;
        const char *q = pc + 1;
        if (q < e && *q == '%') {
            rc = buf_addc(c, at, &b, '%');
            s = q + 1;
            continue;
        }
        const struct val *v = NULL;
        struct val tmpv;
        if (q < e && *q == '(') {
            const char *ke = memchr(q, ')', (size_t)(e - q));
            if (!ke || !mapping) {
                rc = rt_fail(c, at, STRATA_E_INVALID, "format requires a mapping");
                break;
            }
            struct val key;
            if ((rc = mkstr(c, at, q + 1, (size_t)(ke - q - 1), &key)))
                break;
            int i = dict_find(mapping->u.d, &key);
            if (i < 0) {
                rc = rt_fail(c, at, STRATA_E_INVALID, "format: no key '%s'", key.u.s);
                break;
            }
            v = &mapping->u.d->v[i];
            used_map = 1;
            q = ke + 1;
        }
        char spec[32];
        size_t sn = 0;
        spec[sn++] = '%';
        while (q < e && strchr("-+ 0#", *q) && sn < 8)
            spec[sn++] = *q++;
        int width = -1, prec = -1;
        if (q < e && *q == '*') {
            if (ai >= nargs || args[ai].t != V_INT) {
                rc = rt_fail(c, at, STRATA_E_INVALID, "* wants int");
                break;
            }
            width = (int)args[ai++].u.i;
            q++;
        } else {
            while (q < e && isdigit((unsigned char)*q))
                width = (width < 0 ? 0 : width) * 10 + (*q++ - '0');
        }
        if (q < e && *q == '.') {
            q++;
            prec = 0;
            while (q < e && isdigit((unsigned char)*q))
                prec = prec * 10 + (*q++ - '0');
        }
        while (q < e && (*q == 'h' || *q == 'l' || *q == 'L'))
            q++;
        if (q >= e) {
            rc = rt_fail(c, at, STRATA_E_INVALID, "incomplete format");
            break;
        }
        char conv = *q++;
        if (width > 4096)
            width = 4096;
        if (prec > 4096)
            prec = 4096;
        if (!v) {
            if (ai >= nargs) {
                rc = rt_fail(c, at, STRATA_E_INVALID, "not enough arguments for format string");
                break;
            }
            v = &args[ai++];
        }
        char num[8192];
        int k = 0;
        if (conv == 's' || conv == 'r' || conv == 'a') {
            struct buf sb = { 0 };
            rc = write_val(c, at, &sb, v, conv != 's');
            size_t len = sb.n;
            if (!rc && prec >= 0 && (size_t)prec < u8_len(sb.p ? sb.p : "", len))
                len = u8_off(sb.p, len, (size_t)prec);
            size_t cps = sb.p ? u8_len(sb.p, len) : 0;
            int left = memchr(spec, '-', sn) != NULL;
            for (int i = (int)cps; !rc && !left && i < width; i++)
                rc = buf_addc(c, at, &b, ' ');
            if (!rc && len)
                rc = buf_add(c, at, &b, sb.p, len);
            for (int i = (int)cps; !rc && left && i < width; i++)
                rc = buf_addc(c, at, &b, ' ');
            free(sb.p);
        } else if (strchr("diuxXoc", conv)) {
            int64_t iv;
            if (v->t == V_INT || v->t == V_BOOL)
                iv = v->u.i;
            else if (v->t == V_FLOAT && conv != 'c' && conv != 'x' && conv != 'X' && conv != 'o')
                iv = (int64_t)v->u.f;
            else {
                rc = rt_fail(c, at, STRATA_E_INVALID, "%%%c format: a number is required, not %s",
                             conv, type_name(v));
                break;
            }
            if (conv == 'c') {
                char u8[8];
                utf8proc_ssize_t w = utf8proc_encode_char((utf8proc_int32_t)iv, (utf8proc_uint8_t *)u8);
                rc = buf_add(c, at, &b, u8, w > 0 ? (size_t)w : 0);
            } else {
                if (width >= 0)
                    sn += (size_t)snprintf(spec + sn, sizeof spec - sn, "%d", width);
                if (prec >= 0)
                    sn += (size_t)snprintf(spec + sn, sizeof spec - sn, ".%d", prec);
                snprintf(spec + sn, sizeof spec - sn, "ll%c", conv == 'i' || conv == 'u' ? 'd' : conv);
                k = snprintf(num, sizeof num, spec, (long long)iv);
                rc = buf_add(c, at, &b, num, k > 0 ? ((size_t)k < sizeof num ? (size_t)k : sizeof num - 1) : 0);
            }
        } else if (strchr("fFeEgG", conv)) {
            if (!is_num(v)) {
                rc = rt_fail(c, at, STRATA_E_INVALID, "must be real number, not %s", type_name(v));
                break;
            }
            if (width >= 0)
                sn += (size_t)snprintf(spec + sn, sizeof spec - sn, "%d", width);
            if (prec >= 0)
                sn += (size_t)snprintf(spec + sn, sizeof spec - sn, ".%d", prec);
            snprintf(spec + sn, sizeof spec - sn, "%c", conv);
            k = snprintf(num, sizeof num, spec, num_f(v));
            rc = buf_add(c, at, &b, num, k > 0 ? ((size_t)k < sizeof num ? (size_t)k : sizeof num - 1) : 0);
        } else {
            rc = rt_fail(c, at, STRATA_E_INVALID, "unsupported format character '%c'", conv);
            break;
        }
        (void)tmpv;
        s = q;
    }
    /* Python treats a single non-tuple argument with __getitem__ (a list, a dict) as a
     * mapping: unused, it is no error */
    if (!rc && ai < nargs && !used_map && !(nargs == 1 && (mapping || args[0].t == V_LIST)))
        rc = rt_fail(c, at, STRATA_E_INVALID, "not all arguments converted during string formatting");
    if (!rc)
        rc = mkstr(c, at, b.p ? b.p : "", b.n, out);
    free(b.p);
    return rc;
}

static int binop(struct ctx *c, const struct node *at, int op, const struct val *x,
                 const struct val *y, struct val *out)
{
    int rc;
    if (op == '~') {
        struct val sx, sy;
        if ((rc = to_str(c, at, x, &sx)) || (rc = to_str(c, at, y, &sy)))
            return rc;
        if (sx.n + sy.n > c->lim.max_output)
            return rt_fail(c, at, STRATA_E_LIMIT, "string exceeds %zu bytes", c->lim.max_output);
        char *p = xalloc(c, sx.n + sy.n + 1);
        if (!p)
            return oom(c, at);
        memcpy(p, sx.u.s, sx.n);
        memcpy(p + sx.n, sy.u.s, sy.n);
        p[sx.n + sy.n] = 0;
        out->t = V_STR;
        out->u.s = p;
        out->n = sx.n + sy.n;
        return 0;
    }
    if (x->t == V_UNDEF)
        return undefined_error(c, at, x);
    if (y->t == V_UNDEF)
        return undefined_error(c, at, y);
    if (op == '%' && x->t == V_STR) {
        if (y->t == V_LIST && y->u.l->tuple)
            return percent_format(c, at, x, y->u.l->v, (int)y->u.l->n, NULL, out);
        return percent_format(c, at, x, y, 1, y->t == V_DICT ? y : NULL, out);
    }
    if (is_num(x) && is_num(y)) {
        int isint = x->t != V_FLOAT && y->t != V_FLOAT;
        int64_t a = x->u.i, b = y->u.i, r;
        double fa = num_f(x), fb = num_f(y);
        switch (op) {
        case '+':
            if (isint) {
                if (__builtin_add_overflow(a, b, &r))
                    return rt_fail(c, at, STRATA_E_LIMIT, "integer overflow");
                *out = mkint(r);
            } else *out = mkfloat(fa + fb);
            return 0;
        case '-':
            if (isint) {
                if (__builtin_sub_overflow(a, b, &r))
                    return rt_fail(c, at, STRATA_E_LIMIT, "integer overflow");
                *out = mkint(r);
            } else *out = mkfloat(fa - fb);
            return 0;
        case '*':
            if (isint) {
                if (__builtin_mul_overflow(a, b, &r))
                    return rt_fail(c, at, STRATA_E_LIMIT, "integer overflow");
                *out = mkint(r);
            } else *out = mkfloat(fa * fb);
            return 0;
        case '/':
            if (fb == 0)
                return rt_fail(c, at, STRATA_E_INVALID, "division by zero");
            *out = mkfloat(fa / fb);
            return 0;
        case OP_FLOORDIV:
        case '%':
            if (isint ? b == 0 : fb == 0)
                return rt_fail(c, at, STRATA_E_INVALID, "integer division or modulo by zero");
            if (isint) {
                if (a == INT64_MIN && b == -1)
                    return rt_fail(c, at, STRATA_E_LIMIT, "integer overflow");
                int64_t q = a / b, m = a % b;
                if (m != 0 && ((m < 0) != (b < 0))) {
                    q--;
                    m += b;
                }
                *out = mkint(op == '%' ? m : q);
            } else {
                double q = floor(fa / fb), m = fmod(fa, fb);
                if (m != 0 && ((m < 0) != (fb < 0)))
                    m += fb;
                *out = mkfloat(op == '%' ? m : q);
            }
            return 0;
        case OP_POW:
            if (isint && b >= 0) {
                int64_t acc = 1;
                for (int64_t i = 0; i < b; i++) {
                    if (__builtin_mul_overflow(acc, a, &acc))
                        return rt_fail(c, at, STRATA_E_LIMIT, "integer overflow");
                    if (acc == 0 || acc == 1)
                        break;
                }
                *out = mkint(acc);
            } else {
                *out = mkfloat(pow(fa, fb));
            }
            return 0;
        }
    }
    if (op == '+' && x->t == V_STR && y->t == V_STR)
        return binop(c, at, '~', x, y, out);
    if (op == '+' && x->t == V_LIST && y->t == V_LIST) {
        if ((rc = mklist(c, at, x->u.l->n + y->u.l->n, out)))
            return rc;
        if (x->u.l->n)
            memcpy(out->u.l->v, x->u.l->v, x->u.l->n * sizeof *x->u.l->v);
        if (y->u.l->n)
            memcpy(out->u.l->v + x->u.l->n, y->u.l->v, y->u.l->n * sizeof *y->u.l->v);
        out->u.l->n = x->u.l->n + y->u.l->n;
        return 0;
    }
    if (op == '*' && (((x->t == V_STR || x->t == V_LIST) && (y->t == V_INT || y->t == V_BOOL))
                      || ((y->t == V_STR || y->t == V_LIST) && (x->t == V_INT || x->t == V_BOOL)))) {
        const struct val *s = x->t == V_INT || x->t == V_BOOL ? y : x;
        int64_t k = x->t == V_INT || x->t == V_BOOL ? x->u.i : y->u.i;
        if (k < 0)
            k = 0;
        size_t unit = s->t == V_STR ? s->n : s->u.l->n * sizeof(struct val);
        if (unit && (uint64_t)k > (uint64_t)c->lim.max_output / unit)
            return rt_fail(c, at, STRATA_E_LIMIT, "repeated value exceeds %zu bytes",
                           c->lim.max_output);
        if (s->t == V_STR) {
            char *p = xalloc(c, s->n * (size_t)k + 1);
            if (!p)
                return oom(c, at);
            for (int64_t i = 0; i < k; i++)
                memcpy(p + (size_t)i * s->n, s->u.s, s->n);
            p[s->n * (size_t)k] = 0;
            out->t = V_STR;
            out->u.s = p;
            out->n = s->n * (size_t)k;
            return 0;
        }
        if ((rc = mklist(c, at, s->u.l->n * (size_t)k, out)))
            return rc;
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < s->u.l->n; j++)
                out->u.l->v[out->u.l->n++] = s->u.l->v[j];
        return 0;
    }
    static const char *names[] = { ['+'] = "+", ['-'] = "-", ['*'] = "*", ['/'] = "/", ['%'] = "%" };
    const char *on = op < 128 && names[op] ? names[op] : op == OP_FLOORDIV ? "//" : "**";
    return rt_fail(c, at, STRATA_E_INVALID, "unsupported operand type(s) for %s: '%s' and '%s'",
                   on, type_name(x), type_name(y));
}

static const char *const builtin_names[] = { "range", "namespace", "dict", "raise_exception",
                                             "strftime_now", NULL };

static int eval_node(struct ctx *c, struct scope *sc, const struct node *n, struct val *out);

/* Expression trees are at most PARSE_MAX_HEIGHT deep, but macro calls stack them;
 * this bound keeps the C stack in check whatever the template does. */
#define EVAL_MAX_DEPTH 3000

static int eval(struct ctx *c, struct scope *sc, const struct node *n, struct val *out)
{
    if (++c->edepth > EVAL_MAX_DEPTH) {
        c->edepth--;
        return rt_fail(c, n, STRATA_E_LIMIT, "expressions nested too deeply");
    }
    int rc = eval_node(c, sc, n, out);
    c->edepth--;
    return rc;
}

static int eval_node(struct ctx *c, struct scope *sc, const struct node *n, struct val *out)
{
    int rc;
    if ((rc = step(c, n)))
        return rc;
    switch (n->kind) {
    case E_LIT:
        if (n->lit.t == V_UNDEF) /* the hole of a filter block / block set */
            *out = c->hole;
        else
            *out = n->lit;
        return 0;
    case E_NAME:
        if (lookup(sc, n->name, out))
            return 0;
        for (int i = 0; builtin_names[i]; i++)
            if (!strcmp(n->name, builtin_names[i])) {
                out->t = V_FUNC;
                out->u.i = i;
                return 0;
            }
        {
            char msg[200];
            snprintf(msg, sizeof msg, "'%s' is undefined", n->name);
            char *p = arena_strdup(&c->ar, msg, strlen(msg));
            if (!p)
                return oom(c, n);
            *out = undef_hint(p);
        }
        return 0;
    case E_ATTR: {
        struct val o;
        if ((rc = eval(c, sc, n->a, &o)))
            return rc;
        if (n->op == 1)
            return get_item(c, n, &o, &n->lit, out);
        return get_attr(c, n, &o, n->name, out);
    }
    case E_ITEM: {
        struct val o, k;
        if ((rc = eval(c, sc, n->a, &o)) || (rc = eval(c, sc, n->b, &k)))
            return rc;
        return get_item(c, n, &o, &k, out);
    }
    case E_SLICE: {
        struct val o, a = NONE, b = NONE, s = NONE;
        if ((rc = eval(c, sc, n->a, &o)))
            return rc;
        if (n->b && (rc = eval(c, sc, n->b, &a)))
            return rc;
        if (n->c && (rc = eval(c, sc, n->c, &b)))
            return rc;
        if (n->args[0] && (rc = eval(c, sc, n->args[0], &s)))
            return rc;
        return do_slice(c, n, &o, &a, &b, &s, out);
    }
    case E_CALL: {
        struct args a;
        const struct node *f = n->a;
        if (f->kind == E_ATTR && f->op == 0) {
            struct val o;
            if ((rc = eval(c, sc, f->a, &o)))
                return rc;
            /* Python's getattr finds a dict's methods before its keys: schema.items()
             * is the method even when the schema has an "items" key */
            static const char *const dict_methods[] = { "items", "keys", "values", "get",
                                                        "copy", "update", "pop", "setdefault",
                                                        "clear", "popitem", NULL };
            int is_dict_method = 0;
            for (int i = 0; o.t == V_DICT && dict_methods[i]; i++)
                is_dict_method |= !strcmp(f->name, dict_methods[i]);
            if (o.t == V_STR || o.t == V_LIST
                || (o.t == V_DICT && (is_dict_method || dict_find_cstr(o.u.d, f->name) < 0))
                || o.t == V_LOOP) {
                if ((rc = eval_args(c, sc, n, &a)))
                    return rc;
                if (o.t == V_STR)
                    return str_method(c, n, &o, f->name, &a, out);
                if (o.t == V_LIST)
                    return list_method(c, n, &o, f->name, &a, out);
                if (o.t == V_DICT)
                    return dict_method(c, n, &o, f->name, &a, out);
                if (!strcmp(f->name, "cycle") && a.n > 0) {
                    *out = a.v[o.u.lp->index0 % a.n];
                    return 0;
                }
                return rt_fail(c, n, STRATA_E_UNSUPPORTED, "loop.%s() is not supported", f->name);
            }
            struct val fn;
            if ((rc = get_attr(c, f, &o, f->name, &fn)) || (rc = eval_args(c, sc, n, &a)))
                return rc;
            return call_value(c, sc, n, &fn, &a, out);
        }
        struct val fn;
        if ((rc = eval(c, sc, f, &fn)))
            return rc;
        if (fn.t == V_LOOP)
            return rt_fail(c, n, STRATA_E_UNSUPPORTED, "recursive loops are not supported");
        if ((rc = eval_args(c, sc, n, &a)))
            return rc;
        return call_value(c, sc, n, &fn, &a, out);
    }
    case E_FILTER: {
        struct val v;
        struct args a;
        if ((rc = eval(c, sc, n->a, &v)) || (rc = eval_args(c, sc, n, &a)))
            return rc;
        return apply_filter(c, sc, n, n->name, &v, &a, out);
    }
    case E_TEST: {
        struct val v;
        struct args a;
        int r;
        if ((rc = eval(c, sc, n->a, &v)) || (rc = eval_args(c, sc, n, &a)))
            return rc;
        if ((rc = apply_test(c, n, n->name, &v, a.v, a.n, &r)))
            return rc;
        *out = mkbool(n->op ? !r : r);
        return 0;
    }
    case E_NEG:
    case E_POS: {
        struct val v;
        if ((rc = eval(c, sc, n->a, &v)))
            return rc;
        if (v.t == V_UNDEF)
            return undefined_error(c, n, &v);
        if (v.t == V_FLOAT)
            *out = mkfloat(n->kind == E_NEG ? -v.u.f : v.u.f);
        else if (v.t == V_INT || v.t == V_BOOL)
            *out = mkint(n->kind == E_NEG ? -v.u.i : v.u.i);
        else
            return rt_fail(c, n, STRATA_E_INVALID, "bad operand type for unary -: '%s'",
                           type_name(&v));
        return 0;
    }
    case E_NOT: {
        struct val v;
        if ((rc = eval(c, sc, n->a, &v)))
            return rc;
        *out = mkbool(!truthy(&v));
        return 0;
    }
    case E_AND:
    case E_OR: {
        struct val v;
        if ((rc = eval(c, sc, n->a, &v)))
            return rc;
        if (truthy(&v) == (n->kind == E_OR)) {
            *out = v;
            return 0;
        }
        return eval(c, sc, n->b, out);
    }
    case E_BIN: {
        struct val x, y;
        if ((rc = eval(c, sc, n->a, &x)) || (rc = eval(c, sc, n->b, &y)))
            return rc;
        return binop(c, n, n->op, &x, &y, out);
    }
    case E_CMP: {
        struct val x, y;
        if ((rc = eval(c, sc, n->a, &x)))
            return rc;
        for (int i = 0; i < n->n_args; i++) {
            if ((rc = eval(c, sc, n->args[i], &y)))
                return rc;
            int r = 0, op = n->ops[i];
            if (op == OP_EQ || op == OP_NE) {
                r = val_eq(&x, &y) == (op == OP_EQ);
            } else if (op == 'i' || op == 'n') {
                if ((rc = contains(c, n, &x, &y, &r)))
                    return rc;
                if (op == 'n')
                    r = !r;
            } else {
                int cr;
                if ((rc = val_cmp(c, n, &x, &y, &cr)))
                    return rc;
                r = op == '<' ? cr < 0 : op == OP_LE ? cr <= 0 : op == '>' ? cr > 0 : cr >= 0;
            }
            if (!r) {
                *out = mkbool(0);
                return 0;
            }
            x = y;
        }
        *out = mkbool(1);
        return 0;
    }
    case E_COND: {
        struct val cv;
        if ((rc = eval(c, sc, n->a, &cv)))
            return rc;
        if (truthy(&cv))
            return eval(c, sc, n->b, out);
        if (n->c)
            return eval(c, sc, n->c, out);
        *out = undef_hint("the inline if-expression evaluated to false and no else section was defined");
        return 0;
    }
    case E_LIST: {
        if ((rc = mklist(c, n, (size_t)n->n_args, out)))
            return rc;
        for (int i = 0; i < n->n_args; i++)
            if ((rc = eval(c, sc, n->args[i], &out->u.l->v[i])))
                return rc;
        out->u.l->n = (size_t)n->n_args;
        out->u.l->tuple = n->op;
        return 0;
    }
    case E_DICT: {
        if ((rc = mkdict(c, n, V_DICT, out)))
            return rc;
        for (int i = 0; i < n->n_args; i++) {
            struct val k, v;
            if ((rc = eval(c, sc, n->args[i], &k)) || (rc = eval(c, sc, n->kw[i], &v)))
                return rc;
            if ((rc = dict_set(c, n, out->u.d, k, v)))
                return rc;
        }
        return 0;
    }
    }
    return rt_fail(c, n, STRATA_E_INTERNAL, "bad expression node");
}

static int assign_targets(struct ctx *c, const struct node *at, struct scope *sc,
                          const char *const *names, int n, const struct val *v)
{
    if (n == 1)
        return scope_set(c, at, sc, names[0], *v);
    struct list *l;
    int rc;
    if ((rc = iterate(c, at, v, &l)))
        return rc;
    if ((int)l->n != n)
        return rt_fail(c, at, STRATA_E_INVALID, "cannot unpack %zu values into %d names", l->n, n);
    for (int i = 0; i < n; i++)
        if ((rc = scope_set(c, at, sc, names[i], l->v[i])))
            return rc;
    return 0;
}

static int capture(struct ctx *c, struct scope *sc, const struct node *body, struct val *out)
{
    struct buf cap = { 0 };
    struct buf *saved = c->out;
    c->out = &cap;
    int rc = exec_body(c, sc, body);
    c->out = saved;
    if (!rc)
        rc = mkstr(c, body, cap.p ? cap.p : "", cap.n, out);
    free(cap.p);
    return rc;
}

static int exec_for(struct ctx *c, struct scope *sc, const struct node *n)
{
    struct val it;
    struct list *src, *items;
    int rc;
    if ((rc = eval(c, sc, n->a, &it)) || (rc = iterate(c, n, &it, &src)))
        return rc;
    struct scope *ls = xalloc(c, sizeof *ls);
    if (!ls)
        return oom(c, n);
    memset(ls, 0, sizeof *ls);
    ls->parent = sc;
    items = src;
    if (n->n_args) {
        /* "for x in xs if cond": filter first, so loop.length counts what is kept */
        struct val kept;
        if ((rc = mklist(c, n, 0, &kept)))
            return rc;
        for (size_t i = 0; i < src->n; i++) {
            struct val cv;
            if (++c->iters > c->lim.max_loop_iters)
                return rt_fail(c, n, STRATA_E_LIMIT, "loops exceeded %llu iterations",
                               (unsigned long long)c->lim.max_loop_iters);
            if ((rc = assign_targets(c, n, ls, n->kw_names, n->n_kw, &src->v[i]))
                || (rc = eval(c, ls, n->args[0], &cv)))
                return rc;
            if (truthy(&cv) && (rc = list_push(c, n, kept.u.l, src->v[i])))
                return rc;
        }
        items = kept.u.l;
    }
    struct loopctx *lp = xalloc(c, sizeof *lp);
    if (!lp)
        return oom(c, n);
    lp->items = items;
    lp->length = (int64_t)items->n;
    lp->depth0 = 0;
    struct val lv = { .t = V_LOOP };
    lv.u.lp = lp;
    if ((rc = scope_set(c, n, ls, "loop", lv)))
        return rc;
    for (size_t i = 0; i < items->n; i++) {
        if (++c->iters > c->lim.max_loop_iters)
            return rt_fail(c, n, STRATA_E_LIMIT, "loops exceeded %llu iterations",
                           (unsigned long long)c->lim.max_loop_iters);
        lp->index0 = (int64_t)i;
        /* each iteration starts from a fresh scope: a set in one iteration is not
         * seen by the next (jinja2 semantics; namespaces carry state across) */
        ls->vars.n = 0;
        if ((rc = scope_set(c, n, ls, "loop", lv))
            || (rc = assign_targets(c, n, ls, n->kw_names, n->n_kw, &items->v[i])))
            return rc;
        if ((rc = exec_body(c, ls, n->b)))
            return rc;
        if (c->brk == 1) {
            c->brk = 0;
            break;
        }
        c->brk = 0;
    }
    if (items->n == 0 && n->c)
        return exec_body(c, sc, n->c);
    return 0;
}

static int exec_stmt(struct ctx *c, struct scope *sc, const struct node *n)
{
    int rc;
    if ((rc = step(c, n)))
        return rc;
    switch (n->kind) {
    case S_TEXT:
        return buf_add(c, n, c->out, n->name, n->name_len);
    case S_OUT: {
        struct val v;
        if ((rc = eval(c, sc, n->a, &v)))
            return rc;
        if (v.t == V_STR)
            return buf_add(c, n, c->out, v.u.s, v.n);
        return write_val(c, n, c->out, &v, 0);
    }
    case S_IF:
        for (int i = 0; i < n->n_args; i++) {
            struct val cv;
            if ((rc = eval(c, sc, n->args[i], &cv)))
                return rc;
            if (truthy(&cv))
                return exec_body(c, sc, n->kw[i]);
        }
        return n->c ? exec_body(c, sc, n->c) : 0;
    case S_FOR:
        return exec_for(c, sc, n);
    case S_SET: {
        struct val v;
        if ((rc = eval(c, sc, n->a, &v)))
            return rc;
        if (n->name) {
            struct val ns;
            if (!lookup(sc, n->name, &ns))
                return rt_fail(c, n, STRATA_E_INVALID, "'%s' is undefined", n->name);
            if (ns.t != V_NS)
                return rt_fail(c, n, STRATA_E_INVALID,
                               "cannot assign attribute on non-namespace object");
            return dict_set(c, n, ns.u.d, strlit(n->lit.u.s), v);
        }
        return assign_targets(c, n, sc, n->kw_names, n->n_kw, &v);
    }
    case S_SETBLOCK: {
        struct val v;
        if ((rc = capture(c, sc, n->b, &v)))
            return rc;
        if (n->a) {
            struct val saved = c->hole, r;
            c->hole = v;
            rc = eval(c, sc, n->a, &r);
            c->hole = saved;
            if (rc)
                return rc;
            v = r;
        }
        return scope_set(c, n, sc, n->name, v);
    }
    case S_WITH: {
        struct scope *ws = xalloc(c, sizeof *ws);
        if (!ws)
            return oom(c, n);
        memset(ws, 0, sizeof *ws);
        ws->parent = sc;
        for (int i = 0; i < n->n_kw; i++) {
            struct val v;
            /* values are evaluated in the outer scope, as jinja2 does */
            if ((rc = eval(c, sc, n->kw[i], &v)) || (rc = scope_set(c, n, ws, n->kw_names[i], v)))
                return rc;
        }
        return exec_body(c, ws, n->b);
    }
    case S_FILTERBLOCK: {
        struct val v, r;
        if ((rc = capture(c, sc, n->b, &v)))
            return rc;
        struct val saved = c->hole;
        c->hole = v;
        rc = eval(c, sc, n->a, &r);
        c->hole = saved;
        if (rc)
            return rc;
        return write_val(c, n, c->out, &r, 0);
    }
    case S_MACRO: {
        struct macro *m = xalloc(c, sizeof *m);
        if (!m)
            return oom(c, n);
        m->def = n;
        m->closure = sc;
        struct val mv = { .t = V_MACRO };
        mv.u.m = m;
        return scope_set(c, n, sc, n->name, mv);
    }
    case S_CALLBLOCK: {
        struct macro *m = xalloc(c, sizeof *m);
        if (!m)
            return oom(c, n);
        m->def = n; /* params in kw_names/kw, body in b: the same shape as a macro */
        m->closure = sc;
        struct val cv = { .t = V_MACRO }, r;
        cv.u.m = m;
        c->pending_caller = cv;
        rc = eval(c, sc, n->a, &r);
        c->pending_caller.t = V_UNDEF;
        if (rc)
            return rc;
        return write_val(c, n, c->out, &r, 0);
    }
    case S_BREAK:
        c->brk = 1;
        return 0;
    case S_CONTINUE:
        c->brk = 2;
        return 0;
    case S_BODY:
        return exec_body(c, sc, n);
    }
    return rt_fail(c, n, STRATA_E_INTERNAL, "bad statement node");
}

static int exec_body(struct ctx *c, struct scope *sc, const struct node *body)
{
    int rc;
    if (++c->depth > c->lim.max_depth + 64) {
        c->depth--;
        return rt_fail(c, body, STRATA_E_LIMIT, "blocks nested too deeply");
    }
    for (int i = 0; i < body->n_args; i++) {
        if ((rc = exec_stmt(c, sc, body->args[i]))) {
            c->depth--;
            return rc;
        }
        if (c->brk)
            break;
    }
    c->depth--;
    return 0;
}

/* jinja2 refuses, when compiling, a filter or test name it does not know, except
 * inside an if statement or an inline if (where the error waits for run time); a loop,
 * macro, call, filter, with or block-set body inside the if is strict again. */
#define PARSE_MAX_HEIGHT 1000

static int check_names(const struct strata_jinja *t, const struct node *n, int soft,
                       int height, struct strata_err *err)
{
    int rc = 0;
    if (!n)
        return 0;
    if (height > PARSE_MAX_HEIGHT)
        return strata_err_set(err, STRATA_E_LIMIT,
                              "template '%s' line %d column %d: expression nested too deeply "
                              "(more than %d levels)", t->name, n->line, n->col, PARSE_MAX_HEIGHT);
    if ((n->kind == E_FILTER || n->kind == E_TEST) && n->unknown && !soft)
        return strata_err_set(err, STRATA_E_FORMAT, "template '%s' line %d column %d: no %s named '%s'",
                              t->name, n->line, n->col, n->kind == E_FILTER ? "filter" : "test",
                              n->name);
    int sa = soft, sb = soft, sc = soft, sargs = soft, skw = soft;
    int n_args = n->n_args, n_kw = n->n_kw;
    switch (n->kind) {
    case S_IF:
    case E_COND:
        sa = sb = sc = sargs = skw = 1;
        n_kw = n->kind == S_IF ? n->n_args : 0;
        break;
    case S_FOR:
        sb = sc = sargs = 0;
        n_kw = 0;
        break;
    case S_MACRO:
    case S_CALLBLOCK:
        sb = skw = 0;
        break;
    case S_FILTERBLOCK:
    case S_SETBLOCK:
        sa = sb = 0;
        break;
    case S_WITH:
        sb = 0;
        break;
    case E_DICT:
        n_kw = n->n_args;
        break;
    case E_SLICE:
        if (n->args && (rc = check_names(t, n->args[0], soft, height + 1, err)))
            return rc;
        n_args = 0;
        break;
    default:
        break;
    }
    if ((rc = check_names(t, n->a, sa, height + 1, err)) || (rc = check_names(t, n->b, sb, height + 1, err))
        || (rc = check_names(t, n->c, sc, height + 1, err)))
        return rc;
    for (int i = 0; i < n_args && n->args; i++)
        if ((rc = check_names(t, n->args[i], sargs, height + 1, err)))
            return rc;
    for (int i = 0; i < n_kw && n->kw; i++)
        if ((rc = check_names(t, n->kw[i], skw, height + 1, err)))
            return rc;
    return 0;
}

/* ---------------------------------------------------------------- public API */

int strata_jinja_parse(struct strata_jinja **out, const char *src, size_t len, const char *name,
                       struct strata_err *err)
{
    struct strata_jinja *t = calloc(1, sizeof *t);
    char *norm = NULL;
    struct lexer lx = { 0 };
    int rc = 0;
    *out = NULL;
    if (!t || !(t->name = strdup(name ? name : "template"))) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    t->ar.cap = (size_t)1 << 40;
    /* newlines: \r\n and \r read as \n; one trailing newline is dropped
     * (jinja2's keep_trailing_newline=False) */
    norm = arena_alloc(&t->ar, len + 1);
    if (!norm) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n')
        n--;
    norm[n] = 0;
    lx.ar = &t->ar;
    lx.src = norm;
    lx.len = n;
    lx.name = t->name;
    lx.err = err;
    if ((rc = lex(&lx)))
        goto out;
    struct parser p = { &t->ar, lx.toks, 0, lx.n, t->name, 0, err };
    if ((rc = parse_body(&p, &t->root, NULL, NULL)) || (rc = check_names(t, t->root, 0, 0, err)))
        goto out;
    *out = t;
    t = NULL;
out:
    free(lx.toks);
    strata_jinja_free(t);
    return rc;
}

void strata_jinja_free(struct strata_jinja *t)
{
    if (!t)
        return;
    arena_free(&t->ar);
    free(t->name);
    free(t);
}

static int from_json(struct ctx *c, const cJSON *j, struct val *out, int depth)
{
    int rc;
    if (depth > 512)
        return rt_fail(c, NULL, STRATA_E_LIMIT, "variables nested too deeply");
    if (cJSON_IsNull(j)) {
        *out = NONE;
    } else if (cJSON_IsBool(j)) {
        *out = mkbool(cJSON_IsTrue(j));
    } else if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0)
            *out = mkint((int64_t)d);
        else
            *out = mkfloat(d);
    } else if (cJSON_IsString(j)) {
        out->t = V_STR;
        out->u.s = j->valuestring ? j->valuestring : "";
        out->n = strlen(out->u.s);
    } else if (cJSON_IsArray(j)) {
        if ((rc = mklist(c, NULL, (size_t)cJSON_GetArraySize(j), out)))
            return rc;
        const cJSON *e;
        cJSON_ArrayForEach(e, j)
        {
            if ((rc = from_json(c, e, &out->u.l->v[out->u.l->n], depth + 1)))
                return rc;
            out->u.l->n++;
        }
    } else if (cJSON_IsObject(j)) {
        if ((rc = mkdict(c, NULL, V_DICT, out)))
            return rc;
        const cJSON *e;
        cJSON_ArrayForEach(e, j)
        {
            struct val v;
            if ((rc = from_json(c, e, &v, depth + 1)))
                return rc;
            if ((rc = dict_set(c, NULL, out->u.d, strlit(e->string ? e->string : ""), v)))
                return rc;
        }
    } else {
        *out = NONE;
    }
    return 0;
}

int strata_jinja_render(const struct strata_jinja *t, const cJSON *vars,
                        const struct strata_jinja_opts *opts, char **out, size_t *out_len,
                        struct strata_err *err)
{
    struct ctx c;
    struct buf main = { 0 };
    int rc = 0;
    memset(&c, 0, sizeof c);
    *out = NULL;
    if (out_len)
        *out_len = 0;
    c.t = t;
    c.err = err;
    if (opts) {
        c.lim = opts->limits;
        c.now = opts->now;
    }
    if (!c.lim.max_steps) c.lim.max_steps = DEF_MAX_STEPS;
    if (!c.lim.max_loop_iters) c.lim.max_loop_iters = DEF_MAX_LOOP;
    if (c.lim.max_depth <= 0) c.lim.max_depth = DEF_MAX_DEPTH;
    if (!c.lim.max_output) c.lim.max_output = DEF_MAX_OUTPUT;
    if (!c.lim.max_memory) c.lim.max_memory = DEF_MAX_MEMORY;
    c.ar.cap = c.lim.max_memory;
    c.hole = UNDEF;
    c.pending_caller = UNDEF;
    c.out = &main;
    struct scope *globals = xalloc(&c, sizeof *globals), *top = xalloc(&c, sizeof *top);
    if (!globals || !top) {
        rc = oom(&c, NULL);
        goto out;
    }
    memset(globals, 0, sizeof *globals);
    memset(top, 0, sizeof *top);
    top->parent = globals;
    if (vars) {
        if (!cJSON_IsObject(vars)) {
            rc = strata_err_set(err, STRATA_E_INVALID, "template variables must be a JSON object");
            goto out;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, vars)
        {
            struct val v;
            if ((rc = from_json(&c, e, &v, 0)))
                goto out;
            if ((rc = dict_set(&c, NULL, &globals->vars, strlit(e->string ? e->string : ""), v)))
                goto out;
        }
    }
    if ((rc = exec_body(&c, top, t->root)))
        goto out;
    if (!main.p && !(main.p = calloc(1, 1))) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    *out = main.p;
    if (out_len)
        *out_len = main.n;
    main.p = NULL;
out:
    free(main.p);
    arena_free(&c.ar);
    return rc;
}
