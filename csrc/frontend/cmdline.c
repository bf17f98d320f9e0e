/* runc's command line as the front end reads it: which options take a value (runtime_rules.h,
 * made from shim/runtime/runc_args.py), our --device, help, and create/run's bundle. */
#include <string.h>

#include "runtime_rules.h"
#include "frontend.h"

/* Whether NAME (LEN bytes, not NUL-terminated) is one of the NULL-terminated NAMES. */
int among(const char *name, size_t len, const char *const *names)
{
    for (; *names; names++)
        if (strlen(*names) == len && strncmp(name, *names, len) == 0)
            return 1;
    return 0;
}

int is_device_option(const char *name, size_t len)
{
    return among(name, len, (const char *const[]){CDS_DEVICE_OPTION, NULL});
}

/* runc's global options that take a value, and ours. */
int global_takes_value(const char *name, size_t len)
{
    return among(name, len, cds_global_value_options) || is_device_option(name, len);
}

/* Option name without leading dashes and its length (up to '=' if any). */
const char *option_name(const char *arg, size_t *len)
{
    const char *name = arg + (arg[1] == '-' ? 2 : 1);
    const char *eq = strchr(name, '=');
    *len = eq ? (size_t)(eq - name) : strlen(name);
    return name;
}

int is_help_option(const char *name, size_t len) { return among(name, len, cds_help_options); }

/* A --device option without "=": whether the next argument is its value (a device name never
 * starts with '-', so `--device --help` asks for help, not for a device called "--help"). */
int device_value_follows(char **args, int i, int n) { return i + 1 < n && args[i + 1][0] != '-'; }

/* Options of create/run that take a value; the rest of theirs are booleans. */
int create_takes_value(const char *name, size_t len) { return among(name, len, cds_create_value_options); }

struct create_line scan_create(char **args, int n)
{
    struct create_line line = {".", 0, 0, n, NULL};
    for (int i = 1; i < n; i++) {
        const char *a = args[i];
        if (a[0] != '-' || strcmp(a, "-") == 0 || strcmp(a, "--") == 0) {
            line.end = i;
            /* runc (urfave/cli) also takes its options after the container id: --help there
             * shows the command's help too */
            for (int j = i; j < n && strcmp(args[j], "--") != 0; j++)
                if (strcmp(args[j], "--help") == 0 || strcmp(args[j], "-h") == 0 || strcmp(args[j], "-help") == 0
                    || strcmp(args[j], "--h") == 0)
                    line.help = 1;
            break;
        }
        size_t len;
        const char *name = option_name(a, &len);
        const char *eq = strchr(a, '=');
        if (is_device_option(name, len)) {
            line.has_device = 1;
            if (!eq && device_value_follows(args, i, n))
                i++;
        } else if (is_help_option(name, len)) {
            line.help = 1;
        } else if (create_takes_value(name, len)) {
            if ((len == 6 && strncmp(name, "bundle", 6) == 0) || (len == 1 && name[0] == 'b'))
                line.bundle = eq ? eq + 1 : (i + 1 < n ? args[i + 1] : ".");
            else if (len == 8 && strncmp(name, "pid-file", 8) == 0)
                line.pid_file = eq ? eq + 1 : (i + 1 < n ? args[i + 1] : NULL);
            if (!eq)
                i++;
        }
    }
    return line;
}

/* The container id at argv[AT] (past a "--"), for log lines; NULL when there is none. */
const char *container_id(char **argv, int argc, int at)
{
    if (at < argc && strcmp(argv[at], "--") == 0)
        at++;
    return at < argc ? argv[at] : NULL;
}

/* The values of our --device options among runc's global options (ARGV[1 .. COMMAND)) and
 * create's (ARGV[COMMAND + 1 .. END)), in that order (shim/runtime/runc_args.py's), each
 * NUL-terminated into OUT (CAP bytes): their length in all, or -1 when one has no value (the
 * Python half says so) or they do not fit. */
long device_values(char **argv, int command, int end, char *out, size_t cap)
{
    size_t at = 0;
    for (int i = 1; i < end; i++) {
        const char *a = argv[i];
        if (i == command || a[0] != '-')
            continue;
        size_t len;
        const char *name = option_name(a, &len), *eq = strchr(a, '=');
        if (is_device_option(name, len)) {
            const char *value = eq ? eq + 1 : device_value_follows(argv, i, end) ? argv[++i] : NULL;
            size_t n = value ? strlen(value) + 1 : 0;
            if (!value || at + n > cap)
                return -1;
            memcpy(out + at, value, n);
            at += n;
        } else if (!eq && (i < command ? global_takes_value(name, len) : create_takes_value(name, len))) {
            i++;
        }
    }
    return (long)at;
}
