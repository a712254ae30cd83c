/*
 * wf_peak.h - a device's nominal peaks: what MFU and the kernel bench divide by.
 *
 * GPUs: NVIDIA's datasheet figures (dense, no sparsity) for 16-bit tensor cores, TF32
 * tensor cores and fp32 CUDA cores, and the HBM bandwidth. CPUs: cores x the highest
 * clock x the FLOP per cycle of the widest FMA the flags show (two pipes); a CPU's
 * memory bandwidth has no datasheet figure here, so whoever needs it measures it
 * (bench/kernels does).
 */
#ifndef WF_PEAK_H
#define WF_PEAK_H

#include <stdbool.h>
#include <stddef.h>

typedef struct wf_peak {
  double bf16, tf32, fp32; /* TFLOP/s, dense: 16-bit tensor cores, TF32, fp32 */
  double mem_gbs;          /* GB/s (datasheet); 0 = not known */
  char source[160];        /* where the figures come from, for a banner */
  char source_bf16[160];   /* the same for the bf16 figure alone */
} wf_peak;

/* The datasheet peaks of the GPU named `name` (as the driver names it, e.g. "NVIDIA
 * H100 80GB HBM3"); false when it is not listed. */
bool wf_peak_gpu(const char *name, wf_peak *out);

/* The nominal peaks of `cores` cores of this machine's CPU: fp32 (tf32 the same) from
 * the widest FMA, bf16 from the bf16 dot-product units when it has them (AMX,
 * AVX512_BF16), else the fp32 figure; mem_gbs 0. False when /proc/cpuinfo does not
 * tell. */
bool wf_peak_cpu(double cores, wf_peak *out);

#endif /* WF_PEAK_H */
