/*
 * test_xent.c - the two-pass softmax cross-entropy: loss against a double
 * reference, dlogits against finite differences, padding columns zeroed, stability
 * at large logits, and a vocabulary split over two "ranks" (combined with the
 * formula of wf_kernels.h) against the unsplit computation; the packing and combining
 * kernels of that split (a third, empty slice included), the loss-mean accumulation,
 * and the token check.
 */
#include <string.h>

#include "check.h"
#include "wf_kernels.h"

enum { N = 5, V = 7, LD = 9 };

struct xe {
  double *logits; /* (N, LD) */
  const int *targets;
  double dloss;
};

/* L = dloss * sum_i loss_i, so that dL/dlogits is what wf_xent_backward returns. */
static double xe_loss(void *p)
{
  struct xe *x = p;
  double total = 0;
  for (int i = 0; i < N; i++) {
    const double *l = x->logits + i * LD;
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < V; j++)
      mx = fmax(mx, l[j]);
    for (int j = 0; j < V; j++)
      s += exp(l[j] - mx);
    total += log(s) + mx - l[x->targets[i]];
  }
  return x->dloss * total;
}

static void full_pass(float *losses, float *dlogits, const float *logits, const int *targets,
                      float dloss)
{
  float mx[N], se[N], tl[N];
  wf_xent_stats(mx, se, tl, logits, targets, N, V, LD, 0);
  wf_xent_loss(losses, mx, se, tl, N);
  wf_xent_backward(dlogits, logits, mx, se, targets, dloss, N, V, LD, 0);
}

static void make_case(float *logits, int *targets, uint64_t seed)
{
  uint64_t s = seed;
  fill(logits, N * LD, -3, 3, &s);
  for (int i = 0; i < N; i++) {
    for (int j = V; j < LD; j++)
      logits[i * LD + j] = NAN; /* padding must never be read */
    targets[i] = (int)(urand(&s) * V);
  }
  targets[0] = 0, targets[1] = V - 1; /* both ends of the vocabulary */
}

static void test_loss_and_grad(void **state)
{
  float logits[N * LD], dl[N * LD], losses[N];
  int targets[N];
  make_case(logits, targets, 21);
  for (int i = 0; i < N * LD; i++)
    dl[i] = NAN;
  const float dloss = 0.37f; /* e.g. 1 / (B T) */
  full_pass(losses, dl, logits, targets, dloss);
  struct xe x = {to_double(logits, N * LD), targets, 1.0};
  for (int i = 0; i < N; i++) { /* one row at a time: the reference of loss_i */
    double r[1];
    float lrow[LD];
    int t = targets[i];
    memcpy(lrow, logits + i * LD, sizeof lrow);
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < V; j++)
      mx = fmax(mx, lrow[j]);
    for (int j = 0; j < V; j++)
      s += exp(lrow[j] - mx);
    r[0] = log(s) + mx - lrow[t];
    check_close("loss", losses + i, r, 1, FWD_RTOL);
  }
  x.dloss = dloss;
  float g[N * LD];
  memcpy(g, dl, sizeof g);
  for (int i = 0; i < N; i++)
    for (int j = V; j < LD; j++) {
      assert_true(dl[i * LD + j] == 0.0f); /* padding zeroed, even from NaN */
      g[i * LD + j] = 0.0f;
    }
  /* x.logits padding is NaN: the reference does not read it, and check_grad samples
   * every element (N*LD <= 64); padding columns give fd 0 against g 0. */
  for (int i = 0; i < N; i++)
    for (int j = V; j < LD; j++)
      x.logits[i * LD + j] = 0.0;
  check_grad("dlogits", xe_loss, &x, x.logits, N * LD, g);
  free(x.logits);
}

static void test_in_place_and_stability(void **state)
{
  float logits[N * LD], shifted[N * LD], dl[N * LD], l1[N], l2[N];
  int targets[N];
  make_case(logits, targets, 22);
  full_pass(l1, dl, logits, targets, 1.0f);
  /* softmax is shift-invariant: +1000 on every logit must not overflow. The shift
   * rounds logits to multiples of 2^-13 near 1000, so losses agree to ~1e-3. */
  for (int i = 0; i < N * LD; i++)
    shifted[i] = logits[i] + 1000.0f;
  full_pass(l2, shifted, shifted, targets, 1.0f); /* dlogits aliasing logits */
  for (int i = 0; i < N; i++)
    assert_true(fabs(l1[i] - l2[i]) < 2e-3);
  for (int i = 0; i < N * LD; i++)
    assert_true(fabs(dl[i] - shifted[i]) < 2e-3);
}

/* Columns [0, 4) on rank 0 (ld 5) and [4, 7) on rank 1 (ld 4). */
static void test_vocab_split(void **state)
{
  enum { V0 = 4, V1 = V - V0, LD0 = 5, LD1 = 4 };
  float logits[N * LD], dl[N * LD], losses[N];
  int targets[N];
  make_case(logits, targets, 23);
  full_pass(losses, dl, logits, targets, 0.5f);
  float a[N * LD0], b[N * LD1], da[N * LD0], db[N * LD1];
  for (int i = 0; i < N; i++) {
    memcpy(a + i * LD0, logits + i * LD, V0 * sizeof(float));
    memcpy(b + i * LD1, logits + i * LD + V0, V1 * sizeof(float));
    a[i * LD0 + V0] = NAN;
  }
  float m0[N], s0[N], t0[N], m1[N], s1[N], t1[N], M[N], S[N], TL[N], sl[N];
  wf_xent_stats(m0, s0, t0, a, targets, N, V0, LD0, 0);
  wf_xent_stats(m1, s1, t1, b, targets, N, V1, LD1, V0);
  for (int i = 0; i < N; i++) { /* what the vocab-parallel all-reduces compute */
    M[i] = fmaxf(m0[i], m1[i]);
    S[i] = s0[i] * expf(m0[i] - M[i]) + s1[i] * expf(m1[i] - M[i]);
    TL[i] = t0[i] + t1[i];
  }
  wf_xent_loss(sl, M, S, TL, N);
  /* The split sums the exponentials in another order and rescales one part by
   * exp(max0 - M): equal up to float rounding of S, a few eps32 relative. */
  for (int i = 0; i < N; i++)
    assert_true(fabs(sl[i] - losses[i]) <= 1e-6 * (1 + fabs(losses[i])));
  wf_xent_backward(da, a, M, S, targets, 0.5f, N, V0, LD0, 0);
  wf_xent_backward(db, b, M, S, targets, 0.5f, N, V1, LD1, V0);
  for (int i = 0; i < N; i++) {
    assert_true(da[i * LD0 + V0] == 0.0f);
    for (int j = 0; j < V; j++) {
      float g = j < V0 ? da[i * LD0 + j] : db[i * LD1 + j - V0];
      assert_true(fabs(g - dl[i * LD + j]) <= 1e-6 * (fabs(dl[i * LD + j]) + 0.5));
    }
  }
  /* Given the same (max, sumexp), each slice's gradient is bit-identical to the
   * matching columns of the unsplit backward: the passes are purely per column. */
  float fm[N], fs[N], ft[N];
  wf_xent_stats(fm, fs, ft, logits, targets, N, V, LD, 0);
  wf_xent_backward(da, a, fm, fs, targets, 0.5f, N, V0, LD0, 0);
  wf_xent_backward(db, b, fm, fs, targets, 0.5f, N, V1, LD1, V0);
  for (int i = 0; i < N; i++)
    for (int j = 0; j < V; j++)
      assert_true((j < V0 ? da[i * LD0 + j] : db[i * LD1 + j - V0]) == dl[i * LD + j]);
  /* an empty slice: max -inf and sum 0, so it changes neither M nor S */
  float em[N], es[N], et[N];
  wf_xent_stats(em, es, et, a, targets, N, 0, LD0, V);
  for (int i = 0; i < N; i++)
    assert_true(isinf(em[i]) && em[i] < 0 && es[i] == 0.0f && et[i] == 0.0f);
  /* the target is in exactly one slice; the other reports 0 */
  for (int i = 0; i < N; i++)
    assert_true((t0[i] == 0.0f) != (t1[i] == 0.0f) || logits[i * LD + targets[i]] == 0.0f);
}

/* The split of test_vocab_split through the kernels the model uses: pack each slice's
 * statistics, gather (here a concatenation), combine. Combining is the formula above
 * term for term, so it is exact against it; an empty third slice changes nothing. */
static void test_pack_combine(void **state)
{
  enum { V0 = 4, V1 = V - V0, LD0 = 5, LD1 = 4, P = 3 };
  float logits[N * LD], a[N * LD0], b[N * LD1];
  int targets[N];
  make_case(logits, targets, 29);
  for (int i = 0; i < N; i++) {
    memcpy(a + i * LD0, logits + i * LD, V0 * sizeof(float));
    memcpy(b + i * LD1, logits + i * LD + V0, V1 * sizeof(float));
  }
  float m[P][N], s[P][N], t[P][N], all[P * 3 * N];
  wf_xent_stats(m[0], s[0], t[0], a, targets, N, V0, LD0, 0);
  wf_xent_stats(m[1], s[1], t[1], b, targets, N, V1, LD1, V0);
  wf_xent_stats(m[2], s[2], t[2], a, targets, N, 0, LD0, V); /* an empty slice */
  for (int r = 0; r < P; r++)
    wf_xent_pack(all + r * 3 * N, m[r], s[r], t[r], N);
  for (int i = 0; i < N; i++) /* the packed layout: (N, 3) per part */
    assert_true(all[3 * N + 3 * i] == m[1][i] && all[3 * N + 3 * i + 1] == s[1][i] &&
                all[3 * N + 3 * i + 2] == t[1][i]);
  float M[N], S[N], TL[N];
  wf_xent_combine(M, S, TL, all, N, P);
  for (int i = 0; i < N; i++) {
    float mx = fmaxf(m[0][i], m[1][i]);
    assert_true(M[i] == mx);
    assert_true(S[i] == s[0][i] * expf(m[0][i] - mx) + s[1][i] * expf(m[1][i] - mx));
    assert_true(TL[i] == t[0][i] + t[1][i]);
  }
}

/* *acc += the float mean of the losses, summed in double: a running sum over
 * micro-batches, each rounded to float first (values chosen so the rounding shows). */
static void test_loss_accumulate(void **state)
{
  float losses[3] = {1.0f, 2.0f, 1.0f + 0x1p-20f};
  double acc = 0.5, mean = (1.0 + 2.0 + (1.0 + 0x1p-20)) / 3;
  wf_loss_accumulate(&acc, losses, 3);
  assert_true(acc == 0.5 + (double)(float)mean);
  assert_true((double)(float)mean != mean); /* the float rounding is part of the result */
  double acc2 = 0;
  wf_sumsq_acc(&acc2, losses, 3);
  wf_sumsq_acc(&acc2, losses, 0);
  assert_true(fabs(acc2 - (1.0 + 4.0 + (1.0 + 0x1p-20) * (1.0 + 0x1p-20))) <= 1e-15);
}

/* The first out-of-range token and its value; -1 when all are in [0, V). */
static void test_tokens_check(void **state)
{
  int tok[8] = {0, 1, 6, 3, 7, -2, 9, 2}, bad[2];
  wf_tokens_check(bad, tok, 8, 7);
  assert_int_equal(bad[0], 4);
  assert_int_equal(bad[1], 7);
  wf_tokens_check(bad, tok, 4, 7);
  assert_int_equal(bad[0], -1);
  assert_int_equal(bad[1], 0);
  wf_tokens_check(bad, tok + 5, 3, 7);
  assert_int_equal(bad[0], 0);
  assert_int_equal(bad[1], -2);
}

int main(void)
{
  wf_kernels_set_threads(2);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loss_and_grad),   cmocka_unit_test(test_in_place_and_stability),
      cmocka_unit_test(test_vocab_split),     cmocka_unit_test(test_pack_combine),
      cmocka_unit_test(test_loss_accumulate), cmocka_unit_test(test_tokens_check),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
