/*
 * test_device_path.c - every communicator made from one with a device path carries
 * device buffers the same way, and the watchdog's abort reaches all of them.
 *
 * Runs under mpirun on the CPU, with the host stand-in for a GPU (hostgpu/, found
 * through WEFT_MODULE_PATH): its memory is what the collectives take for device
 * memory, and there is no NCCL, so device buffers go through host staging, the path
 * ranks sharing a GPU take. Checked on every rank:
 *  - a split, a group and a split of a split of a staged communicator are staged
 *    (HSDP's fsdp and replica groups are splits of dp: without inheritance their
 *    device buffers reached plain MPI);
 *  - asking for NCCL where it cannot start falls back to staging on every rank, with
 *    the reason;
 *  - collectives on stand-in device buffers in those children (all-to-all among them)
 *    give the serial reference's values, each costing the host the two copies staging needs
 *    (wf_comm_host_syncs), and host buffers none;
 *  - wf_comm_abort_all from any member aborts the whole family and nothing else:
 *    every later operation fails with WF_EABORTED, a second world is untouched.
 * A failed check on any rank calls MPI_Abort.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/mpi_check.h"
#include "wf_collectives.h"
#include "wf_gpu.h"

#define OK(call) CHECK((call) == WF_OK, "a call failed (see the log)")

static float val(int r, int i) { return (float)((r * 7 + i * 3) % 11 - 5); }

/* Allreduce (blocking and not) and bcast of stand-in device memory on c: the values
 * of the serial reference, and two host synchronisations per operation. */
static void check_device_ops(wf_gpu *g, wf_comm *c)
{
  enum { N = 257 };
  int n = wf_comm_size(c), r = wf_comm_rank(c);
  float h[N], *d = NULL;
  OK(wf_gpu_malloc(g, (void **)&d, sizeof h));
  for (int i = 0; i < N; i++)
    h[i] = val(r, i);
  OK(wf_gpu_memcpy_h2d(g, d, h, sizeof h));
  uint64_t s0 = wf_comm_host_syncs(c);
  OK(wf_comm_allreduce(c, d, d, N, WF_COMM_F32, WF_COMM_SUM));
  CHECK(wf_comm_host_syncs(c) == s0 + 2, "%s",
        "staging waits twice per device operation, host buffers never"); /* in place: one buffer
                                                                            down, one up */
  wf_req *req = NULL;
  OK(wf_comm_iallreduce(c, d, d, N, WF_COMM_F32, WF_COMM_SUM, &req));
  OK(wf_req_wait(&req));
  CHECK(wf_comm_host_syncs(c) == s0 + 4, "%s",
        "staging waits twice per device operation, host buffers never");
  OK(wf_gpu_memcpy_d2h(g, h, d, sizeof h));
  for (int i = 0; i < N; i++) {
    float want = 0;
    for (int q = 0; q < n; q++)
      want += val(q, i);
    CHECK(h[i] == want * (float)n, "%s",
          "value against the serial reference"); /* small integers: exact */
  }
  wf_trace_entry e;
  CHECK(wf_comm_last_op(c, &e) && e.op == WF_OP_ALLREDUCE && !e.device, "%s",
        "flight recorder entry"); /* staged: MPI */
  /* all-to-all: rank r sends p + 1 elements to peer p, each block at p * N / n */
  size_t cnt[16], off[16], rc[16], ro[16], blk = N / (size_t)n;
  for (int p = 0; p < n; p++)
    cnt[p] = (size_t)p + 1, off[p] = (size_t)p * blk, rc[p] = (size_t)r + 1, ro[p] = off[p];
  for (int i = 0; i < N; i++)
    h[i] = val(r, i);
  float *e2 = NULL;
  OK(wf_gpu_malloc(g, (void **)&e2, sizeof h));
  OK(wf_gpu_memcpy_h2d(g, d, h, sizeof h));
  uint64_t s1 = wf_comm_host_syncs(c);
  OK(wf_comm_alltoallv(c, d, cnt, off, e2, rc, ro, WF_COMM_F32));
  CHECK(wf_comm_host_syncs(c) == s1 + 2, "%s", "staging waits twice per device operation");
  OK(wf_gpu_memcpy_d2h(g, h, e2, sizeof h));
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < rc[p]; i++)
      CHECK(h[ro[p] + i] == val(p, (int)((size_t)r * blk + i)), "%s",
            "all-to-all against the serial reference");
  wf_gpu_free(g, e2);
  s0 += 2;
  float host[2] = {1, (float)r};
  OK(wf_comm_bcast(c, host, 2, WF_COMM_F32, n - 1));
  CHECK(host[1] == (float)(n - 1) && wf_comm_host_syncs(c) == s0 + 4, "%s",
        "staging waits twice per device operation, host buffers never"); /* host: no copies */
  wf_gpu_free(g, d);
}

/* Children of every kind take the parent's device path. */
static void check_inheritance(wf_gpu *g, wf_comm *world)
{
  int n = wf_comm_size(world), r = wf_comm_rank(world);
  wf_comm *dp = NULL, *fsdp = NULL, *rep = NULL, *ends = NULL;
  char why[256] = "unchanged";
  OK(wf_comm_set_device_path(world, g, false, why, sizeof why));
  CHECK(!strcmp(wf_comm_device_path(world), "staged") && why[0] == '\0', "%s",
        "the device path was not what its parent had");
  OK(wf_comm_split(world, 0, r, "dp", &dp));
  int f = n % 2 == 0 ? 2 : 1; /* as grads.c splits dp for HSDP */
  OK(wf_comm_split(dp, r / f, r % f, "fsdp", &fsdp));
  OK(wf_comm_split(dp, r % f, r / f, "replica", &rep));
  int ranks[2] = {n - 1, 0};
  OK(wf_comm_create_group(world, ranks, n > 1 ? 2 : 1, "ends", &ends));
  CHECK(!strcmp(wf_comm_device_path(dp), "staged"), "%s",
        "the device path was not what its parent had");
  CHECK(!strcmp(wf_comm_device_path(fsdp), "staged"), "%s",
        "the device path was not what its parent had");
  CHECK(!strcmp(wf_comm_device_path(rep), "staged"), "%s",
        "the device path was not what its parent had");
  CHECK((ends != NULL) == (r == 0 || r == n - 1), "%s", "group membership");
  CHECK(!ends || !strcmp(wf_comm_device_path(ends), "staged"), "%s",
        "the device path was not what its parent had");
  check_device_ops(g, fsdp);
  check_device_ops(g, rep);
  if (ends)
    check_device_ops(g, ends);
  wf_comm_destroy(ends);
  wf_comm_destroy(rep);
  wf_comm_destroy(fsdp);
  wf_comm_destroy(dp);
}

/* NCCL asked for, but the module is not on WEFT_MODULE_PATH: staging on every rank. */
static void check_nccl_fallback(wf_gpu *g, wf_comm *c)
{
  char why[256] = "";
  OK(wf_comm_set_device_path(c, g, true, why, sizeof why));
  CHECK(!strcmp(wf_comm_device_path(c), "staged") && !wf_comm_has_nccl(c), "%s",
        "the device path was not what its parent had");
  CHECK(strstr(why, "NCCL module") != NULL, "%s", "the reason NCCL did not start");
  /* A CPU rank (no GPU): nothing to do, host buffers only. */
  wf_comm *cpu = NULL;
  OK(wf_comm_world_create(&cpu));
  OK(wf_comm_set_device_path(cpu, NULL, true, why, sizeof why));
  CHECK(!strcmp(wf_comm_device_path(cpu), "none"), "%s",
        "the device path was not what its parent had");
  wf_comm_destroy(cpu);
}

/* Abort reaches every live member of one family, and only that family. */
static void check_abort_all(wf_gpu *g, wf_comm *other)
{
  int r = wf_comm_rank(other);
  wf_comm *w = NULL, *a = NULL, *b = NULL, *gone = NULL;
  char names[256];
  float x = 1;
  OK(wf_comm_world_create(&w));
  OK(wf_comm_set_device_path(w, g, false, NULL, 0));
  OK(wf_comm_split(w, 0, r, "a", &a));
  OK(wf_comm_split(a, 0, r, "gone", &gone));
  int ranks[1] = {0};
  OK(wf_comm_create_group(a, ranks, 1, "b", &b)); /* rank 0 only */
  wf_comm_destroy(gone);                          /* left the family */
  OK(wf_comm_barrier(w));
  int n = wf_comm_abort_all(b ? b : a, names, sizeof names);
  CHECK(n == (r == 0 ? 3 : 2), "%s", "the abort did not reach exactly the family");
  CHECK(strstr(names, "world(staged)") && strstr(names, "a(staged)") && !strstr(names, "gone"),
        "%s", "the abort did not reach exactly the family");
  CHECK(r != 0 || strstr(names, "b(staged)"), "%s", "the abort did not reach exactly the family");
  CHECK(wf_comm_allreduce(w, &x, &x, 1, WF_COMM_F32, WF_COMM_SUM) == WF_EABORTED, "%s",
        "the abort did not reach exactly the family");
  CHECK(wf_comm_barrier(a) == WF_EABORTED, "%s", "the abort did not reach exactly the family");
  OK(wf_comm_allreduce(other, &x, &x, 1, WF_COMM_F32, WF_COMM_SUM)); /* another family */
  wf_comm_destroy(b);
  wf_comm_destroy(a);
  wf_comm_destroy(w);
}

int main(int argc, char **argv)
{
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  wf_rt_set_rank(world_rank);
  char why[256] = "";
  wf_gpu *g = NULL;
  OK(wf_gpu_open(&g, why, sizeof why)); /* the stand-in: WEFT_MODULE_PATH names it */
  wf_comm *world = NULL, *plain = NULL;
  OK(wf_comm_world_create(&world));
  OK(wf_comm_world_create(&plain));
  check_inheritance(g, world);
  check_nccl_fallback(g, plain);
  check_abort_all(g, world);
  wf_comm_destroy(plain);
  wf_comm_destroy(world);
  wf_gpu_close(g);
  if (world_rank == 0)
    printf("device paths: every child staged like its parent, abort reached the family\n");
  MPI_Finalize();
  return 0;
}
