/*
 * wf_bind.h - binding a rank to CPU cores with hwloc.
 *
 * On a GPU rank: the cores near the GPU (hwloc's locality of its PCI device). On a
 * CPU rank: a disjoint share of the node's cores, split among the local ranks in
 * order. With more local ranks than cores, ranks share cores round-robin (said
 * once by local rank 0) and use one compute thread each. The number of compute
 * threads a rank should use (OpenBLAS, OpenMP) follows from its binding.
 */
#ifndef WF_BIND_H
#define WF_BIND_H

#include <stdbool.h>
#include <stddef.h>

#include "wf_runtime.h"

typedef struct wf_binding {
  bool bound;     /* false when runtime.bind=false or binding failed */
  bool shared;    /* more local ranks than cores: cores are shared */
  int node_cores; /* physical cores on this node */
  int threads;    /* compute threads this rank should use */
  char desc[128]; /* e.g. "cores 0-1", "core 1 (shared)", "none" */
} wf_binding;

/* gpu_bus_id: PCI bus id of this rank's GPU ("0000:19:00.0"), or NULL on CPU. */
wf_status wf_bind_apply(wf_binding *out, bool enable, int local_rank, int local_size,
                        const char *gpu_bus_id);

#endif /* WF_BIND_H */
