/*
 * test_gpu_sharing.c - when may the collectives use NCCL: the pure decision of
 * worker/device.c (wf__gpu_sharing_of) over every rank's host and GPU PCI bus id.
 *
 * The cases are the launch layouts the README documents and the ones that must not
 * pass for them. Before the decision compared bus ids it compared a node's ranks with
 * the devices one rank sees, which called the first case "shared" (4 local ranks, 1
 * visible device each) and host-staged every collective of a Slurm job run with
 * --gpus-per-task=1. No MPI, no GPU.
 */
#include <stdio.h>
#include <string.h>

#include "device.h"

static int failures;

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);                     \
      failures++;                                                                                  \
    }                                                                                              \
  } while (0)

/* Rank i on host host_of[i] with the GPU at bus bus_of[i] ("" = none). */
static wf__gpu_sharing decide(int n, const char *const *host_of, const char *const *bus_of, int *a,
                              int *b)
{
  wf__gpu_seat s[16];
  memset(s, 0, sizeof s);
  for (int i = 0; i < n; i++) {
    snprintf(s[i].host, sizeof s[i].host, "%s", host_of[i]);
    snprintf(s[i].bus, sizeof s[i].bus, "%s", bus_of[i]);
  }
  return wf__gpu_sharing_of(s, n, a, b);
}

int main(void)
{
  int a, b;
  const char *one[8] = {"n0", "n0", "n0", "n0", "n0", "n0", "n0", "n0"};
  /* Slurm --gpus-per-task=1: CUDA_VISIBLE_DEVICES per rank, each rank sees one device
   * (its number 0), four different GPUs. */
  const char *per_task[4] = {"0000:19:00.0", "0000:3b:00.0", "0000:4c:00.0", "0000:5d:00.0"};
  CHECK(decide(4, one, per_task, &a, &b) == WF__GPUS_OWN && a == -1 && b == -1);
  /* Every rank on the one GPU of a workstation. */
  const char *all_one[4] = {"0000:01:00.0", "0000:01:00.0", "0000:01:00.0", "0000:01:00.0"};
  CHECK(decide(4, one, all_one, &a, &b) == WF__GPUS_SHARED && a == 0 && b == 1);
  /* 8 ranks on the 8 GPUs of one node (local rank % 8). */
  const char *eight[8] = {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
                          "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"};
  CHECK(decide(8, one, eight, &a, &b) == WF__GPUS_OWN);
  /* 4 ranks on 2 GPUs (local rank % 2): ranks 0 and 2 share the first. */
  const char *two[4] = {"0000:18:00.0", "0000:2a:00.0", "0000:18:00.0", "0000:2a:00.0"};
  CHECK(decide(4, one, two, &a, &b) == WF__GPUS_SHARED && a == 0 && b == 2);
  /* Two nodes with the same bus ids: one GPU per rank, NCCL. */
  const char *hosts[4] = {"n0", "n0", "n1", "n1"};
  const char *same_bus[4] = {"0000:18:00.0", "0000:2a:00.0", "0000:18:00.0", "0000:2a:00.0"};
  CHECK(decide(4, hosts, same_bus, &a, &b) == WF__GPUS_OWN);
  /* A rank on the CPU: no NCCL for anyone. */
  const char *missing[4] = {"0000:18:00.0", "0000:2a:00.0", "", "0000:3a:00.0"};
  CHECK(decide(4, one, missing, &a, &b) == WF__GPUS_MISSING && a == 2);
  /* One rank alone with its GPU. */
  CHECK(decide(1, one, per_task, &a, &b) == WF__GPUS_OWN);
  if (failures)
    return 1;
  printf("gpu sharing: 7 layouts decided as expected\n");
  return 0;
}
