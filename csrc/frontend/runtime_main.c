/*
 * cdi-shim-runtime: the native front end of the runtime wrapper.
 *
 * containerd calls this binary exactly as it would call runc, for every container operation
 * (state, start, kill, delete, exec probes...). Only create/run may need CDI injection, and
 * only when the bundle's config.json can be asking for a device. Everything else is exec'd
 * straight into runc here, so it costs one exec and no interpreter start-up.
 *
 * The decision "nothing can be requested" is conservative: config.json is searched for the
 * raw byte patterns a request needs (an annotation key with a configured prefix, the device
 * env var, a device-plugin mount). If any pattern, or any JSON escape that could hide one,
 * appears, or if our config file holds anything this small reader does not understand, the
 * Python implementation decides (the interpreter beside this program: pylaunch.h).
 * A false "maybe" costs time; a false "no" cannot happen.
 *
 * Docker's --gpus hook program (nvidia-container-runtime-hook) counts as a request: Python turns it
 * into one and drops it.
 *
 * A config without a request but with a hook program's name in it (injected by containerd's
 * own CDI or podman) is first offered to the replay (csrc/engine/replay.c): the linker step a
 * resident worker kept for such a config, redone here without asking the worker.
 *
 * The parts: settings.c (our config file), cmdline.c (runc's command line, parsed once here),
 * request_scan.c (the scan of config.json), passthrough.c (the exec of runc or the interpreter),
 * after_create.c (a create's device links made after runc's create), runlog.c (our log lines),
 * resident_client.c (the resident process); the replay is the engine's (replay.c).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "frontend.h"
#include "../engine/replay.h"
#include "../engine/cleanup.h"

/* A create whose config only carries hooks (injected by containerd or podman): the step a
 * resident worker kept for it, replayed here (replay.c); 1 when done. */
static int replayed(const struct settings *set, const char *bundle, const char *id, const char *json, long len,
                    mode_t mode)
{
    char steps[sizeof(set->socket) + 16], message[512];
    struct timespec start, end;
    const char *slash = strrchr(set->socket, '/');
    if (!set->socket[0] || !slash)
        return 0;
    clock_gettime(CLOCK_MONOTONIC, &start);
    snprintf(steps, sizeof(steps), "%.*s/steps", (int)(slash - set->socket), set->socket);
    if (!replay_step(steps, bundle, json, (size_t)len, mode, CDS_VERSION))
        return 0;
    clock_gettime(CLOCK_MONOTONIC, &end);
    snprintf(message, sizeof(message),
             "cdi-shim: container %.200s: the linker step of an earlier container of these "
             "files and spec, replayed by the front end; phase=replay took=%.2fms",
             id ? id : "?", (double)(end.tv_sec - start.tv_sec) * 1e3 + (double)(end.tv_nsec - start.tv_nsec) / 1e6);
    debug_line(set, message);
    return 1;
}

/* A create asking for devices that a worker injected before, for the same request, specs and host
 * files: its injection and then its step replayed here (replay.c); 1 when done. Not in a user
 * namespace other than the host's (there the Python half refuses device nodes). */
static int request_replayed(const struct settings *set, const char *bundle, const char *id, const char *json, long len,
                            mode_t mode, const char *options, size_t options_len)
{
    char steps[sizeof(set->socket) + 16], message[768], devices[256], prefixes[MAX_PREFIXES * 256];
    size_t prefixes_len = 0;
    struct timespec start, end;
    const char *slash = strrchr(set->socket, '/');
    if (!set->socket[0] || !slash || !in_host_user_namespace())
        return 0;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (int i = 0; i < set->n_prefixes; i++) {
        size_t n = strlen(set->prefixes[i]) + 1;
        memcpy(prefixes + prefixes_len, set->prefixes[i], n);
        prefixes_len += n;
    }
    struct request_rules rules = {prefixes,     prefixes_len, set->device_env,
                                  options,      options_len,  (const uint8_t *)(set->text ? set->text : ""),
                                  set->text_len};
    snprintf(steps, sizeof(steps), "%.*s/steps", (int)(slash - set->socket), set->socket);
    if (!replay_request(steps, bundle, json, (size_t)len, mode, CDS_VERSION, &rules, devices, sizeof devices))
        return 0;
    clock_gettime(CLOCK_MONOTONIC, &end);
    snprintf(message, sizeof(message), "cdi-shim: container %.200s: injected %.250s", id ? id : "?", devices);
    info_line(set, message);
    snprintf(message, sizeof(message),
             "cdi-shim: container %.200s: the injection and the linker step of an earlier container of this "
             "request, specs and files, replayed by the front end; phase=replay took=%.2fms",
             id ? id : "?", (double)(end.tv_sec - start.tv_sec) * 1e3 + (double)(end.tv_nsec - start.tv_nsec) / 1e6);
    debug_line(set, message);
    return 1;
}

/* Printed before runc's own help (`--help`, `-h`, `help`, or no command at all). */
static const char help_text[] =
    "cdi-shim-runtime: runc with CDI devices. It takes runc's commands and options, listed below,\n"
    "and passes them to runc unchanged; on create and run it first adds the CDI devices the\n"
    "container asks for to the bundle's config.json (device nodes, mounts, env, hooks), from the\n"
    "CDI spec files in the spec directories (default /etc/cdi, /var/run/cdi).\n"
    "\n"
    "A container asks for devices with any of:\n"
    "   annotations    \"cdi.k8s.io/<any name>\": \"vendor.com/class=name[,...]\" in config.json\n"
    "                  (config key annotation-prefixes)\n"
    "   environment    NVIDIA_VISIBLE_DEVICES=0,1 | GPU-<uuid> | all | vendor.com/class=name in the\n"
    "                  process env; none, void or empty: no device (config keys device-env,\n"
    "                  default-kind = nvidia.com/gpu for bare indexes and UUIDs)\n"
    "   mounts         the device plugin's volume mounts at /var/run/nvidia-container-devices/<name>\n"
    "   --device NAME  a qualified device name, e.g. --device nvidia.com/gpu=0 (repeatable; before or\n"
    "                  after create/run: cdi-shim-runtime run --device NAME --bundle DIR ID); runc\n"
    "                  never sees it\n"
    "\n"
    "--debug also prints cdi-shim's per-phase timings: on stderr, and into runc's --log file when\n"
    "one is given. Configuration: /etc/cdi-shim/config.toml (optional), or the file\n"
    "$CDI_SHIM_CONFIG names. Spec tooling and set-up: cdi-shim --help.\n"
    "\n"
    "runc's own help:\n"
    "\n";

/* A create/run (LINE) whose config.json holds something for us: replayed here (replay.c), or
 * handed to the resident process or the interpreter. -1 when what is left is to pass it to runc
 * (JSON, LEN: config.json's text while nothing of ours has rewritten it, else NULL), else the exit
 * status. */
static int prepare_create(const struct settings *set, int argc, char **argv, const struct runc_line *line, char **json,
                          long *len)
{
    const struct create_line *scan = &line->scan;
    mode_t mode = 0;
    enum config_kind kind = config_kind(scan->bundle, set, json, len, &mode);
    char options[4096]; /* our --device options' values: a request too */
    long options_len = device_values(argv, line->command, scan->end, options, sizeof options);
    if (line->has_device || scan->has_device)
        kind = MAY_REQUEST;
    if (line->help || scan->help || kind == NOTHING_FOR_US)
        return -1;
    int replayed_here =
        (kind == HOOKS_ONLY && !set->runc_binds && replayed(set, scan->bundle, scan->id, *json, *len, mode))
        || (kind == MAY_REQUEST && *json && options_len >= 0 && !set->runc_binds
            && request_replayed(set, scan->bundle, scan->id, *json, *len, mode, options, (size_t)options_len));
    if (!replayed_here) {
        int status = try_resident(set, argc, argv, scan);
        return status >= 0 ? status : exec_python(argc, argv);
    }
    free(cds_take_ptr(json)); /* the replay wrote config.json anew */
    return -1;
}

int main(int argc, char **argv)
{
    struct settings set;
    load_settings(&set);
    struct runc_line line = parse_line(argc, argv);
    log_path = line.log;
    log_format = line.log_format;
    if (line.help) {
        fputs(help_text, stdout);
        fflush(stdout);
    }
    if (!set.understood)
        return exec_python(argc, argv);

    cleanup_free char *json = NULL; /* config.json's text, while nothing of ours has rewritten it */
    long len = 0;
    if (line.create) {
        int status = prepare_create(&set, argc, argv, &line, &json, &len);
        if (status >= 0)
            return status;
    } else if (line.command == argc && line.version) {
        printf("cdi-shim-runtime version %s\n", CDS_VERSION);
        fflush(stdout);
    }
    cleanup_free char **out = calloc((size_t)argc + 1, sizeof(char *));
    if (!out)
        return 127;
    runc_argv(argc, argv, &line, out);
    return exec_runtime(&set, out, line.create && !line.help ? &line.scan : NULL, json, len);
}
