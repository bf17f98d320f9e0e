/* What reading a host file as an extra gave (not part of the cffi surface; see scan.h for
 * the switch). Driver libraries are mounted into every GPU container from the same host
 * files, so a long-lived process (the runtime's resident worker) may keep each file's ELF
 * facts, keyed by its path and stat identity (device, inode, size, mtime, ctime: the key
 * ldconfig's own aux cache trusts), and stat the file instead of reading it again. Only
 * host files, never the image's: a container's files are new on every create anyway. */
#ifndef CDI_SHIM_HOSTMEMO_H
#define CDI_SHIM_HOSTMEMO_H

#include <stdint.h>
#include <sys/stat.h>

struct hostmemo_value {
    int status;                       /* CDS_ELF_* (errors are never kept) */
    int32_t flags;
    uint32_t isa_level;
    char *soname;                     /* malloc'd copy on lookup; NULL when none */
};

int hostmemo_enabled(void);
/* 1 and V filled on a hit (V->soname is the caller's to free); 0 on a miss or ENOMEM. */
int hostmemo_lookup(const char *path, const struct stat *st, struct hostmemo_value *v);
/* Keep V for PATH as ST identifies it (best effort: silently nothing on ENOMEM). */
void hostmemo_store(const char *path, const struct stat *st, const struct hostmemo_value *v);
/* Whether two stats name the same unchanged file. */
int hostmemo_same(const struct stat *a, const struct stat *b);

#endif
