/*
 * rng.c - Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
 * 1, 2, 3", SC'11), the counter-based generator also used by cuRAND and JAX.
 *
 * Counter = (index lo, index hi, stream lo, stream hi), key = (seed lo, seed hi).
 * Each element's value depends only on (seed, stream, index), never on how a
 * tensor is split, which is what makes initialisation mesh-independent.
 */
#include <math.h>

#include "wf_runtime.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t *hi)
{
  uint64_t p = (uint64_t)a * b;
  *hi = (uint32_t)(p >> 32);
  return (uint32_t)p;
}

void wf_philox4x32(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2])
{
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    uint32_t hi0, hi1;
    uint32_t lo0 = mulhilo(PHILOX_M0, c0, &hi0);
    uint32_t lo1 = mulhilo(PHILOX_M1, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
    k0 += PHILOX_W0, k1 += PHILOX_W1;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

static void block(uint32_t out[4], uint64_t seed, uint64_t stream, uint64_t index)
{
  uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)stream,
                     (uint32_t)(stream >> 32)};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  wf_philox4x32(out, ctr, key);
}

float wf_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
  uint32_t r[4];
  block(r, seed, stream, index);
  return (float)(r[0] >> 8) * (1.0f / 16777216.0f);
}

uint64_t wf_rng_u64(uint64_t seed, uint64_t stream, uint64_t index)
{
  uint32_t r[4];
  block(r, seed, stream, index);
  return ((uint64_t)r[1] << 32) | r[0];
}

float wf_rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
  uint32_t r[4];
  block(r, seed, stream, index);
  /* u1 in (0, 1] so log() is finite; 32-bit resolution, computed in double. */
  double u1 = ((double)r[0] + 1.0) * (1.0 / 4294967296.0);
  double u2 = (double)r[1] * (1.0 / 4294967296.0);
  return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void wf_rng_fill_normal(float *out, size_t n, float std, uint64_t seed, uint64_t stream,
                        uint64_t first)
{
  for (size_t i = 0; i < n; i++)
    out[i] = std * wf_rng_normal(seed, stream, first + i);
}
