/*
 * device.c - the CPU device (wf_device.h): host memory from the runtime's accounted
 * allocator, the CPU kernels, and streams and events that exist only as handles.
 *
 * Every op has finished when it returns, so a stream is an order that already holds
 * and an event is the wall-clock time at which it was recorded (event_elapsed is then
 * exactly the host time between two records). The kernel table wraps each CPU kernel
 * with the GPU launcher's signature (the stream argument is unused); a call through
 * the table costs one indirect call. The 16-bit tables (bf16, fp16) replace the entries
 * that take activations with the kernels' 16-bit forms (storage.h) and share the rest.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_int.h"
#include "wf_config.h" /* wf_attention_impl */
#include "wf_device.h"
#include "wf_kernels.h"

/* ---- memory -------------------------------------------------------------------- */

static wf_status cpu_alloc(void *impl, void **p, size_t bytes)
{
  *p = wf_mem_alloc(bytes);
  if (*p)
    return WF_OK;
  WF_ERROR("out of host memory allocating %zu bytes", bytes);
  return WF_ENOMEM;
}

static void cpu_free(void *impl, void *p) { wf_mem_free(p); }
static void cpu_host_free(void *impl, void *p, size_t bytes) { wf_mem_free(p); }

struct fill {
  char *p;
  int value;
  size_t n;
};

static void fill_share(void *ctx, int tid, int nt)
{
  const struct fill *f = ctx;
  size_t lo, hi;
  wf__split(f->n, tid, nt, 64, &lo, &hi);
  memset(f->p + lo, f->value, hi - lo);
}

/* Gradient buffers are the size of the model, and one core alone does not reach the
 * memory bandwidth: large fills are split over the kernels' pool. */
static wf_status cpu_memset(void *impl, void *p, int value, size_t bytes, wf_stream *s)
{
  struct fill f = {p, value, bytes};
  wf__parallel(bytes < ((size_t)4 << 20) ? 1 : wf__threads(), fill_share, &f);
  return WF_OK;
}

static wf_status cpu_copy(void *impl, void *dst, const void *src, size_t bytes, wf_copy_kind k,
                          wf_stream *s)
{
  memmove(dst, src, bytes);
  return WF_OK;
}

/* ---- streams and events ------------------------------------------------------------ */

/* Handles only: a distinct non-NULL pointer per stream. */
static wf_status cpu_stream_create(void *impl, wf_stream **s)
{
  *s = malloc(1);
  return *s ? WF_OK : WF_ENOMEM;
}

static void cpu_stream_destroy(void *impl, wf_stream *s) { free(s); }
static wf_status cpu_stream_sync(void *impl, wf_stream *s) { return WF_OK; }

struct wf_event {
  double t; /* wf_now() when recorded; 0 before */
};

static wf_status cpu_event_create(void *impl, wf_event **e)
{
  *e = calloc(1, sizeof **e);
  return *e ? WF_OK : WF_ENOMEM;
}

static void cpu_event_destroy(void *impl, wf_event *e) { free(e); }

static wf_status cpu_event_record(void *impl, wf_event *e, wf_stream *s)
{
  e->t = wf_now();
  return WF_OK;
}

static wf_status cpu_stream_wait(void *impl, wf_stream *s, wf_event *e) { return WF_OK; }
static wf_status cpu_event_sync(void *impl, wf_event *e) { return WF_OK; }

static wf_status cpu_event_elapsed(void *impl, wf_event *a, wf_event *b, double *seconds)
{
  *seconds = b->t - a->t;
  return WF_OK;
}

static void cpu_destroy(void *impl) {}

const wf_dev_ops wf__cpu_dev_ops = {
    .version = WF_DEV_OPS_VERSION,
    .kind = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memset = cpu_memset,
    .copy = cpu_copy,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_sync = cpu_stream_sync,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait = cpu_stream_wait,
    .event_sync = cpu_event_sync,
    .event_elapsed = cpu_event_elapsed,
    .host_alloc = cpu_alloc,
    .host_free = cpu_host_free,
    .host_visible = true,
    .destroy = cpu_destroy,
};

/* ---- the kernel table ------------------------------------------------------------- */

static void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                            int T, int C, wf_stream *s)
{
  wf_encoder_forward(out, inp, wte, wpe, B, T, C);
}

static void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                             int T, int C, wf_stream *s)
{
  wf_encoder_backward(dwte, dwpe, dout, inp, B, T, C);
}

static void encoder_forward_vp(float *out, const int *inp, const float *wte, int v_offset, int Vl,
                               const float *wpe, int B, int T, int C, wf_stream *s)
{
  wf_encoder_forward_vp(out, inp, wte, v_offset, Vl, wpe, B, T, C);
}

static void encoder_backward_vp(float *dwte, float *dwpe, const float *dout, const int *inp,
                                int v_offset, int Vl, int B, int T, int C, wf_stream *s)
{
  wf_encoder_backward_vp(dwte, dwpe, dout, inp, v_offset, Vl, B, T, C);
}

static void layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
                              const float *weight, const float *bias, int N, int C, wf_stream *s)
{
  wf_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
}

static void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                               const void *inp, const float *weight, const float *mean,
                               const float *rstd, int N, int C, wf_stream *s)
{
  wf_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

static void residual_layernorm_forward(void *res, void *ln, float *mean, float *rstd, const void *a,
                                       const float *b, const float *weight, const float *bias,
                                       int N, int C, wf_stream *s)
{
  wf_residual_forward(res, a, b, (size_t)N * C);
  wf_layernorm_forward(ln, mean, rstd, res, weight, bias, N, C);
}

/* fp32 GEMMs: exact for operands the model already rounded to lowp's format. */
static void matmul_forward(void *out, const void *inp, const void *weight, const float *bias, int N,
                           int C, int OC, int lowp, wf_stream *s)
{
  wf_matmul_forward(out, inp, weight, bias, N, C, OC);
}

static void matmul_forward_f32(float *out, const void *inp, const void *weight, const float *bias,
                               int N, int C, int OC, int lowp, wf_stream *s)
{
  wf_matmul_forward(out, inp, weight, bias, N, C, OC);
}

static void matmul_gelu_forward(void *gelu_out, void *pre, const void *inp, const void *weight,
                                const float *bias, int N, int C, int OC, int lowp, wf_stream *s)
{
  wf_matmul_forward(pre, inp, weight, bias, N, C, OC);
  wf_gelu_forward(gelu_out, pre, (size_t)N * OC);
}

static void matmul_backward(void *dinp, float *dweight, float *dbias, const void *dout,
                            const void *inp, const void *weight, int N, int C, int OC, int lowp,
                            wf_stream *s)
{
  wf_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}

static void matmul_backward_f32(float *dinp, float *dweight, float *dbias, const void *dout,
                                const void *inp, const void *weight, int N, int C, int OC, int lowp,
                                wf_stream *s)
{
  wf_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}

static void set_tf32(int allow) {}

/* The CPU kernels keep the (T, T) probabilities, and backward a (T, T) scratch. */
static size_t attention_tt(int B, int T, int C, int NH) { return (size_t)B * NH * T * T; }

static void attention_forward(void *out, void *att, const void *qkv, int B, int T, int C, int NH,
                              wf_stream *s)
{
  wf_attention_forward(out, att, qkv, B, T, C, NH);
}

static void attention_backward(void *dqkv, float *scratch, const void *dout, const void *qkv,
                               const void *att, int B, int T, int C, int NH, wf_stream *s)
{
  wf_attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH);
}

static void gelu_forward(void *out, const void *inp, size_t N, wf_stream *s)
{
  wf_gelu_forward(out, inp, N);
}

static void gelu_backward(void *dinp, const void *inp, const void *dout, size_t N, wf_stream *s)
{
  wf_gelu_backward(dinp, inp, dout, N);
}

static void residual_forward(void *out, const void *a, const float *b, size_t N, wf_stream *s)
{
  wf_residual_forward(out, a, b, N);
}

static void residual_backward(float *da, float *db, const float *dout, size_t N, wf_stream *s)
{
  wf_residual_backward(da, db, dout, N);
}

static void xent_stats(float *row_max, float *row_sumexp, float *target_logit, const void *logits,
                       const int *targets, int N, int V, int ld, int v_offset, wf_stream *s)
{
  wf_xent_stats(row_max, row_sumexp, target_logit, logits, targets, N, V, ld, v_offset);
}

static void xent_pack(float *stats, const float *row_max, const float *row_sumexp,
                      const float *target_logit, int N, wf_stream *s)
{
  wf_xent_pack(stats, row_max, row_sumexp, target_logit, N);
}

static void xent_combine(float *row_max, float *row_sumexp, float *target_logit, const float *all,
                         int N, int parts, wf_stream *s)
{
  wf_xent_combine(row_max, row_sumexp, target_logit, all, N, parts);
}

static void xent_loss(float *losses, const float *row_max, const float *row_sumexp,
                      const float *target_logit, int N, wf_stream *s)
{
  wf_xent_loss(losses, row_max, row_sumexp, target_logit, N);
}

static void xent_backward(void *dlogits, const void *logits, const float *row_max,
                          const float *row_sumexp, const int *targets, float dloss, int N, int V,
                          int ld, int v_offset, wf_stream *s)
{
  wf_xent_backward(dlogits, logits, row_max, row_sumexp, targets, dloss, N, V, ld, v_offset);
}

static void loss_accumulate(double *acc, const float *losses, int N, wf_stream *s)
{
  wf_loss_accumulate(acc, losses, N);
}

static void tokens_check(int *bad, const int *tokens, size_t n, int V, wf_stream *s)
{
  wf_tokens_check(bad, tokens, n, V);
}

static void adamw_update(float *params, float *m, float *v, const float *grads, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, int t,
                         float grad_scale, wf_stream *s)
{
  wf_adamw_update(params, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
}

static void adamw_update_store(float *params, void *low, float *m, float *v, const float *grads,
                               size_t n, float lr, float beta1, float beta2, float eps,
                               float weight_decay, int t, float grad_scale, wf_stream *s)
{
  wf_adamw_update_store(params, low, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, t,
                        grad_scale, WF_PREC_NO);
}

static void checksum(uint64_t *out, const float *x, size_t n, int negate, wf_stream *s)
{
  (void)s;
  wf_checksum(out, x, n, negate);
}

static void sumsq_acc(double *acc, const float *x, size_t n, wf_stream *s)
{
  wf_sumsq_acc(acc, x, n);
}

static void scale(float *x, float f, size_t n, wf_stream *s) { wf_scale(x, f, n); }

static void round_bf16(float *dst, const float *src, size_t n, wf_stream *s)
{
  wf_round_bf16(dst, src, n);
}

static void round_fp16(float *dst, const float *src, size_t n, wf_stream *s)
{
  wf_round_fp16(dst, src, n);
}

static void rmsnorm_forward(void *out, float *rstd, const void *inp, const float *weight, float eps,
                            int N, int C, wf_stream *s)
{
  wf_rmsnorm_forward(out, rstd, inp, weight, eps, N, C);
}

static void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const void *inp,
                             const float *weight, const float *rstd, int N, int C, wf_stream *s)
{
  wf_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
}

static void residual_rmsnorm_forward(void *res, void *out, float *rstd, const void *a,
                                     const float *b, const float *weight, float eps, int N, int C,
                                     wf_stream *s)
{
  wf_residual_forward(res, a, b, (size_t)N * C);
  wf_rmsnorm_forward(out, rstd, res, weight, eps, N, C);
}

static void rope_forward(void *qkv, const float *cs, int B, int T, int NH, int NKV, int hs,
                         wf_stream *s)
{
  wf_rope_forward(qkv, cs, B, T, NH, NKV, hs);
}

static void rope_backward(void *dqkv, const float *cs, int B, int T, int NH, int NKV, int hs,
                          wf_stream *s)
{
  wf_rope_backward(dqkv, cs, B, T, NH, NKV, hs);
}

static void swiglu_forward(void *out, const void *inp, int N, int F, wf_stream *s)
{
  wf_swiglu_forward(out, inp, N, F);
}

static void swiglu_backward(void *dinp, const void *inp, const void *dout, int N, int F,
                            wf_stream *s)
{
  wf_swiglu_backward(dinp, inp, dout, N, F);
}

static void attention_gqa_forward(void *out, void *att, const void *qkv, int B, int T, int C,
                                  int NH, int NKV, wf_stream *s)
{
  wf_attention_gqa_forward(out, att, qkv, B, T, C, NH, NKV);
}

static void attention_gqa_backward(void *dqkv, float *scratch, const void *dout, const void *qkv,
                                   const void *att, int B, int T, int C, int NH, int NKV,
                                   wf_stream *s)
{
  wf_attention_gqa_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH, NKV);
}

/* The CPU kernels allocate nothing for themselves (the 16-bit kernels' working rows are
 * per thread and small: storage.c). */
static size_t workspace_bytes(void) { return 0; }

/* CPU kernels cannot fail once their arguments are valid, except for want of a 16-bit
 * kernel's working rows. */
static wf_status last_error(void)
{
  bool work = wf__work_failed(), dnnl = wf__dnnl_failed();
  return work ? WF_ENOMEM : dnnl ? WF_EUNSUPPORTED : WF_OK;
}

static void store32(void *dst, const float *src, size_t n, wf_stream *s)
{
  wf_storage_store(dst, src, n, WF_PREC_NO);
}

static void load32(float *dst, const void *src, size_t n, wf_stream *s)
{
  wf_storage_load(dst, src, n, WF_PREC_NO);
}

static const wf_ktable *storage(int format);

/* The CPU has one attention, the (T, T) one above. */
static void set_attention(int impl) {}

static int attention_path(int B, int T, int C, int NH, int NKV) { return WF_ATTN_REFERENCE; }

static void attention_bf16_forward(wf_bf16 *out, float *lse, const wf_bf16 *qkv, int B, int T,
                                   int C, int NH, int NKV, wf_stream *s)
{
  wf_attention_bf16_forward(out, lse, qkv, B, T, C, NH, NKV);
}

static void attention_bf16_backward(wf_bf16 *dqkv, float *scratch, const wf_bf16 *dout,
                                    const wf_bf16 *qkv, const wf_bf16 *out, const float *lse, int B,
                                    int T, int C, int NH, int NKV, wf_stream *s)
{
  wf_attention_bf16_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, NKV);
}

static void classifier_bf16(wf_bf16 *logits, float *losses, const int *targets, float dloss, int N,
                            int V, int ld, wf_stream *s)
{
  wf_classifier_bf16(logits, losses, targets, dloss, N, V, ld);
}

static void xent_stats_bf16(float *row_max, float *row_sumexp, float *target_logit,
                            const wf_bf16 *logits, const int *targets, int N, int V, int ld,
                            int v_offset, wf_stream *s)
{
  wf_xent_stats_bf16(row_max, row_sumexp, target_logit, logits, targets, N, V, ld, v_offset);
}

static void xent_backward_bf16(wf_bf16 *dlogits, const wf_bf16 *logits, const float *row_max,
                               const float *row_sumexp, const int *targets, float dloss, int N,
                               int V, int ld, int v_offset, wf_stream *s)
{
  wf_xent_backward_bf16(dlogits, logits, row_max, row_sumexp, targets, dloss, N, V, ld, v_offset);
}

static uint64_t launches(void) { return 0; }

const wf_ktable wf__cpu_ktable = {
    .version = WF_KTABLE_VERSION,
    .encoder_forward = encoder_forward,
    .encoder_backward = encoder_backward,
    .encoder_forward_vp = encoder_forward_vp,
    .encoder_backward_vp = encoder_backward_vp,
    .layernorm_forward = layernorm_forward,
    .layernorm_backward = layernorm_backward,
    .residual_layernorm_forward = residual_layernorm_forward,
    .matmul_forward = matmul_forward,
    .matmul_forward_f32 = matmul_forward_f32,
    .matmul_gelu_forward = matmul_gelu_forward,
    .matmul_backward = matmul_backward,
    .matmul_backward_f32 = matmul_backward_f32,
    .set_tf32 = set_tf32,
    .attention_saved = attention_tt,
    .attention_scratch = attention_tt,
    .workspace_bytes = workspace_bytes,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .gelu_forward = gelu_forward,
    .gelu_backward = gelu_backward,
    .residual_forward = residual_forward,
    .residual_backward = residual_backward,
    .xent_stats = xent_stats,
    .xent_pack = xent_pack,
    .xent_combine = xent_combine,
    .xent_loss = xent_loss,
    .xent_backward = xent_backward,
    .loss_accumulate = loss_accumulate,
    .tokens_check = tokens_check,
    .adamw_update = adamw_update,
    .sumsq_acc = sumsq_acc,
    .checksum = checksum,
    .scale = scale,
    .round_bf16 = round_bf16,
    .round_fp16 = round_fp16,
    .last_error = last_error,
    .rmsnorm_forward = rmsnorm_forward,
    .rmsnorm_backward = rmsnorm_backward,
    .residual_rmsnorm_forward = residual_rmsnorm_forward,
    .rope_forward = rope_forward,
    .rope_backward = rope_backward,
    .swiglu_forward = swiglu_forward,
    .swiglu_backward = swiglu_backward,
    .attention_gqa_forward = attention_gqa_forward,
    .attention_gqa_backward = attention_gqa_backward,
    .set_attention = set_attention,
    .attention_path = attention_path,
    .attention_bf16_forward = attention_bf16_forward,
    .attention_bf16_backward = attention_bf16_backward,
    .attention_bf16_scratch = wf_attention_bf16_scratch,
    .classifier_bf16 = classifier_bf16,
    .xent_stats_bf16 = xent_stats_bf16,
    .xent_backward_bf16 = xent_backward_bf16,
    .launches = launches,
    .format = WF_PREC_NO,
    .storage = storage,
    .store = store32,
    .load = load32,
    .adamw_update_store = adamw_update_store,
};

/* ---- the 16-bit tables --------------------------------------------------------------------- */

/* The entries of the table for 16-bit format FMT, named NAME_<entry>: the kernels' 16-bit
 * forms, with the format bound. */
#define STORAGE_ENTRIES(NAME, FMT)                                                                 \
  static void NAME##_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,       \
                                       const float *w, const float *b, int N, int C, wf_stream *s) \
  {                                                                                                \
    wf_layernorm_forward16(out, mean, rstd, inp, w, b, N, C, FMT);                                 \
  }                                                                                                \
  static void NAME##_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,      \
                                        const void *inp, const float *w, const float *mean,        \
                                        const float *rstd, int N, int C, wf_stream *s)             \
  {                                                                                                \
    wf_layernorm_backward16(dinp, dw, db, dout, inp, w, mean, rstd, N, C, FMT);                    \
  }                                                                                                \
  static void NAME##_residual_layernorm_forward(void *res, void *ln, float *mean, float *rstd,     \
                                                const void *a, const float *b, const float *w,     \
                                                const float *bias, int N, int C, wf_stream *s)     \
  {                                                                                                \
    wf_residual_forward16(res, a, b, (size_t)N *C, FMT);                                           \
    wf_layernorm_forward16(ln, mean, rstd, res, w, bias, N, C, FMT);                               \
  }                                                                                                \
  static void NAME##_matmul_forward(void *out, const void *inp, const void *w, const float *bias,  \
                                    int N, int C, int OC, int lowp, wf_stream *s)                  \
  {                                                                                                \
    const float *rb = OC > 0 ? wf__bias_rounded(bias, (size_t)OC, FMT) : bias;                     \
    if (bias && !rb) /* no memory: reported by last_error */                                       \
      return;                                                                                      \
    if (FMT == WF_PREC_BF16 && wf__dnnl_bf16())                                                    \
      wf__dnnl_forward(out, NULL, inp, w, rb, N, C, OC);                                           \
    else                                                                                           \
      wf_matmul_forward16(out, inp, w, rb, N, C, OC, FMT);                                         \
  }                                                                                                \
  static void NAME##_matmul_forward_f32(float *out, const void *inp, const void *w,                \
                                        const float *bias, int N, int C, int OC, int lowp,         \
                                        wf_stream *s)                                              \
  {                                                                                                \
    if (FMT == WF_PREC_BF16 && wf__dnnl_bf16())                                                    \
      wf__dnnl_forward(NULL, out, inp, w, bias, N, C, OC);                                         \
    else                                                                                           \
      wf_matmul_forward16_f32(out, inp, w, bias, N, C, OC, FMT);                                   \
  }                                                                                                \
  static void NAME##_matmul_gelu_forward(void *gelu_out, void *pre, const void *inp,               \
                                         const void *w, const float *bias, int N, int C, int OC,   \
                                         int lowp, wf_stream *s)                                   \
  {                                                                                                \
    NAME##_matmul_forward(pre, inp, w, bias, N, C, OC, lowp, s);                                   \
    wf_gelu_forward16(gelu_out, pre, (size_t)N *OC, FMT);                                          \
  }                                                                                                \
  static void NAME##_matmul_backward(void *dinp, float *dw, float *db, const void *dout,           \
                                     const void *inp, const void *w, int N, int C, int OC,         \
                                     int lowp, wf_stream *s)                                       \
  {                                                                                                \
    if (FMT == WF_PREC_BF16 && wf__dnnl_bf16())                                                    \
      wf__dnnl_backward(dinp, NULL, dw, db, dout, inp, w, N, C, OC);                               \
    else                                                                                           \
      wf_matmul_backward16(dinp, dw, db, dout, inp, w, N, C, OC, FMT);                             \
  }                                                                                                \
  static void NAME##_matmul_backward_f32(float *dinp, float *dw, float *db, const void *dout,      \
                                         const void *inp, const void *w, int N, int C, int OC,     \
                                         int lowp, wf_stream *s)                                   \
  {                                                                                                \
    if (FMT == WF_PREC_BF16 && wf__dnnl_bf16())                                                    \
      wf__dnnl_backward(NULL, dinp, dw, db, dout, inp, w, N, C, OC);                               \
    else                                                                                           \
      wf_matmul_backward16_f32(dinp, dw, db, dout, inp, w, N, C, OC, FMT);                         \
  }                                                                                                \
  static size_t NAME##_attention_saved(int B, int T, int C, int NH)                                \
  {                                                                                                \
    return ((size_t)B * NH * T * T + 1) / 2; /* the probabilities, two to a float */               \
  }                                                                                                \
  static void NAME##_attention_forward(void *out, void *att, const void *qkv, int B, int T, int C, \
                                       int NH, wf_stream *s)                                       \
  {                                                                                                \
    wf_attention_forward16(out, att, qkv, B, T, C, NH, FMT);                                       \
  }                                                                                                \
  static void NAME##_attention_backward(void *dqkv, float *scratch, const void *dout,              \
                                        const void *qkv, const void *att, int B, int T, int C,     \
                                        int NH, wf_stream *s)                                      \
  {                                                                                                \
    wf_attention_backward16(dqkv, scratch, dout, qkv, att, B, T, C, NH, FMT);                      \
  }                                                                                                \
  static void NAME##_gelu_forward(void *out, const void *inp, size_t N, wf_stream *s)              \
  {                                                                                                \
    wf_gelu_forward16(out, inp, N, FMT);                                                           \
  }                                                                                                \
  static void NAME##_gelu_backward(void *dinp, const void *inp, const void *dout, size_t N,        \
                                   wf_stream *s)                                                   \
  {                                                                                                \
    wf_gelu_backward16(dinp, inp, dout, N, FMT);                                                   \
  }                                                                                                \
  static void NAME##_residual_forward(void *out, const void *a, const float *b, size_t N,          \
                                      wf_stream *s)                                                \
  {                                                                                                \
    wf_residual_forward16(out, a, b, N, FMT);                                                      \
  }                                                                                                \
  static void NAME##_xent_stats(float *mx, float *se, float *tl, const void *logits,               \
                                const int *targets, int N, int V, int ld, int v0, wf_stream *s)    \
  {                                                                                                \
    wf_xent_stats16(mx, se, tl, logits, targets, N, V, ld, v0, FMT);                               \
  }                                                                                                \
  static void NAME##_xent_backward(void *dlogits, const void *logits, const float *mx,             \
                                   const float *se, const int *targets, float dloss, int N, int V, \
                                   int ld, int v0, wf_stream *s)                                   \
  {                                                                                                \
    wf_xent_backward16(dlogits, logits, mx, se, targets, dloss, N, V, ld, v0, FMT);                \
  }                                                                                                \
  static void NAME##_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *w,      \
                                     float eps, int N, int C, wf_stream *s)                        \
  {                                                                                                \
    wf_rmsnorm_forward16(out, rstd, inp, w, eps, N, C, FMT);                                       \
  }                                                                                                \
  static void NAME##_rmsnorm_backward(float *dinp, float *dw, const float *dout, const void *inp,  \
                                      const float *w, const float *rstd, int N, int C,             \
                                      wf_stream *s)                                                \
  {                                                                                                \
    wf_rmsnorm_backward16(dinp, dw, dout, inp, w, rstd, N, C, FMT);                                \
  }                                                                                                \
  static void NAME##_residual_rmsnorm_forward(void *res, void *out, float *rstd, const void *a,    \
                                              const float *b, const float *w, float eps, int N,    \
                                              int C, wf_stream *s)                                 \
  {                                                                                                \
    wf_residual_forward16(res, a, b, (size_t)N *C, FMT);                                           \
    wf_rmsnorm_forward16(out, rstd, res, w, eps, N, C, FMT);                                       \
  }                                                                                                \
  static void NAME##_rope_forward(void *qkv, const float *cs, int B, int T, int NH, int NKV,       \
                                  int hs, wf_stream *s)                                            \
  {                                                                                                \
    wf_rope_forward16(qkv, cs, B, T, NH, NKV, hs, FMT);                                            \
  }                                                                                                \
  static void NAME##_rope_backward(void *dqkv, const float *cs, int B, int T, int NH, int NKV,     \
                                   int hs, wf_stream *s)                                           \
  {                                                                                                \
    wf_rope_backward16(dqkv, cs, B, T, NH, NKV, hs, FMT);                                          \
  }                                                                                                \
  static void NAME##_swiglu_forward(void *out, const void *inp, int N, int F, wf_stream *s)        \
  {                                                                                                \
    wf_swiglu_forward16(out, inp, N, F, FMT);                                                      \
  }                                                                                                \
  static void NAME##_swiglu_backward(void *dinp, const void *inp, const void *dout, int N, int F,  \
                                     wf_stream *s)                                                 \
  {                                                                                                \
    wf_swiglu_backward16(dinp, inp, dout, N, F, FMT);                                              \
  }                                                                                                \
  static void NAME##_attention_gqa_forward(void *out, void *att, const void *qkv, int B, int T,    \
                                           int C, int NH, int NKV, wf_stream *s)                   \
  {                                                                                                \
    wf_attention_gqa_forward16(out, att, qkv, B, T, C, NH, NKV, FMT);                              \
  }                                                                                                \
  static void NAME##_attention_gqa_backward(void *dqkv, float *scratch, const void *dout,          \
                                            const void *qkv, const void *att, int B, int T, int C, \
                                            int NH, int NKV, wf_stream *s)                         \
  {                                                                                                \
    wf_attention_gqa_backward16(dqkv, scratch, dout, qkv, att, B, T, C, NH, NKV, FMT);             \
  }                                                                                                \
  static void NAME##_store(void *dst, const float *src, size_t n, wf_stream *s)                    \
  {                                                                                                \
    wf_storage_store(dst, src, n, FMT);                                                            \
  }                                                                                                \
  static void NAME##_load(float *dst, const void *src, size_t n, wf_stream *s)                     \
  {                                                                                                \
    wf_storage_load(dst, src, n, FMT);                                                             \
  }                                                                                                \
  static void NAME##_adamw_update_store(float *params, void *low, float *m, float *v,              \
                                        const float *grads, size_t n, float lr, float beta1,       \
                                        float beta2, float eps, float weight_decay, int t,         \
                                        float grad_scale, wf_stream *s)                            \
  {                                                                                                \
    wf_adamw_update_store(params, low, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, t,     \
                          grad_scale, FMT);                                                        \
  }

STORAGE_ENTRIES(bf16, WF_PREC_BF16)
STORAGE_ENTRIES(fp16, WF_PREC_FP16)

/* Table t's activation entries and format replaced by those of NAME. */
#define STORAGE_TABLE(t, NAME, FMT)                                                                \
  do {                                                                                             \
    (t) = wf__cpu_ktable;                                                                          \
    (t).layernorm_forward = NAME##_layernorm_forward;                                              \
    (t).layernorm_backward = NAME##_layernorm_backward;                                            \
    (t).residual_layernorm_forward = NAME##_residual_layernorm_forward;                            \
    (t).matmul_forward = NAME##_matmul_forward;                                                    \
    (t).matmul_forward_f32 = NAME##_matmul_forward_f32;                                            \
    (t).matmul_gelu_forward = NAME##_matmul_gelu_forward;                                          \
    (t).matmul_backward = NAME##_matmul_backward;                                                  \
    (t).matmul_backward_f32 = NAME##_matmul_backward_f32;                                          \
    (t).attention_saved = NAME##_attention_saved;                                                  \
    (t).attention_scratch = no_scratch;                                                            \
    (t).attention_forward = NAME##_attention_forward;                                              \
    (t).attention_backward = NAME##_attention_backward;                                            \
    (t).gelu_forward = NAME##_gelu_forward;                                                        \
    (t).gelu_backward = NAME##_gelu_backward;                                                      \
    (t).residual_forward = NAME##_residual_forward;                                                \
    (t).xent_stats = NAME##_xent_stats;                                                            \
    (t).xent_backward = NAME##_xent_backward;                                                      \
    (t).rmsnorm_forward = NAME##_rmsnorm_forward;                                                  \
    (t).rmsnorm_backward = NAME##_rmsnorm_backward;                                                \
    (t).residual_rmsnorm_forward = NAME##_residual_rmsnorm_forward;                                \
    (t).rope_forward = NAME##_rope_forward;                                                        \
    (t).rope_backward = NAME##_rope_backward;                                                      \
    (t).swiglu_forward = NAME##_swiglu_forward;                                                    \
    (t).swiglu_backward = NAME##_swiglu_backward;                                                  \
    (t).attention_gqa_forward = NAME##_attention_gqa_forward;                                      \
    (t).attention_gqa_backward = NAME##_attention_gqa_backward;                                    \
    (t).format = (FMT);                                                                            \
    (t).store = NAME##_store;                                                                      \
    (t).load = NAME##_load;                                                                        \
    (t).adamw_update_store = NAME##_adamw_update_store;                                            \
  } while (0)

/* The 16-bit attention keeps its (T, T) scratch in each thread's working memory. */
static size_t no_scratch(int B, int T, int C, int NH) { return 0; }

static wf_ktable tables[2]; /* bf16, fp16 */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void tables_init(void)
{
  STORAGE_TABLE(tables[0], bf16, WF_PREC_BF16);
  STORAGE_TABLE(tables[1], fp16, WF_PREC_FP16);
}

static const wf_ktable *storage(int format)
{
  pthread_once(&tables_once, tables_init);
  return format == WF_PREC_BF16   ? &tables[0]
         : format == WF_PREC_FP16 ? &tables[1]
         : format == WF_PREC_NO   ? &wf__cpu_ktable
                                  : NULL;
}
