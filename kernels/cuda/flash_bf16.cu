/*
 * flash_bf16.cu - causal (grouped-query) attention on tensor cores, FlashAttention-2's
 * algorithm: bf16 inputs, fp32 accumulation, no (T, T) matrix in memory; the twin of
 * wf_attention_bf16_* (kernels/cpu/attention_lse.c; attention_lse.h defines the numerics).
 * Head sizes 64 and 128, a template parameter, so every per-thread array has a
 * compile-time size and lives in registers; the building blocks (cp.async, ldmatrix,
 * mma.sync m16n8k16) and their fragment layouts are in mma_int.h.
 *
 * Forward (one block of 4 warps per 64 query rows of one (b, h); each warp owns 16
 * rows): Q goes to registers once; the key/value tiles of 64 rows up to the diagonal
 * stream through shared memory, the next K tile loading while the current tile's
 * softmax and P.V run, the next V tile while the next S = Q.K^T runs. Per tile, in
 * registers: S (16 x 64 per warp), the online softmax (running max m and sum l per
 * row; the accumulator rescaled by exp(m_old - m_new)), P rounded to bf16 straight
 * from S's accumulators into the A operand of O += P.V. The end writes O / l in bf16
 * and lse = m + log l, all backward needs besides O. Query tiles are issued heaviest
 * first (causal: the last tile reads every key).
 *
 * Backward, deterministic (no atomics; each output element is written once by one
 * thread), in three kernels:
 *  1. D = rowsum(dout * out) per (b, h, t), into the scratch (B,NH,T);
 *  2. per 64-key tile of one (b, kv head), each warp owning 16 keys, over the query
 *     heads of the group and the query tiles at or after the keys: S^T = K.Q^T,
 *     P^T = exp(S^T scale - lse), dV += P^T.dO, dP^T = V.dO^T, dS^T = P^T (dP^T - D),
 *     dK += dS^T.Q; then dK scale and dV are written;
 *  3. per 64-query tile of one (b, h), over the key tiles up to the diagonal: S, P, dP
 *     and dS again, dQ += dS.K; then dQ scale is written.
 * Kernel 3 recomputes two of kernel 2's products (7 matrix products instead of
 * FlashAttention-2's 5) to avoid its atomic fp32 dQ accumulation, which would make the
 * gradient depend on the order blocks finish.
 *
 * Bounds: rows at or past T load as zeros and are never stored; scores of keys past T
 * or after the query are -inf in the forward and probabilities 0 in the backward.
 * Documents (attention.h's starts, (B,T) or NULL): so are keys before the query's
 * document start; a query tile's key tiles begin at the tile of its first row's start
 * (starts rise along a row), and kernel 2 stops at the first query tile whose first
 * row's start is past its keys (every later query starts later still). The
 * launchers check what the kernels assume: hs 64 or 128, NKV dividing NH, B*NH within a
 * grid's y dimension; the caller (attention_impl.cu) asks flash16_applies first.
 *
 * Legend: B batch, T time, C = NH hs, NKV kv heads, ld = C + 2 NKV hs (qkv's row
 * stride), scale = 1/sqrt(hs); sl2 = scale log2(e), so exp(scale (s - m)) is
 * exp2(s sl2 - m sl2), one FMA and one exp2.
 */
#include "attn_int.h"
#include "mma_int.h"

#define NTHREADS 128 /* 4 warps */
#define LOG2E    1.4426950408889634f

namespace
{

/* Where one (b, head) of qkv lives: row 0 of its q, k and v columns. */
struct heads {
  const bf16 *q, *k, *v;
  size_t ld;
};

__device__ __forceinline__ heads heads_of(const bf16 *qkv, int T, int C, int NKV, int hs, int b,
                                          int h, int j)
{
  heads x;
  x.ld = (size_t)C + 2 * (size_t)NKV * hs;
  const bf16 *base = qkv + (size_t)b * T * x.ld;
  x.q = base + (size_t)h * hs;
  x.k = base + C + (size_t)j * hs;
  x.v = base + C + (size_t)(NKV + j) * hs;
  return x;
}

/* ---- forward ----------------------------------------------------------------------- */

/* The online softmax of one row half (r = 0: row g, r = 1: row g + 8) of a warp's
 * score tiles s: s becomes exp(s sl2 - m sl2) with the new running max m, and the
 * accumulator o and the partial sum l are rescaled to it. Each row's 16 x BC scores are
 * spread over the 4 lanes of a quad, hence the two shuffles. */
template <int NS, int NO>
__device__ __forceinline__ void softmax_rows(float (&s)[NS][4], float (&o)[NO][4], float &m,
                                             float &l, int r, float sl2)
{
  float mx = m;
#pragma unroll
  for (int n = 0; n < NS; n++)
    mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  /* Every live row has a finite score in the first tile (key 0); the guard keeps a row
   * with none at exp2(-inf) = 0 rather than NaN. */
  const float ms = mx == -INFINITY ? 0.0f : mx * sl2;
  const float corr = exp2f(m * sl2 - ms);
  m = mx;
  l *= corr;
#pragma unroll
  for (int n = 0; n < NO; n++) {
    o[n][2 * r] *= corr;
    o[n][2 * r + 1] *= corr;
  }
#pragma unroll
  for (int n = 0; n < NS; n++) {
    s[n][2 * r] = exp2f(fmaf(s[n][2 * r], sl2, -ms));
    s[n][2 * r + 1] = exp2f(fmaf(s[n][2 * r + 1], sl2, -ms));
    l += s[n][2 * r] + s[n][2 * r + 1];
  }
}

/* Scores of keys after the query, at/after T or before the query's document start lo
 * (the thread's rows g and g + 8) become -inf; (row0, col0) is the tile's top-left element
 * in the (T, T) score matrix. */
template <int NS>
__device__ __forceinline__ void mask_scores(float (&s)[NS][4], int row0, int col0, int T,
                                            const int (&lo)[2])
{
  const int l = threadIdx.x % 32, g = l >> 2, q = l & 3;
#pragma unroll
  for (int n = 0; n < NS; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int row = row0 + g + (e >> 1) * 8, col = col0 + n * 8 + 2 * q + (e & 1);
      if (col > row || col >= T || col < lo[e >> 1])
        s[n][e] = -INFINITY;
    }
}

/* The document starts of the thread's rows g and g + 8 of the warp's 16 from row0 (0
 * without documents, or past T). */
__device__ __forceinline__ void row_starts(int (&lo)[2], const int *st, int row0, int T)
{
  const int g = (int)(threadIdx.x % 32) >> 2;
  for (int r = 0; r < 2; r++) {
    int row = row0 + g + 8 * r;
    lo[r] = st && row < T ? st[row] : 0;
  }
}

/* s (16 x BC per warp) += A B^T: A (16 x HS) as fragments in registers (Q, dO), B
 * (BC x HS) a row-major shared tile (K, V): S = Q K^T, dP = dO V^T. */
template <int HS, int BC>
__device__ __forceinline__ void qk_tile(float (&s)[BC / 8][4], const unsigned (&qf)[HS / 16][4],
                                        const bf16 *ks)
{
  constexpr int P = HS + WF_TILE_PAD;
#pragma unroll
  for (int kk = 0; kk < HS / 16; kk++)
#pragma unroll
    for (int np = 0; np < BC / 16; np++) {
      unsigned kf[4];
      wf__ldsm4(kf, wf__frag_bt(ks, P, np * 16, kk * 16));
      wf__mma(s[2 * np], qf[kk], kf[0], kf[1]);
      wf__mma(s[2 * np + 1], qf[kk], kf[2], kf[3]);
    }
}

/* acc (16 x HS per warp) += A B: A (16 x NK) the bf16 rounding of the accumulator tiles c
 * (P from S, dS, P^T, dS^T), B (NK x HS) a row-major shared tile read as is (V, dO, Q,
 * K): O += P V, dV += P^T dO, dK += dS^T Q, dQ += dS K. */
template <int HS, int NK>
__device__ __forceinline__ void acc_pb(float (&acc)[HS / 8][4], const float (&c)[NK / 8][4],
                                       const bf16 *t)
{
  constexpr int P = HS + WF_TILE_PAD;
#pragma unroll
  for (int kk = 0; kk < NK / 16; kk++) {
    unsigned pa[4];
    wf__pack_a(pa, c, kk);
#pragma unroll
    for (int dp = 0; dp < HS / 16; dp++) {
      unsigned tf[4];
      wf__ldsm4t(tf, wf__frag_b(t, P, kk * 16, dp * 16));
      wf__mma(acc[2 * dp], pa, tf[0], tf[1]);
      wf__mma(acc[2 * dp + 1], pa, tf[2], tf[3]);
    }
  }
}

/* The end of the forward: the row sums over the quad, lse, and O / l stored coalesced
 * through the shared tile ks (free: no load is in flight). */
template <int HS>
__device__ __forceinline__ void forward_store(bf16 *out, float *lse, bf16 *ks,
                                              const float (&o)[HS / 8][4], const float (&m)[2],
                                              float (&l)[2], int q0, int T, int C, int h)
{
  const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, g = lane >> 2;
  const int b = (int)blockIdx.y / (int)(C / HS), r0 = q0 + warp * 16;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    int row = r0 + g + 8 * r;
    if ((lane & 3) == 0 && row < T)
      lse[(size_t)blockIdx.y * T + row] = m[r] * rsqrtf((float)HS) + logf(l[r]);
  }
  wf__acc_to_smem(ks, HS + WF_TILE_PAD, o, warp * 16, 1.0f / l[0], 1.0f / l[1]);
  __syncthreads();
  wf__store_rows<64, HS, NTHREADS>(out + (size_t)b * T * C + (size_t)h * HS, (size_t)C, ks, q0, T);
}

/* out (B,T,C), lse (B,NH,T); grid (ceil(T / 64), B * NH), block NTHREADS. */
template <int HS>
__global__ void __launch_bounds__(NTHREADS)
    flash16_forward_kernel(bf16 *out, float *lse, const bf16 *qkv, const int *starts, int T, int C,
                           int NH, int NKV)
{
  constexpr int BR = 64, BC = 64, P = HS + WF_TILE_PAD;
  __shared__ __align__(16) bf16 ks[BC * P];
  __shared__ __align__(16) bf16 vs[BC * P]; /* holds Q first */
  const int h = (int)blockIdx.y % NH, b = (int)blockIdx.y / NH;
  const heads x = heads_of(qkv, T, C, NKV, HS, b, h, h / (NH / NKV));
  const int q0 = ((int)gridDim.x - 1 - (int)blockIdx.x) * BR; /* heaviest tiles first */
  const int warp = (int)threadIdx.x / 32, r0 = q0 + warp * 16;
  const float sl2 = rsqrtf((float)HS) * LOG2E;
  const int *st = starts ? starts + (size_t)b * T : nullptr;
  const int t0 = st ? st[q0] / BC : 0; /* the first key tile any row of the block sees */
  int lo[2];
  row_starts(lo, st, r0, T);

  wf__load_rows<BR, HS, NTHREADS>(vs, x.q, x.ld, q0, T);
  wf__cp_commit();
  wf__load_rows<BC, HS, NTHREADS>(ks, x.k, x.ld, t0 * BC, T);
  wf__cp_commit();
  wf__cp_wait<1>(); /* Q */
  __syncthreads();
  unsigned qf[HS / 16][4];
#pragma unroll
  for (int kk = 0; kk < HS / 16; kk++)
    wf__ldsm4(qf[kk], wf__frag_a(vs, P, warp * 16, kk * 16));
  __syncthreads(); /* every warp has its Q before V overwrites it */
  wf__load_rows<BC, HS, NTHREADS>(vs, x.v, x.ld, t0 * BC, T);
  wf__cp_commit();

  float o[HS / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int ntiles = (min(q0 + BR, T) - 1) / BC + 1; /* keys up to the tile's last row */
  for (int t = t0; t < ntiles; t++) {
    const int k0 = t * BC;
    wf__cp_wait<1>(); /* K_t (V_t may still be in flight) */
    __syncthreads();
    float s[BC / 8][4] = {};
    qk_tile<HS, BC>(s, qf, ks);
    wf__cp_wait<0>(); /* V_t */
    __syncthreads();  /* and every warp is done with K_t */
    if (t + 1 < ntiles) {
      wf__load_rows<BC, HS, NTHREADS>(ks, x.k, x.ld, k0 + BC, T);
      wf__cp_commit();
    }
    if (st || k0 + BC - 1 > r0 || k0 + BC > T)
      mask_scores(s, r0, k0, T, lo);
    softmax_rows(s, o, m[0], l[0], 0, sl2);
    softmax_rows(s, o, m[1], l[1], 1, sl2);
    acc_pb<HS, BC>(o, s, vs);
    __syncthreads(); /* every warp is done with V_t */
    if (t + 1 < ntiles) {
      wf__load_rows<BC, HS, NTHREADS>(vs, x.v, x.ld, k0 + BC, T);
      wf__cp_commit();
    }
  }
  forward_store<HS>(out, lse, ks, o, m, l, q0, T, C, h);
}

/* ---- backward ---------------------------------------------------------------------- */

/* D (B,NH,T) = sum over the head's hs of dout * out; HS / 8 lanes per (b, t, h) row,
 * 8 elements (16 bytes) each. */
template <int HS>
__global__ void flash16_dot_kernel(float *D, const bf16 *dout, const bf16 *out, int T, int NH,
                                   size_t rows)
{
  constexpr int G = HS / 8;
  const size_t total = rows * G, stride = (size_t)gridDim.x * blockDim.x;
  /* The loop condition is the block's (base is uniform), so whole warps shuffle. */
  for (size_t base = (size_t)blockIdx.x * blockDim.x; base < total; base += stride) {
    size_t i = base + threadIdx.x, row = i / G; /* (b T + t) NH + h: row * HS in out */
    float sum = 0.0f;
    if (i < total) {
      uint4 a = *reinterpret_cast<const uint4 *>(dout + row * HS + (i % G) * 8);
      uint4 c = *reinterpret_cast<const uint4 *>(out + row * HS + (i % G) * 8);
      const __nv_bfloat162 *a2 = reinterpret_cast<const __nv_bfloat162 *>(&a);
      const __nv_bfloat162 *c2 = reinterpret_cast<const __nv_bfloat162 *>(&c);
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float2 x = __bfloat1622float2(a2[e]), y = __bfloat1622float2(c2[e]);
        sum += x.x * y.x + x.y * y.y;
      }
    }
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, o, G);
    if (i < total && i % G == 0) {
      size_t bt = row / (size_t)NH, h = row % (size_t)NH, b = bt / (size_t)T, t = bt % (size_t)T;
      D[(b * NH + h) * T + t] = sum;
    }
  }
}

/* Probabilities p = exp(scale s - lse) of a warp's transposed score tiles sT (rows: keys
 * from row0, columns: queries from col0), 0 where the query precedes the key, is past T
 * or starts its document after the key; lse_s and st_s hold the tile's queries' lse and
 * document starts. */
template <int NS>
__device__ __forceinline__ void probs_t(float (&sT)[NS][4], int row0, int col0, int T,
                                        const float *lse_s, const int *st_s, float sl2)
{
  const int l = threadIdx.x % 32, g = l >> 2, q = l & 3;
#pragma unroll
  for (int n = 0; n < NS; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int key = row0 + g + (e >> 1) * 8, c = n * 8 + 2 * q + (e & 1), query = col0 + c;
      sT[n][e] = query < key || query >= T || key < st_s[c]
                     ? 0.0f
                     : exp2f(fmaf(sT[n][e], sl2, -lse_s[c] * LOG2E));
    }
}

/* Shared memory of the dK/dV kernel: the block's K and V tiles, the current query
 * tile's Q and dO, its lse, D and document starts. */
template <int HS> struct dkv_smem {
  static constexpr int BC = 64, BQ = HS == 128 ? 32 : 64, P = HS + WF_TILE_PAD;
  static constexpr size_t bytes = (size_t)(2 * BC + 2 * BQ) * P * sizeof(bf16) + 3 * BQ * 4;
};

/* Products of one query tile for the warp's 16 keys: dV += P^T dO, dK += dS^T Q. */
template <int HS>
__device__ __forceinline__ void dkv_tile(float (&dk)[HS / 8][4], float (&dv)[HS / 8][4],
                                         const bf16 *ks, const bf16 *vs, const bf16 *qs,
                                         const bf16 *dos, const float *lse_s, const float *D_s,
                                         const int *st_s, int key0, int q0, int T, float sl2)
{
  using S = dkv_smem<HS>;
  constexpr int BQ = S::BQ, P = S::P, NS = BQ / 8;
  const int warp = (int)threadIdx.x / 32, l = (int)threadIdx.x % 32, q = l & 3;
  float sT[NS][4] = {}, dpT[NS][4] = {};
#pragma unroll
  for (int kk = 0; kk < HS / 16; kk++) {
    unsigned ka[4], va[4];
    wf__ldsm4(ka, wf__frag_a(ks, P, warp * 16, kk * 16));
    wf__ldsm4(va, wf__frag_a(vs, P, warp * 16, kk * 16));
#pragma unroll
    for (int np = 0; np < BQ / 16; np++) {
      unsigned qf[4], df[4];
      wf__ldsm4(qf, wf__frag_bt(qs, P, np * 16, kk * 16));
      wf__ldsm4(df, wf__frag_bt(dos, P, np * 16, kk * 16));
      wf__mma(sT[2 * np], ka, qf[0], qf[1]);
      wf__mma(sT[2 * np + 1], ka, qf[2], qf[3]);
      wf__mma(dpT[2 * np], va, df[0], df[1]);
      wf__mma(dpT[2 * np + 1], va, df[2], df[3]);
    }
  }
  probs_t(sT, key0 + warp * 16, q0, T, lse_s, st_s, sl2);
#pragma unroll
  for (int n = 0; n < NS; n++)
#pragma unroll
    for (int e = 0; e < 4; e++)
      dpT[n][e] = sT[n][e] * (dpT[n][e] - D_s[n * 8 + 2 * q + (e & 1)]); /* dS^T */
  acc_pb<HS, BQ>(dv, sT, dos);
  acc_pb<HS, BQ>(dk, dpT, qs);
}

/* dK, dV of 64 keys of one (b, kv head j) into dqkv; grid (ceil(T / 64), B * NKV), block
 * NTHREADS, dkv_smem<HS>::bytes of dynamic shared memory. */
template <int HS>
__global__ void __launch_bounds__(NTHREADS)
    flash16_dkv_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse,
                       const float *D, const int *starts, int T, int C, int NH, int NKV)
{
  using S = dkv_smem<HS>;
  constexpr int BC = S::BC, BQ = S::BQ, P = S::P;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16 *ks = reinterpret_cast<bf16 *>(smem), *vs = ks + BC * P, *qs = vs + BC * P;
  bf16 *dos = qs + BQ * P;
  float *lse_s = reinterpret_cast<float *>(dos + BQ * P), *D_s = lse_s + BQ;
  int *st_s = reinterpret_cast<int *>(D_s + BQ);
  const int b = (int)blockIdx.y / NKV, j = (int)blockIdx.y % NKV, G = NH / NKV;
  const int *st = starts ? starts + (size_t)b * T : nullptr;
  const int key0 = (int)blockIdx.x * BC, warp = (int)threadIdx.x / 32;
  const float scale = rsqrtf((float)HS), sl2 = scale * LOG2E;
  heads x = heads_of(qkv, T, C, NKV, HS, b, j * G, j);
  wf__load_rows<BC, HS, NTHREADS>(ks, x.k, x.ld, key0, T);
  wf__load_rows<BC, HS, NTHREADS>(vs, x.v, x.ld, key0, T);
  wf__cp_commit();
  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
  for (int h = j * G; h < (j + 1) * G; h++) {
    const bf16 *qg = heads_of(qkv, T, C, NKV, HS, b, h, j).q;
    const bf16 *dg = dout + (size_t)b * T * C + (size_t)h * HS;
    const float *lh = lse + ((size_t)b * NH + h) * T, *Dh = D + ((size_t)b * NH + h) * T;
    for (int q0 = key0 / BQ * BQ; q0 < T; q0 += BQ) {
      if (st && st[q0] > key0 + BC - 1)
        break;         /* these queries, and every later one, start after all the block's keys */
      __syncthreads(); /* the previous tile's qs, dos, lse_s, D_s, st_s are read */
      wf__load_rows<BQ, HS, NTHREADS>(qs, qg, x.ld, q0, T);
      wf__load_rows<BQ, HS, NTHREADS>(dos, dg, (size_t)C, q0, T);
      wf__cp_commit();
      for (int r = (int)threadIdx.x; r < BQ; r += NTHREADS) {
        lse_s[r] = q0 + r < T ? lh[q0 + r] : 0.0f;
        D_s[r] = q0 + r < T ? Dh[q0 + r] : 0.0f;
        st_s[r] = st && q0 + r < T ? st[q0 + r] : 0;
      }
      wf__cp_wait<0>();
      __syncthreads();
      dkv_tile<HS>(dk, dv, ks, vs, qs, dos, lse_s, D_s, st_s, key0, q0, T, sl2);
    }
  }
  __syncthreads(); /* ks and vs become the output tiles; each warp writes its 16 rows */
  wf__acc_to_smem(ks, P, dk, warp * 16, scale, scale);
  wf__acc_to_smem(vs, P, dv, warp * 16, 1.0f, 1.0f);
  __syncthreads();
  heads dx = heads_of(dqkv, T, C, NKV, HS, b, j * G, j);
  wf__store_rows<BC, HS, NTHREADS>(const_cast<bf16 *>(dx.k), dx.ld, ks, key0, T);
  wf__store_rows<BC, HS, NTHREADS>(const_cast<bf16 *>(dx.v), dx.ld, vs, key0, T);
}

/* Shared memory of the dQ kernel: Q and dO of the block's queries (read into registers
 * once), the current key tile's K and V. */
template <int HS> struct dq_smem {
  static constexpr int BR = 64, BK = HS == 128 ? 32 : 64, P = HS + WF_TILE_PAD;
  static constexpr size_t bytes = (size_t)(2 * BR + 2 * BK) * P * sizeof(bf16);
};

/* One key tile for the warp's 16 queries: S, P, dP, dS, then dQ += dS K. */
template <int HS>
__device__ __forceinline__ void dq_tile(float (&dq)[HS / 8][4], const unsigned (&qf)[HS / 16][4],
                                        const unsigned (&df)[HS / 16][4], const bf16 *ks,
                                        const bf16 *vs, const float (&L)[2], const float (&Dr)[2],
                                        const int (&lo)[2], int row0, int k0, int T, float sl2)
{
  using S = dq_smem<HS>;
  constexpr int BK = S::BK, NS = BK / 8;
  const int l = (int)threadIdx.x % 32, g = l >> 2, q = l & 3;
  float s[NS][4] = {}, dp[NS][4] = {};
  qk_tile<HS, BK>(s, qf, ks);
  qk_tile<HS, BK>(dp, df, vs);
#pragma unroll
  for (int n = 0; n < NS; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int r = e >> 1, query = row0 + g + 8 * r, key = k0 + n * 8 + 2 * q + (e & 1);
      float p =
          key > query || key >= T || key < lo[r] ? 0.0f : exp2f(fmaf(s[n][e], sl2, -L[r] * LOG2E));
      dp[n][e] = p * (dp[n][e] - Dr[r]); /* dS */
    }
  acc_pb<HS, BK>(dq, dp, ks);
}

/* dQ of 64 queries of one (b, h) into dqkv; grid (ceil(T / 64), B * NH), block NTHREADS,
 * dq_smem<HS>::bytes of dynamic shared memory. */
template <int HS>
__global__ void __launch_bounds__(NTHREADS)
    flash16_dq_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse,
                      const float *D, const int *starts, int T, int C, int NH, int NKV)
{
  using S = dq_smem<HS>;
  constexpr int BR = S::BR, BK = S::BK, P = S::P;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16 *qs = reinterpret_cast<bf16 *>(smem), *dos = qs + BR * P, *ks = dos + BR * P;
  bf16 *vs = ks + BK * P;
  const int b = (int)blockIdx.y / NH, h = (int)blockIdx.y % NH;
  const int q0 = ((int)gridDim.x - 1 - (int)blockIdx.x) * BR; /* heaviest tiles first */
  const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, g = lane >> 2;
  const int row0 = q0 + warp * 16;
  const float scale = rsqrtf((float)HS), sl2 = scale * LOG2E;
  const heads x = heads_of(qkv, T, C, NKV, HS, b, h, h / (NH / NKV));
  const int *st = starts ? starts + (size_t)b * T : nullptr;
  int lo[2];
  row_starts(lo, st, row0, T);
  wf__load_rows<BR, HS, NTHREADS>(qs, x.q, x.ld, q0, T);
  wf__load_rows<BR, HS, NTHREADS>(dos, dout + (size_t)b * T * C + (size_t)h * HS, (size_t)C, q0, T);
  wf__cp_commit();
  float L[2], Dr[2];
  for (int r = 0; r < 2; r++) {
    int row = row0 + g + 8 * r;
    L[r] = row < T ? lse[(size_t)blockIdx.y * T + row] : 0.0f;
    Dr[r] = row < T ? D[(size_t)blockIdx.y * T + row] : 0.0f;
  }
  wf__cp_wait<0>();
  __syncthreads();
  unsigned qf[HS / 16][4], df[HS / 16][4];
#pragma unroll
  for (int kk = 0; kk < HS / 16; kk++) {
    wf__ldsm4(qf[kk], wf__frag_a(qs, P, warp * 16, kk * 16));
    wf__ldsm4(df[kk], wf__frag_a(dos, P, warp * 16, kk * 16));
  }
  float dq[HS / 8][4] = {};
  const int ntiles = (min(q0 + BR, T) - 1) / BK + 1;
  for (int t = st ? st[q0] / BK : 0; t < ntiles; t++) {
    __syncthreads(); /* the previous tile's ks and vs are read */
    wf__load_rows<BK, HS, NTHREADS>(ks, x.k, x.ld, t * BK, T);
    wf__load_rows<BK, HS, NTHREADS>(vs, x.v, x.ld, t * BK, T);
    wf__cp_commit();
    wf__cp_wait<0>();
    __syncthreads();
    dq_tile<HS>(dq, qf, df, ks, vs, L, Dr, lo, row0, t * BK, T, sl2);
  }
  __syncthreads(); /* qs becomes the output tile (Q is in registers) */
  wf__acc_to_smem(qs, P, dq, warp * 16, scale, scale);
  __syncthreads();
  bf16 *dq_out = dqkv + (size_t)b * T * x.ld + (size_t)h * HS;
  wf__store_rows<BR, HS, NTHREADS>(dq_out, x.ld, qs, q0, T);
}

/* Raise a kernel's dynamic shared memory limit once (above 48 KB it must be asked). */
template <typename K> bool smem_limit(K kernel, size_t bytes)
{
  return WF_CUDA_OK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <int HS>
void forward_launch(bf16 *out, float *lse, const bf16 *qkv, const int *st, int B, int T, int C,
                    int NH, int NKV, cudaStream_t s)
{
  dim3 grid((unsigned)((T + 63) / 64), (unsigned)(B * NH));
  flash16_forward_kernel<HS><<<grid, NTHREADS, 0, s>>>(out, lse, qkv, st, T, C, NH, NKV);
  WF_CUDA_LAUNCHED("flash16_forward_kernel");
}

template <int HS>
void backward_launch(bf16 *dqkv, float *D, const bf16 *dout, const bf16 *qkv, const bf16 *out,
                     const float *lse, const int *st, int B, int T, int C, int NH, int NKV,
                     cudaStream_t s)
{
  /* Once per process: weft drives one device per process (backend.cu). */
  static const bool dkv_ok = smem_limit(flash16_dkv_kernel<HS>, dkv_smem<HS>::bytes);
  static const bool dq_ok = smem_limit(flash16_dq_kernel<HS>, dq_smem<HS>::bytes);
  if (!dkv_ok || !dq_ok) { /* logged when it failed; every call that cannot run says so */
    wf__cuda_record((int)cudaErrorInvalidValue);
    return;
  }
  size_t rows = (size_t)B * T * NH;
  flash16_dot_kernel<HS>
      <<<wf__grid_1d(rows * (HS / 8), 256), 256, 0, s>>>(D, dout, out, T, NH, rows);
  if (!WF_CUDA_LAUNCHED("flash16_dot_kernel"))
    return;
  dim3 gk((unsigned)((T + 63) / 64), (unsigned)(B * NKV)),
      gq((unsigned)((T + 63) / 64), (unsigned)(B * NH));
  flash16_dkv_kernel<HS>
      <<<gk, NTHREADS, dkv_smem<HS>::bytes, s>>>(dqkv, dout, qkv, lse, D, st, T, C, NH, NKV);
  if (!WF_CUDA_LAUNCHED("flash16_dkv_kernel"))
    return;
  flash16_dq_kernel<HS>
      <<<gq, NTHREADS, dq_smem<HS>::bytes, s>>>(dqkv, dout, qkv, lse, D, st, T, C, NH, NKV);
  WF_CUDA_LAUNCHED("flash16_dq_kernel");
}

} /* namespace */

bool wf__flash16_applies(int B, int T, int C, int NH, int NKV, char *why, size_t len)
{
  int hs = NH > 0 && C % NH == 0 ? C / NH : 0;
  if (hs != 64 && hs != 128)
    snprintf(why, len, "head size %d (the flash kernels take 64 or 128)", hs);
  else if (B <= 0 || T <= 0)
    snprintf(why, len, "an empty batch (B %d, T %d)", B, T);
  else if (NKV <= 0 || NH % NKV != 0)
    snprintf(why, len, "%d kv heads do not divide %d heads", NKV, NH);
  else if ((size_t)B * NH > 65535)
    snprintf(why, len, "B x NH = %zu exceeds a grid's 65535 rows", (size_t)B * NH);
  else if (wf__cuda_cc_major() < 8)
    snprintf(why, len, "compute capability %d.x (mma.sync bf16 needs 8.0)", wf__cuda_cc_major());
  else
    return true;
  return false;
}

void wf__flash16_forward(wf_bf16 *out, float *lse, const wf_bf16 *qkv, const int *starts, int B,
                         int T, int C, int NH, int NKV, cudaStream_t s)
{
  bf16 *o = reinterpret_cast<bf16 *>(out);
  const bf16 *x = reinterpret_cast<const bf16 *>(qkv);
  if (C / NH == 64)
    forward_launch<64>(o, lse, x, starts, B, T, C, NH, NKV, s);
  else
    forward_launch<128>(o, lse, x, starts, B, T, C, NH, NKV, s);
}

void wf__flash16_backward(wf_bf16 *dqkv, float *D, const wf_bf16 *dout, const wf_bf16 *qkv,
                          const wf_bf16 *out, const float *lse, const int *starts, int B, int T,
                          int C, int NH, int NKV, cudaStream_t s)
{
  bf16 *dx = reinterpret_cast<bf16 *>(dqkv);
  const bf16 *dy = reinterpret_cast<const bf16 *>(dout), *x = reinterpret_cast<const bf16 *>(qkv);
  const bf16 *y = reinterpret_cast<const bf16 *>(out);
  if (C / NH == 64)
    backward_launch<64>(dx, D, dy, x, y, lse, starts, B, T, C, NH, NKV, s);
  else
    backward_launch<128>(dx, D, dy, x, y, lse, starts, B, T, C, NH, NKV, s);
}
