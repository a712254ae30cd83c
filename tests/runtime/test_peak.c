/*
 * test_peak.c - the nominal peaks MFU and bench/kernels divide by (runtime/peak.c).
 *
 * The expected figures are NVIDIA's datasheets (dense, no sparsity): H100 SXM5 80GB
 * 989.4 / 494.7 / 66.9 TFLOP/s (16-bit / TF32 / fp32) and 3.35 TB/s; H100 PCIe 756.5 /
 * 378 / 51.2 and 2.0 TB/s; H200 SXM 4.8 TB/s; A100 40GB 1555 GB/s, 80GB SXM 2039 GB/s.
 * Device names are the driver's (cudaGetDeviceProperties), which name the variant.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "wf_peak.h"

static void test_gpus(void **state)
{
  wf_peak p;
  assert_true(wf_peak_gpu("NVIDIA H100 80GB HBM3", &p));
  assert_float_equal(p.bf16, 989.4, 1e-9);
  assert_float_equal(p.tf32, 494.7, 1e-9);
  assert_float_equal(p.fp32, 66.9, 1e-9);
  assert_float_equal(p.mem_gbs, 3350, 1e-9);
  assert_non_null(strstr(p.source, "datasheet"));
  assert_true(wf_peak_gpu("NVIDIA H100 PCIe", &p)); /* the variant, not the family */
  assert_float_equal(p.bf16, 756.5, 1e-9);
  assert_float_equal(p.mem_gbs, 2000, 1e-9);
  assert_true(wf_peak_gpu("NVIDIA H200", &p));
  assert_float_equal(p.mem_gbs, 4800, 1e-9);
  assert_true(wf_peak_gpu("NVIDIA A100-SXM4-40GB", &p));
  assert_float_equal(p.mem_gbs, 1555, 1e-9);
  assert_true(wf_peak_gpu("NVIDIA A100-SXM4-80GB", &p));
  assert_float_equal(p.mem_gbs, 2039, 1e-9);
  assert_false(wf_peak_gpu("NVIDIA GeForce RTX 4090", &p));
  assert_false(wf_peak_gpu(NULL, &p));
}

/* The CPU's figure is cores x clock x FLOP/cycle: linear in the cores. */
static void test_cpu(void **state)
{
  wf_peak one, two;
  assert_true(wf_peak_cpu(1, &one)); /* Linux x86: /proc/cpuinfo has flags and a clock */
  assert_true(wf_peak_cpu(2, &two));
  assert_true(one.fp32 > 0);
  assert_float_equal(two.fp32, 2 * one.fp32, 1e-12);
  /* bf16: the fp32 FMAs' figure, or the bf16 dot products' (AVX512_BF16 twice it, AMX
   * 1024 FLOP/cycle against the FMA's 64); tests/mpi/mfu.py checks which from the flags.
   * The ratios are powers of two, so exact in floating point. */
  double r = one.bf16 / one.fp32;
  assert_true(r == 1 || r == 2 || r == 16);
  assert_float_equal(two.bf16, 2 * one.bf16, 1e-12);
  assert_non_null(strstr(one.source_bf16, r == 1 ? "nominal fp32 peak" : "nominal bf16 peak"));
  assert_float_equal(one.mem_gbs, 0, 0);
  assert_non_null(strstr(one.source, "nominal fp32 peak"));
  assert_false(wf_peak_cpu(0, &one));
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpus),
      cmocka_unit_test(test_cpu),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
