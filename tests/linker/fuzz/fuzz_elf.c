/* libFuzzer harness for the ELF reader. Invariants beyond "no crash, no ASan report": the
 * buffer reader and the descriptor reader (size known, and size learnt from the reads)
 * agree on every input. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "elf.h"

static int memfd = -1;

static void same(int rc_a, const struct cds_elf_info *a, int rc_b, const struct cds_elf_info *b)
{
    if (rc_a != rc_b)
        abort();
    if (rc_a == CDS_ELF_LIBRARY
        && (a->flags != b->flags || a->isa_level != b->isa_level || a->has_soname != b->has_soname
            || strcmp(a->soname, b->soname) != 0))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const int targets[] = {CDS_TARGET_X86_64, CDS_TARGET_AARCH64};
    if (memfd < 0)
        memfd = memfd_create("fuzz-elf", MFD_CLOEXEC);
    if (memfd < 0 || ftruncate(memfd, 0) != 0 || pwrite(memfd, data, size, 0) != (ssize_t)size)
        abort();
    for (int t = 0; t < 2; t++) {
        struct cds_elf_info mem, known, learnt;
        int rc = cds_elf_parse(data, size, targets[t], &mem);
        if (rc == CDS_ELF_LIBRARY && mem.has_soname && strlen(mem.soname) != mem.soname_len)
            abort();
        same(rc, &mem, cds_elf_read_fd(memfd, size, targets[t], &known), &known);
        same(rc, &mem, cds_elf_read_fd(memfd, UINT64_MAX, targets[t], &learnt), &learnt);
    }
    return 0;
}
