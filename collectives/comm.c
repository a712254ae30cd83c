/*
 * comm.c - communicator life cycle, accessors and the cross-rank agreement check.
 *
 * Every wf_comm owns a private MPI communicator (a dup of the world, or the result
 * of a split), so weft's point-to-point tags never meet the caller's traffic. Its
 * error handler is MPI_ERRORS_RETURN: an MPI failure becomes a wf_status, never an
 * abort inside the library.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_int.h"
#include "wf_check.h"

/* $WEFT_COMM_CHECK, read once: the default for the agreement check. */
static bool env_check_default(void)
{
  static atomic_int cached = -1;
  int v = atomic_load(&cached);
  if (v < 0) {
    const char *e = getenv("WEFT_COMM_CHECK");
    v = e && *e && strcmp(e, "0") != 0;
    atomic_store(&cached, v);
  }
  return v != 0;
}

/* $WEFT_COMM_TRACE_CLOCK=precise, read once: full-resolution recorder times. */
static bool env_precise_clock(void)
{
  static atomic_int cached = -1;
  int v = atomic_load(&cached);
  if (v < 0) {
    const char *e = getenv("WEFT_COMM_TRACE_CLOCK");
    v = e && strcmp(e, "precise") == 0;
    atomic_store(&cached, v);
  }
  return v != 0;
}

/* Takes ownership of `mpi` (freed on failure). */
static wf_status comm_wrap(MPI_Comm mpi, const char *name, bool check, wf_comm **out)
{
  wf_status st = WF_OK;
  wf_comm *c = aligned_alloc(_Alignof(wf_comm), sizeof *c); /* sizeof is a multiple */
  WF_CHECK_ALLOC(c);
  memset(c, 0, sizeof *c);
  c->mpi = mpi;
  c->check = check;
  c->precise_clock = env_precise_clock();
  wf_strlcpy(c->name, name ? name : "comm", sizeof c->name);
  atomic_init(&c->next_seq, 0);
  WF_CHECK_MPI(MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN));
  WF_CHECK_MPI(MPI_Comm_rank(mpi, &c->rank));
  WF_CHECK_MPI(MPI_Comm_size(mpi, &c->size));
  *out = c;
  return WF_OK;
fail:
  free(c);
  MPI_Comm_free(&mpi);
  return st;
}

wf_status wf_comm_world_create(wf_comm **out)
{
  wf_status st = WF_OK;
  MPI_Comm dup = MPI_COMM_NULL;
  int inited = 0;
  WF_CHECK(out != NULL, WF_EINVAL, "wf_comm_world_create: out is NULL");
  *out = NULL;
  WF_CHECK_MPI(MPI_Initialized(&inited));
  WF_CHECK(inited, WF_EINVAL, "wf_comm_world_create: call MPI_Init_thread first");
  WF_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  return comm_wrap(dup, "world", env_check_default(), out);
fail:
  return st;
}

wf_status wf_comm_split(wf_comm *parent, int color, int key, const char *name, wf_comm **out)
{
  wf_status st = WF_OK;
  MPI_Comm child = MPI_COMM_NULL;
  WF_CHECK(parent && out, WF_EINVAL, "wf_comm_split: parent and out must not be NULL");
  *out = NULL;
  WF_CHECK_MPI(MPI_Comm_split(parent->mpi, color < 0 ? MPI_UNDEFINED : color, key, &child));
  if (child == MPI_COMM_NULL)
    return WF_OK;
  return comm_wrap(child, name, parent->check, out);
fail:
  return st;
}

static int index_of(const int *ranks, int n, int r)
{
  for (int i = 0; i < n; i++)
    if (ranks[i] == r)
      return i;
  return -1;
}

wf_status wf_comm_create_group(wf_comm *parent, const int *ranks, int n, const char *name,
                               wf_comm **out)
{
  wf_status st = WF_OK;
  MPI_Group pg = MPI_GROUP_NULL, g = MPI_GROUP_NULL;
  MPI_Comm child = MPI_COMM_NULL;
  WF_CHECK(parent && out && ranks && n > 0, WF_EINVAL, "wf_comm_create_group: bad arguments");
  *out = NULL;
  for (int i = 0; i < n; i++)
    WF_CHECK(ranks[i] >= 0 && ranks[i] < parent->size && index_of(ranks, i, ranks[i]) < 0,
             WF_EINVAL,
             "wf_comm_create_group '%s': rank list entry %d (%d) is out of range or "
             "repeated (parent '%s' has %d ranks)",
             name ? name : "?", i, ranks[i], parent->name, parent->size);
  if (index_of(ranks, n, parent->rank) < 0)
    return WF_OK;
  WF_CHECK_MPI(MPI_Comm_group(parent->mpi, &pg));
  WF_CHECK_MPI(MPI_Group_incl(pg, n, ranks, &g));
  WF_CHECK_MPI(MPI_Comm_create_group(parent->mpi, g, 0x77ef, &child));
  st = comm_wrap(child, name, parent->check, out);
exit:
  if (g != MPI_GROUP_NULL)
    MPI_Group_free(&g);
  if (pg != MPI_GROUP_NULL)
    MPI_Group_free(&pg);
  return st;
fail:
  goto exit;
}

void wf_comm_destroy(wf_comm *c)
{
  if (!c)
    return;
  int finalized = 0;
  wf__coll_nccl_fini(c);
  free(c->group);
  free(c->spare);
  MPI_Finalized(&finalized);
  if (!finalized) /* after MPI_Finalize the communicator is gone already */
    MPI_Comm_free(&c->mpi);
  free(c);
}

int wf_comm_rank(const wf_comm *c) { return c ? c->rank : -1; }
int wf_comm_size(const wf_comm *c) { return c ? c->size : 0; }
const char *wf_comm_name(const wf_comm *c) { return c ? c->name : "(null)"; }
void wf_comm_set_check(wf_comm *c, bool on)
{
  if (c)
    c->check = on;
}

int wf_comm_world_rank(const wf_comm *c, int r)
{
  MPI_Group g, wg;
  int out = -1;
  if (!c || r < 0 || r >= c->size)
    return -1;
  if (MPI_Comm_group(c->mpi, &g) != MPI_SUCCESS)
    return -1;
  if (MPI_Comm_group(MPI_COMM_WORLD, &wg) == MPI_SUCCESS) {
    if (MPI_Group_translate_ranks(g, 1, &r, wg, &out) != MPI_SUCCESS || out == MPI_UNDEFINED)
      out = -1;
    MPI_Group_free(&wg);
  }
  MPI_Group_free(&g);
  return out;
}
