/*
 * att16_bound.h - how far attention computed in bf16 (attention_lse.h: the CPU twin,
 * the flash kernels, cuDNN) may lie from fp32 attention, element by element: the
 * mixed-precision tolerance of every attention test that compares the two.
 *
 * Derivation. bf16 keeps 8 significant bits, so rounding a value x to bf16 moves it by
 * at most u |x| with the unit roundoff u = 2^-8. The inputs q, k, v, dout are bf16
 * already (the tests draw them so), their products are exact in fp32 and summed in
 * fp32 (relative error ~ terms x 2^-24, a thousand times below u for these sizes), so
 * to first order in u only the roundings the bf16 paths add count:
 *  - forward: o_i = sum_j p_ij v_j with each p_ij rounded (relative u) before the
 *    product, then o rounded on output:
 *        |do_id| <= u (sum_j p_ij |v_jd| + |o_id|);
 *  - backward: dv_j = sum_i p_ij dout_i with p rounded: |ddv_jd| <= u (sum_i p_ij
 *    |dout_id| + |dv_jd|). D_i = dout_i . o_i is taken from the rounded forward output,
 *    whose error (above) is at most 2u sum_j p_ij |v_jd| per element, so
 *    |dD_i| <= 2u A_i with A_i = sum_d |dout_id| sum_j p_ij |v_jd|; ds_ij = p_ij
 *    (dp_ij - D_i) is rounded before both products: |dds_ij| <= 2u p_ij A_i + u |ds_ij|;
 *    dq_i = scale sum_j ds_ij k_j and dk_j = scale sum_i ds_ij q_i inherit
 *        |ddq_id| <= u (scale sum_j (2 p_ij A_i + |ds_ij|) |k_jd| + |dq_id|),
 *        |ddk_jd| <= u (scale sum_i (2 p_ij A_i + |ds_ij|) |q_id| + |dk_jd|).
 * The bound assumes every rounding error points the same way, so the measured errors
 * sit well inside it; a wrong mask, index or scale moves an element by a whole term
 * (order p v, not u p v) and leaves it. ATT16_SLACK covers the fp32 sums on both sides
 * and the neglected O(u^2) terms: 1e-5 (1 + |reference|).
 *
 * Packed documents (attention.h's starts): row i's keys are [start_i, i]; every sum
 * over keys j above runs over them, and the bound is the same argument's.
 *
 * Multi-head layout: qkv (B,T,3C), out (B,T,C). All arithmetic here is double.
 */
#ifndef WF_TESTS_ATT16_BOUND_H
#define WF_TESTS_ATT16_BOUND_H

#include <math.h>
#include <stdlib.h>

#define ATT16_U     0.00390625 /* 2^-8 */
#define ATT16_SLACK 1e-5

typedef struct att16_bound {
  double *out;  /* (B,T,C) */
  double *dqkv; /* (B,T,3C) */
} att16_bound;

/* The first key of row i: its document's start (st: the sequence's starts), or 0. */
static inline int att16_lo(const int *st, int i) { return st ? st[i] : 0; }

/* Scores row i of one head: p[j] for lo <= j <= i (softmax of scale q_i . k_j), 0 below. */
static inline void att16_probs(double *p, const float *q, const float *k, int i, int lo, int hs,
                               int ld, double scale)
{
  double mx = -INFINITY, sum = 0.0;
  for (int j = 0; j < lo; j++)
    p[j] = 0.0;
  for (int j = lo; j <= i; j++) {
    double s = 0.0;
    for (int d = 0; d < hs; d++)
      s += (double)q[(size_t)i * ld + d] * k[(size_t)j * ld + d];
    p[j] = s * scale;
    mx = fmax(mx, p[j]);
  }
  for (int j = lo; j <= i; j++)
    sum += (p[j] = exp(p[j] - mx));
  for (int j = lo; j <= i; j++)
    p[j] /= sum;
}

/* The forward part of one head: o (T, hs; row stride C), its bound, and A (T). */
static inline void att16_head_forward(double *o, double *bo, double *A, double *P, const float *qkv,
                                      const float *dout, const int *st, int T, int C, int hs)
{
  const int ld = 3 * C;
  for (int i = 0; i < T; i++) {
    double *p = P + (size_t)i * T;
    att16_probs(p, qkv, qkv + C, i, att16_lo(st, i), hs, ld, 1.0 / sqrt((double)hs));
    A[i] = 0.0;
    for (int d = 0; d < hs; d++) {
      double acc = 0.0, mag = 0.0;
      for (int j = 0; j <= i; j++) {
        double v = qkv[(size_t)j * ld + 2 * C + d];
        acc += p[j] * v;
        mag += p[j] * fabs(v);
      }
      o[(size_t)i * C + d] = acc;
      bo[(size_t)i * C + d] = ATT16_U * (mag + fabs(acc));
      A[i] += fabs((double)dout[(size_t)i * C + d]) * mag;
    }
  }
}

/* The backward part of one head: adds |terms| into the dq, dk, dv bounds (row stride 3C,
 * q at 0, k at C, v at 2C) and the exact gradients into g. */
static inline void att16_head_backward(double *g, double *bg, const double *o, const double *A,
                                       const double *P, const float *qkv, const float *dout,
                                       const int *st, int T, int C, int hs)
{
  const int ld = 3 * C;
  const double scale = 1.0 / sqrt((double)hs);
  for (int i = 0; i < T; i++) {
    const double *p = P + (size_t)i * T;
    double D = 0.0;
    for (int d = 0; d < hs; d++)
      D += (double)dout[(size_t)i * C + d] * o[(size_t)i * C + d];
    for (int j = att16_lo(st, i); j <= i; j++) {
      double dp = 0.0;
      for (int d = 0; d < hs; d++)
        dp += (double)dout[(size_t)i * C + d] * qkv[(size_t)j * ld + 2 * C + d];
      double ds = p[j] * (dp - D), w = 2.0 * p[j] * A[i] + fabs(ds);
      for (int d = 0; d < hs; d++) {
        double q = qkv[(size_t)i * ld + d], k = qkv[(size_t)j * ld + C + d];
        double dy = dout[(size_t)i * C + d];
        g[(size_t)i * ld + d] += scale * ds * k;
        g[(size_t)j * ld + C + d] += scale * ds * q;
        g[(size_t)j * ld + 2 * C + d] += p[j] * dy;
        bg[(size_t)i * ld + d] += ATT16_U * scale * w * fabs(k);
        bg[(size_t)j * ld + C + d] += ATT16_U * scale * w * fabs(q);
        bg[(size_t)j * ld + 2 * C + d] += ATT16_U * p[j] * fabs(dy);
      }
    }
  }
}

/* The bounds of out and dqkv for qkv, dout (bf16 values held in floats) and document
 * starts (B,T) or NULL; free with att16_bound_free. NULL members on allocation failure. */
static inline att16_bound att16_bound_make(const float *qkv, const float *dout, const int *starts,
                                           int B, int T, int C, int NH)
{
  const int hs = C / NH;
  const size_t n_out = (size_t)B * T * C, n_qkv = 3 * n_out;
  att16_bound bd = {calloc(n_out, sizeof(double)), calloc(n_qkv, sizeof(double))};
  double *o = calloc(n_out, sizeof(double)), *g = calloc(n_qkv, sizeof(double));
  double *A = calloc((size_t)T, sizeof(double)), *P = calloc((size_t)T * T, sizeof(double));
  if (bd.out && bd.dqkv && o && g && A && P) {
    for (int b = 0; b < B; b++)
      for (int h = 0; h < NH; h++) {
        size_t xo = (size_t)b * T * 3 * C + (size_t)h * hs, yo = (size_t)b * T * C + (size_t)h * hs;
        const int *st = starts ? starts + (size_t)b * T : NULL;
        att16_head_forward(o + yo, bd.out + yo, A, P, qkv + xo, dout + yo, st, T, C, hs);
        att16_head_backward(g + xo, bd.dqkv + xo, o + yo, A, P, qkv + xo, dout + yo, st, T, C, hs);
      }
    for (size_t i = 0; i < n_qkv; i++) /* the output rounding of each gradient */
      bd.dqkv[i] += ATT16_U * fabs(g[i]);
  } else {
    free(bd.out), free(bd.dqkv);
    bd.out = bd.dqkv = NULL;
  }
  free(o), free(g), free(A), free(P);
  return bd;
}

static inline void att16_bound_free(att16_bound *bd)
{
  free(bd->out);
  free(bd->dqkv);
  bd->out = bd->dqkv = NULL;
}

/* Whether got is within bound (plus the slack) of ref. */
static inline int att16_within(float got, float ref, double bound)
{
  return fabs((double)got - ref) <= bound + ATT16_SLACK * (1.0 + fabs((double)ref));
}

#endif /* WF_TESTS_ATT16_BOUND_H */
