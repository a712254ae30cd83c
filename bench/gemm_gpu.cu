/*
 * gemm_gpu.cu - cuBLASLt at GPT-2 124M's GEMM shapes, the way weft calls it and the ways
 * it could: which algorithm the heuristics pick against the fastest of their candidates,
 * what a call costs the host, and 16-bit against fp32 outputs in the backward GEMMs.
 *
 *     gemm_gpu [-B 16] [-T 1024] [--candidates 8] [--json FILE]
 *
 * For each linear layer of GPT-2 124M (qkv, attproj, fc, fcproj, the lm head at the padded
 * vocabulary), three GEMMs in weft's column-major terms (kernels/cuda/matmul.cu):
 *   fwd    out (OC, N) = W^T-view . x       bf16 out, beta 0            (TN)
 *   dinp   dx  (C, N) = W . dout            fp32 out, beta 0 (weft)     (NN)
 *   dw     dW  (C, OC) += x . dout^T        fp32 out, beta 1 (weft)     (NT)
 * and the two backward ones again with bf16 outputs and beta 0 (what a trainer that keeps
 * 16-bit gradients computes). Each row: the heuristics' first algorithm, the fastest of
 * their first --candidates (its rank among them), both in TFLOP/s (the median of 10 timed
 * runs after 3 warm-ups, CUDA events), and the host's microseconds to create the
 * descriptors, ask the heuristics and destroy them, which weft does on every call. Never
 * a test; exits 77 without a GPU.
 */
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define BENCH_NAME "gemm_gpu"
#include "lt_common.h"

struct gemm {
  const char *layer, *pass;
  cublasOperation_t ta, tb;
  int m, n, k;
  cudaDataType_t dt;
  float beta;
};

static const size_t WORKSPACE = (size_t)32 << 20; /* weft's (kernels/cuda/backend.cu) */

/* weft's descriptors for g (matmul.cu descs16_make, no epilogue). */
static bool make(lt_descs &x, const gemm &g)
{
  return lt_make(x, g.ta, g.tb, g.m, g.n, g.k, g.dt, WORKSPACE);
}

struct bufs {
  void *A, *B, *D, *ws;
};

static double time_algo(cublasLtHandle_t h, const lt_descs &x, const gemm &g, const bufs &b,
                        const cublasLtMatmulAlgo_t *algo, cudaEvent_t e0, cudaEvent_t e1)
{
  const float one = 1.0f;
  std::vector<float> ms;
  for (int i = 0; i < 13; i++) {
    CK(cudaEventRecord(e0));
    if (cublasLtMatmul(h, x.op, &one, b.A, x.a, b.B, x.b, &g.beta, b.D, x.d, b.D, x.d, algo, b.ws,
                       WORKSPACE, 0) != CUBLAS_STATUS_SUCCESS)
      return -1;
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t;
    CK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 3)
      ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/* Host microseconds per call of weft's per-GEMM set-up: descriptors, heuristics, destroy. */
static double host_us(cublasLtHandle_t h, const gemm &g)
{
  const int reps = 200;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; i++) {
    lt_descs x;
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    if (make(x, g))
      cublasLtMatmulAlgoGetHeuristic(h, x.op, x.a, x.b, x.d, x.d, x.pref, 1, &r, &found);
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / reps;
}

int main(int argc, char **argv)
{
  int B = 16, T = 1024, cand = 8;
  const char *json = nullptr;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-B") && i + 1 < argc)
      B = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-T") && i + 1 < argc)
      T = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--candidates") && i + 1 < argc)
      cand = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--json") && i + 1 < argc)
      json = argv[++i];
    else {
      fprintf(stderr, "usage: gemm_gpu [-B 16] [-T 1024] [--candidates 8] [--json FILE]\n");
      return 2;
    }
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("skip: no GPU\n");
    return 77;
  }
  cand = std::max(1, std::min(cand, 32));
  const int N = B * T, C = 768, Vp = 50304;
  struct lin {
    const char *name;
    int in, out;
  } lins[] = {{"qkv", C, 3 * C},
              {"attproj", C, C},
              {"fc", C, 4 * C},
              {"fcproj", 4 * C, C},
              {"lm head", C, Vp}};
  std::vector<gemm> gs;
  for (auto &l : lins) {
    gs.push_back({l.name, "fwd", CUBLAS_OP_T, CUBLAS_OP_N, l.out, N, l.in, CUDA_R_16BF, 0.0f});
    gs.push_back({l.name, "dinp f32", CUBLAS_OP_N, CUBLAS_OP_N, l.in, N, l.out, CUDA_R_32F, 0.0f});
    gs.push_back({l.name, "dw f32+=", CUBLAS_OP_N, CUBLAS_OP_T, l.in, l.out, N, CUDA_R_32F, 1.0f});
    gs.push_back(
        {l.name, "dinp bf16", CUBLAS_OP_N, CUBLAS_OP_N, l.in, N, l.out, CUDA_R_16BF, 0.0f});
    gs.push_back({l.name, "dw bf16", CUBLAS_OP_N, CUBLAS_OP_T, l.in, l.out, N, CUDA_R_16BF, 0.0f});
  }
  size_t most = (size_t)N * Vp; /* the largest operand or output, in elements */
  bufs b;
  CK(cudaMalloc(&b.A, most * 2));
  CK(cudaMalloc(&b.B, most * 2));
  CK(cudaMalloc(&b.D, most * 4));
  CK(cudaMalloc(&b.ws, WORKSPACE));
  {
    std::vector<__nv_bfloat16> h(1 << 20);
    for (size_t i = 0; i < h.size(); i++)
      h[i] = __float2bfloat16((float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f);
    for (size_t at = 0; at < most; at += h.size()) {
      size_t n = std::min(h.size(), most - at) * 2;
      CK(cudaMemcpy((char *)b.A + at * 2, h.data(), n, cudaMemcpyHostToDevice));
      CK(cudaMemcpy((char *)b.B + at * 2, h.data(), n, cudaMemcpyHostToDevice));
    }
    CK(cudaMemset(b.D, 0, most * 4));
  }
  cublasLtHandle_t h;
  if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS)
    return 1;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  printf("gemm_gpu on %s: GPT-2 124M, B %d x T %d (N %d), bf16 operands, fp32 compute; the "
         "heuristics' first of %d candidates vs their fastest\n\n",
         p.name, B, T, N, cand);
  printf("| layer | GEMM | m | n | k | first TFLOP/s | best TFLOP/s | best's rank | host us "
         "per set-up |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  FILE *jf = json ? fopen(json, "w") : nullptr;
  if (jf)
    fprintf(jf, "{\"device\": \"%s\", \"B\": %d, \"T\": %d, \"rows\": [", p.name, B, T);
  for (size_t i = 0; i < gs.size(); i++) {
    const gemm &g = gs[i];
    lt_descs x;
    std::vector<cublasLtMatmulHeuristicResult_t> r(cand);
    int found = 0;
    if (!make(x, g) ||
        cublasLtMatmulAlgoGetHeuristic(h, x.op, x.a, x.b, x.d, x.d, x.pref, cand, r.data(),
                                       &found) != 0 ||
        found == 0) {
      printf("| %s | %s | %d | %d | %d | no algorithm | | | |\n", g.layer, g.pass, g.m, g.n, g.k);
      continue;
    }
    double flop = 2.0 * g.m * g.n * g.k, first = -1, best = -1;
    int best_at = 0;
    for (int j = 0; j < found; j++) {
      double ms = time_algo(h, x, g, b, &r[j].algo, e0, e1);
      double tf = ms > 0 ? flop / (ms * 1e-3) / 1e12 : -1;
      if (j == 0)
        first = tf;
      if (tf > best)
        best = tf, best_at = j;
    }
    double us = host_us(h, g);
    printf("| %s | %s | %d | %d | %d | %.1f | %.1f | %d of %d | %.1f |\n", g.layer, g.pass, g.m,
           g.n, g.k, first, best, best_at + 1, found, us);
    if (jf)
      fprintf(jf,
              "%s{\"layer\": \"%s\", \"gemm\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, "
              "\"first_tflops\": %.2f, \"best_tflops\": %.2f, \"best_rank\": %d, \"found\": %d, "
              "\"host_us\": %.2f}",
              i ? ", " : "", g.layer, g.pass, g.m, g.n, g.k, first, best, best_at + 1, found, us);
  }
  if (jf) {
    fprintf(jf, "]}\n");
    fclose(jf);
  }
  cublasLtDestroy(h);
  return 0;
}
