/*
 * nvml.c - a GPU's utilisation and memory from NVML, loaded at run time.
 *
 * libnvidia-ml.so.1 comes with the NVIDIA driver, not with the CUDA toolkit (whose
 * headers here have no nvml.h), so it is dlopen()ed like the CUDA module: the worker
 * runs where it is missing and simply reports no figures. The four entry points weft
 * calls are declared below with NVML's documented C ABI: nvmlReturn_t is an int (0 is
 * NVML_SUCCESS) and a device handle is an opaque pointer.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wf_nvml.h"

typedef struct nvml_utilization {
  unsigned int gpu, memory; /* percent of the last sample period */
} nvml_utilization;

typedef struct nvml_memory {
  unsigned long long total, free, used; /* bytes */
} nvml_memory;

struct wf_nvml {
  void *lib;
  void *device;
  int (*shutdown)(void);
  int (*utilization)(void *, nvml_utilization *);
  int (*memory)(void *, nvml_memory *);
};

static void *sym(void *lib, const char *name, char *why, size_t len)
{
  void *p = dlsym(lib, name);
  if (!p)
    snprintf(why, len, "libnvidia-ml.so.1 has no %s", name);
  return p;
}

wf_status wf_nvml_open(wf_nvml **out, const char *pci_bus_id, char *why, size_t why_len)
{
  *out = NULL;
  wf_nvml *n = calloc(1, sizeof *n);
  if (!n) {
    snprintf(why, why_len, "out of memory");
    return WF_ENOMEM;
  }
  int (*init)(void) = NULL;
  int (*by_bus)(const char *, void **) = NULL;
  n->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!n->lib) {
    snprintf(why, why_len, "NVML is not installed (libnvidia-ml.so.1: %s)", dlerror());
    goto fail;
  }
  if (!(*(void **)&init = sym(n->lib, "nvmlInit_v2", why, why_len)) ||
      !(*(void **)&by_bus = sym(n->lib, "nvmlDeviceGetHandleByPciBusId_v2", why, why_len)) ||
      !(*(void **)&n->shutdown = sym(n->lib, "nvmlShutdown", why, why_len)) ||
      !(*(void **)&n->utilization = sym(n->lib, "nvmlDeviceGetUtilizationRates", why, why_len)) ||
      !(*(void **)&n->memory = sym(n->lib, "nvmlDeviceGetMemoryInfo", why, why_len)))
    goto fail;
  int rc = init();
  if (rc != 0) {
    snprintf(why, why_len, "nvmlInit_v2 failed (NVML error %d)", rc);
    n->shutdown = NULL;
    goto fail;
  }
  rc = by_bus(pci_bus_id, &n->device);
  if (rc != 0) {
    snprintf(why, why_len, "NVML knows no GPU at PCI %s (NVML error %d)", pci_bus_id, rc);
    goto fail;
  }
  *out = n;
  return WF_OK;
fail:
  wf_nvml_close(n);
  return WF_ENODEV;
}

bool wf_nvml_sample(wf_nvml *n, wf_nvml_figures *f)
{
  nvml_utilization u;
  nvml_memory m;
  if (!n || n->utilization(n->device, &u) != 0 || n->memory(n->device, &m) != 0)
    return false;
  *f = (wf_nvml_figures){.util_pct = (int)u.gpu, .mem_used = m.used, .mem_total = m.total};
  return true;
}

void wf_nvml_close(wf_nvml *n)
{
  if (!n)
    return;
  if (n->shutdown)
    n->shutdown();
  if (n->lib)
    dlclose(n->lib);
  free(n);
}
