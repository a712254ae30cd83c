/*
 * registry.c - the CPU's kernel registry (wf_kreg.h): every op of WF_OP_LIST, each
 * exported by its own file as wf__cpu_<op>.
 *
 * CPU kernels cannot fail once their arguments are valid, except for want of a 16-bit
 * kernel's working rows or a failed oneDNN primitive, which last_error reports. They keep
 * no memory of their own beyond those per-thread working rows, which are small next to
 * the tensors and not counted (storage.c says why).
 */
#include "cpu_int.h"
#include "wf_kernels.h"

#define WF__CPU_OP_DECL(name) extern const wf_kvariants wf__cpu_##name;
WF_OP_LIST(WF__CPU_OP_DECL)

static const wf_kvariants *const ops[] = {
#define WF__CPU_OP_REF(name) &wf__cpu_##name,
    WF_OP_LIST(WF__CPU_OP_REF)};

static size_t workspace_bytes(void) { return 0; }

static wf_status last_error(void)
{
  bool work = wf__work_failed(), dnnl = wf__dnnl_failed();
  return work ? WF_ENOMEM : dnnl ? WF_EUNSUPPORTED : WF_OK;
}

static uint64_t launches(void) { return 0; }

const wf_kreg wf__cpu_kreg = {
    .abi = WF_KREG_ABI,
    .device = "cpu",
    .nops = WF_OP_COUNT,
    .ops = ops,
    .workspace_bytes = workspace_bytes,
    .last_error = last_error,
    .launches = launches,
};
