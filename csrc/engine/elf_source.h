/* The bytes of one file (by descriptor) or buffer as the ELF reader (elf.c, its only user) reads
 * them.
 *
 * glibc's ldconfig maps the file and checks only where a pointer starts, so it reads past the
 * end of a short file into the zeros that fill the mapping's last page (and dies of SIGBUS
 * beyond it). We read with pread and reproduce that: bytes past the end read as zero up to
 * the next 4 KiB boundary, and a read beyond that boundary (where ldconfig would crash) is
 * READ_BEYOND. A descriptor's first HEAD bytes are read at once, later reads go through two
 * windows.
 *
 * Static functions: included by elf.c alone, they compile in its translation unit as before
 * (the reads stay inlined on the ELF reader's hot path). */
#ifndef CDI_SHIM_ELF_SOURCE_H
#define CDI_SHIM_ELF_SOURCE_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define PAGE 4096u
#define HEAD 1024u
#define WINDOW 1024u

enum { READ_OK = 0, READ_BEYOND = 1, READ_IO = -1 };

#define SIZE_UNKNOWN UINT64_MAX

/* The bytes of a file (by descriptor) or a buffer. A descriptor's size may be unknown: it
 * is learnt when a read comes back short (or from fstat, when a read finds nothing). */
struct src {
    int fd;
    const uint8_t *mem;
    uint64_t size;  /* SIZE_UNKNOWN until known */
    uint64_t limit; /* size rounded up to a page: where reads stop */
    uint64_t seen;  /* [0, seen) is known to exist */
    uint8_t head[HEAD];
    size_t head_len;
    uint8_t window[2][WINDOW]; /* the last two blocks read past the head */
    uint64_t window_off[2];
    size_t window_len[2];
    int last; /* the window used last */
};

static int pread_full(int fd, uint8_t *out, size_t len, uint64_t off, size_t *got)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, out + done, len - done, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0)
            break; /* end of file */
        done += (size_t)n;
    }
    *got = done;
    return 0;
}

static void set_size(struct src *s, uint64_t size)
{
    s->size = size;
    s->limit = size % PAGE == 0 ? size : size + (PAGE - size % PAGE);
}

static int learn_size(struct src *s)
{
    struct stat st;
    if (fstat(s->fd, &st) < 0)
        return READ_IO;
    set_size(s, (uint64_t)st.st_size);
    return READ_OK;
}

/* Read a window at OFF (descriptor only): WANT bytes at most (strings need little). */
static int fill_n(struct src *s, uint64_t off, size_t want, int *which)
{
    int w = 1 - s->last;
    size_t got = 0;
    if (s->size != SIZE_UNKNOWN)
        want = off >= s->size ? 0 : (s->size - off < want ? (size_t)(s->size - off) : want);
    if (off > (uint64_t)INT64_MAX - WINDOW)
        want = 0; /* past any file: pread would call it EINVAL */
    if (want > 0 && pread_full(s->fd, s->window[w], want, off, &got) < 0)
        return READ_IO;
    s->window_off[w] = off;
    s->window_len[w] = got;
    s->last = w;
    *which = w;
    if (got > 0 && off + got > s->seen)
        s->seen = off + got;
    if ((got < want || want == 0) && s->size == SIZE_UNKNOWN) {
        if (got > 0)
            set_size(s, off + got);
        else if (learn_size(s) != READ_OK)
            return READ_IO;
    }
    return READ_OK;
}

static int fill(struct src *s, uint64_t off, int *which) { return fill_n(s, off, WINDOW, which); }

/* ldconfig's check_ptr: is OFF inside the file (the end itself included)? 1, 0 or -1. */
static int within(struct src *s, uint64_t off)
{
    if (off <= s->seen)
        return 1;
    if (s->size == SIZE_UNKNOWN) {
        int w;
        if (fill(s, off, &w) != READ_OK)
            return -1;
        if (s->size == SIZE_UNKNOWN)
            return 1; /* bytes came back from OFF */
    }
    return off <= s->size;
}

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

/* [OFF, OFF+LEN) inside [START, START+AVAIL)? (no overflow for any OFF) */
static int covers(uint64_t start, size_t avail, uint64_t off, size_t len)
{
    return off >= start && off - start <= avail && len <= avail - (off - start);
}

static int src_read_n(struct src *s, uint64_t off, size_t len, void *dst, size_t window)
{
    uint8_t *out = dst;
    if (s->mem == NULL) {
        if (covers(0, s->head_len, off, len)) {
            memcpy(out, s->head + off, len);
            return READ_OK;
        }
        for (int w = 0; w < 2; w++)
            if (covers(s->window_off[w], s->window_len[w], off, len)) {
                memcpy(out, s->window[w] + (off - s->window_off[w]), len);
                s->last = w;
                return READ_OK;
            }
        if (s->size == SIZE_UNKNOWN) {
            if (len <= window) {
                int w;
                if (fill_n(s, off, window, &w) != READ_OK)
                    return READ_IO;
                if (s->window_len[w] >= len) {
                    memcpy(out, s->window[w], len);
                    return READ_OK;
                }
            } else if (learn_size(s) != READ_OK) {
                return READ_IO;
            }
        }
    }
    /* The size is known: ldconfig's view of the mapping, zeros to the page's end. */
    if (off > s->limit || len > s->limit - off)
        return READ_BEYOND;
    size_t avail = 0;
    if (off < s->size)
        avail = (s->size - off) < len ? (size_t)(s->size - off) : len;
    memset(out + avail, 0, len - avail);
    if (avail == 0)
        return READ_OK;
    if (s->mem != NULL) {
        memcpy(out, s->mem + off, avail);
        return READ_OK;
    }
    if (covers(0, s->head_len, off, avail)) {
        memcpy(out, s->head + off, avail);
        return READ_OK;
    }
    for (int w = 0; w < 2; w++)
        if (covers(s->window_off[w], s->window_len[w], off, avail)) {
            memcpy(out, s->window[w] + (off - s->window_off[w]), avail);
            s->last = w;
            return READ_OK;
        }
    size_t got;
    if (avail > WINDOW) {
        if (pread_full(s->fd, out, avail, off, &got) < 0)
            return READ_IO;
        if (got < avail)
            memset(out + got, 0, avail - got); /* shrank under us */
        return READ_OK;
    }
    int w;
    if (fill_n(s, off, avail > window ? avail : window, &w) != READ_OK)
        return READ_IO;
    size_t have = s->window_len[w] < avail ? s->window_len[w] : avail;
    if (have > 0)
        memcpy(out, s->window[w], have);
    if (have < avail)
        memset(out + have, 0, avail - have);
    return READ_OK;
}

static int src_read(struct src *s, uint64_t off, size_t len, void *dst) { return src_read_n(s, off, len, dst, WINDOW); }

#define STRING_WINDOW 256u

/* A NUL-terminated string at OFF, zero-extended like the rest. */
static int src_string(struct src *s, uint64_t off, char *buf, size_t cap, size_t *len)
{
    size_t got = 0;
    while (got < cap) {
        size_t chunk = cap - got < 64 ? cap - got : 64;
        int rc = src_read_n(s, off + got, chunk, buf + got, STRING_WINDOW);
        if (rc == READ_BEYOND) {
            /* Near the end of the mapping: take what is left of it. */
            if (off + got >= s->limit)
                return READ_BEYOND;
            if (chunk > s->limit - (off + got))
                chunk = (size_t)(s->limit - (off + got));
            rc = src_read_n(s, off + got, chunk, buf + got, STRING_WINDOW);
        }
        if (rc != READ_OK)
            return rc;
        void *nul = memchr(buf + got, '\0', chunk);
        if (nul != NULL) {
            *len = (size_t)((char *)nul - buf);
            return READ_OK;
        }
        got += chunk;
    }
    return 2; /* longer than CAP */
}

static void src_init(struct src *s, int fd, const uint8_t *mem, uint64_t size)
{
    s->fd = fd;
    s->mem = mem;
    s->size = SIZE_UNKNOWN;
    s->limit = SIZE_UNKNOWN;
    s->seen = 0;
    if (size != SIZE_UNKNOWN) {
        set_size(s, size);
        s->seen = size;
    }
    s->head_len = 0;
    s->window_off[0] = s->window_off[1] = 0;
    s->window_len[0] = s->window_len[1] = 0;
    s->last = 0;
}

#endif
