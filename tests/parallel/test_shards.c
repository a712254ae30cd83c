/*
 * test_shards.c - the tensor- and pipeline-parallel shards of the model, under mpirun.
 *
 *   mpirun -np N test_shards TP PP     (dp = N / (TP x PP))
 *
 * Every rank builds its shard of gpt2-tiny (L4 NH4 C64 maxT64 V256 Vp256) with the real
 * tp communicator, as the trainer does (layers split evenly over the pp stages), and
 * checks:
 *  - the parameter count of the shard against a count written out here independently
 *    of model.c (the Megatron split: wte rows, qkv/fc rows and attproj/fcproj columns
 *    divided by tp; layernorms, wpe and the row-parallel biases replicated; embeddings
 *    on the first stage, wte again and the final layernorm on the last), and, for the
 *    tp 2 x pp 2 mesh, against the numbers worked out by hand below;
 *  - the parameters each rank counts in global sums (wf_model_counted: replicated
 *    tensors on tp rank 0 only, the tied wte on the first stage only) add up over the
 *    world to the whole model's 220544 exactly once;
 *  - the initialised shard equals the same slice of the one-rank initialisation
 *    (wf_model_init on the shard vs wf_model_import_full of a whole-model init), bit for
 *    bit: a shard never depends on the mesh;
 *  - exporting every shard of dp rank 0 and summing over the world rebuilds the whole
 *    initial model bit for bit (each element is added once, to zero).
 * A failed check on any rank calls MPI_Abort, so the test fails instead of hanging.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wf_collectives.h"
#include "wf_model.h"
#include "wf_parallel.h"
#include "../common/gpt2_kinds.h"

#include "../common/mpi_check.h"

static const wf_model_dims DIMS = {.L = 4, .NH = 4, .C = 64, .maxT = 64, .V = 256, .Vp = 256};

/* The parameters of a shard, counted from the Megatron split (not from model.c). */
static size_t expected_params(const wf_model_shard *s)
{
  size_t C = (size_t)DIMS.C, tp = (size_t)s->tp, nl = (size_t)(s->l1 - s->l0);
  size_t per_layer = (3 * C * C + 3 * C) / tp   /* qkv: column-parallel */
                     + C * C / tp + C           /* attproj: row-parallel, bias replicated */
                     + (4 * C * C + 4 * C) / tp /* fc: column-parallel */
                     + 4 * C * C / tp + C       /* fcproj: row-parallel, bias replicated */
                     + 4 * C;                   /* ln1, ln2 */
  size_t n = nl * per_layer;
  if (s->first || s->last)
    n += (size_t)DIMS.Vp * C / tp; /* wte: a vocabulary slice */
  if (s->first)
    n += (size_t)DIMS.maxT * C; /* wpe */
  if (s->last)
    n += 2 * C; /* lnf */
  return n;
}

/* Parameters the shard counts in global sums. */
static size_t counted_params(wf_model *m)
{
  size_t n = 0;
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++)
    if (wf_model_counted(m, k))
      n += wf_model_local_numel(m, k);
  return n;
}

static void check_counts(wf_model *m, const wf_model_shard *s, int tp, int pp)
{
  size_t want = expected_params(s), got = wf_model_local_params(m);
  CHECK(got == want, "tp %d/%d layers [%d, %d): %zu parameters, expected %zu", s->tp_rank, tp,
        s->l0, s->l1, got, want);
  if (tp == 2 && pp == 2) {
    /* By hand, C = 64: a layer holds 3*64*64/2 + 3*64/2 + 64*64/2 + 64 + 4*64*64/2 + 4*64/2
     * + 4*64*64/2 + 64 + 4*64 = 25184; stage 0 = 2 layers + wte 256*64/2 + wpe 64*64 =
     * 62656, stage 1 = 2 layers + wte + lnf 128 = 58688. */
    size_t hand = s->first ? 62656 : 58688;
    CHECK(got == hand, "%zu parameters, worked out by hand %zu", got, hand);
  }
  unsigned long long mine = counted_params(m), all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  int dp = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &dp);
  dp /= tp * pp;
  /* 220544: gpt2-tiny's parameter count (llm.c's formula, tests/model test_num_params). */
  CHECK(all == 220544ull * (unsigned long long)dp && wf_model_num_params(&DIMS) == 220544,
        "counted parameters add up to %llu over the world, want 220544 per dp replica", all);
}

static void check_init_slices(wf_model *m, wf_comm *world, int dp_rank)
{
  size_t N = wf_model_num_params(&DIMS), n = wf_model_local_params(m);
  wf_model *whole = NULL;
  CHECK(wf_model_create(&whole, &DIMS, 1, 1) == WF_OK, "cannot create the whole model");
  wf_model_init(whole, 1234);
  float *mine = malloc(n * sizeof *mine), *sum = calloc(N, sizeof *sum);
  CHECK(mine && sum, "out of memory");
  wf_model_init(m, 1234);
  memcpy(mine, wf_model_params(m), n * sizeof *mine);
  memset(wf_model_params(m), 0, n * sizeof *mine);
  wf_model_import_full(m, 0, wf_model_params(whole));
  CHECK(memcmp(mine, wf_model_params(m), n * sizeof *mine) == 0,
        "the shard's initial values differ from the slice of the one-rank model");
  if (dp_rank == 0) /* one copy of the model: dp rank 0's shards, as --save does */
    wf_model_export_full(m, 0, sum);
  CHECK(wf_comm_allreduce(world, sum, sum, N, WF_COMM_F32, WF_COMM_SUM) == WF_OK, "allreduce");
  CHECK(memcmp(sum, wf_model_params(whole), N * sizeof *sum) == 0,
        "the shards of dp rank 0, exported and summed, differ from the whole initial model");
  free(mine);
  free(sum);
  wf_model_destroy(whole);
}

int main(int argc, char **argv)
{
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int tp = argc > 2 ? atoi(argv[1]) : 0, pp = argc > 2 ? atoi(argv[2]) : 0;
  CHECK(tp > 0 && pp > 0 && size % (tp * pp) == 0 && DIMS.L % pp == 0,
        "usage: mpirun -np N test_shards TP PP with TP x PP dividing N and PP dividing 4");
  /* rank = tp + TP * (dp + DP * pp), as the mesh lays ranks out */
  int dp_size = size / (tp * pp), t = world_rank % tp, d = world_rank / tp % dp_size;
  int p = world_rank / (tp * dp_size);
  wf_comm *world = NULL, *tpc = NULL;
  CHECK(wf_comm_world_create(&world) == WF_OK, "world");
  CHECK(wf_comm_split(world, p * dp_size + d, t, "tp", &tpc) == WF_OK, "tp split");
  int lps = DIMS.L / pp;
  wf_tp *tpr = NULL;
  CHECK(wf_tp_create(&tpr, tpc, wf_dev_cpu(), false) == WF_OK, "tp regions");
  wf_model_opts o = {.dims = DIMS,
                     .shard = {.tp = tp,
                               .tp_rank = t,
                               .l0 = p * lps,
                               .l1 = (p + 1) * lps,
                               .first = p == 0,
                               .last = p == pp - 1},
                     .tp = wf_tp_regions_of(tpr),
                     .B = 1,
                     .T = 8,
                     .slots = 1};
  wf_model *m = NULL;
  CHECK(wf_model_create_shard(&m, &o) == WF_OK, "create the shard");
  check_counts(m, &o.shard, tp, pp);
  check_init_slices(m, world, d);
  if (world_rank == 0)
    printf("ok: tp %d x pp %d (dp %d): shard parameter counts, counted sums and init slices\n", tp,
           pp, dp_size);
  wf_model_destroy(m);
  wf_tp_destroy(tpr);
  wf_comm_destroy(tpc);
  wf_comm_destroy(world);
  MPI_Finalize();
  return 0;
}
