/* status.c - names of wf_status codes. */
#include "wf_runtime.h"

const char *wf_status_str(wf_status s)
{
  switch (s) {
  case WF_OK: return "ok";
  case WF_EINVAL: return "invalid argument";
  case WF_ENOMEM: return "out of memory";
  case WF_EIO: return "I/O error";
  case WF_ECONFIG: return "invalid configuration";
  case WF_ELAUNCH: return "inconsistent launch environment";
  case WF_EMPI: return "MPI error";
  case WF_ECUDA: return "CUDA error";
  case WF_ENCCL: return "NCCL error";
  case WF_EUV: return "libuv error";
  case WF_EPROTO: return "protocol error";
  case WF_ETIMEOUT: return "timed out";
  case WF_ENODEV: return "no such device";
  case WF_EFORMAT: return "malformed file";
  case WF_EABORTED: return "aborted";
  case WF_ESYS: return "system error";
  case WF_EUNSUPPORTED: return "unsupported";
  }
  return "unknown status";
}
