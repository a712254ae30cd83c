/*
 * flash.cu - causal multi-head self-attention on the GPU without a (T, T) matrix per
 * head (twin of wf_attention_*): the flash-attention algorithm, in fp32.
 *
 * Forward: a block takes BR query rows of one (b, h), one thread per row, and walks the
 * key tiles up to its last row (causal), BC keys at a time staged in shared memory. Each
 * thread keeps its scaled query, its output accumulator and the running maximum m and
 * sum l of the online softmax: per tile, the scores, the tile's maximum, one rescale of
 * the accumulator by exp(m - m_new), then the tile's contributions. It writes the output
 * and the row's log-sum-exp L = m + log(l), all that backward needs: `att` holds L,
 * (B, NH, T) floats instead of (B, NH, T, T).
 *
 * Backward recomputes the probabilities p = exp(s - L) instead of reading them, in two
 * kernels with no atomics (each writes only rows its own threads own):
 *  1. per query row i: D_i = sum_j p_ij (dout_i . v_j) over its keys, then
 *     dq_i += scale sum_j p_ij (dout_i . v_j - D_i) k_j; D goes to `scratch` (B, NH, T);
 *  2. per key row j: dv_j += sum_{i >= j} p_ij dout_i and
 *     dk_j += sum_{i >= j} p_ij (dout_i . v_j - D_i) scale q_i.
 * Both add into dqkv, which the entry zeroes first: the table's backward writes dqkv
 * (attention.h). The bf16 paths, the fast ones, write it without that pass.
 * D is computed from the probabilities, not from the output (dout . out), so it is exact
 * even where the model rounded the attention output in place for a bf16 GEMM.
 *
 * Documents (attention.h's starts, (B,T) or NULL): query i attends to keys [start_i, i].
 * A query block's key tiles begin at the tile of its first row's start (starts rise
 * along a row), each thread masks the keys before its own start, and backward 2 stops
 * walking queries once their starts pass the block's last key.
 *
 * Head sizes up to 128 use these kernels (templated on a bound for the per-thread
 * arrays); larger ones fall back to attention_tt.cu, which keeps (T, T) probabilities, and
 * the buffer sizes below say so.
 *
 * Grouped-query attention (NKV kv heads, G = NH / NKV query heads each) changes only
 * where a head's k and v columns are, and backward 2: its block takes key rows of one
 * (b, kv head) and walks the G query heads of the group one after another, adding their
 * terms into the same dk and dv registers (still no atomics). Multi-head attention is
 * G = 1, the same operations in the same order.
 *
 * Legend: B batch, T time, C channels of q and out (local), NH query heads (local),
 * NKV kv heads (local), hs = C / NH; qkv (B,T,ld), ld = C + 2 NKV hs, with
 * q = [0,C), k = [C, C + NKV hs), v = [C + NKV hs, ld): query head h owns
 * [h*hs, (h+1)*hs) of q and reads kv head h / G.
 */
#include "attn_int.h"

#define BR 64 /* query (or key) rows per block: one per thread */
#define BC 32 /* rows per shared-memory tile */

static bool flash_fits(int C, int NH) { return NH > 0 && C % NH == 0 && C / NH <= 128; }

size_t wf__attn32_saved(int B, int T, int C, int NH)
{
  return flash_fits(C, NH) ? (size_t)B * NH * T : (size_t)B * NH * T * T;
}

size_t wf__attn32_scratch(int B, int T, int C, int NH)
{
  return flash_fits(C, NH) ? (size_t)B * NH * T : (size_t)B * NH * T * T;
}

/* Where the geometry of one (b, h) lives. */
struct head {
  const float *qkv; /* (T, ld) rows of batch b */
  const int *st;    /* (T) batch b's document starts, or NULL */
  int T, C, hs, ld; /* ld = C + 2 NKV hs */
  int col[3];       /* first column of query head h's q, of its kv head's k and v */
  int off;          /* col[0] = h * hs, where the head's out and dout live */
};

__device__ static head head_of(const float *qkv, const int *starts, int T, int C, int NH, int NKV,
                               int b, int h)
{
  head g;
  int hs = C / NH, kvh = h / (NH / NKV);
  g.ld = C + 2 * NKV * hs;
  g.qkv = qkv + (size_t)b * T * g.ld;
  g.st = starts ? starts + (size_t)b * T : nullptr;
  g.T = T, g.C = C, g.hs = hs, g.off = h * hs;
  g.col[0] = h * hs, g.col[1] = C + kvh * hs, g.col[2] = C + (NKV + kvh) * hs;
  return g;
}

/* (b, h) of query-head block y of a (B * NH) grid. */
__device__ static head head_of_block(const float *qkv, const int *starts, int T, int C, int NH,
                                     int NKV, unsigned y)
{
  return head_of(qkv, starts, T, C, NH, NKV, (int)(y / (unsigned)NH), (int)(y % (unsigned)NH));
}

/* The first key query i attends to: its document's start, or 0. */
__device__ static int first_key(const head &g, int i) { return g.st ? g.st[i] : 0; }

/* Element d of part (0 q, 1 k, 2 v) at time t. */
__device__ static float at(const head &g, int part, int t, int d)
{
  return g.qkv[(size_t)t * g.ld + g.col[part] + d];
}

/* Stage rows [t0, t0 + BC) of parts pa and pb (zeros past T) into two tiles. */
template <int HS>
__device__ static void load_tiles(float (*a)[HS], float (*b)[HS], const head &g, int pa, int pb,
                                  int t0)
{
  for (int e = threadIdx.x; e < BC * g.hs; e += blockDim.x) {
    int j = e / g.hs, d = e % g.hs, t = t0 + j;
    a[j][d] = t < g.T ? at(g, pa, t, d) : 0.0f;
    b[j][d] = t < g.T ? at(g, pb, t, d) : 0.0f;
  }
}

template <int HS>
__device__ static float dot_row(const float *x, const float (*tile)[HS], int j, int hs)
{
  float s = 0.0f;
  for (int d = 0; d < hs; d++)
    s += x[d] * tile[j][d];
  return s;
}

/* out (B,T,C), lse (B,NH,T); grid (ceil(T / BR), B * NH), block BR */
template <int HS>
__global__ static void flash_forward_kernel(float *out, float *lse, const float *qkv,
                                            const int *starts, int T, int C, int NH, int NKV)
{
  __shared__ float ks[BC][HS], vs[BC][HS];
  head g = head_of_block(qkv, starts, T, C, NH, NKV, blockIdx.y);
  const float scale = rsqrtf((float)g.hs);
  int q0 = (int)blockIdx.x * BR, i = q0 + (int)threadIdx.x, last = min(q0 + BR, T) - 1;
  bool live = i < T;
  int lo = live ? first_key(g, i) : 0, k_first = first_key(g, q0) / BC * BC;
  float q[HS], o[HS], m = -INFINITY, l = 0.0f;
  for (int d = 0; d < g.hs; d++) {
    q[d] = live ? at(g, 0, i, d) * scale : 0.0f;
    o[d] = 0.0f;
  }
  for (int k0 = k_first; k0 <= last; k0 += BC) {
    load_tiles<HS>(ks, vs, g, 1, 2, k0);
    __syncthreads();
    float s[BC], mt = -INFINITY;
    for (int j = 0; j < BC; j++) {
      s[j] = live && k0 + j <= i && k0 + j >= lo ? dot_row<HS>(q, ks, j, g.hs) : -INFINITY;
      mt = fmaxf(mt, s[j]);
    }
    if (mt > -INFINITY) { /* one rescale per tile, then the tile's terms */
      float mn = fmaxf(m, mt), corr = expf(m - mn);
      l *= corr;
      for (int d = 0; d < g.hs; d++)
        o[d] *= corr;
      for (int j = 0; j < BC; j++) {
        if (s[j] == -INFINITY)
          continue;
        float p = expf(s[j] - mn);
        l += p;
        for (int d = 0; d < g.hs; d++)
          o[d] += p * vs[j][d];
      }
      m = mn;
    }
    __syncthreads();
  }
  if (!live)
    return;
  float inv = 1.0f / l;
  int b = (int)(blockIdx.y / (unsigned)NH);
  for (int d = 0; d < g.hs; d++)
    out[((size_t)b * T + i) * C + g.off + d] = o[d] * inv;
  lse[(size_t)blockIdx.y * T + i] = m + logf(l);
}

/* Backward 1: D (B,NH,T) and dq; grid and block as the forward. */
template <int HS>
__global__ static void flash_backward_dq_kernel(float *dqkv, float *D, const float *dout,
                                                const float *qkv, const float *lse,
                                                const int *starts, int T, int C, int NH, int NKV)
{
  __shared__ float ks[BC][HS], vs[BC][HS];
  head g = head_of_block(qkv, starts, T, C, NH, NKV, blockIdx.y);
  const float scale = rsqrtf((float)g.hs);
  int b = (int)(blockIdx.y / (unsigned)NH);
  int q0 = (int)blockIdx.x * BR, i = q0 + (int)threadIdx.x, last = min(q0 + BR, T) - 1;
  bool live = i < T;
  int lo = live ? first_key(g, i) : 0, k_first = first_key(g, q0) / BC * BC;
  float q[HS], dy[HS], dq[HS], Li = live ? lse[(size_t)blockIdx.y * T + i] : 0.0f, Di = 0.0f;
  for (int d = 0; d < g.hs; d++) {
    q[d] = live ? at(g, 0, i, d) * scale : 0.0f;
    dy[d] = live ? dout[((size_t)b * T + i) * C + g.off + d] : 0.0f;
    dq[d] = 0.0f;
  }
  for (int pass = 0; pass < 2; pass++) { /* pass 0: D_i; pass 1: dq_i */
    for (int k0 = k_first; k0 <= last; k0 += BC) {
      load_tiles<HS>(ks, vs, g, 1, 2, k0);
      __syncthreads();
      for (int j = 0; live && j < BC && k0 + j <= i; j++) {
        if (k0 + j < lo)
          continue; /* a key of an earlier document */
        float p = expf(dot_row<HS>(q, ks, j, g.hs) - Li), dp = dot_row<HS>(dy, vs, j, g.hs);
        if (pass == 0) {
          Di += p * dp;
          continue;
        }
        float ds = p * (dp - Di) * scale;
        for (int d = 0; d < g.hs; d++)
          dq[d] += ds * ks[j][d];
      }
      __syncthreads();
    }
  }
  if (!live)
    return;
  D[(size_t)blockIdx.y * T + i] = Di;
  float *row = dqkv + ((size_t)b * T + i) * g.ld + g.col[0];
  for (int d = 0; d < g.hs; d++)
    row[d] += dq[d];
}

/* Backward 2, query head h's share of dk and dv of key rows j (in k[], v[], dk[], dv[]
 * of the calling thread): the queries i >= j of that head, BC at a time. */
template <int HS>
__device__ __forceinline__ static void
dkv_of_head(float *dk, float *dv, const float *k, const float *v, float (*qs)[HS], float (*dys)[HS],
            float *Ls, float *Ds, int *Ss, const head &g, const float *D, const float *dout,
            const float *lse, size_t bh, int b, int j0, int j, bool live)
{
  const float scale = rsqrtf((float)g.hs);
  const int j_last = min(j0 + BR, g.T) - 1;         /* the block's last key */
  for (int i0 = j0 / BC * BC; i0 < g.T; i0 += BC) { /* queries i >= j */
    if (first_key(g, i0) > j_last)
      break; /* these queries and all later ones start after every key of the block */
    for (int e = threadIdx.x; e < BC * g.hs; e += blockDim.x) {
      int r = e / g.hs, d = e % g.hs, t = i0 + r;
      qs[r][d] = t < g.T ? at(g, 0, t, d) * scale : 0.0f;
      dys[r][d] = t < g.T ? dout[((size_t)b * g.T + t) * g.C + g.off + d] : 0.0f;
    }
    for (int r = threadIdx.x; r < BC; r += blockDim.x) {
      int t = i0 + r;
      Ls[r] = t < g.T ? lse[bh * g.T + t] : 0.0f;
      Ds[r] = t < g.T ? D[bh * g.T + t] : 0.0f;
      Ss[r] = t < g.T ? first_key(g, t) : 0;
    }
    __syncthreads();
    for (int r = 0; live && r < BC; r++) {
      int t = i0 + r;
      if (t < j || t >= g.T || Ss[r] > j)
        continue;
      float p = expf(dot_row<HS>(k, qs, r, g.hs) - Ls[r]), dp = dot_row<HS>(v, dys, r, g.hs);
      float ds = p * (dp - Ds[r]);
      for (int d = 0; d < g.hs; d++) {
        dv[d] += p * dys[r][d];
        dk[d] += ds * qs[r][d];
      }
    }
    __syncthreads();
  }
}

/* Backward 2: dk and dv of key rows of one (b, kv head), summed over the group's query
 * heads in head order; grid (ceil(T / BR), B * NKV), block BR. */
template <int HS>
__global__ static void flash_backward_dkv_kernel(float *dqkv, const float *D, const float *dout,
                                                 const float *qkv, const float *lse,
                                                 const int *starts, int T, int C, int NH, int NKV)
{
  __shared__ float qs[BC][HS], dys[BC][HS];
  __shared__ float Ls[BC], Ds[BC];
  __shared__ int Ss[BC];
  const int G = NH / NKV, b = (int)(blockIdx.y / (unsigned)NKV);
  const int kvh = (int)(blockIdx.y % (unsigned)NKV);
  head g = head_of(qkv, starts, T, C, NH, NKV, b, kvh * G); /* the group's first query head */
  int j0 = (int)blockIdx.x * BR, j = j0 + (int)threadIdx.x;
  bool live = j < T;
  float k[HS], v[HS], dk[HS], dv[HS];
  for (int d = 0; d < g.hs; d++) {
    k[d] = live ? at(g, 1, j, d) : 0.0f;
    v[d] = live ? at(g, 2, j, d) : 0.0f;
    dk[d] = dv[d] = 0.0f;
  }
  for (int h = kvh * G; h < (kvh + 1) * G; h++) {
    head gh = head_of(qkv, starts, T, C, NH, NKV, b, h);
    dkv_of_head<HS>(dk, dv, k, v, qs, dys, Ls, Ds, Ss, gh, D, dout, lse, (size_t)b * NH + h, b, j0,
                    j, live);
  }
  if (!live)
    return;
  float *row = dqkv + ((size_t)b * T + j) * g.ld;
  for (int d = 0; d < g.hs; d++) {
    row[g.col[1] + d] += dk[d];
    row[g.col[2] + d] += dv[d];
  }
}

static bool shape_ok(int B, int T, int C, int NH, int NKV)
{
  return B > 0 && T > 0 && NH > 0 && C > 0 && C % NH == 0 && NKV > 0 && NH % NKV == 0;
}

/* The smallest instantiated head-size bound that holds hs. */
static int bound_of(int hs) { return hs <= 32 ? 32 : hs <= 64 ? 64 : 128; }

void wf__attn32_forward(float *out, float *att, const float *qkv, const int *starts, int B, int T,
                        int C, int NH, int NKV, wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  if (!shape_ok(B, T, C, NH, NKV))
    return;
  if (!flash_fits(C, NH)) {
    wf__cuda_attention_forward_tt(out, att, qkv, starts, B, T, C, NH, NKV, stream);
    return;
  }
  dim3 grid((unsigned)((T + BR - 1) / BR), (unsigned)(B * NH));
  const int *st = starts;
  switch (bound_of(C / NH)) {
  case 32: flash_forward_kernel<32><<<grid, BR, 0, s>>>(out, att, qkv, st, T, C, NH, NKV); break;
  case 64: flash_forward_kernel<64><<<grid, BR, 0, s>>>(out, att, qkv, st, T, C, NH, NKV); break;
  default: flash_forward_kernel<128><<<grid, BR, 0, s>>>(out, att, qkv, st, T, C, NH, NKV); break;
  }
  WF_CUDA_LAUNCHED("flash_forward_kernel");
}

template <int HS>
static bool backward_launch(float *dqkv, float *D, const float *dout, const float *qkv,
                            const float *lse, const int *st, int B, int T, int C, int NH, int NKV,
                            cudaStream_t s)
{
  dim3 grid_q((unsigned)((T + BR - 1) / BR), (unsigned)(B * NH));
  flash_backward_dq_kernel<HS><<<grid_q, BR, 0, s>>>(dqkv, D, dout, qkv, lse, st, T, C, NH, NKV);
  if (!WF_CUDA_LAUNCHED("flash_backward_dq_kernel"))
    return false;
  dim3 grid_kv((unsigned)((T + BR - 1) / BR), (unsigned)(B * NKV));
  flash_backward_dkv_kernel<HS><<<grid_kv, BR, 0, s>>>(dqkv, D, dout, qkv, lse, st, T, C, NH, NKV);
  return WF_CUDA_LAUNCHED("flash_backward_dkv_kernel");
}

void wf__attn32_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                         const float *att, const int *starts, int B, int T, int C, int NH, int NKV,
                         wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  if (!shape_ok(B, T, C, NH, NKV))
    return;
  size_t nx = (size_t)B * T * (C + 2 * (size_t)NKV * (C / NH));
  if (!WF_CUDA_OK(cudaMemsetAsync(dqkv, 0, nx * sizeof *dqkv, s)))
    return;
  if (!flash_fits(C, NH)) {
    wf__cuda_attention_backward_tt(dqkv, scratch, dout, qkv, att, starts, B, T, C, NH, NKV, stream);
    return;
  }
  const int *st = starts;
  switch (bound_of(C / NH)) {
  case 32: backward_launch<32>(dqkv, scratch, dout, qkv, att, st, B, T, C, NH, NKV, s); break;
  case 64: backward_launch<64>(dqkv, scratch, dout, qkv, att, st, B, T, C, NH, NKV, s); break;
  default: backward_launch<128>(dqkv, scratch, dout, qkv, att, st, B, T, C, NH, NKV, s); break;
  }
}
