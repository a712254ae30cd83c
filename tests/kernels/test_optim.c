/*
 * test_optim.c - AdamW against a hand-computed step and a double-precision formula,
 * and the gradient-norm helpers (sum of squares in double, scale).
 */
#include "check.h"
#include "wf_kernels.h"

static void test_adamw_by_hand(void **state)
{
  /* p = 1, g = 0.5 scaled by 2 -> 1, m = v = 0, t = 1, lr 0.1, betas (0.9, 0.999),
   * eps 1e-8, weight decay 0.01:
   *   m = 0.1 * 1 = 0.1, v = 0.001 * 1 = 0.001; mhat = 0.1 / 0.1 = 1, vhat = 1;
   *   p = 1 - 0.1 * (1 / (1 + 1e-8) + 0.01 * 1) = 0.899 (+1e-9, below float ulp).
   * Tolerances: the betas are floats, so 1 - 0.9f = 0.100000024 and
   * 1 - 0.999f = 0.00099998713: m and v carry 2.4e-7 and 1.3e-5 relative error,
   * which bias correction (computed from the same float betas) cancels in p. */
  float p = 1.0f, m = 0.0f, v = 0.0f, g = 0.5f;
  wf_adamw_update(&p, &m, &v, &g, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 2.0f);
  assert_float_equal(m, 0.1f, 5e-8);
  assert_float_equal(v, 0.001f, 2e-8);
  assert_float_equal(p, 0.899f, 1e-7);
  /* t = 2, same gradient: m = 0.09 + 0.1 = 0.19, v = 0.000999 + 0.001 = 0.001999;
   * mhat = 0.19 / 0.19 = 1, vhat = 0.001999 / 0.001999 = 1;
   * p = 0.899 - 0.1 * (1 / (1 + 1e-8) + 0.01 * 0.899) = 0.7981010. */
  wf_adamw_update(&p, &m, &v, &g, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 2, 2.0f);
  assert_float_equal(m, 0.19f, 2e-7);
  assert_float_equal(v, 0.001999f, 4e-8);
  assert_float_equal(p, 0.7981010f, 2e-7);
}

/* Many parameters (threaded, vector tails) against the formula in double, step 5. */
static void test_adamw_many(void **state)
{
  enum { N = 100003 };
  uint64_t s = 31;
  float *p = zeros(N), *m = zeros(N), *v = zeros(N), *g = zeros(N);
  fill(p, N, -1, 1, &s);
  fill(m, N, -0.1, 0.1, &s);
  fill(v, N, 0, 0.01, &s);
  fill(g, N, -1, 1, &s);
  double *rp = to_double(p, N), *rm = to_double(m, N), *rv = to_double(v, N);
  const double lr = 3e-4, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;
  const int t = 5;
  for (int i = 0; i < N; i++) {
    double gi = g[i] * gs;
    rm[i] = b1 * rm[i] + (1 - b1) * gi;
    rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
    double mh = rm[i] / (1 - pow(b1, t)), vh = rv[i] / (1 - pow(b2, t));
    rp[i] -= lr * (mh / (sqrt(vh) + eps) + wd * rp[i]);
  }
  wf_adamw_update(p, m, v, g, N, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd, t,
                  (float)gs);
  /* float32 rounding of a handful of operations: ~1e-6 relative; the step itself is
   * ~3e-4, so an error in the update formula shows far above these bounds. */
  check_close("adamw m", m, rm, N, 1e-5);
  check_close("adamw v", v, rv, N, 1e-5);
  for (int i = 0; i < N; i++)
    assert_true(fabs(p[i] - rp[i]) <= 2e-7 * (1 + fabs(rp[i])));
  free(p), free(m), free(v), free(g), free(rp), free(rm), free(rv);
}

static void test_sumsq_scale(void **state)
{
  enum { N = 100003 };
  uint64_t s = 32;
  float *x = zeros(N);
  fill(x, N, -2, 2, &s);
  double ref = 0;
  for (int i = 0; i < N; i++)
    ref += (double)x[i] * x[i];
  /* both in double, different order: ~N eps64 relative */
  assert_true(fabs(wf_sumsq(x, N) - ref) <= 1e-12 * ref);
  assert_true(wf_sumsq(x, 0) == 0.0);
  float x3 = x[3];
  wf_scale(x, 0.25f, N);
  assert_true(x[3] == x3 * 0.25f); /* power of two: exact */
  assert_true(fabs(wf_sumsq(x, N) - ref / 16) <= 1e-12 * ref);
  free(x);
}

/* Many back-to-back parallel calls while the budget changes (the pool grows, and
 * some workers sit out): every call must see every share done exactly once. */
static void test_pool_stress(void **state)
{
  enum { N = 40000 };
  float *x = zeros(N);
  for (int i = 0; i < N; i++)
    x[i] = 1.0f;
  for (int r = 0; r < 1000; r++) {
    wf_kernels_set_threads(1 + r % 4);
    assert_true(wf_sumsq(x, N) == (r % 2 ? 4.0 : 1.0) * N); /* 1s or 2s: exact */
    wf_scale(x, r % 2 ? 0.5f : 2.0f, N);                    /* x2 then /2: exact */
  }
  for (int i = 0; i < N; i++)
    assert_true(x[i] == 1.0f);
  wf_kernels_set_threads(2);
  free(x);
}

int main(void)
{
  wf_kernels_set_threads(2);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adamw_by_hand),
      cmocka_unit_test(test_adamw_many),
      cmocka_unit_test(test_sumsq_scale),
      cmocka_unit_test(test_pool_stress),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
