/*
 * round.c - float32 -> nearest bf16 / fp16 value, as float32 (see round.h).
 *
 * Done on the bits, branch-free, so the loops vectorise (Debian's OpenBLAS has no
 * bf16 GEMM, and gcc's _Float16 conversions go through a libgcc call per element
 * without F16C): this is how mixed precision is emulated on the CPU. It gives the
 * numerics of bf16/fp16 GEMM operands, not their speed.
 *
 * Invariant: each output element is a pure function of its input element, so the
 * result does not depend on the thread split.
 */
#include <stdbool.h>

#include "cpu_int.h"
#include "wf_kernels.h"

static inline uint32_t bits_of(float x)
{
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static inline float float_of(uint32_t u)
{
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* bf16 keeps the top 16 bits. Adding 0x7fff plus the lowest kept bit rounds the
 * dropped 16 bits to nearest, ties to the even kept value; a carry into the exponent
 * is the correct next binade (and FLT_MAX's neighbourhood carries into inf). A NaN
 * could lose its only payload bits and turn into inf, so it gets the quiet bit. */
static inline float round_bf16(float x)
{
  uint32_t u = bits_of(x);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  uint32_t nan = (u | 0x00400000u) & 0xffff0000u;
  return float_of((u & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

#define FP16_MIN_NORMAL 0x38800000u /* 2^-14 */
#define FP16_OVERFLOW   0x477ff000u /* 65520: 65504 + half an ulp, the tie goes to inf */
#define F32_INF         0x7f800000u

/* fp16 keeps 10 of fp32's 23 fraction bits: the same carry trick on 13 dropped bits
 * for normal values. Below 2^-14 the grid is fixed at 2^-24, and adding 0.5 (whose
 * binade [0.5, 1) has ulp 2^-24) makes the FPU round to it, ties to even; the sum
 * minus 0.5 is exact. Computed on |x|, the sign put back last. */
static inline float round_fp16(float x)
{
  uint32_t u = bits_of(x), sign = u & 0x80000000u, a = u & 0x7fffffffu;
  uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u;
  uint32_t sub = bits_of((float_of(a) + 0.5f) - 0.5f);
  uint32_t r = a < FP16_MIN_NORMAL ? sub : normal;
  r = a >= FP16_OVERFLOW ? F32_INF : r;
  r = a > F32_INF ? a | 0x00400000u : r; /* NaN: kept, quiet */
  return float_of(sign | r);
}

WF__CLONES static void bf16_range(float *dst, const float *src, size_t lo, size_t hi)
{
#pragma omp simd
  for (size_t i = lo; i < hi; i++)
    dst[i] = round_bf16(src[i]);
}

WF__CLONES static void fp16_range(float *dst, const float *src, size_t lo, size_t hi)
{
#pragma omp simd
  for (size_t i = lo; i < hi; i++)
    dst[i] = round_fp16(src[i]);
}

struct round_task {
  float *dst;
  const float *src;
  size_t n;
  bool fp16;
};

static void round_share(void *p, int tid, int nt)
{
  const struct round_task *t = p;
  size_t lo, hi;
  wf__split(t->n, tid, nt, 16, &lo, &hi);
  if (t->fp16)
    fp16_range(t->dst, t->src, lo, hi);
  else
    bf16_range(t->dst, t->src, lo, hi);
}

void wf_round_bf16(float *dst, const float *src, size_t n)
{
  struct round_task t = {dst, src, n, false};
  wf__parallel(wf__threads_for(n), round_share, &t);
}

void wf_round_fp16(float *dst, const float *src, size_t n)
{
  struct round_task t = {dst, src, n, true};
  wf__parallel(wf__threads_for(n), round_share, &t);
}

/* ---- bf16 tensors (bf16.h) ------------------------------------------------------------ */

void wf_bf16_from_floats(wf_bf16 *dst, const float *src, size_t n)
{
  for (size_t i = 0; i < n; i++)
    dst[i] = wf_bf16_from_float(src[i]);
}

void wf_bf16_to_floats(float *dst, const wf_bf16 *src, size_t n)
{
  for (size_t i = 0; i < n; i++)
    dst[i] = wf_bf16_to_float(src[i]);
}

/* ---- the op (wf_kreg.h): the variant's type is the one rounded to ---------------------- */

static void to_f32(float *dst, const float *src, size_t n, wf_stream *s)
{
  if (dst != src)
    memmove(dst, src, n * sizeof *dst);
}

static void to_bf16(float *dst, const float *src, size_t n, wf_stream *s)
{
  wf_round_bf16(dst, src, n);
}

static void to_f16(float *dst, const float *src, size_t n, wf_stream *s)
{
  wf_round_fp16(dst, src, n);
}

static const wf_round_op f32 = {to_f32}, bf16 = {to_bf16}, f16 = {to_f16};
const wf_kvariants wf__cpu_round = WF_KV(round, WF_OP_VERSION_round, &f32, &bf16, &f16);
