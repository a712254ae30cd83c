/*
 * collectives.c - weft's collectives against the raw MPI calls, nccl-tests style.
 *
 *   mpirun -np 4 build/bench/collectives [--min BYTES] [--max BYTES] [--step F]
 *                                        [--reps R] [--ops allreduce,...]
 *
 * For each operation and size (8 B to 64 MiB by default, x4 steps) it times weft's
 * call and the raw MPI call on the same buffers in the same run, interleaved repeat
 * by repeat so that drift and noise hit both alike. A repeat runs `iters` calls back
 * to back (100 below 8 KiB, 1 from 64 KiB on) after a barrier; its time is the slowest
 * rank's. The table shows the median repeat per call: of 21 repeats by default below
 * 64 KiB, 3 x 21 from 64 KiB to 4 MiB and 2 x 21 above.
 *
 * Units as in nccl-tests: size is the largest buffer of the call (allreduce: count
 * x 4; reduce_scatter: the full input; allgather: the full output; alltoall: a rank's
 * whole send buffer, count / n to each rank; sendrecv: what one rank sends), algbw =
 * size / time, busbw = algbw x factor with factor 2(n-1)/n for allreduce, (n-1)/n for
 * reduce_scatter, allgather and alltoall, and 1 for bcast and sendrecv (each rank sends
 * right and receives from the left at once).
 * ovh = median weft / median raw - 1. pair = the median over repeats of each repeat's
 * weft / raw - 1: the two halves of a repeat run back to back, so a time slice lost to
 * another process on a shared machine spoils one ratio (high or low, alike) rather
 * than shifting a whole median. --control replaces weft by the same raw MPI call on a
 * second communicator: its ovh and pair columns are the noise floor of the machine.
 * Never a test: it prints a table.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wf_collectives.h"

enum { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BCAST, OP_SENDRECV, OP_ALLTOALL, OP_N };
static const char *op_names[OP_N] = {"allreduce", "reduce_scatter", "allgather",
                                     "bcast",     "sendrecv",       "alltoall"};

typedef struct bench {
  wf_comm *c;
  MPI_Comm raw, raw2; /* raw2: the "weft" side of a --control run */
  bool control;
  int rank, size;
  float *send, *recv;
  int reps;
} bench;

static int fail(const char *what, wf_status st)
{
  fprintf(stderr, "bench/collectives: %s: %s\n", what, wf_status_str(st));
  MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

/* One call of `op` with `count` elements per rank (see the size units above). */
static void call_weft(bench *b, int op, int count)
{
  int n = b->size, right = (b->rank + 1) % n, left = (b->rank + n - 1) % n;
  wf_status st = WF_OK;
  switch (op) {
  case OP_ALLREDUCE:
    st = wf_comm_allreduce(b->c, b->send, b->recv, (size_t)count, WF_COMM_F32, WF_COMM_SUM);
    break;
  case OP_REDUCE_SCATTER:
    st = wf_comm_reduce_scatter(b->c, b->send, b->recv, (size_t)count, WF_COMM_F32, WF_COMM_SUM);
    break;
  case OP_ALLGATHER:
    st = wf_comm_allgather(b->c, b->send, b->recv, (size_t)count, WF_COMM_F32);
    break;
  case OP_BCAST: st = wf_comm_bcast(b->c, b->send, (size_t)count, WF_COMM_F32, 0); break;
  case OP_ALLTOALL:
    st = wf_comm_alltoall(b->c, b->send, b->recv, (size_t)count, WF_COMM_F32);
    break;
  case OP_SENDRECV:
    st = wf_comm_group_start(b->c);
    if (st == WF_OK)
      st = wf_comm_recv(b->c, b->recv, (size_t)count, WF_COMM_F32, left);
    if (st == WF_OK)
      st = wf_comm_send(b->c, b->send, (size_t)count, WF_COMM_F32, right);
    if (st == WF_OK)
      st = wf_comm_group_end(b->c);
    break;
  }
  if (st != WF_OK)
    fail(op_names[op], st);
}

static void call_raw(bench *b, MPI_Comm comm, int op, int count)
{
  int n = b->size, right = (b->rank + 1) % n, left = (b->rank + n - 1) % n, rc = MPI_SUCCESS;
  MPI_Request q[2];
  switch (op) {
  case OP_ALLREDUCE: rc = MPI_Allreduce(b->send, b->recv, count, MPI_FLOAT, MPI_SUM, comm); break;
  case OP_REDUCE_SCATTER:
    rc = MPI_Reduce_scatter_block(b->send, b->recv, count, MPI_FLOAT, MPI_SUM, comm);
    break;
  case OP_ALLGATHER:
    rc = MPI_Allgather(b->send, count, MPI_FLOAT, b->recv, count, MPI_FLOAT, comm);
    break;
  case OP_BCAST: rc = MPI_Bcast(b->send, count, MPI_FLOAT, 0, comm); break;
  case OP_ALLTOALL:
    rc = MPI_Alltoall(b->send, count, MPI_FLOAT, b->recv, count, MPI_FLOAT, comm);
    break;
  case OP_SENDRECV:
    MPI_Irecv(b->recv, count, MPI_FLOAT, left, 1, comm, &q[0]);
    MPI_Isend(b->send, count, MPI_FLOAT, right, 1, comm, &q[1]);
    rc = MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
    break;
  }
  if (rc != MPI_SUCCESS)
    fail(op_names[op], WF_EMPI);
}

/* Seconds per call of one repeat: the slowest rank's. */
static double time_rep(bench *b, int op, int count, int iters, bool weft)
{
  MPI_Barrier(b->raw);
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters; i++)
    if (!weft)
      call_raw(b, b->raw, op, count);
    else if (b->control)
      call_raw(b, b->raw2, op, count);
    else
      call_weft(b, op, count);
  double t = (MPI_Wtime() - t0) / iters, tmax = 0;
  MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, b->raw);
  return tmax;
}

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorts v. */
static double median(double *v, int n)
{
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double bus_factor(int op, int n)
{
  if (op == OP_ALLREDUCE)
    return 2.0 * (n - 1) / n;
  if (op == OP_REDUCE_SCATTER || op == OP_ALLGATHER || op == OP_ALLTOALL)
    return (double)(n - 1) / n;
  return 1.0;
}

typedef struct worst {
  double ovh, pair; /* largest of each at >= 64 KiB */
  size_t ovh_bytes, pair_bytes;
  int ovh_op, pair_op;
} worst;

static void run_size(bench *b, int op, size_t bytes, worst *w)
{
  int n = b->size;
  size_t total = bytes / sizeof(float);
  bool split = op == OP_REDUCE_SCATTER || op == OP_ALLGATHER || op == OP_ALLTOALL;
  int count = (int)(split ? total / (size_t)n : total); /* alltoall: to each rank */
  if (count == 0)
    return;
  size_t shown = (size_t)count * sizeof(float) * (split ? (size_t)n : 1);
  /* Small sizes: many calls per repeat so that the clock resolves them. From 64 KiB
   * on, one call per repeat, so that a rank losing its core (the machine is shared)
   * spoils one sample of the median and not a whole repeat. */
  int iters = bytes <= 8192 ? 100 : bytes < 65536 ? 10 : 1;
  /* Single calls are sampled from 64 KiB on: up to 4 MiB they are cheap, so take 3x as
   * many for a steadier median; above, 2x, because time slices of a shared machine
   * (milliseconds) then hit a large share of the samples. */
  int reps = bytes < 65536 ? b->reps : bytes <= (4u << 20) ? 3 * b->reps : 2 * b->reps;
  double tw[192], tr[192], ratio[192];
  for (int i = 0; i < 2; i++) { /* warm-up: connections, page faults */
    call_raw(b, b->raw, op, count);
    call_weft(b, op, count);
  }
  for (int r = 0; r < reps; r++) {
    bool weft_first = r % 2;
    double a = time_rep(b, op, count, iters, weft_first);
    double z = time_rep(b, op, count, iters, !weft_first);
    tw[r] = weft_first ? a : z;
    tr[r] = weft_first ? z : a;
    ratio[r] = tw[r] / tr[r];
  }
  double mw = median(tw, reps), mr = median(tr, reps), f = bus_factor(op, n);
  double ovh = 100.0 * (mw / mr - 1.0), pair = 100.0 * (median(ratio, reps) - 1.0);
  if (bytes >= 65536 && ovh > w->ovh) {
    w->ovh = ovh;
    w->ovh_bytes = shown;
    w->ovh_op = op;
  }
  if (bytes >= 65536 && pair > w->pair) {
    w->pair = pair;
    w->pair_bytes = shown;
    w->pair_op = op;
  }
  if (b->rank == 0)
    printf("%-14s %11zu %10d  %10.2f %7.3f %7.3f  %10.2f %7.3f %7.3f  %+7.2f %+8.2f\n",
           op_names[op], shown, count, mw * 1e6, shown / mw * 1e-9, shown / mw * 1e-9 * f, mr * 1e6,
           shown / mr * 1e-9, shown / mr * 1e-9 * f, ovh, pair);
}

static size_t parse_size(const char *s)
{
  char *end = NULL;
  double v = strtod(s, &end);
  if (end && (*end == 'K' || *end == 'k'))
    v *= 1024;
  if (end && (*end == 'M' || *end == 'm'))
    v *= 1024 * 1024;
  return (size_t)v;
}

int main(int argc, char **argv)
{
  int provided;
  size_t min = 8, max = (size_t)64 << 20;
  double step = 4;
  const char *ops = "allreduce,reduce_scatter,allgather,bcast,sendrecv,alltoall";
  bench b = {.reps = 21};
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--min"))
      min = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "--max"))
      max = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "--step"))
      step = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--reps"))
      b.reps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--ops"))
      ops = argv[i + 1];
    else if (!strcmp(argv[i], "--control"))
      b.control = atoi(argv[i + 1]) != 0;
  }
  if (b.reps < 1 || b.reps > 64 || step < 2 || min < 4 || max < min)
    return fail("arguments (--reps 1..64, --step >= 2, 4 <= --min <= --max)", WF_EINVAL);
  MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &b.size);
  wf_rt_set_rank(b.rank);
  wf_status st = wf_comm_world_create(&b.c);
  if (st != WF_OK)
    return fail("wf_comm_world_create", st);
  MPI_Comm_dup(MPI_COMM_WORLD, &b.raw);
  MPI_Comm_dup(MPI_COMM_WORLD, &b.raw2);
  b.send = wf_mem_alloc(max);
  b.recv = wf_mem_alloc(max);
  if (!b.send || !b.recv)
    return fail("allocating buffers", WF_ENOMEM);
  for (size_t i = 0; i < max / sizeof(float); i++)
    b.send[i] = (float)(i % 17);
  if (b.rank == 0) {
    printf("# %s: %d ranks, float32, sum, median of %d repeats\n",
           b.control ? "CONTROL run, raw MPI vs raw MPI on a second communicator"
                     : "weft collectives vs raw MPI",
           b.size, b.reps);
    printf("#%13s %11s %10s  %28s  %28s\n", "", "", "", "------------ weft ----------",
           "---------- raw MPI ---------");
    printf("%-14s %11s %10s  %10s %7s %7s  %10s %7s %7s  %7s %8s\n", "# op", "size(B)", "count",
           "time(us)", "algbw", "busbw", "time(us)", "algbw", "busbw", "ovh(%)", "pair(%)");
  }
  worst w = {-1e9, -1e9, 0, 0, 0, 0};
  for (int op = 0; op < OP_N; op++) {
    if (!strstr(ops, op_names[op]) || (op == OP_SENDRECV && b.size < 2))
      continue;
    double s = (double)min;
    for (; s <= (double)max; s *= step)
      run_size(&b, op, (size_t)s, &w);
    if (s / step < (double)max) /* always end at --max (64 MiB is not 8 B x 4^k) */
      run_size(&b, op, max, &w);
  }
  if (b.rank == 0 && w.ovh_bytes)
    printf("# largest at >= 64 KiB (the bar is +5%%): ovh %+.2f%% (%s, %zu B), pair %+.2f%% "
           "(%s, %zu B)\n",
           w.ovh, op_names[w.ovh_op], w.ovh_bytes, w.pair, op_names[w.pair_op], w.pair_bytes);
  wf_mem_free(b.send);
  wf_mem_free(b.recv);
  wf_comm_destroy(b.c);
  MPI_Comm_free(&b.raw);
  MPI_Comm_free(&b.raw2);
  MPI_Finalize();
  return 0;
}
