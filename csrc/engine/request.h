/* A device request's injection, replayed from what a worker recorded: see request.c. */
#ifndef CDI_SHIM_REQUEST_H
#define CDI_SHIM_REQUEST_H

#include <stddef.h>
#include <stdint.h>

/* The key of the injection for the config JSON (LEN bytes) and the runtime's --device options
 * DEVICES (DEVICES_LEN bytes, each NUL-terminated): PREFIXES (PREFIXES_LEN bytes of
 * NUL-terminated annotation prefixes), DEVICE_ENV and the settings file's bytes are the
 * settings the resolution ran under. 0 with *KEY (free it with cds_request_free), or -1
 * (EINVAL: a config this reader is not sure of; ENOMEM). */
int cds_request_key(const char *json, size_t len, const char *prefixes, size_t prefixes_len, const char *device_env,
                    const char *devices, size_t devices_len, const uint8_t *settings, size_t settings_len,
                    uint8_t **key, size_t *key_len);

/* JSON with the recorded EDITS (EDITS_LEN bytes) applied: 0 with *OUT (NUL-terminated, *OUT_LEN
 * bytes before the NUL; free it with cds_request_free), or -1 (EINVAL: the edits do not fit this
 * config; ENOMEM). */
int cds_request_apply(const char *json, size_t len, const uint8_t *edits, size_t edits_len, char **out,
                      size_t *out_len);

/* One element of a changed list: the config's own element at INDEX there, or (TEXT not NULL) a
 * new one, LEN bytes of JSON. */
struct cds_request_item {
    size_t index;
    const char *text;
    size_t len;
};

/* One place of config.json an injection changed: TARGET ('E' process.env, 'M' mounts, 'D'
 * linux.devices, 'R' linux.resources.devices, 'H' hooks) and its new value: VALUE (LEN bytes of
 * JSON) whole, or (VALUE NULL) the N_ITEMS ITEMS of a list. */
struct cds_request_place {
    char target;
    const char *value;
    size_t len;
    const struct cds_request_item *items;
    size_t n_items;
};

/* The record of the N PLACES, as cds_request_apply reads it: 0 with *OUT (free it with
 * cds_request_free), or -1. */
int cds_request_edits(const struct cds_request_place *places, size_t n, uint8_t **out, size_t *out_len);

void cds_request_free(void *data);

/* The fields of a config the key covers, one a line: a path, a space, how (request.c). */
const char *cds_request_key_fields(void);

#endif
