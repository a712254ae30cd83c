/*
 * test_hw.c - the rates the time model reads from a hardware profile (worker/plan/hw.c),
 * on profiles written out here:
 *  - a GEMM between two measured row counts of its shape takes the rate interpolated in
 *    log(rows); at a measured one, that one's; past the measured rows, the nearest's;
 *  - an all-reduce and an all-gather take the profile's measured rates for the nearest
 *    group, and an all-gather without its rate half an all-reduce of the vector (the
 *    built-in GPU profiles, and files written before it was measured).
 * Expected values are computed here from the profile's own numbers; the tolerance is
 * double rounding (1e-12 relative).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "wf_plan.h"

#define REL 1e-12

static void near(double got, double want)
{
  if (fabs(got - want) > REL * fabs(want))
    fail_msg("got %.17g, want %.17g", got, want);
}

/* (64, 192, 64) at 0.1 TFLOPS and (256, 192, 64) at 0.2, one thread. */
static wf_hw two_rows(void)
{
  wf_hw hw = {.n_gemm = 2, .mem_bw = 1e10};
  hw.gemm[0] = (wf_hw_gemm){64, 192, 64, 1, 0.1, false};
  hw.gemm[1] = (wf_hw_gemm){256, 192, 64, 1, 0.2, false};
  return hw;
}

static void gemm_rows(void **state)
{
  (void)state;
  wf_hw hw = two_rows();
  double f = 2.0 * 192 * 64; /* flops per row */
  near(wf_hw_gemm_s(&hw, 64, 192, 64, 1, WF_PREC_NO), 64 * f / 0.1e12);
  near(wf_hw_gemm_s(&hw, 256, 192, 64, 1, WF_PREC_NO), 256 * f / 0.2e12);
  /* 128 rows: half-way in log(rows) */
  near(wf_hw_gemm_s(&hw, 128, 192, 64, 1, WF_PREC_NO), 128 * f / 0.15e12);
  near(wf_hw_gemm_s(&hw, 1024, 192, 64, 1, WF_PREC_NO), 1024 * f / 0.2e12);
  near(wf_hw_gemm_s(&hw, 32, 192, 64, 1, WF_PREC_NO), 32 * f / 0.1e12);
}

static void allreduce_allgather(void **state)
{
  (void)state;
  wf_hw hw = {.n_coll = 2, .intra_alpha_s = 1, .intra_bw = 1}; /* links never used here */
  hw.coll[0] = (wf_hw_coll){2, 10e-6, 1e9, 4e9, 0.25e9, 2e9};
  hw.coll[1] = (wf_hw_coll){8, 30e-6, 0.5e9, 1e9, 0, 0};
  double b = 1 << 20;
  near(wf_hw_allreduce_s(&hw, b, 2, true), 10e-6 + b / 1e9);
  near(wf_hw_allgather_s(&hw, b, 2, true), 10e-6 + b / 4e9);
  near(wf_hw_allreduce_s(&hw, b, 8, true), 30e-6 + b / 0.5e9);
  near(wf_hw_allgather_s(&hw, b, 8, true), 30e-6 + b / 1e9);
  /* the gradient path's all-reduce: its own rate where measured, else a blocking one's */
  near(wf_hw_dp_allreduce_s(&hw, b, 2, true), 10e-6 + b / 0.25e9);
  near(wf_hw_dp_allreduce_s(&hw, b, 8, true), 30e-6 + b / 0.5e9);
  /* expert parallelism's all-to-all: its own rate where measured, else an all-gather's */
  near(wf_hw_alltoall_s(&hw, b, 2, true), 10e-6 + b / 2e9);
  near(wf_hw_alltoall_s(&hw, b, 8, true), wf_hw_allgather_s(&hw, b, 8, true));
  hw.coll[1].ag_bw = 0; /* not measured: half an all-reduce */
  near(wf_hw_allgather_s(&hw, b, 8, true), (30e-6 + b / 0.5e9) / 2);
  near(wf_hw_allgather_s(&hw, b, 1, true), 0);
}

static void builtin_halves(void **state)
{
  (void)state;
  wf_hw hw;
  assert_int_equal(wf_hw_builtin("h100-sxm", &hw), WF_OK);
  double b = 1e9, ar = wf_hw_allreduce_s(&hw, b, 8, false);
  near(ar, hw.inter_alpha_s + 2.0 * 7 / 8 * b / hw.inter_bw);
  near(wf_hw_allgather_s(&hw, b, 8, false), ar / 2);
  near(wf_hw_allgather_s(&hw, b, 8, true), wf_hw_allreduce_s(&hw, b, 8, true) / 2);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(gemm_rows),
      cmocka_unit_test(allreduce_allgather),
      cmocka_unit_test(builtin_halves),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
