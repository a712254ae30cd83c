/*
 * devices.c - every rank of a job trains on the same kind of device.
 *
 * Rank 0 holds every rank's facts after the bootstrap; a rank's device is "cpu" or
 * "cuda:N (MODEL)". Ranks on different GPU models train correctly (the mathematics is
 * the same) but every step waits for the slowest, so the job goes on with a warning
 * that names the ranks. Ranks on the CPU beside ranks on a GPU are almost always a node
 * whose GPU or driver failed (that rank's log says why it fell back): the job is
 * refused, naming the ranks, unless runtime.device=cpu puts every rank on the CPU.
 */
#include <stdio.h>
#include <string.h>

#include "wf_coordinator.h"

/* The kind of a device description: "cpu", a GPU's model, or "cuda" without one. */
static void kind_of(const char *device, char *kind, size_t len)
{
  const char *open = strchr(device, '('), *close = open ? strrchr(open, ')') : NULL;
  if (!strcmp(device, "cpu"))
    snprintf(kind, len, "cpu");
  else if (open && close && close > open + 1)
    snprintf(kind, len, "%.*s", (int)(close - open - 1), open + 1);
  else
    snprintf(kind, len, "cuda");
}

/* "0-3,6": the ranks whose device is `kind`, as ranges. */
static void ranks_of(const wf_rank_facts *f, int n, const char *kind, char *buf, size_t len)
{
  size_t used = 0;
  buf[0] = '\0';
  for (int r = 0; r < n && used + 1 < len; r++) {
    char k[64];
    kind_of(f[r].device, k, sizeof k);
    if (strcmp(k, kind))
      continue;
    int end = r;
    for (char k2[64]; end + 1 < n; end++) {
      kind_of(f[end + 1].device, k2, sizeof k2);
      if (strcmp(k2, kind))
        break;
    }
    int w = end > r ? snprintf(buf + used, len - used, "%s%d-%d", used ? "," : "", r, end)
                    : snprintf(buf + used, len - used, "%s%d", used ? "," : "", r);
    used += w > 0 ? (size_t)w : 0;
    r = end;
  }
}

wf_devices_verdict wf_devices_compare(const wf_rank_facts *f, int n, char *msg, size_t len)
{
  char kinds[8][64];
  int nk = 0;
  bool cpu = false;
  msg[0] = '\0';
  for (int r = 0; r < n; r++) {
    char k[64];
    int i = 0;
    kind_of(f[r].device, k, sizeof k);
    while (i < nk && strcmp(kinds[i], k))
      i++;
    if (i == nk && nk < 8)
      snprintf(kinds[nk++], sizeof kinds[0], "%s", k);
    cpu |= !strcmp(k, "cpu");
  }
  if (nk <= 1)
    return WF_DEVICES_SAME;
  size_t used = 0;
  for (int i = 0; i < nk && used + 1 < len; i++) {
    char ranks[256];
    ranks_of(f, n, kinds[i], ranks, sizeof ranks);
    int w = snprintf(msg + used, len - used, "%s%s %s on %s", i ? ", " : "",
                     strchr(ranks, ',') || strchr(ranks, '-') ? "ranks" : "rank", ranks,
                     !strcmp(kinds[i], "cpu") ? "the CPU" : kinds[i]);
    used += w > 0 ? (size_t)w : 0;
  }
  return cpu ? WF_DEVICES_MIXED : WF_DEVICES_MODELS;
}

wf_status wf_job_check_devices(const wf_job *job)
{
  char msg[1024];
  if (wf_job_rank(job) != 0)
    return WF_OK;
  switch (wf_devices_compare(wf_job_facts(job), wf_job_world(job), msg, sizeof msg)) {
  case WF_DEVICES_SAME: return WF_OK;
  case WF_DEVICES_MODELS:
    WF_WARN("the ranks' GPUs differ: %s; every step waits for the slowest, so the faster GPUs "
            "idle part of each step (use nodes with one GPU model)",
            msg);
    return WF_OK;
  case WF_DEVICES_MIXED: break;
  }
  WF_ERROR("the ranks' devices are not homogeneous: %s; a rank on the CPU beside GPUs is "
           "usually a node whose GPU or driver failed (its log above says why it fell back). "
           "Fix that node, or set runtime.device=cpu to train every rank on the CPU",
           msg);
  return WF_ECONFIG;
}
