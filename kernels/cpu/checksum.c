/*
 * checksum.c - the 64-bit checksum of checksum.h: per-thread partial sums of the mixed
 * elements, added mod 2^64 (in any order: the result does not depend on the threads).
 */
#include <string.h>

#include "cpu_int.h"
#include "wf_kernels.h"

#define MAX_PARTIALS 256

struct checksum_task {
  const float *x;
  size_t n;
  uint64_t part[MAX_PARTIALS];
};

static void checksum_share(void *p, int tid, int nt)
{
  struct checksum_task *t = p;
  size_t lo, hi;
  uint64_t s = 0;
  wf__split(t->n, tid, nt, 16, &lo, &hi);
  for (size_t i = lo; i < hi; i++) {
    uint32_t bits;
    memcpy(&bits, &t->x[i], sizeof bits);
    s += wf_checksum_mix(wf_checksum_mix(i) ^ bits);
  }
  t->part[tid] = s;
}

void wf_checksum(uint64_t *out, const float *x, size_t n, int negate)
{
  struct checksum_task t = {.x = x, .n = n};
  int nt = wf__threads_for(n);
  nt = nt > MAX_PARTIALS ? MAX_PARTIALS : nt;
  wf__parallel(nt, checksum_share, &t);
  uint64_t s = 0;
  for (int i = 0; i < nt; i++)
    s += t.part[i];
  *out = negate ? 0 - s : s;
}

/* ---- the op (wf_kreg.h) ---------------------------------------------------------------- */

static void sum(uint64_t *out, const float *x, size_t n, int negate, wf_stream *s)
{
  wf_checksum(out, x, n, negate);
}

static const wf_checksum_op op = {sum};
const wf_kvariants wf__cpu_checksum = WF_KV_ANY(checksum, WF_OP_VERSION_checksum, &op);
