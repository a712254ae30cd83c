/*
 * twin_device.c - CUDA kernels against their CPU twins (twin.h): the device seam: the checksum and
 * the host syncs of its calls.
 */
#include "twin.h"

/* The 64-bit checksum (checksum.h): the CPU's value exactly, either sign, and one
 * changed element or two swapped ones change it. */
void test_checksum(ctx *c)
{
  const size_t n = ((size_t)1 << 20) + 3;
  float *x = hrand(c, n, -1, 1);
  float *d_x = df(c, x, n);
  uint64_t *d_h = dcopy(c, &(uint64_t){7}, sizeof(uint64_t)), want, got;
  for (int neg = 0; neg < 2; neg++) {
    wf_checksum(&want, x, n, neg);
    WF_K(c->k, checksum)->sum(d_h, d_x, n, neg, c->stream);
    bool ok = wf_gpu_stream_sync(c->g, c->stream) == WF_OK &&
              wf_gpu_memcpy_d2h(c->g, &got, d_h, sizeof got) == WF_OK && got == want;
    printf("  %-4s %-28s cpu %016llx gpu %016llx\n", ok ? "ok" : "FAIL",
           neg ? "checksum, negated" : "checksum", (unsigned long long)want,
           (unsigned long long)got);
    c->failures += !ok;
  }
  uint64_t h0, h1, h2;
  wf_checksum(&h0, x, n, 0);
  float t = x[5];
  x[5] = nextafterf(x[5], 2.0f); /* one bit */
  wf_checksum(&h1, x, n, 0);
  x[5] = x[6], x[6] = t; /* x[5] and x[6] swapped */
  wf_checksum(&h2, x, n, 0);
  bool ok = h0 != h1 && h0 != h2 && h1 != h2;
  printf("  %-4s %-28s one bit and a swap change it\n", ok ? "ok" : "FAIL", "checksum");
  c->failures += !ok;
}

/* The device seam counts the host's waits for the GPU per call (wf_device.h): a copy
 * to the device, a kernel and a write view wait for nothing; a read, a stream or event
 * synchronisation, a read view and a write-back wait once each. */
void test_host_syncs(ctx *c)
{
  char why[256] = "";
  wf_dev *dev = NULL;
  wf_event *ev = NULL;
  float h[64] = {1}, *d = NULL;
  wf_dev_view v;
  if (wf_dev_open_cuda(&dev, c->g, why, sizeof why) != WF_OK ||
      wf_dev_alloc_floats(dev, &d, 64) != WF_OK || wf_dev_event_create(dev, &ev) != WF_OK) {
    printf("  FAIL the CUDA device: %s\n", why);
    c->failures++;
    goto exit;
  }
  struct {
    const char *what;
    int want;
  } step[] = {{"copy to the device", 0}, {"kernel", 0},      {"wf_dev_read", 1},
              {"event sync", 1},         {"stream sync", 1}, {"read view", 1},
              {"unmap (read)", 0},       {"write view", 0},  {"unmap (write)", 1}};
  for (size_t i = 0; i < WF_ARRAY_LEN(step); i++) {
    uint64_t s0 = wf_dev_host_syncs(dev);
    wf_status st = WF_OK;
    switch (i) {
    case 0: st = wf_dev_copy(dev, d, h, sizeof h, WF_COPY_H2D, NULL); break;
    case 1: WF_K(wf_dev_kernels(dev, WF_DT_F32), norm)->scale(d, 2.0f, 64, NULL); break;
    case 2: st = wf_dev_read(dev, h, d, sizeof h); break;
    case 3:
      st = wf_dev_event_record(dev, ev, NULL);
      st = st == WF_OK ? wf_dev_event_sync(dev, ev) : st;
      break;
    case 4: st = wf_dev_stream_sync(dev, NULL); break;
    case 5: st = wf_dev_map(dev, &v, d, sizeof h, WF_MAP_READ); break;
    case 6: st = wf_dev_unmap(dev, &v); break;
    case 7: st = wf_dev_map(dev, &v, d, sizeof h, WF_MAP_WRITE); break;
    case 8: memset(v.host, 0, sizeof h), st = wf_dev_unmap(dev, &v); break;
    }
    int got = (int)(wf_dev_host_syncs(dev) - s0);
    bool ok = st == WF_OK && got == step[i].want;
    printf("  %-4s %-28s %d wait(s)\n", ok ? "ok" : "FAIL", step[i].what, got);
    c->failures += !ok;
  }
  if (h[0] != 2.0f) {
    printf("  FAIL the kernel's result read back: %g, want 2\n", h[0]);
    c->failures++;
  }
exit:
  wf_dev_event_destroy(dev, ev);
  if (dev)
    wf_dev_free(dev, d);
  wf_dev_close(dev);
}
