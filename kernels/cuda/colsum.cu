/*
 * colsum.cu - the column sums of backward (a bias's gradient, layernorm's weight and
 * bias gradients) with enough blocks to fill the GPU, deterministically.
 *
 * A column sum over N rows of C columns launched as one block per 32 columns has C/32
 * blocks (24 at C = 768, on 132 SMs): most of the GPU idles while a few blocks walk all
 * the rows. So the rows are cut into R blocks as well: block (x, r) sums rows
 * [r*rows, (r+1)*rows) of its 32 columns into partial sums part[r][c] (stage 1, the
 * caller's kernel, which knows what it sums), and one thread per column adds the R
 * partial sums in r order into the gradient (stage 2, here). R depends only on N and
 * C, so the order of every addition is fixed: same inputs, same bits, on any run.
 * R is chosen so that about WF__COLSUM_BLOCKS blocks run, within the partial sums'
 * room in the module's workspace; where even R = 2 does not fit, R = 1 and stage 1
 * adds into the gradient itself (the one-stage reduction).
 *
 * The column sums themselves are here too, templated on the type of what they read
 * (act_int.h: fp32, bf16, fp16), for every table: a bias's gradient (wf__bias_grad) and
 * a norm's weight and bias gradients (wf__norm_param_grads, LayerNorm's and RMSNorm's).
 */
#include "act_int.h"

#define WF__COLSUM_BLOCKS 1024 /* about 8 per SM on an H100's 132 */
#define MAX_ROW_BLOCKS    256

bool wf__colsum_plan(wf__colsum *p, int N, int C, int arrays, const char *file, int line)
{
  float *part = NULL;
  size_t room = 0;
  int col_blocks = (C + WF__COLSUM_TILE - 1) / WF__COLSUM_TILE;
  int want = (WF__COLSUM_BLOCKS + col_blocks - 1) / col_blocks;
  int max_by_rows = (N + WF__COLSUM_LANES - 1) / WF__COLSUM_LANES; /* a lane row each */
  int R = want < MAX_ROW_BLOCKS ? want : MAX_ROW_BLOCKS;
  R = R < max_by_rows ? R : max_by_rows;
  *p = wf__colsum{};
  p->col_blocks = col_blocks;
  if (R > 1 && !wf__partials(&part, &room, file, line))
    return false;
  while (R > 1 && (size_t)R * (size_t)C * (size_t)arrays > room)
    R /= 2;
  p->R = R > 1 ? R : 1;
  p->rows = (N + p->R - 1) / p->R;
  p->part = p->R > 1 ? part : NULL;
  return true;
}

/* dst (C) += sum over r of part (R, C), in r order. */
__global__ static void colsum_finish_kernel(float *dst, const float *part, int R, int C)
{
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C)
    return;
  float acc = 0.0f;
  for (int r = 0; r < R; r++)
    acc += part[(size_t)r * C + c];
  dst[c] += acc;
}

bool wf__colsum_finish(float *dst, const float *part, const wf__colsum *p, int C, cudaStream_t s)
{
  if (!dst || p->R == 1)
    return true;
  colsum_finish_kernel<<<(unsigned)((C + 255) / 256), 256, 0, s>>>(dst, part, p->R, C);
  return WF_CUDA_LAUNCHED("colsum_finish_kernel");
}

/* Stage 1 of dbias (OC) += sum over rows of dout (N, OC): block (x, r) sums rows
 * [r * rows, (r + 1) * rows) of 32 columns. Block (32, 8). */
template <typename E>
__global__ static void bias_grad_kernel(float *dbias, float *part, const E *dout, int N, int OC,
                                        int rows, int R)
{
  __shared__ float sh[WF__COLSUM_LANES * (WF__COLSUM_TILE + 1)];
  int c = blockIdx.x * WF__COLSUM_TILE + threadIdx.x;
  int n0 = blockIdx.y * rows, n1 = min(N, n0 + rows);
  float acc = 0.0f;
  if (c < OC)
    for (int n = n0 + threadIdx.y; n < n1; n += WF__COLSUM_LANES)
      acc += wf__ld(dout, (size_t)n * OC + c);
  wf__colsum_store(acc, sh, dbias, part, R, OC, c);
}

template <typename E> void wf__bias_grad(float *dbias, const E *dout, int N, int OC, cudaStream_t s)
{
  wf__colsum p;
  if (!dbias || N <= 0 || OC <= 0 || !wf__colsum_plan(&p, N, OC, 1, __FILE__, __LINE__))
    return;
  dim3 grid((unsigned)p.col_blocks, (unsigned)p.R);
  bias_grad_kernel<E><<<grid, dim3(WF__COLSUM_TILE, WF__COLSUM_LANES), 0, s>>>(dbias, p.part, dout,
                                                                               N, OC, p.rows, p.R);
  if (WF_CUDA_LAUNCHED("bias_grad_kernel"))
    wf__colsum_finish(dbias, p.part, &p, OC, s);
}

/* Stage 1 of dweight (C) += sum_n xhat dout, xhat = (x - mean) rstd (mean NULL: x rstd,
 * RMSNorm's), and dbias (C) += sum_n dout: block (x, r) sums rows [r * rows, (r + 1) *
 * rows) of 32 columns; the partial sums go to part (dweight's) and part + R * C
 * (dbias's). Block (32, 8). */
template <typename E>
__global__ static void norm_params_kernel(float *dweight, float *dbias, float *part,
                                          const float *dout, const E *inp, const float *mean,
                                          const float *rstd, int N, int C, int rows, int R)
{
  __shared__ float sh[WF__COLSUM_LANES * (WF__COLSUM_TILE + 1)];
  int c = blockIdx.x * WF__COLSUM_TILE + threadIdx.x;
  int n0 = blockIdx.y * rows, n1 = min(N, n0 + rows);
  float w = 0.0f, b = 0.0f;
  if (c < C)
    for (int n = n0 + threadIdx.y; n < n1; n += WF__COLSUM_LANES) {
      size_t i = (size_t)n * C + c;
      float x = wf__ld(inp, i);
      w += (mean ? x - mean[n] : x) * rstd[n] * dout[i];
      b += dout[i];
    }
  wf__colsum_store(w, sh, dweight, part, R, C, c);
  wf__colsum_store(b, sh, dbias, part ? part + (size_t)R * C : NULL, R, C, c);
}

template <typename E>
void wf__norm_param_grads(float *dweight, float *dbias, const float *dout, const E *inp,
                          const float *mean, const float *rstd, int N, int C, cudaStream_t s)
{
  wf__colsum p;
  if ((!dweight && !dbias) || N <= 0 || C <= 0 || !wf__colsum_plan(&p, N, C, 2, __FILE__, __LINE__))
    return;
  dim3 grid((unsigned)p.col_blocks, (unsigned)p.R);
  norm_params_kernel<E><<<grid, dim3(WF__COLSUM_TILE, WF__COLSUM_LANES), 0, s>>>(
      dweight, dbias, p.part, dout, inp, mean, rstd, N, C, p.rows, p.R);
  if (!WF_CUDA_LAUNCHED("norm_params_kernel"))
    return;
  if (wf__colsum_finish(dweight, p.part, &p, C, s))
    wf__colsum_finish(dbias, p.part ? p.part + (size_t)p.R * C : NULL, &p, C, s);
}

#define WF_COLSUM_FORMS(E)                                                                         \
  template void wf__bias_grad<E>(float *, const E *, int, int, cudaStream_t);                      \
  template void wf__norm_param_grads<E>(float *, float *, const float *, const E *, const float *, \
                                        const float *, int, int, cudaStream_t);
WF_COLSUM_FORMS(float)
WF_COLSUM_FORMS(__nv_bfloat16)
WF_COLSUM_FORMS(__half)
