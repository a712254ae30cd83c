/*
 * adamw.cu - AdamW on the GPU (twin of wf_adamw_update and wf_adamw_update_store).
 *
 * One thread per parameter. The inverse bias corrections 1 / (1 - beta^t) are
 * computed once on the host in double, as the CPU twin does (which also treats a
 * step t < 1 as 1), and passed in as floats.
 *   g = grad * grad_scale
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *   p -= lr (m ibc1 / (sqrt(v ibc2) + eps) + weight_decay p),  ibc = 1 / (1 - beta^t)
 * Under mixed precision the same thread stores the new p into the model's 16-bit copy
 * (type E, act_int.h), rounded as cast.cu's store kernel rounds it: bit for bit the
 * update followed by that separate pass, which it replaces.
 */
#include "act_int.h"

/* params, m, v, grads (n); low (n) or NULL */
template <typename E>
__global__ static void adamw_kernel(float *params, E *low, float *m, float *v, const float *grads,
                                    size_t n, float lr, float beta1, float beta2, float eps,
                                    float weight_decay, float ibc1, float ibc2, float grad_scale)
{
  WF_GRID_STRIDE(i, n)
  {
    float g = grads[i] * grad_scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float p = params[i];
    p = p - lr * (mi * ibc1 / (sqrtf(vi * ibc2) + eps) + weight_decay * p);
    params[i] = p;
    if (low)
      wf__st(low, i, p);
  }
}

template <typename E>
static void update_store(float *params, void *low, float *m, float *v, const float *grads, size_t n,
                         float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                         float grad_scale, wf_stream *stream)
{
  if (n == 0)
    return;
  if (t < 1)
    t = 1;
  float ibc1 = (float)(1.0 / (1.0 - pow((double)beta1, t)));
  float ibc2 = (float)(1.0 / (1.0 - pow((double)beta2, t)));
  adamw_kernel<E><<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(
      params, (E *)low, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, ibc1, ibc2,
      grad_scale);
  WF_CUDA_LAUNCHED("adamw_kernel");
}

static void update(float *params, float *m, float *v, const float *grads, size_t n, float lr,
                   float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale,
                   wf_stream *stream)
{
  update_store<float>(params, NULL, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, t,
                      grad_scale, stream);
}

/* ---- the op (wf_kreg.h): one variant per element type (the copy's) --------------------- */

template <typename E> static const wf_adamw_op op = {update, update_store<E>};
const wf_kvariants wf__cuda_adamw =
    WF_KV(adamw, WF_OP_VERSION_adamw, &op<float>, &op<__nv_bfloat16>, &op<__half>);
