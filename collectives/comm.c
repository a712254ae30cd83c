/*
 * comm.c - communicator life cycle, accessors and the cross-rank agreement check.
 *
 * Every wf_comm owns a private MPI communicator (a dup of the world, or the result
 * of a split), so weft's point-to-point tags never meet the caller's traffic. Its
 * error handler is MPI_ERRORS_RETURN: an MPI failure becomes a wf_status, never an
 * abort inside the library.
 *
 * A communicator made from another (wf_comm_split, wf_comm_create_group) joins its
 * parent's family and takes its parent's device path (comm_int.h), so a job sets the
 * path once, on its world communicator's children, and every communicator made later
 * (HSDP's fsdp and replica groups, a profile's groups) carries device buffers the same
 * way.
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

/* ---- families ---------------------------------------------------------------------- */

static wf__family *family_new(void)
{
  wf__family *f = calloc(1, sizeof *f);
  if (f)
    pthread_mutex_init(&f->lock, NULL);
  return f;
}

/* Add c to f (c->family set on success). */
static wf_status family_join(wf__family *f, wf_comm *c)
{
  wf_status st = WF_OK;
  pthread_mutex_lock(&f->lock);
  if (f->n == f->cap) {
    int cap = f->cap ? 2 * f->cap : 8;
    wf_comm **m = realloc(f->members, (size_t)cap * sizeof *m);
    if (!m) {
      st = WF_ENOMEM;
      goto exit;
    }
    f->members = m, f->cap = cap;
  }
  f->members[f->n++] = c;
  f->refs++;
  c->family = f;
exit:
  pthread_mutex_unlock(&f->lock);
  return st;
}

/* Remove c from its family; the last member frees it. */
static void family_leave(wf_comm *c)
{
  wf__family *f = c->family;
  if (!f)
    return;
  pthread_mutex_lock(&f->lock);
  for (int i = 0; i < f->n; i++)
    if (f->members[i] == c) {
      f->members[i] = f->members[--f->n];
      break;
    }
  bool last = --f->refs == 0;
  pthread_mutex_unlock(&f->lock);
  c->family = NULL;
  if (!last)
    return;
  pthread_mutex_destroy(&f->lock);
  free(f->members);
  free(f);
}

/* ---- life cycle ---------------------------------------------------------------------- */

/* Takes ownership of `mpi` (freed on failure). Joins `family`, or a new one when NULL. */
static wf_status comm_wrap(MPI_Comm mpi, const char *name, bool check, wf__family *family,
                           wf_comm **out)
{
  wf_status st = WF_OK;
  wf__family *own = family ? NULL : family_new();
  wf_comm *c = aligned_alloc(_Alignof(wf_comm), sizeof *c); /* sizeof is a multiple */
  WF_CHECK_ALLOC(c);
  memset(c, 0, sizeof *c);
  WF_CHECK_ALLOC(family ? family : own);
  WF_TRY(family_join(family ? family : own, c));
  own = NULL;
  c->mpi = mpi;
  c->check = check;
  c->precise_clock = env_precise_clock();
  wf_strlcpy(c->name, name ? name : "comm", sizeof c->name);
  atomic_init(&c->next_seq, 0);
  atomic_init(&c->aborted, false);
  atomic_init(&c->host_syncs, 0);
  WF_CHECK_MPI(MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN));
  WF_CHECK_MPI(MPI_Comm_rank(mpi, &c->rank));
  WF_CHECK_MPI(MPI_Comm_size(mpi, &c->size));
  *out = c;
  return WF_OK;
fail:
  if (c)
    family_leave(c);
  if (own) {
    pthread_mutex_destroy(&own->lock);
    free(own);
  }
  free(c);
  MPI_Comm_free(&mpi);
  return st;
}

/* The child of `parent` just made: its family, and its parent's device path
 * (collective over the child when that path is NCCL). On failure the child is freed. */
static wf_status adopt(const wf_comm *parent, MPI_Comm child, const char *name, wf_comm **out)
{
  wf_status st = comm_wrap(child, name, parent->check, parent->family, out);
  if (st != WF_OK || !parent->dev)
    return st;
  st = parent->dev->inherit(parent, *out);
  if (st != WF_OK) {
    wf_comm_destroy(*out);
    *out = NULL;
  }
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
  return comm_wrap(dup, "world", env_check_default(), NULL, out);
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
  return adopt(parent, child, name, out);
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
  st = adopt(parent, child, name, out);
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
  family_leave(c); /* first: wf_comm_abort_all must not reach a transport being freed */
  if (c->dev)
    c->dev->fini(c);
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

/* ---- the device path ---------------------------------------------------------------- */

wf_status wf_comm_set_device_path(wf_comm *c, wf_gpu *gpu, bool nccl, char *why, size_t why_len)
{
  char local[512] = "";
  if (why && why_len)
    why[0] = '\0';
  if (!c)
    return WF_EINVAL;
  if (!gpu)
    return WF_OK; /* a CPU rank: host buffers only */
  if (nccl && (c->nc || wf__coll_nccl_start(c, gpu, local, sizeof local) == WF_OK))
    return WF_OK;
  if (nccl && c->rank == 0) /* agreed inside wf__coll_nccl_start: every rank falls back */
    WF_WARN("comm '%s': NCCL could not start (%s); device buffers go through MPI with host "
            "staging",
            c->name, local);
  if (why && why_len)
    snprintf(why, why_len, "%s", local);
  return wf_comm_enable_staging(c, gpu);
}

const char *wf_comm_device_path(const wf_comm *c) { return c && c->dev ? c->dev->name : "none"; }

uint64_t wf_comm_host_syncs(const wf_comm *c)
{
  return c ? atomic_load_explicit(&((wf_comm *)c)->host_syncs, memory_order_relaxed) : 0;
}

/* ---- abort ------------------------------------------------------------------------------ */

wf_status wf_comm_abort(wf_comm *c)
{
  if (!c)
    return WF_EINVAL;
  atomic_store(&c->aborted, true);
  return c->dev ? c->dev->abort(c) : WF_EUNSUPPORTED;
}

int wf_comm_abort_all(wf_comm *c, char *names, size_t len)
{
  size_t used = 0;
  int n = 0;
  if (names && len)
    names[0] = '\0';
  if (!c || !c->family)
    return 0;
  wf__family *f = c->family;
  pthread_mutex_lock(&f->lock);
  for (int i = 0; i < f->n; i++) {
    wf_comm *m = f->members[i];
    wf_status st = wf_comm_abort(m);
    if (st != WF_OK && st != WF_EUNSUPPORTED)
      WF_WARN("comm '%s': abort failed (%s)", m->name, wf_status_str(st));
    n++;
    if (names && used + 1 < len)
      used += (size_t)snprintf(names + used, len - used, "%s%s(%s)", i ? " " : "", m->name,
                               wf_comm_device_path(m));
  }
  pthread_mutex_unlock(&f->lock);
  return n;
}
