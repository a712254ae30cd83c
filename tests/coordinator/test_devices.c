/*
 * test_devices.c - wf_devices_compare: the job's device check names the ranks of each
 * kind; GPUs of different models are MODELS (a warning), the CPU beside GPUs is MIXED
 * (refused), one kind everywhere is SAME.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "wf_coordinator.h"

static wf_devices_verdict compare(const char *const *devices, int n, char *msg, size_t len)
{
  wf_rank_facts f[16];
  memset(f, 0, sizeof f);
  for (int r = 0; r < n; r++) {
    f[r].rank = r;
    snprintf(f[r].device, sizeof f[r].device, "%s", devices[r]);
  }
  return wf_devices_compare(f, n, msg, len);
}

static void test_same(void **state)
{
  (void)state;
  char msg[512];
  const char *cpu[] = {"cpu", "cpu", "cpu", "cpu"};
  const char *h100[] = {"cuda:0 (NVIDIA H100 80GB HBM3)", "cuda:1 (NVIDIA H100 80GB HBM3)"};
  assert_int_equal(compare(cpu, 4, msg, sizeof msg), WF_DEVICES_SAME);
  assert_string_equal(msg, "");
  /* the device index differs, the model does not */
  assert_int_equal(compare(h100, 2, msg, sizeof msg), WF_DEVICES_SAME);
}

static void test_models_differ(void **state)
{
  (void)state;
  char msg[512];
  const char *d[] = {"cuda:0 (NVIDIA H100 80GB HBM3)", "cuda:1 (NVIDIA H100 80GB HBM3)",
                     "cuda:0 (NVIDIA A100-SXM4-80GB)", "cuda:1 (NVIDIA H100 80GB HBM3)"};
  assert_int_equal(compare(d, 4, msg, sizeof msg), WF_DEVICES_MODELS);
  assert_string_equal(msg, "ranks 0-1,3 on NVIDIA H100 80GB HBM3, rank 2 on NVIDIA A100-SXM4-80GB");
}

static void test_cpu_beside_gpus(void **state)
{
  (void)state;
  char msg[512];
  const char *d[] = {"cuda:0 (NVIDIA H200)", "cuda:1 (NVIDIA H200)", "cpu", "cpu",
                     "cuda:0 (NVIDIA H200)"};
  assert_int_equal(compare(d, 5, msg, sizeof msg), WF_DEVICES_MIXED);
  assert_string_equal(msg, "ranks 0-1,4 on NVIDIA H200, ranks 2-3 on the CPU");
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same),
      cmocka_unit_test(test_models_differ),
      cmocka_unit_test(test_cpu_beside_gpus),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
