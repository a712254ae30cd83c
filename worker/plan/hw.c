/*
 * hw.c - hardware profiles: the built-in GPUs (datasheet numbers; docs/planning.md gives
 * each one's source), the JSON file worker --profile-hw writes, and the rates the
 * time model reads from a profile: a GEMM's seconds at its shape, and an all-reduce's
 * and an all-gather's seconds by group size.
 *
 * Measured entries win over nominal ones: a GEMM takes the rate of the measured shape
 * nearest to it (log distance over m, n, k, at the same thread count when there is
 * one), interpolated over the rows measured around its own; a collective within a node takes the
 * fit measured for the nearest group size. What is not measured follows a roofline (the peak times
 * gemm_eff, or memory bandwidth) and a ring all-reduce (alpha + 2 (g-1)/g bytes / link bandwidth),
 * an all-gather being half of one.
 */
#include <math.h>
#include <string.h>

#include <jansson.h>

#include "plan_int.h"
#include "wf_file.h"

/* ---- built-in profiles ------------------------------------------------------------------ */

/* Datasheet figures (dense, no sparsity); gemm_eff, alpha and overlap are the
 * planner's assumptions, not datasheet numbers (docs/planning.md says so). */
static const wf_hw builtins[] = {
    {.name = "h100-sxm",
     .source = "NVIDIA H100 Tensor Core GPU datasheet (SXM5 80GB): TF32 494.7, BF16/FP16 989.4 "
               "dense TFLOPS, HBM3 3.35 TB/s, NVLink 900 GB/s; DGX H100: 8x 400 Gb/s NDR",
     .gpu = true,
     .peak_tflops = {494.7, 989.4, 989.4},
     .gemm_eff = 0.6,
     .mem_bw = 3.35e12,
     .mem_bytes = 80e9,
     .gpus_per_node = 8,
     .intra_alpha_s = 10e-6,
     .intra_bw = 450e9, /* NVLink 900 GB/s both directions: 450 each way */
     .inter_alpha_s = 20e-6,
     .inter_bw = 50e9, /* 400 Gb/s NDR per GPU */
     .overlap = 1.0,
     .op_s = 5e-6},
    {.name = "h200",
     .source = "NVIDIA H200 Tensor Core GPU datasheet (SXM 141GB): TF32 494.7, BF16/FP16 989.4 "
               "dense TFLOPS, HBM3e 4.8 TB/s, NVLink 900 GB/s; DGX H200: 8x 400 Gb/s NDR",
     .gpu = true,
     .peak_tflops = {494.7, 989.4, 989.4},
     .gemm_eff = 0.6,
     .mem_bw = 4.8e12,
     .mem_bytes = 141e9,
     .gpus_per_node = 8,
     .intra_alpha_s = 10e-6,
     .intra_bw = 450e9,
     .inter_alpha_s = 20e-6,
     .inter_bw = 50e9,
     .overlap = 1.0,
     .op_s = 5e-6},
    {.name = "a100-80gb",
     .source = "NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB): TF32 156, BF16/FP16 312 dense "
               "TFLOPS, HBM2e 2039 GB/s, NVLink 600 GB/s; DGX A100: 8x 200 Gb/s HDR",
     .gpu = true,
     .peak_tflops = {156, 312, 312},
     .gemm_eff = 0.6,
     .mem_bw = 2.039e12,
     .mem_bytes = 80e9,
     .gpus_per_node = 8,
     .intra_alpha_s = 10e-6,
     .intra_bw = 300e9,
     .inter_alpha_s = 20e-6,
     .inter_bw = 25e9,
     .overlap = 1.0,
     .op_s = 5e-6},
};

wf_status wf_hw_builtin(const char *name, wf_hw *out)
{
  for (size_t i = 0; i < WF_ARRAY_LEN(builtins); i++)
    if (!strcmp(builtins[i].name, name)) {
      *out = builtins[i];
      return WF_OK;
    }
  return WF_EINVAL;
}

/* ---- rates ---------------------------------------------------------------------------- */

static double shape_distance(const wf_hw_gemm *g, double m, double n, double k, int threads)
{
  return fabs(log(g->m / m)) + fabs(log(g->n / n)) + fabs(log(g->k / k)) +
         (g->threads == threads ? 0 : 10); /* another thread count only when nothing else */
}

/* The measured entry of kind `attention` nearest to the shape, or NULL. */
static const wf_hw_gemm *nearest(const wf_hw *hw, bool attention, double m, double n, double k,
                                 int threads)
{
  const wf_hw_gemm *best = NULL;
  for (int i = 0; i < hw->n_gemm; i++)
    if (hw->gemm[i].attention == attention &&
        (!best ||
         shape_distance(&hw->gemm[i], m, n, k, threads) < shape_distance(best, m, n, k, threads)))
      best = &hw->gemm[i];
  return best;
}

double wf_hw_attention_s(const wf_hw *hw, double heads, double T, double hs, int threads,
                         wf_precision p)
{
  const wf_hw_gemm *best = nearest(hw, true, T, T, hs, threads);
  if (!best)
    return 2 * heads * wf_hw_gemm_s(hw, T, T, hs, threads, p);
  double rate =
      best->tflops * 1e12 * (best->threads != threads ? (double)threads / best->threads : 1);
  return 4 * heads * T * T * hs / rate;
}

/* The rate (TFLOPS) of the measured GEMM `best` moved to m rows: interpolated in log(m)
 * between the entries of its n, k and thread count measured just below and above m.
 * The profile measures rows T, 4T, 16T ...; a micro-batch of 2 rows lies between 1 and
 * 4, and small GEMMs are slower per FLOP (gpt2-small's at 64 rows run ~10% slower than
 * at 256 here). Outside the measured rows: best's own rate. */
static double rate_at_rows(const wf_hw *hw, const wf_hw_gemm *best, double m)
{
  const wf_hw_gemm *lo = NULL, *hi = NULL;
  for (int i = 0; i < hw->n_gemm; i++) {
    const wf_hw_gemm *e = &hw->gemm[i];
    if (e->attention || e->n != best->n || e->k != best->k || e->threads != best->threads)
      continue;
    if (e->m <= m && (!lo || e->m > lo->m))
      lo = e;
    if (e->m >= m && (!hi || e->m < hi->m))
      hi = e;
  }
  if (!lo || !hi || lo->m == hi->m)
    return best->tflops;
  double f = log(m / lo->m) / log((double)hi->m / lo->m);
  return lo->tflops + f * (hi->tflops - lo->tflops);
}

double wf_hw_gemm_s(const wf_hw *hw, double m, double n, double k, int threads, wf_precision p)
{
  double flops = 2 * m * n * k;
  if (flops <= 0)
    return 0;
  const wf_hw_gemm *best = nearest(hw, false, m, n, k, threads);
  if (best) {
    double rate = rate_at_rows(hw, best, m) * 1e12;
    if (best->threads != threads && best->threads > 0) /* scale by the threads it had */
      rate *= (double)threads / best->threads;
    return flops / rate;
  }
  double peak = hw->peak_tflops[p] > 0 ? hw->peak_tflops[p] : hw->peak_tflops[WF_PREC_NO];
  double bytes = (m * k + k * n + m * n) * (p == WF_PREC_NO ? 4 : 2);
  return fmax(flops / (peak * 1e12 * hw->gemm_eff), bytes / hw->mem_bw);
}

typedef enum { ALLREDUCE, ALLGATHER, DP_ALLREDUCE, ALLTOALL } coll_kind;

/* The measured group nearest in size, or NULL. */
static const wf_hw_coll *nearest_coll(const wf_hw *hw, int size)
{
  const wf_hw_coll *best = hw->n_coll > 0 ? &hw->coll[0] : NULL;
  for (int i = 1; i < hw->n_coll; i++)
    if (abs(hw->coll[i].size - size) < abs(best->size - size))
      best = &hw->coll[i];
  return best;
}

static double coll_s(const wf_hw *hw, double bytes, int size, bool intra, coll_kind kind)
{
  if (size <= 1)
    return 0;
  const wf_hw_coll *best = intra ? nearest_coll(hw, size) : NULL;
  double bw = !best                  ? 0
              : kind == ALLGATHER    ? best->ag_bw
              : kind == DP_ALLREDUCE ? best->dp_bw
              : kind == ALLTOALL     ? best->a2a_bw
                                     : best->bw;
  if (kind == ALLGATHER && bw <= 0) /* not measured: half an all-reduce */
    return coll_s(hw, bytes, size, intra, ALLREDUCE) / 2;
  if (kind == DP_ALLREDUCE && bw <= 0) /* not measured: a blocking one's */
    return coll_s(hw, bytes, size, intra, ALLREDUCE);
  if (kind == ALLTOALL && bw <= 0) /* not measured: the same bytes as an all-gather's */
    return coll_s(hw, bytes, size, intra, ALLGATHER);
  if (best) {
    /* a group larger than any measured moves 2(g-1)/g of the bytes over the same links */
    double scale =
        size > best->size ? (2.0 * (size - 1) / size) / (2.0 * (best->size - 1) / best->size) : 1;
    return best->alpha_s + scale * bytes / bw;
  }
  double alpha = intra ? hw->intra_alpha_s : hw->inter_alpha_s,
         link = intra ? hw->intra_bw : hw->inter_bw;
  return alpha + 2.0 * (size - 1) / size * bytes / link;
}

double wf_hw_allreduce_s(const wf_hw *hw, double bytes, int size, bool intra)
{
  return coll_s(hw, bytes, size, intra, ALLREDUCE);
}

double wf_hw_allgather_s(const wf_hw *hw, double bytes, int size, bool intra)
{
  return coll_s(hw, bytes, size, intra, ALLGATHER);
}

double wf_hw_dp_allreduce_s(const wf_hw *hw, double bytes, int size, bool intra)
{
  return coll_s(hw, bytes, size, intra, DP_ALLREDUCE);
}

double wf_hw_alltoall_s(const wf_hw *hw, double bytes, int size, bool intra)
{
  return coll_s(hw, bytes, size, intra, ALLTOALL);
}

/* ---- JSON --------------------------------------------------------------------------------- */

static json_t *peaks_json(const wf_hw *hw)
{
  return json_pack("{s:f, s:f, s:f}", "fp32", hw->peak_tflops[WF_PREC_NO], "fp16",
                   hw->peak_tflops[WF_PREC_FP16], "bf16", hw->peak_tflops[WF_PREC_BF16]);
}

/* An all-reduce entry; a measured all-gather rides along with it. */
static json_t *coll_json(const wf_hw_coll *c)
{
  json_t *o = json_pack("{s:i, s:f, s:f}", "size", c->size, "alpha_us", c->alpha_s * 1e6, "bw_gbs",
                        c->bw * 1e-9);
  if (o && c->ag_bw > 0)
    json_object_set_new(o, "allgather_gbs", json_real(c->ag_bw * 1e-9));
  if (o && c->dp_bw > 0)
    json_object_set_new(o, "dp_allreduce_gbs", json_real(c->dp_bw * 1e-9));
  if (o && c->a2a_bw > 0)
    json_object_set_new(o, "alltoall_gbs", json_real(c->a2a_bw * 1e-9));
  return o;
}

static json_t *hw_json(const wf_hw *hw)
{
  json_t *g = json_array(), *c = json_array();
  for (int i = 0; i < hw->n_gemm; i++)
    json_array_append_new(g,
                          json_pack("{s:s, s:i, s:i, s:i, s:i, s:f}", "op",
                                    hw->gemm[i].attention ? "attention" : "matmul", "m",
                                    hw->gemm[i].m, "n", hw->gemm[i].n, "k", hw->gemm[i].k,
                                    "threads", hw->gemm[i].threads, "tflops", hw->gemm[i].tflops));
  for (int i = 0; i < hw->n_coll; i++)
    json_array_append_new(c, coll_json(&hw->coll[i]));
  return json_pack("{s:s, s:s, s:b, s:o, s:f, s:f, s:f, s:i, s:i, s:{s:f, s:f}, s:{s:f, s:f}, "
                   "s:f, s:f, s:f, s:{s:f, s:f, s:f, s:f}, s:o, s:o}",
                   "name", hw->name, "source", hw->source, "gpu", hw->gpu, "peak_tflops",
                   peaks_json(hw), "gemm_eff", hw->gemm_eff, "mem_bw_gbs", hw->mem_bw * 1e-9,
                   "mem_gib", hw->mem_bytes / (1 << 30), "gpus_per_node", hw->gpus_per_node,
                   "cores", hw->cores, "intra", "alpha_us", hw->intra_alpha_s * 1e6, "bw_gbs",
                   hw->intra_bw * 1e-9, "inter", "alpha_us", hw->inter_alpha_s * 1e6, "bw_gbs",
                   hw->inter_bw * 1e-9, "overlap", hw->overlap, "op_us", hw->op_s * 1e6,
                   "busy_cores", hw->busy_cores, "kernels", "layernorm_ns", hw->ln_s * 1e9,
                   "gelu_ns", hw->gelu_s * 1e9, "attention_bwd_ratio", hw->attn_bwd,
                   "matmul_bwd_ratio", hw->matmul_bwd, "gemm", g, "allreduce", c);
}

wf_status wf_hw_save(const wf_hw *hw, const char *path, char *err, size_t len)
{
  json_t *o = hw_json(hw);
  char *text = o ? json_dumps(o, JSON_INDENT(2)) : NULL;
  wf_status st = text ? wf_file_write_atomic(path, text, strlen(text), 0644) : WF_ENOMEM;
  if (st != WF_OK)
    snprintf(err, len, "cannot write the hardware profile %s (%s)", path, wf_status_str(st));
  free(text);
  json_decref(o);
  return st;
}

/* A number field of o, in [lo, hi]; a missing one is an error naming it. */
static bool num_field(json_t *o, const char *key, double lo, double hi, double *out,
                      const char *path, char *err, size_t len)
{
  json_t *v = json_object_get(o, key);
  if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi) {
    snprintf(err, len, "hardware profile %s: \"%s\" must be a number in [%g, %g]", path, key, lo,
             hi);
    return false;
  }
  *out = json_number_value(v);
  return true;
}

static bool read_gemms(json_t *a, wf_hw *hw, const char *path, char *err, size_t len)
{
  size_t i;
  json_t *e;
  json_array_foreach(a, i, e)
  {
    double m, n, k, th, tf;
    if (hw->n_gemm >= WF_HW_MAX_GEMM)
      break;
    if (!num_field(e, "m", 1, 1e9, &m, path, err, len) ||
        !num_field(e, "n", 1, 1e9, &n, path, err, len) ||
        !num_field(e, "k", 1, 1e9, &k, path, err, len) ||
        !num_field(e, "threads", 1, 4096, &th, path, err, len) ||
        !num_field(e, "tflops", 1e-9, 1e6, &tf, path, err, len))
      return false;
    const char *op = json_string_value(json_object_get(e, "op"));
    hw->gemm[hw->n_gemm++] =
        (wf_hw_gemm){(int)m, (int)n, (int)k, (int)th, tf, op && !strcmp(op, "attention")};
  }
  return true;
}

static bool read_colls(json_t *a, wf_hw *hw, const char *path, char *err, size_t len)
{
  size_t i;
  json_t *e;
  json_array_foreach(a, i, e)
  {
    double size, alpha, bw, ag = 0, dp = 0, a2a = 0;
    if (hw->n_coll >= WF_HW_MAX_COLL)
      break;
    if (!num_field(e, "size", 2, 1 << 24, &size, path, err, len) ||
        !num_field(e, "alpha_us", 0, 1e9, &alpha, path, err, len) ||
        !num_field(e, "bw_gbs", 1e-9, 1e9, &bw, path, err, len))
      return false;
    /* optional (profiles before it was measured): half an all-reduce then */
    if (json_object_get(e, "allgather_gbs") &&
        !num_field(e, "allgather_gbs", 1e-9, 1e9, &ag, path, err, len))
      return false;
    if (json_object_get(e, "dp_allreduce_gbs") &&
        !num_field(e, "dp_allreduce_gbs", 1e-9, 1e9, &dp, path, err, len))
      return false;
    if (json_object_get(e, "alltoall_gbs") &&
        !num_field(e, "alltoall_gbs", 1e-9, 1e9, &a2a, path, err, len))
      return false;
    hw->coll[hw->n_coll++] =
        (wf_hw_coll){(int)size, alpha * 1e-6, bw * 1e9, ag * 1e9, dp * 1e9, a2a * 1e9};
  }
  return true;
}

static bool read_link(json_t *o, const char *key, double *alpha, double *bw, const char *path,
                      char *err, size_t len)
{
  json_t *l = json_object_get(o, key);
  char name[64];
  snprintf(name, sizeof name, "%s\" with \"alpha_us\" and \"bw_gbs", key);
  if (!json_is_object(l)) {
    snprintf(err, len, "hardware profile %s: needs an object \"%s\"", path, name);
    return false;
  }
  if (!num_field(l, "alpha_us", 0, 1e9, alpha, path, err, len) ||
      !num_field(l, "bw_gbs", 1e-9, 1e9, bw, path, err, len))
    return false;
  *alpha *= 1e-6, *bw *= 1e9;
  return true;
}

static bool read_hw(json_t *o, wf_hw *hw, const char *path, char *err, size_t len)
{
  json_t *pk = json_object_get(o, "peak_tflops");
  double gpn, cores, memgib, membw;
  memset(hw, 0, sizeof *hw);
  const char *name = json_string_value(json_object_get(o, "name"));
  snprintf(hw->name, sizeof hw->name, "%s", name ? name : path);
  snprintf(hw->source, sizeof hw->source, "%s",
           json_string_value(json_object_get(o, "source"))
               ? json_string_value(json_object_get(o, "source"))
               : path);
  hw->gpu = json_is_true(json_object_get(o, "gpu"));
  if (!json_is_object(pk) ||
      !num_field(pk, "fp32", 0, 1e6, &hw->peak_tflops[WF_PREC_NO], path, err, len) ||
      !num_field(pk, "fp16", 0, 1e6, &hw->peak_tflops[WF_PREC_FP16], path, err, len) ||
      !num_field(pk, "bf16", 0, 1e6, &hw->peak_tflops[WF_PREC_BF16], path, err, len))
    return false;
  if (!num_field(o, "gemm_eff", 0, 1, &hw->gemm_eff, path, err, len) ||
      !num_field(o, "mem_bw_gbs", 1e-3, 1e6, &membw, path, err, len) ||
      !num_field(o, "mem_gib", 0, 1e6, &memgib, path, err, len) ||
      !num_field(o, "gpus_per_node", 1, 1 << 16, &gpn, path, err, len) ||
      !num_field(o, "cores", 0, 1 << 16, &cores, path, err, len) ||
      !num_field(o, "overlap", 0, 1, &hw->overlap, path, err, len) ||
      !num_field(o, "op_us", 0, 1e6, &hw->op_s, path, err, len) ||
      !read_link(o, "intra", &hw->intra_alpha_s, &hw->intra_bw, path, err, len) ||
      !read_link(o, "inter", &hw->inter_alpha_s, &hw->inter_bw, path, err, len))
    return false;
  hw->mem_bw = membw * 1e9, hw->mem_bytes = memgib * (1 << 30), hw->op_s *= 1e-6;
  hw->gpus_per_node = (int)gpn, hw->cores = (int)cores;
  if (!num_field(o, "busy_cores", 0, 1 << 16, &hw->busy_cores, path, err, len))
    return false;
  json_t *kn = json_object_get(o, "kernels");
  if (json_is_object(kn) &&
      (!num_field(kn, "layernorm_ns", 0, 1e9, &hw->ln_s, path, err, len) ||
       !num_field(kn, "gelu_ns", 0, 1e9, &hw->gelu_s, path, err, len) ||
       !num_field(kn, "attention_bwd_ratio", 0, 100, &hw->attn_bwd, path, err, len) ||
       !num_field(kn, "matmul_bwd_ratio", 0, 100, &hw->matmul_bwd, path, err, len)))
    return false;
  hw->ln_s *= 1e-9, hw->gelu_s *= 1e-9;
  if (!read_gemms(json_object_get(o, "gemm"), hw, path, err, len) ||
      !read_colls(json_object_get(o, "allreduce"), hw, path, err, len))
    return false;
  if (hw->n_gemm == 0 && hw->peak_tflops[WF_PREC_NO] <= 0) {
    snprintf(err, len, "hardware profile %s: needs measured \"gemm\" entries or a peak_tflops.fp32",
             path);
    return false;
  }
  return true;
}

wf_status wf_hw_load(const char *path, wf_hw *out, char *err, size_t len)
{
  json_error_t je;
  if (wf_hw_builtin(path, out) == WF_OK)
    return WF_OK;
  json_t *o = json_load_file(path, 0, &je);
  if (!o) {
    snprintf(err, len,
             "cannot read the hardware profile %s: %s (write one with worker --profile-hw FILE, "
             "or name a built-in one: h100-sxm, h200, a100-80gb)",
             path, je.text);
    return WF_EIO;
  }
  bool ok = json_is_object(o) && read_hw(o, out, path, err, len);
  if (!json_is_object(o))
    snprintf(err, len, "hardware profile %s: not a JSON object", path);
  json_decref(o);
  return ok ? WF_OK : WF_EFORMAT;
}
