/*
 * test_zero_mem.c - ZeRO's memory by kind, under mpirun.
 *
 *   mpirun -np D test_zero_mem      (dp = D, the whole gpt2-tiny model on every rank)
 *
 * For optim.zero 0, 1 and 2 (bucket_mb 0: one layer per bucket) every rank builds the
 * model, then the gradient path and the optimizer as the trainer does, and checks:
 *  - the accounting is exact: the bytes the runtime's allocator holds after creating
 *    them, minus before, equal what they report (wf_grads_bytes, wf_grads_param_bytes,
 *    wf_optim_bytes, less the model's flat gradient that ZeRO-2 frees, plus the 8-byte
 *    norm accumulator);
 *  - the formulas (wf_zero_mem) give the same three figures;
 *  - those figures equal an independent count written out here from the llm.c layout:
 *    shard = ceil(n / D); optimizer 8 x the rank's share of it; ZeRO-1's gradient the
 *    flat vector (re-laid bucket by bucket, reduced in place) + the shard; ZeRO-2's the
 *    shard + the unlayered kinds + two one-layer windows; plain dp's the flat vector +
 *    its staging; below ZeRO-3 no parameter memory beyond the flat vector (the
 *    all-gather is in place);
 *  - ZeRO-2 holds less gradient memory than ZeRO-1, and its params + grads + optimizer
 *    stay within 4n + 12n / D + 4 (edge + 2 layers);
 *  - ZeRO-3 (which also frees the flat parameters) holds the shard, the gathered edge
 *    and two one-layer windows of parameters, the same of gradients, and the optimizer's
 *    shard: params + grads + optimizer <= 16n / D + 8 edge + 16 layer + 16 x 3 (the
 *    shard's rounding): the whole model's 1/D, plus its edge unit (wte, wpe, lnf) and
 *    two layer units (the one computing and the one prefetched), parameters and
 *    gradients each.
 * A failed check on any rank calls MPI_Abort, so the test fails instead of hanging.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wf_collectives.h"
#include "wf_model.h"
#include "wf_optim.h"
#include "wf_parallel.h"

#include "../common/mpi_check.h"

static const wf_model_dims DIMS = {.L = 4, .NH = 4, .C = 64, .maxT = 64, .V = 256, .Vp = 256};
#define MIN(a, b) ((a) < (b) ? (a) : (b))

static int64_t held(void)
{
  wf_mem_stats ms;
  wf_mem_get_stats(&ms);
  return ms.current[WF_MEM_HOST] + ms.current[WF_MEM_DEVICE];
}

/* The independent count (elements) of the gradient memory at zero z. */
static size_t expected_grad(wf_model *m, int z, int D)
{
  size_t n = wf_model_local_params(m), shard = (n + (size_t)D - 1) / (size_t)D, C = DIMS.C;
  size_t layer = 12 * C * C + 13 * C; /* qkv 3C^2+3C, attproj C^2+C, fc 4C^2+4C, fcproj
                                         4C^2+C, ln1 and ln2 4C */
  size_t edge = (size_t)DIMS.Vp * C + (size_t)DIMS.maxT * C + 2 * C; /* wte, wpe, lnf */
  CHECK(n == 4 * layer + edge && n == 220544, "gpt2-tiny has %zu parameters", n);
  if (z == 0) /* plain dp: groups lnf, 4 layers, embeddings, each count + 1 */
    return n + (D > 1 ? n + 6 : 0);
  if (z >= 2)
    return shard + edge + 2 * layer;
  return n + shard; /* ZeRO-1 */
}

static void check_zero(wf_comm *dp, int z, size_t grad_bytes[4])
{
  int D = wf_comm_size(dp), rank = wf_comm_rank(dp);
  wf_model *m = NULL;
  CHECK(wf_model_create(&m, &DIMS, 2, 16) == WF_OK, "model");
  wf_config cfg;
  wf_config_init(&cfg);
  size_t n = wf_model_local_params(m), f = sizeof(float);
  wf_mem_kinds plan;
  CHECK(wf_zero_mem(m, D, rank, z, 0, false, &plan) == WF_OK, "wf_zero_mem");
  int64_t before = held();
  wf_grads *g = NULL;
  wf_optim *o = NULL;
  wf_grads_opts go = {.model = m, .dp = dp, .zero = z};
  CHECK(wf_grads_create(&g, &go) == WF_OK, "grads");
  wf_optim_opts oo = {.cfg = &cfg, .model = m, .dp_size = D};
  wf_grads_range(g, &oo.lo, &oo.hi);
  CHECK(wf_optim_create(&o, &oo) == WF_OK, "optim");
  CHECK(wf_grads_zero(g) == WF_OK, "the first step's start (ZeRO-3 shards the parameters)");
  int64_t delta = held() - before;
  size_t grads = wf_grads_bytes(g), extra = wf_grads_param_bytes(g), optim = wf_optim_bytes(o);
  size_t param = wf_model_param_bytes(m) + extra;
  /* created: the reduction's buffers, the optimizer and the gradient path's two device
   * words (the norm's sum of squares and the tied check's word); freed: ZeRO-2's flat
   * gradient and ZeRO-3's flat parameters */
  int64_t want = (int64_t)(grads + extra + optim + 2 * sizeof(double)) - (int64_t)(n * f) -
                 (z == 3 ? (int64_t)(n * f) : 0);
  CHECK(delta == want, "zero %d: allocations grew by %lld bytes, the accounting says %lld", z,
        (long long)delta, (long long)want);
  CHECK(plan.param == param && plan.grad == grads && plan.optim == optim,
        "zero %d: wf_zero_mem says param %zu grad %zu optim %zu, the trainer %zu %zu %zu", z,
        plan.param, plan.grad, plan.optim, param, grads, optim);
  size_t shard = (n + (size_t)D - 1) / (size_t)D;
  size_t s0 = MIN((size_t)rank * shard, n), s1 = MIN(s0 + shard, n);
  CHECK(optim == (z ? 8 * (s1 - s0) : 8 * n), "zero %d: optimizer %zu bytes", z, optim);
  size_t eg = expected_grad(m, z, D) * f;
  CHECK(grads == eg, "zero %d: gradient memory %zu bytes, counted independently %zu", z, grads, eg);
  size_t C = DIMS.C, layer = 12 * C * C + 13 * C;
  size_t edge = (size_t)DIMS.Vp * C + (size_t)DIMS.maxT * C + 2 * C;
  if (z == 3) {
    CHECK(param == 4 * (shard + edge + 2 * layer), "ZeRO-3: parameter memory %zu bytes", param);
    size_t bound = 16 * n / (size_t)D + 8 * edge + 16 * layer + 16 * 3;
    CHECK(param + grads + optim <= bound, "ZeRO-3: %zu bytes > %zu", param + grads + optim, bound);
  }
  if (z == 1 || z == 2)
    CHECK(extra == 0, "ZeRO-%d: %zu bytes of parameters beyond the flat vector", z, extra);
  if (z == 2) {
    size_t bound = 4 * n + 12 * n / (size_t)D + 4 * (edge + 2 * layer) + 4 * 3;
    CHECK(param + grads + optim <= bound, "ZeRO-2: %zu bytes > %zu", param + grads + optim, bound);
  }
  grad_bytes[z] = grads;
  if (rank == 0)
    printf("dp %d zero %d rank 0: param %zu grad %zu optim %zu bytes (allocations +%lld)\n", D, z,
           param, grads, optim, (long long)delta);
  wf_optim_destroy(o);
  wf_grads_destroy(g);
  wf_model_destroy(m);
}

int main(int argc, char **argv)
{
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  wf_comm *world = NULL;
  CHECK(wf_comm_world_create(&world) == WF_OK, "world");
  size_t grad_bytes[4];
  for (int z = 0; z <= 3; z++)
    check_zero(world, z, grad_bytes);
  CHECK(grad_bytes[2] < grad_bytes[1], "ZeRO-2's gradient memory %zu >= ZeRO-1's %zu",
        grad_bytes[2], grad_bytes[1]);
  if (world_rank == 0)
    printf("ok: memory by kind exact for zero 0, 1, 2, 3\n");
  wf_comm_destroy(world);
  MPI_Finalize();
  return 0;
}
