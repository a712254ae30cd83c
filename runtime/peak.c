/*
 * peak.c - nominal peaks of GPUs (datasheets) and CPUs (cores x clock x FMA width), for
 * MFU (worker/device.c) and the kernel bench (bench/kernels.c). See wf_peak.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wf_peak.h"
#include "wf_runtime.h"

/* NVIDIA's datasheets, dense (no sparsity): TFLOP/s of 16-bit tensor cores, TF32 tensor
 * cores and fp32 CUDA cores, and HBM GB/s. The first entry whose name the device's name
 * contains wins, so the variants come before their family. */
static const struct {
  const char *name;
  double bf16, tf32, fp32, mem_gbs;
} gpus[] = {
    {"H100 PCIe", 756.5, 378.0, 51.2, 2000},      {"H100 NVL", 835.5, 417.5, 60.0, 3900},
    {"H200 NVL", 835.5, 417.5, 60.0, 4800},       {"H100", 989.4, 494.7, 66.9, 3350},
    {"H200", 989.4, 494.7, 66.9, 4800},           {"A100-SXM4-40GB", 312.0, 156.0, 19.5, 1555},
    {"A100-PCIE-40GB", 312.0, 156.0, 19.5, 1555}, {"A100 80GB PCIe", 312.0, 156.0, 19.5, 1935},
    {"A100", 312.0, 156.0, 19.5, 2039},
};

bool wf_peak_gpu(const char *name, wf_peak *out)
{
  for (size_t i = 0; name && i < WF_ARRAY_LEN(gpus); i++) {
    if (!strstr(name, gpus[i].name))
      continue;
    *out = (wf_peak){.bf16 = gpus[i].bf16,
                     .tf32 = gpus[i].tf32,
                     .fp32 = gpus[i].fp32,
                     .mem_gbs = gpus[i].mem_gbs};
    snprintf(out->source, sizeof out->source,
             "NVIDIA datasheet, %s: 16-bit %.1f, TF32 %.1f, fp32 %.1f TFLOP/s dense, %.0f GB/s",
             gpus[i].name, gpus[i].bf16, gpus[i].tf32, gpus[i].fp32, gpus[i].mem_gbs);
    snprintf(out->source_bf16, sizeof out->source_bf16, "%s", out->source);
    return true;
  }
  return false;
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

/* bf16 FLOP per cycle per core of the units oneDNN's bf16 GEMMs run on
 * (kernels/cpu/dnnl.c): AMX tiles, 1024 (Intel's figure per core); AVX512_BF16's dot
 * products, twice the fp32 FMA's (two bf16 products per fp32 lane); else the fp32
 * FMAs, which widened operands run on. */
static int cpu_bf16_flops_per_cycle(const char *flags, int fp32)
{
  if (strstr(flags, " amx_bf16"))
    return 1024;
  return strstr(flags, " avx512_bf16") ? 2 * fp32 : fp32;
}

bool wf_peak_cpu(double cores, wf_peak *out)
{
  char line[4096], flags[4096] = "";
  double mhz = 0;
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f)
    return false;
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
    return false;
  int fpc = cpu_flops_per_cycle(flags), bpc = cpu_bf16_flops_per_cycle(flags, fpc);
  double tflops = cores * ghz * fpc * 1e-3;
  *out = (wf_peak){.bf16 = cores * ghz * bpc * 1e-3, .tf32 = tflops, .fp32 = tflops};
  snprintf(out->source, sizeof out->source,
           "nominal fp32 peak: %.2f cores x %.2f GHz x %d FLOP/cycle (%s FMA, 2 pipes)", cores, ghz,
           fpc,
           fpc == 64   ? "AVX-512"
           : fpc == 32 ? "AVX2"
           : fpc == 16 ? "AVX"
                       : "SSE");
  if (bpc == fpc)
    snprintf(out->source_bf16, sizeof out->source_bf16, "%s", out->source);
  else
    snprintf(out->source_bf16, sizeof out->source_bf16,
             "nominal bf16 peak: %.2f cores x %.2f GHz x %d FLOP/cycle (%s)", cores, ghz, bpc,
             bpc == 1024 ? "AMX tiles" : "AVX512_BF16 dot products, 2 pipes");
  return true;
}
