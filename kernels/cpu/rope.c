/*
 * rope.c - rotary position embeddings on the q and k heads of a packed qkv, in place,
 * Hugging Face's rotate-half convention (rope.h states the contract and why the table).
 *
 * Legend: B batch, T time, NH query heads, NKV key/value heads, hs head size (even),
 * W = (NH + 2 NKV) hs the row of qkv, h2 = hs / 2.
 * Rows (b, t) are independent and split over threads; within a row the rotation of a
 * pair reads both elements before writing them, so it is safe in place. The products
 * are taken as Hugging Face writes them (x1 cos + (-x2) sin, x2 cos + x1 sin; no FMA
 * under ISO C), so with its table the forward rounds as its fp32 forward does.
 */
#include <math.h>

#include "cpu_int.h"
#include "wf_kernels.h"

/* clang contracts x * c + y * s into an FMA unless told not to (gcc does not under ISO
 * C); the products must round as Hugging Face's separate fp32 ops do. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* Llama 3.1's rescaled inverse frequency (transformers' _compute_llama3_parameters),
 * each step one fp32 op as PyTorch computes it on fp32 tensors: a Python scalar is
 * rounded to fp32 first, `scalar / tensor` is reciprocal(tensor) * scalar, and
 * `tensor / scalar` a true division. The band limits are the Python quotients old_ctx /
 * low_freq_factor and old_ctx / high_freq_factor (double), rounded to fp32 to compare. */
static float llama3_inv_freq(float inv, const wf_rope_scaling *s)
{
  const float factor = (float)s->factor, lo = (float)s->low_freq_factor;
  const float old_ctx = (float)s->original_max_position_embeddings;
  const float low_wavelen = (float)(s->original_max_position_embeddings / s->low_freq_factor);
  const float high_wavelen = (float)(s->original_max_position_embeddings / s->high_freq_factor);
  const float span = (float)(s->high_freq_factor - s->low_freq_factor);
  float wavelen = (1.0f / inv) * (float)(2 * M_PI);
  if (wavelen < high_wavelen) /* high frequencies: kept */
    return inv;
  if (wavelen > low_wavelen) /* low frequencies: divided by factor */
    return inv / factor;
  float smooth = ((1.0f / wavelen) * old_ctx - lo) / span; /* in between: interpolated */
  float scaled = (1.0f - smooth) * inv;
  scaled = scaled / factor;
  float kept = smooth * inv;
  return scaled + kept;
}

void wf_rope_table(float *cs, int T, int hs, double theta, const wf_rope_scaling *scaling)
{
  const int h2 = hs / 2;
  const bool llama3 = scaling && scaling->rope_type == WF_ROPE_LLAMA3;
  for (int i = 0; i < h2; i++) {
    /* Hugging Face: inv_freq = 1.0 / (base ** (arange(0, dim, 2).float() / dim)), in fp32 */
    float e = (float)(2 * i) / (float)hs;
    float inv = 1.0f / powf((float)theta, e);
    if (llama3)
      inv = llama3_inv_freq(inv, scaling);
    for (int t = 0; t < T; t++) {
      float angle = (float)t * inv; /* positions (fp32) @ inv_freq: one rounded product */
      cs[(size_t)t * hs + i] = (float)cos((double)angle);
      cs[(size_t)t * hs + h2 + i] = (float)sin((double)angle);
    }
  }
}

struct rope {
  float *x;
  const float *cs;
  const int *pos; /* (B,T) or NULL: row t's */
  int B, T, NH, NKV, hs;
  float sign; /* +1 rotates forward, -1 backward (the transpose) */
};

/* x1' = x1 c - x2 (sign s), x2' = x2 c + x1 (sign s) for each of `heads` heads of a row. */
WF__CLONES static void rope_rotate_row(float *x, const float *c, const float *s, int heads, int hs,
                                       float sign)
{
  const int h2 = hs / 2;
  for (int j = 0; j < heads; j++, x += hs) {
#pragma omp simd
    for (int i = 0; i < h2; i++) {
      float x1 = x[i], x2 = x[i + h2], si = sign * s[i];
      x[i] = x1 * c[i] + (-x2) * si;
      x[i + h2] = x2 * c[i] + x1 * si;
    }
  }
}

static void rope_share(void *p, int tid, int nt)
{
  const struct rope *r = p;
  const size_t W = (size_t)(r->NH + 2 * r->NKV) * r->hs;
  size_t lo, hi;
  wf__split((size_t)r->B * r->T, tid, nt, 1, &lo, &hi);
  for (size_t bt = lo; bt < hi; bt++) {
    size_t p = r->pos ? (size_t)r->pos[bt] : bt % (size_t)r->T;
    const float *c = r->cs + p * r->hs;
    rope_rotate_row(r->x + bt * W, c, c + r->hs / 2, r->NH + r->NKV, r->hs, r->sign);
  }
}

static void rope_apply(float *x, const float *cs, const int *pos, int B, int T, int NH, int NKV,
                       int hs, float sign)
{
  struct rope r = {x, cs, pos, B, T, NH, NKV, hs, sign};
  wf__parallel(wf__threads_for((size_t)B * T * (NH + NKV) * hs), rope_share, &r);
}

void wf_rope_forward(float *qkv, const float *cs, const int *pos, int B, int T, int NH, int NKV,
                     int hs)
{
  rope_apply(qkv, cs, pos, B, T, NH, NKV, hs, 1.0f);
}

void wf_rope_backward(float *dqkv, const float *cs, const int *pos, int B, int T, int NH, int NKV,
                      int hs)
{
  rope_apply(dqkv, cs, pos, B, T, NH, NKV, hs, -1.0f);
}

/* ---- 16-bit storage: row blocks through this thread's working memory (cpu_int.h) --------- */

typedef void rope_fn(float *qkv, const float *cs, const int *pos, int B, int T, int NH, int NKV,
                     int hs);

/* fn (RoPE's forward or backward) on rows [t0, t0 + n) of batch b at a time: a (1, n)
 * batch whose angles start at row t0 of cs, or whose positions are pos's rows. */
static void rope16(rope_fn *fn, void *qkv, const float *cs, const int *pos, int B, int T, int NH,
                   int NKV, int hs, int fmt)
{
  size_t width = (size_t)(NH + 2 * NKV) * hs, blk = wf__block_rows(width);
  for (size_t b = 0; b < (size_t)B; b++)
    for (size_t t0 = 0; t0 < (size_t)T; t0 += blk) {
      size_t n = WF_MIN(blk, (size_t)T - t0), r0 = b * T + t0;
      float *x = wf__widened(WF__W_IN, qkv, r0, n, width, fmt);
      if (!x)
        return;
      if (pos)
        fn(x, cs, pos + r0, 1, (int)n, NH, NKV, hs);
      else
        fn(x, cs + t0 * hs, NULL, 1, (int)n, NH, NKV, hs);
      wf__store(qkv, r0 * width, x, n * width, fmt);
    }
}

void wf_rope_forward16(void *qkv, const float *cs, const int *pos, int B, int T, int NH, int NKV,
                       int hs, int fmt)
{
  rope16(wf_rope_forward, qkv, cs, pos, B, T, NH, NKV, hs, fmt);
}

void wf_rope_backward16(void *dqkv, const float *cs, const int *pos, int B, int T, int NH, int NKV,
                        int hs, int fmt)
{
  rope16(wf_rope_backward, dqkv, cs, pos, B, T, NH, NKV, hs, fmt);
}

/* ---- the op (wf_kreg.h): one variant per element type, the type bound ----------------- */

#define ROPE_VARIANT(name, fmt)                                                                    \
  static void name##_forward(void *qkv, const float *cs, const int *pos, int B, int T, int NH,     \
                             int NKV, int hs, wf_stream *s)                                        \
  {                                                                                                \
    if (fmt == WF_DT_F32)                                                                          \
      wf_rope_forward(qkv, cs, pos, B, T, NH, NKV, hs);                                            \
    else                                                                                           \
      wf_rope_forward16(qkv, cs, pos, B, T, NH, NKV, hs, fmt);                                     \
  }                                                                                                \
  static void name##_backward(void *dqkv, const float *cs, const int *pos, int B, int T, int NH,   \
                              int NKV, int hs, wf_stream *s)                                       \
  {                                                                                                \
    if (fmt == WF_DT_F32)                                                                          \
      wf_rope_backward(dqkv, cs, pos, B, T, NH, NKV, hs);                                          \
    else                                                                                           \
      wf_rope_backward16(dqkv, cs, pos, B, T, NH, NKV, hs, fmt);                                   \
  }                                                                                                \
  static const wf_rope_op name = {name##_forward, name##_backward}

ROPE_VARIANT(f32, WF_DT_F32);
ROPE_VARIANT(bf16, WF_DT_BF16);
ROPE_VARIANT(f16, WF_DT_F16);
const wf_kvariants wf__cpu_rope = WF_KV(rope, WF_OP_VERSION_rope, &f32, &bf16, &f16);
