/*
 * checksum.h - a 64-bit checksum of a tensor, for checks that two copies agree bit for
 * bit (the tied embedding of the first and last pipeline stage) without moving either
 * copy to the host.
 * Part of the kernels module; include wf_kernels.h, which states the conventions. The
 * CPU code is kernels/cpu/checksum.c; the CUDA twin has the same arguments plus a
 * stream.
 *
 * sum(x) = Σ_i mix(mix(i) ^ bits(x[i])) mod 2^64, mix = splitmix64's finalizer: each
 * element's bits and position go through a bijective 64-bit mixer, so any change of
 * one element, or two elements swapped, changes the sum (but for a 2^-64 chance), and
 * the sum of unsigned integers is the same in any order: the CPU and a GPU agree
 * exactly, whatever their threads. Not a cryptographic hash.
 */
#ifndef WF_KERNELS_CHECKSUM_H
#define WF_KERNELS_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

/* *out = sum(x) (see above), or its negation mod 2^64 when `negate`: two copies'
 * checksums, one negated, add up to 0 exactly when they agree, so one all-reduce of
 * one word compares them. x (n) */
void wf_checksum(uint64_t *out, const float *x, size_t n, int negate);

/* splitmix64's finalizer (Steele, Lea and Flood, 2014), shared by both twins. */
#ifdef __CUDACC__
__host__ __device__
#endif
    static inline uint64_t
    wf_checksum_mix(uint64_t z)
{
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* ---- the op (wf_kreg.h): fp32 only, the same table for every element type ---- */
#define WF_OP_VERSION_checksum 1
typedef struct wf_checksum_op {
  /* *out (device memory) = the checksum above of x (n floats), negated when `negate` */
  void (*sum)(uint64_t *out, const float *x, size_t n, int negate, wf_stream *s);
} wf_checksum_op;

#endif /* WF_KERNELS_CHECKSUM_H */
