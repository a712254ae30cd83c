/*
 * test_cudnn_graphs.cu - cuDNN takes weft's attention graphs (kernels/cuda/cudnn_sdpa.cu):
 * its fused flash-attention engines recognise the forward and the backward graph, plain
 * and with packed documents' mask, on a machine with a GPU and on one without.
 *
 * The graph builders are the module's own (this file includes cudnn_sdpa.cu, so it tests
 * the code that runs, not a copy). For each shape (head size 64 at T 1024, 128 at T 77;
 * B x NH 3):
 *  - with a GPU: both plans are built through the module's builder::plan on a real
 *    handle, as wf__cudnn_sdpa_accepts builds them;
 *  - without one: the heuristics are asked for an H100 (sm_90) and an A100 (sm_80)
 *    described by cuDNN's device-property JSON (cuDNN 9.8 and later). They return the
 *    fused attention engines' configurations, which then cannot finalize for want of
 *    the driver (libcuda, to compile and load their kernels). cuDNN logs why each was
 *    rejected; the test captures the log (cudnnSetCallback) and requires that every
 *    rejection is CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING, i.e. that
 *    the engines accepted the graph and only the missing GPU stopped them. A graph the
 *    engines do not recognise is rejected with CUDNN_STATUS_NOT_SUPPORTED and a reason
 *    about the graph: a deliberately wrong forward (the softmax's division replaced by
 *    a subtraction) shows that this check fails when it should.
 *
 * cuDNN 9 must be loadable (it is where weft is built with CUDA: /usr/local/cuda); the
 * test fails otherwise, with the loader's reason.
 */
#include <stdio.h>
#include <string>

#include "../../kernels/cuda/cudnn_sdpa.cu"
#include "module_stubs.h"

/* What the module's backend.cu provides besides module_stubs.h's, for cudnn_sdpa.cu. */
extern "C" void wf_vlog(int level, const char *file, int line, const char *fmt, va_list ap)
{
  (void)level, (void)file, (void)line;
  vprintf(fmt, ap);
  printf("\n");
}
bool wf__cuda_check(cudaError_t e, const char *file, int line, const char *what)
{
  (void)file, (void)line;
  if (e != cudaSuccess)
    printf("%s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

namespace
{

/* Device properties as cuDNN's JSON names them (cudaDeviceProp's values of the GPU). */
const char *H100_JSON =
    "{\"deviceName\":\"NVIDIA H100 80GB HBM3\",\"deviceVer\":900,\"driverVer\":13000,"
    "\"cudaDeviceId\":0,\"maxGridSize\":[2147483647,65535,65535],\"maxBlockSize\":[1024,1024,64],"
    "\"regsPerBlock\":65536,\"multiProcessorCount\":132,\"warpSize\":32,"
    "\"maxSharedMemoryPerBlock\":49152,\"maxSharedMemoryPerBlockOptin\":232448,"
    "\"reservedSharedMemoryPerBlock\":1024,\"maxRegistersPerSM\":65536,\"maxCtasPerSM\":32,"
    "\"maxThreadsPerBlock\":1024,\"maxThreadsPerSM\":2048,\"pciDeviceId\":0,\"isTccDriver\":0,"
    "\"supportCoopLaunch\":1,\"totalGlobalMem\":85031714816,\"smClockRateKHz\":1980000,"
    "\"memClockRateKHz\":2619000,\"l2CacheSize\":52428800}";
const char *A100_JSON =
    "{\"deviceName\":\"NVIDIA A100-SXM4-80GB\",\"deviceVer\":800,\"driverVer\":13000,"
    "\"cudaDeviceId\":0,\"maxGridSize\":[2147483647,65535,65535],\"maxBlockSize\":[1024,1024,64],"
    "\"regsPerBlock\":65536,\"multiProcessorCount\":108,\"warpSize\":32,"
    "\"maxSharedMemoryPerBlock\":49152,\"maxSharedMemoryPerBlockOptin\":166912,"
    "\"reservedSharedMemoryPerBlock\":1024,\"maxRegistersPerSM\":65536,\"maxCtasPerSM\":32,"
    "\"maxThreadsPerBlock\":1024,\"maxThreadsPerSM\":2048,\"pciDeviceId\":0,\"isTccDriver\":0,"
    "\"supportCoopLaunch\":1,\"totalGlobalMem\":85899345920,\"smClockRateKHz\":1410000,"
    "\"memClockRateKHz\":1593000,\"l2CacheSize\":41943040}";

std::string g_log; /* cuDNN's warnings since the last clear */

void capture(cudnnSeverity_t sev, void *, const cudnnDebug_t *, const char *msg)
{
  if (sev > CUDNN_SEV_WARNING)
    return;
  for (const char *p = msg; *p; p += strlen(p) + 1) /* lines, each NUL-terminated */
    g_log.append(p).append("\n");
}

/* How cuDNN judged the heuristics' configurations of one graph. */
struct verdict {
  int64_t configs; /* proposed by the heuristics */
  int64_t plans;   /* that finalized */
  int prereq;      /* rejections for a missing runtime prerequisite (the driver) */
  int other;       /* rejections for anything else: the graph */
  std::string first_other;
};

/* count (and first) lines of g_log holding `needle` */
int count_lines(const char *needle, std::string *first)
{
  int n = 0;
  size_t a = 0;
  while (a < g_log.size()) {
    size_t b = g_log.find('\n', a);
    std::string line = g_log.substr(a, b == std::string::npos ? std::string::npos : b - a);
    if (line.find(needle) != std::string::npos && n++ == 0 && first)
      *first = line;
    a = b == std::string::npos ? g_log.size() : b + 1;
  }
  return n;
}

/* The heuristics' configurations of g's graph for the device `prop`, and the plans they
 * finalize into (none without a driver). */
verdict offline(builder &g, desc prop)
{
  verdict v = {0, 0, 0, 0, ""};
  desc graph = g.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)g.ops.size(),
        g.ops.data());
  g.finalize(graph, "operation graph");
  desc heur = g.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  g.set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  g.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  g.set_desc(heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, prop);
  g.finalize(heur, "engine heuristics");
  if (!g.ok || g_api.get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                         &v.configs, nullptr) != CUDNN_STATUS_SUCCESS)
    return v;
  std::vector<desc> cfgs;
  for (int64_t i = 0; i < v.configs; i++)
    cfgs.push_back(g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
  g_log.clear();
  if (v.configs > 0)
    g_api.get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, v.configs,
              &v.plans, cfgs.data());
  v.prereq = count_lines("CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING;", nullptr);
  v.other = count_lines("CUDNN_STATUS_NOT_SUPPORTED;", &v.first_other);
  return v;
}

/* The engines took the graph: a plan finalized, or every rejection wanted the driver. */
bool accepted(const verdict &v)
{
  return v.configs > 0 && (v.plans > 0 || (v.prereq > 0 && v.other == 0));
}

void print(const char *what, const verdict &v, bool ok)
{
  printf("  %-4s %-34s %lld configurations, %lld plans; rejected for the driver %d, for the "
         "graph %d%s%s\n",
         ok ? "ok" : "FAIL", what, (long long)v.configs, (long long)v.plans, v.prereq, v.other,
         v.other ? ": " : "", v.first_other.c_str());
}

/* A wrong forward graph: the softmax's division replaced by a subtraction. */
void wrong_forward(builder &g, const shape &z)
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
  g.pointwise(CUDNN_POINTWISE_SUB, T_F32, e, zs, p);
  g.matmul(p, v, o);
}

typedef void (*graph_fn)(builder &, const shape &);

/* One graph of one shape on the device `prop`; `expect` whether the engines take it. */
int check_offline(const char *what, graph_fn fn, const shape &z, desc prop, bool expect)
{
  builder g;
  fn(g, z);
  verdict v = offline(g, prop);
  bool ok = g.ok && accepted(v) == expect;
  if (!g.ok)
    printf("  FAIL %s: %s\n", what, g.why);
  else
    print(what, v, ok);
  g.release();
  return !ok;
}

/* Both plans on the real device, as the module builds them. */
int check_device(const char *what, const shape &z)
{
  char why[256] = "";
  cudnnHandle_t h = handle_of(why, sizeof why);
  int failures = 0;
  for (int dir = 0; dir < 2; dir++) {
    builder g;
    int64_t ws = 0;
    (dir ? backward_graph : forward_graph)(g, z);
    bool ok = h && g.plan(h, &ws, dir ? "backward" : "forward") && g.ok;
    printf("  %-4s %s %s: %s (workspace %lld bytes)\n", ok ? "ok" : "FAIL", what,
           dir ? "backward" : "forward",
           ok  ? "a plan"
           : h ? g.why
               : why,
           (long long)ws);
    failures += !ok;
    g.release();
  }
  return failures;
}

desc device_prop(builder &pb, const char *json)
{
  desc prop = pb.make(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
  pb.set(prop, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, (int64_t)strlen(json),
         json);
  pb.finalize(prop, "device properties from JSON (cuDNN 9.8 or later)");
  return pb.ok ? prop : nullptr;
}

} /* namespace */

int main(void)
{
  const int shapes[][4] = {{1, 1024, 3, 64}, {3, 77, 1, 128}}; /* B, T, NH, hs */
  int failures = 0, gpus = 0;
  setenv("CUDNN_LOGLEVEL_DBG", "2", 1); /* warnings reach the callback */
  if (!load_api()) {
    printf("FAIL cuDNN: %s\n", g_load_why);
    return 1;
  }
  cudnnStatus_t (*set_callback)(unsigned, void *, cudnnCallback_t) = nullptr;
  if (!sym(set_callback, "cudnnSetCallback") ||
      set_callback(CUDNN_SEV_ERROR_EN | CUDNN_SEV_WARNING_EN, nullptr, capture) != 0) {
    printf("FAIL cuDNN: no log callback\n");
    return 1;
  }
  printf("cuDNN %zu\n", g_api.version);
  if (cudaGetDeviceCount(&gpus) != cudaSuccess)
    gpus = 0;
  cudaGetLastError();
  builder pb;
  desc h100 = gpus ? nullptr : device_prop(pb, H100_JSON);
  desc a100 = gpus ? nullptr : device_prop(pb, A100_JSON);
  if (!gpus && (!h100 || !a100)) {
    printf("FAIL %s\n", pb.why);
    return 1;
  }
  for (const auto &s : shapes) {
    shape z = {s[0], s[2], s[1], s[3], 3 * (int64_t)s[2] * s[3], (int64_t)s[2] * s[3]};
    char what[96];
    snprintf(what, sizeof what, "B %d, T %d, %d heads of %d", s[0], s[1], s[2], s[3]);
    printf("%s\n", what);
    shape zd = z; /* the same with packed documents (the START mask) */
    zd.docs = true;
    if (gpus) {
      failures += check_device(what, z);
      failures += check_device("(documents)", zd);
      continue;
    }
    failures += check_offline("forward on an H100", forward_graph, z, h100, true);
    failures += check_offline("backward on an H100", backward_graph, z, h100, true);
    failures += check_offline("forward on an A100", forward_graph, z, a100, true);
    failures += check_offline("backward on an A100", backward_graph, z, a100, true);
    failures += check_offline("a wrong forward on an H100", wrong_forward, z, h100, false);
    failures += check_offline("documents: forward on an H100", forward_graph, zd, h100, true);
    failures += check_offline("documents: backward on an H100", backward_graph, zd, h100, true);
    failures += check_offline("documents: forward on an A100", forward_graph, zd, a100, true);
    failures += check_offline("documents: backward on an A100", backward_graph, zd, a100, true);
  }
  pb.release();
  printf("%d failure(s)\n", failures);
  return failures ? 1 : 0;
}
