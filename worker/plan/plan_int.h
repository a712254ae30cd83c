/*
 * plan_int.h - private to worker/plan: the GPU attention sizes, the enumeration's
 * candidates and what the commands print.
 *
 * Error idiom (the worker's): functions that can fail return a wf_status and log where
 * it arises (WF_TRY / goto fail); the search itself refuses nothing through the log: a
 * plan left out carries its reason as text, and only the command's verdict is said.
 */
#ifndef WF_PLAN_INT_H
#define WF_PLAN_INT_H

#include "wf_check.h"
#include "wf_device.h"
#include "wf_parallel.h"
#include "wf_plan.h"

/* The kernels whose attention sizes apply on hw: the CPU device's own, or
 * for a GPU profile a table carrying the CUDA flash kernel's sizes (B*NH*T floats kept
 * per layer, as kernels/cuda/flash.cu's wf_cuda_attention_saved says for head sizes up
 * to 128), so a CPU-only build can plan for GPUs. */
const wf_kset *wf__plan_kernels(const wf_hw *hw);

/* One enumerated plan and its predictions; reason is "" for a plan that fits. */
typedef struct wf__plan {
  wf_plan_mesh m;
  wf_plan_time t;
  size_t peak; /* the largest stage's bytes */
  int peak_stage;
  char reason[160]; /* why it is left out; "" = kept */
} wf__plan;

/* The memory limit per rank on hw for a world of `world` ranks, in bytes. */
double wf__plan_mem_limit(const wf_hw *hw, const wf_plan_cli *cli, int world);
/* The hardware profile the commands use: cli->hw, or this machine measured now. */
wf_status wf__plan_hw(const wf_config *cfg, const wf_plan_cli *cli, int world, wf_hw *hw, char *err,
                      size_t len);
/* This machine: GEMMs at the model's shapes for micro-batch rows N and tp 1..tpmax, and
 * memory bandwidth, measured on this process's threads; collectives are left to the
 * defaults (shared memory) unless a communicator is given. */
wf_status wf__plan_measure(const wf_model_dims *d, int N, int T, int tpmax, wf_hw *hw);
/* A mesh's key=value arguments (the line that runs it). */
void wf__plan_keys(const wf_plan_mesh *m, char *buf, size_t len);
/* Mesh in words: "dp 2 x tp 2 x pp 2, 1f1b, m 4 x B 2, zero 1, sp, recompute, bf16". */
void wf__plan_describe(const wf_plan_mesh *m, char *buf, size_t len);

#endif /* WF_PLAN_INT_H */
