/* A stand-in for NVIDIA's libnvidia-ml.so.1 where no GPU exists (CI): the functions Fairlane's
 * executor calls through pynvml, answering from a text file so a test can change what the
 * "GPUs" report while the executor runs. Built by tests/fake_nvml.py with the system cc.
 *
 * FAKE_NVML_FILE names the file; it is read again on every call. One GPU per line:
 *     uuid name utilization% memory_used_MiB memory_total_MiB temperature_C power_mW
 * A field written "-" answers NVML_ERROR_NOT_SUPPORTED, as a real board does for a sensor
 * it lacks. No file (or FAKE_NVML_FAIL set) makes nvmlInit fail as a machine without a
 * driver does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OK 0
#define ERROR_UNINITIALIZED 1
#define ERROR_INVALID_ARGUMENT 2
#define ERROR_NOT_SUPPORTED 3
#define ERROR_INSUFFICIENT_SIZE 7
#define ERROR_DRIVER_NOT_LOADED 9
#define ERROR_UNKNOWN 999
#define MAX_GPUS 16
#define UNSUPPORTED -1LL

typedef struct { unsigned long long total, free, used; } memory_t;
typedef struct { unsigned int gpu, memory; } utilization_t;
typedef struct {
    char uuid[96];
    char name[96];
    long long util, used_mib, total_mib, temp, power_mw;
} gpu_t;

static int initialised = 0;

static long long field(const char *text) {
    return strcmp(text, "-") == 0 ? UNSUPPORTED : atoll(text);
}

/* The GPUs as the file says now; -1 where it cannot be read. */
static int load(gpu_t *gpus) {
    const char *path = getenv("FAKE_NVML_FILE");
    if (path == NULL) return -1;
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    int n = 0;
    char line[512], u[16], m[32], t[32], c[16], p[32];
    while (n < MAX_GPUS && fgets(line, sizeof line, f) != NULL) {
        gpu_t *g = &gpus[n];
        if (sscanf(line, "%95s %95s %15s %31s %31s %15s %31s", g->uuid, g->name, u, m, t, c, p) != 7)
            continue;
        for (char *s = g->name; *s; s++) if (*s == '_') *s = ' ';  /* names have spaces */
        g->util = field(u); g->used_mib = field(m); g->total_mib = field(t);
        g->temp = field(c); g->power_mw = field(p);
        n++;
    }
    fclose(f);
    return n;
}

/* The GPU a handle stands for (handles are index + 1), or NULL. */
static int gpu_of(void *handle, gpu_t *out) {
    gpu_t gpus[MAX_GPUS];
    long index = (long)handle - 1;
    int n = load(gpus);
    if (!initialised || n < 0 || index < 0 || index >= n) return 0;
    *out = gpus[index];
    return 1;
}

int nvmlInitWithFlags(unsigned int flags) {
    gpu_t gpus[MAX_GPUS];
    (void)flags;
    if (getenv("FAKE_NVML_FAIL") != NULL || load(gpus) < 0) return ERROR_DRIVER_NOT_LOADED;
    initialised = 1;
    return OK;
}
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlInit(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) { return OK; }  /* pynvml counts its own references */

const char *nvmlErrorString(int result) {
    switch (result) {
    case OK: return "Success";
    case ERROR_UNINITIALIZED: return "Uninitialized";
    case ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case ERROR_NOT_SUPPORTED: return "Not Supported";
    case ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    gpu_t gpus[MAX_GPUS];
    int n = load(gpus);
    if (!initialised) return ERROR_UNINITIALIZED;
    if (n < 0) return ERROR_UNKNOWN;
    *count = (unsigned int)n;
    return OK;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **handle) {
    gpu_t g;
    if (!gpu_of((void *)(long)(index + 1), &g)) return ERROR_INVALID_ARGUMENT;
    *handle = (void *)(long)(index + 1);
    return OK;
}

static int text(const char *value, char *out, unsigned int length) {
    if (strlen(value) + 1 > length) return ERROR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return OK;
}

int nvmlDeviceGetUUID(void *handle, char *uuid, unsigned int length) {
    gpu_t g;
    if (!gpu_of(handle, &g)) return ERROR_INVALID_ARGUMENT;
    return text(g.uuid, uuid, length);
}

int nvmlDeviceGetName(void *handle, char *name, unsigned int length) {
    gpu_t g;
    if (!gpu_of(handle, &g)) return ERROR_INVALID_ARGUMENT;
    return text(g.name, name, length);
}

int nvmlDeviceGetMemoryInfo(void *handle, memory_t *memory) {
    gpu_t g;
    if (!gpu_of(handle, &g)) return ERROR_INVALID_ARGUMENT;
    if (g.total_mib == UNSUPPORTED || g.used_mib == UNSUPPORTED) return ERROR_NOT_SUPPORTED;
    memory->total = (unsigned long long)g.total_mib << 20;
    memory->used = (unsigned long long)g.used_mib << 20;
    memory->free = memory->total - memory->used;
    return OK;
}

int nvmlDeviceGetUtilizationRates(void *handle, utilization_t *utilization) {
    gpu_t g;
    if (!gpu_of(handle, &g)) return ERROR_INVALID_ARGUMENT;
    if (g.util == UNSUPPORTED) return ERROR_NOT_SUPPORTED;
    utilization->gpu = (unsigned int)g.util;
    utilization->memory = 0;
    return OK;
}

int nvmlDeviceGetTemperature(void *handle, int sensor, unsigned int *temperature) {
    gpu_t g;
    if (!gpu_of(handle, &g) || sensor != 0) return ERROR_INVALID_ARGUMENT;
    if (g.temp == UNSUPPORTED) return ERROR_NOT_SUPPORTED;
    *temperature = (unsigned int)g.temp;
    return OK;
}

int nvmlDeviceGetPowerUsage(void *handle, unsigned int *milliwatts) {
    gpu_t g;
    if (!gpu_of(handle, &g)) return ERROR_INVALID_ARGUMENT;
    if (g.power_mw == UNSUPPORTED) return ERROR_NOT_SUPPORTED;
    *milliwatts = (unsigned int)g.power_mw;
    return OK;
}
