/*
 * cpu_int.h - helpers shared by the CPU kernels; private to kernels/cpu.
 *
 * Threading model (why it is this way): one thread pool (threads.c) runs everything.
 * OpenBLAS is pinned to one thread and every large GEMM is split by wf__sgemm into
 * one single-threaded OpenBLAS call per pool thread. OpenBLAS's own pthreads keep
 * spinning after each call; measured on the 2-core machine, alternating a 2-thread
 * OpenBLAS GEMM with a 2-thread OpenMP loop cost ~1.5-2x the sum of the two alone,
 * while the single pool costs the sum. So no two pools ever compete for the cores.
 *
 * Invariants: the work split depends only on the sizes and the thread budget, and
 * reductions combine per-thread partials in thread order, so a kernel gives
 * bit-identical results for the same inputs and the same wf_kernels_set_threads().
 */
#ifndef WF_KERNELS_CPU_INT_H
#define WF_KERNELS_CPU_INT_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cblas.h>

/* Below this many elements (or multiply-adds for GEMMs) a loop runs on one thread:
 * waking the pool costs a few microseconds. */
#define WF__PAR_MIN 16384

/* Hot elementwise loops are compiled for AVX-512, AVX2 and baseline x86-64 and the
 * best one is picked at load time (ifunc): the build stays portable, and the exp/tanh
 * loops run ~3x faster on this project's machines than with SSE2 alone. With gcc
 * (ISO C: no FMA contraction) elementwise results are the same in every clone; sums
 * may round differently on machines with other vector widths, never between runs.
 * A cloned function's name must be unique among the kernels' files even when static:
 * clang makes its ifunc resolver (NAME.resolver) a global symbol. */
/* No clones under ThreadSanitizer: it instruments the ifunc resolver, which runs
 * before the sanitizer's runtime is up, and crashes. */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define WF__CLONES
#endif
#endif
#if defined(__SANITIZE_THREAD__) && !defined(WF__CLONES)
#define WF__CLONES
#endif
#if defined(__x86_64__) && defined(__has_attribute) && !defined(WF__CLONES)
#if __has_attribute(target_clones)
#define WF__CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef WF__CLONES
#define WF__CLONES
#endif

/* The thread budget (>= 1); the first call pins OpenBLAS to one thread. */
int wf__threads(void);

/* Runs fn(ctx, tid, nt) for every tid in [0, nt) on the kernels' pool (tid 0 on the
 * caller) and returns when all are done (threads.c). */
typedef void (*wf__task_fn)(void *ctx, int tid, int nt);
void wf__parallel(int nt, wf__task_fn fn, void *ctx);

/* Threads to use for `work` units: 1 when the work is too small to pay. */
static inline int wf__threads_for(size_t work) { return work < WF__PAR_MIN ? 1 : wf__threads(); }

/* [*lo, *hi): the share of thread `tid` of `nt` in n items; boundaries are
 * multiples of `align` so that threads do not share cache lines. */
static inline void wf__split(size_t n, int tid, int nt, size_t align, size_t *lo, size_t *hi)
{
  size_t per = (n + (size_t)nt - 1) / (size_t)nt;
  per = (per + align - 1) / align * align;
  size_t a = (size_t)tid * per;
  *lo = a < n ? a : n;
  *hi = a + per < n ? a + per : n;
}

/* dst[c] += src[c] for c in [lo, hi). */
static inline void wf__add_row(float *dst, const float *src, size_t lo, size_t hi)
{
#pragma omp simd
  for (size_t c = lo; c < hi; c++)
    dst[c] += src[c];
}

/* Row-major C (M,N) = alpha op(A) op(B) + beta C, split over the larger of M and N
 * across the thread budget (single-threaded OpenBLAS inside each share). */
void wf__sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* A backward GEMM's dinp (N, C of `width` bytes each; NULL: none) is written, not added
 * into (matmul.h): whether there is a GEMM to run (N, C and OC positive); with no OC the
 * empty sum, 0, is written into dinp (matmul.c). */
bool wf__dinp_has_terms(void *dinp, size_t width, int N, int C, int OC);

/* ---- 16-bit storage (storage.c) ------------------------------------------------------
 * dst[0, n) = elements [first, first + n) of src, stored in format fmt (storage.h),
 * widened; and elements [first, first + n) of dst = src[0, n) stored rounded. Serial
 * (for a task's own range). */
void wf__load(float *dst, const void *src, size_t first, size_t n, int fmt);
void wf__store(void *dst, size_t first, const float *src, size_t n, int fmt);
/* This thread's working memory number `slot` (0-7) of at least n floats, 64-byte
 * aligned, kept for the next call (NULL when memory ran out: logged, and reported by
 * wf__work_failed). */
float *wf__work(int slot, size_t n);
bool wf__work_failed(void);
/* Row-blocked 16-bit forms (rmsnorm.c, rope.c, swiglu.c): a block of rows at a time,
 * the activations widened (exactly) into the calling thread's working memory, the fp32
 * kernel run on the block, its activation output stored rounded. Rows of `width` floats
 * per block (at least one), and rows [r0, r0 + n) of src widened into working slot
 * `slot` (NULL when memory ran out). Their slots: 4, 5, 6 (attention's 0..5 and the
 * GEMMs' never run inside them). */
enum { WF__W_DY = 4, WF__W_IN = 5, WF__W_OUT = 6 };
size_t wf__block_rows(size_t width);
float *wf__widened(int slot, const void *src, size_t r0, size_t n, size_t width, int fmt);
/* A GEMM's bias (n) rounded to format fmt and widened, as a 16-bit output's GEMM adds it
 * (matmul.h's op): in this thread's working slot 3 (free while a GEMM runs: matmul.c's
 * take 0-2, oneDNN's 7). NULL when bias is NULL or memory ran out (wf__work_failed). */
const float *wf__bias_rounded(const float *bias, size_t n, int fmt);

/* out (N) = a + b with out and a in format fmt (WF_DT_F32 or 16-bit), b fp32 (residual.c):
 * the fused residual-and-norm ops compose it with their norm. */
void wf__residual_forward_as(void *out, const void *a, const float *b, size_t N, int fmt);

/* GELU's forward on out and inp in format fmt (gelu.c): the matmul + GELU op composes it. */
void wf__gelu_forward_as(void *out, const void *inp, size_t N, int fmt);

/* ---- bf16 GEMMs through oneDNN (dnnl.c) ----------------------------------------------
 * Whether bf16 GEMMs go through oneDNN on this CPU (AVX512_BF16 and a bf16 kernel), and
 * the GEMMs themselves: the arguments of matmul.h's 16-bit forms in bf16 (out, or out32
 * when not NULL; dinp, or dinp32 when not NULL). wf__dnnl_failed: a GEMM failed since the
 * last call (logged). */
bool wf__dnnl_bf16(void);
void wf__dnnl_forward(void *out, float *out32, const void *inp, const void *weight,
                      const float *bias, int N, int C, int OC);
void wf__dnnl_backward(void *dinp, float *dinp32, float *dweight, float *dbias, const void *dout,
                       const void *inp, const void *weight, int N, int C, int OC);
bool wf__dnnl_failed(void);

/* exp(x) in float, vectorisable (no libm call): n = round(x log2 e), r = x - n ln2 in
 * two parts (Cody-Waite), exp(r) by Cephes' degree-6 polynomial (~1 ulp on
 * |r| <= ln2/2), times 2^n built in the exponent bits. x < -87.3 gives 0, x > 88
 * saturates at e^88; NaN stays NaN. Used where a loop does millions of exps
 * (softmax, cross-entropy, GELU), since glibc's expf/tanhf do not vectorise. */
static inline float wf__expf(float x)
{
  float xc = x < -87.3f ? -87.3f : (x > 88.0f ? 88.0f : x);
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float z = r * r;
  float p = (((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +
               4.1665795894e-2f) *
                  r +
              1.6666665459e-1f) *
                 r +
             5.0000001201e-1f) *
                z +
            r + 1.0f;
  int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  float y = p * scale;
  return x < -87.3f ? 0.0f : y;
}

/* max of x[0..n), n >= 1. Eight running maxima that compilers turn into vector
 * max instructions (an `omp simd reduction(max)` does not vectorise in clang). A NaN
 * element is skipped here, but it still poisons the exp sums that follow. */
static inline float wf__maxf(const float *x, int n)
{
  float m[8];
  for (int l = 0; l < 8; l++)
    m[l] = x[0];
  int j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; l++)
      m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  for (; j < n; j++)
    m[0] = x[j] > m[0] ? x[j] : m[0];
  for (int l = 1; l < 8; l++)
    m[0] = m[l] > m[0] ? m[l] : m[0];
  return m[0];
}

/* tanh(x) = sign(x) (1 - e) / (1 + e) with e = exp(-2|x|): absolute error ~1e-7. */
static inline float wf__tanhf(float x)
{
  float e = wf__expf(-2.0f * fabsf(x));
  return copysignf((1.0f - e) / (1.0f + e), x);
}

#endif /* WF_KERNELS_CPU_INT_H */
