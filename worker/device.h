/*
 * device.h - private to the worker binary: which device a rank trains on, and how its
 * collectives reach device memory.
 */
#ifndef WF_WORKER_DEVICE_H
#define WF_WORKER_DEVICE_H

#include <stddef.h>

#include "wf_collectives.h"
#include "wf_config.h"
#include "wf_coordinator.h"
#include "wf_device.h"
#include "wf_gpu.h"
#include "wf_launch.h"

/* The device a rank trains on. */
typedef struct wf__rank_device {
  wf_gpu *gpu;        /* NULL on the CPU */
  wf_dev *dev;        /* the GPU's device or the CPU's */
  char desc[32];      /* "cpu" or "cuda:N" */
  char bus[32];       /* the GPU's PCI bus id, or "" */
  double peak_tflops; /* the GPU's nominal dense peak at the run's precision; 0 = unknown */
  char peak_source[128];
} wf__rank_device;

/* The rank's device: GPU `local rank % visible` when runtime.device is auto or cuda and
 * one is usable (logged with its name, PCI bus id and memory; TF32 set from
 * runtime.allow_tf32), else the CPU (the reason logged once per node).
 * runtime.device=cuda without a usable GPU is an error (err). */
wf_status wf__pick_device(const wf_config *cfg, const wf_launch *l, wf__rank_device *rd, char *err,
                          size_t err_len);
void wf__rank_device_close(wf__rank_device *rd);

/* On the CPU: the nominal fp32 peak of the cores this rank computes on (`cores`, a
 * fraction when ranks share cores), from /proc/cpuinfo's widest FMA vector and the
 * highest clock it or cpufreq reports. An upper bound no GEMM can beat, as a GPU's data
 * sheet peak is; left 0 (MFU falls back to a measurement) where the CPU is not known. */
void wf__cpu_peak(wf__rank_device *rd, double cores);

/* On a GPU: every communicator of the job carries device buffers, through NCCL when
 * each rank has a GPU of its own, else (more ranks on a node than GPUs: NCCL refuses
 * duplicate GPUs) through MPI with host staging. Collective over the job; rank 0 says
 * which. A no-op on the CPU. */
wf_status wf__comms_on_device(const wf_job *job, wf_gpu *gpu, const wf_launch *l);

#endif /* WF_WORKER_DEVICE_H */
