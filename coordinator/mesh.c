/*
 * mesh.c - coordinates and groups of the dp x tp x pp mesh (pure arithmetic).
 *
 * rank = tp + TP * (dp + DP * pp). Group members are listed in the order of the
 * varying coordinate, which is also their rank order inside the group's
 * communicator (wf_job_bootstrap splits with key = world rank).
 */
#include "wf_coordinator.h"

int wf_mesh_size(const wf_mesh *m) { return m->dp * m->tp * m->pp; }

wf_coords wf_mesh_coords(const wf_mesh *m, int rank)
{
  wf_coords c;
  c.tp = rank % m->tp;
  c.dp = (rank / m->tp) % m->dp;
  c.pp = rank / (m->tp * m->dp);
  return c;
}

int wf_mesh_rank(const wf_mesh *m, wf_coords c) { return c.tp + m->tp * (c.dp + m->dp * c.pp); }

const char *wf_axis_name(wf_axis a)
{
  static const char *names[] = {"tp", "dp", "pp", "emb"};
  return a < WF_NUM_AXES ? names[a] : "?";
}

int wf_mesh_group(const wf_mesh *m, wf_axis axis, int rank, int *members, int max)
{
  wf_coords c = wf_mesh_coords(m, rank);
  int n = 0;
  switch (axis) {
  case WF_AXIS_TP:
    for (c.tp = 0; c.tp < m->tp && n < max; c.tp++)
      members[n++] = wf_mesh_rank(m, c);
    break;
  case WF_AXIS_DP:
    for (c.dp = 0; c.dp < m->dp && n < max; c.dp++)
      members[n++] = wf_mesh_rank(m, c);
    break;
  case WF_AXIS_PP:
    for (c.pp = 0; c.pp < m->pp && n < max; c.pp++)
      members[n++] = wf_mesh_rank(m, c);
    break;
  case WF_AXIS_EMB:
    if (c.pp != 0 && c.pp != m->pp - 1)
      return 0;
    c.pp = 0;
    members[n++] = wf_mesh_rank(m, c);
    c.pp = m->pp - 1;
    if (m->pp > 1 && n < max)
      members[n++] = wf_mesh_rank(m, c);
    break;
  default: return 0;
  }
  return n;
}

int wf_mesh_group_color(const wf_mesh *m, wf_axis axis, int rank)
{
  int first;
  return wf_mesh_group(m, axis, rank, &first, 1) > 0 ? first : -1;
}
