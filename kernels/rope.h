/*
 * rope.h - rotary position embeddings (RoPE) on the q and k heads of a packed qkv.
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/rope.c; the CUDA twin has the same arguments plus a stream.
 *
 * Convention: Hugging Face's "rotate half" (LlamaForCausalLM's apply_rotary_pos_emb):
 * within a head of size hs, element i pairs with element i + hs/2 (i < hs/2) and the
 * pair turns by the angle t * f_i of its position t:
 *     x1' = x1 cos - x2 sin,   x2' = x2 cos + x1 sin,   f_i = theta^(-2i/hs).
 * Hugging Face checkpoints are stored for this convention (their conversion script
 * permuted Meta's interleaved-pair q_proj/k_proj rows), so they load unpermuted.
 *
 * The angles come from a table, not from sin/cos in the kernel: the table is built
 * once, on the host, by wf_rope_table, exactly as Hugging Face rounds it (fp32 inverse
 * frequencies, fp32 angles), so CPU and GPU rotate by the same numbers, a GPU kernel
 * does one load instead of a sincosf of an angle up to T radians, and another frequency
 * rule (Llama 3.1's scaled frequencies, wf_rope_scaling) is another table, not another
 * kernel.
 * Sizing and ownership: the table of a model is (T_max, hs) floats (T_max the longest
 * sequence it runs; 8192 x 128 is 4 MiB), built by whoever builds the model, copied to
 * its device once and freed with it; kernels borrow it read-only. Positions are
 * 0..T-1, or pos (B,T) gives each row's own (packed documents, whose positions restart
 * at each); a caller whose sequence starts at position p passes cs + p * hs.
 *
 * The rotation is applied in place: the qkv GEMM writes the packed buffer, RoPE turns
 * its q and k heads, attention reads it. Backward needs only the angles (the map is
 * linear and orthogonal, so no input is kept), and attention's backward needs the
 * rotated q and k, which is what the buffer holds: an out-of-place form would cost a
 * second (B, T, (NH + 2 NKV) hs) activation per layer for nothing.
 */
#ifndef WF_KERNELS_ROPE_H
#define WF_KERNELS_ROPE_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

#include "wf_config.h" /* wf_rope_scaling */

/* cs (T, hs), host memory: row t = [cos(t f_0) .. cos(t f_{hs/2-1}),
 * sin(t f_0) .. sin(t f_{hs/2-1})] with f_i = 1 / fp32(theta^(fp32(2i / hs))) and the
 * angle fp32(t * f_i), each rounded to fp32 as Hugging Face computes them (Llama 3:
 * theta = 500000, Llama 2: 10000). hs even, theta > 0.
 * scaling (NULL or rope_type none: none) rescales each f_i first, as transformers'
 * rope_type "llama3" does (Llama 3.1, 3.2), in its fp32 steps: with the wavelength
 * w = 2 pi / f_i and old = original_max_position_embeddings, w < old / high_freq_factor
 * keeps f_i, w > old / low_freq_factor divides it by factor, and in between
 * s = (old / w - low_freq_factor) / (high_freq_factor - low_freq_factor) gives
 * (1 - s) f_i / factor + s f_i. The scaling is resolved (wf_rope_scaling_resolve). */
void wf_rope_table(float *cs, int T, int hs, double theta, const wf_rope_scaling *scaling);

/* qkv (B, T, (NH + 2 NKV) hs), in place: the NH q heads and then the NKV k heads of
 * each (b, t) are rotated by row p of cs (T, hs), p = pos ? pos[b,t] : t (pos (B,T) or
 * NULL); the NKV v heads are untouched. NH and NKV are the heads this rank holds (local
 * under tensor parallelism), hs even. */
void wf_rope_forward(float *qkv, const float *cs, const int *pos, int B, int T, int NH, int NKV,
                     int hs);
/* dqkv (B, T, (NH + 2 NKV) hs), in place: the gradient of the rotated q and k heads
 * becomes the gradient of the unrotated ones by the inverse (transposed) rotation,
 *     d1 = d1' cos + d2' sin,   d2 = d2' cos - d1' sin;
 * v heads untouched. The one backward that does not add into its output: it maps a
 * finished gradient (attention's backward has added all of it) to another, in place. */
void wf_rope_backward(float *dqkv, const float *cs, const int *pos, int B, int T, int NH, int NKV,
                      int hs);

/* The same on qkv (dqkv) stored in 16-bit format fmt (storage.h): rotated in fp32,
 * rounded. */
void wf_rope_forward16(void *qkv, const float *cs, const int *pos, int B, int T, int NH, int NKV,
                       int hs, int fmt);
void wf_rope_backward16(void *dqkv, const float *cs, const int *pos, int B, int T, int NH, int NKV,
                        int hs, int fmt);

/* ---- the op (wf_kreg.h): qkv and dqkv in the variant's element type; cs (T, hs) is the
 * device copy of a wf_rope_table, fp32; pos (B,T) in device memory or NULL. Version 2:
 * pos ---- */
#define WF_OP_VERSION_rope 2
typedef struct wf_rope_op {
  void (*forward)(void *qkv, const float *cs, const int *pos, int B, int T, int NH, int NKV, int hs,
                  wf_stream *s);
  void (*backward)(void *dqkv, const float *cs, const int *pos, int B, int T, int NH, int NKV,
                   int hs, wf_stream *s);
} wf_rope_op;

#endif /* WF_KERNELS_ROPE_H */
