/*
 * synthetic.c - the synthetic data source (data.path ""): a fixed first-order Markov
 * chain over the first K = min(V, 64) symbols, whose entropy rate (the loss floor) is
 * computed exactly, so a run on it shows how close training gets to the best possible
 * loss.
 *
 * The chain itself is fixed (its own constant seed, CHAIN_SEED), so its entropy floor is
 * the same for every run with the same vocabulary; train.seed only changes the samples.
 * Samples are Philox values keyed by (train.seed, the data stream data.c chooses,
 * row << 32 | t), so a row never depends on which rank or micro-batch asks for it.
 */
#include <math.h>

#include "io_int.h"

#define CHAIN_SEED 0x5eedc4a1ull /* fixes the chain; not train.seed */

static double unit(uint64_t r) { return (double)(r >> 11) * (1.0 / 9007199254740992.0); }

static int sample_cdf(const double *cdf, int n, double u)
{
  for (int i = 0; i < n - 1; i++)
    if (u < cdf[i])
      return i;
  return n - 1;
}

/* Row i: always i -> i+1 (so the chain is irreducible), plus 3-7 distinct random
 * successors; weights are Exp(1) draws, i.e. the row is a Dirichlet(1) sample. */
static void chain_row_build(wf__chain *c, int i)
{
  uint64_t stream = 0xC4A1ull << 48 | (uint64_t)i;
  uint64_t ctr = 0;
  int n = WF__CHAIN_MIN_SUCC + (int)(wf_rng_u64(CHAIN_SEED, stream, ctr++) %
                                     (WF__CHAIN_MAX_SUCC - WF__CHAIN_MIN_SUCC + 1));
  n = WF_MIN(n, c->K);
  c->succ[i][0] = (i + 1) % c->K;
  for (int k = 1; k < n;) {
    int s = (int)(wf_rng_u64(CHAIN_SEED, stream, ctr++) % (uint64_t)c->K);
    int dup = 0;
    for (int j = 0; j < k; j++)
      dup |= c->succ[i][j] == s;
    if (!dup)
      c->succ[i][k++] = s;
  }
  double w[WF__CHAIN_MAX_SUCC], sum = 0;
  for (int k = 0; k < n; k++) {
    w[k] = -log(1.0 - unit(wf_rng_u64(CHAIN_SEED, stream, ctr++)));
    sum += w[k];
  }
  double acc = 0, h = 0;
  for (int k = 0; k < n; k++) {
    double p = w[k] / sum;
    acc += p;
    c->cdf[i][k] = acc;
    h -= p > 0 ? p * log(p) : 0;
  }
  c->cdf[i][n - 1] = 1.0;
  c->n[i] = n;
  c->pi[i] = h; /* row entropy, parked here until chain_stationary() */
}

static double row_prob(const wf__chain *c, int i, int k)
{
  return k == 0 ? c->cdf[i][0] : c->cdf[i][k] - c->cdf[i][k - 1];
}

/* Power iteration on the lazy chain (P + I) / 2: same stationary distribution, but
 * aperiodic, so it converges; the i -> i+1 cycle makes the distribution unique. */
static void chain_stationary(wf__chain *c, const double *row_h)
{
  double p[WF__CHAIN_MAX_K], q[WF__CHAIN_MAX_K];
  for (int i = 0; i < c->K; i++)
    p[i] = 1.0 / c->K;
  for (int it = 0; it < 200000; it++) {
    for (int i = 0; i < c->K; i++)
      q[i] = 0.5 * p[i];
    for (int i = 0; i < c->K; i++)
      for (int k = 0; k < c->n[i]; k++)
        q[c->succ[i][k]] += 0.5 * p[i] * row_prob(c, i, k);
    double diff = 0;
    for (int i = 0; i < c->K; i++) {
      diff += fabs(q[i] - p[i]);
      p[i] = q[i];
    }
    if (diff < 1e-15)
      break;
  }
  double acc = 0, H = 0;
  for (int i = 0; i < c->K; i++) {
    c->pi[i] = p[i];
    acc += p[i];
    c->pi_cdf[i] = acc;
    H += p[i] * row_h[i];
  }
  c->pi_cdf[c->K - 1] = 1.0;
  c->H = H;
}

void wf__chain_build(wf__chain *c, int vocab)
{
  double row_h[WF__CHAIN_MAX_K];
  c->K = WF_MIN(vocab, WF__CHAIN_MAX_K);
  for (int i = 0; i < c->K; i++) {
    chain_row_build(c, i);
    row_h[i] = c->pi[i];
  }
  chain_stationary(c, row_h);
}

/* A row starts in a state drawn from pi, so every target is a stationary transition
 * and the best possible mean loss is exactly H. */
void wf__chain_window(int *win, const wf__chain *c, uint64_t seed, int T, uint64_t stream,
                      int64_t row)
{
  uint64_t base = (uint64_t)row << 32;
  int x = sample_cdf(c->pi_cdf, c->K, unit(wf_rng_u64(seed, stream, base)));
  win[0] = x;
  for (int t = 1; t <= T; t++) {
    int k = sample_cdf(c->cdf[x], c->n[x], unit(wf_rng_u64(seed, stream, base + t)));
    x = c->succ[x][k];
    win[t] = x;
  }
}
