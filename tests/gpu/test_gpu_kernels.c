/*
 * test_gpu_kernels.c - every CUDA kernel against its CPU twin: the cases' buffers and
 * comparisons, their table and main; the cases are in twin_<family>.c, one file per op family.
 *
 * Each case draws random inputs (Philox, fixed seed) with odd sizes, so that no
 * size is a multiple of a warp, tile or block, runs the CPU kernel
 * (kernels/cpu, the reference) and the CUDA launcher from the module's table on
 * copies of the same buffers, and compares every output element:
 *     |gpu - cpu| <= atol + rtol * |cpu|
 * Backward cases start the gradient buffers from random values, not zeros, so
 * that "adds into" is checked as well as the value added, and so is "writes" (matmul's
 * dinp, GELU's, SwiGLU's and attention's input gradients: wf_kernels.h), where an
 * addition would leave the random start in.
 *
 * Tolerances, and why:
 *  - TOL_EXACT (1e-6): one or two float operations per element (residual,
 *    scale, embedding and position forward): any difference is an indexing bug.
 *  - TOL_ELEM (2e-5): elementwise with exp/tanh/sqrt (GELU, AdamW, the loss):
 *    CUDA's expf/tanhf are within 2 ulp and the CPU twin's vectorised ones within
 *    a few ulp, i.e. ~1e-6 relative; 2e-5 leaves margin, a wrong formula is off
 *    by far more.
 *  - TOL_SUM (1e-4): reductions over up to a few hundred terms in a different
 *    order (GEMMs, layernorm, attention, softmax, atomics): float32 rounding
 *    grows like (terms x 6e-8 x magnitude), about 1e-5 for these sizes.
 *  - sumsq and the loss mean are accumulated in double on both sides: relative 1e-9
 *    (the GPU adds in another order; double's 2^-53 over 3e5 terms is ~1e-11).
 *  - xent_pack, tokens_check, checksum: exact (they move or find values, or add
 *    integers).
 *  - embedding and position backward: bit for bit. They add in the twin's order
 *    (embedding.cu, position.cu), so any
 *    difference is an order or indexing bug; and run twice, it gives the same bits.
 *  - column sums over many rows (TOL_COLSUM, 2e-3 absolute): each side adds 8192 terms
 *    in [-1, 1] in its own order; a sum's rounding error grows like sqrt(n) 2^-24
 *    sqrt(sum x^2), about 3e-4 here for either side, so 2e-3 leaves margin, while a lost
 *    or doubled row block (32 or more rows, each term up to 1) is off by far more.
 *  - round_bf16 / round_fp16 must agree bit for bit (the CPU twin's bit arithmetic
 *    against CUDA's __float2bfloat16_rn / __float2half_rn), NaN against NaN.
 *  - The 16-bit tables (storage.h: bf16 and fp16 activations) against the CPU's 16-bit
 *    tables: storing and loading bit for bit; fp32 outputs (statistics, gradients) at the
 *    fp32 tolerances above, since both sides compute in fp32 from the same 16-bit
 *    inputs; a 16-bit output may in addition round the other way where the two fp32
 *    values straddle a rounding boundary, one step of the format: 2^-7 |x| (bf16, 8
 *    significant bits) or 2^-10 |x| (fp16, 11), plus fp16's subnormal step 2^-24.
 *  - attention on tensor cores (cuDNN, the bf16 flash kernels) against the fp32 CPU
 *    attention: tests/common/att16_bound.h's per-element bound, derived there from bf16's
 *    unit roundoff 2^-8 at the points the bf16 paths round (weft's flash kernels round
 *    exactly where the bound assumes; cuDNN's internal rounding points are not
 *    documented, so it gets twice the bound).
 *  - the fused bf16 classifier against its CPU twin: statistics and losses TOL_SUM
 *    (fp32 sums against the twin's double); each dlogit within one bf16 step of the
 *    twin's (both round an fp32 value that differs in its last bits: 2^-7 relative).
 *
 * Exits 77 (meson: skipped) only when the machine has no GPU (wf_gpu_open says
 * WF_ENODEV: no NVIDIA driver, or it reports no device), after printing why. A GPU
 * that is there but unusable (the module or a CUDA library does not load) fails.
 */
#include "twin.h"

/* ---- buffers (all released by end_case) ----------------------------------------- */

void *keep_host(ctx *c, void *p)
{
  if (!p || c->n_host == MAX_BUFS) {
    fprintf(stderr, "out of host buffers\n");
    exit(1);
  }
  c->host[c->n_host++] = p;
  return p;
}

float *hzero(ctx *c, size_t n) { return keep_host(c, calloc(n ? n : 1, sizeof(float))); }

/* Uniform in [lo, hi), a fresh RNG stream per buffer. */
float *hrand(ctx *c, size_t n, float lo, float hi)
{
  float *p = hzero(c, n);
  uint64_t s = c->draw++;
  for (size_t i = 0; i < n; i++)
    p[i] = lo + (hi - lo) * wf_rng_uniform(SEED, s, i);
  return p;
}

int *hints(ctx *c, size_t n, int lo, int hi)
{
  int *p = keep_host(c, calloc(n ? n : 1, sizeof(int)));
  uint64_t s = c->draw++;
  for (size_t i = 0; i < n; i++)
    p[i] = lo + (int)(wf_rng_u64(SEED, s, i) % (uint64_t)(hi - lo));
  return p;
}

/* A device copy of `bytes` from host `h`. */
void *dcopy(ctx *c, const void *h, size_t bytes)
{
  void *d = NULL;
  if (c->n_dev == MAX_BUFS || wf_gpu_malloc(c->g, &d, bytes) != WF_OK ||
      wf_gpu_memcpy_h2d(c->g, d, h, bytes) != WF_OK) {
    fprintf(stderr, "device buffer of %zu bytes failed\n", bytes);
    exit(1);
  }
  c->dev[c->n_dev++] = d;
  return d;
}

float *df(ctx *c, const float *h, size_t n) { return dcopy(c, h, n * sizeof(float)); }
int *di(ctx *c, const int *h, size_t n) { return dcopy(c, h, n * sizeof(int)); }

void end_case(ctx *c)
{
  while (c->n_dev)
    wf_gpu_free(c->g, c->dev[--c->n_dev]);
  while (c->n_host)
    free(c->host[--c->n_host]);
}

/* ---- comparison ------------------------------------------------------------------- */

/* Compare the CPU result `ref` with device buffer `d`; prints one line. */
void expect_close(ctx *c, const char *what, const float *ref, const float *d, size_t n, float atol,
                  float rtol)
{
  float *got = hzero(c, n);
  size_t bad = n, worst_i = 0;
  double worst = 0.0;
  if (wf_gpu_stream_sync(c->g, c->stream) != WF_OK ||
      wf_gpu_memcpy_d2h(c->g, got, d, n * sizeof(float)) != WF_OK)
    bad = 0;
  for (size_t i = 0; i < n && bad == n; i++) {
    /* equal values match, infinities too (a 16-bit store's overflow on both sides),
     * where the tolerance itself is NaN (0 x inf) */
    double err = got[i] == ref[i] ? 0.0 : fabs((double)got[i] - ref[i]);
    if (got[i] != ref[i] && !(err <= atol + rtol * fabs(ref[i])))
      bad = i;
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  if (bad == n) {
    printf("  ok   %-28s n=%-7zu max |err| %.3g at %zu\n", what, n, worst, worst_i);
    return;
  }
  printf("  FAIL %-28s n=%-7zu at %zu: cpu %.9g gpu %.9g\n", what, n, bad, ref[bad], got[bad]);
  c->failures++;
}

/* The bf16-only ops' set (attention_lse, classifier). */
const wf_kset *bf16_of(const ctx *c) { return wf_kset_as(c->k, WF_DT_BF16); }

/* bf16 device buffer d (n) against bf16 host values ref within rel |ref| + atol. */
void expect_close16(ctx *c, const char *what, const wf_bf16 *ref, const wf_bf16 *d, size_t n,
                    float atol, float rel)
{
  float *r = hzero(c, n), *g = hzero(c, n);
  wf_bf16 *got = keep_host(c, calloc(n ? n : 1, sizeof *got));
  size_t bad = n;
  if (wf_gpu_stream_sync(c->g, c->stream) != WF_OK ||
      wf_gpu_memcpy_d2h(c->g, got, d, n * sizeof *got) != WF_OK)
    bad = 0;
  wf_bf16_to_floats(r, ref, n);
  wf_bf16_to_floats(g, got, n);
  for (size_t i = 0; i < n && bad == n; i++)
    if (!(fabsf(g[i] - r[i]) <= atol + rel * fabsf(r[i])))
      bad = i;
  if (bad == n) {
    printf("  ok   %-28s n=%zu\n", what, n);
    return;
  }
  printf("  FAIL %-28s n=%-7zu at %zu: cpu %.9g gpu %.9g\n", what, n, bad, r[bad], g[bad]);
  c->failures++;
}

wf_bf16 *h16(ctx *c, const float *f, size_t n)
{
  wf_bf16 *h = keep_host(c, calloc(n ? n : 1, sizeof *h));
  wf_bf16_from_floats(h, f, n);
  return h;
}

/* A device buffer of n bf16, read back widened. */
float *read16(ctx *c, const wf_bf16 *d, size_t n)
{
  wf_bf16 *h = keep_host(c, calloc(n ? n : 1, sizeof *h));
  float *f = hzero(c, n);
  if (wf_gpu_stream_sync(c->g, c->stream) != WF_OK ||
      wf_gpu_memcpy_d2h(c->g, h, d, n * sizeof *h) != WF_OK)
    return NULL;
  wf_bf16_to_floats(f, h, n);
  return f;
}

/* A device double, read back. */
double read_double(ctx *c, const double *d)
{
  double x = NAN;
  if (wf_gpu_stream_sync(c->g, c->stream) != WF_OK ||
      wf_gpu_memcpy_d2h(c->g, &x, d, sizeof x) != WF_OK)
    return NAN;
  return x;
}

void expect_double(ctx *c, const char *what, double want, double got, double rtol)
{
  bool ok = fabs(got - want) <= rtol * fabs(want);
  printf("  %-4s %-28s cpu %.12g gpu %.12g\n", ok ? "ok" : "FAIL", what, want, got);
  c->failures += !ok;
}

/* Bit-exact comparison of a rounding result; a NaN must meet a NaN. */
void expect_bits(ctx *c, const char *what, const float *ref, const float *d, size_t n)
{
  float *got = hzero(c, n);
  size_t bad = n;
  if (wf_gpu_stream_sync(c->g, c->stream) != WF_OK ||
      wf_gpu_memcpy_d2h(c->g, got, d, n * sizeof(float)) != WF_OK)
    bad = 0;
  for (size_t i = 0; i < n && bad == n; i++)
    if (isnan(ref[i]) ? !isnan(got[i]) : memcmp(&ref[i], &got[i], sizeof(float)) != 0)
      bad = i;
  if (bad == n) {
    printf("  ok   %-28s n=%-7zu bit for bit\n", what, n);
    return;
  }
  printf("  FAIL %-28s n=%-7zu at %zu: cpu %.9g gpu %.9g\n", what, n, bad, ref[bad], got[bad]);
  c->failures++;
}

static const struct {
  const char *name;
  void (*fn)(ctx *c);
} cases[] = {
    {"encoder", test_encoder},
    {"encoder_vp", test_encoder_vp},
    {"encoder backward, deterministic", test_encoder_deterministic},
    {"column sums at C 768", test_colsums},
    {"GEMM scratch", test_gemm_allocates_nothing},
    {"checksum", test_checksum},
    {"host syncs of the device seam", test_host_syncs},
    {"layernorm", test_layernorm},
    {"matmul", test_matmul},
    {"matmul+gelu", test_matmul_gelu},
    {"residual+layernorm", test_residual_layernorm},
    {"attention", test_attention},
    {"attention paths", test_attention_paths},
    {"attention bf16 gqa", test_attention_gqa16},
    {"classifier bf16", test_classifier},
    {"launches", test_launches},
    {"gelu+residual", test_gelu_residual},
    {"xent", test_xent},
    {"adamw", test_adamw},
    {"adamw writing the 16-bit copy", test_adamw_store},
    {"sumsq+scale", test_sumsq_scale},
    {"xent parts+loss", test_xent_parts},
    {"tokens", test_tokens},
    {"round", test_round},
    {"16-bit storage", test_storage},
    {"rmsnorm", test_rmsnorm},
    {"rope", test_rope},
    {"swiglu", test_swiglu},
    {"attention (grouped-query)", test_gqa},
    {"packed documents", test_documents},
};

int main(void)
{
  char why[512] = "";
  ctx c = {0};
  wf_status st = wf_gpu_open(&c.g, why, sizeof why);
  if (st == WF_ENODEV) {
    printf("skip: no GPU: %s\n", why);
    return 77;
  }
  if (st != WF_OK) {
    printf("FAIL: %s\n", why);
    return 1;
  }
  const wf_kreg *reg = wf_kreg_check(wf_gpu_kernel_table(c.g));
  wf_kset sets[WF_DT_COUNT];
  if (reg)
    wf_kset_resolve(sets, reg);
  c.k = reg ? &sets[WF_DT_F32] : NULL;
  void *stream = NULL;
  if (!c.k || wf_gpu_set_device(c.g, 0) != WF_OK || wf_gpu_stream_create(c.g, &stream) != WF_OK) {
    fprintf(stderr, "GPU present but the kernel registry or a stream is unusable\n");
    return 1;
  }
  c.stream = stream;
  wf_mem_stats before, after;
  wf_mem_get_stats(&before);
  for (size_t i = 0; i < WF_ARRAY_LEN(cases); i++) {
    printf("%s\n", cases[i].name);
    cases[i].fn(&c);
    end_case(&c);
  }
  if (c.k->reg->last_error() != WF_OK) {
    printf("FAIL a launch reported an error (logged above)\n");
    c.failures++;
  }
  wf_mem_get_stats(&after);
  if (after.current[WF_MEM_DEVICE] != before.current[WF_MEM_DEVICE]) {
    printf("FAIL device memory accounting: %lld bytes before, %lld after\n",
           (long long)before.current[WF_MEM_DEVICE], (long long)after.current[WF_MEM_DEVICE]);
    c.failures++;
  }
  wf_gpu_stream_destroy(c.g, c.stream);
  wf_gpu_close(c.g);
  printf("%d failure(s)\n", c.failures);
  return c.failures ? 1 : 0;
}
