/*
 * A fake libnvidia-ml.so.1 for the tests of `cdi-shim cdi generate`: the NVML entry points
 * pynvml calls for a spec, answering from a text description of fake GPUs, so the real
 * pynvml code runs against it.
 *
 * The description is the file $FAKE_NVML_CONFIG, else "fake-nvml.conf" beside this library.
 * One directive a line ('#' starts a comment):
 *
 *     driver 580.65.06                    nvmlSystemGetDriverVersion
 *     init-error 9                        nvmlInit* returns 9 (NVML_ERROR_DRIVER_NOT_LOADED)
 *     count-error 999                     nvmlDeviceGetCount_v2 returns 999
 *     gpu uuid=GPU-... minor=0 bus=00000000:3B:00.0 name=NVIDIA_H100 mig=0 fail=FUNCTION:CODE
 *     gpu ... mig=1 migs=0,2,3           MIG mode on, MIG devices in slots 0, 2 and 3 (of 7)
 *
 * One "gpu" line per GPU, in index order (name: '_' is shown as a space; fail: that device's
 * FUNCTION returns CODE). MIG device in slot S of GPU G: UUID MIG-<G>-<S> padded to the MIG
 * UUID shape, GPU instance S + 1, compute instance 0. If $FAKE_NVML_LOG names a file, every call appends its function
 * name there, one a line.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64
#define MIG_SLOTS 7

struct fake_gpu {
    char uuid[96];
    char name[96];
    char bus[32];
    unsigned int minor;
    int mig; /* 0 disabled, 1 enabled, -1 not supported */
    char fail_fn[64];
    int fail_code;
    int mig_slot_used[MIG_SLOTS];
    unsigned int gi, ci; /* MIG devices only */
};

typedef struct fake_gpu *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

static struct fake_gpu gpus[MAX_GPUS];
static struct fake_gpu migs[MAX_GPUS][MIG_SLOTS];
static unsigned int ngpus;
static char driver_version[80] = "580.65.06";
static int init_error, count_error, loaded, config_error, initialised;

static void trace(const char *fn)
{
    const char *path = getenv("FAKE_NVML_LOG");
    FILE *out;

    if (path == NULL || (out = fopen(path, "a")) == NULL)
        return;
    fprintf(out, "%s\n", fn);
    fclose(out);
}

static FILE *open_config(void)
{
    const char *path = getenv("FAKE_NVML_CONFIG");
    char buf[4096];
    Dl_info info;
    char *slash;

    if (path != NULL && *path != '\0')
        return fopen(path, "r");
    if (dladdr((void *)open_config, &info) == 0 || info.dli_fname == NULL)
        return NULL;
    snprintf(buf, sizeof(buf), "%s", info.dli_fname);
    if ((slash = strrchr(buf, '/')) == NULL)
        return NULL;
    snprintf(slash + 1, sizeof(buf) - (size_t)(slash + 1 - buf), "fake-nvml.conf");
    return fopen(buf, "r");
}

static void parse_gpu(char *rest)
{
    struct fake_gpu *g;
    char *field, *save = NULL;

    if (ngpus >= MAX_GPUS) {
        config_error = 1;
        return;
    }
    g = &gpus[ngpus];
    memset(g, 0, sizeof(*g));
    snprintf(g->name, sizeof(g->name), "NVIDIA Fake GPU");
    snprintf(g->uuid, sizeof(g->uuid), "GPU-00000000-0000-0000-0000-%012u", ngpus);
    snprintf(g->bus, sizeof(g->bus), "00000000:%02X:00.0", ngpus + 1);
    g->minor = ngpus;
    for (field = strtok_r(rest, " \t\n", &save); field; field = strtok_r(NULL, " \t\n", &save)) {
        char *eq = strchr(field, '=');
        if (eq == NULL) {
            config_error = 1;
            continue;
        }
        *eq++ = '\0';
        if (strcmp(field, "uuid") == 0) {
            snprintf(g->uuid, sizeof(g->uuid), "%s", eq);
        } else if (strcmp(field, "name") == 0) {
            snprintf(g->name, sizeof(g->name), "%s", eq);
            for (char *p = g->name; *p; p++)
                if (*p == '_')
                    *p = ' ';
        } else if (strcmp(field, "bus") == 0) {
            snprintf(g->bus, sizeof(g->bus), "%s", eq);
        } else if (strcmp(field, "minor") == 0) {
            g->minor = (unsigned int)strtoul(eq, NULL, 10);
        } else if (strcmp(field, "mig") == 0) {
            g->mig = strcmp(eq, "na") == 0 ? -1 : atoi(eq);
        } else if (strcmp(field, "migs") == 0) {
            for (char *slot = strtok(eq, ","); slot; slot = strtok(NULL, ",")) {
                unsigned int n = (unsigned int)atoi(slot);
                if (n >= MIG_SLOTS) {
                    config_error = 1;
                    continue;
                }
                g->mig_slot_used[n] = 1;
            }
        } else if (strcmp(field, "fail") == 0) {
            char *colon = strchr(eq, ':');
            if (colon == NULL) {
                config_error = 1;
                continue;
            }
            *colon = '\0';
            snprintf(g->fail_fn, sizeof(g->fail_fn), "%s", eq);
            g->fail_code = atoi(colon + 1);
        } else {
            config_error = 1;
        }
    }
    ngpus++;
}

static void load(void)
{
    char line[1024];
    FILE *in;

    if (loaded)
        return;
    loaded = 1;
    if ((in = open_config()) == NULL) {
        config_error = 1;
        return;
    }
    while (fgets(line, sizeof(line), in) != NULL) {
        char *p = line, *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        while (*p == ' ' || *p == '\t')
            p++;
        if (strncmp(p, "driver ", 7) == 0) {
            snprintf(driver_version, sizeof(driver_version), "%s", p + 7);
            driver_version[strcspn(driver_version, " \t\n")] = '\0';
        } else if (strncmp(p, "init-error ", 11) == 0) {
            init_error = atoi(p + 11);
        } else if (strncmp(p, "count-error ", 12) == 0) {
            count_error = atoi(p + 12);
        } else if (strncmp(p, "gpu", 3) == 0 && (p[3] == ' ' || p[3] == '\n' || p[3] == '\0')) {
            parse_gpu(p + 3);
        } else if (*p != '\n' && *p != '\0') {
            config_error = 1;
        }
    }
    fclose(in);
}

static int valid(nvmlDevice_t d)
{
    struct fake_gpu *first_mig = &migs[0][0];
    return d != NULL && ((d >= gpus && d < gpus + ngpus) || (d >= first_mig && d < first_mig + MAX_GPUS * MIG_SLOTS));
}

static int is_mig(nvmlDevice_t d) { return d >= &migs[0][0] && d < &migs[0][0] + MAX_GPUS * MIG_SLOTS; }

/* The error the description sets for FN on device D, else 0. */
static nvmlReturn_t device_fails(nvmlDevice_t d, const char *fn)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->fail_fn[0] != '\0' && strcmp(d->fail_fn, fn) == 0)
        return d->fail_code;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *value)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t init(const char *fn)
{
    trace(fn);
    load();
    if (config_error)
        return NVML_ERROR_UNKNOWN;
    if (init_error)
        return init_error;
    initialised++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return init("nvmlInit_v2"); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return init("nvmlInitWithFlags");
}

nvmlReturn_t nvmlShutdown(void)
{
    trace("nvmlShutdown");
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    initialised--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    trace("nvmlSystemGetDriverVersion");
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, driver_version);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    trace("nvmlDeviceGetCount_v2");
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (count_error)
        return count_error;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    trace("nvmlDeviceGetHandleByIndex_v2");
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (index >= ngpus || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gpus[index].fail_fn[0] && strcmp(gpus[index].fail_fn, "nvmlDeviceGetHandleByIndex_v2") == 0)
        return gpus[index].fail_code;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    trace("nvmlDeviceGetHandleByUUID");
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (uuid == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < ngpus; i++)
        if (strcmp(gpus[i].uuid, uuid) == 0) {
            *device = &gpus[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length)
{
    nvmlReturn_t r;
    trace("nvmlDeviceGetName");
    if ((r = device_fails(d, "nvmlDeviceGetName")) != NVML_SUCCESS)
        return r;
    return copy_string(name, length, d->name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length)
{
    nvmlReturn_t r;
    trace("nvmlDeviceGetUUID");
    if ((r = device_fails(d, "nvmlDeviceGetUUID")) != NVML_SUCCESS)
        return r;
    return copy_string(uuid, length, d->uuid);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor)
{
    nvmlReturn_t r;
    trace("nvmlDeviceGetMinorNumber");
    if ((r = device_fails(d, "nvmlDeviceGetMinorNumber")) != NVML_SUCCESS)
        return r;
    if (minor == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minor = d->minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci)
{
    nvmlReturn_t r;
    unsigned int domain = 0, bus = 0, dev = 0;
    trace("nvmlDeviceGetPciInfo_v3");
    if ((r = device_fails(d, "nvmlDeviceGetPciInfo_v3")) != NVML_SUCCESS)
        return r;
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    sscanf(d->bus, "%x:%x:%x", &domain, &bus, &dev);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = 0x233010de;
    snprintf(pci->busId, sizeof(pci->busId), "%s", d->bus);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%.15s", d->bus);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending)
{
    nvmlReturn_t r;
    trace("nvmlDeviceGetMigMode");
    if ((r = device_fails(d, "nvmlDeviceGetMigMode")) != NVML_SUCCESS)
        return r;
    if (d->mig < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (current == NULL || pending == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = (unsigned int)d->mig;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count)
{
    nvmlReturn_t r;
    trace("nvmlDeviceGetMaxMigDeviceCount");
    if ((r = device_fails(d, "nvmlDeviceGetMaxMigDeviceCount")) != NVML_SUCCESS)
        return r;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = d->mig > 0 ? MIG_SLOTS : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig)
{
    nvmlReturn_t r;
    unsigned int g;
    trace("nvmlDeviceGetMigDeviceHandleByIndex");
    if ((r = device_fails(d, "nvmlDeviceGetMigDeviceHandleByIndex")) != NVML_SUCCESS)
        return r;
    if (is_mig(d) || mig == NULL || index >= MIG_SLOTS)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mig <= 0 || !d->mig_slot_used[index])
        return NVML_ERROR_NOT_FOUND;
    g = (unsigned int)(d - gpus);
    *mig = &migs[g][index];
    memset(*mig, 0, sizeof(**mig));
    snprintf((*mig)->uuid, sizeof((*mig)->uuid), "MIG-%08x-0000-4000-8000-%012x", g, index);
    (*mig)->gi = index + 1;
    (*mig)->ci = 0;
    (*mig)->minor = d->minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id)
{
    trace("nvmlDeviceGetGpuInstanceId");
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !is_mig(d) || id == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = d->gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id)
{
    trace("nvmlDeviceGetComputeInstanceId");
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !is_mig(d) || id == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = d->ci;
    return NVML_SUCCESS;
}
