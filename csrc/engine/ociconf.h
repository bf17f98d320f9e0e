/* The parts of an OCI config.json that a linker step reads (shim/linker/stepmemo.py), found
 * in its text without building it: the runtime front end replays a kept step from them, and
 * the resident worker names the step it keeps with the same key (cds_step_key). The hooks read
 * the OCI state and config.json with the same reader (cds_json_string).
 *
 * Spans are byte offsets into the text, [start, end); a string's span includes its quotes.
 * A config this reader is not sure of -- malformed JSON, a \/ escape anywhere, a \u escape of
 * NUL or of a lone surrogate, an escape in a key, in a mount's strings, in root.path or in a
 * namespace's type or path, a key given twice where it matters, nesting past
 * CDS_OCI_MAX_DEPTH, invalid UTF-8 -- is refused (-1): the worker then does the step. Other
 * strings count as their raw text, escapes and all (two spellings of one value: two keys). */
#ifndef CDI_SHIM_OCICONF_H
#define CDI_SHIM_OCICONF_H

#include <stddef.h>
#include <stdint.h>

#define CDS_OCI_MAX_DEPTH 512

struct cds_span {
    size_t start, end; /* both 0: absent */
};

struct cds_oci_mount {
    struct cds_span whole, destination, source; /* destination, source: strings, or absent */
};

struct cds_oci_view {
    struct cds_span hooks;                                  /* the value of "hooks" (an object) */
    struct cds_span mounts;                                 /* the value of "mounts" (an array) */
    struct cds_span root_path;                              /* root.path (a string) */
    struct cds_span root_readonly;                          /* root.readonly (any value) */
    struct cds_span devices;                                /* linux.devices (any value) */
    struct cds_span namespaces, uid_mappings, gid_mappings; /* linux.namespaces, .uidMappings, .gidMappings */
    struct cds_oci_mount *mount;
    size_t n_mounts;
};

/* 0 with VIEW filled (free it with cds_oci_view_free), or -1 (EINVAL: not for us; ENOMEM). */
int cds_oci_view(const char *json, size_t len, struct cds_oci_view *view);
void cds_oci_view_free(struct cds_oci_view *view);

/* The key of the linker step for the config in JSON: the hooks' text; each mount's text whole
 * (type, source, destination, options), but for a mount whose destination names no library its
 * source stands as one byte: whether its name is one of the step's own bundle files
 * ("cdi-shim.*": all the step reads of it; a pod's own /etc/hosts source differs per pod);
 * root.readonly, linux.devices, uidMappings and gidMappings as text; of linux.namespaces each one's type, and
 * the path of a user or mount namespace only (a pod's network, IPC and UTS paths differ per pod).
 * 0 with *KEY (malloc'd: free it with cds_step_key_free) and *KEY_LEN, or -1 as cds_oci_view. */
int cds_step_key(const char *json, size_t len, uint8_t **key, size_t *key_len);
void cds_step_key_free(uint8_t *key);

/* The string member KEY of the JSON object in JSON (with INNER: member INNER of the object
 * KEY), every escape decoded; a key given twice counts as given last, as runc's reader has it.
 * Unlike the view above, any valid escape is taken (the hooks' documents come from runc and the
 * engine, and a refusal fails the container), but a \u0000 anywhere is refused, as is
 * anything malformed. 0 with *OUT malloc'd, or NULL when absent or not a string; -1 (EINVAL:
 * not one JSON object; ENOMEM). */
int cds_json_string(const char *json, size_t len, const char *key, const char *inner, char **out);

/* FNV-1a, 64 bits, of LEN bytes at DATA: a recipe's file name (of its key) and its check sum
 * (of its bytes before the sum), for the worker that writes it and the front end that reads it. */
uint64_t cds_fnv1a(const uint8_t *data, size_t len);

#endif
