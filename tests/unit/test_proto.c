/* test_proto.c - engine protocol helpers: line framing, UTF-8 repair, stop strings. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto.h"
#include "tap.h"

static void test_stop(void)
{
    const char *stop[] = {"END", "\n\n", "", "xyzzy"};
    int which = 7;
    const char *t = "abc\n\nENDx";
    ok(strata_proto_stop_find(t, strlen(t), stop, 4, &which) == 3 && which == 1,
       "stop_find: earliest occurrence wins ('\\n\\n' at 3)");
    ok(strata_proto_stop_find("abcEN", 5, stop, 4, &which) == 5 && which == -1,
       "stop_find: an incomplete stop string is not found");
    const char *longer[] = {"ab", "abc"};
    ok(strata_proto_stop_find("xabc", 4, longer, 2, &which) == 1 && which == 1,
       "stop_find: the longest of those starting at one position");
    ok(strata_proto_stop_holdback("hello E", 7, stop, 4) == 1,
       "holdback: 'E' could still become 'END'");
    ok(strata_proto_stop_holdback("hello EN", 8, stop, 4) == 2, "holdback: 'EN'");
    ok(strata_proto_stop_holdback("hello ENq", 9, stop, 4) == 0, "holdback: 'ENq' cannot");
    ok(strata_proto_stop_holdback("a\n", 2, stop, 4) == 1, "holdback: a lone newline");
    ok(strata_proto_stop_holdback("xyzz", 4, stop, 4) == 4, "holdback: the whole text");
    ok(strata_proto_stop_holdback("abc", 3, stop, 0) == 0, "holdback: no stop strings");
}

static void test_utf8(void)
{
    size_t n = 0;
    char *s = strata_proto_utf8_fix("h\xC3\xA9llo", 6, &n);
    ok(s && n == 6 && !memcmp(s, "h\xC3\xA9llo", 6), "utf8_fix keeps valid text");
    free(s);
    s = strata_proto_utf8_fix("a\xC3", 2, &n);
    ok(s && n == 4 && !memcmp(s, "a\xEF\xBF\xBD", 4), "utf8_fix: a truncated character -> U+FFFD");
    free(s);
    s = strata_proto_utf8_fix("\xED\xA0\x80z", 4, &n);
    ok(s && n == 10 && s[9] == 'z', "utf8_fix: a surrogate's 3 bytes each -> U+FFFD");
    free(s);
    s = strata_proto_utf8_fix("a\0b", 3, &n);
    ok(s && n == 5 && strlen(s) == 5, "utf8_fix: NUL -> U+FFFD (JSON strings are C strings)");
    free(s);
    s = strata_proto_utf8_fix("\xF0\x9F\x98\x80", 4, &n);
    ok(s && n == 4, "utf8_fix keeps a 4-byte character");
    free(s);
}

static void test_reader(void)
{
    int p[2];
    if (pipe(p)) {
        ok(0, "pipe");
        return;
    }
    const char *data = "{\"type\":\"a\"}\r\n\n{\"type\":\"b\"}\npartial";
    ssize_t w = write(p[1], data, strlen(data));
    close(p[1]);
    struct strata_proto_reader r;
    strata_proto_reader_init(&r, p[0]);
    struct strata_err err = {0};
    int fill = strata_proto_reader_fill(&r, &err);
    char *l1 = strata_proto_reader_line(&r);
    char *l2 = strata_proto_reader_line(&r);
    char *l3 = strata_proto_reader_line(&r);
    char *l4 = strata_proto_reader_line(&r);
    ok(w > 0 && fill == 1, "reader fills from the descriptor");
    ok(l1 && !strcmp(l1, "{\"type\":\"a\"}"), "first line, '\\r\\n' stripped");
    ok(l2 && !strcmp(l2, ""), "an empty line");
    ok(l3 && !strcmp(l3, "{\"type\":\"b\"}"), "third line");
    ok(!l4, "an unterminated line waits for more");
    int eof = strata_proto_reader_fill(&r, &err);
    char *l5 = strata_proto_reader_line(&r);
    ok(eof == 0 && r.eof && l5 && !strcmp(l5, "partial"),
       "at end of file the last line comes out");
    free(l1);
    free(l2);
    free(l3);
    free(l4);
    free(l5);
    strata_proto_reader_free(&r);
    close(p[0]);

    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "x\ny");
    size_t n = 0;
    char *enc = strata_proto_encode(o, &n);
    ok(enc && n == strlen(enc) && enc[n - 1] == '\n' && !memchr(enc, '\n', n - 1),
       "encode: one line, newlines in strings escaped");
    free(enc);
    cJSON_Delete(o);
}

int main(void)
{
    test_stop();
    test_utf8();
    test_reader();
    return tap_done();
}
