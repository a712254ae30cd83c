/*
 * matmul.cu - out = inp . weight^T + bias on the GPU with cuBLASLt (twin of
 * wf_matmul_*). Legend: N rows (B*T), C input channels, OC output channels.
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
 * has already rounded every operand to that format (wf_ktable.h), so the GEMM takes
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

extern "C" void wf_cuda_set_tf32(int allow) { g_allow_tf32.store(allow != 0); }

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
    wf_cuda_gelu_forward(g->D, g->pre, n, (wf_stream *)s);
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

extern "C" void wf_cuda_matmul_forward(float *out, const float *inp, const float *weight,
                                       const float *bias, int N, int C, int OC, int lowp,
                                       wf_stream *stream)
{
  forward(out, NULL, inp, weight, bias, N, C, OC, lowp, (cudaStream_t)stream);
}

extern "C" void wf_cuda_matmul_gelu_forward(float *gelu_out, float *pre, const float *inp,
                                            const float *weight, const float *bias, int N, int C,
                                            int OC, int lowp, wf_stream *stream)
{
  forward(gelu_out, pre, inp, weight, bias, N, C, OC, lowp, (cudaStream_t)stream);
}

bool wf__dinp_nonempty(void *dinp, size_t bytes, int OC, cudaStream_t s)
{
  if (OC > 0)
    return true;
  if (dinp && bytes > 0) /* 0 is all zero bits in every format */
    WF_CUDA_OK(cudaMemsetAsync(dinp, 0, bytes, s));
  return false;
}

extern "C" void wf_cuda_matmul_backward(float *dinp, float *dweight, float *dbias,
                                        const float *dout, const float *inp, const float *weight,
                                        int N, int C, int OC, int lowp, wf_stream *stream)
{
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
