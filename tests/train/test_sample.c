/*
 * test_sample.c - one draw of a sample (wf_sample_token): greedy and ties, the top-k
 * softmax's frequencies against the probabilities worked out here, temperature, the whole
 * vocabulary with k = 0, and determinism in (seed, stream, index).
 *
 * Frequencies are checked to 5 binomial standard deviations: a correct sampler fails
 * one such check with probability below 1e-6, and the draws are a fixed Philox sequence,
 * so a pass is reproducible; a sampler off by a few percent in any probability fails
 * (20000 draws: sigma of a frequency <= 0.35%).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "wf_train.h"

enum { N = 20000 };

static void check_freqs(const float *logits, int V, int k, double temp, uint64_t seed)
{
  int count[16] = {0};
  double p[16] = {0}, total = 0;
  /* the top k here are the first k: the logits below are in decreasing order */
  for (int i = 0; i < k; i++)
    total += (p[i] = exp((double)logits[i] / temp));
  for (int i = 0; i < N; i++) {
    int id = wf_sample_token(logits, V, k == V ? 0 : k, temp, seed, 3, (uint64_t)i);
    assert_true(id >= 0 && id < V);
    count[id]++;
  }
  for (int i = 0; i < V; i++) {
    if (i >= k) {
      assert_int_equal(count[i], 0); /* outside the top k: never */
      continue;
    }
    double q = p[i] / total, sd = sqrt(N * q * (1 - q));
    if (fabs(count[i] - N * q) > 5 * sd)
      fail_msg("id %d drawn %d times in %d, expected %.1f (p=%.4f, 5 sd = %.1f)", i, count[i], N,
               N * q, q, 5 * sd);
  }
}

static void test_greedy_and_ties(void **state)
{
  (void)state;
  float l[8] = {0.5f, -1, 3, 2.5f, 3, 0, 1, -2};
  for (int i = 0; i < 50; i++) /* top 1: the largest, ties to the lower id (2, not 4) */
    assert_int_equal(wf_sample_token(l, 8, 1, 1.0, 7, 0, (uint64_t)i), 2);
  /* a temperature near zero is greedy too, whatever k */
  for (int i = 0; i < 50; i++)
    assert_int_equal(wf_sample_token(l, 8, 0, 1e-4, 7, 0, (uint64_t)i) % 2, 0); /* 2 or 4 */
}

static void test_top_k_frequencies(void **state)
{
  (void)state;
  float l[10] = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -2.5f};
  check_freqs(l, 10, 4, 1.0, 11);  /* top 4, renormalised */
  check_freqs(l, 10, 4, 0.5, 12);  /* sharper */
  check_freqs(l, 10, 3, 3.0, 13);  /* flatter */
  check_freqs(l, 10, 10, 1.0, 14); /* k = 0: the whole vocabulary */
}

/* The order of the logits does not matter, only their values: the same distribution
 * over ids when the row is shuffled. */
static void test_unsorted(void **state)
{
  (void)state;
  float l[6] = {-1, 2, 0, 1, -3, 1.5f};
  int count[6] = {0};
  for (int i = 0; i < N; i++)
    count[wf_sample_token(l, 6, 3, 1.0, 5, 0, (uint64_t)i)]++;
  assert_int_equal(count[0] + count[2] + count[4], 0); /* the top 3 are ids 1, 5, 3 */
  double e1 = exp(2), e5 = exp(1.5), e3 = exp(1), t = e1 + e5 + e3;
  double q[3] = {e1 / t, e5 / t, e3 / t};
  int c[3] = {count[1], count[5], count[3]};
  for (int i = 0; i < 3; i++)
    assert_true(fabs(c[i] - N * q[i]) <= 5 * sqrt(N * q[i] * (1 - q[i])));
}

static void test_deterministic(void **state)
{
  (void)state;
  float l[16];
  for (int i = 0; i < 16; i++)
    l[i] = 0; /* flat: every draw depends on the random number alone */
  int same = 0, differ = 0;
  for (int i = 0; i < 64; i++) {
    int a = wf_sample_token(l, 16, 0, 1.0, 42, 9, (uint64_t)i);
    assert_int_equal(a, wf_sample_token(l, 16, 0, 1.0, 42, 9, (uint64_t)i));
    same += a == wf_sample_token(l, 16, 0, 1.0, 43, 9, (uint64_t)i);
    differ += a != wf_sample_token(l, 16, 0, 1.0, 42, 10, (uint64_t)i);
  }
  /* another seed or stream is another sequence: about 1/16 of the draws agree */
  assert_true(same < 20);
  assert_true(differ > 44);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_greedy_and_ties),
      cmocka_unit_test(test_top_k_frequencies),
      cmocka_unit_test(test_unsorted),
      cmocka_unit_test(test_deterministic),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
