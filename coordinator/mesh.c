/*
 * mesh.c - coordinates and groups of the dp x cp x tp x pp mesh (pure arithmetic).
 *
 * rank = tp + TP * (cp + CP * (dp + DP * pp)). Group members are listed in the order of
 * the varying coordinates (for dp x cp and edp: cp fastest), which is also their rank
 * order inside the group's communicator (wf_job_bootstrap splits with key = world rank).
 * A mesh's cp of 0 reads as 1, so meshes built without the axis keep their meaning. The
 * expert groups subdivide dp: ep group g holds dp ranks [g ep, (g + 1) ep) of one cp
 * rank, edp group e the dp ranks with dp % ep == e of every cp rank.
 */
#include "wf_coordinator.h"

static int cp_of(const wf_mesh *m) { return m->cp > 0 ? m->cp : 1; }

int wf_mesh_size(const wf_mesh *m) { return m->dp * m->tp * m->pp * cp_of(m); }

wf_coords wf_mesh_coords(const wf_mesh *m, int rank)
{
  wf_coords c;
  int cp = cp_of(m);
  c.tp = rank % m->tp;
  c.cp = (rank / m->tp) % cp;
  c.dp = (rank / (m->tp * cp)) % m->dp;
  c.pp = rank / (m->tp * cp * m->dp);
  return c;
}

int wf_mesh_rank(const wf_mesh *m, wf_coords c)
{
  return c.tp + m->tp * (c.cp + cp_of(m) * (c.dp + m->dp * c.pp));
}

const char *wf_axis_name(wf_axis a)
{
  static const char *names[] = {"tp", "dp", "pp", "emb", "cp", "dpcp", "ep", "edp"};
  return a < WF_NUM_AXES ? names[a] : "?";
}

/* The embedding group: the first and the last stage of rank c's (dp, cp, tp). */
static int emb_group(const wf_mesh *m, wf_coords c, int *members, int max)
{
  int n = 0;
  if ((c.pp != 0 && c.pp != m->pp - 1) || max < 1)
    return 0;
  c.pp = 0;
  members[n++] = wf_mesh_rank(m, c);
  c.pp = m->pp - 1;
  if (m->pp > 1 && n < max)
    members[n++] = wf_mesh_rank(m, c);
  return n;
}

static int ep_of(const wf_mesh *m) { return m->ep > 1 ? m->ep : 1; }

/* The ranks of c's ep group (same dp / ep and cp) or edp group (same dp % ep, any cp). */
static int expert_group(const wf_mesh *m, wf_axis axis, wf_coords c, int *members, int max)
{
  int ep = ep_of(m), n = 0, base = c.dp / ep * ep;
  if (ep == 1)
    return 0;
  if (axis == WF_AXIS_EP)
    for (c.dp = base; c.dp < base + ep && n < max; c.dp++)
      members[n++] = wf_mesh_rank(m, c);
  else
    for (c.dp = c.dp % ep; c.dp < m->dp; c.dp += ep)
      for (c.cp = 0; c.cp < cp_of(m) && n < max; c.cp++)
        members[n++] = wf_mesh_rank(m, c);
  return n;
}

int wf_mesh_group(const wf_mesh *m, wf_axis axis, int rank, int *members, int max)
{
  wf_coords c = wf_mesh_coords(m, rank);
  int n = 0, cp = cp_of(m);
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
  case WF_AXIS_CP:
    for (c.cp = 0; c.cp < cp && n < max; c.cp++)
      members[n++] = wf_mesh_rank(m, c);
    break;
  case WF_AXIS_DPCP:
    for (c.dp = 0; c.dp < m->dp; c.dp++)
      for (c.cp = 0; c.cp < cp && n < max; c.cp++)
        members[n++] = wf_mesh_rank(m, c);
    break;
  case WF_AXIS_EMB: return emb_group(m, c, members, max);
  case WF_AXIS_EP:
  case WF_AXIS_EDP: return expert_group(m, axis, c, members, max);
  default: return 0;
  }
  return n;
}

int wf_mesh_group_color(const wf_mesh *m, wf_axis axis, int rank)
{
  int first;
  return wf_mesh_group(m, axis, rank, &first, 1) > 0 ? first : -1;
}
