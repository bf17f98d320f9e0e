/* The request scan: whether a bundle's config.json can ask for a device, by searching its raw
 * bytes for the patterns a request needs (see runtime_main.c for why a false "maybe" is fine). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime_rules.h"
#include "frontend.h"
#include "../engine/cleanup.h"
#include "../engine/memo_rules.h"

#define DEVICE_MOUNT_PATTERN "\"" CDS_DEVICE_MOUNT_ROOT

/* The hook programs whose work the Python half does (cds_hook_programs): a config injected by
 * someone else (containerd's own CDI, podman) carries them with no request left in it. Docker's
 * --gpus hook (CDS_LEGACY_HOOK) is a request, and ours to drop, whatever the env says. Both are
 * matched as a whole JSON string or its last path component. */
#define N_HOOK_PROGRAMS (sizeof(cds_hook_programs) / sizeof(cds_hook_programs[0]) - 1)

static int starts_with(const char *at, const char *end, const char *text, size_t len)
{
    return (size_t)(end - at) >= len && memcmp(at, text, len) == 0;
}

/* Whether AT holds one of cds_no_request_values, closed by its quote. */
static int no_request_value(const char *at, const char *end)
{
    for (const char *const *v = cds_no_request_values; *v; v++) {
        size_t len = strlen(*v);
        if (starts_with(at, end, *v, len) && at + len < end && at[len] == '"')
            return 1;
    }
    return 0;
}

/* Which characters the patterns hold (PATTERN_CHARS[c] for c < 128; NON_ASCII: any byte past
 * 127), so that an escape of another character cannot spell one differently. */
struct pattern_chars {
    unsigned char ascii[128];
    int non_ascii;
};

static void note_chars(struct pattern_chars *set, const char *text)
{
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if (*c < 128)
            set->ascii[*c] = 1;
        else
            set->non_ascii = 1;
    }
}

static void pattern_chars(struct pattern_chars *set, const struct settings *s, const char *env_pattern)
{
    memset(set, 0, sizeof(*set));
    note_chars(set, "\"\\" DEVICE_MOUNT_PATTERN CDS_LEGACY_HOOK);
    note_chars(set, env_pattern);
    for (int i = 0; i < s->n_prefixes; i++)
        note_chars(set, s->prefixes[i]);
    for (size_t h = 0; cds_hook_programs[h]; h++)
        note_chars(set, cds_hook_programs[h]);
    for (const char *const *v = cds_no_request_values; *v; v++)
        note_chars(set, *v);
}

/* Whether the \u escape at P (its backslash) spells a character no pattern holds: Go's encoder,
 * containerd's, writes <, > and & so (a pod's `sh -c "a && b"`), and control characters. */
static int harmless_escape(const char *p, const char *end, const struct pattern_chars *set)
{
    unsigned cp = 0;
    if (end - p < 6)
        return 0;
    for (int i = 2; i < 6; i++) {
        char c = p[i];
        int digit = c >= '0' && c <= '9' ? c - '0'
            : c >= 'a' && c <= 'f'       ? c - 'a' + 10
            : c >= 'A' && c <= 'F'       ? c - 'A' + 10
                                         : -1;
        if (digit < 0)
            return 0;
        cp = cp * 16 + (unsigned)digit;
    }
    return cp < 128 ? cp != 0 && !set->ascii[cp] : !set->non_ascii;
}

/* What config.json (read into *JSON, its length *LEN and mode *MODE, unless it could not be read)
 * holds for us:
 * MAY_REQUEST when it may request a device (or we cannot tell), HOOKS_ONLY when it cannot but
 * carries a hook program whose work we may do, NOTHING_FOR_US when it has neither. One pass:
 * it stops only at quotes and backslashes, where every pattern begins (a request: an opening
 * quote) or ends (a hook program: a closing quote). */
enum config_kind config_kind(const char *bundle, const struct settings *set, char **json_out, long *len_out,
                             mode_t *mode)
{
    char path[8192], env_pattern[300];
    cleanup_free char *json = NULL;
    int hooks = 0;

    if (snprintf(path, sizeof(path), "%s/config.json", bundle) >= (int)sizeof(path))
        return MAY_REQUEST;
    long len = read_file_mode(path, MAX_CONFIG_JSON, &json, mode);
    if (len < 0)
        return MAY_REQUEST; /* Python reports the problem with the file */
    size_t prefix_len[MAX_PREFIXES], env_len = 0, mount_len = strlen(DEVICE_MOUNT_PATTERN), hook_len[N_HOOK_PROGRAMS];
    for (int i = 0; i < set->n_prefixes; i++)
        prefix_len[i] = strlen(set->prefixes[i]);
    if (set->device_env[0])
        env_len = (size_t)snprintf(env_pattern, sizeof(env_pattern), "%s=", set->device_env);
    for (size_t h = 0; h < N_HOOK_PROGRAMS; h++)
        hook_len[h] = strlen(cds_hook_programs[h]);
    struct pattern_chars chars;
    pattern_chars(&chars, set, env_len ? env_pattern : "");
    const char *end = json + len;
    for (const char *p = json;; p++) {
        p += strcspn(p, "\\\""); /* stops at a quote, a backslash or a NUL */
        if (*p == '\0') {
            if (p < end)
                goto may_request; /* a NUL inside the text: Python says what is wrong */
            break;
        }
        if (*p == '\\') {
            if (p[1] == 'u' && harmless_escape(p, end, &chars)) {
                p += 5;
                continue;
            }
            if (p[1] == 'u' || p[1] == '/' || p[1] == '\0')
                goto may_request; /* an escape could spell a pattern differently */
            p++;                  /* the escaped character is no pattern's edge */
            continue;
        }
        /* a quote: a request begins here, or a hook program ends here */
        if (starts_with(p, end, DEVICE_MOUNT_PATTERN, mount_len))
            goto may_request;
        for (int i = 0; i < set->n_prefixes; i++)
            if (starts_with(p + 1, end, set->prefixes[i], prefix_len[i]))
                goto may_request;
        if (env_len && starts_with(p + 1, end, env_pattern, env_len)) {
            /* cds_no_request_values ("void", "none") request nothing, and beat any other value
             * of the variable: only when every one is such can none be a request. */
            const char *value = p + 1 + env_len;
            if (!no_request_value(value, end))
                goto may_request;
        }
        size_t legacy_len = sizeof(CDS_LEGACY_HOOK) - 1;
        if ((size_t)(p - json) > legacy_len && memcmp(p - legacy_len, CDS_LEGACY_HOOK, legacy_len) == 0
            && (p[-(long)legacy_len - 1] == '/' || p[-(long)legacy_len - 1] == '"'))
            goto may_request;
        for (size_t h = 0; !hooks && h < N_HOOK_PROGRAMS; h++) {
            const char *name = p - hook_len[h];
            if ((size_t)(p - json) > hook_len[h] && memcmp(name, cds_hook_programs[h], hook_len[h]) == 0
                && (name[-1] == '/' || name[-1] == '"'))
                hooks = 1;
        }
    }
    *json_out = cds_take_ptr(&json);
    *len_out = len;
    return hooks ? HOOKS_ONLY : NOTHING_FOR_US;
may_request:
    *json_out = cds_take_ptr(&json);
    *len_out = len;
    return MAY_REQUEST;
}
