/*
 * wf_nvml.h - a GPU's utilisation and memory for the console and /metrics, from NVML
 * (the driver's libnvidia-ml.so.1, loaded at run time; absent on machines without the
 * NVIDIA driver, where wf_nvml_open says why and nothing is reported).
 */
#ifndef WF_NVML_H
#define WF_NVML_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wf_runtime.h"

typedef struct wf_nvml wf_nvml;

typedef struct wf_nvml_figures {
  int util_pct;       /* kernels running in the last sample period, percent */
  uint64_t mem_used;  /* device memory in use by every process, bytes */
  uint64_t mem_total; /* bytes */
} wf_nvml_figures;

/* The GPU at PCI bus id `pci_bus_id` ("0000:19:00.0"). WF_ENODEV and `why` when NVML or
 * the device is not there. */
wf_status wf_nvml_open(wf_nvml **out, const char *pci_bus_id, char *why, size_t why_len);
/* false when a query fails (the figures are then left as they were). */
bool wf_nvml_sample(wf_nvml *n, wf_nvml_figures *f);
void wf_nvml_close(wf_nvml *n); /* accepts NULL */

#endif /* WF_NVML_H */
