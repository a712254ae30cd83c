/*
 * fake_cuda.c - a GPU-less stand-in for the NVIDIA driver's libcuda.so.1.
 *
 * It answers the three driver entry points weft's driver probe calls
 * (runtime/gpu.c, wf_gpu_driver_probe) as a machine with one GPU would: cuInit
 * succeeds, cuDeviceGetCount says WEFT_TEST_FAKE_GPUS devices (default 1), the driver
 * supports CUDA 13.0. Nothing else of the driver exists, so anything that really
 * reaches the driver (the CUDA runtime inside the GPU module) fails. Only a test's
 * LD_LIBRARY_PATH makes the dynamic linker find it; tests/gpu/no_skip.py uses it to
 * show that a GPU test fails, not skips, when a GPU is there and the module is not
 * usable.
 */
#include <stdlib.h>

int cuInit(unsigned flags);
int cuDeviceGetCount(int *count);
int cuDriverGetVersion(int *version);

int cuInit(unsigned flags)
{
  (void)flags;
  return 0;
}

int cuDeviceGetCount(int *count)
{
  const char *n = getenv("WEFT_TEST_FAKE_GPUS");
  *count = n ? atoi(n) : 1;
  return 0;
}

int cuDriverGetVersion(int *version)
{
  *version = 13000;
  return 0;
}
