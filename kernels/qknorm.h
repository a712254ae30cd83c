/*
 * qknorm.h - RMSNorm of the queries and keys inside the packed [q | k | v] rows of an
 * attention projection (OLMoE's q_norm and k_norm over the whole projection, Qwen3's per
 * head), in parts that let tensor parallelism sum a group's statistics across ranks.
 * Part of the kernels module; include wf_kernels.h, which states the conventions. The code
 * is kernels/cpu/qknorm.c and kernels/cuda/qknorm.cu.
 *
 * Legend: N rows of ld elements, the first nq of them this rank's queries, the next nk its
 * keys (the values follow, untouched). The queries are normalised in groups of gq
 * consecutive elements, the keys in groups of gk, G = nq / gq + nk / gk groups a row, and
 * a group's mean square is over fq (queries) or fk (keys) elements: the group's full
 * size, larger than gq when a group spans tensor-parallel ranks (OLMoE's norm over the
 * whole projection: gq = nq = NH hs / tp, fq = NH hs), equal to it otherwise (Qwen3's
 * heads: gq = fq = hs). Weights: element i of a query group is scaled by wq[i] (gq of
 * them), of a key group by wk[i].
 *
 * Forward: sumsq (the rank's part of each group's sum of squares), [the caller sums them
 * over the ranks a group spans], forward. Backward: dot, [summed likewise], backward.
 * y = w x r with r = 1 / sqrt(sum x^2 / f + eps), as transformers' RMSNorm computes it in
 * fp32; x_hat = x r.
 */
#ifndef WF_KERNELS_QKNORM_H
#define WF_KERNELS_QKNORM_H

#include <stddef.h>

#include "wf_kreg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ss (N, G) = the sum of squares of each group's elements on this rank, WRITTEN; qkv in
 * format fmt. */
void wf_qknorm_sumsq(float *ss, const void *qkv, int N, int ld, int nq, int gq, int nk, int gk,
                     int fmt);

/* raw (N, nq + nk) = the queries and keys as they are (format fmt), then they are replaced
 * in qkv by w x r (rounded to fmt); rstd (N, G) = r from ss (the whole groups' sums). */
void wf_qknorm_forward(void *qkv, void *raw, float *rstd, const float *ss, const float *wq,
                       const float *wk, int N, int ld, int nq, int gq, int fq, int nk, int gk,
                       int fk, float eps, int fmt);

/* dot (N, G) = sum over a group's elements on this rank of w dy x_hat, WRITTEN; dy the
 * q and k parts of dqkv (format fmt). */
void wf_qknorm_dot(float *dot, const void *dqkv, const void *raw, const float *rstd,
                   const float *wq, const float *wk, int N, int ld, int nq, int gq, int nk, int gk,
                   int fmt);

/* The q and k parts of dqkv become the inputs' gradient r (w dy - x_hat dot / f), in place
 * (rounded to fmt); dwq (gq) and dwk (gk) += the sum over rows and groups of dy x_hat. dot:
 * the whole groups' sums. */
void wf_qknorm_backward(void *dqkv, float *dwq, float *dwk, const void *raw, const float *rstd,
                        const float *dot, const float *wq, const float *wk, int N, int ld, int nq,
                        int gq, int fq, int nk, int gk, int fk, int fmt);

/* ---- the op (wf_kreg.h): the format of qkv is an argument (statistics in fp32), so one
 * table serves every element type. Entries: the functions above plus the stream. */
#define WF_OP_VERSION_qknorm 1
typedef struct wf_qknorm_op {
  void (*sumsq)(float *ss, const void *qkv, int N, int ld, int nq, int gq, int nk, int gk, int fmt,
                wf_stream *s);
  void (*forward)(void *qkv, void *raw, float *rstd, const float *ss, const float *wq,
                  const float *wk, int N, int ld, int nq, int gq, int fq, int nk, int gk, int fk,
                  float eps, int fmt, wf_stream *s);
  void (*dot)(float *dot, const void *dqkv, const void *raw, const float *rstd, const float *wq,
              const float *wk, int N, int ld, int nq, int gq, int nk, int gk, int fmt,
              wf_stream *s);
  void (*backward)(void *dqkv, float *dwq, float *dwk, const void *raw, const float *rstd,
                   const float *dot, const float *wq, const float *wk, int N, int ld, int nq,
                   int gq, int fq, int nk, int gk, int fk, int fmt, wf_stream *s);
} wf_qknorm_op;

#ifdef __cplusplus
}
#endif

#endif /* WF_KERNELS_QKNORM_H */
