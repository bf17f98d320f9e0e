/* Generated from shim/config.py's KEYS by `python -m shim.config header`: do not edit.
 * tests/runtime/test_config_keys.py fails when the two differ. */
#ifndef CDS_CONFIG_KEYS_H
#define CDS_CONFIG_KEYS_H

#define CDS_CONFIG_ENV "CDI_SHIM_CONFIG"
#define CDS_DEFAULT_CONFIG_PATH "/etc/cdi-shim/config.toml"
#define CDS_MAX_CONFIG_BYTES 1048576u

enum cds_key {
    CDS_KEY_RUNTIME,
    CDS_KEY_SPEC_DIRS,
    CDS_KEY_ANNOTATION_PREFIXES,
    CDS_KEY_DEVICE_ENV,
    CDS_KEY_DEFAULT_KIND,
    CDS_KEY_LOG_FILE,
    CDS_KEY_LOG_LEVEL,
    CDS_KEY_ACCEPT_ENV_UNPRIVILEGED,
    CDS_KEY_VOLUME_MOUNT_REQUESTS,
    CDS_KEY_ENV_VENDORS,
    CDS_KEY_RESIDENT_SOCKET,
    CDS_KEY_FILE_BINDS,
    CDS_KEY_COUNT
};

/* 's': a string, 'l': a list of strings, 'b': true or false */
struct cds_key_info {
    const char *name;
    char type;
    int front_end_reads; /* else checked and skipped: only Python needs it */
    const char *const *choices; /* NULL-terminated; NULL: any value */
};

static const char *const cds_choices_log_level[] = {"debug", "info", "warning", "error", NULL};
static const char *const cds_choices_volume_mount_requests[] = {"dev-null", "off", NULL};
static const char *const cds_choices_file_binds[] = {"hook", "runc", NULL};

static const struct cds_key_info cds_keys[CDS_KEY_COUNT] = {
    [CDS_KEY_RUNTIME] = {"runtime", 's', 1, NULL},
    [CDS_KEY_SPEC_DIRS] = {"spec-dirs", 'l', 0, NULL},
    [CDS_KEY_ANNOTATION_PREFIXES] = {"annotation-prefixes", 'l', 1, NULL},
    [CDS_KEY_DEVICE_ENV] = {"device-env", 's', 1, NULL},
    [CDS_KEY_DEFAULT_KIND] = {"default-kind", 's', 0, NULL},
    [CDS_KEY_LOG_FILE] = {"log-file", 's', 1, NULL},
    [CDS_KEY_LOG_LEVEL] = {"log-level", 's', 1, cds_choices_log_level},
    [CDS_KEY_ACCEPT_ENV_UNPRIVILEGED] = {"accept-env-unprivileged", 'b', 0, NULL},
    [CDS_KEY_VOLUME_MOUNT_REQUESTS] = {"volume-mount-requests", 's', 0, cds_choices_volume_mount_requests},
    [CDS_KEY_ENV_VENDORS] = {"env-vendors", 'l', 0, NULL},
    [CDS_KEY_RESIDENT_SOCKET] = {"resident-socket", 's', 1, NULL},
    [CDS_KEY_FILE_BINDS] = {"file-binds", 's', 1, cds_choices_file_binds},
};

/* The defaults of the keys the front end reads. */
#define CDS_DEFAULT_RUNTIME "runc"
#define CDS_DEFAULT_ANNOTATION_PREFIXES {"cdi.k8s.io/", NULL}
#define CDS_DEFAULT_DEVICE_ENV "NVIDIA_VISIBLE_DEVICES"
#define CDS_DEFAULT_LOG_FILE ""
#define CDS_DEFAULT_LOG_LEVEL "info"
#define CDS_DEFAULT_RESIDENT_SOCKET "/run/cdi-shim/runtime.sock"
#define CDS_DEFAULT_FILE_BINDS "hook"

#endif
