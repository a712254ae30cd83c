/*
 * attention.cu - the attention op on the GPU (attention.h's table, twin of
 * kernels/cpu/attention.c): causal grouped-query attention, one variant per element type,
 * each keeping to packed documents when given their starts (every path takes them).
 *
 *  - fp32: runtime.attention's path for the shape (attention_impl.cu: cuDNN or weft's
 *    flash kernels on bf16 copies, or the fp32 reference kernels).
 *  - bf16, up to head size 128: the same path on the stored operands (attention_lse's
 *    entries). `att` has the fp32 variant's layout (wf__attn_saved): the lse (B,NH,T),
 *    then the output O (B,T,C) in bf16, which the forward writes there and copies to
 *    `out` (backward reads O from `att`: the op's backward is not handed the output).
 *    Backward reads dout as the output projection's backward stored it in bf16; its
 *    scratch holds the flash kernels' D (B,NH,T); the path writes the bf16 dqkv straight
 *    into the op's (a bf16 activation gradient).
 *  - fp16, and bf16 above head size 128: the fp32 kernels on widened copies (the
 *    tensor-core paths take bf16 only), the output and dqkv stored in 16 bits. The
 *    forward's copies are stream-ordered allocations (the entry has no scratch argument);
 *    backward's come out of its scratch, which scratch16 sizes for them.
 */
#include "act_int.h"
#include "attn_int.h"

/* Floats, each part of a buffer rounded up to 64 of them (256 bytes). */
static size_t part(size_t floats) { return (floats + 63) / 64 * 64; }

/* Floats of a packed qkv of NH query and NKV kv heads: (B, T, C + 2 NKV hs). */
static size_t qkv_floats(int B, int T, int C, int NH, int NKV)
{
  return (size_t)B * T * (C + 2 * (size_t)NKV * (C / NH));
}

/* ---- 16 bits on widened copies -------------------------------------------------------- */

/* n floats of stream-ordered device memory, or NULL (the failure logged and kept). */
static float *widened(size_t n, wf_stream *stream)
{
  float *w = NULL;
  if (n == 0 || !WF_CUDA_OK(cudaMallocAsync((void **)&w, n * sizeof(float), (cudaStream_t)stream)))
    return NULL;
  return w;
}

static void release(float *w, wf_stream *stream)
{
  WF_CUDA_OK(cudaFreeAsync(w, (cudaStream_t)stream));
}

/* Backward's scratch: the fp32 kernels' own, then room for the widened qkv and for the
 * fp32 dqkv (B,T,3C each at most: NKV <= NH), then for the widened dout (B,T,C). */
static size_t scratch16(int B, int T, int C, int NH)
{
  return part(wf__attn_scratch(B, T, C, NH)) + 2 * part((size_t)B * T * 3 * C) +
         part((size_t)B * T * C);
}

template <typename E>
static void forward16(void *out, void *att, const void *qkv, const int *starts, int B, int T, int C,
                      int NH, int NKV, wf_stream *stream)
{
  size_t nq = qkv_floats(B, T, C, NH, NKV), no = (size_t)B * T * C;
  float *w = widened(nq + no, stream);
  if (!w)
    return;
  wf__cast_load<E>(w, qkv, nq, stream);
  wf__attn_forward(w + nq, (float *)att, w, starts, B, T, C, NH, NKV, stream);
  wf__cast_store<E>(out, w + nq, no, stream);
  release(w, stream);
}

/* The widened qkv, the fp32 dqkv and the widened dout in the scratch scratch16 sized;
 * dqkv stored in 16 bits from it. */
template <typename E>
static void backward16(void *dqkv, float *scratch, const void *dout, const void *qkv,
                       const void *att, const int *starts, int B, int T, int C, int NH, int NKV,
                       wf_stream *stream)
{
  size_t nx = qkv_floats(B, T, C, NH, NKV), ny = (size_t)B * T * C;
  float *w = scratch + part(wf__attn_scratch(B, T, C, NH));
  float *dw = w + part((size_t)B * T * 3 * C), *dy = dw + part((size_t)B * T * 3 * C);
  wf__cast_load<E>(w, qkv, nx, stream);
  wf__cast_load<E>(dy, dout, ny, stream);
  wf__attn_backward(dw, scratch, dy, w, (const float *)att, starts, B, T, C, NH, NKV, stream);
  wf__cast_store<E>(dqkv, dw, nx, stream);
}

/* ---- bf16 on the tensor-core paths ----------------------------------------------------- */

static bool tensor_core_heads(int C, int NH) { return NH > 0 && C % NH == 0 && C / NH <= 128; }

static size_t scratch_bf16(int B, int T, int C, int NH)
{
  return tensor_core_heads(C, NH) ? part((size_t)B * NH * T) : scratch16(B, T, C, NH);
}

static void forward_bf16(void *out, void *att, const void *qkv, const int *starts, int B, int T,
                         int C, int NH, int NKV, wf_stream *stream)
{
  if (!tensor_core_heads(C, NH)) {
    forward16<__nv_bfloat16>(out, att, qkv, starts, B, T, C, NH, NKV, stream);
    return;
  }
  size_t ny = (size_t)B * T * C;
  wf_bf16 *o = wf__attn_saved_out((float *)att, B, T, NH);
  wf__attention_bf16_forward(o, (float *)att, (const wf_bf16 *)qkv, starts, B, T, C, NH, NKV,
                             stream);
  if (ny > 0)
    WF_CUDA_OK(cudaMemcpyAsync(out, o, ny * sizeof(wf_bf16), cudaMemcpyDeviceToDevice,
                               (cudaStream_t)stream));
}

static void backward_bf16(void *dqkv, float *scratch, const void *dout, const void *qkv,
                          const void *att, const int *starts, int B, int T, int C, int NH, int NKV,
                          wf_stream *stream)
{
  if (!tensor_core_heads(C, NH)) {
    backward16<__nv_bfloat16>(dqkv, scratch, dout, qkv, att, starts, B, T, C, NH, NKV, stream);
    return;
  }
  float *lse = (float *)att;
  if (qkv_floats(B, T, C, NH, NKV) == 0)
    return;
  wf__attention_bf16_backward((wf_bf16 *)dqkv, scratch, (const wf_bf16 *)dout, (const wf_bf16 *)qkv,
                              wf__attn_saved_out(lse, B, T, NH), lse, starts, B, T, C, NH, NKV,
                              stream);
}

/* ---- fp32 ------------------------------------------------------------------------------ */

static void forward32(void *out, void *att, const void *qkv, const int *starts, int B, int T, int C,
                      int NH, int NKV, wf_stream *stream)
{
  wf__attn_forward((float *)out, (float *)att, (const float *)qkv, starts, B, T, C, NH, NKV,
                   stream);
}

static void backward32(void *dqkv, float *scratch, const void *dout, const void *qkv,
                       const void *att, const int *starts, int B, int T, int C, int NH, int NKV,
                       wf_stream *stream)
{
  wf__attn_backward((float *)dqkv, scratch, (const float *)dout, (const float *)qkv,
                    (const float *)att, starts, B, T, C, NH, NKV, stream);
}

/* ---- the op (wf_kreg.h) ----------------------------------------------------------------- */

static const wf_attention_op f32 = {wf__attn_saved, wf__attn_scratch,       forward32,
                                    backward32,     wf__attention_set_impl, wf__attention_path};
static const wf_attention_op bf16 = {wf__attn_saved, scratch_bf16,           forward_bf16,
                                     backward_bf16,  wf__attention_set_impl, wf__attention_path};
static const wf_attention_op f16 = {wf__attn_saved,         scratch16,
                                    forward16<__half>,      backward16<__half>,
                                    wf__attention_set_impl, wf__attention_path};
const wf_kvariants wf__cuda_attention =
    WF_KV(attention, WF_OP_VERSION_attention, &f32, &bf16, &f16);
