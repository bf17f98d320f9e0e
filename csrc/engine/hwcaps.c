/* ldconfig's name tables: which subdirectory names are legacy hwcap ones (tls, x86_64,
 * haswell, ...), the hwcap bits a path's trailing components stand for, and which file names
 * look like shared libraries. Declared in scan.h. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "elf.h"
#include "scan.h"

static const char *const x86_hwcaps[] = {"sse2", "x86_64", "avx512_1"};
static const char *const x86_platforms[] = {"i586", "i686", "haswell", "xeon_phi"};
#define X86_FIRST_PLATFORM 48
static const char *const aarch64_hwcaps[] = {
    "fp",    "asimd",    "evtstrm", "aes",   "pmull",  "sha1",  "sha2", "crc32", "atomics", "fphp",    "asimdhp",
    "cpuid", "asimdrdm", "jscvt",   "fcma",  "lrcpc",  "dcpop", "sha3", "sm3",   "sm4",     "asimddp", "sha512",
    "sve",   "asimdfhm", "dit",     "uscat", "ilrcpc", "flagm", "ssbs", "sb",    "paca",    "pacg",
};
#define AARCH64_HWCAP_IMPORTANT (1u << 8) /* atomics */
#define TLS_HWCAP_BIT 63

static int string_hwcap(int target, const char *name)
{
    if (target == CDS_TARGET_AARCH64) {
        for (int i = 0; i < (int)(sizeof aarch64_hwcaps / sizeof *aarch64_hwcaps); i++)
            if (strcmp(name, aarch64_hwcaps[i]) == 0)
                return i;
        return -1;
    }
    for (int i = 0; i < 3; i++)
        if (strcmp(name, x86_hwcaps[i]) == 0)
            return i;
    return -1;
}

static int string_platform(int target, const char *name)
{
    if (target == CDS_TARGET_AARCH64)
        return -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(name, x86_platforms[i]) == 0)
            return X86_FIRST_PLATFORM + i;
    return -1;
}

int cds_is_hwcap_subdir(int target, const char *name)
{
    int idx = string_hwcap(target, name);
    uint32_t important = target == CDS_TARGET_AARCH64 ? AARCH64_HWCAP_IMPORTANT : 0x7u;
    if (idx != -1 && ((1u << idx) & important))
        return 1;
    if (string_platform(target, name) != -1)
        return 1;
    return strcmp(name, "tls") == 0;
}

uint64_t cds_path_hwcap(int target, const char *path)
{
    uint64_t hwcap = 0;
    char *copy = strdup(path);
    if (copy == NULL)
        return 0;
    for (;;) {
        char *slash = strrchr(copy, '/');
        if (slash == NULL)
            break;
        int bit = string_hwcap(target, slash + 1);
        if (bit == -1) {
            bit = string_platform(target, slash + 1);
            if (bit == -1) {
                if (strcmp(slash + 1, "tls") == 0)
                    bit = TLS_HWCAP_BIT;
                else
                    break;
            }
        }
        hwcap += 1ull << bit;
        *slash = '\0';
    }
    free(copy);
    return hwcap;
}

int cds_is_dso_name(const char *name)
{
    return ((strncmp(name, "lib", 3) == 0 || strncmp(name, "ld-", 3) == 0) && strstr(name, ".so") != NULL)
        || strncmp(name, "ld.so.", 6) == 0 || strncmp(name, "ld64.so.", 8) == 0;
}
