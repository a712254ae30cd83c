/*
 * wf_kernels.h - forward and backward of every op of the GPT model, on the CPU.
 *
 * Conventions (llm.c's):
 *  - outputs first, then inputs, then sizes;
 *  - backward functions ADD into gradient buffers (zeroing is the caller's job), so
 *    gradient accumulation over micro-batches and tied weights come for free;
 *  - shapes in comments use  B batch, T time, C channels, OC output channels,
 *    NH heads (local to this rank under tensor parallelism), hs = C / NH,
 *    V vocabulary columns present in `logits`, ld the row stride (>= V), N rows;
 *  - kernels never communicate: pieces that need a reduction across ranks are split
 *    so the caller can reduce between them (see the cross-entropy pair).
 *
 * Every function has a CUDA twin in the GPU module (kernels/cuda/) with the same
 * arguments plus a stream; tests compare the two.
 *
 * CPU kernels use the number of threads set by wf_kernels_set_threads(), which main()
 * derives from the rank's CPU binding (OpenBLAS and OpenMP share that budget).
 */
#ifndef WF_KERNELS_H
#define WF_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Thread budget for OpenBLAS and the kernels' own parallel loops. */
void wf_kernels_set_threads(int n);
int wf_kernels_threads(void);

/* out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
 * out (B,T,C), inp (B,T), wte (V,C), wpe (maxT,C) */
void wf_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe,
                        int B, int T, int C);
void wf_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp,
                         int B, int T, int C);

/* out (N,C), mean (N), rstd (N), inp (N,C), weight (C), bias (C); eps 1e-5 */
void wf_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C);
void wf_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int N, int C);

/* out = inp . weight^T + bias
 * out (N,OC), inp (N,C), weight (OC,C), bias (OC) or NULL */
void wf_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                       int N, int C, int OC);
/* dinp (N,C) may be NULL (first layer); dbias may be NULL. */
void wf_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int C, int OC);

/* Causal multi-head self-attention.
 * out (B,T,C), att (B,NH,T,T) softmax probabilities kept for backward,
 * qkv (B,T,3C): q = qkv[..., 0:C], k = [C:2C], v = [2C:3C], head h owns columns
 * [h*hs, (h+1)*hs) of each. Scale 1/sqrt(hs). */
void wf_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                          int NH);
/* dqkv (B,T,3C) accumulated; scratch (B,NH,T,T) is overwritten. */
void wf_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int NH);

/* GELU, tanh approximation. out (N), inp (N). */
void wf_gelu_forward(float *out, const float *inp, size_t N);
void wf_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N);

/* out = a + b; backward adds dout into da and db. */
void wf_residual_forward(float *out, const float *a, const float *b, size_t N);
void wf_residual_backward(float *da, float *db, const float *dout, size_t N);

/* Softmax + cross-entropy, split so vocabulary-parallel ranks can reduce between
 * the passes. logits (N, ld) hold V real columns of the vocabulary starting at
 * global column v_offset; columns >= V (padding) are ignored.
 *
 * Pass 1, per row: row_max = max over the V columns; row_sumexp = sum exp(l - row_max);
 * target_logit = logits[target - v_offset] if the target is in this slice, else 0.
 * (Across ranks: M = max row_max; S = sum row_sumexp * exp(row_max - M);
 *  target_logit summed; loss = log S + M - target_logit.) */
void wf_xent_stats(float *row_max, float *row_sumexp, float *target_logit,
                   const float *logits, const int *targets, int N, int V, int ld,
                   int v_offset);
/* loss[i] = log(sumexp[i]) + max[i] - target_logit[i] */
void wf_xent_loss(float *losses, const float *row_max, const float *row_sumexp,
                  const float *target_logit, int N);
/* Pass 2: dlogits = dloss * (softmax - onehot(target)) using the global row_max and
 * row_sumexp; padding columns [V, ld) are set to 0. dlogits may alias logits
 * (it is written, not accumulated, because logits are consumed here). */
void wf_xent_backward(float *dlogits, const float *logits, const float *row_max,
                      const float *row_sumexp, const int *targets, float dloss, int N,
                      int V, int ld, int v_offset);

/* AdamW on n contiguous parameters, bias-corrected, step t >= 1.
 * g is multiplied by grad_scale first (gradient clipping / loss scaling).
 * p -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * p) */
void wf_adamw_update(float *params, float *m, float *v, const float *grads, size_t n,
                     float lr, float beta1, float beta2, float eps, float weight_decay,
                     int t, float grad_scale);

/* Sum of squares in double (for the global gradient norm; reduce across ranks
 * before taking the square root). */
double wf_sumsq(const float *x, size_t n);
/* x *= s */
void wf_scale(float *x, float s, size_t n);

#endif /* WF_KERNELS_H */
