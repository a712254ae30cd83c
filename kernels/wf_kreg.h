/*
 * wf_kreg.h - the kernel registry: every op of the models, found by (op, element type,
 * device). docs/architecture.md walks through adding an op or an element type.
 *
 * An op is one unit: its header kernels/<op>.h (the CPU functions, and the op's table
 * `wf_<op>_op`: its entry points with the CPU function's arguments plus a trailing
 * stream), kernels/cpu/<op>.c, kernels/cuda/<op>.cu and its twin test. The op is
 * written once per device and instantiated per element type: on the CPU by binding the
 * element type into one generic implementation, on the GPU by C++ templates. Each
 * device file exports one wf_kvariants, `wf__<device>_<op>`: the op's table for every
 * element type that device supports. kernels/meson.build's `kernel_ops` lists the ops
 * (one line each); the build turns that list into WF_OP_LIST, and each device's
 * registry (kernels/cpu/registry.c, kernels/cuda/backend.cu) collects its variants from
 * it.
 *
 * Element types. An op's element type is the type of its activations (what a layer
 * keeps for backward, a GEMM's operands, the logits; storage.h): fp32, bf16 or fp16.
 * Everything else stays fp32 in every variant: gradients that are accumulated, norm
 * statistics, non-GEMM weights, the loss, reductions' partial sums. A 16-bit variant
 * computes what the fp32 variant computes on the widened activations, in fp32, and
 * rounds each activation it stores to nearest even. An op that touches no activation
 * registers one table for every element type (WF_KV_ANY).
 *
 * Resolution. A device resolves its registry once, into one wf_kset per element type:
 * the op tables of that type, or NULL where the device has none (not registered, not
 * for that type, or built against another version of the op's table). Whoever computes
 * with a set first states the ops it needs (wf_kset_need), which fails naming the op,
 * the type and the device; a call never finds a hole. A call is WF_K(set, op)->entry(...).
 *
 * Launches are asynchronous on a GPU, so an entry cannot return an error: each launcher
 * checks its launch, logs a failure once with the kernel's name, file and line, and
 * keeps the first for the registry's last_error(), which the device reports at the next
 * wf_dev_check().
 */
#ifndef WF_KREG_H
#define WF_KREG_H

#include <stddef.h>
#include <stdint.h>

#include "wf_op_list.h" /* generated from kernels/meson.build: WF_OP_LIST(X) */

#ifdef __cplusplus
extern "C" {
#endif

#include "wf_config.h" /* wf_precision: the element types' values */
#include "wf_runtime.h"

/* A stream of the device (a cudaStream_t on the GPU; the CPU has one, implicit). */
typedef struct wf_stream wf_stream;

/* Element types, valued as the precision that stores its activations in them (so a
 * wf_precision is a wf_dtype, and storage.h's `fmt` arguments are both). */
typedef enum wf_dtype {
  WF_DT_F32 = WF_PREC_NO,
  WF_DT_F16 = WF_PREC_FP16,
  WF_DT_BF16 = WF_PREC_BF16,
} wf_dtype;
#define WF_DT_COUNT 3

/* "fp32", "fp16", "bf16" (or "?"). */
const char *wf_dtype_name(int dt);

typedef enum wf_op_id {
#define WF__OP_ENUM(name) WF_OP_##name,
  WF_OP_LIST(WF__OP_ENUM)
#undef WF__OP_ENUM
      WF_OP_COUNT
} wf_op_id;

/* The op's name ("layernorm"), or "?". */
const char *wf_op_name(int op);

/* One op's tables on one device, by element type (NULL: none for that type). */
typedef struct wf_kvariants {
  const char *op; /* the op's name, matched against WF_OP_LIST's */
  int version;    /* the WF_<OP>_VERSION of the op's header the device was built with */
  const void *v[WF_DT_COUNT];
} wf_kvariants;

/* Variants for op `name` (its version macro ver) with one table per element type (NULL:
 * none), and with the same table for every type. Positional, so that C++ takes it too
 * (the values of wf_dtype are 0, 1, 2 in the order fp32, fp16, bf16). */
#define WF_KV(name, ver, f32, bf16, f16)                                                           \
  {                                                                                                \
#name, ver, { (f32), (f16), (bf16) }                                                           \
  }
#define WF_KV_ANY(name, ver, t) WF_KV(name, ver, t, t, t)

/* A device's kernels. */
#define WF_KREG_ABI 1
typedef struct wf_kreg {
  int abi;                        /* WF_KREG_ABI */
  const char *device;             /* "cpu", "cuda" */
  int nops;                       /* entries of ops */
  const wf_kvariants *const *ops; /* in any order: resolution matches names */
  /* Bytes of device memory the kernels keep for themselves per device (a GPU's
   * workspace, WF_KREG_GPU_WORKSPACE; 0 on the CPU), counted with the rest from the moment
   * the device is selected. */
  size_t (*workspace_bytes)(void);
  /* The first launch or library error since the last call (then cleared): WF_OK, WF_ECUDA
   * or WF_ENOMEM / WF_EUNSUPPORTED (a CPU kernel's working rows, oneDNN). Logged where it
   * happened. */
  wf_status (*last_error)(void);
  /* Kernel launches and library calls issued so far (bench); the CPU counts none. */
  uint64_t (*launches)(void);
} wf_kreg;

/* Device memory the CUDA kernels keep per device besides what their callers allocate:
 * cuBLASLt's workspace (32 MiB) and the column reductions' partial sums (4 MiB),
 * allocated when the device is selected and counted with the rest (backend.cu). The
 * planner adds it to a GPU rank's memory; the CPU keeps none. */
#define WF_KREG_GPU_WORKSPACE ((size_t)36 << 20)

/* A device's ops of one element type. */
typedef struct wf_kset {
  wf_dtype dt;
  const wf_kreg *reg;
  const struct wf_kset *sets; /* the device's sets, indexed by wf_dtype (this one among them) */
  const void *op[WF_OP_COUNT];
} wf_kset;

/* The op table `name` of set ks (NULL only where wf_kset_need would have refused). */
#define WF_K(ks, name) ((const wf_##name##_op *)(ks)->op[WF_OP_##name])

/* sets[t] = the ops of reg for element type t, every t (sets outlives nothing: it holds
 * pointers into reg). */
void wf_kset_resolve(wf_kset sets[WF_DT_COUNT], const wf_kreg *reg);
/* The sibling set of element type dt. */
static inline const wf_kset *wf_kset_as(const wf_kset *ks, int dt)
{
  return dt >= 0 && dt < WF_DT_COUNT ? &ks->sets[dt] : NULL;
}
/* WF_OK when ks has every op of ops (n of them); WF_EUNSUPPORTED otherwise, logged once
 * with the first missing op, the element type, the device and why. */
wf_status wf_kset_need(const wf_kset *ks, const wf_op_id *ops, int n);

/* The registry of the GPU module's kernels (wf_gpu_kernel_table), or NULL when its ABI
 * is another. */
const wf_kreg *wf_kreg_check(const void *raw);

#ifdef __cplusplus
}
#endif

#endif /* WF_KREG_H */
