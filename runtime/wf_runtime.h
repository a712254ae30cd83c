/*
 * wf_runtime.h - the runtime core every other module builds on.
 *
 * Status codes, logging, memory accounting, the counter-based RNG, clocks and
 * run-time module loading. Nothing here knows about models or MPI groups.
 *
 * Invariants:
 *  - Every fallible function returns a wf_status: WF_OK (0) or a negative code.
 *  - Library code never exits; only main() decides to exit.
 *  - The only global state is the runtime context (rank, host, log level,
 *    memory counters and the model's config check), set once at start-up by main().
 */
#ifndef WF_RUNTIME_H
#define WF_RUNTIME_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- status ----------------------------------------------------------------- */

typedef enum wf_status {
  WF_OK = 0,
  WF_EINVAL = -1,       /* bad argument (a caller bug) */
  WF_ENOMEM = -2,       /* allocation failed */
  WF_EIO = -3,          /* read/write/open failed */
  WF_ECONFIG = -4,      /* invalid configuration (user error) */
  WF_ELAUNCH = -5,      /* launch environment inconsistent (user error) */
  WF_EMPI = -6,         /* an MPI call failed */
  WF_ECUDA = -7,        /* a CUDA runtime or cuBLAS call failed */
  WF_ENCCL = -8,        /* an NCCL call failed */
  WF_EUV = -9,          /* a libuv call failed */
  WF_EPROTO = -10,      /* malformed control-plane frame */
  WF_ETIMEOUT = -11,    /* an operation did not finish in time */
  WF_ENODEV = -12,      /* requested device or module not available */
  WF_EFORMAT = -13,     /* malformed or incompatible file */
  WF_EABORTED = -14,    /* the job was aborted (by the watchdog or a peer) */
  WF_ESYS = -15,        /* a system call failed (errno was logged) */
  WF_EUNSUPPORTED = -16 /* not implemented for this configuration */
} wf_status;

const char *wf_status_str(wf_status s);

/* ---- logging -----------------------------------------------------------------
 * Lines look like   "[weft E host:1234:r3] message"   on stderr. Levels are
 * ordered; a message is printed when its level <= the current level. */

enum {
  WF_LOG_ERROR = 0,
  WF_LOG_WARN = 1,
  WF_LOG_INFO = 2,
  WF_LOG_DEBUG = 3,
};

void wf_log(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void wf_vlog(int level, const char *file, int line, const char *fmt, va_list ap);
void wf_log_set_level(int level);
int wf_log_level(void);
/* Parses "error|warn|info|debug" (or 0..3). Returns -1 when unknown. */
int wf_log_level_parse(const char *s);

#define WF_ERROR(...) wf_log(WF_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)
#define WF_WARN(...)  wf_log(WF_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define WF_INFO(...)  wf_log(WF_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define WF_DEBUG(...) wf_log(WF_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)

/* ---- runtime context (the one global) --------------------------------------- */

/* Sets the identity used in log prefixes. rank < 0 means "not yet known". */
void wf_rt_set_rank(int rank);
int wf_rt_rank(void);
const char *wf_rt_host(void);

/* ---- memory accounting ------------------------------------------------------
 * Large host allocations go through wf_mem_alloc so each rank can report its
 * memory. Memory is 64-byte aligned and zeroed. Device memory is accounted by the
 * GPU backend through wf_mem_account(). */

typedef enum wf_mem_kind { WF_MEM_HOST = 0, WF_MEM_DEVICE = 1 } wf_mem_kind;

typedef struct wf_mem_stats {
  int64_t current[2]; /* bytes in use, by wf_mem_kind */
  int64_t peak[2];    /* high-water mark since start or last reset */
  int64_t allocs[2];  /* number of live allocations */
} wf_mem_stats;

void *wf_mem_alloc(size_t bytes);
void wf_mem_free(void *p); /* accepts NULL */
void wf_mem_account(wf_mem_kind kind, int64_t delta_bytes);
void wf_mem_get_stats(wf_mem_stats *out);
void wf_mem_reset_peak(void);

/* ---- counter-based RNG (Philox4x32-10) --------------------------------------
 * Every value is a pure function of (seed, stream, index): element i of a tensor
 * can be generated alone and equals element i of the whole tensor. This is how a
 * parameter shard is initialised independently of the mesh. */

void wf_philox4x32(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2]);
/* Uniform in [0, 1) with 24 bits, for element `index` of `stream`. */
float wf_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Standard normal (Box-Muller on one Philox block) for element `index`. */
float wf_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);
/* out[i] = std * N(0,1) of element (first + i), i < n. */
void wf_rng_fill_normal(float *out, size_t n, float std, uint64_t seed, uint64_t stream,
                        uint64_t first);
/* A uniformly distributed 64-bit value, for data sampling. */
uint64_t wf_rng_u64(uint64_t seed, uint64_t stream, uint64_t index);

/* ---- clocks ------------------------------------------------------------------ */

double wf_now(void);       /* monotonic seconds */
uint64_t wf_now_ns(void);  /* monotonic nanoseconds */
double wf_wall_time(void); /* seconds since the epoch */

/* ---- run-time modules ----------------------------------------------------------
 * GPU backends are shared modules dlopen()ed at run time. wf_module_open looks for
 * lib<name>.so in $WEFT_MODULE_PATH (colon separated), next to the executable, in
 * the executable's ../kernels and ../collectives (the build tree), then in the
 * dynamic linker's path. On failure it returns NULL and writes why into `why`. */

void *wf_module_open(const char *name, char *why, size_t why_len);
void *wf_module_sym(void *module, const char *symbol);
void wf_module_close(void *module);

/* ---- small helpers --------------------------------------------------------------- */

/* snprintf into a fixed buffer that always terminates; returns `buf`. */
char *wf_strlcpy(char *dst, const char *src, size_t dst_len);

#define WF_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define WF_MIN(a, b)    ((a) < (b) ? (a) : (b))
#define WF_MAX(a, b)    ((a) > (b) ? (a) : (b))

#endif /* WF_RUNTIME_H */
