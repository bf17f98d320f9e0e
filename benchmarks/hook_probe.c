/* What a container sees of the toolkit's hooks' work, for benchmarks/hook_differential.py.
 *
 * Built with gcc -static, so it runs in any image, whatever the loader's cache says.
 * Usage: /probe PATH... -- SONAME...
 *   each PATH: its entries (type, mode, link text, whether a link resolves), a small
 *   regular file's bytes (the ld.so.conf files), /etc/ld.so.cache's bytes in hex;
 *   each SONAME: dlopen's result -- the path the loader chose and the library's fake_id().
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void show_file(const char *path, const char *tag, size_t limit)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("%s %s unreadable\n", tag, path);
        return;
    }
    printf("%s %s ", tag, path);
    int c;
    size_t n = 0;
    while ((c = fgetc(f)) != EOF && n++ < limit)
        printf("%02x", c);
    printf("\n");
    fclose(f);
}

static void show_entry(const char *path)
{
    struct stat st, target;
    if (lstat(path, &st) != 0) {
        printf("entry %s absent\n", path);
        return;
    }
    char type = S_ISDIR(st.st_mode) ? 'd'
        : S_ISLNK(st.st_mode)       ? 'l'
        : S_ISREG(st.st_mode)       ? 'f'
        : S_ISCHR(st.st_mode)       ? 'c'
                                    : '?';
    printf("entry %s %c %04o", path, type, (unsigned)(st.st_mode & 07777));
    if (type == 'l') {
        char text[4096];
        ssize_t len = readlink(path, text, sizeof text - 1);
        text[len < 0 ? 0 : len] = 0;
        printf(" -> %s %s", text, stat(path, &target) == 0 ? "resolves" : "dangles");
    }
    printf("\n");
    size_t plen = strlen(path);
    if (type == 'f' && plen > 5 && (!strcmp(path + plen - 5, ".conf") || !strcmp(path + plen - 5, "/.ro")))
        show_file(path, "bytes", 4096);
}

static void show_tree(const char *path)
{
    show_entry(path);
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return;
    struct dirent **names;
    int n = scandir(path, &names, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i]->d_name, ".") && strcmp(names[i]->d_name, "..")) {
            char child[4096];
            snprintf(child, sizeof child, "%s/%s", path, names[i]->d_name);
            show_entry(child);
        }
        free(names[i]);
    }
    if (n >= 0)
        free(names);
}

int main(int argc, char **argv)
{
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--"); i++)
        show_tree(argv[i]);
    show_file("/etc/ld.so.cache", "cache", 1 << 20);
    show_file("/etc/ld.so.conf", "bytes", 4096);
    fflush(stdout);
    for (i++; i < argc; i++) { /* each in a new process: one load must not answer for the next */
        pid_t child = fork();
        if (child > 0) {
            waitpid(child, NULL, 0);
            continue;
        }
        void *handle = dlopen(argv[i], RTLD_NOW);
        if (!handle) {
            printf("dlopen %s fails\n", argv[i]);
            _exit(0);
        }
        struct link_map *map = NULL;
        dlinfo(handle, RTLD_DI_LINKMAP, &map);
        const char *(*id)(void) = (const char *(*)(void))dlsym(handle, "fake_id");
        printf("dlopen %s %s %s\n", argv[i], map ? map->l_name : "?", id ? id() : "?");
        fflush(stdout);
        _exit(0);
    }
    return 0;
}
