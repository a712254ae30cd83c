/*
 * cast.c - activations between fp32 and their storage format (cast.h): each element
 * converted on its own (storage.c's wf__store / wf__load), so the thread split changes
 * nothing.
 */
#include "cpu_int.h"
#include "wf_kernels.h"

struct conv {
  void *dst;
  const void *src;
  size_t n;
  int fmt;
  bool store;
};

static void conv_share(void *p, int tid, int nt)
{
  const struct conv *c = p;
  size_t lo, hi;
  wf__split(c->n, tid, nt, 32, &lo, &hi);
  if (c->store)
    wf__store(c->dst, lo, (const float *)c->src + lo, hi - lo, c->fmt);
  else
    wf__load((float *)c->dst + lo, c->src, lo, hi - lo, c->fmt);
}

void wf_storage_store(void *dst, const float *src, size_t n, int fmt)
{
  struct conv c = {dst, src, n, fmt, true};
  wf__parallel(wf__threads_for(n), conv_share, &c);
}

void wf_storage_load(float *dst, const void *src, size_t n, int fmt)
{
  struct conv c = {dst, src, n, fmt, false};
  wf__parallel(wf__threads_for(n), conv_share, &c);
}

/* ---- the op (wf_kreg.h): one variant per element type, the type bound ----------------- */

#define CAST_VARIANT(name, fmt)                                                                    \
  static void name##_store(void *dst, const float *src, size_t n, wf_stream *s)                    \
  {                                                                                                \
    wf_storage_store(dst, src, n, fmt);                                                            \
  }                                                                                                \
  static void name##_load(float *dst, const void *src, size_t n, wf_stream *s)                     \
  {                                                                                                \
    wf_storage_load(dst, src, n, fmt);                                                             \
  }                                                                                                \
  static const wf_cast_op name = {name##_store, name##_load}

CAST_VARIANT(f32, WF_DT_F32);
CAST_VARIANT(bf16, WF_DT_BF16);
CAST_VARIANT(f16, WF_DT_F16);
const wf_kvariants wf__cpu_cast = WF_KV(cast, WF_OP_VERSION_cast, &f32, &bf16, &f16);
