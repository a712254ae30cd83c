/*
 * dnnl.c - bf16 GEMMs on CPUs with bf16 dot products (AVX512_BF16) through oneDNN's
 * matmul primitive: bf16 operands, fp32 accumulation, fp32 or bf16 output.
 *
 * Why oneDNN: Debian's OpenBLAS (0.3.21) has no sbgemm, and the 16-bit twins in
 * matmul.c widen their panels and run sgemm, so bf16 costs what fp32 costs. oneDNN's
 * brgemm kernels feed the bf16 values to vdpbf16ps, twice the fp32 FMA rate.
 *
 * Threading stays weft's (cpu_int.h): each GEMM is split over the pool exactly as the
 * twins split it (forward and dweight by output rows, dinp by output columns), and each
 * pool thread runs its share as one single-threaded oneDNN primitive (its OpenMP
 * threads are set to 1 on that thread), so no second pool competes for the cores and
 * the split, hence the result, depends only on the sizes and the thread budget.
 *
 * Primitives are made once per shape (a small table, under a lock) and kept for the
 * process; memory objects wrap the caller's pointers on each call. The products of
 * bf16 values are exact in fp32 and accumulate in fp32, as in the twins, in another
 * order (and vdpbf16ps treats bf16 subnormal inputs as zero, which weights and
 * activations of a trained model do not reach): the tests compare with the twins at
 * the summation tolerance.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "cpu_int.h"
#include "wf_kernels.h"
#include "wf_runtime.h"

#ifndef WF_HAVE_DNNL
/* Built without oneDNN: the twins run every bf16 GEMM. */
bool wf__dnnl_bf16(void) { return false; }
void wf_kernels_allow_bf16_gemm(int allow) {}
const char *wf_kernels_bf16_gemm(void) { return "this build has no oneDNN (libdnnl-dev)"; }
int wf_kernels_bf16_gemm_fast(void) { return 0; }
void wf__dnnl_forward(void *out, float *out32, const void *inp, const void *weight,
                      const float *bias, int N, int C, int OC)
{
}
void wf__dnnl_backward(void *dinp, float *dinp32, float *dweight, float *dbias, const void *dout,
                       const void *inp, const void *weight, int N, int C, int OC)
{
}
bool wf__dnnl_failed(void) { return false; }
#else
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

enum { SRC, WEI, DST, NMD };

/* One GEMM shape: dst (M, N) (+)= src (M, K) . wei (K, N) (+ bias), each with its strides
 * and type, the bias and the accumulation (sum post-op) flags. */
typedef struct shape {
  dnnl_dim_t m, n, k, stride[NMD][2];
  dnnl_data_type_t dst_type;
  int bias, accumulate;
} shape;

typedef struct entry {
  shape key;
  dnnl_primitive_t prim;
} entry;

#define CACHE 256
static struct {
  pthread_once_t once;
  pthread_mutex_t lock;
  dnnl_engine_t engine;
  bool ok;
  char why[160];
  entry e[CACHE];
  int n;
} g = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static dnnl_primitive_t make(const shape *s)
{
  dnnl_memory_desc_t md[NMD], bmd;
  dnnl_dims_t dims[NMD] = {{s->m, s->k}, {s->k, s->n}, {s->m, s->n}};
  dnnl_data_type_t type[NMD] = {dnnl_bf16, dnnl_bf16, s->dst_type};
  for (int i = 0; i < NMD; i++) {
    dnnl_dims_t stride = {s->stride[i][0], s->stride[i][1]};
    if (dnnl_memory_desc_init_by_strides(&md[i], 2, dims[i], type[i], stride) != dnnl_success)
      return NULL;
  }
  dnnl_dims_t bdims = {1, s->n}, bstride = {s->n, 1};
  if (s->bias &&
      dnnl_memory_desc_init_by_strides(&bmd, 2, bdims, dnnl_f32, bstride) != dnnl_success)
    return NULL;
  dnnl_matmul_desc_t desc;
  if (dnnl_matmul_desc_init(&desc, &md[SRC], &md[WEI], s->bias ? &bmd : NULL, &md[DST]) !=
      dnnl_success)
    return NULL;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_primitive_t prim = NULL;
  /* each pool thread passes its own scratchpad (run): a primitive's library-managed one
   * is shared by the threads that run it at once */
  bool ok =
      dnnl_primitive_attr_create(&attr) == dnnl_success &&
      dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
  if (ok && s->accumulate)
    ok = dnnl_post_ops_create(&po) == dnnl_success &&
         dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
         dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
  ok = ok && dnnl_primitive_desc_create(&pd, &desc, attr, g.engine, NULL) == dnnl_success;
  ok = ok && dnnl_primitive_create(&prim, pd) == dnnl_success;
  if (pd)
    dnnl_primitive_desc_destroy(pd);
  if (po)
    dnnl_post_ops_destroy(po);
  if (attr)
    dnnl_primitive_attr_destroy(attr);
  return ok ? prim : NULL;
}

/* The cached primitive of shape s, made on first use; NULL if oneDNN cannot make it.
 * Beyond CACHE shapes (rare: a process training several models) a primitive is made for
 * the call alone, and *own says the caller destroys it. */
static dnnl_primitive_t lookup(const shape *s, bool *own)
{
  dnnl_primitive_t p = NULL;
  *own = false;
  pthread_mutex_lock(&g.lock);
  for (int i = 0; i < g.n && !p; i++)
    if (!memcmp(&g.e[i].key, s, sizeof *s))
      p = g.e[i].prim;
  if (!p && (p = make(s))) {
    if (g.n < CACHE)
      g.e[g.n++] = (entry){*s, p};
    else
      *own = true;
  }
  pthread_mutex_unlock(&g.lock);
  return p;
}

static __thread dnnl_stream_t t_stream;

/* Runs shape s on the calling pool thread: dst (+)= src . wei (+ bias). */
static bool execute(dnnl_primitive_t p, const shape *s, const void *src, const void *wei,
                    const float *bias, void *dst)
{
  if (!t_stream &&
      dnnl_stream_create(&t_stream, g.engine, dnnl_stream_default_flags) != dnnl_success)
    return false;
  const dnnl_memory_desc_t *md;
  dnnl_memory_t mem[5] = {0};
  void *ptr[5] = {(void *)src, (void *)wei, dst, (void *)bias, NULL};
  int arg[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS, DNNL_ARG_SCRATCHPAD};
  dnnl_query_t q[5] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md,
                       dnnl_query_weights_md, dnnl_query_scratchpad_md};
  int which[5] = {0, 0, 0, 1, 0}, use[5] = {1, 1, 1, s->bias, 1};
  dnnl_exec_arg_t args[5];
  const_dnnl_primitive_desc_t pd;
  bool ok = dnnl_primitive_get_primitive_desc(p, &pd) == dnnl_success;
  size_t pad = 0;
  if (ok && (md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0)))
    pad = dnnl_memory_desc_get_size(md);
  use[4] = pad > 0;
  if (pad && !(ptr[4] = wf__work(7, pad / sizeof(float) + 1)))
    return false;
  int n = 0;
  for (int i = 0; ok && i < 5; i++) {
    if (!use[i])
      continue;
    md = dnnl_primitive_desc_query_md(pd, q[i], which[i]);
    ok = md && dnnl_memory_create(&mem[i], md, g.engine, ptr[i]) == dnnl_success;
    args[n++] = (dnnl_exec_arg_t){arg[i], mem[i]};
  }
  /* this pool thread's share runs on this thread alone (the caller's own OpenMP setting,
   * which the worker may use elsewhere, is put back) */
  int omp0 = omp_get_max_threads();
  omp_set_num_threads(1);
  ok = ok && dnnl_primitive_execute(p, t_stream, n, args) == dnnl_success &&
       dnnl_stream_wait(t_stream) == dnnl_success;
  omp_set_num_threads(omp0);
  for (int i = 0; i < 5; i++)
    if (mem[i])
      dnnl_memory_destroy(mem[i]);
  return ok;
}

static bool run(const shape *s, const void *src, const void *wei, const float *bias, void *dst)
{
  bool own;
  dnnl_primitive_t p = lookup(s, &own);
  if (!p)
    return false;
  bool ok = execute(p, s, src, wei, bias, dst);
  if (own)
    dnnl_primitive_destroy(p);
  return ok;
}

/* oneDNN is used where the CPU has bf16 dot products and oneDNN picks a bf16 kernel for
 * a probe GEMM (not its reference implementation). */
static void init(void)
{
  if (!__builtin_cpu_supports("avx512bf16")) {
    snprintf(g.why, sizeof g.why, "this CPU has no AVX512_BF16");
    return;
  }
  if (dnnl_engine_create(&g.engine, dnnl_cpu, 0) != dnnl_success) {
    snprintf(g.why, sizeof g.why, "oneDNN could not open its CPU engine");
    return;
  }
  shape probe = {.m = 64, .n = 64, .k = 64, .dst_type = dnnl_f32};
  for (int i = 0; i < NMD; i++)
    probe.stride[i][0] = 64, probe.stride[i][1] = 1;
  dnnl_primitive_t p = make(&probe);
  const_dnnl_primitive_desc_t pd = NULL;
  const char *impl = NULL;
  if (p && dnnl_primitive_get_primitive_desc(p, &pd) == dnnl_success)
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
  if (!impl || strstr(impl, "ref")) {
    snprintf(g.why, sizeof g.why, "oneDNN has no bf16 matmul kernel for this CPU (%s)",
             impl ? impl : "none");
  } else {
    const dnnl_version_t *v = dnnl_version();
    snprintf(g.why, sizeof g.why, "oneDNN %d.%d.%d (%s) on AVX512_BF16", v->major, v->minor,
             v->patch, impl);
    g.ok = true;
  }
  if (p)
    dnnl_primitive_destroy(p);
}

static _Atomic int g_allow = 1;

void wf_kernels_allow_bf16_gemm(int allow) { g_allow = allow != 0; }

bool wf__dnnl_bf16(void)
{
  if (!g_allow)
    return false;
  pthread_once(&g.once, init);
  return g.ok;
}

const char *wf_kernels_bf16_gemm(void)
{
  if (!g_allow)
    return "runtime.cpu_bf16_gemm=false";
  pthread_once(&g.once, init);
  return g.why;
}

int wf_kernels_bf16_gemm_fast(void) { return wf__dnnl_bf16(); }

/* ---- the three GEMMs, split over the pool as matmul.c's twins split them ------------- */

typedef struct job {
  void *out, *dinp; /* bf16, unless out32 / dinp32 is given */
  float *out32, *dinp32, *dweight, *dbias;
  const wf_bf16 *inp, *weight, *dout;
  const float *bias;
  dnnl_dim_t N, C, OC;
  _Atomic bool failed;
} job;

/* out[:, lo:hi] = inp (N, C) . W[lo:hi]^T + bias[lo:hi] */
static void forward_share(void *p, int tid, int nt)
{
  job *j = p;
  size_t lo, hi;
  wf__split((size_t)j->OC, tid, nt, 16, &lo, &hi);
  if (lo >= hi)
    return;
  shape s = {.m = j->N,
             .n = (dnnl_dim_t)(hi - lo),
             .k = j->C,
             .stride = {{j->C, 1}, {1, j->C}, {j->OC, 1}},
             .dst_type = j->out32 ? dnnl_f32 : dnnl_bf16,
             .bias = j->bias != NULL};
  void *dst = j->out32 ? (void *)(j->out32 + lo) : (void *)((wf_bf16 *)j->out + lo);
  if (!run(&s, j->inp, j->weight + lo * (size_t)j->C, j->bias ? j->bias + lo : NULL, dst))
    j->failed = true;
}

/* dinp[:, lo:hi] = dout (N, OC) . W[:, lo:hi], written (in bf16: the fp32 sum rounded once) */
static void dinp_share(void *p, int tid, int nt)
{
  job *j = p;
  size_t lo, hi;
  wf__split((size_t)j->C, tid, nt, 16, &lo, &hi);
  if (lo >= hi)
    return;
  shape s = {.m = j->N,
             .n = (dnnl_dim_t)(hi - lo),
             .k = j->OC,
             .stride = {{j->OC, 1}, {j->C, 1}, {j->C, 1}},
             .dst_type = j->dinp32 ? dnnl_f32 : dnnl_bf16};
  void *dst = j->dinp32 ? (void *)(j->dinp32 + lo) : (void *)((wf_bf16 *)j->dinp + lo);
  if (!run(&s, j->dout, j->weight + lo, NULL, dst))
    j->failed = true;
}

/* dweight[lo:hi] += dout[:, lo:hi]^T . inp; dbias[lo:hi] += dout's rows in row order */
static void dweight_share(void *p, int tid, int nt)
{
  job *j = p;
  size_t lo, hi, OC = (size_t)j->OC;
  wf__split(OC, tid, nt, 16, &lo, &hi);
  if (lo >= hi)
    return;
  shape s = {.m = (dnnl_dim_t)(hi - lo),
             .n = j->C,
             .k = j->N,
             .stride = {{1, j->OC}, {j->C, 1}, {j->C, 1}},
             .dst_type = dnnl_f32,
             .accumulate = 1};
  if (j->dweight && !run(&s, j->dout + lo, j->inp, NULL, j->dweight + lo * (size_t)j->C))
    j->failed = true;
  for (size_t r = 0; j->dbias && r < (size_t)j->N; r++)
    for (size_t c = lo; c < hi; c++)
      j->dbias[c] += wf_bf16_to_float(j->dout[r * OC + c]);
}

static _Atomic bool g_failed; /* a GEMM failed since the last check (wf__dnnl_failed) */

/* A failure (oneDNN could not make or run a primitive it made for the probe's kind) is
 * logged once with the shape and reported by the table's last_error, like a CUDA launch
 * error: the step fails rather than continue on a partial sum. */
static void split(job *j, wf__task_fn fn)
{
  int nt = wf__threads_for((size_t)j->N * (size_t)j->C * (size_t)j->OC / 64);
  wf__parallel(nt, fn, j);
  if (j->failed && !atomic_exchange(&g_failed, true))
    WF_ERROR("oneDNN bf16 matmul failed (N %ld, C %ld, OC %ld); set "
             "runtime.cpu_bf16_gemm=false to run bf16 GEMMs on widened operands instead",
             (long)j->N, (long)j->C, (long)j->OC);
}

bool wf__dnnl_failed(void) { return atomic_exchange(&g_failed, false); }

void wf__dnnl_forward(void *out, float *out32, const void *inp, const void *weight,
                      const float *bias, int N, int C, int OC)
{
  job j = {.out = out,
           .out32 = out32,
           .inp = inp,
           .weight = weight,
           .bias = bias,
           .N = N,
           .C = C,
           .OC = OC};
  if (N > 0 && OC > 0)
    split(&j, forward_share);
}

void wf__dnnl_backward(void *dinp, float *dinp32, float *dweight, float *dbias, const void *dout,
                       const void *inp, const void *weight, int N, int C, int OC)
{
  job j = {.dinp = dinp,
           .dinp32 = dinp32,
           .dweight = dweight,
           .dbias = dbias,
           .dout = dout,
           .inp = inp,
           .weight = weight,
           .N = N,
           .C = C,
           .OC = OC};
  void *di = dinp32 ? (void *)dinp32 : dinp;
  if (!wf__dinp_has_terms(di, dinp32 ? sizeof(float) : sizeof(wf_bf16), N, C, OC))
    return;
  if (di)
    split(&j, dinp_share);
  if (dweight || dbias)
    split(&j, dweight_share);
}
#endif /* WF_HAVE_DNNL */
