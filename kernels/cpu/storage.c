/*
 * storage.c - the CPU's helpers for activations in a storage format (storage.h):
 * storing fp32 values in bf16 / fp16 and loading them back a range at a time, and the
 * per-thread working rows the 16-bit kernels compute in. The cast op (cast.c) is these
 * conversions over a whole tensor.
 *
 * The 16-bit kernels of each op (layernorm.c, attention.c, ...) load a row or a block
 * of their 16-bit inputs into fp32 working memory, run the fp32 kernel's own row
 * function on it, and store the outputs rounded: so each equals store(fp32 kernel(load
 * (inputs))) bit for bit, and the CPU needs no fp32 copy of a whole tensor. The working
 * memory is this thread's (each pool thread has its own, kept between calls and grown
 * as needed): a few rows, or one attention head's tiles, so it is small beside the
 * tensors, which is why it is not counted with them.
 *
 * Invariant: each stored element is a pure function of its source element (the same
 * rounding as round.c's), so the thread split changes nothing.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "cpu_int.h"
#include "wf_kernels.h"

const char *wf_storage_name(int fmt)
{
  return fmt == WF_PREC_BF16 ? "bf16" : fmt == WF_PREC_FP16 ? "fp16" : "fp32";
}

/* The same bit trick as round.c's round_bf16, keeping the top half. */
static inline uint16_t bf16_bits(float x)
{
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t nan = (u | 0x00400000u) >> 16;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

WF__CLONES static void store_bf16(uint16_t *dst, const float *src, size_t n)
{
#pragma omp simd
  for (size_t i = 0; i < n; i++)
    dst[i] = bf16_bits(src[i]);
}

WF__CLONES static void load_bf16(float *dst, const uint16_t *src, size_t n)
{
#pragma omp simd
  for (size_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)src[i] << 16;
    memcpy(dst + i, &u, sizeof u);
  }
}

void wf__store(void *dst, size_t first, const float *src, size_t n, int fmt)
{
  if (fmt == WF_PREC_BF16) {
    store_bf16((uint16_t *)dst + first, src, n);
  } else if (fmt == WF_PREC_FP16) {
    wf_f16 *d = (wf_f16 *)dst + first;
    for (size_t i = 0; i < n; i++)
      d[i] = wf_f16_from_float(src[i]);
  } else {
    memcpy((float *)dst + first, src, n * sizeof(float));
  }
}

void wf__load(float *dst, const void *src, size_t first, size_t n, int fmt)
{
  if (fmt == WF_PREC_BF16) {
    load_bf16(dst, (const uint16_t *)src + first, n);
  } else if (fmt == WF_PREC_FP16) {
    const wf_f16 *s = (const wf_f16 *)src + first;
    for (size_t i = 0; i < n; i++)
      dst[i] = wf_f16_to_float(s[i]);
  } else {
    memcpy(dst, (const float *)src + first, n * sizeof(float));
  }
}

const float *wf__bias_rounded(const float *bias, size_t n, int fmt)
{
  float *r = bias ? wf__work(3, n) : NULL;
  uint16_t low[256];
  for (size_t i = 0; r && i < n; i += 256) {
    size_t k = n - i < 256 ? n - i : 256;
    wf__store(low, 0, bias + i, k, fmt);
    wf__load(r + i, low, 0, k, fmt);
  }
  return r;
}

/* Floats of one operand's block: large enough for an fp32 kernel to split over the
 * threads, small next to the activations. */
#define BLOCK_FLOATS ((size_t)1 << 16)

size_t wf__block_rows(size_t width) { return width < BLOCK_FLOATS ? BLOCK_FLOATS / width : 1; }

float *wf__widened(int slot, const void *src, size_t r0, size_t n, size_t width, int fmt)
{
  float *w = wf__work(slot, n * width);
  if (w)
    wf__load(w, src, r0 * width, n * width, fmt);
  return w;
}

/* ---- per-thread working memory --------------------------------------------------------- */

#define WORK_SLOTS 8

typedef struct work {
  float *p[WORK_SLOTS];
  size_t n[WORK_SLOTS];
} work;

static pthread_key_t work_key;
static pthread_once_t work_once = PTHREAD_ONCE_INIT;

static void work_free(void *p)
{
  work *w = p;
  for (int i = 0; i < WORK_SLOTS; i++)
    free(w->p[i]);
  free(w);
}

static void work_init(void) { pthread_key_create(&work_key, work_free); }

static atomic_int work_failed;

/* Whether working memory ran out since the last call (then cleared): the kernel that
 * needed it did nothing, and the device's last_error reports it. */
bool wf__work_failed(void) { return atomic_exchange(&work_failed, 0) != 0; }

static float *fail(size_t n)
{
  WF_ERROR("out of host memory for a 16-bit kernel's working rows (%zu floats)", n);
  atomic_store(&work_failed, 1);
  return NULL;
}

float *wf__work(int slot, size_t n)
{
  pthread_once(&work_once, work_init);
  work *w = pthread_getspecific(work_key);
  if (!w) {
    w = calloc(1, sizeof *w);
    if (!w || pthread_setspecific(work_key, w) != 0) {
      free(w);
      return fail(n);
    }
  }
  if (w->n[slot] < n) {
    free(w->p[slot]);
    w->p[slot] = aligned_alloc(64, (n * sizeof(float) + 63) & ~(size_t)63);
    w->n[slot] = w->p[slot] ? n : 0;
  }
  return w->p[slot] ? w->p[slot] : fail(n);
}
