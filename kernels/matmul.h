/*
 * matmul.h - linear layer on sgemm.
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/matmul.c; the CUDA twin has the same arguments plus a stream.
 */
#ifndef WF_KERNELS_MATMUL_H
#define WF_KERNELS_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

/* out = inp . weight^T + bias
 * out (N,OC), inp (N,C), weight (OC,C), bias (OC) or NULL */
void wf_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC);
/* dinp (N,C) = dout . weight, WRITTEN (the one backward output here that is not added
 * into: it feeds one consumer, so writing it spares a zeroing pass and a read); dweight
 * (OC,C) += dout^T . inp and dbias (OC) += dout's rows. dinp may be NULL (first layer);
 * dbias may be NULL (and dweight, if frozen). */
void wf_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int C, int OC);

/* The same with the operands stored in 16-bit format fmt (storage.h): inp, weight and
 * (backward) dout load exactly, their products accumulate in fp32, out and dinp are
 * stored rounded (forward16, backward16) or left in fp32 (forward16_f32,
 * backward16_f32); dweight, dbias and bias are fp32 (a 16-bit table's matmul_forward
 * hands forward16 its bias rounded to the format: the op below). This is the reference the fast
 * 16-bit GEMMs (oneDNN on the CPU, cuBLASLt on the GPU) are checked against: the same exact
 * products, summed in another order. */
void wf_matmul_forward16(void *out, const void *inp, const void *weight, const float *bias, int N,
                         int C, int OC, int fmt);
void wf_matmul_forward16_f32(float *out, const void *inp, const void *weight, const float *bias,
                             int N, int C, int OC, int fmt);
void wf_matmul_backward16(void *dinp, float *dweight, float *dbias, const void *dout,
                          const void *inp, const void *weight, int N, int C, int OC, int fmt);
void wf_matmul_backward16_f32(float *dinp, float *dweight, float *dbias, const void *dout,
                              const void *inp, const void *weight, int N, int C, int OC, int fmt);

/* Whether the CPU's bf16 GEMMs may use oneDNN (runtime.cpu_bf16_gemm; default yes).
 * Process-wide, like set_tf32. */
void wf_kernels_allow_bf16_gemm(int allow);
/* How the CPU's bf16 GEMMs run, for the banner: "oneDNN x.y.z (kernel) on AVX512_BF16",
 * or why they run on the 16-bit forms above (no AVX512_BF16, no oneDNN in this build,
 * or not allowed); and whether it is oneDNN. */
const char *wf_kernels_bf16_gemm(void);
int wf_kernels_bf16_gemm_fast(void);

/* ---- the op (wf_kreg.h) ----
 * inp, weight (the model's 16-bit copy under mixed precision), dout and the `void *` outputs
 * in the variant's element type; bias, dweight, dbias and the `float *` outputs fp32.
 * `lowp` is the precision the operands are representable in (a wf_precision): in a 16-bit
 * variant its own type; in the fp32 variant WF_PREC_NO, or BF16 / FP16 for fp32 operands
 * already rounded to that type (tests and benchmarks), which a GPU may then multiply on
 * 16-bit tensor cores: the same exact products, summed in another order. Products always
 * accumulate in fp32.
 * In a 16-bit variant the bias is rounded to the type before it is added (the value the
 * model's 16-bit weight copy holds, as llm.c and PyTorch's autocast add it, which lets
 * cuBLASLt's epilogue add it): out = round(sum + widen(round(bias))), one rounding of the
 * fp32 sum; gelu_forward's pre the same. */
#define WF_OP_VERSION_matmul 1
typedef struct wf_matmul_op {
  void (*forward)(void *out, const void *inp, const void *weight, const float *bias, int N, int C,
                  int OC, int lowp, wf_stream *s);
  /* The same product left in fp32, its fp32 bias added exactly: a row-parallel layer's
   * partial sums, which the tp reduction adds in fp32 before the residual stream stores
   * them. */
  void (*forward_f32)(float *out, const void *inp, const void *weight, const float *bias, int N,
                      int C, int OC, int lowp, wf_stream *s);
  /* pre = inp . weight^T + bias, gelu_out = gelu(pre) (the MLP's fc and its GELU): exactly
   * forward then gelu's forward on the stored pre. */
  void (*gelu_forward)(void *gelu_out, void *pre, const void *inp, const void *weight,
                       const float *bias, int N, int C, int OC, int lowp, wf_stream *s);
  /* dinp WRITTEN in the variant's type: the output gradient of the activation before a
   * row-parallel layer (attention's, GELU's, SwiGLU's), which its backward reads */
  void (*backward)(void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                   const void *weight, int N, int C, int OC, int lowp, wf_stream *s);
  /* The same with dinp WRITTEN in fp32: a column-parallel layer's input gradient, which the
   * tp reduction adds in fp32 before the norm's backward reads it. */
  void (*backward_f32)(float *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                       const void *weight, int N, int C, int OC, int lowp, wf_stream *s);
  /* fp32 GEMMs (lowp = WF_PREC_NO) may use TF32 tensor cores: off unless allowed
   * (runtime.allow_tf32). Process-wide, like the math mode it sets. */
  void (*set_tf32)(int allow);
} wf_matmul_op;

#endif /* WF_KERNELS_MATMUL_H */
