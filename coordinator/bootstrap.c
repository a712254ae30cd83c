/*
 * bootstrap.c - building the job: facts, job id, mesh communicators.
 *
 * Collective over MPI_COMM_WORLD. Each mesh axis gets a communicator from
 * MPI_Comm_split with colour = the group's first world rank and key = world rank,
 * so group rank order equals the order wf_mesh_group() lists. The world communicator
 * gets the job's device path first (wf_job_opts), and the axes inherit it. After the split the
 * communicators are checked against the pure mesh arithmetic (size and members),
 * so a mistake in either shows up at start-up rather than as a wrong gradient.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wf_check.h"
#include "wf_collectives.h"
#include "wf_coordinator.h"

struct wf_job {
  int rank, world;
  wf_mesh mesh;
  wf_comm *world_comm;
  wf_comm *comms[WF_NUM_AXES]; /* NULL where the rank is in no group of that axis */
  wf_rank_facts *facts;        /* rank 0 only */
  wf_rank_facts mine;
  char id[96];
};

int wf_job_rank(const wf_job *job) { return job->rank; }
int wf_job_world(const wf_job *job) { return job->world; }
const wf_mesh *wf_job_mesh(const wf_job *job) { return &job->mesh; }
const wf_rank_facts *wf_job_facts(const wf_job *job) { return job->facts; }
const wf_rank_facts *wf_job_my_facts(const wf_job *job) { return &job->mine; }
const char *wf_job_id(const wf_job *job) { return job->id; }
wf_comm *wf_job_comm(const wf_job *job, wf_axis axis) { return job->comms[axis]; }
wf_comm *wf_job_world_comm(const wf_job *job) { return job->world_comm; }

static void fill_facts(wf_rank_facts *f, const wf_job *job, const wf_job_opts *o)
{
  memset(f, 0, sizeof *f);
  f->rank = job->rank;
  f->local_rank = o->launch->local_rank;
  f->local_size = o->launch->local_size;
  f->pid = (int)getpid();
  wf_strlcpy(f->host, wf_rt_host(), sizeof f->host);
  wf_strlcpy(f->device, o->device ? o->device : "cpu", sizeof f->device);
  wf_strlcpy(f->binding, o->binding ? o->binding->desc : "none", sizeof f->binding);
  f->threads = o->binding ? o->binding->threads : 1;
  f->coords = wf_mesh_coords(&job->mesh, job->rank);
}

/* Check one axis communicator against the mesh arithmetic. */
static wf_status verify_axis(wf_job *job, wf_axis axis)
{
  wf_status st = WF_OK;
  int members[WF_MAX_STAGES * 64];
  int n = wf_mesh_group(&job->mesh, axis, job->rank, members, (int)WF_ARRAY_LEN(members));
  wf_comm *c = job->comms[axis];
  WF_CHECK((n == 0) == (c == NULL), WF_EMPI, "%s group: membership disagrees", wf_axis_name(axis));
  if (n == 0)
    return WF_OK;
  WF_CHECK(wf_comm_size(c) == n, WF_EMPI, "%s group: MPI size %d, mesh says %d", wf_axis_name(axis),
           wf_comm_size(c), n);
  for (int i = 0; i < n; i++)
    WF_CHECK(wf_comm_world_rank(c, i) == members[i], WF_EMPI,
             "%s group: member %d is world rank %d, mesh says %d", wf_axis_name(axis), i,
             wf_comm_world_rank(c, i), members[i]);
fail:
  return st;
}

static wf_status make_id(wf_job *job, const wf_launch *l, const char *name)
{
  wf_status st = WF_OK;
  if (job->rank == 0) {
    if (name && name[0]) /* runtime.job_name: validated, the same on every rank */
      wf_strlcpy(job->id, name, sizeof job->id);
    else if (l->slurm_job_id[0])
      snprintf(job->id, sizeof job->id, "slurm-%s", l->slurm_job_id);
    else
      snprintf(job->id, sizeof job->id, "%.40s-%d-%ld", wf_rt_host(), (int)getpid(),
               (long)wf_wall_time());
  }
  WF_CHECK_MPI(MPI_Bcast(job->id, sizeof job->id, MPI_CHAR, 0, MPI_COMM_WORLD));
fail:
  return st;
}

/* Append ranks [first, last] to buf as "a" or "a-b", with a separator. */
static void add_span(char *buf, size_t len, int first, int last, bool sep)
{
  size_t at = strlen(buf);
  if (first == last)
    snprintf(buf + at, len - at, "%s%d", sep ? "," : "", first);
  else
    snprintf(buf + at, len - at, "%s%d-%d", sep ? "," : "", first, last);
}

/* Index of the host of rank r among the job's hosts in order of first appearance. */
static int host_index(const wf_job *job, int r)
{
  int idx = 0;
  for (int i = 0; i < r; i++) {
    bool seen = false;
    for (int j = 0; j < i && !seen; j++)
      seen = strcmp(job->facts[j].host, job->facts[i].host) == 0;
    if (!seen && strcmp(job->facts[i].host, job->facts[r].host) == 0)
      return idx;
    idx += !seen;
  }
  return idx;
}

/* Rank 0, once: which host runs which ranks ("2 hosts: node0 ranks 0-1, node1 ranks
 * 2-3"), and a warning for each tensor-parallel group that spans hosts (its all-reduces,
 * two per layer and direction, then cross the network instead of NVLink). */
static void log_hosts(const wf_job *job)
{
  char line[1024] = "";
  int hosts = 0;
  for (int r = 0; r < job->world; r++) {
    if (host_index(job, r) < hosts)
      continue; /* this host was listed with its first rank */
    size_t at = strlen(line);
    snprintf(line + at, sizeof line - at, "%s%s ranks ", hosts ? ", " : "", job->facts[r].host);
    int run = -1, prev = -2, spans = 0;
    for (int q = r; q < job->world; q++) {
      if (strcmp(job->facts[q].host, job->facts[r].host) != 0)
        continue;
      if (q != prev + 1) {
        if (run >= 0)
          add_span(line, sizeof line, run, prev, spans++ > 0);
        run = q;
      }
      prev = q;
    }
    add_span(line, sizeof line, run, prev, spans > 0);
    hosts++;
  }
  WF_INFO("job %s: %d ranks on %d host%s: %s", job->id, job->world, hosts, hosts == 1 ? "" : "s",
          line);
  for (int r = 0; job->mesh.tp > 1 && r < job->world; r += job->mesh.tp) {
    int other = -1;
    for (int q = r + 1; q < r + job->mesh.tp && other < 0; q++)
      if (strcmp(job->facts[q].host, job->facts[r].host) != 0)
        other = q;
    if (other >= 0)
      WF_WARN("tensor-parallel group of ranks %d-%d spans hosts %s and %s: its all-reduces "
              "cross the network; place mesh.tp=%d consecutive ranks on each host (mpirun "
              "--map-by ppr:N:node with N a multiple of %d)",
              r, r + job->mesh.tp - 1, job->facts[r].host, job->facts[other].host, job->mesh.tp,
              job->mesh.tp);
  }
}

wf_status wf_job_bootstrap(wf_job **out, const wf_job_opts *o)
{
  wf_status st = WF_OK;
  wf_job *job = calloc(1, sizeof *job);
  WF_CHECK_ALLOC(job);
  WF_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &job->rank));
  WF_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &job->world));
  job->mesh = (wf_mesh){o->cfg->mesh.dp, o->cfg->mesh.tp, o->cfg->mesh.pp, o->cfg->mesh.cp,
                        o->cfg->mesh.ep};
  WF_CHECK(wf_mesh_size(&job->mesh) == job->world, WF_ECONFIG,
           "mesh %dx%dx%dx%d (dp x tp x pp x cp) does not cover %d ranks", job->mesh.dp,
           job->mesh.tp, job->mesh.pp, job->mesh.cp, job->world);
  WF_TRY(make_id(job, o->launch, o->cfg->runtime.job_name));

  fill_facts(&job->mine, job, o);
  if (job->rank == 0)
    WF_CHECK_ALLOC(job->facts = calloc((size_t)job->world, sizeof *job->facts));
  WF_CHECK_MPI(MPI_Gather(&job->mine, sizeof job->mine, MPI_BYTE, job->facts, sizeof job->mine,
                          MPI_BYTE, 0, MPI_COMM_WORLD));
  WF_TRY(wf_comm_world_create(&job->world_comm));
  WF_TRY(wf_comm_set_device_path(job->world_comm, o->gpu, o->nccl, NULL, 0));
  for (int a = 0; a < WF_NUM_AXES; a++) { /* each inherits the world's device path */
    int color = wf_mesh_group_color(&job->mesh, (wf_axis)a, job->rank);
    WF_TRY(
        wf_comm_split(job->world_comm, color, job->rank, wf_axis_name((wf_axis)a), &job->comms[a]));
    WF_TRY(verify_axis(job, (wf_axis)a));
  }
  if (job->rank == 0)
    log_hosts(job);
  *out = job;
  return WF_OK;
fail:
  wf_job_destroy(job);
  *out = NULL;
  return st;
}

void wf_job_destroy(wf_job *job)
{
  if (!job)
    return;
  for (int a = 0; a < WF_NUM_AXES; a++)
    wf_comm_destroy(job->comms[a]);
  wf_comm_destroy(job->world_comm);
  free(job->facts);
  free(job);
}

static void group_str(const wf_mesh *m, wf_axis axis, int rank, char *out, size_t len)
{
  int members[256];
  int n = wf_mesh_group(m, axis, rank, members, (int)WF_ARRAY_LEN(members));
  size_t used = 0;
  out[0] = '\0';
  if (n == 0)
    snprintf(out, len, "-");
  for (int i = 0; i < n && used + 1 < len; i++)
    used += (size_t)snprintf(out + used, len - used, "%s%d", i ? "," : "", members[i]);
}

/* The context-parallel columns (cp > 1 only: a mesh without cp prints as it always did). */
/* The optional columns after the emb group (the cp group, the ep and edp groups), each
 * padded to the width of the one before it, and the line's end. */
static void print_extra(FILE *out, const char *emb, const char *cp, const char *ep, const char *edp)
{
  const char *col[] = {emb, cp, ep, edp};
  int last = 0;
  for (int i = 1; i < 4; i++)
    if (col[i])
      last = i;
  for (int i = 1, prev = 0; i <= last; i++) {
    if (!col[i])
      continue;
    fprintf(out, "%*s %s", (int)(11 - strlen(col[prev])), "", col[i]);
    prev = i;
  }
  fputc('\n', out);
}

static void print_header(const wf_job *job, FILE *out, bool cp, bool ep)
{
  const wf_mesh *m = &job->mesh;
  if (cp)
    fprintf(out,
            "weft job %s: %d ranks, mesh dp=%d x cp=%d x tp=%d x pp=%d (rank = tp + %d*(cp + "
            "%d*(dp + %d*pp)))",
            job->id, job->world, m->dp, m->cp, m->tp, m->pp, m->tp, m->cp, m->dp);
  else
    fprintf(out, "weft job %s: %d ranks, mesh dp=%d x tp=%d x pp=%d (rank = tp + %d*(dp + %d*pp))",
            job->id, job->world, m->dp, m->tp, m->pp, m->tp, m->dp);
  if (ep)
    fprintf(out, ", ep=%d inside dp", m->ep);
  fprintf(out, "\n%4s  %-16s %8s %5s  %-10s %-18s %3s  %-10s %-11s %-11s %-11s %s", "rank", "host",
          "pid", "local", "device", "binding", "thr", cp ? "(pp,dp,cp,tp)" : "(pp,dp,tp)",
          "tp group", "dp group", "pp group", "emb group");
  print_extra(out, "emb group", cp ? "cp group" : NULL, ep ? "ep group" : NULL,
              ep ? "edp group" : NULL);
}

void wf_job_print_table(const wf_job *job, FILE *out)
{
  if (!job->facts)
    return;
  const wf_mesh *m = &job->mesh;
  bool cp = m->cp > 1, ep = m->ep > 1;
  print_header(job, out, cp, ep);
  for (int r = 0; r < job->world; r++) {
    const wf_rank_facts *f = &job->facts[r];
    char coords[32], g[WF_NUM_AXES][64];
    if (cp)
      snprintf(coords, sizeof coords, "(%d,%d,%d,%d)", f->coords.pp, f->coords.dp, f->coords.cp,
               f->coords.tp);
    else
      snprintf(coords, sizeof coords, "(%d,%d,%d)", f->coords.pp, f->coords.dp, f->coords.tp);
    for (int a = 0; a < WF_NUM_AXES; a++)
      group_str(m, (wf_axis)a, r, g[a], sizeof g[a]);
    fprintf(out, "%4d  %-16.16s %8d %2d/%-2d  %-10.10s %-18.18s %3d  %-10s %-11s %-11s %-11s %s", r,
            f->host, f->pid, f->local_rank, f->local_size, f->device, f->binding, f->threads,
            coords, g[WF_AXIS_TP], g[WF_AXIS_DP], g[WF_AXIS_PP], g[WF_AXIS_EMB]);
    print_extra(out, g[WF_AXIS_EMB], cp ? g[WF_AXIS_CP] : NULL, ep ? g[WF_AXIS_EP] : NULL,
                ep ? g[WF_AXIS_EDP] : NULL);
  }
}
