/*
 * twin.h - what the pieces of test_gpu_kernels (every CUDA kernel against its CPU twin, one
 * file per op family: twin_<family>.c) share: the case's context, its buffers, the
 * comparisons, the tolerances (test_gpu_kernels.c says where each comes from), the helpers
 * that more than one family calls, and the cases.
 */
#ifndef WF_TEST_GPU_TWIN_H
#define WF_TEST_GPU_TWIN_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wf_config.h"
#include "wf_device.h"
#include "wf_gpu.h"
#include "wf_kernels.h"

#define SEED       20241122u
#define TOL_EXACT  1e-6f
#define TOL_ELEM   2e-5f
#define TOL_SUM    1e-4f
#define TOL_COLSUM 2e-3f
#define MAX_BUFS   64

typedef struct ctx {
  wf_gpu *g;
  const wf_kset *k;
  wf_stream *stream;
  void *dev[MAX_BUFS]; /* device buffers of the current case */
  void *host[MAX_BUFS];
  int n_dev, n_host;
  uint64_t draw; /* RNG stream of the next random buffer */
  int failures;
} ctx;

/* ---- buffers, all released by end_case (test_gpu_kernels.c) ---------------------- */

void *keep_host(ctx *c, void *p);
float *hzero(ctx *c, size_t n);
/* Uniform in [lo, hi), a fresh RNG stream per buffer. */
float *hrand(ctx *c, size_t n, float lo, float hi);
int *hints(ctx *c, size_t n, int lo, int hi);
/* A device copy of `bytes` from host `h`. */
void *dcopy(ctx *c, const void *h, size_t bytes);
float *df(ctx *c, const float *h, size_t n);
int *di(ctx *c, const int *h, size_t n);
wf_bf16 *h16(ctx *c, const float *f, size_t n);
/* A device buffer of n bf16, read back widened. */
float *read16(ctx *c, const wf_bf16 *d, size_t n);
/* A device double, read back. */
double read_double(ctx *c, const double *d);
void end_case(ctx *c);

/* ---- comparisons: one line each, failures counted (test_gpu_kernels.c) ----------- */

/* Compare the CPU result `ref` with device buffer `d`; prints one line. */
void expect_close(ctx *c, const char *what, const float *ref, const float *d, size_t n, float atol,
                  float rtol);
/* Bit-exact comparison of a rounding result; a NaN must meet a NaN. */
void expect_bits(ctx *c, const char *what, const float *ref, const float *d, size_t n);
/* bf16 device buffer d (n) against bf16 host values ref within rel |ref| + atol. */
void expect_close16(ctx *c, const char *what, const wf_bf16 *ref, const wf_bf16 *d, size_t n,
                    float atol, float rel);
void expect_double(ctx *c, const char *what, double want, double got, double rtol);

/* ---- helpers of more than one family -------------------------------------------- */

/* The bf16-only ops' set (attention_lse, classifier). */
const wf_kset *bf16_of(const ctx *c);
/* Host operands as the model hands them to a GEMM of precision lowp: rounded to it
 * (twin_matmul.c). */
float *operand(ctx *c, size_t n, int lowp);
/* Attention (fp32) on each side, compared (twin_attention.c). */
void attention_case(ctx *c, int B, int T, int NH, int hs);
/* An attention path's name (twin_attention.c). */
const char *path_name(int p);
/* Result got (host; NULL: it could not be read) against the fp32 CPU result ref within
 * factor x the bf16 bound (twin_attention.c). */
void bound_verdict(ctx *c, const char *what, const float *ref, const float *got,
                   const double *bound, size_t n, double factor);
/* Whether the path taken is the one this case must take (see test_attention_paths;
 * twin_attention.c). */
void expect_path(ctx *c, int impl, int path, bool cudnn_shape);
/* RoPE in place on a packed qkv, forward and backward, compared (twin_elementwise.c). */
void rope_case(ctx *c, int B, int T, int NH, int NKV, int hs, double theta, const int *pos);

/* ---- the cases (their table: test_gpu_kernels.c) -------------------------------- */

void test_encoder(ctx *c);
void test_encoder_vp(ctx *c);
void test_encoder_deterministic(ctx *c);
void test_colsums(ctx *c);
void test_gemm_allocates_nothing(ctx *c);
void test_checksum(ctx *c);
void test_host_syncs(ctx *c);
void test_layernorm(ctx *c);
void test_matmul(ctx *c);
void test_matmul_gelu(ctx *c);
void test_residual_layernorm(ctx *c);
void test_attention(ctx *c);
void test_attention_paths(ctx *c);
void test_attention_gqa16(ctx *c);
void test_classifier(ctx *c);
void test_launches(ctx *c);
void test_gelu_residual(ctx *c);
void test_xent(ctx *c);
void test_adamw(ctx *c);
void test_adamw_store(ctx *c);
void test_sumsq_scale(ctx *c);
void test_xent_parts(ctx *c);
void test_tokens(ctx *c);
void test_round(ctx *c);
void test_storage(ctx *c);
void test_rmsnorm(ctx *c);
void test_rope(ctx *c);
void test_swiglu(ctx *c);
void test_gqa(ctx *c);
void test_documents(ctx *c);

#endif
