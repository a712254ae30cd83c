/*
 * test_checksum.c - the 64-bit checksum of checksum.h: its definition by an independent
 * serial loop, the independence from the thread count, negation, and the changes it
 * must see (one bit of one element, two elements swapped, a trailing element).
 */
#include <string.h>

#include "check.h"
#include "wf_kernels.h"

#define N 100003 /* odd, above the kernels' one-thread threshold */

/* The definition, serially: sum over i of mix(mix(i) ^ bits(x[i])) mod 2^64. */
static uint64_t reference(const float *x, size_t n)
{
  uint64_t s = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t b;
    memcpy(&b, &x[i], sizeof b);
    s += wf_checksum_mix(wf_checksum_mix(i) ^ b);
  }
  return s;
}

static float *data(void)
{
  uint64_t seed = 0x9a7d3;
  float *x = malloc(N * sizeof *x);
  assert_non_null(x);
  for (size_t i = 0; i < N; i++)
    x[i] = (float)(urand(&seed) * 2 - 1);
  return x;
}

static void test_definition_and_threads(void **state)
{
  (void)state;
  float *x = data();
  uint64_t want = reference(x, N), got = 0, neg = 0;
  for (int t = 1; t <= 4; t++) {
    wf_kernels_set_threads(t);
    wf_checksum(&got, x, N, 0);
    assert_int_equal(got, want);
    wf_checksum(&neg, x, N, 1);
    assert_int_equal(neg + got, 0); /* one negated copy cancels the other, mod 2^64 */
  }
  wf_checksum(&got, x, 0, 0);
  assert_int_equal(got, 0); /* the empty sum */
  /* splitmix64's finalizer of 0 + its increment, 0x9e3779b97f4a7c15: published value */
  assert_int_equal(wf_checksum_mix(0), 0xe220a8397b1dcdafull);
  free(x);
}

static void test_changes_seen(void **state)
{
  (void)state;
  float *x = data();
  uint64_t h0, h;
  wf_checksum(&h0, x, N, 0);
  uint32_t b;
  memcpy(&b, &x[N / 2], sizeof b);
  b ^= 1u; /* the last mantissa bit of one element */
  memcpy(&x[N / 2], &b, sizeof b);
  wf_checksum(&h, x, N, 0);
  assert_true(h != h0);
  memcpy(&b, &x[N / 2], sizeof b);
  b ^= 1u; /* back */
  memcpy(&x[N / 2], &b, sizeof b);
  float t = x[3];
  x[3] = x[4], x[4] = t; /* a swap keeps the multiset of values */
  wf_checksum(&h, x, N, 0);
  assert_true(h != h0);
  x[4] = x[3], x[3] = t;
  wf_checksum(&h, x, N - 1, 0); /* one element fewer */
  assert_true(h != h0);
  free(x);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_definition_and_threads),
      cmocka_unit_test(test_changes_seen),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
