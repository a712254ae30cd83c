/*
 * device.c - the rank's device and its collectives' path to device memory.
 *
 * The choice is the DESIGN's: a CUDA device when one is visible and not disabled,
 * device `local rank % visible`; otherwise the CPU, said once per node. A GPU that
 * opens but whose module has no usable kernel registry is a fallback too (auto) or an
 * error (runtime.device=cuda), never a crash later.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "wf_check.h"
#include "wf_kernels.h"
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

/* runtime.attention as the GPU's kernels take it: auto means the tensor-core paths
 * (cuDNN, else weft's flash kernels, chosen per shape by the module) only under
 * precision=bf16, whose activations they round to bf16 anyway; otherwise the fp32
 * reference. An explicit cudnn or flash is taken as asked. */
static int attention_impl(const wf_config *cfg)
{
  if (cfg->runtime.attention == WF_ATTN_AUTO && cfg->precision != WF_PREC_BF16)
    return WF_ATTN_REFERENCE;
  return cfg->runtime.attention;
}

static const char *attention_name(int impl)
{
  static const char *names[] = {"auto: cudnn, else flash, else reference", "cudnn", "flash",
                                "reference (fp32)"};
  return impl >= 0 && impl < (int)WF_ARRAY_LEN(names) ? names[impl] : "?";
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
  WF_K(wf_dev_kernels(rd->dev, WF_DT_F32), matmul)->set_tf32(cfg->runtime.allow_tf32);
  WF_K(wf_dev_kernels(rd->dev, WF_DT_F32), attention)->set_impl(attention_impl(cfg));
  wf_gpu_device_name(rd->gpu, d, name, sizeof name);
  wf_gpu_pci_bus_id(rd->gpu, d, rd->bus, sizeof rd->bus);
  wf_gpu_mem_info(rd->gpu, &free_b, &total);
  snprintf(rd->desc, sizeof rd->desc, "cuda:%d", d);
  nominal_peak(rd, name, cfg);
  WF_INFO("using GPU %d of %d: %s, PCI %s, %.1f GiB (%.1f GiB free), TF32 %s, attention %s", d, n,
          name, rd->bus, (double)total / (1 << 30), (double)free_b / (1 << 30),
          cfg->runtime.allow_tf32 ? "allowed" : "off (runtime.allow_tf32)",
          attention_name(attention_impl(cfg)));
fail:
  if (st != WF_OK && !why[0])
    snprintf(why, why_len, "could not select CUDA device %d", d);
  return st;
}

void wf__cpu_peak(wf__rank_device *rd, double cores, const wf_config *cfg)
{
  wf_peak p;
  if (!wf_peak_cpu(cores, &p))
    return;
  /* bf16 runs' GEMMs, the FLOPs that count, are oneDNN's when it takes them */
  bool dots = cfg->precision == WF_PREC_BF16 && wf_kernels_bf16_gemm_fast();
  rd->peak_tflops = dots ? p.bf16 : p.fp32;
  wf_strlcpy(rd->peak_source, dots ? p.source_bf16 : p.source, sizeof rd->peak_source);
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
  wf_kernels_allow_bf16_gemm(cfg->runtime.cpu_bf16_gemm);
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

/* ---- which path device buffers take ------------------------------------------------- */

static bool same_gpu(const wf__gpu_seat *a, const wf__gpu_seat *b)
{
  return !strcmp(a->host, b->host) && !strcmp(a->bus, b->bus);
}

/* Seats sorted by (host, bus, rank): ranks on one GPU end up side by side, in order. */
static int seat_cmp(const void *x, const void *y)
{
  const wf__gpu_seat *a = x, *b = y;
  int c = strcmp(a->host, b->host);
  c = c ? c : strcmp(a->bus, b->bus);
  return c ? c : (a->rank > b->rank) - (a->rank < b->rank);
}

wf__gpu_sharing wf__gpu_sharing_of(const wf__gpu_seat *seats, int n, int *a, int *b)
{
  *a = *b = -1;
  for (int i = 0; i < n; i++)
    if (!seats[i].bus[0]) {
      *a = i;
      return WF__GPUS_MISSING;
    }
  wf__gpu_seat *s = malloc((size_t)(n > 0 ? n : 1) * sizeof *s);
  if (!s) { /* cannot tell: the path that works either way */
    *a = 0;
    return WF__GPUS_SHARED;
  }
  memcpy(s, seats, (size_t)n * sizeof *s);
  for (int i = 0; i < n; i++)
    s[i].rank = i;
  qsort(s, (size_t)n, sizeof *s, seat_cmp);
  wf__gpu_sharing out = WF__GPUS_OWN;
  for (int i = 1; i < n && out == WF__GPUS_OWN; i++)
    if (same_gpu(&s[i - 1], &s[i])) {
      *a = s[i - 1].rank, *b = s[i].rank;
      out = WF__GPUS_SHARED;
    }
  free(s);
  return out;
}

/* Say once (world rank 0) which path device buffers take, and why. */
static void say_path(wf__gpu_sharing how, const wf__gpu_seat *all, int a, int b)
{
  if (how == WF__GPUS_OWN)
    WF_INFO("collectives on device buffers: NCCL (every rank has a GPU of its own, by PCI bus "
            "id)");
  else if (how == WF__GPUS_MISSING)
    WF_INFO("collectives on device buffers: MPI with host staging (rank %d has no GPU)", a);
  else
    WF_INFO("collectives on device buffers: MPI with host staging (ranks %d and %d share the "
            "GPU %s on %s; NCCL refuses duplicate GPUs)",
            a, b, all[a].bus, all[a].host);
}

wf_status wf__survey_gpus(wf_comm *world, const wf__rank_device *rd, bool *nccl)
{
  wf_status st = WF_OK;
  int n = wf_comm_size(world), a, b;
  wf__gpu_seat mine = {.rank = wf_comm_rank(world)}, *all = NULL;
  wf_strlcpy(mine.host, wf_rt_host(), sizeof mine.host);
  if (rd->gpu)
    wf_strlcpy(mine.bus, rd->bus[0] ? rd->bus : "?", sizeof mine.bus);
  WF_CHECK_ALLOC(all = calloc((size_t)n, sizeof *all));
  WF_TRY(wf_comm_allgather(world, &mine, all, sizeof mine, WF_COMM_U8));
  wf__gpu_sharing how = wf__gpu_sharing_of(all, n, &a, &b);
  *nccl = how == WF__GPUS_OWN;
  bool any_gpu = false;
  for (int i = 0; i < n; i++)
    any_gpu |= all[i].bus[0] != '\0';
  if (wf_comm_rank(world) == 0 && any_gpu) /* a CPU job has nothing to say */
    say_path(how, all, a, b);
fail:
  free(all);
  return st;
}
