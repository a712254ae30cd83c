/*
 * test_round.c - rounding float32 to bf16 and fp16 (kernels/round.h): known values,
 * each with where its expected value comes from, then every exponent range against an
 * independent reference (double arithmetic: scale to the format's quantum, rint(),
 * scale back; and, for fp16, the compiler's own _Float16 conversion where it has one).
 *
 * Formats: bf16 has 8 significant bits (ulp of 1 is 2^-7) and fp32's exponent range;
 * fp16 has 11 significant bits (ulp of 1 is 2^-10), largest finite 65504 =
 * (2 - 2^-10) * 2^15, smallest normal 2^-14, subnormals on a grid of 2^-24.
 */
#include <float.h>
#include <stdbool.h>
#include <string.h>

#include "check.h"
#include "wf_kernels.h"

static float from_bits(uint32_t u)
{
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static uint32_t to_bits(float x)
{
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

typedef void (*round_fn)(float *dst, const float *src, size_t n);

/* in -> want, compared bit for bit (so -0 differs from +0); NaN only needs to be NaN. */
static void expect_round(round_fn fn, const char *name, float in, float want)
{
  float got = 0;
  fn(&got, &in, 1);
  bool ok = isnan(want) ? isnan(got) : to_bits(got) == to_bits(want);
  if (!ok) {
    print_error("%s(%a) = %a (bits %08x), expected %a (bits %08x)\n", name, (double)in, (double)got,
                to_bits(got), (double)want, to_bits(want));
    fail();
  }
}

#define BF16(in, want) expect_round(wf_round_bf16, "round_bf16", (in), (want))
#define FP16(in, want) expect_round(wf_round_fp16, "round_fp16", (in), (want))

static void test_bf16_known(void **state)
{
  BF16(1.0f, 1.0f); /* representable */
  /* 1 + 2^-8 is half an ulp (2^-7) above 1: a tie between 1 (significand even) and
   * 1 + 2^-7 (odd); ties go to even. */
  BF16(0x1.01p0f, 1.0f);
  BF16(-0x1.01p0f, -1.0f);
  /* 1 + 3 * 2^-9 = 1 + 0.75 ulp: nearer to 1 + 2^-7. */
  BF16(0x1.018p0f, 0x1.02p0f);
  /* 1 + 3 * 2^-8 = 1 + 1.5 ulp: a tie between 1 + 2^-7 (odd) and 1 + 2^-6 (even). */
  BF16(0x1.03p0f, 0x1.04p0f);
  /* 0.1f = 0x3dcccccd: the dropped 16 bits 0xcccd are above half (0x8000): up to
   * 0x3dcd0000 = 0.10009765625 (as torch.tensor(0.1).bfloat16() gives). */
  BF16(0.1f, 0.10009765625f);
  /* fp16's limits mean nothing to bf16: 65504 = 0x477fe000 and 65520 = 0x477ff000
   * both have dropped bits above half: up to 0x47800000 = 65536. */
  BF16(65504.0f, 65536.0f);
  BF16(65520.0f, 65536.0f);
  /* The largest bf16, (2 - 2^-7) * 2^127 = 0x7f7f0000, is representable. */
  BF16(from_bits(0x7f7f0000u), from_bits(0x7f7f0000u));
  /* 0x7f7f7fff is just below half an ulp above it: stays finite. */
  BF16(from_bits(0x7f7f7fffu), from_bits(0x7f7f0000u));
  /* 0x7f7f8000 is the tie between bf16 max (odd) and 2^128 (even, not representable):
   * IEEE roundTiesToEven overflows it to inf, as do FLT_MAX and CUDA's
   * __float2bfloat16_rn. The only finite floats that become inf: the top half ulp. */
  BF16(from_bits(0x7f7f8000u), INFINITY);
  BF16(FLT_MAX, INFINITY);
  BF16(-FLT_MAX, -INFINITY);
  /* Subnormals: bf16's grid there is 2^-133 (0x00010000); 2^-149 (0x00000001) is far
   * below half of it and becomes +0; 2^-133 itself stays. */
  BF16(from_bits(0x00000001u), 0.0f);
  BF16(from_bits(0x00010000u), from_bits(0x00010000u));
  BF16(-0.0f, -0.0f); /* the sign of zero is kept */
  BF16(INFINITY, INFINITY);
  BF16(-INFINITY, -INFINITY);
  BF16(NAN, NAN);
  /* A NaN whose payload is only in the dropped bits must not truncate to inf. */
  BF16(from_bits(0x7f800001u), NAN);
  BF16(from_bits(0xff800001u), NAN);
}

static void test_fp16_known(void **state)
{
  FP16(1.0f, 1.0f);
  /* 1 + 2^-8 and 1 + 3 * 2^-9 are multiples of fp16's ulp 2^-10: exact. */
  FP16(0x1.01p0f, 0x1.01p0f);
  FP16(0x1.018p0f, 0x1.018p0f);
  /* 1 + 2^-11 is a tie between 1 (even) and 1 + 2^-10 (odd): 1. 1 + 3 * 2^-11 is a
   * tie between 1 + 2^-10 (odd) and 1 + 2^-9 (even): 1 + 2^-9. (Python's
   * struct.pack('e', x) gives the same: 1.0 and 1.001953125.) */
  FP16(0x1.002p0f, 1.0f);
  FP16(0x1.006p0f, 0x1.008p0f);
  /* 0.1 -> 0x2e66 = 0.0999755859375 (struct.pack('e', 0.1)). */
  FP16(0.1f, 0.0999755859375f);
  /* The largest half, 65504 = (2 - 2^-10) * 2^15, stays; 65519 rounds down to it
   * (below the tie); 65520 = 65504 + half its ulp 32 is the tie between 65504 (odd)
   * and 65536 (even, out of range): inf, as __float2half_rn gives. This is fp16
   * overflow, which loss scaling avoids. */
  FP16(65504.0f, 65504.0f);
  FP16(65519.0f, 65504.0f);
  FP16(65520.0f, INFINITY);
  FP16(-65520.0f, -INFINITY);
  FP16(1e5f, INFINITY);
  FP16(FLT_MAX, INFINITY);
  /* Normal/subnormal boundary: 2^-14 is the smallest normal; 2^-14 - 2^-25 is 1023.5
   * subnormal quanta of 2^-24, a tie between 1023 (odd) and 1024 (even): 2^-14. */
  FP16(0x1p-14f, 0x1p-14f);
  FP16(0x1p-14f - 0x1p-25f, 0x1p-14f);
  /* Subnormals, quantum 2^-24: 2^-24 stays; 2^-25 is a tie between 0 (even) and 1
   * quantum: +0; 0.75 quantum -> 1; 1.5 quanta is a tie between 1 (odd) and 2
   * (even) -> 2^-23; 100.25 quanta -> 100 quanta (struct.pack('e') agrees on all). */
  FP16(0x1p-24f, 0x1p-24f);
  FP16(0x1p-25f, 0.0f);
  FP16(0x3p-26f, 0x1p-24f);
  FP16(0x3p-25f, 0x1p-23f);
  FP16(100.25f * 0x1p-24f, 100.0f * 0x1p-24f);
  /* Below half a quantum a negative value becomes -0, keeping its sign. */
  FP16(-1e-8f, -0.0f);
  FP16(-0.0f, -0.0f);
  FP16(INFINITY, INFINITY);
  FP16(-INFINITY, -INFINITY);
  FP16(NAN, NAN);
  FP16(from_bits(0x7f800001u), NAN);
}

/* The nearest value with `bits` significant bits, exponent at least emin (m * 2^e,
 * m in [0.5, 1): e >= emin is normal, below the grid stays 2^(emin - bits)), ties to
 * even, and inf above `max` after rounding. In double: every step is exact. */
static float reference(float x, int bits, int emin, double max)
{
  if (isnan(x) || isinf(x) || x == 0.0f)
    return x;
  int e;
  frexp(fabs((double)x), &e);
  double q = ldexp(1.0, (e < emin ? emin : e) - bits);
  double r = rint(fabs((double)x) / q) * q; /* rint: to nearest, ties to even */
  if (r > max)
    return copysignf(INFINITY, x);
  return copysignf((float)r, x);
}

#ifdef __FLT16_MAX__
/* The compiler's IEEE conversion, where the target has _Float16 (gcc >= 12 on x86-64):
 * a second, independent fp16 reference. */
static float via_float16(float x)
{
  __extension__ _Float16 h = (_Float16)x;
  return (float)h;
}
#endif

/* Random bit patterns over every exponent (both formats' subnormal, normal and
 * overflow ranges), the same in place and out of place. */
static void sweep(round_fn fn, const char *name, int bits, int emin, double max)
{
  enum { N = 1 << 20 };
  float *x = zeros(N), *y = zeros(N);
  uint64_t s = 12345;
  for (size_t i = 0; i < N; i++)
    x[i] = from_bits((uint32_t)(urand(&s) * 4294967296.0));
  fn(y, x, N);
  for (size_t i = 0; i < N; i++) {
    float want = reference(x[i], bits, emin, max);
    if (isnan(want) ? !isnan(y[i]) : to_bits(y[i]) != to_bits(want)) {
      print_error("%s(%a) = %a, reference %a\n", name, (double)x[i], (double)y[i], (double)want);
      fail();
    }
#ifdef __FLT16_MAX__
    if (bits == 11 && !isnan(x[i]) && to_bits(y[i]) != to_bits(via_float16(x[i]))) {
      print_error("%s(%a) = %a, _Float16 gives %a\n", name, (double)x[i], (double)y[i],
                  (double)via_float16(x[i]));
      fail();
    }
#endif
  }
  fn(x, x, N); /* in place */
  assert_memory_equal(x, y, N * sizeof *x);
  free(x);
  free(y);
}

/* bf16: 8 bits, normal from 2^-126 (m * 2^e with e >= -125), largest 0x7f7f0000. */
static void test_bf16_sweep(void **state)
{
  sweep(wf_round_bf16, "round_bf16", 8, -125, 0x1.fep127);
}

/* fp16: 11 bits, normal from 2^-14 (e >= -13), largest 65504. */
static void test_fp16_sweep(void **state) { sweep(wf_round_fp16, "round_fp16", 11, -13, 65504.0); }

int main(void)
{
  wf_kernels_set_threads(2);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bf16_known),
      cmocka_unit_test(test_fp16_known),
      cmocka_unit_test(test_bf16_sweep),
      cmocka_unit_test(test_fp16_sweep),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
