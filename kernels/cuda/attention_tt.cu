/*
 * attention_tt.cu - causal self-attention on the GPU that keeps the (T, T)
 * probabilities, as its CPU twin does (wf_attention_*): flash.cu's kernels take over
 * where they apply (head size <= 128) and call these otherwise. Simple rather than
 * fast: one block per (b, h, t) query row.
 *
 * Legend: B batch, T time, C channels of q and out (local), NH query heads (local),
 * NKV kv heads (local; NKV divides NH, G = NH / NKV), hs = C / NH, ld = C + 2 NKV hs.
 * qkv (B,T,ld): q = [0,C), k = [C, C + NKV hs), v = [C + NKV hs, ld); query head h
 * owns columns [h*hs, (h+1)*hs) of q and reads kv head h / G (multi-head attention is
 * NKV == NH, G = 1). att (B,NH,T,T): row (b,h,t) holds softmax over t2 <= t and exact
 * zeros for t2 > t. Scale 1/sqrt(hs). With document starts (attention.h) row t's keys
 * begin at its start s: the softmax is over s <= t2 <= t, zeros elsewhere, and so is
 * the scaled softmax backward, so launch 2's sums need no mask (masked terms are 0).
 *
 * Forward, per row: scores into the att row (each thread owns t2 = tid, tid +
 * blockDim, ...), block max, exp and block sum, normalise, then after a barrier
 * (which makes the row's global writes visible to the whole block) out[i] =
 * sum_t2 att[t2] v[t2][i] with threads over i.
 *
 * Backward, in two launches with no atomics:
 *  1. per row: datt[t2] = dout[t] . v[t2]; s = sum_t2 att[t2] datt[t2];
 *     scratch[t2] = att[t2] (datt[t2] - s) * scale   (softmax backward, scaled)
 *  2. per (b, kv head, j), for each query head h of the group in turn:
 *                    dq_h[j] += sum_{t2<=j} scratch_h[j][t2] k[t2]
 *                    dk[j]   += sum_h sum_{t>=j} scratch_h[t][j] q_h[t]
 *                    dv[j]   += sum_h sum_{t>=j} att_h[t][j] dout_h[t]
 *     All three read only what launch 1 and the forward wrote, and each block
 *     writes only row j's dq (of its G heads), dk and dv, so the adds need no atomics.
 */
#include "attn_int.h"

#define ATT_THREADS 128

/* Row geometry shared by the kernels: block = (b * heads + h) * T + t. */
struct att_row {
  int b, h, t;
  size_t bh; /* b * heads + h */
};

__device__ static att_row att_row_of(unsigned block, int T, int heads)
{
  att_row r;
  r.t = (int)(block % (unsigned)T);
  r.bh = block / (unsigned)T;
  r.h = (int)(r.bh % (size_t)heads);
  r.b = (int)(r.bh / (size_t)heads);
  return r;
}

/* The sizes every kernel needs, and the document starts (B,T) or NULL. */
struct att_dims {
  int T, C, NH, NKV, hs;
  const int *starts;
};

/* The first key of row t of batch b. */
__device__ static int first_key(const att_dims &d, int b, int t)
{
  return d.starts ? d.starts[(size_t)b * d.T + t] : 0;
}

/* Start of query head h's slice of part `part` (0 q, 1 k, 2 v: those of its kv head)
 * at time t. */
__device__ static const float *qkv_at(const float *qkv, int b, int t, int h, int part,
                                      const att_dims &a)
{
  size_t ld = (size_t)a.C + 2 * (size_t)a.NKV * a.hs, kvh = (size_t)(h / (a.NH / a.NKV));
  size_t col =
      part == 0 ? (size_t)h * a.hs : (size_t)a.C + ((part == 2 ? (size_t)a.NKV : 0) + kvh) * a.hs;
  return qkv + ((size_t)b * a.T + t) * ld + col;
}

__device__ static float dot(const float *a, const float *b, int n)
{
  float s = 0.0f;
  for (int i = 0; i < n; i++)
    s += a[i] * b[i];
  return s;
}

/* out (B,T,C), att (B,NH,T,T), qkv (B,T,ld) */
__global__ static void attention_forward_kernel(float *out, float *att, const float *qkv,
                                                att_dims d)
{
  __shared__ float red[32];
  const int T = d.T, C = d.C, hs = d.hs;
  const float scale = rsqrtf((float)hs);
  att_row r = att_row_of(blockIdx.x, T, d.NH);
  float *a = att + (size_t)blockIdx.x * T;
  const float *q = qkv_at(qkv, r.b, r.t, r.h, 0, d);
  const int lo = first_key(d, r.b, r.t);
  float mx = -INFINITY;
  for (int t2 = lo + (int)threadIdx.x; t2 <= r.t; t2 += blockDim.x) {
    float s = dot(q, qkv_at(qkv, r.b, t2, r.h, 1, d), hs) * scale;
    a[t2] = s;
    mx = fmaxf(mx, s);
  }
  mx = wf__block_max(mx, red);
  float sum = 0.0f;
  for (int t2 = lo + (int)threadIdx.x; t2 <= r.t; t2 += blockDim.x) {
    float e = expf(a[t2] - mx);
    a[t2] = e;
    sum += e;
  }
  float inv = 1.0f / wf__block_sum(sum, red);
  for (int t2 = threadIdx.x; t2 < T; t2 += blockDim.x)
    a[t2] = t2 <= r.t && t2 >= lo ? a[t2] * inv : 0.0f;
  __syncthreads();
  float *o = out + ((size_t)r.b * T + r.t) * C + (size_t)r.h * hs;
  for (int i = threadIdx.x; i < hs; i += blockDim.x) {
    float acc = 0.0f;
    for (int t2 = lo; t2 <= r.t; t2++)
      acc += a[t2] * qkv_at(qkv, r.b, t2, r.h, 2, d)[i];
    o[i] = acc;
  }
}

/* scratch (B,NH,T,T) = scaled softmax backward of each row; see the file comment. */
__global__ static void attention_backward_scores_kernel(float *scratch, const float *dout,
                                                        const float *qkv, const float *att,
                                                        att_dims d)
{
  __shared__ float red[32];
  const int T = d.T, C = d.C, hs = d.hs;
  const float scale = rsqrtf((float)hs);
  att_row r = att_row_of(blockIdx.x, T, d.NH);
  const float *a = att + (size_t)blockIdx.x * T;
  float *ds = scratch + (size_t)blockIdx.x * T;
  const float *dy = dout + ((size_t)r.b * T + r.t) * C + (size_t)r.h * hs;
  const int lo = first_key(d, r.b, r.t);
  float acc = 0.0f;
  for (int t2 = lo + (int)threadIdx.x; t2 <= r.t; t2 += blockDim.x) {
    float dp = dot(dy, qkv_at(qkv, r.b, t2, r.h, 2, d), hs);
    ds[t2] = dp;
    acc += a[t2] * dp;
  }
  float s = wf__block_sum(acc, red);
  for (int t2 = threadIdx.x; t2 < T; t2 += blockDim.x)
    ds[t2] = t2 <= r.t && t2 >= lo ? a[t2] * (ds[t2] - s) * scale : 0.0f;
}

/* dq of query head h at row j (dq_j: its columns in dqkv) and that head's terms of dk
 * and dv at row j, added into gk and gv; see the file comment. */
__device__ static void row_grads_of_head(float *dq_j, float *gk, float *gv, int i,
                                         const float *scratch, const float *dout, const float *qkv,
                                         const float *att, const att_dims &d, int b, int h, int j)
{
  const int T = d.T;
  const size_t bh = (size_t)b * d.NH + h;
  const float *ds_j = scratch + (bh * T + j) * T; /* row j */
  const size_t rows = bh * (size_t)T * T;         /* start of (b,h)'s T x T block */
  float gq = 0.0f;
  for (int t2 = 0; t2 <= j; t2++)
    gq += ds_j[t2] * qkv_at(qkv, b, t2, h, 1, d)[i];
  for (int t = j; t < T; t++) {
    size_t tj = rows + (size_t)t * T + j;
    *gk += scratch[tj] * qkv_at(qkv, b, t, h, 0, d)[i];
    *gv += att[tj] * dout[((size_t)b * T + t) * d.C + (size_t)h * d.hs + i];
  }
  dq_j[i] += gq;
}

/* dqkv (B,T,ld) += the q gradients of row j = r.t of the G query heads of kv head r.h,
 * and the k and v gradients of that kv head's row j; see the file comment. */
__global__ static void attention_backward_qkv_kernel(float *dqkv, const float *scratch,
                                                     const float *dout, const float *qkv,
                                                     const float *att, att_dims d)
{
  const int G = d.NH / d.NKV, j = (int)(blockIdx.x % (unsigned)d.T);
  att_row r = att_row_of(blockIdx.x, d.T, d.NKV); /* r.h: the kv head */
  const size_t ld = (size_t)d.C + 2 * (size_t)d.NKV * d.hs;
  float *row = dqkv + ((size_t)r.b * d.T + j) * ld;
  float *dk = row + d.C + (size_t)r.h * d.hs, *dv = row + d.C + ((size_t)d.NKV + r.h) * d.hs;
  for (int i = threadIdx.x; i < d.hs; i += blockDim.x) {
    float gk = 0.0f, gv = 0.0f;
    for (int h = r.h * G; h < (r.h + 1) * G; h++)
      row_grads_of_head(row + (size_t)h * d.hs, &gk, &gv, i, scratch, dout, qkv, att, d, r.b, h, j);
    dk[i] += gk;
    dv[i] += gv;
  }
}

static bool attention_shape_ok(int B, int T, int C, int NH, int NKV)
{
  return B > 0 && T > 0 && NH > 0 && C > 0 && C % NH == 0 && NKV > 0 && NH % NKV == 0;
}

void wf__cuda_attention_forward_tt(float *out, float *att, const float *qkv, const int *starts,
                                   int B, int T, int C, int NH, int NKV, wf_stream *stream)
{
  if (!attention_shape_ok(B, T, C, NH, NKV))
    return;
  att_dims d = {T, C, NH, NKV, C / NH, starts};
  unsigned rows = (unsigned)((size_t)B * NH * T);
  attention_forward_kernel<<<rows, ATT_THREADS, 0, (cudaStream_t)stream>>>(out, att, qkv, d);
  WF_CUDA_LAUNCHED("attention_forward_kernel");
}

void wf__cuda_attention_backward_tt(float *dqkv, float *scratch, const float *dout,
                                    const float *qkv, const float *att, const int *starts, int B,
                                    int T, int C, int NH, int NKV, wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  if (!attention_shape_ok(B, T, C, NH, NKV))
    return;
  att_dims d = {T, C, NH, NKV, C / NH, starts};
  unsigned rows = (unsigned)((size_t)B * NH * T), kv_rows = (unsigned)((size_t)B * NKV * T);
  attention_backward_scores_kernel<<<rows, ATT_THREADS, 0, s>>>(scratch, dout, qkv, att, d);
  if (!WF_CUDA_LAUNCHED("attention_backward_scores_kernel"))
    return;
  attention_backward_qkv_kernel<<<kv_rows, ATT_THREADS, 0, s>>>(dqkv, scratch, dout, qkv, att, d);
  WF_CUDA_LAUNCHED("attention_backward_qkv_kernel");
}
