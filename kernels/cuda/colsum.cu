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
 */
#include "cuda_int.h"

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
