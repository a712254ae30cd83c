/*
 * wf_check.h - the project's check macros, the only macros that change control flow.
 *
 * Each converts a foreign error into a wf_status, logs it once with file and line,
 * stores it in the caller's local `wf_status st` and jumps to the caller's `fail:`
 * label. The usual function shape (NCCL's) is:
 *
 *     wf_status f(void) {
 *       wf_status st = WF_OK;
 *       WF_TRY(g());
 *       WF_CHECK_SYS(open(...));
 *     exit:
 *       ...free...
 *       return st;
 *     fail:
 *       goto exit;
 *     }
 *
 * The header includes no foreign headers: the CUDA/NCCL/MPI/libuv macros call the
 * foreign error-string functions, so use them only in files that include those APIs.
 */
#ifndef WF_CHECK_H
#define WF_CHECK_H

#include <errno.h>
#include <string.h>

#include "wf_runtime.h"

/* Propagate a wf_status that was already logged where it arose. */
#define WF_TRY(expr)                                                                               \
  do {                                                                                             \
    wf_status wf__s = (expr);                                                                      \
    if (wf__s != WF_OK) {                                                                          \
      st = wf__s;                                                                                  \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)

/* A condition that must hold; otherwise log the message and fail with `code`. */
#define WF_CHECK(cond, code, ...)                                                                  \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      wf_log(WF_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__);                                       \
      st = (code);                                                                                 \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)

/* A refusal that every rank reaches alike from the same configuration (a bad key, a
 * mesh that does not fit the model): logged once, by world rank 0 (or a process
 * without MPI), so a job of N ranks prints one line, not N; otherwise like WF_CHECK. */
#define WF_REFUSE(cond, code, ...)                                                                 \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      if (wf_rt_rank() <= 0)                                                                       \
        wf_log(WF_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__);                                     \
      st = (code);                                                                                 \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)

/* A system call returning < 0 (or NULL through WF_CHECK_PTR) with errno set. */
#define WF_CHECK_SYS(call)                                                                         \
  do {                                                                                             \
    if ((call) < 0) {                                                                              \
      wf_log(WF_LOG_ERROR, __FILE__, __LINE__, "%s: %s", #call, strerror(errno));                  \
      st = WF_ESYS;                                                                                \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)

#define WF_CHECK_ALLOC(ptr)                                                                        \
  do {                                                                                             \
    if ((ptr) == NULL) {                                                                           \
      wf_log(WF_LOG_ERROR, __FILE__, __LINE__, "out of memory: %s", #ptr);                         \
      st = WF_ENOMEM;                                                                              \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)

#define WF_CHECK_MPI(call)                                                                         \
  do {                                                                                             \
    int wf__rc = (call);                                                                           \
    if (wf__rc != MPI_SUCCESS) {                                                                   \
      char wf__msg[MPI_MAX_ERROR_STRING];                                                          \
      int wf__len = 0;                                                                             \
      MPI_Error_string(wf__rc, wf__msg, &wf__len);                                                 \
      wf_log(WF_LOG_ERROR, __FILE__, __LINE__, "%s: %s", #call, wf__msg);                          \
      st = WF_EMPI;                                                                                \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)

#define WF_CHECK_UV(call)                                                                          \
  do {                                                                                             \
    int wf__rc = (call);                                                                           \
    if (wf__rc < 0) {                                                                              \
      wf_log(WF_LOG_ERROR, __FILE__, __LINE__, "%s: %s", #call, uv_strerror(wf__rc));              \
      st = WF_EUV;                                                                                 \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)

#define WF_CHECK_CUDA(call)                                                                        \
  do {                                                                                             \
    cudaError_t wf__e = (call);                                                                    \
    if (wf__e != cudaSuccess) {                                                                    \
      wf_log(WF_LOG_ERROR, __FILE__, __LINE__, "%s: %s", #call, cudaGetErrorString(wf__e));        \
      st = WF_ECUDA;                                                                               \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)

#define WF_CHECK_CUBLAS(call)                                                                      \
  do {                                                                                             \
    cublasStatus_t wf__e = (call);                                                                 \
    if (wf__e != CUBLAS_STATUS_SUCCESS) {                                                          \
      wf_log(WF_LOG_ERROR, __FILE__, __LINE__, "%s: cuBLAS status %d", #call, (int)wf__e);         \
      st = WF_ECUDA;                                                                               \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)

#define WF_CHECK_NCCL(call)                                                                        \
  do {                                                                                             \
    ncclResult_t wf__e = (call);                                                                   \
    if (wf__e != ncclSuccess) {                                                                    \
      wf_log(WF_LOG_ERROR, __FILE__, __LINE__, "%s: %s", #call, ncclGetErrorString(wf__e));        \
      st = WF_ENCCL;                                                                               \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)

#endif /* WF_CHECK_H */
