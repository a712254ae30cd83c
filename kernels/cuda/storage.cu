/*
 * storage.cu - the GPU's kernel tables of each storage format (wf_ktable.h, storage.h):
 * the fp32 table's entries that take activations (`void *`, fp32 here, calling the
 * fp32 launchers), and the 16-bit kernels of the bf16 and fp16 tables, twins of the
 * CPU's `*16` kernels (kernels/cpu): each loads its 16-bit activations, computes in
 * fp32 what the fp32 kernel computes, and stores its activation outputs rounded to
 * nearest even (__float2bfloat16_rn, __float2half_rn); gradients, statistics and
 * non-GEMM weights stay fp32.
 *
 * GEMMs: cuBLASLt with the 16-bit operands as they are stored (the activations, the
 * model's 16-bit weight copy, the output gradient), fp32 compute and accumulation. An
 * fp32 output gets its fp32 bias from the BIAS epilogue. A 16-bit output adds its bias
 * rounded to the format (wf_ktable.h), the value the model's 16-bit weight copy holds,
 * as llm.c and PyTorch's autocast do: cuBLASLt takes a bias only of the output's type
 * (an fp32 bias with a bf16 D is CUBLAS_STATUS_INVALID_VALUE on an H100, cuBLASLt
 * 13.1), so the rounded bias lets the BIAS epilogue write D once from the fp32 sum
 * (run16_biased). Where cuBLASLt refuses that, the GEMM writes fp32 blocks with the
 * rounded bias widened and one kernel rounds them once (run16_rounded), the same
 * arithmetic; adding a bias to an already rounded output would round twice. The matmul +
 * GELU then stores the GELU of the stored pre-activation, the CPU's composition. dbias,
 * like every column sum, is colsum.cu's: cut over rows and columns to fill the GPU,
 * added in a fixed order. Backward's dinp is written in the format (matmul_backward: the
 * output gradient attention's, GELU's or SwiGLU's backward reads next) or in fp32
 * (matmul_backward_f32: a column-parallel layer's, which the tp reduction adds).
 *
 * Attention in bf16 (up to head size 128): runtime.attention's path (attention_impl.cu:
 * cuDNN, weft's flash kernels, or the fp32 reference) on the stored qkv, its output
 * written in bf16; backward reads dout in bf16 and the path writes dqkv in bf16, the
 * table's format (attention_bf16.h's precision). fp16 attention, and any head size above
 * 128: the fp32 kernels on widened copies, the output and dqkv stored in 16 bits.
 *
 * Llama's RMSNorm, RoPE and SwiGLU: the fp32 kernels' own code instantiated for the
 * format (act_int.h): 16-bit loads, fp32 math, 16-bit stores, no copies.
 *
 * Legend: N rows, C channels, OC output channels, V vocabulary columns, ld row stride.
 */
#include <atomic>

#include "act_int.h"
#include "attn_int.h"

#define LN_EPS         1e-5f
#define ROWS_PER_BLOCK 4                   /* warps per 128-thread block */
#define GELU_K         0.7978845608028654f /* sqrt(2 / pi) */

static unsigned rows_grid(int N) { return (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }

/* ---- store and load ------------------------------------------------------------------------ */

template <typename T>
__global__ static void store_kernel(T *dst, const float *src, size_t n, bool vec)
{
  WF_PACKS(i, n, vec)
  {
    float v[8];
    wf__ld8(src, i, v);
    wf__st8(dst, i, v);
  }
  WF_PACK_TAIL(i, n, vec) { wf__st(dst, i, src[i]); }
}

template <typename T>
__global__ static void load_kernel(float *dst, const T *src, size_t n, bool vec)
{
  WF_PACKS(i, n, vec)
  {
    float v[8];
    wf__ld8(src, i, v);
    wf__st8(dst, i, v);
  }
  WF_PACK_TAIL(i, n, vec) { dst[i] = wf__ld(src, i); }
}

template <typename T> static void store(void *dst, const float *src, size_t n, wf_stream *s)
{
  bool vec = wf__aligned16(dst, src);
  if (n == 0)
    return;
  store_kernel<T><<<wf__pack_grid(n, vec, 256), 256, 0, (cudaStream_t)s>>>((T *)dst, src, n, vec);
  WF_CUDA_LAUNCHED("store_kernel");
}

template <typename T> static void load(float *dst, const void *src, size_t n, wf_stream *s)
{
  bool vec = wf__aligned16(dst, src);
  if (n == 0)
    return;
  load_kernel<T>
      <<<wf__pack_grid(n, vec, 256), 256, 0, (cudaStream_t)s>>>(dst, (const T *)src, n, vec);
  WF_CUDA_LAUNCHED("load_kernel");
}

/* ---- layernorm (layernorm.cu's algorithm: a warp per row) ---------------------------------- */

/* One warp normalises row x into o (both 16-bit); lane 0 keeps mean and rstd. */
template <typename T>
__device__ static void normalize_row(T *o, float *mean, float *rstd, const T *x, const float *w,
                                     const float *b, int C, int row, bool vec)
{
  float s = 0.0f, q = 0.0f, v[8], wv[8], bv[8];
  WF_ROW_PACKS(c, C, vec)
  {
    wf__ld8(x, c, v);
    for (int k = 0; k < 8; k++)
      s += v[k];
  }
  WF_ROW_ELEMS(c, C, vec) { s += wf__ld(x, c); }
  float m = wf__warp_sum(s) / C;
  WF_ROW_PACKS(c, C, vec)
  {
    wf__ld8(x, c, v);
    for (int k = 0; k < 8; k++)
      q += (v[k] - m) * (v[k] - m);
  }
  WF_ROW_ELEMS(c, C, vec) { q += (wf__ld(x, c) - m) * (wf__ld(x, c) - m); }
  float rs = rsqrtf(wf__warp_sum(q) / C + LN_EPS);
  WF_ROW_PACKS(c, C, vec)
  {
    wf__ld8(x, c, v), wf__ld8(w, c, wv), wf__ld8(b, c, bv);
    for (int k = 0; k < 8; k++)
      v[k] = (v[k] - m) * rs * wv[k] + bv[k];
    wf__st8(o, c, v);
  }
  WF_ROW_ELEMS(c, C, vec) { wf__st(o, c, (wf__ld(x, c) - m) * rs * w[c] + b[c]); }
  if (threadIdx.x % 32 == 0 && mean)
    mean[row] = m;
  if (threadIdx.x % 32 == 0 && rstd)
    rstd[row] = rs;
}

template <typename T>
__global__ static void layernorm_forward_kernel(T *out, float *mean, float *rstd, const T *inp,
                                                const float *w, const float *b, int N, int C,
                                                bool vec)
{
  int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  if (row >= N)
    return;
  size_t at = (size_t)row * C;
  normalize_row(out + at, mean, rstd, inp + at, w, b, C, row, vec);
}

/* res = store(a + b) (res may alias a: each lane reads then writes its own elements),
 * then the layernorm of the stored res. */
template <typename T>
__global__ static void residual_layernorm_kernel(T *res, T *ln, float *mean, float *rstd,
                                                 const T *a, const float *b, const float *w,
                                                 const float *bias, int N, int C, bool vec)
{
  int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  if (row >= N)
    return;
  size_t at = (size_t)row * C;
  wf__residual_row(res + at, a + at, b + at, C, vec);
  normalize_row(ln + at, mean, rstd, res + at, w, bias, C, row, vec);
}

template <typename T>
__global__ static void layernorm_backward_dinp_kernel(float *dinp, const float *dout, const T *inp,
                                                      const float *w, const float *mean,
                                                      const float *rstd, int N, int C, bool vec)
{
  int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  if (row >= N)
    return;
  const T *x = inp + (size_t)row * C;
  const float *dy = dout + (size_t)row * C;
  float *dx = dinp + (size_t)row * C;
  float m = mean[row], rs = rstd[row], a = 0.0f, bb = 0.0f, xv[8], wv[8], dv[8], ov[8];
  WF_ROW_PACKS(c, C, vec)
  {
    wf__ld8(x, c, xv), wf__ld8(w, c, wv), wf__ld8(dy, c, dv);
    for (int k = 0; k < 8; k++) {
      a += wv[k] * dv[k];
      bb += wv[k] * dv[k] * (xv[k] - m) * rs;
    }
  }
  WF_ROW_ELEMS(c, C, vec)
  {
    float wdy = w[c] * dy[c];
    a += wdy;
    bb += wdy * (wf__ld(x, c) - m) * rs;
  }
  float mean_wdy = wf__warp_sum(a) / C, mean_wdy_norm = wf__warp_sum(bb) / C;
  WF_ROW_PACKS(c, C, vec)
  {
    wf__ld8(x, c, xv), wf__ld8(w, c, wv), wf__ld8(dy, c, dv), wf__ld8(dx, c, ov);
    for (int k = 0; k < 8; k++)
      ov[k] += (wv[k] * dv[k] - mean_wdy - (xv[k] - m) * rs * mean_wdy_norm) * rs;
    wf__st8(dx, c, ov);
  }
  WF_ROW_ELEMS(c, C, vec)
  {
    float norm = (wf__ld(x, c) - m) * rs;
    dx[c] += (w[c] * dy[c] - mean_wdy - norm * mean_wdy_norm) * rs;
  }
}

template <typename T>
static void layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const float *w,
                              const float *b, int N, int C, wf_stream *s)
{
  if (N <= 0 || C <= 0)
    return;
  bool vec = wf__row_packs(C, out, inp, w, b);
  layernorm_forward_kernel<T><<<rows_grid(N), 32 * ROWS_PER_BLOCK, 0, (cudaStream_t)s>>>(
      (T *)out, mean, rstd, (const T *)inp, w, b, N, C, vec);
  WF_CUDA_LAUNCHED("layernorm_forward_kernel (16-bit)");
}

template <typename T>
static void residual_layernorm_forward(void *res, void *ln, float *mean, float *rstd, const void *a,
                                       const float *b, const float *w, const float *bias, int N,
                                       int C, wf_stream *s)
{
  if (N <= 0 || C <= 0)
    return;
  bool vec = wf__row_packs(C, res, ln, a, b) && wf__aligned16(w, bias);
  residual_layernorm_kernel<T><<<rows_grid(N), 32 * ROWS_PER_BLOCK, 0, (cudaStream_t)s>>>(
      (T *)res, (T *)ln, mean, rstd, (const T *)a, b, w, bias, N, C, vec);
  WF_CUDA_LAUNCHED("residual_layernorm_kernel (16-bit)");
}

template <typename T>
static void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                               const void *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C, wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  if (N <= 0 || C <= 0)
    return;
  if (dinp) {
    bool vec = wf__row_packs(C, dinp, dout, inp, w);
    layernorm_backward_dinp_kernel<T><<<rows_grid(N), 32 * ROWS_PER_BLOCK, 0, s>>>(
        dinp, dout, (const T *)inp, w, mean, rstd, N, C, vec);
    if (!WF_CUDA_LAUNCHED("layernorm_backward_dinp_kernel (16-bit)"))
      return;
  }
  wf__norm_param_grads(dweight, dbias, dout, (const T *)inp, mean, rstd, N, C, s);
}

/* ---- elementwise ----------------------------------------------------------------------------- */

template <typename T>
__global__ static void residual_kernel(T *out, const T *a, const float *b, size_t n, bool vec)
{
  WF_PACKS(i, n, vec)
  {
    float x[8], y[8];
    wf__ld8(a, i, x);
    wf__ld8(b, i, y);
    for (int k = 0; k < 8; k++)
      x[k] += y[k];
    wf__st8(out, i, x);
  }
  WF_PACK_TAIL(i, n, vec) { wf__st(out, i, wf__ld(a, i) + b[i]); }
}

__device__ __forceinline__ float gelu(float x)
{
  float u = GELU_K * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

template <typename T>
__global__ static void gelu_forward_kernel(T *out, const T *inp, size_t n, bool vec)
{
  WF_PACKS(i, n, vec)
  {
    float x[8];
    wf__ld8(inp, i, x);
    for (int k = 0; k < 8; k++)
      x[k] = gelu(x[k]);
    wf__st8(out, i, x);
  }
  WF_PACK_TAIL(i, n, vec) { wf__st(out, i, gelu(wf__ld(inp, i))); }
}

/* out = x rounded to T; with gelu_out, also the GELU of that stored value, as the CPU's
 * composition computes it. */
template <typename T>
__global__ static void round_gelu_kernel(T *out, T *gelu_out, const float *x, size_t n)
{
  WF_GRID_STRIDE(i, n)
  {
    wf__st(out, i, x[i]);
    if (gelu_out)
      wf__st(gelu_out, i, gelu(wf__ld(out, i)));
  }
}

__device__ __forceinline__ float gelu_grad(float x)
{
  float th = tanhf(GELU_K * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + th) +
         0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
}

/* dinp = gelu'(inp) * dout, dout and dinp in the format (gelu.h) */
template <typename T>
__global__ static void gelu_backward_kernel(T *dinp, const T *inp, const T *dout, size_t n,
                                            bool vec)
{
  WF_PACKS(i, n, vec)
  {
    float x[8], dy[8];
    wf__ld8(inp, i, x);
    wf__ld8(dout, i, dy);
    for (int k = 0; k < 8; k++)
      x[k] = gelu_grad(x[k]) * dy[k];
    wf__st8(dinp, i, x);
  }
  WF_PACK_TAIL(i, n, vec) { wf__st(dinp, i, gelu_grad(wf__ld(inp, i)) * wf__ld(dout, i)); }
}

template <typename T>
static void residual_forward(void *out, const void *a, const float *b, size_t n, wf_stream *s)
{
  bool vec = wf__aligned16(out, a, b);
  if (n == 0)
    return;
  residual_kernel<T>
      <<<wf__pack_grid(n, vec, 256), 256, 0, (cudaStream_t)s>>>((T *)out, (const T *)a, b, n, vec);
  WF_CUDA_LAUNCHED("residual_kernel (16-bit)");
}

template <typename T> static void gelu_forward(void *out, const void *inp, size_t n, wf_stream *s)
{
  bool vec = wf__aligned16(out, inp);
  if (n == 0)
    return;
  gelu_forward_kernel<T>
      <<<wf__pack_grid(n, vec, 256), 256, 0, (cudaStream_t)s>>>((T *)out, (const T *)inp, n, vec);
  WF_CUDA_LAUNCHED("gelu_forward_kernel (16-bit)");
}

template <typename T>
static void gelu_backward(void *dinp, const void *inp, const void *dout, size_t n, wf_stream *s)
{
  bool vec = wf__aligned16(dinp, inp, dout);
  if (n == 0)
    return;
  gelu_backward_kernel<T><<<wf__pack_grid(n, vec, 256), 256, 0, (cudaStream_t)s>>>(
      (T *)dinp, (const T *)inp, (const T *)dout, n, vec);
  WF_CUDA_LAUNCHED("gelu_backward_kernel (16-bit)");
}

/* ---- GEMMs over 16-bit operands ---------------------------------------------------------------
 */

template <typename T> static cudaDataType_t cuda_type();
template <> cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }
template <> cudaDataType_t cuda_type<__half>() { return CUDA_R_16F; }

/* D (m,n) = op(A) op(B) + beta D (+ bias, m values of bias_type: fp32 unless set) in
 * cuBLAS's column-major terms, A and B of type ab, D of type dt (fp32 or ab). */
struct gemm16 {
  cublasOperation_t ta, tb;
  int m, n, k;
  const void *A;
  int lda;
  const void *B;
  int ldb;
  float beta;
  void *D;
  cudaDataType_t ab, dt;
  const void *bias;
  cudaDataType_t bias_type; /* CUDA_R_32F (0) unless set */
};

static cublasStatus_t descs16_make(wf__lt_descs *x, const gemm16 *g, bool bias, size_t workspace)
{
  cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  cudaDataType_t bias_type = g->bias_type;
  WF__LT_TRY(cublasLtMatmulDescCreate(&x->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  WF__LT_TRY(
      cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_TRANSA, &g->ta, sizeof g->ta));
  WF__LT_TRY(
      cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_TRANSB, &g->tb, sizeof g->tb));
  WF__LT_TRY(
      cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (bias) {
    WF__LT_TRY(cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                              sizeof g->bias));
    WF__LT_TRY(cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                              &bias_type, sizeof bias_type));
  }
  bool at = g->ta == CUBLAS_OP_T, bt = g->tb == CUBLAS_OP_T;
  WF__LT_TRY(cublasLtMatrixLayoutCreate(&x->a, g->ab, at ? g->k : g->m, at ? g->m : g->k, g->lda));
  WF__LT_TRY(cublasLtMatrixLayoutCreate(&x->b, g->ab, bt ? g->n : g->k, bt ? g->k : g->n, g->ldb));
  WF__LT_TRY(cublasLtMatrixLayoutCreate(&x->d, g->dt, g->m, g->n, g->m));
  WF__LT_TRY(cublasLtMatmulPreferenceCreate(&x->pref));
  WF__LT_TRY(cublasLtMatmulPreferenceSetAttribute(x->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &workspace, sizeof workspace));
  return CUBLAS_STATUS_SUCCESS;
}

/* g with (bias) or without its bias epilogue; NOT_SUPPORTED when no algorithm fits. */
static cublasStatus_t lt16_enqueue(const wf__lt *lt, const gemm16 *g, bool bias, cudaStream_t s)
{
  wf__lt_descs x = {};
  cublasStatus_t made = descs16_make(&x, g, bias, lt->workspace_bytes);
  return wf__lt_run(lt, &x, made, g->A, g->B, &g->beta, g->D, s);
}

/* out (m x n, column-major: rows of n, m columns each) += bias after a plain GEMM */
__global__ static void add_bias32_kernel(float *out, const float *bias, int m, size_t n)
{
  WF_GRID_STRIDE(i, n) { out[i] += bias[i % (size_t)m]; }
}

/* Run g under the GEMM lock: an fp32 output with the bias epilogue where cuBLASLt has
 * one, else plain and the bias added by a kernel; a 16-bit output without a bias (those
 * with one go through run16_rounded). k = 0 is an empty sum: D = bias (beta is 0 there). */
template <typename T> static bool run16(const gemm16 *g, cudaStream_t s)
{
  size_t n = (size_t)g->m * g->n, es = g->dt == CUDA_R_32F ? 4 : 2;
  bool fused = false;
  if (g->k == 0 && !WF_CUDA_OK(cudaMemsetAsync(g->D, 0, n * es, s)))
    return false;
  if (g->k > 0) {
    wf__lt lt;
    if (!wf__lt_begin(&lt, __FILE__, __LINE__))
      return false;
    bool epilogue = g->bias && g->dt == CUDA_R_32F; /* see the top of the file */
    cublasStatus_t st = epilogue ? lt16_enqueue(&lt, g, true, s) : CUBLAS_STATUS_NOT_SUPPORTED;
    fused = st == CUBLAS_STATUS_SUCCESS;
    if (!fused) /* no algorithm for the epilogue, or none at all: say so below */
      st = lt16_enqueue(&lt, g, false, s);
    char what[96];
    snprintf(what, sizeof what, "cublasLtMatmul 16-bit (m %d, n %d, k %d)", g->m, g->n, g->k);
    if (!wf__lt_end(st, __FILE__, __LINE__, what))
      return false;
  }
  if (fused || !g->bias)
    return true;
  add_bias32_kernel<<<wf__grid_1d(n, 256), 256, 0, s>>>((float *)g->D, (const float *)g->bias, g->m,
                                                        n);
  return WF_CUDA_LAUNCHED("add_bias32_kernel");
}

/* A 16-bit output g->D (beta 0, B not transposed) rounded once from the fp32 sum with
 * its bias, as the CPU's (see the top of the file): fp32 column blocks of at most
 * 32 MiB from CUDA's stream-ordered pool, each with the bias epilogue, then rounded by a
 * kernel that also writes the GELU into gelu_out where one is given. */
template <typename T> static bool run16_rounded(const gemm16 *g, void *gelu_out, cudaStream_t s)
{
  const size_t cap = ((size_t)32 << 20) / sizeof(float);
  int cols = (int)WF_MIN((size_t)g->n, WF_MAX((size_t)1, cap / (size_t)g->m));
  float *tmp = NULL;
  if (!WF_CUDA_OK(cudaMallocAsync((void **)&tmp, (size_t)cols * g->m * sizeof(float), s)))
    return false;
  bool ok = true;
  for (int j = 0; ok && j < g->n; j += cols) {
    gemm16 b = *g;
    b.n = WF_MIN(cols, g->n - j);
    b.B = (const T *)g->B + (size_t)j * (size_t)g->ldb;
    b.D = tmp;
    b.dt = CUDA_R_32F;
    size_t n = (size_t)b.n * (size_t)g->m, at = (size_t)j * (size_t)g->m;
    ok = run16<T>(&b, s);
    if (ok) {
      round_gelu_kernel<T><<<wf__grid_1d(n, 256), 256, 0, s>>>(
          (T *)g->D + at, gelu_out ? (T *)gelu_out + at : NULL, tmp, n);
      ok = WF_CUDA_LAUNCHED("round_gelu_kernel (16-bit)");
    }
  }
  return WF_CUDA_OK(cudaFreeAsync(tmp, s)) && ok;
}

/* b16 (n) = b rounded to the format, b32 (n) = b16 widened */
template <typename T>
__global__ static void bias_rounded_kernel(T *b16, float *b32, const float *b, size_t n)
{
  WF_GRID_STRIDE(i, n)
  {
    wf__st(b16, i, b[i]);
    b32[i] = wf__ld(b16, i);
  }
}

/* Whether cuBLASLt has refused a 16-bit bias with a 16-bit output (logged once; each
 * call still asks, as the answer may depend on the shape). */
static std::atomic<bool> g_bias16_refused{false};

/* g's 16-bit output D with its fp32 bias rounded to the format first, the value the
 * model's 16-bit copy of the bias holds (wf_ktable.h): one GEMM with cuBLASLt's BIAS
 * epilogue on the 16-bit bias, the fp32 sum rounded once into D; where cuBLASLt refuses
 * that, run16_rounded's fp32 blocks with the rounded bias widened, the same arithmetic.
 * Then, where gelu_out is given, the GELU of the stored pre-activation (the CPU's
 * composition). */
template <typename T> static bool run16_biased(const gemm16 *g, void *gelu_out, cudaStream_t s)
{
  size_t m = (size_t)g->m, n = m * (size_t)g->n, off = (m * sizeof(T) + 255) / 256 * 256;
  char *tmp = NULL;
  if (!WF_CUDA_OK(cudaMallocAsync((void **)&tmp, off + m * sizeof(float), s)))
    return false;
  T *b16 = (T *)tmp;
  float *b32 = (float *)(tmp + off);
  bias_rounded_kernel<T><<<wf__grid_1d(m, 256), 256, 0, s>>>(b16, b32, (const float *)g->bias, m);
  bool ok = WF_CUDA_LAUNCHED("bias_rounded_kernel (16-bit)"), fused = false;
  wf__lt lt;
  /* k 0: run16's empty sum. m or k not a multiple of 8: cuBLASLt 13.1's BIAS epilogue
   * with a bf16 bias and output is wrong there with most of the heuristics' algorithms
   * (bench/lt_bias16 on an H200: 13 to 251 bf16 steps off on a few percent of the
   * elements; an fp32 output is exact), so those widths take the fp32 blocks below,
   * which compute them exactly; the model's widths are multiples of 8. */
  if (ok && g->k > 0 && g->m % 8 == 0 && g->k % 8 == 0 && wf__lt_begin(&lt, __FILE__, __LINE__)) {
    gemm16 f = *g;
    f.bias = b16, f.bias_type = cuda_type<T>();
    cublasStatus_t st = lt16_enqueue(&lt, &f, true, s);
    fused = st == CUBLAS_STATUS_SUCCESS;
    wf__lt_end(CUBLAS_STATUS_SUCCESS, __FILE__, __LINE__, "cublasLtMatmul 16-bit bias");
    if (!fused && !g_bias16_refused.exchange(true))
      WF_INFO("cuBLASLt refuses a 16-bit bias with a 16-bit output (m %d, n %d, k %d: cuBLAS "
              "status %d): 16-bit GEMMs with a bias go through fp32 blocks",
              g->m, g->n, g->k, (int)st);
  }
  if (ok && !fused) {
    gemm16 f = *g;
    f.bias = b32, f.bias_type = CUDA_R_32F;
    ok = run16_rounded<T>(&f, gelu_out, s);
  } else if (ok && gelu_out) {
    gelu_forward<T>(gelu_out, g->D, n, (wf_stream *)s); /* a launch failure is kept, as any */
  }
  return WF_CUDA_OK(cudaFreeAsync(tmp, s)) && ok;
}

/* out^T (OC,N) = W (OC,C)^T-view . inp^T (+ bias): matmul.cu's forward, out of type dt */
template <typename T>
static void forward16(void *out, cudaDataType_t dt, const void *inp, const void *w,
                      const float *bias, int N, int C, int OC, wf_stream *stream)
{
  if (N <= 0 || OC <= 0 || C < 0)
    return;
  gemm16 g = {CUBLAS_OP_T, CUBLAS_OP_N,    OC, N,    C,         w, C, inp, C, 0.0f,
              out,         cuda_type<T>(), dt, bias, CUDA_R_32F};
  if (bias && dt != CUDA_R_32F)
    run16_biased<T>(&g, NULL, (cudaStream_t)stream);
  else
    run16<T>(&g, (cudaStream_t)stream);
}

template <typename T>
static void matmul_forward(void *out, const void *inp, const void *w, const float *bias, int N,
                           int C, int OC, int /* lowp: the format */, wf_stream *s)
{
  forward16<T>(out, cuda_type<T>(), inp, w, bias, N, C, OC, s);
}

template <typename T>
static void matmul_forward_f32(float *out, const void *inp, const void *w, const float *bias, int N,
                               int C, int OC, int /* lowp: the format */, wf_stream *s)
{
  forward16<T>(out, CUDA_R_32F, inp, w, bias, N, C, OC, s);
}

template <typename T>
static void matmul_gelu_forward(void *gelu_out, void *pre, const void *inp, const void *w,
                                const float *bias, int N, int C, int OC, int /* lowp: the format */,
                                wf_stream *s)
{
  if (N <= 0 || OC <= 0 || C < 0)
    return;
  gemm16 g = {CUBLAS_OP_T,    CUBLAS_OP_N,    OC,   N,         C, w, C, inp, C, 0.0f, pre,
              cuda_type<T>(), cuda_type<T>(), bias, CUDA_R_32F};
  if (bias)
    run16_biased<T>(&g, gelu_out, (cudaStream_t)s);
  else
    run16_rounded<T>(&g, gelu_out, (cudaStream_t)s);
}

/* dinp (N,C) = dout . W, written in type dt (the format, or fp32), and dweight (OC,C) +=
 * dout^T . inp in fp32: matmul.cu's backward with 16-bit operands. A 16-bit dinp is the
 * fp32 sum rounded once by cuBLASLt's output conversion, half the bytes written, and
 * the faster GEMM (attproj's and fcproj's input gradients ran at 459 and 592 TFLOP/s
 * with bf16 outputs against 258 and 303 with fp32 ones on an H100, bench/gemm_gpu). */
template <typename T>
static void backward16(void *dinp, cudaDataType_t dt, float *dweight, float *dbias,
                       const void *dout, const void *inp, const void *w, int N, int C, int OC,
                       wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  cudaDataType_t t = cuda_type<T>();
  size_t width = dt == CUDA_R_32F ? sizeof(float) : sizeof(T);
  if (N <= 0 || C < 0 || !wf__dinp_nonempty(dinp, (size_t)N * C * width, OC, s))
    return;
  gemm16 gi = {CUBLAS_OP_N, CUBLAS_OP_N, C,    N, OC, w,    C,         dout,
               OC,          0.0f,        dinp, t, dt, NULL, CUDA_R_32F};
  gemm16 gw = {CUBLAS_OP_N, CUBLAS_OP_T, C,       OC, N,          inp,  C,         dout,
               OC,          1.0f,        dweight, t,  CUDA_R_32F, NULL, CUDA_R_32F};
  if (C > 0 && dinp && !run16<T>(&gi, s))
    return;
  if (C > 0 && dweight && !run16<T>(&gw, s))
    return;
  wf__bias_grad(dbias, (const T *)dout, N, OC, s);
}

template <typename T>
static void matmul_backward(void *dinp, float *dweight, float *dbias, const void *dout,
                            const void *inp, const void *w, int N, int C, int OC,
                            int /* lowp: the format */, wf_stream *s)
{
  backward16<T>(dinp, cuda_type<T>(), dweight, dbias, dout, inp, w, N, C, OC, s);
}

template <typename T>
static void matmul_backward_f32(float *dinp, float *dweight, float *dbias, const void *dout,
                                const void *inp, const void *w, int N, int C, int OC,
                                int /* lowp: the format */, wf_stream *s)
{
  backward16<T>(dinp, CUDA_R_32F, dweight, dbias, dout, inp, w, N, C, OC, s);
}

/* ---- Llama's ops: 16-bit forms of the fp32 kernels ------------------------------------------
 * RMSNorm, RoPE and SwiGLU are rmsnorm.cu's, rope.cu's and swiglu.cu's kernels
 * instantiated for the format (act_int.h): they load their 16-bit operands, compute in
 * fp32 and store their activation outputs rounded, what the fp32 kernels compute on the
 * widened activations, as on the CPU (kernels/cpu/llama16.c), with no copy. */

template <typename E>
static void rmsnorm_forward(void *out, float *rstd, const void *inp, const float *w, float eps,
                            int N, int C, wf_stream *stream)
{
  wf__rmsnorm_forward((E *)out, rstd, (const E *)inp, w, eps, N, C, stream);
}

template <typename E>
static void rmsnorm_backward(float *dinp, float *dw, const float *dout, const void *inp,
                             const float *w, const float *rstd, int N, int C, wf_stream *stream)
{
  wf__rmsnorm_backward(dinp, dw, dout, (const E *)inp, w, rstd, N, C, stream);
}

template <typename E>
static void residual_rmsnorm_forward(void *res, void *out, float *rstd, const void *a,
                                     const float *b, const float *w, float eps, int N, int C,
                                     wf_stream *stream)
{
  wf__residual_rmsnorm_forward((E *)res, (E *)out, rstd, (const E *)a, b, w, eps, N, C, stream);
}

template <typename E>
static void rope_forward(void *qkv, const float *cs, int B, int T, int NH, int NKV, int hs,
                         wf_stream *stream)
{
  wf__rope_forward((E *)qkv, cs, B, T, NH, NKV, hs, stream);
}

template <typename E>
static void rope_backward(void *dqkv, const float *cs, int B, int T, int NH, int NKV, int hs,
                          wf_stream *stream)
{
  wf__rope_backward((E *)dqkv, cs, B, T, NH, NKV, hs, stream);
}

template <typename E>
static void swiglu_forward(void *out, const void *inp, int N, int F, wf_stream *stream)
{
  wf__swiglu_forward((E *)out, (const E *)inp, N, F, stream);
}

template <typename E>
static void swiglu_backward(void *dinp, const void *inp, const void *dout, int N, int F,
                            wf_stream *stream)
{
  wf__swiglu_backward((E *)dinp, (const E *)inp, (const E *)dout, N, F, stream);
}

/* ---- attention, fp16 and head sizes above 128: the fp32 kernels on widened copies ----------
 * q, k, v are loaded into fp32 copies, the fp32 launchers run on them and the output (and
 * backward's dqkv) is stored in 16 bits; the state kept for backward is theirs. The
 * forward's copies are stream-ordered allocations (the entry has no scratch argument);
 * backward's come out of its scratch, which attention_scratch16 sizes for them. */

/* n floats of stream-ordered device memory, or NULL (the failure logged and kept). */
static float *widened(size_t n, wf_stream *stream)
{
  float *w = NULL;
  if (n == 0 || !WF_CUDA_OK(cudaMallocAsync((void **)&w, n * sizeof(float), (cudaStream_t)stream)))
    return NULL;
  return w;
}

static void release(float *w, wf_stream *stream)
{
  WF_CUDA_OK(cudaFreeAsync(w, (cudaStream_t)stream));
}

/* Floats, each part of a buffer rounded up to 64 of them (256 bytes). */
static size_t part(size_t floats) { return (floats + 63) / 64 * 64; }

/* Backward's scratch: the fp32 kernels' own, then room for the widened qkv and for the
 * fp32 dqkv (B,T,3C each at most: NKV <= NH), then for the widened dout (B,T,C). */
static size_t attention_scratch16(int B, int T, int C, int NH)
{
  return part(wf_cuda_attn_scratch(B, T, C, NH)) + 2 * part((size_t)B * T * 3 * C) +
         part((size_t)B * T * C);
}

template <typename E>
static void attention_gqa_forward(void *out, void *att, const void *qkv, int B, int T, int C,
                                  int NH, int NKV, wf_stream *stream)
{
  size_t nq = (size_t)B * T * (C + 2 * (size_t)NKV * (C / NH)), no = (size_t)B * T * C;
  float *w = widened(nq + no, stream);
  if (!w)
    return;
  load<E>(w, qkv, nq, stream);
  wf_cuda_attn_gqa_forward(w + nq, (float *)att, w, B, T, C, NH, NKV, stream);
  store<E>(out, w + nq, no, stream);
  release(w, stream);
}

/* The widened qkv, the fp32 dqkv and the widened dout in the scratch attention_scratch16
 * sized; dqkv stored in 16 bits from it. */
template <typename E>
static void attention_gqa_backward(void *dqkv, float *scratch, const void *dout, const void *qkv,
                                   const void *att, int B, int T, int C, int NH, int NKV,
                                   wf_stream *stream)
{
  size_t nx = (size_t)B * T * (C + 2 * (size_t)NKV * (C / NH)), ny = (size_t)B * T * C;
  float *w = scratch + part(wf_cuda_attn_scratch(B, T, C, NH));
  float *dw = w + part((size_t)B * T * 3 * C), *dy = dw + part((size_t)B * T * 3 * C);
  load<E>(w, qkv, nx, stream);
  load<E>(dy, dout, ny, stream);
  wf_cuda_attn_gqa_backward(dw, scratch, dy, w, (const float *)att, B, T, C, NH, NKV, stream);
  store<E>(dqkv, dw, nx, stream);
}

/* ---- attention in bf16: runtime.attention's path on the stored operands ------------------
 * Up to head size 128 the bf16 table's attention is attention_bf16's (attention_impl.cu:
 * cuDNN, the flash kernels, or the fp32 reference kernels, as runtime.attention picks for
 * the shape), reading qkv as stored. `att` has the fp32 table's layout
 * (wf_cuda_attn_saved): the lse (B,NH,T), then the output O (B,T,C) in bf16, which the
 * forward writes there and copies to `out` (backward reads O from `att`: the table's
 * backward is not handed the output). Backward reads dout as the output projection's
 * backward stored it in bf16, and its scratch (attention_scratch_bf16) holds the flash
 * kernels' D (B,NH,T); the path writes the bf16 dqkv straight into the table's (a bf16
 * activation gradient). Above head size 128, and for
 * fp16 (the tensor-core paths take bf16 only), the fp32 kernels on widened copies
 * (above). */

static bool tensor_core_heads(int C, int NH) { return NH > 0 && C % NH == 0 && C / NH <= 128; }

static size_t attention_scratch_bf16(int B, int T, int C, int NH)
{
  if (!tensor_core_heads(C, NH))
    return attention_scratch16(B, T, C, NH);
  return part((size_t)B * NH * T);
}

static void attention_gqa_forward_bf16(void *out, void *att, const void *qkv, int B, int T, int C,
                                       int NH, int NKV, wf_stream *stream)
{
  if (!tensor_core_heads(C, NH)) {
    attention_gqa_forward<__nv_bfloat16>(out, att, qkv, B, T, C, NH, NKV, stream);
    return;
  }
  size_t ny = (size_t)B * T * C;
  wf_bf16 *o = wf__attn_saved_out((float *)att, B, T, NH);
  wf_cuda_attention_bf16_forward(o, (float *)att, (const wf_bf16 *)qkv, B, T, C, NH, NKV, stream);
  if (ny > 0)
    WF_CUDA_OK(cudaMemcpyAsync(out, o, ny * sizeof(wf_bf16), cudaMemcpyDeviceToDevice,
                               (cudaStream_t)stream));
}

static void attention_gqa_backward_bf16(void *dqkv, float *scratch, const void *dout,
                                        const void *qkv, const void *att, int B, int T, int C,
                                        int NH, int NKV, wf_stream *stream)
{
  if (!tensor_core_heads(C, NH)) {
    attention_gqa_backward<__nv_bfloat16>(dqkv, scratch, dout, qkv, att, B, T, C, NH, NKV, stream);
    return;
  }
  size_t nx = (size_t)B * T * (C + 2 * (size_t)NKV * (C / NH));
  float *D = scratch, *lse = (float *)att;
  if (nx == 0)
    return;
  wf_cuda_attention_bf16_backward((wf_bf16 *)dqkv, D, (const wf_bf16 *)dout, (const wf_bf16 *)qkv,
                                  wf__attn_saved_out(lse, B, T, NH), lse, B, T, C, NH, NKV, stream);
}

/* Multi-head attention is the grouped case NKV = NH (as the fp32 launchers define it). */
template <typename E>
static void attention_forward(void *out, void *att, const void *qkv, int B, int T, int C, int NH,
                              wf_stream *stream)
{
  attention_gqa_forward<E>(out, att, qkv, B, T, C, NH, NH, stream);
}

template <typename E>
static void attention_backward(void *dqkv, float *scratch, const void *dout, const void *qkv,
                               const void *att, int B, int T, int C, int NH, wf_stream *stream)
{
  attention_gqa_backward<E>(dqkv, scratch, dout, qkv, att, B, T, C, NH, NH, stream);
}

static void attention_forward_bf16(void *out, void *att, const void *qkv, int B, int T, int C,
                                   int NH, wf_stream *stream)
{
  attention_gqa_forward_bf16(out, att, qkv, B, T, C, NH, NH, stream);
}

static void attention_backward_bf16(void *dqkv, float *scratch, const void *dout, const void *qkv,
                                    const void *att, int B, int T, int C, int NH, wf_stream *stream)
{
  attention_gqa_backward_bf16(dqkv, scratch, dout, qkv, att, B, T, C, NH, NH, stream);
}

/* The attention entries of T's table: bf16's tensor-core paths, fp16's widened copies. */
template <typename T> static void set_attention(wf_ktable *t)
{
  t->attention_scratch = attention_scratch16;
  t->attention_forward = attention_forward<T>;
  t->attention_backward = attention_backward<T>;
  t->attention_gqa_forward = attention_gqa_forward<T>;
  t->attention_gqa_backward = attention_gqa_backward<T>;
}

template <> void set_attention<__nv_bfloat16>(wf_ktable *t)
{
  t->attention_scratch = attention_scratch_bf16;
  t->attention_forward = attention_forward_bf16;
  t->attention_backward = attention_backward_bf16;
  t->attention_gqa_forward = attention_gqa_forward_bf16;
  t->attention_gqa_backward = attention_gqa_backward_bf16;
}

/* ---- AdamW writing the model's 16-bit copy (adamw.cu) -------------------------------------- */

template <typename E>
static void adamw_update_store(float *params, void *low, float *m, float *v, const float *grads,
                               size_t n, float lr, float beta1, float beta2, float eps,
                               float weight_decay, int t, float grad_scale, wf_stream *stream)
{
  wf__adamw_update_store(params, (E *)low, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, t,
                         grad_scale, stream);
}

/* ---- the fp32 table's activation entries ------------------------------------------------------
 */

extern "C" {
void wf__cuda32_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
                                  const float *w, const float *b, int N, int C, wf_stream *s)
{
  wf_cuda_layernorm_forward((float *)out, mean, rstd, (const float *)inp, w, b, N, C, s);
}

void wf__cuda32_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                   const void *inp, const float *w, const float *mean,
                                   const float *rstd, int N, int C, wf_stream *s)
{
  wf_cuda_layernorm_backward(dinp, dw, db, dout, (const float *)inp, w, mean, rstd, N, C, s);
}

void wf__cuda32_residual_layernorm_forward(void *res, void *ln, float *mean, float *rstd,
                                           const void *a, const float *b, const float *w,
                                           const float *bias, int N, int C, wf_stream *s)
{
  wf_cuda_residual_layernorm_forward((float *)res, (float *)ln, mean, rstd, (const float *)a, b, w,
                                     bias, N, C, s);
}

void wf__cuda32_matmul_forward(void *out, const void *inp, const void *w, const float *bias, int N,
                               int C, int OC, int lowp, wf_stream *s)
{
  wf_cuda_matmul_forward((float *)out, (const float *)inp, (const float *)w, bias, N, C, OC, lowp,
                         s);
}

void wf__cuda32_matmul_forward_f32(float *out, const void *inp, const void *w, const float *bias,
                                   int N, int C, int OC, int lowp, wf_stream *s)
{
  wf_cuda_matmul_forward(out, (const float *)inp, (const float *)w, bias, N, C, OC, lowp, s);
}

void wf__cuda32_matmul_gelu_forward(void *gelu_out, void *pre, const void *inp, const void *w,
                                    const float *bias, int N, int C, int OC, int lowp, wf_stream *s)
{
  wf_cuda_matmul_gelu_forward((float *)gelu_out, (float *)pre, (const float *)inp, (const float *)w,
                              bias, N, C, OC, lowp, s);
}

void wf__cuda32_matmul_backward(void *dinp, float *dw, float *db, const void *dout, const void *inp,
                                const void *w, int N, int C, int OC, int lowp, wf_stream *s)
{
  wf_cuda_matmul_backward((float *)dinp, dw, db, (const float *)dout, (const float *)inp,
                          (const float *)w, N, C, OC, lowp, s);
}

void wf__cuda32_matmul_backward_f32(float *dinp, float *dw, float *db, const void *dout,
                                    const void *inp, const void *w, int N, int C, int OC, int lowp,
                                    wf_stream *s)
{
  wf_cuda_matmul_backward(dinp, dw, db, (const float *)dout, (const float *)inp, (const float *)w,
                          N, C, OC, lowp, s);
}

void wf__cuda32_attention_forward(void *out, void *att, const void *qkv, int B, int T, int C,
                                  int NH, wf_stream *s)
{
  wf_cuda_attn_forward((float *)out, (float *)att, (const float *)qkv, B, T, C, NH, s);
}

void wf__cuda32_attention_backward(void *dqkv, float *scratch, const void *dout, const void *qkv,
                                   const void *att, int B, int T, int C, int NH, wf_stream *s)
{
  wf_cuda_attn_backward((float *)dqkv, scratch, (const float *)dout, (const float *)qkv,
                        (const float *)att, B, T, C, NH, s);
}

void wf__cuda32_gelu_forward(void *out, const void *inp, size_t N, wf_stream *s)
{
  wf_cuda_gelu_forward((float *)out, (const float *)inp, N, s);
}

void wf__cuda32_gelu_backward(void *dinp, const void *inp, const void *dout, size_t N, wf_stream *s)
{
  wf_cuda_gelu_backward((float *)dinp, (const float *)inp, (const float *)dout, N, s);
}

void wf__cuda32_residual_forward(void *out, const void *a, const float *b, size_t N, wf_stream *s)
{
  wf_cuda_residual_forward((float *)out, (const float *)a, b, N, s);
}

void wf__cuda32_xent_stats(float *mx, float *se, float *tl, const void *logits, const int *targets,
                           int N, int V, int ld, int v0, wf_stream *s)
{
  wf_cuda_xent_stats(mx, se, tl, (const float *)logits, targets, N, V, ld, v0, s);
}

void wf__cuda32_xent_backward(void *dlogits, const void *logits, const float *mx, const float *se,
                              const int *targets, float dloss, int N, int V, int ld, int v0,
                              wf_stream *s)
{
  wf_cuda_xent_backward((float *)dlogits, (const float *)logits, mx, se, targets, dloss, N, V, ld,
                        v0, s);
}

void wf__cuda32_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *w, float eps,
                                int N, int C, wf_stream *s)
{
  wf_cuda_rmsnorm_forward((float *)out, rstd, (const float *)inp, w, eps, N, C, s);
}

void wf__cuda32_rmsnorm_backward(float *dinp, float *dw, const float *dout, const void *inp,
                                 const float *w, const float *rstd, int N, int C, wf_stream *s)
{
  wf_cuda_rmsnorm_backward(dinp, dw, dout, (const float *)inp, w, rstd, N, C, s);
}

void wf__cuda32_residual_rmsnorm_forward(void *res, void *out, float *rstd, const void *a,
                                         const float *b, const float *w, float eps, int N, int C,
                                         wf_stream *s)
{
  wf_cuda_residual_rmsnorm_forward((float *)res, (float *)out, rstd, (const float *)a, b, w, eps, N,
                                   C, s);
}

void wf__cuda32_rope_forward(void *qkv, const float *cs, int B, int T, int NH, int NKV, int hs,
                             wf_stream *s)
{
  wf_cuda_rope_forward((float *)qkv, cs, B, T, NH, NKV, hs, s);
}

void wf__cuda32_rope_backward(void *dqkv, const float *cs, int B, int T, int NH, int NKV, int hs,
                              wf_stream *s)
{
  wf_cuda_rope_backward((float *)dqkv, cs, B, T, NH, NKV, hs, s);
}

void wf__cuda32_swiglu_forward(void *out, const void *inp, int N, int F, wf_stream *s)
{
  wf_cuda_swiglu_forward((float *)out, (const float *)inp, N, F, s);
}

void wf__cuda32_swiglu_backward(void *dinp, const void *inp, const void *dout, int N, int F,
                                wf_stream *s)
{
  wf_cuda_swiglu_backward((float *)dinp, (const float *)inp, (const float *)dout, N, F, s);
}

void wf__cuda32_attention_gqa_forward(void *out, void *att, const void *qkv, int B, int T, int C,
                                      int NH, int NKV, wf_stream *s)
{
  wf_cuda_attn_gqa_forward((float *)out, (float *)att, (const float *)qkv, B, T, C, NH, NKV, s);
}

void wf__cuda32_attention_gqa_backward(void *dqkv, float *scratch, const void *dout,
                                       const void *qkv, const void *att, int B, int T, int C,
                                       int NH, int NKV, wf_stream *s)
{
  wf_cuda_attn_gqa_backward((float *)dqkv, scratch, (const float *)dout, (const float *)qkv,
                            (const float *)att, B, T, C, NH, NKV, s);
}

void wf__cuda32_store(void *dst, const float *src, size_t n, wf_stream *s)
{
  if (n > 0 && dst != src)
    WF_CUDA_OK(
        cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, (cudaStream_t)s));
}

void wf__cuda32_load(float *dst, const void *src, size_t n, wf_stream *s)
{
  wf__cuda32_store(dst, (const float *)src, n, s);
}
}

/* ---- the 16-bit tables -------------------------------------------------------------------------
 */

/* bf16 logits' cross-entropy: classifier.cu's kernels (a block per row, 16-byte loads),
 * which read the logits at about 3 TB/s on an H100 where xent.cu's templated ones read
 * them at 0.6 (GPT-2 small, B 16: 0.55 against 2.6 ms for the statistics, 1.1 against
 * 2.7 for the gradient). The same sums to within their order; fp16 keeps xent.cu's. */
static void xent_stats_rows(float *row_max, float *row_sumexp, float *target_logit,
                            const void *logits, const int *targets, int N, int V, int ld,
                            int v_offset, wf_stream *s)
{
  wf_cuda_xent_stats_bf16(row_max, row_sumexp, target_logit, (const wf_bf16 *)logits, targets, N, V,
                          ld, v_offset, s);
}

static void xent_backward_rows(void *dlogits, const void *logits, const float *row_max,
                               const float *row_sumexp, const int *targets, float dloss, int N,
                               int V, int ld, int v_offset, wf_stream *s)
{
  wf_cuda_xent_backward_bf16((wf_bf16 *)dlogits, (const wf_bf16 *)logits, row_max, row_sumexp,
                             targets, dloss, N, V, ld, v_offset, s);
}

/* The fp32 table with its activation entries and format replaced by T's. */
template <typename T> static wf_ktable storage_table(const wf_ktable *k32, int format)
{
  wf_ktable t = *k32;
  t.layernorm_forward = layernorm_forward<T>;
  t.layernorm_backward = layernorm_backward<T>;
  t.residual_layernorm_forward = residual_layernorm_forward<T>;
  t.matmul_forward = matmul_forward<T>;
  t.matmul_forward_f32 = matmul_forward_f32<T>;
  t.matmul_gelu_forward = matmul_gelu_forward<T>;
  t.matmul_backward = matmul_backward<T>;
  t.matmul_backward_f32 = matmul_backward_f32<T>;
  set_attention<T>(&t);
  t.rmsnorm_forward = rmsnorm_forward<T>;
  t.rmsnorm_backward = rmsnorm_backward<T>;
  t.residual_rmsnorm_forward = residual_rmsnorm_forward<T>;
  t.rope_forward = rope_forward<T>;
  t.rope_backward = rope_backward<T>;
  t.swiglu_forward = swiglu_forward<T>;
  t.swiglu_backward = swiglu_backward<T>;
  t.gelu_forward = gelu_forward<T>;
  t.gelu_backward = gelu_backward<T>;
  t.residual_forward = residual_forward<T>;
  t.xent_stats = format == WF_PREC_BF16 ? xent_stats_rows : wf__xent_stats<T>;
  t.xent_backward = format == WF_PREC_BF16 ? xent_backward_rows : wf__xent_backward<T>;
  t.format = format;
  t.store = store<T>;
  t.load = load<T>;
  t.adamw_update_store = adamw_update_store<T>;
  return t;
}

extern "C" const wf_ktable *wf__cuda_storage(int format)
{
  static const wf_ktable bf16 = storage_table<__nv_bfloat16>(&wf__cuda_kernels, WF_PREC_BF16);
  static const wf_ktable fp16 = storage_table<__half>(&wf__cuda_kernels, WF_PREC_FP16);
  return format == WF_PREC_BF16   ? &bf16
         : format == WF_PREC_FP16 ? &fp16
         : format == WF_PREC_NO   ? &wf__cuda_kernels
                                  : NULL;
}
