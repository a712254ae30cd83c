/*
 * module_stubs.h - what the weft_cuda module's backend.cu provides to an op's .cu file,
 * for the GPU twin tests that include those files directly (so the code tested is the
 * module's) without the module: the log printed, launches checked and reported. And CK,
 * a CUDA runtime call that must succeed.
 */
#ifndef WF_TEST_MODULE_STUBS_H
#define WF_TEST_MODULE_STUBS_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

extern "C" void wf_log(int level, const char *file, int line, const char *fmt, ...)
{
  (void)level, (void)file, (void)line;
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
}
void wf__cuda_record(int err) { (void)err; }
void wf__cuda_count_launch(void) {}
bool wf__cuda_check_launch(const char *file, int line, const char *what)
{
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    printf("%s:%d %s: %s\n", file, line, what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      printf("FAIL: %s: %s\n", #x, cudaGetErrorString(e_));                                        \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

#endif /* WF_TEST_MODULE_STUBS_H */
