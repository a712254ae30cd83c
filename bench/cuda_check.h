/*
 * cuda_check.h - the one error idiom of bench/'s standalone CUDA programs (gemm_gpu,
 * lt_bias16), which link no weft code: a failed CUDA runtime call prints the program,
 * the call and CUDA's reason, and exits 1. Each program defines BENCH_NAME first.
 */
#ifndef BENCH_CUDA_CHECK_H
#define BENCH_CUDA_CHECK_H

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s: %s: %s\n", BENCH_NAME, #x, cudaGetErrorString(e_));                     \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

#endif /* BENCH_CUDA_CHECK_H */
