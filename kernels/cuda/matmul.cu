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
 *   dinp      dinp (N,C) += dout (N,OC) . W (OC,C)  dinp^T (C,N) = W^T (C,OC) . dout^T (OC,N)
 *             W col-major (C,OC) op N; dout col-major (OC,N), ld OC, op N
 *             -> gemm(N, N, m=C, n=N, k=OC, W, C, dout, OC, beta 1, dinp, C)
 *   dweight   dW (OC,C) += dout^T (OC,N) . inp (N,C) dW^T (C,OC) = inp^T (C,N) . dout (N,OC)
 *             inp col-major (C,N) op N; dout col-major (OC,N) op T
 *             -> gemm(N, T, m=C, n=OC, k=N, inp, C, dout, OC, beta 1, dW, C)
 *
 * Precision. With lowp = WF_PREC_NO the GEMM is true fp32 (CUBLAS_COMPUTE_32F) unless
 * TF32 was allowed (set_tf32, runtime.allow_tf32). With lowp = BF16 or FP16 the model
 * has already rounded every operand to that format (wf_ktable.h), so converting them to
 * 16-bit scratch loses nothing; the tensor cores multiply them and accumulate in fp32,
 * and the result stays fp32. The scratch is stream-ordered (cudaMallocAsync), so the
 * driver's pool hands back the same bytes step after step without a synchronization.
 *
 * Epilogues. The bias add (BIAS) and the MLP's bias + GELU (GELU_AUX_BIAS, which also
 * writes the pre-GELU values that backward needs) run inside the GEMM. cuBLASLt's GELU
 * is the tanh approximation, the same function as gelu.cu and the CPU twin. When the
 * heuristics find no algorithm with the epilogue (an aux leading dimension not a
 * multiple of 8, say), the GEMM runs plain and the epilogue's kernels follow it.
 *
 * dbias is a column sum of dout done like layernorm's parameter gradients (32 columns
 * per block, 8 thread rows over N, combined in shared memory): deterministic, unlike
 * cuBLASLt's BGRAD epilogues, which do not promise it.
 */
#include <atomic>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_int.h"

#define COL_TILE  32
#define ROW_LANES 8

static std::atomic<int> g_allow_tf32{0};

extern "C" void wf_cuda_set_tf32(int allow) { g_allow_tf32.store(allow != 0); }

/* ---- small kernels ----------------------------------------------------------------- */

/* out (N,OC) += bias (OC) broadcast over rows */
__global__ static void add_bias_kernel(float *out, const float *bias, int OC, size_t n)
{
  WF_GRID_STRIDE(i, n) { out[i] += bias[i % (size_t)OC]; }
}

/* dbias (OC) += sum over rows of dout (N,OC). Block (32, 8). */
__global__ static void bias_backward_kernel(float *dbias, const float *dout, int N, int OC)
{
  __shared__ float part[ROW_LANES][COL_TILE + 1];
  int c = blockIdx.x * COL_TILE + threadIdx.x;
  float acc = 0.0f;
  if (c < OC)
    for (int n = threadIdx.y; n < N; n += ROW_LANES)
      acc += dout[(size_t)n * OC + c];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= OC)
    return;
  for (int r = 1; r < ROW_LANES; r++)
    acc += part[r][threadIdx.x];
  dbias[c] += acc;
}

/* dst = src in 16 bits; exact, since the model rounded src to that format. */
__device__ static void store16(__nv_bfloat16 *p, float x) { *p = __float2bfloat16_rn(x); }
__device__ static void store16(__half *p, float x) { *p = __float2half_rn(x); }

template <typename T> __global__ static void narrow_kernel(T *dst, const float *src, size_t n)
{
  WF_GRID_STRIDE(i, n) { store16(dst + i, src[i]); }
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
  cudaDataType_t ab; /* A and B: CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F */
  const float *bias;
  float *pre;
};

struct lt_descs {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, d;
  cublasLtMatmulPreference_t pref;
};

static void descs_destroy(lt_descs *x)
{
  if (x->pref)
    cublasLtMatmulPreferenceDestroy(x->pref);
  if (x->d)
    cublasLtMatrixLayoutDestroy(x->d);
  if (x->b)
    cublasLtMatrixLayoutDestroy(x->b);
  if (x->a)
    cublasLtMatrixLayoutDestroy(x->a);
  if (x->op)
    cublasLtMatmulDescDestroy(x->op);
}

#define LT_TRY(call)                                                                               \
  do {                                                                                             \
    cublasStatus_t st_ = (call);                                                                   \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                              \
      return st_;                                                                                  \
  } while (0)

static cublasStatus_t set_attr(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t a,
                               const void *v, size_t bytes)
{
  return cublasLtMatmulDescSetAttribute(op, a, v, bytes);
}

/* The descriptors of g writing `out` with epilogue `epi`. A stored matrix op'd by T is
 * (k, m) rather than (m, k). */
static cublasStatus_t descs_make(lt_descs *x, const gemm *g, cublasLtEpilogue_t epi,
                                 size_t workspace)
{
  cublasComputeType_t compute = g->ab == CUDA_R_32F && g_allow_tf32.load()
                                    ? CUBLAS_COMPUTE_32F_FAST_TF32
                                    : CUBLAS_COMPUTE_32F;
  LT_TRY(cublasLtMatmulDescCreate(&x->op, compute, CUDA_R_32F));
  LT_TRY(set_attr(x->op, CUBLASLT_MATMUL_DESC_TRANSA, &g->ta, sizeof g->ta));
  LT_TRY(set_attr(x->op, CUBLASLT_MATMUL_DESC_TRANSB, &g->tb, sizeof g->tb));
  LT_TRY(set_attr(x->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (g->bias && epi != CUBLASLT_EPILOGUE_DEFAULT)
    LT_TRY(set_attr(x->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias));
  if (epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epi == CUBLASLT_EPILOGUE_GELU_AUX) {
    int64_t ld = g->m;
    LT_TRY(set_attr(x->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->pre, sizeof g->pre));
    LT_TRY(set_attr(x->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
  }
  bool at = g->ta == CUBLAS_OP_T, bt = g->tb == CUBLAS_OP_T;
  LT_TRY(cublasLtMatrixLayoutCreate(&x->a, g->ab, at ? g->k : g->m, at ? g->m : g->k, g->lda));
  LT_TRY(cublasLtMatrixLayoutCreate(&x->b, g->ab, bt ? g->n : g->k, bt ? g->k : g->n, g->ldb));
  LT_TRY(cublasLtMatrixLayoutCreate(&x->d, CUDA_R_32F, g->m, g->n, g->m));
  LT_TRY(cublasLtMatmulPreferenceCreate(&x->pref));
  LT_TRY(cublasLtMatmulPreferenceSetAttribute(x->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &workspace, sizeof workspace));
  return CUBLAS_STATUS_SUCCESS;
}

/* Enqueue g into `out` with epilogue `epi` on s; NOT_SUPPORTED when the heuristics
 * find no algorithm for it. */
static cublasStatus_t lt_enqueue(const wf__lt *lt, const gemm *g, float *out,
                                 cublasLtEpilogue_t epi, cudaStream_t s)
{
  lt_descs x = {};
  cublasStatus_t st = descs_make(&x, g, epi, lt->workspace_bytes);
  cublasLtMatmulHeuristicResult_t h = {};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st =
        cublasLtMatmulAlgoGetHeuristic(lt->handle, x.op, x.a, x.b, x.d, x.d, x.pref, 1, &h, &found);
  if (st == CUBLAS_STATUS_SUCCESS && found == 0)
    st = CUBLAS_STATUS_NOT_SUPPORTED;
  const float one = 1.0f;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmul(lt->handle, x.op, &one, g->A, x.a, g->B, x.b, &g->beta, out, x.d, out, x.d,
                        &h.algo, lt->workspace, lt->workspace_bytes, s);
  descs_destroy(&x);
  return st;
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

/* ---- operands in 16 bits -------------------------------------------------------------- */

static cudaDataType_t operand_type(int lowp)
{
  return lowp == WF_PREC_BF16 ? CUDA_R_16BF : lowp == WF_PREC_FP16 ? CUDA_R_16F : CUDA_R_32F;
}

/* Up to three fp32 operands as the GEMM's operand type: themselves in fp32, else
 * copies in one stream-ordered scratch allocation, freed by operands_free. */
struct operands {
  const void *p[3];
  void *scratch;
};

#define SCRATCH_ALIGN 256 /* cudaMalloc's alignment, for each copy */

static bool operands_make(operands *o, const float *const src[3], const size_t n[3], int lowp,
                          cudaStream_t s)
{
  size_t off[3], total = 0;
  *o = operands{};
  for (int i = 0; i < 3; i++)
    o->p[i] = src[i];
  if (operand_type(lowp) == CUDA_R_32F)
    return true;
  for (int i = 0; i < 3; i++) {
    off[i] = total;
    total += src[i] ? (n[i] * 2 + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN : 0;
  }
  if (!WF_CUDA_OK(cudaMallocAsync(&o->scratch, total, s)))
    return false;
  for (int i = 0; i < 3; i++) {
    if (!src[i] || n[i] == 0)
      continue;
    void *dst = (char *)o->scratch + off[i];
    unsigned grid = wf__grid_1d(n[i], 256);
    if (lowp == WF_PREC_BF16)
      narrow_kernel<<<grid, 256, 0, s>>>((__nv_bfloat16 *)dst, src[i], n[i]);
    else
      narrow_kernel<<<grid, 256, 0, s>>>((__half *)dst, src[i], n[i]);
    if (!WF_CUDA_LAUNCHED("narrow_kernel"))
      return false;
    o->p[i] = dst;
  }
  return true;
}

static void operands_free(operands *o, cudaStream_t s)
{
  if (o->scratch)
    WF_CUDA_OK(cudaFreeAsync(o->scratch, s));
}

/* ---- the launchers ------------------------------------------------------------------ */

/* out^T (OC,N) = W (OC,C)^T-view . inp^T, then bias, then GELU into gelu_out when pre. */
static void forward(float *out, float *pre, const float *inp, const float *weight,
                    const float *bias, int N, int C, int OC, int lowp, cudaStream_t s)
{
  if (N <= 0 || OC <= 0 || C < 0)
    return;
  const float *src[3] = {weight, inp, NULL};
  size_t n[3] = {(size_t)OC * C, (size_t)N * C, 0};
  operands o;
  if (operands_make(&o, src, n, lowp, s)) {
    gemm g = {CUBLAS_OP_T, CUBLAS_OP_N,        OC,   N,  C, o.p[0], C, o.p[1], C, 0.0f,
              out,         operand_type(lowp), bias, pre};
    run_gemm(&g, s);
  }
  operands_free(&o, s);
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

extern "C" void wf_cuda_matmul_backward(float *dinp, float *dweight, float *dbias,
                                        const float *dout, const float *inp, const float *weight,
                                        int N, int C, int OC, int lowp, wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  if (N <= 0 || OC <= 0 || C < 0)
    return;
  if (C > 0 && (dinp || dweight)) {
    const float *src[3] = {dinp ? weight : NULL, dout, dweight ? inp : NULL};
    size_t n[3] = {(size_t)OC * C, (size_t)N * OC, (size_t)N * C};
    cudaDataType_t t = operand_type(lowp);
    operands o;
    bool ok = operands_make(&o, src, n, lowp, s);
    gemm gi = {CUBLAS_OP_N, CUBLAS_OP_N, C,    N,    OC, o.p[0], C,
               o.p[1],      OC,          1.0f, dinp, t,  NULL,   NULL};
    gemm gw = {CUBLAS_OP_N, CUBLAS_OP_T, C,    OC,      N, o.p[2], C,
               o.p[1],      OC,          1.0f, dweight, t, NULL,   NULL};
    ok = ok && (!dinp || run_gemm(&gi, s)) && (!dweight || run_gemm(&gw, s));
    operands_free(&o, s);
    if (!ok)
      return;
  }
  if (!dbias)
    return;
  unsigned grid = (unsigned)((OC + COL_TILE - 1) / COL_TILE);
  bias_backward_kernel<<<grid, dim3(COL_TILE, ROW_LANES), 0, s>>>(dbias, dout, N, OC);
  WF_CUDA_LAUNCHED("bias_backward_kernel");
}
