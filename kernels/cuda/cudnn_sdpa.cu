/*
 * cudnn_sdpa.cu - causal attention through cuDNN 9's fused flash attention, built with
 * the graph (backend) API in C: the operation graphs cudnn-frontend's scaled-dot-product
 * attention nodes build (its v1.8 composite graphs, which every cuDNN 9 release takes),
 * written out as backend descriptors, one engine plan per shape and direction, cached.
 *
 * Loading. cuDNN is dlopen()ed (libcudnn.so.9) at the first use, never linked: a
 * machine without it still runs the module, and attention falls back (attention_impl.cu
 * logs one line per shape). The handful of entry points are looked up by name.
 *
 * Shapes taken (the rest are refused with the reason, and the flash kernels or the fp32
 * reference run instead): cuDNN 9.0 or later except 9.10.0 and 9.10.1 (their bf16
 * backward is known wrong: cudnn-frontend refuses them); head size 64 or 128 (the
 * sizes weft's tests cover); kv heads = heads (the grouped-query graphs add reductions
 * that are not written here); T a multiple of 128 before cuDNN 9.16 (earlier backward
 * engines mishandle a sequence length that is not, without a padding mask); and
 * whatever the heuristics find no engine for.
 *
 * Graphs (b batch, h heads, s = T, d head size; every intermediate is a virtual fp32
 * tensor of (b,h,s,s) or (b,h,s,1) unless said):
 *   forward:  S = Q.K^T; S *= scale; causal mask (row >= col, else the lowest float;
 *             with packed documents also col >= START, START the (b,1,s,1) int32 tensor
 *             of each row's document start, broadcast over heads and keys: another
 *             graph, planned and cached apart);
 *             M = rowmax S; E = exp(S - M); Z = rowsum E; Stats = M + log Z (the
 *             output lse); P = E / Z (bf16); O = P.V.
 *   backward: Dsum = rowsum(dO * O) (kept in workspace); S as above, masked;
 *             P = exp(S - Stats); dV = P^T.dO; dP = dO.V^T; dS = P (dP - Dsum) scale;
 *             dK = dS^T.Q; dQacc = dS.K (fp32, workspace); dQ = dQacc.
 * Q, K, V, dQ, dK, dV are strided views of weft's qkv rows (B,T,3C): element (b,h,t,e)
 * at b T 3C + t 3C + h d + e (plus C for K, 2C for V); O and dO of (B,T,C); Stats is
 * (B,NH,T), the lse convention of every attention path here.
 *
 * cuDNN's backward accumulates dQ with atomics: unlike the flash kernels its dQ is not
 * bitwise reproducible run to run (within fp32 rounding of the same sum).
 */
#include <dlfcn.h>
#include <float.h>
#include <mutex>
#include <vector>

#include <cudnn_graph.h>

#include "attn_int.h"

#define MAX_DEVICES 64
#define MAX_PLANS   32

namespace
{

/* ---- the library ------------------------------------------------------------------- */

struct api {
  void *lib;
  size_t version;
  cudnnStatus_t (*create)(cudnnHandle_t *);
  cudnnStatus_t (*destroy)(cudnnHandle_t);
  cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t);
  const char *(*error_string)(cudnnStatus_t);
  void (*last_error)(char *, size_t);
  cudnnStatus_t (*make)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
  cudnnStatus_t (*unmake)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*set)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                       cudnnBackendAttributeType_t, int64_t, const void *);
  cudnnStatus_t (*get)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                       cudnnBackendAttributeType_t, int64_t, int64_t *, void *);
  cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
};

std::mutex g_lock; /* guards everything below */
api g_api;
bool g_tried;
char g_load_why[256];
cudnnHandle_t g_handle[MAX_DEVICES];

template <typename F> bool sym(F &f, const char *name)
{
  f = reinterpret_cast<F>(dlsym(g_api.lib, name));
  if (!f)
    snprintf(g_load_why, sizeof g_load_why, "libcudnn.so.9 has no %s", name);
  return f != nullptr;
}

/* dlopen cuDNN once; g_lock held. */
bool load_api(void)
{
  if (g_tried)
    return g_api.lib != nullptr;
  g_tried = true;
  g_api.lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  if (!g_api.lib) {
    const char *e = dlerror();
    snprintf(g_load_why, sizeof g_load_why, "cuDNN 9 not found (%s)", e ? e : "libcudnn.so.9");
    return false;
  }
  size_t (*version)(void) = nullptr;
  bool ok =
      sym(version, "cudnnGetVersion") && sym(g_api.create, "cudnnCreate") &&
      sym(g_api.destroy, "cudnnDestroy") && sym(g_api.set_stream, "cudnnSetStream") &&
      sym(g_api.error_string, "cudnnGetErrorString") &&
      sym(g_api.last_error, "cudnnGetLastErrorString") &&
      sym(g_api.make, "cudnnBackendCreateDescriptor") &&
      sym(g_api.unmake, "cudnnBackendDestroyDescriptor") &&
      sym(g_api.set, "cudnnBackendSetAttribute") && sym(g_api.get, "cudnnBackendGetAttribute") &&
      sym(g_api.finalize, "cudnnBackendFinalize") && sym(g_api.execute, "cudnnBackendExecute");
  if (ok) {
    g_api.version = version();
    if (g_api.version < 90000 || g_api.version == 91000 || g_api.version == 91001) {
      snprintf(g_load_why, sizeof g_load_why,
               "cuDNN %zu.%zu.%zu is not used (9.0 or later, not 9.10.0 or 9.10.1)",
               g_api.version / 10000, g_api.version / 100 % 100, g_api.version % 100);
      ok = false;
    }
  }
  if (!ok) {
    dlclose(g_api.lib);
    g_api.lib = nullptr;
  }
  return ok;
}

/* The current device's handle; g_lock held. */
cudnnHandle_t handle_of(char *why, size_t len)
{
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MAX_DEVICES) {
    cudaGetLastError();
    snprintf(why, len, "no current CUDA device");
    return nullptr;
  }
  if (!g_handle[dev]) {
    cudnnStatus_t st = g_api.create(&g_handle[dev]);
    if (st != CUDNN_STATUS_SUCCESS) {
      snprintf(why, len, "cudnnCreate: %s", g_api.error_string(st));
      g_handle[dev] = nullptr;
    }
  }
  return g_handle[dev];
}

/* ---- graphs ------------------------------------------------------------------------ */

typedef cudnnBackendDescriptor_t desc;
typedef std::vector<int64_t> dims;

/* Descriptors made while building a graph: all are kept (a plan refers to its graph)
 * and destroyed together. The first failing call is remembered; later calls do nothing,
 * so a builder reads straight through and checks once. */
struct builder {
  std::vector<desc> all, ops;
  int64_t next_uid = 1000; /* virtual tensors; the variant pack's uids are below */
  bool ok = true;
  char why[256] = "";

  void fail(cudnnStatus_t st, const char *what)
  {
    char detail[160] = "";
    g_api.last_error(detail, sizeof detail);
    snprintf(why, sizeof why, "%s: %s%s%s", what, g_api.error_string(st), detail[0] ? ": " : "",
             detail);
    ok = false;
  }

  desc make(cudnnBackendDescriptorType_t t)
  {
    desc d = nullptr;
    if (!ok)
      return nullptr;
    cudnnStatus_t st = g_api.make(t, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
      fail(st, "cudnnBackendCreateDescriptor");
      return nullptr;
    }
    all.push_back(d);
    return d;
  }

  void set(desc d, cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, int64_t count,
           const void *v)
  {
    if (!ok)
      return;
    cudnnStatus_t st = g_api.set(d, n, t, count, v);
    if (st != CUDNN_STATUS_SUCCESS) {
      char what[64];
      snprintf(what, sizeof what, "cudnnBackendSetAttribute (attribute %d)", (int)n);
      fail(st, what);
    }
  }

  void set_desc(desc d, cudnnBackendAttributeName_t n, desc v)
  {
    set(d, n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
  }

  void finalize(desc d, const char *what)
  {
    if (!ok)
      return;
    cudnnStatus_t st = g_api.finalize(d);
    if (st != CUDNN_STATUS_SUCCESS)
      fail(st, what);
  }

  /* A tensor: uid 0 makes a virtual one with the next virtual uid. */
  desc tensor(int64_t uid, cudnnDataType_t type, const dims &d, const dims &s,
              bool by_value = false)
  {
    desc t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    bool virt = uid == 0;
    int64_t id = virt ? next_uid++ : uid, align = 16;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, (int64_t)d.size(), d.data());
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, (int64_t)s.size(), s.data());
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id);
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (by_value)
      set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    finalize(t, "tensor descriptor");
    return t;
  }

  /* A float passed by value in the variant pack (its pointer is a host pointer). */
  desc scalar(int64_t uid)
  {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, true);
  }

  void op(desc o, const char *what)
  {
    finalize(o, what);
    if (ok)
      ops.push_back(o);
  }

  /* y = mode(x, b) (b, t may be null; t is BINARY_SELECT's condition); axis >= 0 for
   * GEN_INDEX. prec is the compute type. */
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t prec, desc x, desc b, desc y,
                 desc t = nullptr, int64_t axis = -1)
  {
    desc pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0)
      set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(pw, "pointwise descriptor");
    desc o = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    float one = 1.0f;
    set_desc(o, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    set_desc(o, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    set_desc(o, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    set(o, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    set(o, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    if (b)
      set_desc(o, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t)
      set_desc(o, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    op(o, "pointwise operation");
  }

  void matmul(desc a, desc b, desc c)
  {
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    desc mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    finalize(mm, "matmul descriptor");
    desc o = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set_desc(o, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    set_desc(o, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    set_desc(o, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    set_desc(o, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    op(o, "matmul operation");
  }

  void reduction(cudnnReduceTensorOp_t mode, desc x, desc y)
  {
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    desc r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    finalize(r, "reduction descriptor");
    desc o = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set_desc(o, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    set_desc(o, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    set_desc(o, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    op(o, "reduction operation");
  }

  void reshape(desc x, desc y)
  {
    desc o = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set_desc(o, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    set_desc(o, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    op(o, "reshape operation");
  }

  /* The operation graph of `ops` (`what`), the heuristics' engine configurations in
   * order, and the first that finalizes into a plan. */
  desc plan(cudnnHandle_t h, int64_t *workspace, const char *what);

  void release(void)
  {
    for (size_t i = all.size(); i-- > 0;)
      g_api.unmake(all[i]);
    all.clear();
    ops.clear();
  }
};

desc builder::plan(cudnnHandle_t h, int64_t *workspace, const char *what)
{
  desc graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)ops.size(),
      ops.data());
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  finalize(graph, "operation graph");
  desc heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  finalize(heur, "engine heuristics");
  int64_t n = 0;
  if (ok && g_api.get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n,
                      nullptr) != CUDNN_STATUS_SUCCESS)
    n = 0;
  std::vector<desc> cfgs;
  for (int64_t i = 0; ok && i < n; i++)
    cfgs.push_back(make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
  if (ok && n > 0 &&
      g_api.get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &n,
                cfgs.data()) != CUDNN_STATUS_SUCCESS)
    n = 0;
  for (int64_t i = 0, got = 0; ok && i < n; i++) {
    desc p = nullptr;
    if (g_api.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p) != CUDNN_STATUS_SUCCESS)
      break;
    if (g_api.set(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h) ==
            CUDNN_STATUS_SUCCESS &&
        g_api.set(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                  &cfgs[(size_t)i]) == CUDNN_STATUS_SUCCESS &&
        g_api.finalize(p) == CUDNN_STATUS_SUCCESS &&
        g_api.get(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got,
                  workspace) == CUDNN_STATUS_SUCCESS) {
      all.push_back(p);
      WF_DEBUG("cuDNN %s graph: the heuristics offered %lld engine configurations; "
               "configuration %lld made the plan",
               what, (long long)n, (long long)i);
      return p;
    }
    g_api.unmake(p); /* this engine cannot run the graph; the next may */
  }
  if (ok)
    snprintf(why, sizeof why, "no cuDNN engine for the graph (%lld configurations tried)",
             (long long)n);
  ok = false;
  return nullptr;
}

/* ---- the two graphs ---------------------------------------------------------------- */

enum uid { Q = 1, K, V, O, STATS, DO, DQ, DK, DV, SCALE, ONE, NEG, DSUM, DQACC, START };

struct shape {
  int64_t b, h, s, d, ld, C;
  bool docs = false;                                /* the document mask too (START) */
  dims qkv() const { return {s * ld, d, ld, 1}; }   /* Q, K, V, dQ, dK, dV: (b,h,s,d) */
  dims qkv_t() const { return {s * ld, d, 1, ld}; } /* K^T, V^T: (b,h,d,s) */
  dims bhsd() const { return {b, h, s, d}; }
  dims bhds() const { return {b, h, d, s}; }
  dims bhss() const { return {b, h, s, s}; }
  dims bhs1() const { return {b, h, s, 1}; }
  dims ss() const { return {h * s * s, s * s, s, 1}; }   /* a (b,h,s,s) intermediate */
  dims ss_t() const { return {h * s * s, s * s, 1, s}; } /* the same, transposed */
  dims s1() const { return {h * s, s, 1, 1}; }           /* (b,h,s,1): Stats and its kin */
  dims out() const { return {s * C, d, C, 1}; }          /* O, dO of (B,T,C) */
};

const cudnnDataType_t T_F32 = CUDNN_DATA_FLOAT, T_BF16 = CUDNN_DATA_BFLOAT16,
                      T_I32 = CUDNN_DATA_INT32, T_BOOL = CUDNN_DATA_BOOLEAN;

/* S = scale Q.K^T with the causal mask applied (and the document mask: keys from the
 * row's START on): the start of both graphs. */
desc masked_scores(builder &g, const shape &z, desc q, desc kt, desc scale)
{
  desc s1 = g.tensor(0, T_F32, z.bhss(), z.ss()), s2 = g.tensor(0, T_F32, z.bhss(), z.ss());
  desc row = g.tensor(0, T_I32, z.bhss(), z.ss()), col = g.tensor(0, T_I32, z.bhss(), z.ss());
  desc mask = g.tensor(0, T_BOOL, z.bhss(), z.ss()), s3 = g.tensor(0, T_F32, z.bhss(), z.ss());
  desc neg = g.scalar(NEG);
  g.matmul(q, kt, s1);
  g.pointwise(CUDNN_POINTWISE_MUL, T_F32, s1, scale, s2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, T_I32, s2, nullptr, row, nullptr, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, T_I32, s2, nullptr, col, nullptr, 3);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, T_BOOL, row, col, mask);
  if (z.docs) { /* and col >= START[b, row] */
    desc start = g.tensor(START, T_I32, {z.b, 1, z.s, 1}, {z.s, z.s, 1, 1});
    desc in_doc = g.tensor(0, T_BOOL, z.bhss(), z.ss()),
         both = g.tensor(0, T_BOOL, z.bhss(), z.ss());
    g.pointwise(CUDNN_POINTWISE_CMP_GE, T_BOOL, col, start, in_doc);
    g.pointwise(CUDNN_POINTWISE_LOGICAL_AND, T_BOOL, mask, in_doc, both);
    mask = both;
  }
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, T_F32, s2, neg, s3, mask);
  return s3;
}

void forward_graph(builder &g, const shape &z)
{
  desc q = g.tensor(Q, T_BF16, z.bhsd(), z.qkv()), kt = g.tensor(K, T_BF16, z.bhds(), z.qkv_t());
  desc v = g.tensor(V, T_BF16, z.bhsd(), z.qkv()), o = g.tensor(O, T_BF16, z.bhsd(), z.out());
  desc stats = g.tensor(STATS, T_F32, z.bhs1(), z.s1()), scale = g.scalar(SCALE);
  desc s = masked_scores(g, z, q, kt, scale);
  desc m = g.tensor(0, T_F32, z.bhs1(), z.s1()), sub = g.tensor(0, T_F32, z.bhss(), z.ss());
  desc e = g.tensor(0, T_F32, z.bhss(), z.ss()), zs = g.tensor(0, T_F32, z.bhs1(), z.s1());
  desc lz = g.tensor(0, T_F32, z.bhs1(), z.s1()), p = g.tensor(0, T_BF16, z.bhss(), z.ss());
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s, m);
  g.pointwise(CUDNN_POINTWISE_SUB, T_F32, s, m, sub);
  g.pointwise(CUDNN_POINTWISE_EXP, T_F32, sub, nullptr, e);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, zs);
  g.pointwise(CUDNN_POINTWISE_LOG, T_F32, zs, nullptr, lz);
  g.pointwise(CUDNN_POINTWISE_ADD, T_F32, m, lz, stats);
  g.pointwise(CUDNN_POINTWISE_DIV, T_F32, e, zs, p);
  g.matmul(p, v, o);
}

/* dQ = (dS.K) through the fp32 accumulator, as cuDNN's engines expect. */
void backward_dq(builder &g, const shape &z, desc ds, desc kt)
{
  desc kr = g.tensor(0, T_F32, z.bhsd(), z.qkv());
  desc acc = g.tensor(DQACC, T_F32, z.bhsd(), {z.h * z.s * z.d, z.s * z.d, z.d, 1});
  desc dq = g.tensor(DQ, T_BF16, z.bhsd(), z.qkv());
  g.reshape(kt, kr);
  g.matmul(ds, kr, acc);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, T_F32, acc, nullptr, dq);
}

void backward_graph(builder &g, const shape &z)
{
  desc q = g.tensor(Q, T_BF16, z.bhsd(), z.qkv()), kt = g.tensor(K, T_BF16, z.bhds(), z.qkv_t());
  desc vt = g.tensor(V, T_BF16, z.bhds(), z.qkv_t()), o = g.tensor(O, T_BF16, z.bhsd(), z.out());
  desc dO = g.tensor(DO, T_BF16, z.bhsd(), z.out()),
       stats = g.tensor(STATS, T_F32, z.bhs1(), z.s1());
  desc dk = g.tensor(DK, T_BF16, z.bhsd(), z.qkv()), dv = g.tensor(DV, T_BF16, z.bhsd(), z.qkv());
  desc scale = g.scalar(SCALE), one = g.scalar(ONE);
  /* Dsum = rowsum(dO * O), through the workspace tensor DSUM */
  desc doo = g.tensor(0, T_F32, z.bhsd(), {z.h * z.s * z.d, z.s * z.d, z.h * z.d, 1});
  desc dsum_v = g.tensor(0, T_F32, z.bhs1(), z.s1()),
       dsum = g.tensor(DSUM, T_F32, z.bhs1(), z.s1());
  g.pointwise(CUDNN_POINTWISE_MUL, T_F32, dO, o, doo);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, doo, dsum_v);
  g.pointwise(CUDNN_POINTWISE_MUL, T_F32, dsum_v, one, dsum);
  /* P = exp(S - Stats); dV = P^T.dO */
  desc s = masked_scores(g, z, q, kt, scale);
  desc sub = g.tensor(0, T_F32, z.bhss(), z.ss()), p = g.tensor(0, T_F32, z.bhss(), z.ss());
  desc pt = g.tensor(0, T_BF16, z.bhss(), z.ss_t());
  g.pointwise(CUDNN_POINTWISE_SUB, T_F32, s, stats, sub);
  g.pointwise(CUDNN_POINTWISE_EXP, T_F32, sub, nullptr, p);
  g.reshape(p, pt);
  g.matmul(pt, dO, dv);
  /* dS = P (dP - Dsum) scale; dK = dS^T.Q */
  desc dp1 = g.tensor(0, T_F32, z.bhss(), z.ss()), dp2 = g.tensor(0, T_F32, z.bhss(), z.ss());
  desc dp3 = g.tensor(0, T_F32, z.bhss(), z.ss()), ds1 = g.tensor(0, T_F32, z.bhss(), z.ss());
  desc ds = g.tensor(0, T_F32, z.bhss(), z.ss()), dst = g.tensor(0, T_BF16, z.bhss(), z.ss_t());
  g.matmul(dO, vt, dp1);
  g.pointwise(CUDNN_POINTWISE_MUL, T_F32, dp1, one, dp2);
  g.pointwise(CUDNN_POINTWISE_SUB, T_F32, dp2, dsum, dp3);
  g.pointwise(CUDNN_POINTWISE_MUL, T_F32, dp3, p, ds1);
  g.pointwise(CUDNN_POINTWISE_MUL, T_F32, ds1, scale, ds);
  g.reshape(ds, dst);
  g.matmul(dst, q, dk);
  backward_dq(g, z, ds, kt);
}

/* ---- plans --------------------------------------------------------------------------- */

struct plans {
  int dev, B, T, C, NH;
  bool docs;
  bool ok;
  char why[256];
  builder fwd, bwd;
  desc fwd_plan, bwd_plan;
  int64_t fwd_ws, bwd_ws;
};

plans *g_plans[MAX_PLANS];
int g_nplans;

/* Why cuDNN is not asked for this shape at all, or "" (g_lock held). */
void refusal(int T, int C, int NH, int NKV, char *why, size_t len)
{
  int hs = C / NH;
  why[0] = '\0';
  if (!load_api())
    snprintf(why, len, "%s", g_load_why);
  else if (hs != 64 && hs != 128)
    snprintf(why, len, "head size %d (weft uses cuDNN for 64 and 128)", hs);
  else if (NKV != NH)
    snprintf(why, len, "%d kv heads for %d heads (weft's cuDNN graphs are multi-head)", NKV, NH);
  else if (g_api.version < 91600 && T % 128 != 0)
    snprintf(why, len, "T %d not a multiple of 128 (cuDNN %zu.%zu's backward needs it)", T,
             g_api.version / 10000, g_api.version / 100 % 100);
}

plans *build(int dev, int B, int T, int C, int NH, bool docs, cudnnHandle_t h)
{
  plans *p = new plans();
  p->dev = dev, p->B = B, p->T = T, p->C = C, p->NH = NH, p->docs = docs;
  shape z = {B, NH, T, C / NH, 3 * (int64_t)C, C, docs};
  forward_graph(p->fwd, z);
  p->fwd_plan = p->fwd.plan(h, &p->fwd_ws, "forward");
  if (p->fwd.ok) {
    backward_graph(p->bwd, z);
    p->bwd_plan = p->bwd.plan(h, &p->bwd_ws, "backward");
  }
  p->ok = p->fwd.ok && p->bwd.ok;
  if (!p->ok)
    snprintf(p->why, sizeof p->why, "%s graph: %.200s", p->fwd.ok ? "backward" : "forward",
             p->fwd.ok ? p->bwd.why : p->fwd.why);
  if (!p->ok) { /* keep only the verdict */
    p->fwd.release();
    p->bwd.release();
  }
  return p;
}

/* The cached plans of a shape on the current device, built if new; g_lock held. */
plans *plans_of(int B, int T, int C, int NH, bool docs, char *why, size_t len)
{
  int dev = 0;
  cudaGetDevice(&dev);
  for (int i = 0; i < g_nplans; i++) {
    plans *p = g_plans[i];
    if (p->dev == dev && p->B == B && p->T == T && p->C == C && p->NH == NH && p->docs == docs)
      return p;
  }
  cudnnHandle_t h = handle_of(why, len);
  if (!h || g_nplans == MAX_PLANS) {
    if (h)
      snprintf(why, len, "more than %d attention shapes", MAX_PLANS);
    return nullptr;
  }
  plans *p = build(dev, B, T, C, NH, docs, h);
  g_plans[g_nplans++] = p;
  return p;
}

/* Execute `plan` on s with the variant pack (uids, pointers) and a workspace of ws bytes
 * from the stream-ordered pool; g_lock held (the handle's stream is shared state). */
void run(desc plan, int64_t ws, const int64_t *uids, void *const *ptrs, int n, cudaStream_t s,
         const char *what)
{
  char why[256] = "";
  cudnnHandle_t h = handle_of(why, sizeof why);
  void *work = nullptr;
  desc pack = nullptr;
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  if (!h || (ws > 0 && !WF_CUDA_OK(cudaMallocAsync(&work, (size_t)ws, s)))) {
    WF_ERROR("%s: %s", what, h ? "no workspace" : why);
    wf__cuda_record(-1);
    return;
  }
  if ((st = g_api.set_stream(h, s)) == CUDNN_STATUS_SUCCESS &&
      (st = g_api.make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack)) == CUDNN_STATUS_SUCCESS &&
      (st = g_api.set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids)) ==
          CUDNN_STATUS_SUCCESS &&
      (st = g_api.set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs)) ==
          CUDNN_STATUS_SUCCESS &&
      (st = g_api.set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &work)) ==
          CUDNN_STATUS_SUCCESS &&
      (st = g_api.finalize(pack)) == CUDNN_STATUS_SUCCESS)
    st = g_api.execute(h, plan, pack);
  wf__cuda_count_launch();
  if (st != CUDNN_STATUS_SUCCESS) {
    char detail[160] = "";
    g_api.last_error(detail, sizeof detail);
    WF_ERROR("%s: %s%s%s", what, g_api.error_string(st), detail[0] ? ": " : "", detail);
    wf__cuda_record(-(int)st);
  }
  if (pack)
    g_api.unmake(pack);
  if (work)
    WF_CUDA_OK(cudaFreeAsync(work, s));
}

plans *ready(int B, int T, int C, int NH, int NKV, bool docs, const char *what)
{
  char why[256] = "kv heads differ from heads";
  plans *p = NKV == NH ? plans_of(B, T, C, NH, docs, why, sizeof why) : nullptr;
  if (!p || !p->ok) { /* attention_impl.cu asked wf__cudnn_sdpa_accepts first */
    WF_ERROR("%s: no cuDNN plan for B %d, T %d, C %d, %d heads: %s", what, B, T, C, NH,
             p ? p->why : why);
    wf__cuda_record(-1);
    return nullptr;
  }
  return p;
}

} /* namespace */

bool wf__cudnn_sdpa_accepts(int B, int T, int C, int NH, int NKV, bool docs, char *why, size_t len)
{
  std::lock_guard<std::mutex> guard(g_lock);
  refusal(T, C, NH, NKV, why, len);
  if (why[0])
    return false;
  plans *p = plans_of(B, T, C, NH, docs, why, len);
  if (p && !p->ok)
    snprintf(why, len, "cuDNN %zu: %s", g_api.version, p->why);
  return p && p->ok;
}

void wf__cudnn_sdpa_forward(wf_bf16 *out, float *lse, const wf_bf16 *qkv, const int *starts, int B,
                            int T, int C, int NH, int NKV, cudaStream_t s)
{
  std::lock_guard<std::mutex> guard(g_lock);
  plans *p = ready(B, T, C, NH, NKV, starts != nullptr, "cuDNN attention forward");
  if (!p)
    return;
  float scale = 1.0f / sqrtf((float)(C / NH)), neg = g_api.version < 91000 ? -FLT_MAX : -INFINITY;
  wf_bf16 *x = const_cast<wf_bf16 *>(qkv);
  const int64_t uids[] = {Q, K, V, O, STATS, SCALE, NEG, START};
  void *const ptrs[] = {x,      x + C, x + 2 * (size_t)C,        out, lse,
                        &scale, &neg,  const_cast<int *>(starts)};
  run(p->fwd_plan, p->fwd_ws, uids, ptrs, starts ? 8 : 7, s, "cuDNN attention forward");
}

void wf__cudnn_sdpa_backward(wf_bf16 *dqkv, const wf_bf16 *dout, const wf_bf16 *qkv,
                             const wf_bf16 *out, const float *lse, const int *starts, int B, int T,
                             int C, int NH, int NKV, cudaStream_t s)
{
  std::lock_guard<std::mutex> guard(g_lock);
  plans *p = ready(B, T, C, NH, NKV, starts != nullptr, "cuDNN attention backward");
  if (!p)
    return;
  size_t rows = (size_t)B * NH * T, dsum_bytes = (rows * sizeof(float) + 255) & ~(size_t)255;
  size_t acc_bytes = rows * (size_t)(C / NH) * sizeof(float);
  char *mem = nullptr; /* Dsum, then the fp32 dQ accumulator */
  if (!WF_CUDA_OK(cudaMallocAsync((void **)&mem, dsum_bytes + acc_bytes, s)))
    return;
  /* Before cuDNN 9.6 the accumulator must start at zero (cudnn-frontend clears it). */
  if (g_api.version >= 90600 || WF_CUDA_OK(cudaMemsetAsync(mem + dsum_bytes, 0, acc_bytes, s))) {
    float scale = 1.0f / sqrtf((float)(C / NH)), one = 1.0f;
    float neg = g_api.version < 91000 ? -FLT_MAX : -INFINITY;
    wf_bf16 *x = const_cast<wf_bf16 *>(qkv), *dy = const_cast<wf_bf16 *>(dout);
    wf_bf16 *y = const_cast<wf_bf16 *>(out);
    const int64_t uids[] = {Q, K, V, O, STATS, DO, DQ, DK, DV, SCALE, ONE, NEG, DSUM, DQACC, START};
    void *const ptrs[] = {x,
                          x + C,
                          x + 2 * (size_t)C,
                          y,
                          const_cast<float *>(lse),
                          dy,
                          dqkv,
                          dqkv + C,
                          dqkv + 2 * (size_t)C,
                          &scale,
                          &one,
                          &neg,
                          mem,
                          mem + dsum_bytes,
                          const_cast<int *>(starts)};
    run(p->bwd_plan, p->bwd_ws, uids, ptrs, starts ? 15 : 14, s, "cuDNN attention backward");
  }
  WF_CUDA_OK(cudaFreeAsync(mem, s));
}

void wf__cudnn_sdpa_release(void)
{
  std::lock_guard<std::mutex> guard(g_lock);
  if (!g_api.lib)
    return;
  for (int i = 0; i < g_nplans; i++) {
    g_plans[i]->fwd.release();
    g_plans[i]->bwd.release();
    delete g_plans[i];
  }
  g_nplans = 0;
  int cur = 0;
  bool have_cur = cudaGetDevice(&cur) == cudaSuccess;
  for (int d = 0; d < MAX_DEVICES; d++)
    if (g_handle[d] && cudaSetDevice(d) == cudaSuccess) {
      g_api.destroy(g_handle[d]);
      g_handle[d] = nullptr;
    }
  if (have_cur)
    cudaSetDevice(cur);
}
