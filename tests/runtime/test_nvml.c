/*
 * test_nvml.c - the NVML binding (runtime/nvml.c) against tests/runtime/fake_nvml.c,
 * found through LD_LIBRARY_PATH (meson sets it for the "nvml" test): the figures the
 * fake returns arrive intact, an unknown bus id and a missing library are errors that
 * say why. Run without the fake (the "nvml-absent" test) it checks the absent case only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wf_nvml.h"

static void test_fake_figures(void **state)
{
  (void)state;
  if (!getenv("WEFT_TEST_FAKE_NVML"))
    skip();
  wf_nvml *n = NULL;
  char why[256] = "";
  assert_int_equal(wf_nvml_open(&n, "0000:19:00.0", why, sizeof why), WF_OK);
  wf_nvml_figures f = {0};
  assert_true(wf_nvml_sample(n, &f));
  assert_int_equal(f.util_pct, 37);
  assert_int_equal(f.mem_used, 1288490188ull);
  assert_int_equal(f.mem_total, 85899345920ull);
  wf_nvml_close(n);
}

static void test_unknown_bus(void **state)
{
  (void)state;
  if (!getenv("WEFT_TEST_FAKE_NVML"))
    skip();
  wf_nvml *n = (wf_nvml *)1;
  char why[256] = "";
  assert_int_equal(wf_nvml_open(&n, "0000:aa:00.0", why, sizeof why), WF_ENODEV);
  assert_null(n);
  assert_non_null(strstr(why, "no GPU at PCI 0000:aa:00.0"));
}

static void test_absent(void **state)
{
  (void)state;
  if (getenv("WEFT_TEST_FAKE_NVML"))
    skip();
  wf_nvml *n = (wf_nvml *)1;
  char why[256] = "";
  assert_int_equal(wf_nvml_open(&n, "0000:19:00.0", why, sizeof why), WF_ENODEV);
  assert_null(n);
  assert_non_null(strstr(why, "libnvidia-ml.so.1"));
  assert_false(wf_nvml_sample(NULL, &(wf_nvml_figures){0}));
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fake_figures),
      cmocka_unit_test(test_unknown_bus),
      cmocka_unit_test(test_absent),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
