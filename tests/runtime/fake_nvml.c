/*
 * fake_nvml.c - a stand-in libnvidia-ml.so.1 for tests/runtime/test_nvml.c: NVML's C
 * ABI with fixed answers for one device at PCI 0000:19:00.0, so the test checks that
 * weft's run-time binding calls the right entry points and reads the structs as NVML
 * lays them out. Only the test's LD_LIBRARY_PATH makes dlopen find it.
 */
#include <string.h>

typedef struct {
  unsigned int gpu, memory;
} util_t;
typedef struct {
  unsigned long long total, free, used;
} mem_t;

static int device_tag; /* the handle's address */
static int inits;

int nvmlInit_v2(void) { return inits++, 0; }
int nvmlShutdown(void) { return inits--, 0; }

int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **device)
{
  if (!inits || strcmp(bus, "0000:19:00.0") != 0)
    return 13; /* NVML_ERROR_NOT_FOUND... any non-zero is an error to weft */
  *device = &device_tag;
  return 0;
}

int nvmlDeviceGetUtilizationRates(void *device, util_t *u)
{
  if (device != &device_tag)
    return 2; /* NVML_ERROR_INVALID_ARGUMENT */
  u->gpu = 37, u->memory = 11;
  return 0;
}

int nvmlDeviceGetMemoryInfo(void *device, mem_t *m)
{
  if (device != &device_tag)
    return 2;
  m->total = 85899345920ull, m->free = 85899345920ull - 1288490188ull, m->used = 1288490188ull;
  return 0;
}
