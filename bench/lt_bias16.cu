/*
 * lt_bias16.cu - does cuBLASLt's BIAS epilogue with a 16-bit bias and a 16-bit output
 * write D = round(A.B + bias), the sum rounded once? A reproducer, outside weft, for
 * the shapes where matmul.cu's run16_biased stopped using the epilogue.
 *
 *     lt_bias16 [--candidates 8]
 *
 * weft's forward GEMM as matmul.cu makes it: D (m x n, column-major, ld m) = W^T-view .
 * x with A = W stored (m rows of k, lda k, transposed), B = x (n rows of k, ldb k), bf16
 * operands, fp32 compute, a bf16 bias of m, a bf16 D, beta 0. For each (m, n, k) of a
 * grid crossing odd and multiple-of-8 sizes, and for each of the heuristics' first
 * --candidates algorithms: the largest distance of D from the exact sum plus the bias
 * rounded once to bf16, in bf16 steps (units in the last place of the exact value), and
 * how many elements are more than 1 step away. One step is what a different summation
 * order may give (an fp32 sum of at most 72 products of bf16 values, each exact in fp32,
 * is within 72 x 2^-24 relative of the exact sum, far below a bf16 step of 2^-8, so the
 * sum can only cross one rounding boundary); 2 or more is a wrong epilogue. A row
 * "fp32 D" runs the same GEMM with an fp32 D and an fp32 bias (the widened bf16 bias)
 * and rounds on the host, the control. Operands are seeded random bf16 values in
 * [-1, 1]. Exits 77 without a GPU, 1 when a call fails; never a test.
 */
#include <cmath>
#include <cstring>
#include <vector>

#include <cuda_bf16.h>

#define BENCH_NAME "lt_bias16"
#include "lt_common.h"

typedef __nv_bfloat16 bf16;

/* the value rounded to bf16 (nearest even, through fp32), widened back */
static double bf16_round(double d) { return __bfloat162float(__float2bfloat16_rn((float)d)); }

/* the distance of x from exact in steps of bf16 at exact's magnitude */
static double steps(double x, double exact)
{
  double e = exact == 0 ? 1e-30 : fabs(exact);
  double step = ldexp(1.0, (int)floor(log2(e)) - 7);
  return fabs(x - exact) / step;
}

struct shape {
  int m, n, k;
};

struct result {
  double worst;
  int bad;
  bool ran;
};

static result run(cublasLtHandle_t h, const shape &s, int cand, bool f32, void *dA, void *dB,
                  void *dbias16, void *dbias32, void *dD, void *work, size_t work_bytes,
                  const std::vector<double> &exact)
{
  result r = {0, 0, false};
  lt_descs x;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
  cudaDataType_t dt = f32 ? CUDA_R_32F : CUDA_R_16BF;
  void *bias = f32 ? dbias32 : dbias16;
  if (!lt_make(x, CUBLAS_OP_T, CUBLAS_OP_N, s.m, s.n, s.k, dt, work_bytes) ||
      cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) ||
      cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) ||
      cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &dt, sizeof dt)) {
    fprintf(stderr, "lt_bias16: cuBLASLt refused the descriptors of m %d, n %d, k %d\n", s.m, s.n,
            s.k);
    exit(1);
  }
  cublasLtMatmulHeuristicResult_t res[16];
  int found = 0;
  cublasLtMatmulAlgoGetHeuristic(h, x.op, x.a, x.b, x.d, x.d, x.pref, cand + 1, res, &found);
  float alpha = 1, beta = 0;
  if (cand < found &&
      cublasLtMatmul(h, x.op, &alpha, dA, x.a, dB, x.b, &beta, dD, x.d, dD, x.d, &res[cand].algo,
                     work, work_bytes, 0) == CUBLAS_STATUS_SUCCESS) {
    CK(cudaDeviceSynchronize());
    size_t n = (size_t)s.m * s.n;
    std::vector<float> out(n);
    std::vector<bf16> out16(n);
    if (f32)
      CK(cudaMemcpy(out.data(), dD, n * 4, cudaMemcpyDeviceToHost));
    else
      CK(cudaMemcpy(out16.data(), dD, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) {
      double got = f32 ? bf16_round(out[i]) : (double)__bfloat162float(out16[i]);
      double st = steps(got, exact[i]);
      r.worst = fmax(r.worst, st);
      r.bad += st > 1.0;
    }
    r.ran = true;
  }
  return r;
}

int main(int argc, char **argv)
{
  int candidates = 8;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--candidates") && i + 1 < argc)
      candidates = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: lt_bias16 [--candidates N (1-16)]\n");
      return 2;
    }
  }
  if (candidates < 1 || candidates > 16) {
    fprintf(stderr, "lt_bias16: --candidates is 1 to 16\n");
    return 2;
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("lt_bias16: no GPU\n");
    return 77;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  cublasLtHandle_t h;
  if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "lt_bias16: cublasLtCreate failed\n");
    return 1;
  }
  printf("%s, cuBLASLt %zu: D = round(A.B + bias), bf16 operands and bias, fp32 compute\n",
         prop.name, cublasLtGetVersion());
  printf("| m | n | k | D | algorithm | worst, bf16 steps | elements > 1 step |\n");
  printf("|---:|---:|---:|---|---:|---:|---:|\n");
  const shape shapes[] = {{29, 37, 45}, {29, 37, 48}, {29, 40, 45}, {29, 40, 48}, {32, 37, 45},
                          {32, 37, 48}, {32, 40, 45}, {32, 40, 48}, {64, 40, 72}, {64, 37, 45}};
  size_t work_bytes = 32u << 20;
  void *work;
  CK(cudaMalloc(&work, work_bytes));
  srand(1337);
  for (const shape &s : shapes) {
    std::vector<bf16> A((size_t)s.m * s.k), B((size_t)s.n * s.k), bias(s.m);
    std::vector<float> bias32(s.m);
    for (auto &x : A)
      x = __float2bfloat16_rn((float)(2.0 * rand() / RAND_MAX - 1));
    for (auto &x : B)
      x = __float2bfloat16_rn((float)(2.0 * rand() / RAND_MAX - 1));
    for (int i = 0; i < s.m; i++) {
      bias[i] = __float2bfloat16_rn((float)(2.0 * rand() / RAND_MAX - 1));
      bias32[i] = __bfloat162float(bias[i]);
    }
    /* exact: D[i + j m] = sum_p A[i k + p] B[j k + p] + bias[i], rounded once */
    std::vector<double> exact((size_t)s.m * s.n);
    for (int j = 0; j < s.n; j++)
      for (int i = 0; i < s.m; i++) {
        double acc = bias32[i];
        for (int p = 0; p < s.k; p++)
          acc += (double)__bfloat162float(A[(size_t)i * s.k + p]) *
                 __bfloat162float(B[(size_t)j * s.k + p]);
        exact[(size_t)j * s.m + i] = bf16_round(acc);
      }
    void *dA, *dB, *db16, *db32, *dD;
    CK(cudaMalloc(&dA, A.size() * 2));
    CK(cudaMalloc(&dB, B.size() * 2));
    CK(cudaMalloc(&db16, 256 + s.m * 2));
    CK(cudaMalloc(&db32, s.m * 4));
    CK(cudaMalloc(&dD, exact.size() * 4));
    CK(cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db16, bias.data(), s.m * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db32, bias32.data(), s.m * 4, cudaMemcpyHostToDevice));
    for (int f32 = 1; f32 >= 0; f32--)
      for (int c = 0; c < (f32 ? 1 : candidates); c++) {
        result r = run(h, s, c, f32, dA, dB, db16, db32, dD, work, work_bytes, exact);
        if (r.ran)
          printf("| %d | %d | %d | %s | %d | %.2f | %d |\n", s.m, s.n, s.k, f32 ? "fp32" : "bf16",
                 c, r.worst, r.bad);
      }
    CK(cudaFree(dA));
    CK(cudaFree(dB));
    CK(cudaFree(db16));
    CK(cudaFree(db32));
    CK(cudaFree(dD));
  }
  CK(cudaFree(work));
  cublasLtDestroy(h);
  return 0;
}
