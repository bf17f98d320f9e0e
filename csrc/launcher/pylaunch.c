#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pylaunch.h"

/* Runs under `python -I -S` (no environment, no site: the hook and runtime paths must not be
 * steered by the caller, and site's start-up is a cost on every call): the prefix comes as argv[1], the program's name
 * as argv[2]. An editable install has no package in site-packages, only a .pth naming the
 * source tree, so site's reading of that folder happens only when the import fails. */
static const char boot[] = "import sys\n"
                           "prefix = sys.argv[1]\n"
                           "del sys.argv[:2]\n"
                           "packages = prefix + '/lib/python%%d.%%d/site-packages' %% sys.version_info[:2]\n"
                           "sys.path.insert(0, packages)\n"
                           "try:\n"
                           "    import shim\n"
                           "except ImportError:\n"
                           "    import site\n"
                           "    site.addsitedir(packages)\n"
                           "from %s import main\n"
                           "sys.exit(main())\n";

/* The prefix: the folder above the one holding this program, links resolved. */
static int own_prefix(char *prefix, size_t size)
{
    ssize_t n = readlink("/proc/self/exe", prefix, size - 1);
    if (n <= 0 || (size_t)n >= size - 1)
        return -1;
    prefix[n] = '\0';
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(prefix, '/');
        if (!slash)
            return -1;
        *slash = '\0';
    }
    if (!prefix[0])
        strcpy(prefix, "/");
    return 0;
}

int cds_exec_python(const char *module, int argc, char **argv, char *message, size_t size)
{
    char prefix[PATH_MAX], python[PATH_MAX + 16], code[sizeof(boot) + 128];
    if (own_prefix(prefix, sizeof(prefix)) != 0) {
        snprintf(message, size, "cannot tell where %s is installed (/proc/self/exe: %s)", argv[0],
                 strerror(errno ? errno : ENAMETOOLONG));
        return -1;
    }
    snprintf(python, sizeof(python), "%s/bin/python3", prefix);
    snprintf(code, sizeof(code), boot, module);
    char **args = calloc((size_t)argc + 8, sizeof(char *));
    if (!args) {
        snprintf(message, size, "out of memory");
        return -1;
    }
    int n = 0;
    args[n++] = python;
    args[n++] = "-I";
    args[n++] = "-S";
    args[n++] = "-c";
    args[n++] = code;
    args[n++] = prefix;
    for (int i = 0; i < argc; i++)
        args[n++] = argv[i];
    execv(python, args);
    int error = errno;
    free(args);
    snprintf(message, size, "cannot start %s: %s (%s needs the Python of the folder it is installed in)", python,
             strerror(error), argv[0]);
    return -1;
}
