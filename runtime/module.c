/*
 * module.c - finding and loading run-time modules (the GPU backends).
 *
 * Search order: when $WEFT_MODULE_PATH is set, its entries and nothing else;
 * otherwise the executable's directory, its ../kernels/cuda, ../collectives/nccl,
 * ../kernels and ../collectives (the meson build tree, for build/worker/worker and
 * the benches in build/bench), ../../kernels/cuda and ../../collectives/nccl (for the tests, two
 * folders down in build/tests/<area>), its ../lib/weft (an install), then the dynamic
 * linker's own path. Everything is relative to the executable, so a build tree (or
 * scripts/gpu-bundle.sh's copy of one) works wherever it is moved. A module that exists but fails
 * to load gives the most useful reason ("libcudart.so.13: cannot open ..."), so that one is kept.
 */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wf_runtime.h"

/* dlopen dir/file. A file that exists but fails to load (a missing libcudart, say)
 * is the most useful reason, so it is recorded once and never overwritten. */
static void *try_open(const char *dir, const char *file, char *why, size_t why_len,
                      bool *have_reason)
{
  char path[PATH_MAX];
  if (dir) {
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (access(path, F_OK) != 0)
      return NULL;
  } else {
    snprintf(path, sizeof path, "%s", file);
  }
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h && !*have_reason && why && why_len) {
    const char *e = dlerror();
    snprintf(why, why_len, "%s", e ? e : path);
    *have_reason = dir != NULL;
  }
  return h;
}

void *wf_module_open(const char *name, char *why, size_t why_len)
{
  char file[256], exe[PATH_MAX], dir[PATH_MAX + 32];
  bool have_reason = false;
  void *h = NULL;
  snprintf(file, sizeof file, "lib%s.so", name);
  const char *env = getenv("WEFT_MODULE_PATH");
  if (env && *env) {
    /* An explicit path is the whole search: tests and users who set it mean it. */
    char list[PATH_MAX];
    wf_strlcpy(list, env, sizeof list);
    for (char *save = NULL, *d = strtok_r(list, ":", &save); d && !h;
         d = strtok_r(NULL, ":", &save))
      h = try_open(d, file, why, why_len, &have_reason);
    if (!h && !have_reason && why && why_len)
      snprintf(why, why_len, "%s not found in WEFT_MODULE_PATH=%s", file, env);
    return h;
  }
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (!h && n > 0) {
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
      *slash = '\0';
    static const char *rel[] = {"",
                                "/../kernels/cuda",
                                "/../collectives/nccl",
                                "/../kernels",
                                "/../collectives",
                                "/../../kernels/cuda",
                                "/../../collectives/nccl",
                                "/../lib/weft"};
    for (size_t i = 0; i < WF_ARRAY_LEN(rel) && !h; i++) {
      snprintf(dir, sizeof dir, "%s%s", exe, rel[i]);
      h = try_open(dir, file, why, why_len, &have_reason);
    }
  }
  if (!h)
    h = try_open(NULL, file, why, why_len, &have_reason);
  if (!h && !have_reason && why && why_len)
    snprintf(why, why_len, "%s not built or not found (set WEFT_MODULE_PATH)", file);
  return h;
}

void *wf_module_sym(void *module, const char *symbol)
{
  return module ? dlsym(module, symbol) : NULL;
}

void wf_module_close(void *module)
{
  if (module)
    dlclose(module);
}
