/*
 * device.c - the rank's device and its collectives' path to device memory.
 *
 * The choice is the DESIGN's: a CUDA device when one is visible and not disabled,
 * device `local rank % visible`; otherwise the CPU, said once per node. A GPU that
 * opens but whose module has no usable kernel table is a fallback too (auto) or an
 * error (runtime.device=cuda), never a crash later.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "wf_check.h"
#include "wf_peak.h"

/* What MFU divides by on GPU `name` at the run's precision (runtime/peak.c's
 * datasheet table); 0 when it is not listed. */
static void nominal_peak(wf__rank_device *rd, const char *name, const wf_config *cfg)
{
  wf_peak p;
  if (!wf_peak_gpu(name, &p))
    return;
  const char *what = cfg->precision != WF_PREC_NO ? "16-bit tensor cores"
                     : cfg->runtime.allow_tf32    ? "TF32 tensor cores"
                                                  : "fp32 without TF32";
  rd->peak_tflops = cfg->precision != WF_PREC_NO ? p.bf16
                    : cfg->runtime.allow_tf32    ? p.tf32
                                                 : p.fp32;
  snprintf(rd->peak_source, sizeof rd->peak_source, "nominal dense peak of the %s, %s", name, what);
}

/* Open GPU `d` of rd->gpu as the rank's device; describe it. */
static wf_status open_gpu(wf__rank_device *rd, const wf_config *cfg, int d, int n, char *why,
                          size_t why_len)
{
  wf_status st = WF_OK;
  char name[128] = "";
  size_t free_b = 0, total = 0;
  WF_TRY(wf_gpu_set_device(rd->gpu, d));
  WF_TRY(wf_dev_open_cuda(&rd->dev, rd->gpu, why, why_len));
  wf_dev_kernels(rd->dev)->set_tf32(cfg->runtime.allow_tf32);
  wf_gpu_device_name(rd->gpu, d, name, sizeof name);
  wf_gpu_pci_bus_id(rd->gpu, d, rd->bus, sizeof rd->bus);
  wf_gpu_mem_info(rd->gpu, &free_b, &total);
  snprintf(rd->desc, sizeof rd->desc, "cuda:%d", d);
  nominal_peak(rd, name, cfg);
  WF_INFO("using GPU %d of %d: %s, PCI %s, %.1f GiB (%.1f GiB free), TF32 %s", d, n, name, rd->bus,
          (double)total / (1 << 30), (double)free_b / (1 << 30),
          cfg->runtime.allow_tf32 ? "allowed" : "off (runtime.allow_tf32)");
fail:
  if (st != WF_OK && !why[0])
    snprintf(why, why_len, "could not select CUDA device %d", d);
  return st;
}

void wf__cpu_peak(wf__rank_device *rd, double cores)
{
  wf_peak p;
  if (!wf_peak_cpu(cores, &p))
    return;
  rd->peak_tflops = p.fp32;
  wf_strlcpy(rd->peak_source, p.source, sizeof rd->peak_source);
}

static void use_cpu(wf__rank_device *rd)
{
  *rd = (wf__rank_device){.dev = wf_dev_cpu()};
  snprintf(rd->desc, sizeof rd->desc, "cpu");
}

wf_status wf__pick_device(const wf_config *cfg, const wf_launch *l, wf__rank_device *rd, char *err,
                          size_t err_len)
{
  char why[512] = "disabled by runtime.device=cpu";
  use_cpu(rd);
  if (cfg->runtime.device != WF_DEV_CPU && wf_gpu_open(&rd->gpu, why, sizeof why) == WF_OK) {
    int n = wf_gpu_device_count(rd->gpu), d = n == 1 ? 0 : l->local_rank % n;
    why[0] = '\0';
    if (open_gpu(rd, cfg, d, n, why, sizeof why) == WF_OK)
      return WF_OK;
    wf_gpu_close(rd->gpu);
    use_cpu(rd);
  }
  if (cfg->runtime.device == WF_DEV_CUDA) {
    snprintf(err, err_len, "runtime.device=cuda but no GPU is usable: %s", why);
    return WF_ENODEV;
  }
  if (l->local_rank == 0 && cfg->runtime.device == WF_DEV_AUTO)
    WF_INFO("no GPU: %s; falling back to the CPU", why);
  return WF_OK;
}

void wf__rank_device_close(wf__rank_device *rd)
{
  wf_dev_close(rd->dev);
  wf_gpu_close(rd->gpu);
  use_cpu(rd);
}

/* Whether every rank has a GPU, and whether any node runs more ranks than it has GPUs:
 * the same answers on every rank (one MIN all-reduce of both). */
static wf_status survey(wf_comm *world, wf_gpu *gpu, const wf_launch *l, bool *all_gpu,
                        bool *shared)
{
  int32_t v[2] = {gpu != NULL, !(gpu && l->local_size > wf_gpu_device_count(gpu))};
  wf_status st = wf_comm_allreduce(world, v, v, 2, WF_COMM_I32, WF_COMM_MIN);
  *all_gpu = v[0] != 0;
  *shared = v[1] == 0;
  return st;
}

/* NCCL on c (collective over c), or host staging when it must not or cannot start
 * (agreed inside wf_comm_enable_nccl, so every rank of c takes the same path). */
static wf_status on_device(wf_comm *c, wf_gpu *gpu, bool nccl, bool *staged)
{
  char why[512] = "";
  if (!c)
    return WF_OK;
  if (nccl && wf_comm_enable_nccl(c, gpu, why, sizeof why) == WF_OK)
    return WF_OK;
  if (nccl && wf_rt_rank() <= 0)
    WF_WARN("comm '%s': NCCL could not start (%s); device buffers go through MPI with host "
            "staging",
            wf_comm_name(c), why);
  *staged = true;
  return wf_comm_enable_staging(c, gpu);
}

wf_status wf__comms_on_device(const wf_job *job, wf_gpu *gpu, const wf_launch *l)
{
  wf_status st = WF_OK;
  wf_comm *world = wf_job_world_comm(job);
  bool all_gpu = false, shared = false, staged = false;
  WF_TRY(survey(world, gpu, l, &all_gpu, &shared));
  if (!gpu)
    return WF_OK; /* a CPU rank: host buffers, MPI, nothing to set up */
  /* NCCL is collective over each communicator: only when every rank takes part. */
  bool nccl = all_gpu && !shared;
  WF_TRY(on_device(world, gpu, nccl, &staged));
  for (int a = 0; a < WF_NUM_AXES; a++)
    WF_TRY(on_device(wf_job_comm(job, (wf_axis)a), gpu, nccl, &staged));
  if (wf_rt_rank() == 0)
    WF_INFO("collectives on device buffers: %s",
            !all_gpu ? "MPI with host staging (some ranks have no GPU)"
            : shared ? "MPI with host staging (ranks share a GPU; NCCL refuses duplicate GPUs)"
            : staged ? "NCCL where it started, MPI with host staging elsewhere"
                     : "NCCL");
fail:
  return st;
}
