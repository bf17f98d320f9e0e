/* libFuzzer harness for the ld.so.cache reader (and the writer, by round trip).
 * Invariants beyond "no crash, no ASan report": a cache that parses can be rebuilt, and the
 * rebuilt file parses to the same entries. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "elf.h"
#include "inroot.h"
#include "ldcache.h"

static int has_long_number(const char *s)
{
    int run = 0;
    for (; *s != '\0'; s++) {
        run = (*s >= '0' && *s <= '9') ? run + 1 : 0;
        if (run >= 9)
            return 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cds_cache *cache = NULL;
    const char *why = NULL;
    if (cds_cache_parse(data, size, &cache, &why) != 0) {
        if (why == NULL || why[0] == '\0')
            abort(); /* every refusal says why */
        return 0;
    }
    uint32_t n = cds_cache_count(cache);
    size_t total = 0;
    int long_numbers = 0; /* glibc's libcmp overflows there: no order to check */
    for (uint32_t i = 0; i < n; i++) {
        struct cds_cache_entry e;
        if (cds_cache_entry(cache, i, &e) != 0)
            abort();
        long_numbers |= has_long_number(e.key);
        total += strlen(e.key) + strlen(e.value);
        if (e.hwcaps != NULL)
            total += strlen(e.hwcaps);
        if (e.hwcaps_print != NULL)
            total += strlen(e.hwcaps_print);
    }
    size_t glen;
    const char *gen = cds_cache_generator(cache, &glen);
    if (gen != NULL && gen[glen] != '\0')
        abort();
    (void)cds_cache_unsorted_at(cache, CDS_TARGET_X86_64);
    (void)cds_cache_unsorted_at(cache, CDS_TARGET_AARCH64);
    char *names = NULL;
    uint32_t *counts = NULL;
    size_t names_len = 0;
    if (cds_cache_dirs(cache, &names, &counts, &names_len) >= 0) {
        cds_free(names);
        cds_free(counts);
    }

    /* Round trip through the writer. */
    struct cds_builder *b = cds_builder_new(CDS_TARGET_X86_64);
    long unknown = cds_builder_add_cache(b, cache, NULL, NULL, 0, 0);
    if (unknown >= 0) {
        uint8_t *out = NULL;
        size_t out_len = 0;
        if (cds_builder_build(b, CDS_FORMAT_NEW, "fuzz", &out, &out_len) == 0) {
            struct cds_cache *again = NULL;
            if (cds_cache_parse(out, out_len, &again, &why) != 0)
                abort(); /* what we write, we read */
            if (cds_cache_count(again) != cds_builder_count(b))
                abort();
            if (!long_numbers && cds_cache_unsorted_at(again, CDS_TARGET_X86_64) != -1)
                abort(); /* and it is in ldconfig's order */
            cds_cache_free(again);
            cds_free(out);
        }
    }
    cds_builder_free(b);
    cds_cache_free(cache);
    return total == (size_t)-1;
}
