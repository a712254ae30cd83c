/*
 * matmul.cu - out = inp . weight^T + bias on the GPU with cuBLASLt (twin of
 * kernels/cpu/matmul.c), one variant per element type of the operands (wf_kreg.h): fp32
 * operands (exact in lowp's format when lowp says so) first, then 16-bit ones.
 * Legend: N rows (B*T), C input channels, OC output channels.
 *
 * cuBLAS is column-major, weft row-major. A row-major (R, K) matrix is, byte for
 * byte, the column-major (K, R) matrix: its transpose. So each row-major product
 * is computed as its transpose, with the operands' roles swapped:
 *
 *   forward   out (N,OC) = inp (N,C) . W^T        out^T (OC,N) = W (OC,C) . inp^T (C,N)
 *             col-major: W is (C,OC), ld C, so op T; inp is (C,N), ld C, op N
 *             -> gemm(T, N, m=OC, n=N, k=C, W, C, inp, C, out, OC)
 *   dinp      dinp (N,C) = dout (N,OC) . W (OC,C)   dinp^T (C,N) = W^T (C,OC) . dout^T (OC,N)
 *             W col-major (C,OC) op N; dout col-major (OC,N), ld OC, op N
 *             -> gemm(N, N, m=C, n=N, k=OC, W, C, dout, OC, beta 0, dinp, C)
 *   dweight   dW (OC,C) += dout^T (OC,N) . inp (N,C) dW^T (C,OC) = inp^T (C,N) . dout (N,OC)
 *             inp col-major (C,N) op N; dout col-major (OC,N) op T
 *             -> gemm(N, T, m=C, n=OC, k=N, inp, C, dout, OC, beta 1, dW, C)
 *
 * Precision. With lowp = WF_PREC_NO the GEMM is true fp32 (CUBLAS_COMPUTE_32F) unless
 * TF32 was allowed (set_tf32, runtime.allow_tf32). With lowp = BF16 or FP16 the model
 * has already rounded every operand to that format (matmul.h's op), so the GEMM takes
 * the fp32 operands as they are and lets cuBLASLt narrow them on the way into the
 * tensor cores (CUBLAS_COMPUTE_32F_FAST_16BF / _16F, what PyTorch's "medium" matmul
 * precision uses): exact for such operands, products accumulated in fp32, the result
 * fp32. No 16-bit copies, so no scratch: a GEMM allocates nothing (a stream-ordered
 * pool of copies held 1.6 GB at GPT-2 124M, B 16, out of every count). Where the
 * heuristics offer no fast-16-bit algorithm the GEMM runs in fp32 (CUBLAS_COMPUTE_32F),
 * which computes the same exact products.
 *
 * Epilogues. The bias add (BIAS) and the MLP's bias + GELU (GELU_AUX_BIAS, which also
 * writes the pre-GELU values that backward needs) run inside the GEMM. cuBLASLt's GELU
 * is the tanh approximation, the same function as gelu.cu and the CPU twin. When the
 * heuristics find no algorithm with the epilogue (an aux leading dimension not a
 * multiple of 8, say), the GEMM runs plain and the epilogue's kernels follow it.
 *
 * dbias is a column sum of dout, cut over rows as well as columns so that it fills the
 * GPU (colsum.cu): deterministic, unlike cuBLASLt's BGRAD epilogues, which do not
 * promise it.
 */
#include <atomic>

#include "act_int.h"

static std::atomic<int> g_allow_tf32{0};

static void set_tf32(int allow) { g_allow_tf32.store(allow != 0); }

/* ---- small kernels ----------------------------------------------------------------- */

/* out (N,OC) += bias (OC) broadcast over rows */
__global__ static void add_bias_kernel(float *out, const float *bias, int OC, size_t n)
{
  WF_GRID_STRIDE(i, n) { out[i] += bias[i % (size_t)OC]; }
}

/* ---- one GEMM ----------------------------------------------------------------------- */

/* D (m,n) = op(A) op(B) + beta D in cuBLAS's column-major terms (D dense: ld m), then
 * + bias (m floats) when bias is set, then, when pre is set, pre = that and D = gelu of
 * it. */
struct gemm {
  cublasOperation_t ta, tb;
  int m, n, k;
  const void *A;
  int lda;
  const void *B;
  int ldb;
  float beta;
  float *D;
  cublasComputeType_t compute; /* fp32 operands always; see the top of the file */
  const float *bias;
  float *pre;
};

static cublasStatus_t set_attr(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t a,
                               const void *v, size_t bytes)
{
  return cublasLtMatmulDescSetAttribute(op, a, v, bytes);
}

/* The descriptors of g writing `out` with epilogue `epi`. A stored matrix op'd by T is
 * (k, m) rather than (m, k). */
static cublasStatus_t descs_make(wf__lt_descs *x, const gemm *g, cublasLtEpilogue_t epi,
                                 size_t workspace)
{
  WF__LT_TRY(cublasLtMatmulDescCreate(&x->op, g->compute, CUDA_R_32F));
  WF__LT_TRY(set_attr(x->op, CUBLASLT_MATMUL_DESC_TRANSA, &g->ta, sizeof g->ta));
  WF__LT_TRY(set_attr(x->op, CUBLASLT_MATMUL_DESC_TRANSB, &g->tb, sizeof g->tb));
  WF__LT_TRY(set_attr(x->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (g->bias && epi != CUBLASLT_EPILOGUE_DEFAULT)
    WF__LT_TRY(set_attr(x->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias));
  if (epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epi == CUBLASLT_EPILOGUE_GELU_AUX) {
    int64_t ld = g->m;
    WF__LT_TRY(set_attr(x->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->pre, sizeof g->pre));
    WF__LT_TRY(set_attr(x->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
  }
  bool at = g->ta == CUBLAS_OP_T, bt = g->tb == CUBLAS_OP_T;
  WF__LT_TRY(
      cublasLtMatrixLayoutCreate(&x->a, CUDA_R_32F, at ? g->k : g->m, at ? g->m : g->k, g->lda));
  WF__LT_TRY(
      cublasLtMatrixLayoutCreate(&x->b, CUDA_R_32F, bt ? g->n : g->k, bt ? g->k : g->n, g->ldb));
  WF__LT_TRY(cublasLtMatrixLayoutCreate(&x->d, CUDA_R_32F, g->m, g->n, g->m));
  WF__LT_TRY(cublasLtMatmulPreferenceCreate(&x->pref));
  WF__LT_TRY(cublasLtMatmulPreferenceSetAttribute(x->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &workspace, sizeof workspace));
  return CUBLAS_STATUS_SUCCESS;
}

/* Enqueue g into `out` with epilogue `epi` on s; NOT_SUPPORTED when the heuristics
 * find no algorithm for it. */
cublasStatus_t wf__lt_run(const wf__lt *lt, wf__lt_descs *x, cublasStatus_t made, const void *A,
                          const void *B, const float *beta, void *D, cudaStream_t s)
{
  cublasStatus_t st = made;
  cublasLtMatmulHeuristicResult_t h = {};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(lt->handle, x->op, x->a, x->b, x->d, x->d, x->pref, 1, &h,
                                        &found);
  if (st == CUBLAS_STATUS_SUCCESS && found == 0)
    st = CUBLAS_STATUS_NOT_SUPPORTED;
  const float one = 1.0f;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmul(lt->handle, x->op, &one, A, x->a, B, x->b, beta, D, x->d, D, x->d, &h.algo,
                        lt->workspace, lt->workspace_bytes, s);
  wf__lt_descs_destroy(x);
  return st;
}

static cublasStatus_t lt_enqueue(const wf__lt *lt, const gemm *g, float *out,
                                 cublasLtEpilogue_t epi, cudaStream_t s)
{
  wf__lt_descs x = {};
  cublasStatus_t made = descs_make(&x, g, epi, lt->workspace_bytes);
  return wf__lt_run(lt, &x, made, g->A, g->B, &g->beta, out, s);
}

/* The fused epilogue for g, or DEFAULT where cuBLASLt cannot do it: a GELU's aux
 * leading dimension must be a multiple of 8. */
static cublasLtEpilogue_t fused_epilogue(const gemm *g)
{
  if (g->pre)
    return g->m % 8  ? CUBLASLT_EPILOGUE_DEFAULT
           : g->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                     : CUBLASLT_EPILOGUE_GELU_AUX;
  return g->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

/* Run g under the GEMM lock: fused when cuBLASLt can, else plain and then the bias and
 * GELU kernels. An empty sum (k = 0) is no GEMM: out = 0 (beta is 0 wherever k can be). */
static bool run_gemm(const gemm *g, cudaStream_t s)
{
  float *plain_out = g->pre ? g->pre : g->D;
  size_t n = (size_t)g->m * g->n;
  bool fused = false;
  if (g->k == 0 && !WF_CUDA_OK(cudaMemsetAsync(plain_out, 0, n * sizeof(float), s)))
    return false;
  if (g->k > 0) {
    wf__lt lt;
    if (!wf__lt_begin(&lt, __FILE__, __LINE__))
      return false;
    cublasLtEpilogue_t epi = fused_epilogue(g);
    cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (epi != CUBLASLT_EPILOGUE_DEFAULT)
      st = lt_enqueue(&lt, g, g->D, epi, s);
    fused = st == CUBLAS_STATUS_SUCCESS;
    if (st == CUBLAS_STATUS_NOT_SUPPORTED)
      st = lt_enqueue(&lt, g, plain_out, CUBLASLT_EPILOGUE_DEFAULT, s);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED && g->compute != CUBLAS_COMPUTE_32F) {
      gemm exact = *g; /* the same products in fp32 (see the top of the file) */
      exact.compute = CUBLAS_COMPUTE_32F;
      st = lt_enqueue(&lt, &exact, plain_out, CUBLASLT_EPILOGUE_DEFAULT, s);
    }
    char what[96];
    snprintf(what, sizeof what, "cublasLtMatmul (m %d, n %d, k %d)", g->m, g->n, g->k);
    if (!wf__lt_end(st, __FILE__, __LINE__, what))
      return false;
  }
  if (fused)
    return true;
  if (g->bias) {
    add_bias_kernel<<<wf__grid_1d(n, 256), 256, 0, s>>>(plain_out, g->bias, g->m, n);
    if (!WF_CUDA_LAUNCHED("add_bias_kernel"))
      return false;
  }
  if (g->pre)
    wf__gelu_forward<float>(g->D, g->pre, n, (wf_stream *)s);
  return true;
}

/* ---- precision -------------------------------------------------------------------------- */

/* The compute type of a GEMM whose operands are representable in `lowp` (a wf_precision). */
static cublasComputeType_t compute_of(int lowp)
{
  if (lowp == WF_PREC_BF16)
    return CUBLAS_COMPUTE_32F_FAST_16BF;
  if (lowp == WF_PREC_FP16)
    return CUBLAS_COMPUTE_32F_FAST_16F;
  return g_allow_tf32.load() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

/* ---- the launchers ------------------------------------------------------------------ */

/* out^T (OC,N) = W (OC,C)^T-view . inp^T, then bias, then GELU into gelu_out when pre. */
static void forward(float *out, float *pre, const float *inp, const float *weight,
                    const float *bias, int N, int C, int OC, int lowp, cudaStream_t s)
{
  if (N <= 0 || OC <= 0 || C < 0)
    return;
  gemm g = {CUBLAS_OP_T, CUBLAS_OP_N,      OC,   N,  C, weight, C, inp, C, 0.0f,
            out,         compute_of(lowp), bias, pre};
  run_gemm(&g, s);
}

static void forward_32(void *out, const void *inp, const void *weight, const float *bias, int N,
                       int C, int OC, int lowp, wf_stream *stream)
{
  forward((float *)out, NULL, (const float *)inp, (const float *)weight, bias, N, C, OC, lowp,
          (cudaStream_t)stream);
}

static void forward_f32_32(float *out, const void *inp, const void *weight, const float *bias,
                           int N, int C, int OC, int lowp, wf_stream *stream)
{
  forward_32(out, inp, weight, bias, N, C, OC, lowp, stream);
}

static void gelu_forward_32(void *gelu_out, void *pre, const void *inp, const void *weight,
                            const float *bias, int N, int C, int OC, int lowp, wf_stream *stream)
{
  forward((float *)gelu_out, (float *)pre, (const float *)inp, (const float *)weight, bias, N, C,
          OC, lowp, (cudaStream_t)stream);
}

bool wf__dinp_nonempty(void *dinp, size_t bytes, int OC, cudaStream_t s)
{
  if (OC > 0)
    return true;
  if (dinp && bytes > 0) /* 0 is all zero bits in every format */
    WF_CUDA_OK(cudaMemsetAsync(dinp, 0, bytes, s));
  return false;
}

static void backward_f32_32(float *dinp, float *dweight, float *dbias, const void *dout_,
                            const void *inp, const void *weight, int N, int C, int OC, int lowp,
                            wf_stream *stream)
{
  const float *dout = (const float *)dout_;
  cudaStream_t s = (cudaStream_t)stream;
  if (N <= 0 || C < 0 || !wf__dinp_nonempty(dinp, (size_t)N * C * sizeof *dinp, OC, s))
    return;
  cublasComputeType_t t = compute_of(lowp);
  gemm gi = {CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight, C, dout, OC, 0.0f, dinp, t, NULL, NULL};
  gemm gw = {CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, OC, 1.0f, dweight, t, NULL, NULL};
  if (C > 0 && ((dinp && !run_gemm(&gi, s)) || (dweight && !run_gemm(&gw, s))))
    return;
  if (dbias)
    wf__bias_grad(dbias, dout, N, OC, s);
}

static void backward_32(void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                        const void *weight, int N, int C, int OC, int lowp, wf_stream *stream)
{
  backward_f32_32((float *)dinp, dweight, dbias, dout, inp, weight, N, C, OC, lowp, stream);
}

/* ---- GEMMs over 16-bit operands ---------------------------------------------------------------
 * cuBLASLt with the 16-bit operands as they are stored (the activations, the model's
 * 16-bit weight copy, the output gradient), fp32 compute and accumulation. An fp32 output
 * gets its fp32 bias from the BIAS epilogue. A 16-bit output adds its bias rounded to the
 * format (matmul.h's op), the value the model's 16-bit weight copy holds, as llm.c and
 * PyTorch's autocast do: cuBLASLt takes a bias only of the output's type (an fp32 bias
 * with a bf16 D is CUBLAS_STATUS_INVALID_VALUE on an H100, cuBLASLt 13.1), so the rounded
 * bias lets the BIAS epilogue write D once from the fp32 sum (run16_biased). Where
 * cuBLASLt refuses that, the GEMM writes fp32 blocks with the rounded bias widened and one
 * kernel rounds them once (run16_rounded), the same arithmetic; adding a bias to an
 * already rounded output would round twice. The matmul + GELU then stores the GELU of the
 * stored pre-activation, the CPU's composition. dbias, like every column sum, is
 * colsum.cu's. Backward's dinp is written in the format (backward: the output gradient
 * attention's, GELU's or SwiGLU's backward reads next) or in fp32 (backward_f32: a
 * column-parallel layer's, which the tp reduction adds). */

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

/* out = x rounded to T; with gelu_out, also the GELU of that stored value, as the CPU's
 * composition computes it. */
template <typename T>
__global__ static void round_gelu_kernel(T *out, T *gelu_out, const float *x, size_t n)
{
  WF_GRID_STRIDE(i, n)
  {
    wf__st(out, i, x[i]);
    if (gelu_out)
      wf__st(gelu_out, i, wf__gelu(wf__ld(out, i)));
  }
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
 * model's 16-bit copy of the bias holds (matmul.h's op): one GEMM with cuBLASLt's BIAS
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
    wf__gelu_forward<T>(gelu_out, g->D, n, (wf_stream *)s); /* a failure is kept, as any */
  }
  return WF_CUDA_OK(cudaFreeAsync(tmp, s)) && ok;
}

/* out^T (OC,N) = W (OC,C)^T-view . inp^T (+ bias): the fp32 forward above, out of type dt */
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
static void forward_16(void *out, const void *inp, const void *w, const float *bias, int N, int C,
                       int OC, int /* lowp: the format */, wf_stream *s)
{
  forward16<T>(out, cuda_type<T>(), inp, w, bias, N, C, OC, s);
}

template <typename T>
static void forward_f32_16(float *out, const void *inp, const void *w, const float *bias, int N,
                           int C, int OC, int /* lowp: the format */, wf_stream *s)
{
  forward16<T>(out, CUDA_R_32F, inp, w, bias, N, C, OC, s);
}

template <typename T>
static void gelu_forward_16(void *gelu_out, void *pre, const void *inp, const void *w,
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
 * dout^T . inp in fp32: the fp32 backward above with 16-bit operands. A 16-bit dinp is the
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
static void backward_16(void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,
                        const void *w, int N, int C, int OC, int /* lowp: the format */,
                        wf_stream *s)
{
  backward16<T>(dinp, cuda_type<T>(), dweight, dbias, dout, inp, w, N, C, OC, s);
}

template <typename T>
static void backward_f32_16(float *dinp, float *dweight, float *dbias, const void *dout,
                            const void *inp, const void *w, int N, int C, int OC,
                            int /* lowp: the format */, wf_stream *s)
{
  backward16<T>(dinp, CUDA_R_32F, dweight, dbias, dout, inp, w, N, C, OC, s);
}

/* ---- the op (wf_kreg.h): one variant per element type of the operands ----------------- */

static const wf_matmul_op f32 = {forward_32,  forward_f32_32,  gelu_forward_32,
                                 backward_32, backward_f32_32, set_tf32};
template <typename T>
static const wf_matmul_op op16 = {forward_16<T>,  forward_f32_16<T>,  gelu_forward_16<T>,
                                  backward_16<T>, backward_f32_16<T>, set_tf32};
const wf_kvariants wf__cuda_matmul =
    WF_KV(matmul, WF_OP_VERSION_matmul, &f32, &op16<__nv_bfloat16>, &op16<__half>);
