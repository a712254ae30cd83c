/*
 * bind.c - hwloc CPU binding (see wf_bind.h for the policy).
 *
 * Binding failures are not fatal: a rank that cannot bind runs unbound and says
 * why, because a mis-bound rank is slower but still correct.
 */
#include <errno.h>
#include <hwloc.h>
#include <stdio.h>
#include <string.h>

#include "wf_bind.h"

/* Describe `set` as "core(s) <list>" by the cores it covers. */
static void describe(hwloc_topology_t topo, hwloc_const_cpuset_t set, bool shared, char *out,
                     size_t len)
{
  hwloc_bitmap_t cores = hwloc_bitmap_alloc();
  int n = 0;
  hwloc_obj_t core = NULL;
  while ((core = hwloc_get_next_obj_inside_cpuset_by_type(topo, set, HWLOC_OBJ_CORE, core))) {
    hwloc_bitmap_set(cores, core->logical_index);
    n++;
  }
  char list[96];
  hwloc_bitmap_list_snprintf(list, sizeof list, cores);
  snprintf(out, len, "%s %s%s", n == 1 ? "core" : "cores", list, shared ? " (shared)" : "");
  hwloc_bitmap_free(cores);
}

/* The cpuset near a GPU, or NULL when hwloc does not know the device. */
static hwloc_obj_t gpu_ancestor(hwloc_topology_t topo, const char *bus_id)
{
  hwloc_obj_t pci = hwloc_get_pcidev_by_busidstring(topo, bus_id);
  return pci ? hwloc_get_non_io_ancestor_obj(topo, pci) : NULL;
}

static int cpu_share(hwloc_topology_t topo, hwloc_bitmap_t set, int ncores, int local_rank,
                     int local_size, bool *shared)
{
  *shared = local_size > ncores;
  int first, count;
  if (*shared) {
    first = local_rank % ncores;
    count = 1;
  } else {
    first = (int)((long)local_rank * ncores / local_size);
    count = (int)((long)(local_rank + 1) * ncores / local_size) - first;
  }
  for (int c = first; c < first + count; c++) {
    hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, (unsigned)c);
    if (core)
      hwloc_bitmap_or(set, set, core->cpuset);
  }
  return count;
}

wf_status wf_bind_apply(wf_binding *out, bool enable, int local_rank, int local_size,
                        const char *gpu_bus_id)
{
  hwloc_topology_t topo;
  memset(out, 0, sizeof *out);
  snprintf(out->desc, sizeof out->desc, "none");
  out->threads = 1;
  if (hwloc_topology_init(&topo) < 0)
    return WF_OK;
  if (gpu_bus_id)
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo) < 0) {
    hwloc_topology_destroy(topo);
    return WF_OK;
  }
  int ncores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  out->node_cores = ncores > 0 ? ncores : 1;
  if (local_size < 1)
    local_size = 1;
  /* Unbound ranks still split the node's cores between them for threads. */
  out->threads = WF_MAX(1, out->node_cores / local_size);
  if (!enable || ncores < 1) {
    hwloc_topology_destroy(topo);
    return WF_OK;
  }
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  hwloc_obj_t near = gpu_bus_id ? gpu_ancestor(topo, gpu_bus_id) : NULL;
  int count;
  if (near) {
    hwloc_bitmap_copy(set, near->cpuset);
    count = WF_MAX(1, hwloc_get_nbobjs_inside_cpuset_by_type(topo, set, HWLOC_OBJ_CORE));
    out->shared = false;
  } else {
    count = cpu_share(topo, set, ncores, local_rank, local_size, &out->shared);
  }
  if (hwloc_set_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) < 0) {
    WF_WARN("could not bind to %d core(s): %s; running unbound", count, strerror(errno));
  } else {
    out->bound = true;
    out->threads = near ? WF_MAX(1, count / local_size) : count;
    describe(topo, set, out->shared, out->desc, sizeof out->desc);
  }
  hwloc_bitmap_free(set);
  hwloc_topology_destroy(topo);
  return WF_OK;
}
