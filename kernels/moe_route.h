/*
 * moe_route.h - a mixture-of-experts router: softmax over the experts' logits, the top-k
 * experts of each token with their routing weights, and the load-balancing and z-loss
 * terms, forward and backward.
 * Part of the kernels module; include wf_kernels.h, which states the conventions. The code
 * is kernels/cpu/moe_route.c and kernels/cuda/moe_route.cu.
 *
 * Legend: N tokens, E experts, K experts per token. A layer's routing, as transformers'
 * OlmoeSparseMoeBlock / Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock compute it:
 * probs = softmax(logits) in fp32, the K largest probabilities of each token (in
 * decreasing order; of equal ones the lower expert first), their weights the
 * probabilities themselves or, with renorm (norm_topk_prob), divided by their sum.
 *
 * The layer's statistics (`stats`, WF_MOE_STATS(E) floats) are what the losses over the
 * whole model need, summed over the layers (and the pipeline's stages) before any
 * backward: cnt[e] (how many of the N K choices went to expert e), psum[e] (the sum over
 * tokens of probs[:, e]), zsum (the sum over tokens of logsumexp(logits)^2) and dropped
 * (pairs a capacity refused, moe_dispatch.h). With R = L N router rows over L layers,
 * transformers' load_balancing_loss_func is
 *     aux = E / R^2 sum_e cnt[e] psum[e]
 * and the router z-loss zsum / R; training minimises CE + a aux + z (zsum / R).
 */
#ifndef WF_KERNELS_MOE_ROUTE_H
#define WF_KERNELS_MOE_ROUTE_H

#include <stdbool.h>
#include <stddef.h>

#include "wf_kreg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Floats of one layer's statistics: cnt (E), psum (E), zsum, dropped. */
#define WF_MOE_STATS(E) (2 * (size_t)(E) + 2)

/* probs (N,E) = softmax(logits (N,E)); lse (N) = logsumexp; idx (N,K) and w (N,K) the
 * top-K experts and their weights; stats (WF_MOE_STATS(E)) WRITTEN with this layer's cnt,
 * psum and zsum (dropped 0: moe_dispatch.h's). K <= E. */
void wf_moe_route_forward(float *probs, float *lse, int *idx, float *w, float *stats,
                          const float *logits, int N, int E, int K, bool renorm);

/* dlogits (N,E), stored in format fmt (the router GEMM's backward reads it), WRITTEN:
 * the softmax's backward of g[n,e] = aux_scale * cnt[e] (every token's share of the
 * load-balancing loss, cnt the whole model's counts) plus, at a chosen expert, the
 * gradient of its weight dw (N,K) (through the renormalisation when renorm), and the
 * z-loss's z_scale * lse[n] * probs[n,e]. */
void wf_moe_route_backward(void *dlogits, const float *dw, const float *probs, const float *lse,
                           const int *idx, const float *w, const float *cnt, float aux_scale,
                           float z_scale, int N, int E, int K, bool renorm, int fmt);

/* acc[0] += E / R^2 sum_e cnt[e] psum[e], acc[1] += zsum / R, acc[2] += dropped, from the
 * whole model's statistics `sums` (WF_MOE_STATS(E)): one micro-batch's load-balancing loss
 * and z-loss (without their coefficients) and the choices a capacity dropped, R router
 * rows. */
void wf_moe_aux_accumulate(double *acc, const float *sums, int E, double R);

/* ---- the op (wf_kreg.h): the router computes in fp32 and dlogits' format is an argument,
 * so one table serves every element type. Entries: the functions above plus the stream. */
#define WF_OP_VERSION_moe_route 1
typedef struct wf_moe_route_op {
  void (*forward)(float *probs, float *lse, int *idx, float *w, float *stats, const float *logits,
                  int N, int E, int K, bool renorm, wf_stream *s);
  void (*backward)(void *dlogits, const float *dw, const float *probs, const float *lse,
                   const int *idx, const float *w, const float *cnt, float aux_scale, float z_scale,
                   int N, int E, int K, bool renorm, int fmt, wf_stream *s);
  void (*aux_accumulate)(double *acc, const float *sums, int E, double R, wf_stream *s);
} wf_moe_route_op;

#ifdef __cplusplus
}
#endif

#endif /* WF_KERNELS_MOE_ROUTE_H */
