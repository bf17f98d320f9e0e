/* What reading a library file gave, kept by a long-lived process (the runtime's resident
 * worker; see scan.h for the switch) so that the next scan stats the file instead of
 * reading it: ldconfig's aux cache, in memory. Not part of the cffi surface.
 *
 * Two kinds of file, two keys:
 * - host files read as extras (the driver libraries every GPU container mounts): their path
 *   and stat identity (device, inode, size, mtime, ctime: the key ldconfig's aux cache
 *   trusts);
 * - the image's own files: their name and stat identity. On overlayfs without the device:
 *   every container's root is a new overlay mount (a new device number), but a file from
 *   an image layer keeps its inode, size, mtime and ctime in every container of that
 *   image, so a node starting the same image again finds what it read the first time;
 * - the image's library directories: their listing (names, types, link texts), by stat
 *   identity the same way. Adding, removing or renaming an entry changes a directory's
 *   mtime and ctime, and a link's text cannot change in place. An overlay directory shows
 *   the identity of its topmost layer's copy, and a layer always sits on the same layers
 *   below it (containerd's and containers/storage's snapshots are keyed by their whole
 *   chain), so the identity stands for the merged listing too.
 *
 * A file changed in place within one tick of the clock the kernel stamps ctime with would
 * keep its key; so only files whose ctime is older than the settle window (CDS_SETTLE_NS,
 * memo_rules.h, Python's RACY_WINDOW_NS) before the scan
 * began are kept (an image's or a driver's files are hours old; a file being written is
 * read every time).
 *
 * What a hostile image could do with it: its files have inodes of their own, and a reused
 * inode number comes with a later ctime, which no image chooses. A false hit would need
 * another filesystem's file with the same name, inode, size, mtime and ctime, and would
 * still only change what the victim's cache says of the victim's own root: listed files
 * are stat'ed in the victim's directory, and links resolve inside its root. */
#ifndef CDI_SHIM_FILEMEMO_H
#define CDI_SHIM_FILEMEMO_H

#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

/* statfs(2)'s f_type of overlayfs: there an image file's device number is left out of its key. */
#define OVERLAYFS_MAGIC 0x794c7630

enum filememo_kind { FILEMEMO_HOST = 0, FILEMEMO_IMAGE = 1, FILEMEMO_DIR = 2 };

struct filememo_value {
    int status; /* CDS_ELF_* (errors are never kept) */
    int32_t flags;
    uint32_t isa_level;
    char *soname; /* malloc'd copy on lookup; NULL when none */
    /* FILEMEMO_DIR: the listing, a run of entries "<type byte><has link text byte>name\0
     * text\0" (text empty unless read); a malloc'd copy on lookup. */
    char *listing;
    size_t listing_size;
    uint32_t listing_count;
};

int filememo_enabled(void);
/* The time a scan starting now compares ctimes against (see filememo_store). */
struct timespec filememo_clock(void);
/* 1 and V filled on a hit (V->soname and V->listing are the caller's to free); 0 on a
 * miss or ENOMEM. NAME: the host path, the image file's name in its directory, or "" for
 * a directory. WITH_DEV: whether the device is part of the key (always for host files;
 * not on overlayfs). */
int filememo_lookup(enum filememo_kind kind, const char *name, const struct stat *st, int with_dev,
                    struct filememo_value *v);
/* Keep V for NAME as ST identifies it, if ST's ctime is settled at STARTED (the
 * filememo_clock() from before ST was taken). Best effort: nothing on ENOMEM. */
void filememo_store(enum filememo_kind kind, const char *name, const struct stat *st, int with_dev,
                    const struct filememo_value *v, struct timespec started);
/* Whether two stats of one path name the same unchanged file. */
int filememo_same(const struct stat *a, const struct stat *b);

#endif
