/*
 * attention_block.cu - the block attention ops of kernels/attention_block.h on the GPU:
 * the CPU twins' arguments plus a stream, the same arithmetic in fp32 on operands widened
 * from their storage format. A reference for context parallelism's blocks, not a
 * tensor-core kernel: one thread block per query row (forward, dq) or key row (dk, dv),
 * keys or queries walked in tiles of NT.
 *
 * Forward: the row's scores against a tile of keys (one key per thread, the dot product
 * over the head), an online softmax across tiles (running max m and sum l, the output
 * accumulator rescaled by exp(m_old - m_new)), lse = m + log l. Backward recomputes
 * p = exp(s - lse) and ds = p (dout . v - D) twice: for dq per query row, and for dk and dv
 * per key row over the rows of its kv head's query heads in head order; so nothing is
 * added atomically, and each gradient is one block's sum in a fixed order.
 *
 * Shapes and strides: attention_block.h (wf_attn_block). hs <= MAXHS.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention_block.h"
#include "cuda_int.h"
#include "fmt_int.h"

namespace
{

constexpr int NT = 128;    /* threads per block, and keys (queries) per tile */
constexpr int MAXHS = 256; /* the largest head size */

/* Element offsets of row i of head h (q, out) or kv head j's k and v, batch b. */
__device__ __forceinline__ size_t q_at(const wf_attn_block &g, int b, int i, int h)
{
  return (size_t)b * g.q_batch + (size_t)i * g.q_row + (size_t)h * g.hs;
}
__device__ __forceinline__ size_t o_at(const wf_attn_block &g, int b, int i, int h)
{
  return (size_t)b * g.o_batch + (size_t)i * g.o_row + (size_t)h * g.hs;
}
__device__ __forceinline__ size_t k_at(const wf_attn_block &g, int b, int j, int kvh)
{
  return (size_t)b * g.kv_batch + (size_t)j * g.kv_row + (size_t)kvh * g.hs;
}
__device__ __forceinline__ size_t v_at(const wf_attn_block &g, int b, int j, int kvh)
{
  return k_at(g, b, j, g.NKV + kvh);
}
__device__ __forceinline__ size_t l_at(const wf_attn_block &g, int b, int h, int i)
{
  return (size_t)b * g.l_batch + (size_t)h * g.l_head + (size_t)i;
}

/* scale x (row a of a, in fmt) . (row b of x, in fmt) over hs, a in shared memory */
__device__ __forceinline__ float dot(const float *a, const void *x, size_t off, int hs, int fmt)
{
  float s = 0.0f;
  for (int d = 0; d < hs; d++)
    s += a[d] * wf__ldf(x, off + d, fmt);
  return s;
}

/* grid (Tq, NH, B): row blockIdx.x of head blockIdx.y. */
__global__ void fwd_kernel(float *out, float *lse, const void *q, const void *kv, wf_attn_block g)
{
  __shared__ float qs[MAXHS], acc[MAXHS], p[NT], red[32];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t = threadIdx.x, hs = g.hs;
  const int kvh = h / (g.NH / g.NKV), n = g.causal ? i + 1 : g.Tk;
  const float scale = rsqrtf((float)hs);
  for (int d = t; d < hs; d += NT)
    qs[d] = wf__ldf(q, q_at(g, b, i, h) + d, g.fmt), acc[d] = 0;
  __syncthreads();
  float m = -INFINITY, l = 0.0f;
  for (int j0 = 0; j0 < n; j0 += NT) {
    int j = j0 + t;
    float s = j < n ? scale * dot(qs, kv, k_at(g, b, j, kvh), hs, g.fmt) : -INFINITY;
    float mn = fmaxf(m, wf__block_max(s, red));
    float e = j < n ? expf(s - mn) : 0.0f, corr = expf(m - mn); /* exp(-inf) = 0 */
    p[t] = e;
    l = l * corr + wf__block_sum(e, red); /* its barriers publish p */
    for (int d = t; d < hs; d += NT) {
      float a = acc[d] * corr;
      for (int u = 0; u < NT && j0 + u < n; u++)
        a += p[u] * wf__ldf(kv, v_at(g, b, j0 + u, kvh) + d, g.fmt);
      acc[d] = a;
    }
    m = mn;
    __syncthreads();
  }
  for (int d = t; d < hs; d += NT)
    out[o_at(g, b, i, h) + d] = acc[d] / l;
  if (t == 0)
    lse[l_at(g, b, h, i)] = m + logf(l);
}

__global__ void merge_kernel(float *acc, float *acc_lse, const float *out, const float *lse,
                             wf_attn_block g)
{
  size_t rows = (size_t)g.B * g.NH * g.Tq;
  WF_GRID_STRIDE(r, rows)
  {
    int i = (int)(r % g.Tq), h = (int)(r / g.Tq % g.NH), b = (int)(r / g.Tq / g.NH);
    size_t li = l_at(g, b, h, i), o = o_at(g, b, i, h);
    float la = acc_lse[li], lb = lse[li];
    if (lb == -INFINITY)
      continue;
    float mx = fmaxf(la, lb), lnew = mx + logf(expf(la - mx) + expf(lb - mx));
    float wa = expf(la - lnew), wb = expf(lb - lnew);
    for (int d = 0; d < g.hs; d++)
      acc[o + d] = wa * acc[o + d] + wb * out[o + d];
    acc_lse[li] = lnew;
  }
}

__global__ void delta_kernel(float *D, const void *dout, const void *out, wf_attn_block g)
{
  size_t rows = (size_t)g.B * g.NH * g.Tq;
  WF_GRID_STRIDE(r, rows)
  {
    int i = (int)(r % g.Tq), h = (int)(r / g.Tq % g.NH), b = (int)(r / g.Tq / g.NH);
    size_t o = o_at(g, b, i, h);
    float s = 0.0f;
    for (int d = 0; d < g.hs; d++)
      s += wf__ldf(dout, o + d, g.fmt) * wf__ldf(out, o + d, g.fmt);
    D[l_at(g, b, h, i)] = s;
  }
}

/* p and ds of query row (b, h, i) (qs, dos in shared memory) against key j */
struct pds {
  float p, ds;
};
__device__ __forceinline__ pds p_ds(const wf_attn_block &g, const float *qs, const float *dos,
                                    const void *kv, int b, int j, int kvh, float lse, float D)
{
  float s = rsqrtf((float)g.hs) * dot(qs, kv, k_at(g, b, j, kvh), g.hs, g.fmt);
  float p = expf(s - lse), dp = dot(dos, kv, v_at(g, b, j, kvh), g.hs, g.fmt);
  return {p, p * (dp - D)};
}

/* grid (Tq, NH, B): dq of row blockIdx.x of head blockIdx.y, added into dq (o strides). */
__global__ void dq_kernel(float *dq, const void *dout, const void *q, const void *kv,
                          const float *lse, const float *D, wf_attn_block g)
{
  __shared__ float qs[MAXHS], dos[MAXHS], ds[NT];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t = threadIdx.x, hs = g.hs;
  const int kvh = h / (g.NH / g.NKV), n = g.causal ? i + 1 : g.Tk;
  const float li = lse[l_at(g, b, h, i)], Di = D[l_at(g, b, h, i)];
  for (int d = t; d < hs; d += NT)
    qs[d] = wf__ldf(q, q_at(g, b, i, h) + d, g.fmt),
    dos[d] = wf__ldf(dout, o_at(g, b, i, h) + d, g.fmt);
  __syncthreads();
  float acc[MAXHS / NT] = {0};
  for (int j0 = 0; j0 < n; j0 += NT) {
    int j = j0 + t;
    ds[t] = j < n ? p_ds(g, qs, dos, kv, b, j, kvh, li, Di).ds : 0.0f;
    __syncthreads();
    for (int d = t, k = 0; d < hs; d += NT, k++)
      for (int u = 0; u < NT && j0 + u < n; u++)
        acc[k] += ds[u] * wf__ldf(kv, k_at(g, b, j0 + u, kvh) + d, g.fmt);
    __syncthreads();
  }
  for (int d = t, k = 0; d < hs; d += NT, k++)
    dq[o_at(g, b, i, h) + d] += rsqrtf((float)hs) * acc[k];
}

/* grid (Tk, NKV, B): dk and dv of key row blockIdx.x of kv head blockIdx.y, over its query
 * heads in head order, added into dkv (kv strides). */
__global__ void dkv_kernel(float *dkv, const void *dout, const void *q, const void *kv,
                           const float *lse, const float *D, wf_attn_block g)
{
  __shared__ float P[NT], DS[NT];
  const int j = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, t = threadIdx.x, hs = g.hs;
  const int G = g.NH / g.NKV;
  float adk[MAXHS / NT] = {0}, adv[MAXHS / NT] = {0};
  for (int h = kvh * G; h < (kvh + 1) * G; h++)
    for (int i0 = g.causal ? j / NT * NT : 0; i0 < g.Tq; i0 += NT) {
      int i = i0 + t;
      bool ok = i < g.Tq && (!g.causal || i >= j);
      float p = 0.0f, dsv = 0.0f;
      if (ok) { /* this thread's query row, read straight from global memory */
        float s = 0.0f, dp = 0.0f;
        size_t qo = q_at(g, b, i, h), oo = o_at(g, b, i, h);
        for (int d = 0; d < hs; d++) {
          s += wf__ldf(q, qo + d, g.fmt) * wf__ldf(kv, k_at(g, b, j, kvh) + d, g.fmt);
          dp += wf__ldf(dout, oo + d, g.fmt) * wf__ldf(kv, v_at(g, b, j, kvh) + d, g.fmt);
        }
        p = expf(rsqrtf((float)hs) * s - lse[l_at(g, b, h, i)]);
        dsv = p * (dp - D[l_at(g, b, h, i)]);
      }
      P[t] = p, DS[t] = dsv;
      __syncthreads();
      for (int d = t, k = 0; d < hs; d += NT, k++)
        for (int u = 0; u < NT && i0 + u < g.Tq; u++) {
          adv[k] += P[u] * wf__ldf(dout, o_at(g, b, i0 + u, h) + d, g.fmt);
          adk[k] += DS[u] * wf__ldf(q, q_at(g, b, i0 + u, h) + d, g.fmt);
        }
      __syncthreads();
    }
  for (int d = t, k = 0; d < hs; d += NT, k++) {
    dkv[k_at(g, b, j, kvh) + d] += rsqrtf((float)hs) * adk[k];
    dkv[v_at(g, b, j, kvh) + d] += adv[k];
  }
}

__global__ void extract_kernel(void *kv, const void *qkv, size_t rows, int C, int KW, int fmt)
{
  WF_GRID_STRIDE(e, rows * (size_t)KW)
  {
    size_t r = e / KW, c = e % KW;
    wf__stf(kv, e, wf__ldf(qkv, r * (size_t)(C + KW) + (size_t)C + c, fmt),
            fmt); /* exact: same format */
  }
}

__global__ void pack_kernel(void *dqkv, const float *dq, const float *dkv, size_t rows, int C,
                            int KW, int fmt)
{
  size_t ld_ = (size_t)(C + KW);
  WF_GRID_STRIDE(e, rows * ld_)
  {
    size_t r = e / ld_, c = e % ld_;
    wf__stf(dqkv, e, c < (size_t)C ? dq[r * C + c] : dkv[r * KW + (c - C)], fmt);
  }
}

__global__ void add_kernel(float *dst, const float *src, size_t n)
{
  WF_GRID_STRIDE(e, n) dst[e] += src[e];
}

cudaStream_t stream_of(wf_stream *s) { return (cudaStream_t)s; }

unsigned blocks_for(size_t n) { return wf__grid_1d(n, NT); }

void fwd(float *out, float *lse, const void *q, const void *kv, const wf_attn_block *g,
         wf_stream *s)
{
  fwd_kernel<<<dim3(g->Tq, g->NH, g->B), NT, 0, stream_of(s)>>>(out, lse, q, kv, *g);
  WF_CUDA_LAUNCHED("attention_block forward");
}

void merge(float *acc, float *acc_lse, const float *out, const float *lse, const wf_attn_block *g,
           wf_stream *s)
{
  size_t rows = (size_t)g->B * g->NH * g->Tq;
  merge_kernel<<<blocks_for(rows), NT, 0, stream_of(s)>>>(acc, acc_lse, out, lse, *g);
  WF_CUDA_LAUNCHED("attention_block merge");
}

void delta(float *D, const void *dout, const void *out, const wf_attn_block *g, wf_stream *s)
{
  size_t rows = (size_t)g->B * g->NH * g->Tq;
  delta_kernel<<<blocks_for(rows), NT, 0, stream_of(s)>>>(D, dout, out, *g);
  WF_CUDA_LAUNCHED("attention_block delta");
}

void bwd(float *dq, float *dkv, const void *dout, const void *q, const void *kv, const float *lse,
         const float *D, const wf_attn_block *g, wf_stream *s)
{
  dq_kernel<<<dim3(g->Tq, g->NH, g->B), NT, 0, stream_of(s)>>>(dq, dout, q, kv, lse, D, *g);
  if (!WF_CUDA_LAUNCHED("attention_block backward (dq)"))
    return;
  dkv_kernel<<<dim3(g->Tk, g->NKV, g->B), NT, 0, stream_of(s)>>>(dkv, dout, q, kv, lse, D, *g);
  WF_CUDA_LAUNCHED("attention_block backward (dk, dv)");
}

void extract(void *kv, const void *qkv, size_t rows, int C, int KW, int fmt, wf_stream *s)
{
  extract_kernel<<<blocks_for(rows * KW), NT, 0, stream_of(s)>>>(kv, qkv, rows, C, KW, fmt);
  WF_CUDA_LAUNCHED("attention_block kv_extract");
}

void pack(void *dqkv, const float *dq, const float *dkv, size_t rows, int C, int KW, int fmt,
          wf_stream *s)
{
  pack_kernel<<<blocks_for(rows * (C + KW)), NT, 0, stream_of(s)>>>(dqkv, dq, dkv, rows, C, KW,
                                                                    fmt);
  WF_CUDA_LAUNCHED("attention_block grad_pack");
}

void add(float *dst, const float *src, size_t n, wf_stream *s)
{
  add_kernel<<<blocks_for(n), NT, 0, stream_of(s)>>>(dst, src, n);
  WF_CUDA_LAUNCHED("attention_block grad_add");
}

const wf_attention_block_op op = {fwd, merge, delta, bwd, extract, pack, add};

} // namespace

/* ---- the op (wf_kreg.h): one table for every element type (the format is an argument) -- */

const wf_kvariants wf__cuda_attention_block =
    WF_KV_ANY(attention_block, WF_OP_VERSION_attention_block, &op);
