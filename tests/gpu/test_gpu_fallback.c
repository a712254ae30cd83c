/*
 * test_gpu_fallback.c - wf_gpu_open() falls back with the right reason.
 *
 * One binary, one mode per meson test (argv[1]), each mode its own process
 * because the module search path is read from the environment:
 *
 *   notfound           WEFT_MODULE_PATH points at an empty place and the module is
 *                      nowhere else: the reason says "not found".
 *   nodriver DIR       the real module in DIR. On a machine with the CUDA toolkit but
 *                      no GPU (CI: no libcuda.so.1) the reason names the missing
 *                      driver or device. With a GPU there is nothing to fall back
 *                      from: exit 77 (skipped).
 *   absent DIR         a fake libweft_cuda.so in DIR needs libweft_test_absent.so,
 *                      which the loader cannot find (tests/gpu/absent_*): the reason
 *                      says the module failed to load and names that library.
 *
 * Every mode first checks that this binary, which links the runtime, starts
 * without any CUDA library mapped: the runtime must reach CUDA only through the
 * module. Each mode prints the reason it got, which is the worker's log line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wf_build_config.h"
#include "wf_gpu.h"
#include "wf_device.h"

static int failures;

#define EXPECT(cond)                                                                               \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);                          \
      failures++;                                                                                  \
    }                                                                                              \
  } while (0)

/* True when a library whose path contains `name` is mapped into this process. */
static bool mapped(const char *name)
{
  char line[4096];
  bool found = false;
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f)
    return false;
  while (!found && fgets(line, sizeof line, f))
    found = strstr(line, name) != NULL;
  fclose(f);
  return found;
}

/* Open with WEFT_MODULE_PATH=dir; the reason goes to `why`. */
static wf_status open_from(const char *dir, wf_gpu **g, char *why, size_t len)
{
  setenv("WEFT_MODULE_PATH", dir, 1);
  why[0] = '\0';
  wf_status st = wf_gpu_open(g, why, len);
  printf("WEFT_MODULE_PATH=%s -> %s: %s\n", dir, wf_status_str(st), st == WF_OK ? "ok" : why);
  return st;
}

static int test_notfound(void)
{
  char why[512];
  wf_gpu *g = (wf_gpu *)1;
  EXPECT(open_from("/nonexistent/weft-test", &g, why, sizeof why) == WF_ENODEV);
  EXPECT(g == NULL);
  EXPECT(strstr(why, "libweft_cuda.so") != NULL);
  EXPECT(strstr(why, "not found") != NULL);
  /* The API is safe to call on "no GPU". */
  EXPECT(wf_gpu_device_count(NULL) == 0);
  EXPECT(wf_kreg_check(wf_gpu_kernel_table(NULL)) == NULL);
  EXPECT(wf_gpu_is_device_ptr(NULL, why) == 0);
  wf_gpu_close(NULL);
  return 0;
}

static int test_nodriver(const char *dir)
{
  char why[512];
  wf_gpu *g = NULL;
  if (!WF_HAVE_CUDA) {
    printf("skip: built without the CUDA backend\n");
    return 77;
  }
  wf_status st = open_from(dir, &g, why, sizeof why);
  if (st == WF_OK) {
    printf("skip: %d GPU(s) present, nothing to fall back from\n", wf_gpu_device_count(g));
    wf_gpu_close(g);
    return 77;
  }
  EXPECT(st == WF_ENODEV);
  EXPECT(g == NULL);
  /* Here (CI): cudaGetDeviceCount fails with error 35, "no CUDA driver". */
  EXPECT(strstr(why, "driver") != NULL || strstr(why, "device") != NULL);
  EXPECT(strstr(why, "not found") == NULL);
  return 0;
}

static int test_absent(const char *dir)
{
  char why[512];
  wf_gpu *g = NULL;
  EXPECT(open_from(dir, &g, why, sizeof why) == WF_ENODEV);
  EXPECT(g == NULL);
  EXPECT(strstr(why, "failed to load") != NULL);
  EXPECT(strstr(why, "libweft_test_absent.so") != NULL);
  return 0;
}

int main(int argc, char **argv)
{
  int rc = 0;
  if (argc < 2) {
    fprintf(stderr, "usage: %s notfound | nodriver DIR | absent DIR\n", argv[0]);
    return 2;
  }
  /* Linking the runtime must not pull in CUDA: the binary starts without it. */
  EXPECT(!mapped("libcudart"));
  EXPECT(!mapped("libcublas"));
  EXPECT(!mapped("libnccl"));
  if (strcmp(argv[1], "notfound") == 0)
    rc = test_notfound();
  else if (strcmp(argv[1], "nodriver") == 0 && argc > 2)
    rc = test_nodriver(argv[2]);
  else if (strcmp(argv[1], "absent") == 0 && argc > 2)
    rc = test_absent(argv[2]);
  else
    return 2;
  if (failures)
    return 1;
  return rc;
}
