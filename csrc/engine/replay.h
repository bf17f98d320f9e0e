/* The replay of a linker step a resident worker kept, and of a request's injection: see replay.c.
 * The front end calls them for a config someone else injected or that asks for devices; a worker
 * replays the step for the config it just injected itself. */
#ifndef CDI_SHIM_REPLAY_H
#define CDI_SHIM_REPLAY_H

#include <stddef.h>
#include <stdint.h>

/* 1 when the step kept in STEPS_DIR for the config JSON (LEN bytes) of BUNDLE was replayed and
 * BUNDLE/config.json rewritten (mode CONFIG_MODE); 0 when there is none, it is not of this
 * VERSION, it does not apply, or anything failed before config.json was replaced: the worker
 * does the step. */
int replay_step(const char *steps_dir, const char *bundle, const char *json, size_t len, unsigned config_mode,
                const char *version);

/* The settings a request's resolution runs under (request.h's cds_request_key). */
struct request_rules {
    const char *prefixes; /* NUL-terminated annotation prefixes, PREFIXES_LEN bytes in all */
    size_t prefixes_len;
    const char *device_env;
    const char *devices; /* the runtime's --device options' values, NUL-terminated each */
    size_t devices_len;
    const uint8_t *settings; /* the settings file's bytes */
    size_t settings_len;
};

/* 1 when the injection a worker recorded in STEPS_DIR for the request in JSON, under RULES,
 * still holds (the spec and host files unchanged, the driver version file too) and, applied,
 * gave a config whose step was replayed as replay_step does; the devices injected then go to
 * DEVICES (DEVICES_CAP bytes, for the log). 0: the worker resolves the request. */
int replay_request(const char *steps_dir, const char *bundle, const char *json, size_t len, unsigned config_mode,
                   const char *version, const struct request_rules *rules, char *devices, size_t devices_cap);

#endif
