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
  char peak_source[160];
} wf__rank_device;

/* The rank's device: GPU `local rank % visible` when runtime.device is auto or cuda and
 * one is usable (logged with its name, PCI bus id and memory; TF32 set from
 * runtime.allow_tf32), else the CPU (the reason logged once per node).
 * runtime.device=cuda without a usable GPU is an error (err). */
wf_status wf__pick_device(const wf_config *cfg, const wf_launch *l, wf__rank_device *rd, char *err,
                          size_t err_len);
void wf__rank_device_close(wf__rank_device *rd);

/* On the CPU: the nominal peak of the cores this rank computes on (`cores`, a fraction
 * when ranks share cores), from /proc/cpuinfo's widest FMA vector (its bf16 dot-product
 * units when precision=bf16's GEMMs run on oneDNN) and the highest clock it or cpufreq
 * reports. An upper bound no GEMM can beat, as a GPU's data sheet peak is; left 0 (MFU
 * falls back to a measurement) where the CPU is not known. */
void wf__cpu_peak(wf__rank_device *rd, double cores, const wf_config *cfg);

/* One rank's GPU as the choice of NCCL sees it: its host and the PCI bus id of its
 * device ("" when the rank computes on the CPU). `rank` is filled in by the decision. */
typedef struct wf__gpu_seat {
  char host[64];
  char bus[32];
  int rank;
} wf__gpu_seat;

typedef enum wf__gpu_sharing {
  WF__GPUS_OWN = 0, /* every rank has a GPU, no two on one host the same: NCCL */
  WF__GPUS_SHARED,  /* two ranks drive one GPU (NCCL refuses it): host staging */
  WF__GPUS_MISSING, /* some rank has no GPU: host staging on the ranks that have one */
} wf__gpu_sharing;

/* The decision, a pure function of every rank's seat (seats[i] is world rank i): GPUs
 * are told apart by host and PCI bus id, never by how many devices a rank sees (with
 * CUDA_VISIBLE_DEVICES per rank, as Slurm's --gpus-per-task=1 sets it, each rank sees
 * one device numbered 0, and they are different GPUs). *a < *b: the two lowest ranks on
 * the first shared GPU in (host, bus id) order (SHARED), or the first rank without a GPU
 * in *a (MISSING); else -1. */
wf__gpu_sharing wf__gpu_sharing_of(const wf__gpu_seat *seats, int n, int *a, int *b);

/* Collective over `world` (host buffers): whether the job's communicators can carry
 * device buffers on NCCL (*nccl), from every rank's seat; world rank 0 says which path
 * they take and why. The job's world communicator gets that path when it is made
 * (wf_job_opts), and every communicator made from it inherits it. */
wf_status wf__survey_gpus(wf_comm *world, const wf__rank_device *rd, bool *nccl);

#endif /* WF_WORKER_DEVICE_H */
