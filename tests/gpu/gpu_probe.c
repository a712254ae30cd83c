/*
 * gpu_probe.c - is there a GPU, can weft use it, and what does it run on.
 *
 *     gpu_probe            prints one JSON object (below) and exits
 *                            0   a GPU is present and weft's GPU module opened it;
 *                            77  no GPU: no NVIDIA driver, or it reports no device;
 *                            1   a GPU is present but weft cannot use it (`why` says
 *                                why: a library that does not load, an old driver...).
 *
 * The GPU tests that are scripts (train_gpu.py) and scripts/gpu-check.sh take their
 * skip-or-fail decision from this exit status, so it is wf_gpu_open's own decision
 * (runtime/gpu.c): 77 never stands for a failure on a machine with a GPU.
 *
 * The object: {"weft_build" (wf_build_id.h), "status": "gpu" | "no-gpu" | "unusable",
 * "why", "driver": {"cuda", "devices", "detail"}, "devices": [{"index", "name", "pci",
 * "memory_gib", "free_gib", "sm_count", "cc"}], "libraries": {"cudart" | "cublas" |
 * "cublasLt" | "nccl" | "cudnn": {"version", "path"} or {"error"}}}. A library's path is
 * the file the dynamic linker chose, the one the GPU modules load (they resolve the same
 * sonames the same way); its version is the library's own answer.
 */
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "wf_build_id.h"
#include "wf_gpu.h"

/* The sonames the GPU modules link (kernels/cuda, collectives/nccl), and cuDNN's. */
typedef enum { V_INT_OUT, V_SIZE_RET, V_PROPERTY } version_abi;
static const struct {
  const char *key, *soname, *symbol;
  version_abi abi; /* int f(int *), size_t f(void) or int f(property, int *) */
  int major_div;   /* version / major_div = major; then 2 digits of minor and patch */
} libraries[] = {
    {"cudart", "libcudart.so.13", "cudaRuntimeGetVersion", V_INT_OUT, 1000},
    {"cublas", "libcublas.so.13", "cublasGetProperty", V_PROPERTY, 10000},
    {"cublasLt", "libcublasLt.so.13", "cublasLtGetVersion", V_SIZE_RET, 10000},
    {"nccl", "libnccl.so.2", "ncclGetVersion", V_INT_OUT, 10000},
    {"cudnn", "libcudnn.so.9", "cudnnGetVersion", V_SIZE_RET, 10000},
};

/* "13.1.0" from 130100 (major_div 10000) or "13.0" from 13000 (cudart: major*1000 +
 * minor*10). */
static json_t *version_text(long v, int major_div)
{
  char s[64];
  if (major_div == 1000)
    snprintf(s, sizeof s, "%ld.%ld", v / 1000, v % 1000 / 10);
  else
    snprintf(s, sizeof s, "%ld.%ld.%ld", v / major_div, v % major_div / 100, v % 100);
  return json_string(s);
}

static json_t *library(size_t i)
{
  json_t *o = json_object();
  void *h = dlopen(libraries[i].soname, RTLD_NOW | RTLD_NOLOAD);
  if (!h)
    h = dlopen(libraries[i].soname, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    json_object_set_new(o, "error", json_string(e ? e : libraries[i].soname));
    return o;
  }
  struct link_map *lm = NULL;
  if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm)
    json_object_set_new(o, "path", json_string(lm->l_name));
  void *sym = dlsym(h, libraries[i].symbol);
  long v = -1;
  if (sym && libraries[i].abi == V_INT_OUT) {
    int (*f)(int *) = NULL, x = 0;
    memcpy(&f, &sym, sizeof f);
    if (f(&x) == 0)
      v = x;
  } else if (sym && libraries[i].abi == V_PROPERTY) {
    int (*f)(int, int *) = NULL, x[3] = {0, 0, 0}; /* MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL */
    memcpy(&f, &sym, sizeof f);
    if (f(0, &x[0]) == 0 && f(1, &x[1]) == 0 && f(2, &x[2]) == 0)
      v = x[0] * 10000L + x[1] * 100L + x[2];
  } else if (sym) {
    size_t (*f)(void) = NULL;
    memcpy(&f, &sym, sizeof f);
    v = (long)f();
  }
  if (v >= 0)
    json_object_set_new(o, "version", version_text(v, libraries[i].major_div));
  else
    json_object_set_new(o, "error", json_string("no version entry point"));
  return o; /* the handle stays open: the process ends soon */
}

static json_t *device(wf_gpu *g, int d)
{
  char name[128] = "?", pci[32] = "?";
  int sms = 0, major = 0, minor = 0;
  size_t free_b = 0, total = 0;
  wf_gpu_device_name(g, d, name, sizeof name);
  wf_gpu_pci_bus_id(g, d, pci, sizeof pci);
  wf_gpu_device_attrs(g, d, &sms, &major, &minor);
  if (wf_gpu_set_device(g, d) == WF_OK)
    wf_gpu_mem_info(g, &free_b, &total);
  char cc[16];
  snprintf(cc, sizeof cc, "%d.%d", major, minor);
  return json_pack("{s:i, s:s, s:s, s:f, s:f, s:i, s:s}", "index", d, "name", name, "pci", pci,
                   "memory_gib", (double)total / (1 << 30), "free_gib", (double)free_b / (1 << 30),
                   "sm_count", sms, "cc", cc);
}

int main(void)
{
  char why[1024] = "", driver[256] = "";
  int n_driver = 0, cuda = 0;
  wf_gpu *g = NULL;
  wf_status st = wf_gpu_open(&g, why, sizeof why);
  wf_gpu_driver_probe(&n_driver, &cuda, driver, sizeof driver);
  const char *status = st == WF_OK ? "gpu" : st == WF_ENODEV ? "no-gpu" : "unusable";
  json_t *devices = json_array(), *libs = json_object();
  for (int d = 0; g && d < wf_gpu_device_count(g); d++)
    json_array_append_new(devices, device(g, d));
  for (size_t i = 0; i < sizeof libraries / sizeof libraries[0]; i++)
    json_object_set_new(libs, libraries[i].key, library(i));
  char cuda_text[16];
  snprintf(cuda_text, sizeof cuda_text, "%d.%d", cuda / 1000, cuda % 1000 / 10);
  json_t *out = json_pack("{s:s, s:s, s:s, s:{s:s, s:i, s:s}, s:o, s:o}", "weft_build",
                          wf_build_id(), "status", status, "why", st == WF_OK ? "" : why, "driver",
                          "cuda", cuda ? cuda_text : "", "devices", n_driver, "detail", driver,
                          "devices", devices, "libraries", libs);
  char *text = out ? json_dumps(out, JSON_INDENT(2)) : NULL;
  printf("%s\n", text ? text : "{}");
  free(text);
  json_decref(out);
  wf_gpu_close(g);
  return st == WF_OK ? 0 : st == WF_ENODEV ? 77 : 1;
}
