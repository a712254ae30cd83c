/*
 * attention.cu - causal multi-head self-attention on the GPU that keeps the (T, T)
 * probabilities, as its CPU twin does (wf_attention_*): flash.cu's kernels take over
 * where they apply (head size <= 128) and call these otherwise. Simple rather than
 * fast: one block per (b, h, t) query row.
 *
 * Legend: B batch, T time, C channels (local), NH heads (local), hs = C / NH.
 * qkv (B,T,3C): q = [0,C), k = [C,2C), v = [2C,3C); head h owns columns
 * [h*hs, (h+1)*hs) of each. att (B,NH,T,T): row (b,h,t) holds softmax over
 * t2 <= t and exact zeros for t2 > t. Scale 1/sqrt(hs).
 *
 * Forward, per row: scores into the att row (each thread owns t2 = tid, tid +
 * blockDim, ...), block max, exp and block sum, normalise, then after a barrier
 * (which makes the row's global writes visible to the whole block) out[i] =
 * sum_t2 att[t2] v[t2][i] with threads over i.
 *
 * Backward, in two launches with no atomics:
 *  1. per row: datt[t2] = dout[t] . v[t2]; s = sum_t2 att[t2] datt[t2];
 *     scratch[t2] = att[t2] (datt[t2] - s) * scale   (softmax backward, scaled)
 *  2. per (b, h, j): dq[j] += sum_{t2<=j} scratch[j][t2] k[t2]
 *                    dk[j] += sum_{t>=j} scratch[t][j] q[t]
 *                    dv[j] += sum_{t>=j} att[t][j] dout[t]
 *     All three read only what launch 1 and the forward wrote, and each block
 *     writes only row j's dq, dk and dv, so the adds need no atomics.
 */
#include "cuda_int.h"

#define ATT_THREADS 128

/* Row geometry shared by the kernels. */
struct att_row {
  int b, h, t;
  size_t bh; /* b * NH + h */
};

__device__ static att_row att_row_of(unsigned block, int T, int NH)
{
  att_row r;
  r.t = (int)(block % (unsigned)T);
  r.bh = block / (unsigned)T;
  r.h = (int)(r.bh % (size_t)NH);
  r.b = (int)(r.bh / (size_t)NH);
  return r;
}

/* Start of head h's slice of part `part` (0 q, 1 k, 2 v) at time t. */
__device__ static const float *qkv_at(const float *qkv, int b, int t, int h, int part, int T, int C,
                                      int hs)
{
  return qkv + ((size_t)b * T + t) * 3 * C + (size_t)part * C + (size_t)h * hs;
}

__device__ static float dot(const float *a, const float *b, int n)
{
  float s = 0.0f;
  for (int i = 0; i < n; i++)
    s += a[i] * b[i];
  return s;
}

/* out (B,T,C), att (B,NH,T,T), qkv (B,T,3C) */
__global__ static void attention_forward_kernel(float *out, float *att, const float *qkv, int T,
                                                int C, int NH)
{
  __shared__ float red[32];
  const int hs = C / NH;
  const float scale = rsqrtf((float)hs);
  att_row r = att_row_of(blockIdx.x, T, NH);
  float *a = att + (size_t)blockIdx.x * T;
  const float *q = qkv_at(qkv, r.b, r.t, r.h, 0, T, C, hs);
  float mx = -INFINITY;
  for (int t2 = threadIdx.x; t2 <= r.t; t2 += blockDim.x) {
    float s = dot(q, qkv_at(qkv, r.b, t2, r.h, 1, T, C, hs), hs) * scale;
    a[t2] = s;
    mx = fmaxf(mx, s);
  }
  mx = wf__block_max(mx, red);
  float sum = 0.0f;
  for (int t2 = threadIdx.x; t2 <= r.t; t2 += blockDim.x) {
    float e = expf(a[t2] - mx);
    a[t2] = e;
    sum += e;
  }
  float inv = 1.0f / wf__block_sum(sum, red);
  for (int t2 = threadIdx.x; t2 < T; t2 += blockDim.x)
    a[t2] = t2 <= r.t ? a[t2] * inv : 0.0f;
  __syncthreads();
  float *o = out + ((size_t)r.b * T + r.t) * C + (size_t)r.h * hs;
  for (int i = threadIdx.x; i < hs; i += blockDim.x) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= r.t; t2++)
      acc += a[t2] * qkv_at(qkv, r.b, t2, r.h, 2, T, C, hs)[i];
    o[i] = acc;
  }
}

/* scratch (B,NH,T,T) = scaled softmax backward of each row; see the file comment. */
__global__ static void attention_backward_scores_kernel(float *scratch, const float *dout,
                                                        const float *qkv, const float *att, int T,
                                                        int C, int NH)
{
  __shared__ float red[32];
  const int hs = C / NH;
  const float scale = rsqrtf((float)hs);
  att_row r = att_row_of(blockIdx.x, T, NH);
  const float *a = att + (size_t)blockIdx.x * T;
  float *ds = scratch + (size_t)blockIdx.x * T;
  const float *dy = dout + ((size_t)r.b * T + r.t) * C + (size_t)r.h * hs;
  float acc = 0.0f;
  for (int t2 = threadIdx.x; t2 <= r.t; t2 += blockDim.x) {
    float d = dot(dy, qkv_at(qkv, r.b, t2, r.h, 2, T, C, hs), hs);
    ds[t2] = d;
    acc += a[t2] * d;
  }
  float s = wf__block_sum(acc, red);
  for (int t2 = threadIdx.x; t2 < T; t2 += blockDim.x)
    ds[t2] = t2 <= r.t ? a[t2] * (ds[t2] - s) * scale : 0.0f;
}

/* dqkv (B,T,3C) += the q, k and v gradients of row j = r.t; see the file comment. */
__global__ static void attention_backward_qkv_kernel(float *dqkv, const float *scratch,
                                                     const float *dout, const float *qkv,
                                                     const float *att, int T, int C, int NH)
{
  const int hs = C / NH;
  att_row r = att_row_of(blockIdx.x, T, NH);
  const int j = r.t;
  const float *ds_j = scratch + (size_t)blockIdx.x * T; /* row j */
  const size_t rows = r.bh * (size_t)T * T;             /* start of (b,h)'s T x T block */
  float *dq = dqkv + ((size_t)r.b * T + j) * 3 * C + (size_t)r.h * hs;
  float *dk = dq + C, *dv = dq + 2 * C;
  for (int i = threadIdx.x; i < hs; i += blockDim.x) {
    float gq = 0.0f, gk = 0.0f, gv = 0.0f;
    for (int t2 = 0; t2 <= j; t2++)
      gq += ds_j[t2] * qkv_at(qkv, r.b, t2, r.h, 1, T, C, hs)[i];
    for (int t = j; t < T; t++) {
      size_t tj = rows + (size_t)t * T + j;
      gk += scratch[tj] * qkv_at(qkv, r.b, t, r.h, 0, T, C, hs)[i];
      gv += att[tj] * dout[((size_t)r.b * T + t) * C + (size_t)r.h * hs + i];
    }
    dq[i] += gq;
    dk[i] += gk;
    dv[i] += gv;
  }
}

static bool attention_shape_ok(int B, int T, int C, int NH)
{
  return B > 0 && T > 0 && NH > 0 && C > 0 && C % NH == 0;
}

void wf__cuda_attention_forward_tt(float *out, float *att, const float *qkv, int B, int T, int C,
                                   int NH, wf_stream *stream)
{
  if (!attention_shape_ok(B, T, C, NH))
    return;
  unsigned rows = (unsigned)((size_t)B * NH * T);
  attention_forward_kernel<<<rows, ATT_THREADS, 0, (cudaStream_t)stream>>>(out, att, qkv, T, C, NH);
  WF_CUDA_LAUNCHED("attention_forward_kernel");
}

void wf__cuda_attention_backward_tt(float *dqkv, float *scratch, const float *dout,
                                    const float *qkv, const float *att, int B, int T, int C, int NH,
                                    wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  if (!attention_shape_ok(B, T, C, NH))
    return;
  unsigned rows = (unsigned)((size_t)B * NH * T);
  attention_backward_scores_kernel<<<rows, ATT_THREADS, 0, s>>>(scratch, dout, qkv, att, T, C, NH);
  if (!WF_CUDA_LAUNCHED("attention_backward_scores_kernel"))
    return;
  attention_backward_qkv_kernel<<<rows, ATT_THREADS, 0, s>>>(dqkv, scratch, dout, qkv, att, T, C,
                                                             NH);
  WF_CUDA_LAUNCHED("attention_backward_qkv_kernel");
}
