/* fuzz_chat_parse.c - libFuzzer target: parse arbitrary generated text in every
 * tool-call format.  The first byte picks the format and the reasoning flag. */
#include <stdint.h>
#include <stdlib.h>

#include "chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    enum strata_chat_format f = (enum strata_chat_format)(data[0] % STRATA_CHAT_FORMAT_COUNT);
    unsigned flags = (data[0] & 0x80) ? STRATA_CHAT_PARSE_IN_REASONING : 0;
    cJSON *msg = NULL;
    struct strata_err err = { 0 };
    if (strata_chat_parse(f, (const char *)data + 1, size - 1, flags, &msg, &err) == 0) {
        /* a result is always an assistant message with content or calls */
        if (!cJSON_GetObjectItem(msg, "content"))
            abort();
        cJSON_Delete(msg);
    }
    return 0;
}
