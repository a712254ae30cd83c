/*
 * adamw.cu - AdamW on the GPU (twin of wf_adamw_update).
 *
 * One thread per parameter. The inverse bias corrections 1 / (1 - beta^t) are
 * computed once on the host in double, as the CPU twin does (which also treats a
 * step t < 1 as 1), and passed in as floats.
 *   g = grad * grad_scale
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *   p -= lr (m ibc1 / (sqrt(v ibc2) + eps) + weight_decay p),  ibc = 1 / (1 - beta^t)
 */
#include "cuda_int.h"

/* params, m, v, grads (n) */
__global__ static void adamw_kernel(float *params, float *m, float *v, const float *grads, size_t n,
                                    float lr, float beta1, float beta2, float eps,
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
    params[i] = p - lr * (mi * ibc1 / (sqrtf(vi * ibc2) + eps) + weight_decay * p);
  }
}

extern "C" void wf_cuda_adamw_update(float *params, float *m, float *v, const float *grads,
                                     size_t n, float lr, float beta1, float beta2, float eps,
                                     float weight_decay, int t, float grad_scale, wf_stream *stream)
{
  if (n == 0)
    return;
  if (t < 1)
    t = 1;
  float ibc1 = (float)(1.0 / (1.0 - pow((double)beta1, t)));
  float ibc2 = (float)(1.0 / (1.0 - pow((double)beta2, t)));
  adamw_kernel<<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(
      params, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, ibc1, ibc2, grad_scale);
  WF_CUDA_LAUNCHED("adamw_kernel");
}
