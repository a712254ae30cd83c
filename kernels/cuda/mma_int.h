/*
 * mma_int.h - private to the weft_cuda module: the warp-level tensor-core pieces the bf16
 * attention kernels are built from (sm_80 and later: cp.async, ldmatrix, mma.sync
 * m16n8k16 with bf16 inputs and fp32 accumulators), and the fragment layouts they use.
 *
 * Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), for lane l of a warp,
 * g = l / 4 and q = l % 4:
 *  - A (16 x 16, row-major), four 32-bit registers of two bf16 each:
 *      a[0] = A[g][2q, 2q+1]     a[1] = A[g+8][2q, 2q+1]
 *      a[2] = A[g][2q+8, 2q+9]   a[3] = A[g+8][2q+8, 2q+9]
 *  - B (16 x 8, "col": B[k][n] with k fastest in a register), two registers:
 *      b[0] = B[2q, 2q+1][g]     b[1] = B[2q+8, 2q+9][g]
 *  - C/D (16 x 8 fp32), four floats: c[0], c[1] = C[g][2q, 2q+1]; c[2], c[3] = C[g+8][...]
 * So the accumulators of two adjacent n-tiles (columns 0-7 and 8-15) are, register for
 * register, the A fragment of those 16 columns: pack_a() turns scores into the next
 * product's A operand without leaving registers (FlashAttention-2's trick).
 *
 * ldmatrix.x4 loads four 8x8 bf16 matrices from shared memory; lane l gives the address
 * of row l % 8 of matrix l / 8, and register i receives matrix i, lane l holding its row
 * l / 4, columns 2 (l % 4) and +1 (with .trans: its column l / 4, rows 2 (l % 4), +1).
 * The three address patterns below place the four matrices so that the registers come
 * out as the fragments above; each takes a row-major tile in shared memory with `pitch`
 * elements per row:
 *  - frag_a:  A = tile[r0 .. r0+15][c0 .. c0+15]                     -> a[0..3]
 *  - frag_bt: B[k][n] = tile[n][k] for n in n0 .. n0+15, k in c0 .. c0+15
 *             -> {b0, b1} of n-tile n0 in r[0], r[1], of n-tile n0+8 in r[2], r[3]
 *  - frag_b:  B[k][n] = tile[k][n] for k in k0 .. k0+15, n in n0 .. n0+15 (.trans)
 *             -> the same register order as frag_bt
 * Rows of a tile are padded to pitch = width + 8 elements (16 bytes): the 8 rows an
 * 8x8 load reads then start in 8 different 4-bank groups, so ldmatrix has no bank
 * conflicts, and every row start stays 16-byte aligned for cp.async.
 */
#ifndef WF_CUDA_MMA_INT_H
#define WF_CUDA_MMA_INT_H

#include <cuda_bf16.h>

#include "cuda_int.h"

typedef __nv_bfloat16 bf16;

#define WF_TILE_PAD 8 /* elements of padding per shared-memory row */

__device__ __forceinline__ unsigned wf__smem(const void *p)
{
  return (unsigned)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, asynchronously; zeros when !pred (src is not read). */
__device__ __forceinline__ void wf__cp16(void *dst, const void *src, bool pred)
{
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(wf__smem(dst)), "l"(src),
               "r"(pred ? 16 : 0));
}

__device__ __forceinline__ void wf__cp_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }

/* Wait until at most N of this thread's committed groups are still in flight. */
template <int N> __device__ __forceinline__ void wf__cp_wait(void)
{
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void wf__ldsm4(unsigned (&r)[4], const bf16 *p)
{
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(wf__smem(p)));
}

__device__ __forceinline__ void wf__ldsm4t(unsigned (&r)[4], const bf16 *p)
{
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(wf__smem(p)));
}

/* d (16x8) += a (16x16) b (16x8), bf16 products summed in fp32. */
__device__ __forceinline__ void wf__mma(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                        unsigned b1)
{
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats -> one register of two bf16 (lo in the low half), rounded to nearest even. */
__device__ __forceinline__ unsigned wf__pack(float lo, float hi)
{
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  unsigned u;
  memcpy(&u, &v, sizeof u);
  return u;
}

/* The A fragment of columns [16 kk, 16 kk + 16) of a warp's 16-row accumulator tiles
 * c[n][4] (n-tiles of 8 columns), rounded to bf16. */
template <int N>
__device__ __forceinline__ void wf__pack_a(unsigned (&a)[4], const float (&c)[N][4], int kk)
{
  a[0] = wf__pack(c[2 * kk][0], c[2 * kk][1]);
  a[1] = wf__pack(c[2 * kk][2], c[2 * kk][3]);
  a[2] = wf__pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = wf__pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

/* Lane addresses of the three ldmatrix patterns (see the top of the file). */
__device__ __forceinline__ const bf16 *wf__frag_a(const bf16 *t, int pitch, int r0, int c0)
{
  const int l = threadIdx.x % 32;
  return t + (size_t)(r0 + (l & 7) + ((l >> 3) & 1) * 8) * pitch + c0 + (l >> 4) * 8;
}

__device__ __forceinline__ const bf16 *wf__frag_bt(const bf16 *t, int pitch, int n0, int c0)
{
  const int l = threadIdx.x % 32;
  return t + (size_t)(n0 + (l & 7) + (l >> 4) * 8) * pitch + c0 + ((l >> 3) & 1) * 8;
}

__device__ __forceinline__ const bf16 *wf__frag_b(const bf16 *t, int pitch, int k0, int n0)
{
  const int l = threadIdx.x % 32;
  return t + (size_t)(k0 + (l & 7) + ((l >> 3) & 1) * 8) * pitch + n0 + (l >> 4) * 8;
}

/* rows [r0, r0 + R) of a (T, width HS) bf16 matrix at g (row stride ld elements) into
 * the shared tile s (pitch HS + WF_TILE_PAD), by the block's NT threads, asynchronously;
 * rows at or past T become zeros. */
template <int R, int HS, int NT>
__device__ __forceinline__ void wf__load_rows(bf16 *s, const bf16 *g, size_t ld, int r0, int T)
{
  constexpr int CH = HS / 8; /* 16-byte chunks per row */
  for (int e = threadIdx.x; e < R * CH; e += NT) {
    int r = e / CH, c = (e % CH) * 8;
    bool ok = r0 + r < T;
    wf__cp16(s + r * (HS + WF_TILE_PAD) + c, ok ? g + (size_t)(r0 + r) * ld + c : g, ok);
  }
}

/* rows [0, R) of the shared tile s into rows [r0, r0 + R) of g (row stride ld), 16 bytes
 * per thread and coalesced, skipping rows at or past T. */
template <int R, int HS, int NT>
__device__ __forceinline__ void wf__store_rows(bf16 *g, size_t ld, const bf16 *s, int r0, int T)
{
  constexpr int CH = HS / 8;
  for (int e = threadIdx.x; e < R * CH; e += NT) {
    int r = e / CH, c = (e % CH) * 8;
    if (r0 + r < T)
      *reinterpret_cast<uint4 *>(g + (size_t)(r0 + r) * ld + c) =
          *reinterpret_cast<const uint4 *>(s + r * (HS + WF_TILE_PAD) + c);
  }
}

/* A warp's accumulator tiles acc (N tiles of 8 columns: rows r0 + g and r0 + g + 8),
 * times f_lo (row r0 + g) and f_hi (row r0 + g + 8), into the shared tile s as bf16. */
template <int N>
__device__ __forceinline__ void wf__acc_to_smem(bf16 *s, int pitch, const float (&acc)[N][4],
                                                int r0, float f_lo, float f_hi)
{
  const int l = threadIdx.x % 32, g = l >> 2, q = l & 3;
  for (int n = 0; n < N; n++) {
    *reinterpret_cast<unsigned *>(s + (size_t)(r0 + g) * pitch + n * 8 + 2 * q) =
        wf__pack(acc[n][0] * f_lo, acc[n][1] * f_lo);
    *reinterpret_cast<unsigned *>(s + (size_t)(r0 + g + 8) * pitch + n * 8 + 2 * q) =
        wf__pack(acc[n][2] * f_hi, acc[n][3] * f_hi);
  }
}

#endif /* WF_CUDA_MMA_INT_H */
