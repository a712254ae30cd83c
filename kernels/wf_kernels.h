/*
 * wf_kernels.h - forward and backward of every op of the models (GPT-2, Llama, the
 * mixture-of-experts families), on the CPU.
 *
 * Conventions (llm.c's):
 *  - outputs first, then inputs, then sizes;
 *  - backward functions ADD into gradient buffers (zeroing is the caller's job), so
 *    gradient accumulation over micro-batches, tied weights and the residual stream's
 *    branches come for free. Except the input gradients that feed one consumer, which
 *    are WRITTEN: matmul's dinp, GELU's and SwiGLU's (whose only reader is the GEMM
 *    before them), attention's dqkv, and RoPE's in-place map. Adding them into zeros cost a zeroing
 * pass and a read of the zeros for nothing;
 *  - shapes in comments use  B batch, T time, C channels, OC output channels,
 *    NH heads (local to this rank under tensor parallelism), hs = C / NH,
 *    NKV key/value heads (grouped-query attention; NKV divides NH), F the MLP's width,
 *    V vocabulary columns present in `logits`, ld the row stride (>= V), N rows;
 *  - kernels never communicate: pieces that need a reduction across ranks are split
 *    so the caller can reduce between them (see the cross-entropy pair).
 *
 * Every function has a CUDA twin in the GPU module (kernels/cuda/) with the same
 * arguments plus a stream, reached through the op's table (wf_kreg.h); tests compare
 * the two.
 *
 * The declarations live in one header per op (kernels/<op>.h), included here.
 *
 * CPU kernels use the number of threads set by wf_kernels_set_threads(), which main()
 * derives from the rank's CPU binding (loops and GEMM shares run on one pool).
 */
#ifndef WF_KERNELS_H
#define WF_KERNELS_H

#include "bf16.h"
#include "storage.h"
#include "threads.h"
#include "wf_op_headers.h" /* every op's header (kernels/meson.build's kernel_ops) */

#endif /* WF_KERNELS_H */
