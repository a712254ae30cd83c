/*
 * test_rng.c - the counter-based RNG: known-answer test, slice independence and
 * distribution moments.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "wf_runtime.h"

static void test_known_answer(void **state)
{
  /* Philox4x32-10 known-answer vectors from the Random123 distribution
   * (kat_vectors): ctr = 0, key = 0 and ctr = all ones, key = all ones. */
  uint32_t out[4];
  uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0};
  wf_philox4x32(out, c0, k0);
  assert_int_equal(out[0], 0x6627e8d5u);
  assert_int_equal(out[1], 0xe169c58du);
  assert_int_equal(out[2], 0xbc57ac4cu);
  assert_int_equal(out[3], 0x9b00dbd8u);
  uint32_t c1[4] = {~0u, ~0u, ~0u, ~0u}, k1[2] = {~0u, ~0u};
  wf_philox4x32(out, c1, k1);
  assert_int_equal(out[0], 0x408f276du);
  assert_int_equal(out[1], 0x41c83b0eu);
  assert_int_equal(out[2], 0xa20bc7c6u);
  assert_int_equal(out[3], 0x6d5451fdu);
}

static void test_slices_match(void **state)
{
  enum { N = 1000 };
  float full[N], part[N];
  wf_rng_fill_normal(full, N, 0.02f, 1337, 7, 0);
  /* Any slice, produced alone, equals the same slice of the whole tensor. */
  wf_rng_fill_normal(part, 333, 0.02f, 1337, 7, 500);
  for (int i = 0; i < 333; i++)
    assert_true(part[i] == full[500 + i]);
  /* Another stream or seed gives different numbers. */
  wf_rng_fill_normal(part, N, 0.02f, 1337, 8, 0);
  int same = 0;
  for (int i = 0; i < N; i++)
    same += part[i] == full[i];
  assert_true(same < 5);
}

static void test_moments(void **state)
{
  /* 200k samples: the standard error of the mean is 1/sqrt(2e5) = 0.0022 and of the
   * variance sqrt(2/2e5) = 0.0032, so 5 sigma bounds are 0.011 and 0.016. */
  enum { N = 200000 };
  double s = 0, s2 = 0, u = 0;
  for (int i = 0; i < N; i++) {
    double x = wf_rng_normal(42, 1, (uint64_t)i);
    s += x, s2 += x * x;
    u += wf_rng_uniform(42, 2, (uint64_t)i);
  }
  double mean = s / N, var = s2 / N - mean * mean;
  assert_true(fabs(mean) < 0.011);
  assert_true(fabs(var - 1.0) < 0.016);
  /* uniform mean 1/2, sd of the mean sqrt(1/12/N) = 0.00065: 5 sigma 0.0033 */
  assert_true(fabs(u / N - 0.5) < 0.0033);
}

int main(void)
{
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_known_answer),
                                     cmocka_unit_test(test_slices_match),
                                     cmocka_unit_test(test_moments)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
