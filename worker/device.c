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

/* Nominal dense (no sparsity) peaks from NVIDIA's data sheets, in TFLOP/s: 16-bit
 * tensor cores, TF32 tensor cores, fp32 CUDA cores. The first entry whose name the
 * device's name contains wins, so the variants come before their family. */
static const struct {
  const char *name;
  double bf16, tf32, fp32;
} nominal_peaks[] = {
    {"H100 PCIe", 756.5, 378.0, 51.2}, {"H100 NVL", 835.5, 417.5, 60.0},
    {"H200 NVL", 835.5, 417.5, 60.0},  {"H100", 989.4, 494.7, 66.9},
    {"H200", 989.4, 494.7, 66.9},      {"A100", 312.0, 156.0, 19.5},
};

/* What MFU divides by on GPU `name` at the run's precision; 0 when it is not listed. */
static void nominal_peak(wf__rank_device *rd, const char *name, const wf_config *cfg)
{
  for (size_t i = 0; i < WF_ARRAY_LEN(nominal_peaks); i++) {
    if (!strstr(name, nominal_peaks[i].name))
      continue;
    const char *what = cfg->precision != WF_PREC_NO ? "16-bit tensor cores"
                       : cfg->runtime.allow_tf32    ? "TF32 tensor cores"
                                                    : "fp32 without TF32";
    rd->peak_tflops = cfg->precision != WF_PREC_NO ? nominal_peaks[i].bf16
                      : cfg->runtime.allow_tf32    ? nominal_peaks[i].tf32
                                                   : nominal_peaks[i].fp32;
    snprintf(rd->peak_source, sizeof rd->peak_source, "nominal dense peak of the %s, %s", name,
             what);
    return;
  }
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
  wf_dev_kernels(rd->dev)->set_tf32(cfg->runtime.allow_tf32);
  wf_dev_kernels(rd->dev)->set_attention(attention_impl(cfg));
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

/* fp32 FLOP per cycle per core of the widest FMA the CPU has, counted as two FMA pipes
 * of that width (Intel's server cores; AMD's Zen 4 splits AVX-512 into 256-bit halves,
 * so there this is twice its real rate: a bound, never a reachable figure). */
static int cpu_flops_per_cycle(const char *flags)
{
  if (strstr(flags, " avx512f"))
    return 64;
  if (strstr(flags, " avx2") && strstr(flags, " fma"))
    return 32;
  return strstr(flags, " avx") ? 16 : 8;
}

/* The highest clock in GHz: cpufreq's maximum (turbo) where the kernel has it, else
 * /proc/cpuinfo's "cpu MHz" (a VM's nominal clock, `cpuinfo_mhz`); 0 when neither is
 * known. */
static double cpu_ghz(double cpuinfo_mhz)
{
  double khz = 0;
  FILE *f = fopen("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "r");
  if (f) {
    if (fscanf(f, "%lf", &khz) != 1)
      khz = 0;
    fclose(f);
  }
  return WF_MAX(khz / 1e6, cpuinfo_mhz / 1e3);
}

void wf__cpu_peak(wf__rank_device *rd, double cores)
{
  char line[4096], flags[4096] = "";
  double mhz = 0;
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f)
    return;
  while (fgets(line, sizeof line, f) && !(flags[0] && mhz > 0)) {
    const char *val = strchr(line, ':');
    if (!val)
      continue;
    if (!flags[0] && !strncmp(line, "flags", 5))
      snprintf(flags, sizeof flags, " %s", val + 1); /* " " first: flags match " name" */
    else if (mhz <= 0 && !strncmp(line, "cpu MHz", 7))
      mhz = strtod(val + 1, NULL);
  }
  fclose(f);
  double ghz = cpu_ghz(mhz);
  if (!flags[0] || ghz <= 0 || cores <= 0)
    return;
  int fpc = cpu_flops_per_cycle(flags);
  rd->peak_tflops = cores * ghz * fpc * 1e-3;
  snprintf(rd->peak_source, sizeof rd->peak_source,
           "nominal fp32 peak: %.2f cores x %.2f GHz x %d FLOP/cycle (%s FMA, 2 pipes)", cores, ghz,
           fpc,
           fpc == 64   ? "AVX-512"
           : fpc == 32 ? "AVX2"
           : fpc == 16 ? "AVX"
                       : "SSE");
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
