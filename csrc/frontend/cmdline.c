/* runc's command line as the front end reads it, once (parse_line): which options take a value
 * (runtime_rules.h, made from shim/runtime/runc_args.py), our --device, help, runc's --log, and
 * create/run's bundle, pid file and container id; then the argv runc gets (runc_argv). */
#include <stdio.h>
#include <string.h>

#include "runtime_rules.h"
#include "frontend.h"

/* Whether NAME (LEN bytes, not NUL-terminated) is one of the NULL-terminated NAMES. */
static int among(const char *name, size_t len, const char *const *names)
{
    for (; *names; names++)
        if (strlen(*names) == len && strncmp(name, *names, len) == 0)
            return 1;
    return 0;
}

static int is_device_option(const char *name, size_t len)
{
    return among(name, len, (const char *const[]){CDS_DEVICE_OPTION, NULL});
}

/* runc's global options that take a value, and ours. */
static int global_takes_value(const char *name, size_t len)
{
    return among(name, len, cds_global_value_options) || is_device_option(name, len);
}

/* Option name without leading dashes and its length (up to '=' if any). */
static const char *option_name(const char *arg, size_t *len)
{
    const char *name = arg + (arg[1] == '-' ? 2 : 1);
    const char *eq = strchr(name, '=');
    *len = eq ? (size_t)(eq - name) : strlen(name);
    return name;
}

static int is_help_option(const char *name, size_t len) { return among(name, len, cds_help_options); }

/* A --device option without "=": whether the next argument is its value (a device name never
 * starts with '-', so `--device --help` asks for help, not for a device called "--help"). */
static int device_value_follows(char **args, int i, int n) { return i + 1 < n && args[i + 1][0] != '-'; }

/* Options of create/run that take a value; the rest of theirs are booleans. */
static int create_takes_value(const char *name, size_t len) { return among(name, len, cds_create_value_options); }

/* What the options of create/run in ARGS (N words, the command word first) say; END and the id
 * relative to ARGS. */
static struct create_line scan_create(char **args, int n)
{
    struct create_line line = {".", NULL, NULL, 0, 0, n, strcmp(args[0], "run") == 0, 0};
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
    int at = line.end < n && strcmp(args[line.end], "--") == 0 ? line.end + 1 : line.end;
    line.id = at < n ? args[at] : NULL;
    return line;
}

/* runc's global options in ARGV (up to the command word) into LINE: ours, help, version, --log. */
static void scan_globals(int argc, char **argv, struct runc_line *line)
{
    int kept = 0; /* the words of runc's own options: runc_argv keeps them */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || strcmp(a, "-") == 0) {
            line->command = i;
            break;
        }
        size_t len;
        const char *name = option_name(a, &len), *eq = strchr(a, '=');
        if (is_device_option(name, len)) {
            line->has_device = 1;
            if (!eq && device_value_follows(argv, i, argc))
                i++;
            continue;
        }
        kept++;
        if ((len == 7 && strncmp(name, "version", 7) == 0) || (len == 1 && name[0] == 'v'))
            line->version = 1;
        else if (is_help_option(name, len))
            line->help = 1;
        if (global_takes_value(name, len)) {
            const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[i + 1] : "");
            if (len == 3 && strncmp(name, "log", 3) == 0)
                line->log = value;
            else if (len == 10 && strncmp(name, "log-format", 10) == 0)
                line->log_format = value;
            if (!eq) {
                i++;
                kept++;
            }
        }
    }
    line->scan.runc_command = 1 + kept;
}

struct runc_line parse_line(int argc, char **argv)
{
    struct runc_line line = {argc, 0, 0, 0, 0, NULL, "text", {".", NULL, NULL, 0, 0, 0, 0, 0}};
    scan_globals(argc, argv, &line);
    int command = line.command;
    /* runc shows its help for --help, no command (unless --version) and a bare `help` */
    if (command == argc)
        line.help = !line.version;
    else if (argc - command == 1 && among(argv[command], strlen(argv[command]), cds_help_commands))
        line.help = 1;
    line.create = command < argc && among(argv[command], strlen(argv[command]), cds_injecting_commands);
    if (line.create) {
        int runc_command = line.scan.runc_command;
        line.scan = scan_create(argv + command, argc - command);
        line.scan.end += command;
        line.scan.runc_command = runc_command;
    }
    return line;
}

/* The argv runc gets into OUT (ARGC + 1 slots; OUT[0] left for the runtime's path): ours without
 * our own --device options (the global ones, and those among the options of create/run, which
 * reach runc only with --help). */
void runc_argv(int argc, char **argv, const struct runc_line *line, char **out)
{
    int n = 1, command = line->command, end = line->create ? line->scan.end : command;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i < end && i != command && a[0] == '-') {
            size_t len;
            const char *name = option_name(a, &len);
            if (is_device_option(name, len)) {
                if (!strchr(a, '=') && device_value_follows(argv, i, argc))
                    i++;
                if (command < argc && !line->create && !line->help)
                    fprintf(stderr, "cdi-shim: --device is ignored for the %s command\n", argv[command]);
                continue;
            }
            if (i > command && !strchr(a, '=') && i + 1 < argc && create_takes_value(name, len))
                out[n++] = argv[i++]; /* and its value, whatever it looks like */
        }
        out[n++] = argv[i];
    }
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
