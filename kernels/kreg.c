/*
 * kreg.c - resolving a device's kernel registry (wf_kreg.h) into one set of op tables
 * per element type, and explaining a hole.
 *
 * A device's registry lists its ops by name, in its own order, so a GPU module built
 * from another op list still resolves what it shares with the host; an op whose table
 * version differs from the host's header is treated as absent (its entries' arguments
 * may differ), and wf_kset_need says so.
 */
#include <string.h>

#include "wf_check.h"
#include "wf_kernels.h"

static const char *const op_names[WF_OP_COUNT] = {
#define WF__OP_NAME(name) #name,
    WF_OP_LIST(WF__OP_NAME)
#undef WF__OP_NAME
};

/* The version of each op's table in this build's headers (WF_<OP>_VERSION). */
static const int op_versions[WF_OP_COUNT] = {
#define WF__OP_VERSION(name) WF_OP_VERSION_##name,
    WF_OP_LIST(WF__OP_VERSION)
#undef WF__OP_VERSION
};

const char *wf_op_name(int op) { return op >= 0 && op < WF_OP_COUNT ? op_names[op] : "?"; }

const char *wf_dtype_name(int dt)
{
  return dt == WF_DT_F32 ? "fp32" : dt == WF_DT_BF16 ? "bf16" : dt == WF_DT_F16 ? "fp16" : "?";
}

/* reg's variants of op, whatever their version, or NULL. */
static const wf_kvariants *find(const wf_kreg *reg, int op)
{
  for (int i = 0; reg && i < reg->nops; i++)
    if (reg->ops[i] && strcmp(reg->ops[i]->op, op_names[op]) == 0)
      return reg->ops[i];
  return NULL;
}

void wf_kset_resolve(wf_kset sets[WF_DT_COUNT], const wf_kreg *reg)
{
  for (int t = 0; t < WF_DT_COUNT; t++) {
    memset(&sets[t], 0, sizeof sets[t]);
    sets[t].dt = (wf_dtype)t, sets[t].reg = reg, sets[t].sets = sets;
  }
  for (int op = 0; op < WF_OP_COUNT; op++) {
    const wf_kvariants *v = find(reg, op);
    if (!v || v->version != op_versions[op])
      continue;
    for (int t = 0; t < WF_DT_COUNT; t++)
      sets[t].op[op] = v->v[t];
  }
}

wf_status wf_kset_need(const wf_kset *ks, const wf_op_id *ops, int n)
{
  for (int i = 0; i < n; i++) {
    int op = ops[i];
    if (op < 0 || op >= WF_OP_COUNT || ks->op[op])
      continue;
    const wf_kvariants *v = find(ks->reg, op);
    const char *dev = ks->reg ? ks->reg->device : "?";
    if (!v)
      WF_ERROR("the %s kernels have no op '%s' (kernels/%s/%s.*): this build's %s module is "
               "older than its host; rebuild both",
               dev, op_names[op], dev, op_names[op], dev);
    else if (v->version != op_versions[op])
      WF_ERROR("the %s kernels' op '%s' is version %d, the host's %d: rebuild both from one tree",
               dev, op_names[op], v->version, op_versions[op]);
    else
      WF_ERROR("the %s kernels have no %s form of op '%s': use another precision, or add "
               "that element type to kernels/%s/%s.*",
               dev, wf_dtype_name(ks->dt), op_names[op], dev, op_names[op]);
    return WF_EUNSUPPORTED;
  }
  return WF_OK;
}

const wf_kreg *wf_kreg_check(const void *raw)
{
  const wf_kreg *r = raw;
  return r && r->abi == WF_KREG_ABI ? r : NULL;
}
