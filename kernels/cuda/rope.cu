/*
 * rope.cu - rotary position embeddings on the GPU (twin of wf_rope_*), in place on the
 * q and k heads of a packed qkv, Hugging Face's rotate-half convention (rope.h).
 *
 * One thread per rotated pair, grid-stride: pair p of B*T*(NH+NKV)*h2 is element i of
 * head j of row bt (i fastest, so a warp reads consecutive elements of a head). The
 * thread reads both elements of its pair and the angle's cos/sin from the table (row
 * t of cs, or row pos[b,t] when pos gives each row its position), then writes both: no
 * other thread touches them, so in place is safe.
 * Legend: B batch, T time, NH query heads, NKV kv heads, hs head size (even),
 * h2 = hs / 2, W = (NH + 2 NKV) hs the row of qkv; cs (T, hs) = [cos | sin] per row.
 * The forward's qkv is an activation of type E (act_int.h: fp32, or bf16 / fp16 for the
 * 16-bit tables: both elements loaded widened, rotated in fp32, stored rounded); the
 * backward's dqkv is an fp32 gradient.
 */
#include "act_int.h"

/* x (B,T,W) in place; sign +1 turns forward, -1 backward (the transpose). */
template <typename E>
__global__ static void rope_kernel(E *x, const float *cs, const int *pos, int T, int heads, int W,
                                   int hs, float sign, size_t pairs)
{
  const int h2 = hs / 2;
  WF_GRID_STRIDE(p, pairs)
  {
    int i = (int)(p % (size_t)h2);
    size_t r = p / (size_t)h2;
    int j = (int)(r % (size_t)heads);
    size_t bt = r / (size_t)heads;
    const float *c = cs + (pos ? (size_t)pos[bt] : bt % (size_t)T) * hs;
    E *e = x + bt * W + (size_t)j * hs + i;
    float x1 = wf__ld(e, 0), x2 = wf__ld(e, h2), co = c[i], si = sign * c[h2 + i];
    wf__st(e, 0, x1 * co - x2 * si);
    wf__st(e, h2, x2 * co + x1 * si);
  }
}

template <typename E>
static void rope_launch(E *x, const float *cs, const int *pos, int B, int T, int NH, int NKV,
                        int hs, float sign, wf_stream *stream, const char *what)
{
  if (B <= 0 || T <= 0 || NH + NKV <= 0 || hs < 2)
    return;
  size_t pairs = (size_t)B * T * (NH + NKV) * (hs / 2);
  rope_kernel<E><<<wf__grid_1d(pairs, 256), 256, 0, (cudaStream_t)stream>>>(
      x, cs, pos, T, NH + NKV, (NH + 2 * NKV) * hs, hs, sign, pairs);
  WF_CUDA_LAUNCHED(what);
}

template <typename E>
static void rope_forward(void *qkv, const float *cs, const int *pos, int B, int T, int NH, int NKV,
                         int hs, wf_stream *stream)
{
  rope_launch((E *)qkv, cs, pos, B, T, NH, NKV, hs, 1.0f, stream, "rope_kernel (forward)");
}

template <typename E>
static void rope_backward(void *dqkv, const float *cs, const int *pos, int B, int T, int NH,
                          int NKV, int hs, wf_stream *stream)
{
  rope_launch((E *)dqkv, cs, pos, B, T, NH, NKV, hs, -1.0f, stream, "rope_kernel (backward)");
}

/* ---- the op (wf_kreg.h): one variant per element type --------------------------------- */

template <typename E> static const wf_rope_op op = {rope_forward<E>, rope_backward<E>};
const wf_kvariants wf__cuda_rope =
    WF_KV(rope, WF_OP_VERSION_rope, &op<float>, &op<__nv_bfloat16>, &op<__half>);
