/*
 * adamw.cu - AdamW on the GPU (twin of wf_adamw_update).
 *
 * One thread per parameter. The bias corrections 1 - beta^t are computed once on
 * the host, in float as the CPU twin does, and passed in.
 *   g = grad * grad_scale
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *   p -= lr (m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay p)
 */
#include "cuda_int.h"

/* params, m, v, grads (n) */
__global__ static void adamw_kernel(float *params, float *m, float *v, const float *grads, size_t n,
                                    float lr, float beta1, float beta2, float eps,
                                    float weight_decay, float bc1, float bc2, float grad_scale)
{
  WF_GRID_STRIDE(i, n)
  {
    float g = grads[i] * grad_scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bc1;
    float vhat = vi / bc2;
    float p = params[i];
    params[i] = p - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * p);
  }
}

extern "C" void wf_cuda_adamw_update(float *params, float *m, float *v, const float *grads,
                                     size_t n, float lr, float beta1, float beta2, float eps,
                                     float weight_decay, int t, float grad_scale, void *stream)
{
  if (n == 0)
    return;
  float bc1 = 1.0f - powf(beta1, (float)t);
  float bc2 = 1.0f - powf(beta2, (float)t);
  adamw_kernel<<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(
      params, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2, grad_scale);
  WF_CUDA_LAUNCHED("adamw_kernel");
}
