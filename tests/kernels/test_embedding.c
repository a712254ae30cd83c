/*
 * test_embedding.c - the embedding and position ops (embedding.h, position.h) as GPT-2
 * composes them (check.h's encode), split over the vocabulary, against the whole
 * vocabulary and naive loops written here; and positions given explicitly.
 *
 * wte (V,C) is cut into tp equal slices, rank r holding rows [r V/tp, (r+1) V/tp),
 * for tp in {1, 2, 4}. Every comparison is bit-exact (0 ulp), and why it can be:
 *  - forward: each output element has at most two nonzero terms over all ranks (the
 *    one rank's wte row and rank 0's wpe row), and x + 0 = x, so the sum over ranks
 *    in rank order is the single float add wte + wpe that the whole table gives;
 *  - backward: every dwte or dwpe element gets the same dout terms in the same
 *    (b, t) order in the split and the whole kernel, and in the naive loop here.
 * The tokens hit the first and last row of every tp = 4 slice (so every slice of
 * every split), repeat (so rows accumulate), and the rest are random. dwte slices
 * sit between guard rows that must survive, so a token outside a rank's range that
 * wrote anyway, or a row index off by the offset, fails. Gradients start from random
 * values, so "adds into" is checked too. The large shape is above the 16384-element
 * threshold under which the CPU kernels run on one thread, so the threaded split
 * (columns per thread in backward, rows in forward) is covered.
 */
#include <stdbool.h>
#include <string.h>

#include "check.h"
#include "wf_kernels.h"

struct shape {
  int B, T, C, V, maxT;
};

/* Inputs and whole-vocabulary references for one shape. */
struct fix {
  struct shape s;
  int *inp;                             /* (B,T) */
  float *wte, *wpe, *dout;              /* (V,C), (maxT,C), (B,T,C) */
  float *dwte0, *dwpe0;                 /* (V,C), (maxT,C): the gradients' starting values */
  float *ref_out, *ref_dwte, *ref_dwpe; /* naive loops below */
};

/* V = 96 splits evenly 4 ways; C = 16 and T = 8 as small as the rules allow. */
static const struct shape SMALL = {.B = 2, .T = 8, .C = 16, .V = 96, .maxT = 10};
/* B T C = 20480 > 16384: the threaded paths run. */
static const struct shape LARGE = {.B = 4, .T = 64, .C = 80, .V = 96, .maxT = 67};

static size_t btc(const struct shape *s) { return (size_t)s->B * s->T * s->C; }

static void make_tokens(int *inp, const struct shape *s, uint64_t *rng)
{
  int BT = s->B * s->T, q = s->V / 4, k = 0;
  for (int r = 0; r < 4 && k + 1 < BT; r++) { /* first and last row of every slice */
    inp[k++] = r * q;
    inp[k++] = r * q + q - 1;
  }
  for (; k < BT; k++)
    inp[k] = (int)(urand(rng) * s->V);
  inp[8] = inp[9] = 5;          /* a repeat inside rank 0's slice for every tp */
  inp[10] = inp[11] = s->V - 1; /* a repeat of the last row, also seen at inp[7] */
}

static void naive_forward(float *out, const struct fix *f)
{
  const struct shape *s = &f->s;
  for (int bt = 0; bt < s->B * s->T; bt++)
    for (int c = 0; c < s->C; c++)
      out[(size_t)bt * s->C + c] =
          f->wte[(size_t)f->inp[bt] * s->C + c] + f->wpe[(size_t)(bt % s->T) * s->C + c];
}

static void naive_backward(float *dwte, float *dwpe, const struct fix *f)
{
  const struct shape *s = &f->s;
  for (int bt = 0; bt < s->B * s->T; bt++)
    for (int c = 0; c < s->C; c++) {
      float d = f->dout[(size_t)bt * s->C + c];
      dwte[(size_t)f->inp[bt] * s->C + c] += d;
      dwpe[(size_t)(bt % s->T) * s->C + c] += d;
    }
}

static float *copy(const float *x, size_t n)
{
  float *y = malloc(n * sizeof *y);
  memcpy(y, x, n * sizeof *y);
  return y;
}

static void fix_init(struct fix *f, const struct shape *s, uint64_t seed)
{
  uint64_t rng = seed;
  size_t VC = (size_t)s->V * s->C, PC = (size_t)s->maxT * s->C, N = btc(s);
  f->s = *s;
  f->inp = malloc((size_t)s->B * s->T * sizeof *f->inp);
  make_tokens(f->inp, s, &rng);
  f->wte = zeros(VC), f->wpe = zeros(PC), f->dout = zeros(N);
  f->dwte0 = zeros(VC), f->dwpe0 = zeros(PC);
  fill(f->wte, VC, -1, 1, &rng);
  fill(f->wpe, PC, -1, 1, &rng);
  fill(f->dout, N, -1, 1, &rng);
  fill(f->dwte0, VC, -1, 1, &rng);
  fill(f->dwpe0, PC, -1, 1, &rng);
  f->ref_out = zeros(N);
  naive_forward(f->ref_out, f);
  f->ref_dwte = copy(f->dwte0, VC), f->ref_dwpe = copy(f->dwpe0, PC);
  naive_backward(f->ref_dwte, f->ref_dwpe, f);
}

static void fix_fini(struct fix *f)
{
  free(f->inp), free(f->wte), free(f->wpe), free(f->dout), free(f->dwte0), free(f->dwpe0);
  free(f->ref_out), free(f->ref_dwte), free(f->ref_dwpe);
}

/* got == want bit for bit. */
static void expect_same(const char *what, int tp, const float *got, const float *want, size_t n)
{
  for (size_t i = 0; i < n; i++) {
    if (memcmp(&got[i], &want[i], sizeof *got) != 0) {
      print_error("%s (tp %d)[%zu]: got %.9g, expected %.9g\n", what, tp, i, got[i], want[i]);
      fail();
    }
  }
}

/* ---- forward ------------------------------------------------------------------- */

/* One rank's output by the definition in kernels/embedding.h. */
static void expect_rank_out(const float *out, const struct fix *f, int tp, int r)
{
  const struct shape *s = &f->s;
  int Vl = s->V / tp, lo = r * Vl;
  for (int bt = 0; bt < s->B * s->T; bt++) {
    int tok = f->inp[bt];
    bool mine = tok >= lo && tok < lo + Vl;
    for (int c = 0; c < s->C; c++) {
      float w = f->wte[(size_t)tok * s->C + c], p = f->wpe[(size_t)(bt % s->T) * s->C + c];
      float want = r == 0 ? (mine ? w + p : p) : (mine ? w : 0.0f);
      expect_same("rank out", tp, &out[(size_t)bt * s->C + c], &want, 1);
    }
  }
}

static void check_forward(const struct shape *s)
{
  struct fix f;
  fix_init(&f, s, 7);
  size_t N = btc(s);
  float *whole = nans(N), *sum = zeros(N), *out = nans(N);
  encode(whole, f.inp, f.wte, 0, INT_MAX, f.wpe, s->B, s->T, s->C);
  expect_same("whole forward", 0, whole, f.ref_out, N);
  for (int tp = 1; tp <= 4; tp *= 2) {
    int Vl = s->V / tp;
    for (int r = 0; r < tp; r++) {
      for (size_t i = 0; i < N; i++)
        out[i] = NAN; /* an element the kernel leaves unwritten stays NaN and fails */
      encode(out, f.inp, f.wte + (size_t)r * Vl * s->C, r * Vl, Vl, r == 0 ? f.wpe : NULL, s->B,
             s->T, s->C);
      expect_rank_out(out, &f, tp, r);
      for (size_t i = 0; i < N; i++)
        sum[i] = r == 0 ? out[i] : sum[i] + out[i];
    }
    expect_same("sum of forward_vp", tp, sum, whole, N);
  }
  free(whole), free(sum), free(out);
  fix_fini(&f);
}

static void test_forward_split(void **state)
{
  (void)state;
  check_forward(&SMALL);
}

static void test_forward_split_threaded(void **state)
{
  (void)state;
  check_forward(&LARGE);
}

/* ---- backward ------------------------------------------------------------------ */

#define GUARD 1234.5f /* not a sum any of these gradients can reach */

/* Rank r's backward into a dwte slice between one guard row on each side (NULL
 * when !with_dwte) and a fresh dwpe (NULL when !with_dwpe); the slice lands in
 * cat (V,C) and the dwpe result is compared with the reference. */
static void rank_backward(float *cat, const struct fix *f, int tp, int r, bool with_dwte,
                          bool with_dwpe)
{
  const struct shape *s = &f->s;
  int Vl = s->V / tp, C = s->C;
  size_t VlC = (size_t)Vl * C, PC = (size_t)s->maxT * C;
  float *buf = malloc((VlC + 2 * (size_t)C) * sizeof *buf);
  for (size_t i = 0; i < VlC + 2 * (size_t)C; i++)
    buf[i] = GUARD;
  float *dwte = buf + C;
  memcpy(dwte, f->dwte0 + (size_t)r * VlC, VlC * sizeof *dwte);
  float *dwpe = copy(f->dwpe0, PC);
  encode_backward(with_dwte ? dwte : NULL, with_dwpe ? dwpe : NULL, f->dout, f->inp, r * Vl, Vl,
                  s->B, s->T, C);
  for (int c = 0; c < C; c++) {
    float g = GUARD;
    expect_same("guard row before the slice", tp, &buf[c], &g, 1);
    expect_same("guard row after the slice", tp, &buf[C + VlC + c], &g, 1);
  }
  memcpy(cat + (size_t)r * VlC, dwte, VlC * sizeof *dwte);
  expect_same("rank dwpe", tp, dwpe, with_dwpe ? f->ref_dwpe : f->dwpe0, PC);
  free(buf), free(dwpe);
}

static void check_backward(const struct shape *s, bool with_dwte, bool with_dwpe)
{
  struct fix f;
  fix_init(&f, s, 11);
  size_t VC = (size_t)s->V * s->C, PC = (size_t)s->maxT * s->C;
  float *dwte = copy(f.dwte0, VC), *dwpe = copy(f.dwpe0, PC), *cat = nans(VC);
  encode_backward(dwte, dwpe, f.dout, f.inp, 0, INT_MAX, s->B, s->T, s->C);
  expect_same("whole backward dwte", 0, dwte, f.ref_dwte, VC);
  expect_same("whole backward dwpe", 0, dwpe, f.ref_dwpe, PC);
  for (int tp = 1; tp <= 4; tp *= 2) {
    for (int r = 0; r < tp; r++)
      rank_backward(cat, &f, tp, r, with_dwte, with_dwpe);
    expect_same("concatenated dwte", tp, cat, with_dwte ? dwte : f.dwte0, VC);
  }
  free(dwte), free(dwpe), free(cat);
  fix_fini(&f);
}

static void test_backward_split(void **state)
{
  (void)state;
  check_backward(&SMALL, true, true);
}

static void test_backward_split_threaded(void **state)
{
  (void)state;
  check_backward(&LARGE, true, true);
}

/* dwte NULL: only dwpe, unchanged by the split; dwte slices keep their values. */
static void test_backward_no_dwte(void **state)
{
  (void)state;
  check_backward(&SMALL, false, true);
  check_backward(&LARGE, false, true);
}

static void test_backward_no_dwpe(void **state)
{
  (void)state;
  check_backward(&SMALL, true, false);
}

/* ---- a slice that holds none of the tokens ------------------------------------- */

static void test_outside_every_range(void **state)
{
  (void)state;
  struct fix f;
  fix_init(&f, &SMALL, 13);
  const struct shape *s = &f.s;
  enum { VL = 8 };
  size_t N = btc(s), C = (size_t)s->C, PC = (size_t)s->maxT * C;
  uint64_t rng = 3;
  float *rows = zeros((VL + 2) * C), *before;
  fill(rows, (VL + 2) * C, -1, 1, &rng);
  before = copy(rows, (VL + 2) * C);
  /* rows [V, V + 8): past the vocabulary, so no token is in range */
  float *out = nans(N), *dwpe = copy(f.dwpe0, PC);
  encode(out, f.inp, rows + C, s->V, VL, NULL, s->B, s->T, s->C);
  for (size_t i = 0; i < N; i++)
    expect_same("out without wpe or rows", 0, &out[i], &(float){0.0f}, 1);
  encode(out, f.inp, rows + C, s->V, VL, f.wpe, s->B, s->T, s->C);
  for (size_t bt = 0; bt < (size_t)s->B * s->T; bt++)
    expect_same("out with wpe only", 0, out + bt * C, f.wpe + (bt % (size_t)s->T) * C, C);
  encode_backward(rows + C, dwpe, f.dout, f.inp, s->V, VL, s->B, s->T, s->C);
  expect_same("dwte rows of a slice no token is in", 0, rows, before, (VL + 2) * C);
  expect_same("dwpe", 0, dwpe, f.ref_dwpe, PC);
  free(out), free(dwpe), free(rows), free(before);
  fix_fini(&f);
}

/* ---- positions given explicitly ------------------------------------------------
 * A pos array (packed documents, a context-parallel chunk) picks each row's wpe row:
 * forward adds exactly that row (one float add onto the embedded token), backward sums
 * each row of dwpe over the rows whose position it is, in row order. Positions run
 * backwards here and repeat, so a kernel that used t instead, or wrote instead of
 * adding, fails. Both compared bit for bit with loops written here. */
static void check_positions(const struct shape *s)
{
  struct fix f;
  fix_init(&f, s, 17);
  int BT = s->B * s->T, C = s->C;
  size_t N = btc(s), PC = (size_t)s->maxT * C;
  int *pos = malloc((size_t)BT * sizeof *pos);
  for (int r = 0; r < BT; r++)
    pos[r] = (s->maxT - 1 - r % s->maxT + (r / 3) % 2) % s->maxT;
  float *out = copy(f.dout, N), *want = copy(f.dout, N);
  wf_position_forward(out, f.wpe, pos, s->B, s->T, C);
  for (int r = 0; r < BT; r++)
    for (int c = 0; c < C; c++)
      want[(size_t)r * C + c] += f.wpe[(size_t)pos[r] * C + c];
  expect_same("positions forward", 0, out, want, N);
  float *dwpe = copy(f.dwpe0, PC), *ref = copy(f.dwpe0, PC);
  wf_position_backward(dwpe, f.dout, pos, s->B, s->T, C);
  for (int r = 0; r < BT; r++)
    for (int c = 0; c < C; c++)
      ref[(size_t)pos[r] * C + c] += f.dout[(size_t)r * C + c];
  expect_same("positions backward", 0, dwpe, ref, PC);
  free(pos), free(out), free(want), free(dwpe), free(ref);
  fix_fini(&f);
}

static void test_positions_given(void **state)
{
  (void)state;
  check_positions(&SMALL);
  check_positions(&LARGE);
}

int main(void)
{
  /* two threads even on one core, so the threaded paths run */
  wf_kernels_set_threads(2);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forward_split),       cmocka_unit_test(test_forward_split_threaded),
      cmocka_unit_test(test_backward_split),      cmocka_unit_test(test_backward_split_threaded),
      cmocka_unit_test(test_backward_no_dwte),    cmocka_unit_test(test_backward_no_dwpe),
      cmocka_unit_test(test_outside_every_range), cmocka_unit_test(test_positions_given),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
