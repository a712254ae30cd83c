/*
 * mem.c - host allocations with accounting.
 *
 * Each block carries a 64-byte header holding its size, so wf_mem_free can
 * subtract it; the user pointer stays 64-byte aligned (cache line, AVX-512).
 * Counters are atomics: allocation may happen on any thread.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "wf_runtime.h"

#define HDR 64

static atomic_llong cur[2], peak[2], live[2];

void wf_mem_account(wf_mem_kind kind, int64_t delta)
{
  long long now = atomic_fetch_add(&cur[kind], delta) + delta;
  atomic_fetch_add(&live[kind], delta > 0 ? 1 : (delta < 0 ? -1 : 0));
  long long p = atomic_load(&peak[kind]);
  while (now > p && !atomic_compare_exchange_weak(&peak[kind], &p, now)) {
  }
}

void *wf_mem_alloc(size_t bytes)
{
  if (bytes > SIZE_MAX - HDR)
    return NULL;
  unsigned char *base = aligned_alloc(HDR, ((bytes + HDR + HDR - 1) / HDR) * HDR);
  if (!base)
    return NULL;
  memset(base, 0, bytes + HDR);
  memcpy(base, &bytes, sizeof bytes);
  wf_mem_account(WF_MEM_HOST, (int64_t)bytes);
  return base + HDR;
}

void wf_mem_free(void *p)
{
  if (!p)
    return;
  unsigned char *base = (unsigned char *)p - HDR;
  size_t bytes;
  memcpy(&bytes, base, sizeof bytes);
  wf_mem_account(WF_MEM_HOST, -(int64_t)bytes);
  free(base);
}

void wf_mem_get_stats(wf_mem_stats *out)
{
  for (int k = 0; k < 2; k++) {
    out->current[k] = atomic_load(&cur[k]);
    out->peak[k] = atomic_load(&peak[k]);
    out->allocs[k] = atomic_load(&live[k]);
  }
}

void wf_mem_reset_peak(void)
{
  for (int k = 0; k < 2; k++)
    atomic_store(&peak[k], atomic_load(&cur[k]));
}
