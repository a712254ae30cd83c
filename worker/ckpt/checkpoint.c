/*
 * checkpoint.c - atomic sharded checkpoints, resume and resharding (see
 * wf_ckpt.h for the directory layout).
 *
 * Files:
 *  - model-ppPP-tpTT.bin: the parameters of the (pp, tp) shard, written by its dp rank 0.
 *    While the shard is the whole model (tp = pp = 1) the file is llm.c's GPT-2
 *    checkpoint (int32[256] header {20240326, 3, maxT, V, L, NH, C, Vp}, then the
 *    float32 parameters in llm.c order), so it is also a valid model.init. A real shard
 *    is a weft shard file: a 128-byte header {magic "WFMS", version 1, L, NH, C, maxT,
 *    V, Vp, tp, tp_rank, l0, l1, chunks, chunk_stride, first, last, n} then the n
 *    float32 parameters of the shard's flat vector (wf_gpt_params' local layout). The
 *    manifest names each model file's format and records the same geometry.
 *  - optim-ppPP-tpTT[-dpDD].bin: a 64-byte header {magic "WFOP", version 1, n, lo, hi,
 *    t, pp, tp, dp, dp size} then float32 m[lo, hi) and float32 v[lo, hi) of the (pp, tp)
 *    shard's flat parameter vector of n elements. dp is 0xffffffff for the unsharded
 *    file.
 *  - manifest.json: everything else, and {name, bytes, xxh3} of every file.
 *
 * Loading: when every rank's shard has exactly the geometry of the saved shard of its
 * (pp, tp) coordinates (the same tp, pp and layer split, whatever dp and ZeRO-1), dp
 * rank 0 of each (pp, tp) reads its model file and broadcasts it, and each rank reads
 * the optimizer range it holds, re-sliced over dp: the bits come back unchanged.
 * Otherwise the checkpoint is resharded: the ranks share out the files, each adds the
 * counted runs (wf_gpt_shard_runs: tp rank 0's copy of replicated tensors, the first
 * stage's tied wte) of its files into whole-model parameters and AdamW m and v, a sum
 * over the job assembles them, and every rank copies out its slices (and its ZeRO-1
 * range). That costs three whole-model float32 vectors per rank while loading, plus
 * one shard file's worth: fine at the sizes this trains, to be streamed per tensor
 * for models near a rank's memory.
 *
 * Invariants:
 *  - `latest` only ever names a directory whose files were all fsync()ed, renamed into
 *    place and listed with their checksums in a manifest that was itself fsync()ed.
 *  - A reader trusts nothing it has not checked: sizes and XXH3-64 checksums against
 *    the manifest (every file is hashed whole by exactly one rank before training
 *    goes on), headers against the manifest, the model shape against the config.
 *  - Every step that can fail on one rank ends with an agreement over the job
 *    (settle), so ranks never disagree about whether a checkpoint was written or
 *    loaded, and nobody waits in a collective the others have left.
 *  - The RNG is counter-based (Philox keyed by train.seed) and data batches and the
 *    learning rate are pure functions of the step, so (seed, step) is the whole RNG
 *    state and data position: restoring parameters, AdamW m and v, and the step
 *    makes the continuation bit-identical on the same mesh.
 *
 * Test hooks (read once): WEFT_TEST_CKPT_DELAY_MS sleeps inside each data-file write,
 * after its first bytes, so a test can kill a rank mid-write; WEFT_TEST_CKPT_FAIL=R:S
 * makes world rank R's write of the step-S checkpoint fail as a full disk would.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "wf_build_config.h"
#include "wf_ckpt.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint files are little-endian; add byte swapping for this host"
#endif

#define MANIFEST       "manifest.json"
#define LATEST         "latest"
#define FORMAT_NAME    "weft-checkpoint"
#define FORMAT_VERSION 1
#define LLMC_MAGIC     20240326
#define LLMC_VERSION   3
#define LLMC_HEADER    1024        /* bytes: int32[256] */
#define OPT_MAGIC      0x504f4657u /* "WFOP" little-endian */
#define OPT_VERSION    1u
#define OPT_HEADER     64
#define OPT_UNSHARDED  0xffffffffu
#define SHARD_MAGIC    0x534d4657u /* "WFMS" little-endian */
#define SHARD_VERSION  1u
#define SHARD_HEADER   128
#define FMT_LLMC       "llmc-gpt2-v3"
#define FMT_SHARD      "weft-shard-v1"
#define CHUNK          (4u << 20) /* bytes per read or write call (a multiple of 4) */
#define PATH_LEN       (WF_PATH_MAX + 64)
#define ERR_LEN        (2 * PATH_LEN + 256)
#define REC_LEN        20 /* uint64 per rank in the save gather (see pack_rec) */

typedef struct optim_header {
  uint32_t magic, version;
  uint64_t n, lo, hi, t;
  uint32_t pp, tp, dp, dp_size;
  uint8_t pad[OPT_HEADER - 56];
} optim_header;
_Static_assert(sizeof(optim_header) == OPT_HEADER, "optimizer header is 64 bytes");

typedef struct shard_header {
  uint32_t magic, version;
  int32_t L, NH, C, maxT, V, Vp;
  int32_t tp, tp_rank, l0, l1, chunks, chunk_stride, first, last;
  uint64_t n;
  uint8_t pad[SHARD_HEADER - 72];
} shard_header;
_Static_assert(sizeof(shard_header) == SHARD_HEADER, "model shard header is 128 bytes");

/* One file of a checkpoint, as the manifest lists it. */
typedef struct entry {
  char name[64];
  bool optim;      /* else the model */
  int pp, tp, dp;  /* dp -1: unsharded (or the model) */
  uint64_t lo, hi; /* element range of the (pp, tp) shard's flat parameter vector */
  uint64_t bytes, hash;
  bool llmc;        /* model: an llm.c file (the whole model), else a weft shard file */
  wf_gpt_shard geo; /* model: the shard's geometry (saved_geo) */
} entry;

typedef struct manifest {
  int step, dp, tp, pp, zero;
  uint64_t n, seed;
  wf_gpt_dims dims;
  int n_files;
  entry *files;
  bool has_scaler; /* "loss_scaler": written by precision=fp16 runs */
  wf_ckpt_scaler scaler;
} manifest;

/* ---- small helpers ------------------------------------------------------------------ */

/* snprintf for paths and names, which are bounded (config paths are at most
 * WF_PATH_MAX, names are short) and would only be cut, never overflow. */
static void pathf(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void pathf(char *buf, size_t len, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, len, fmt, ap);
  va_end(ap);
}

static void errf(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void errf(char *err, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, ERR_LEN, fmt, ap);
  va_end(ap);
}

static wf_comm *world_of(const wf_ckpt_target *t) { return t->world ? t->world : t->dp_comm; }
static int rank_of(wf_comm *c) { return c ? wf_comm_rank(c) : 0; }
static int size_of(wf_comm *c) { return c ? wf_comm_size(c) : 1; }

static void step_name(char *buf, size_t len, int step) { pathf(buf, len, "step-%06d", step); }

static int test_delay_ms(void)
{
  static int ms = -1; /* environment parameters are read once */
  if (ms < 0) {
    const char *s = getenv("WEFT_TEST_CKPT_DELAY_MS");
    ms = s ? atoi(s) : 0;
    ms = ms > 0 ? ms : 0;
  }
  return ms;
}

static bool test_fail(int rank, int step)
{
  static int r = -2, s = -1;
  if (r == -2) {
    const char *e = getenv("WEFT_TEST_CKPT_FAIL");
    if (!e || sscanf(e, "%d:%d", &r, &s) != 2)
      r = -1;
  }
  return r == rank && s == step;
}

static void sleep_ms(int ms)
{
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

static wf_status fsync_dir(const char *dir, char *err)
{
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) {
    errf(err, "%s: cannot fsync the directory: %s", dir, strerror(errno));
    if (fd >= 0)
      close(fd);
    return WF_EIO;
  }
  close(fd);
  return WF_OK;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
  (void)sb, (void)flag, (void)ftw;
  return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

/* rm -rf; a missing path is fine. */
static int remove_tree(const char *path)
{
  struct stat sb;
  if (lstat(path, &sb) != 0)
    return errno == ENOENT ? 0 : -1;
  return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static bool is_file(const char *path)
{
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* ---- agreement ------------------------------------------------------------------------ */

/* Every rank contributes k uint64 and receives all of them (rank-major). The
 * collectives carry float32, so each value travels as four exact 16-bit pieces. */
static wf_status gather_u64(wf_comm *c, const uint64_t *mine, int k, uint64_t *all)
{
  int n = size_of(c);
  if (n == 1) {
    memcpy(all, mine, (size_t)k * sizeof *all);
    return WF_OK;
  }
  float *send = malloc((size_t)k * 4 * sizeof *send);
  float *recv = malloc((size_t)n * k * 4 * sizeof *recv);
  wf_status st = send && recv ? WF_OK : WF_ENOMEM;
  for (int i = 0; st == WF_OK && i < 4 * k; i++)
    send[i] = (float)((mine[i / 4] >> (16 * (i % 4))) & 0xffffu);
  if (st == WF_OK)
    st = wf_comm_allgather(c, send, recv, (size_t)k * 4, WF_COMM_F32);
  for (int i = 0; st == WF_OK && i < n * k; i++) {
    all[i] = 0;
    for (int j = 0; j < 4; j++)
      all[i] |= (uint64_t)recv[4 * i + j] << (16 * j);
  }
  free(send);
  free(recv);
  return st;
}

/* Agree on every rank's outcome: WF_OK when all succeeded, else the status of the
 * lowest failing rank, on every rank. A failing rank logs its message (with `same`,
 * all ranks hit the same message, so only the lowest failing rank logs it); the
 * others log which rank failed and what it was doing. */
static wf_status settle(wf_comm *c, wf_status mine, const char *msg, bool same, const char *what)
{
  int n = size_of(c), me = rank_of(c), bad = -1;
  uint64_t code = (uint64_t)(-(int64_t)mine), *all = malloc((size_t)n * sizeof *all);
  wf_status st = all ? gather_u64(c, &code, 1, all) : WF_ENOMEM;
  if (st != WF_OK) {
    free(all);
    WF_ERROR("checkpoint: cannot agree with the other ranks on %s: %s", what, wf_status_str(st));
    return st;
  }
  for (int r = 0; r < n && bad < 0; r++)
    if (all[r])
      bad = r;
  if (bad >= 0)
    st = (wf_status)(-(int64_t)all[bad]);
  free(all);
  if (bad < 0)
    return WF_OK;
  if (mine != WF_OK && (!same || me == bad))
    WF_ERROR("%s", msg[0] ? msg : "checkpoint: failed (no message)");
  else if (mine == WF_OK)
    WF_ERROR("checkpoint: %s failed on rank %d (see its message); stopping", what, bad);
  return st;
}

/* ---- atomic file writer ------------------------------------------------------------------- */

/* A file written to ".NAME.tmp.PID" in its directory, hashed while written, then
 * fsync()ed and renamed to NAME, and the directory fsync()ed. */
typedef struct afile {
  int fd;
  char dir[PATH_LEN], tmp[PATH_LEN], path[PATH_LEN];
  XXH3_state_t *xx;
  uint64_t bytes;
  bool delayed;
} afile;

static wf_status afile_open(afile *f, const char *dir, const char *name, char *err)
{
  memset(f, 0, sizeof *f);
  f->fd = -1;
  wf_strlcpy(f->dir, dir, sizeof f->dir);
  pathf(f->path, sizeof f->path, "%s/%s", dir, name);
  pathf(f->tmp, sizeof f->tmp, "%s/.%s.tmp.%ld", dir, name, (long)getpid());
  f->xx = XXH3_createState();
  if (!f->xx || XXH3_64bits_reset(f->xx) != XXH_OK) {
    errf(err, "%s: out of memory for the checksum state", f->path);
    return WF_ENOMEM;
  }
  f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f->fd < 0) {
    errf(err, "%s: cannot create: %s", f->tmp, strerror(errno));
    return WF_EIO;
  }
  return WF_OK;
}

static wf_status afile_write(afile *f, const void *buf, size_t n, char *err)
{
  const char *p = buf;
  XXH3_64bits_update(f->xx, buf, n);
  f->bytes += n;
  while (n > 0) {
    ssize_t w = write(f->fd, p, WF_MIN(n, (size_t)CHUNK));
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      errf(err, "%s: write failed after %llu bytes: %s", f->path,
           (unsigned long long)(f->bytes - n), w < 0 ? strerror(errno) : "no progress");
      return WF_EIO;
    }
    p += w, n -= (size_t)w;
  }
  if (!f->delayed && test_delay_ms() > 0) {
    f->delayed = true; /* test hook: hold the file half-written */
    sleep_ms(test_delay_ms());
  }
  return WF_OK;
}

static void afile_abort(afile *f)
{
  if (f->fd >= 0) {
    close(f->fd);
    unlink(f->tmp);
  }
  f->fd = -1;
  XXH3_freeState(f->xx);
  f->xx = NULL;
}

static wf_status afile_commit(afile *f, uint64_t *bytes, uint64_t *hash, char *err)
{
  wf_status st = WF_OK;
  if (fsync(f->fd) != 0) {
    errf(err, "%s: fsync failed: %s", f->path, strerror(errno));
    st = WF_EIO;
  } else if (close(f->fd) != 0) {
    errf(err, "%s: close failed: %s", f->path, strerror(errno));
    f->fd = -1;
    unlink(f->tmp);
    st = WF_EIO;
  } else {
    f->fd = -1;
    if (rename(f->tmp, f->path) != 0) {
      errf(err, "%s: cannot rename into place: %s", f->path, strerror(errno));
      unlink(f->tmp);
      st = WF_EIO;
    } else {
      st = fsync_dir(f->dir, err);
    }
  }
  if (bytes)
    *bytes = f->bytes;
  if (hash)
    *hash = XXH3_64bits_digest(f->xx);
  afile_abort(f);
  return st;
}

/* Write a whole small file atomically. */
static wf_status write_small(const char *dir, const char *name, const char *text, char *err)
{
  afile f;
  wf_status st = afile_open(&f, dir, name, err);
  if (st == WF_OK)
    st = afile_write(&f, text, strlen(text), err);
  if (st == WF_OK)
    return afile_commit(&f, NULL, NULL, err);
  afile_abort(&f);
  return st;
}

/* ---- shard geometry ---------------------------------------------------------------------- */

/* What a checkpoint records of a shard: the fields that decide its parameter layout
 * (sequence parallelism does not change it; chunk_stride matters only with chunks). */
static wf_gpt_shard saved_geo(const wf_gpt_shard *s)
{
  wf_gpt_shard g = *s;
  g.sequence = false;
  g.chunks = WF_MAX(g.chunks, 1);
  if (g.chunks == 1)
    g.chunk_stride = 0;
  return g;
}

static bool same_geo(const wf_gpt_shard *a, const wf_gpt_shard *b)
{
  return a->tp == b->tp && a->tp_rank == b->tp_rank && a->l0 == b->l0 && a->l1 == b->l1 &&
         a->chunks == b->chunks && a->chunk_stride == b->chunk_stride && a->first == b->first &&
         a->last == b->last;
}

/* The whole model: its file is a plain llm.c checkpoint. */
static bool whole_geo(const wf_gpt_shard *g)
{
  return g->tp == 1 && g->first && g->last && g->chunks == 1;
}

static void describe_geo(char *buf, size_t len, const wf_gpt_shard *g)
{
  char chunks[64] = "";
  if (g->chunks > 1)
    pathf(chunks, sizeof chunks, " in %d chunks %d layers apart", g->chunks, g->chunk_stride);
  pathf(buf, len, "tp rank %d of %d, layers [%d, %d)%s%s%s", g->tp_rank, g->tp, g->l0, g->l1,
        chunks, g->first ? ", first stage" : "", g->last ? ", last stage" : "");
}

/* Big enough for either model file header. */
typedef union model_hdr {
  int32_t llmc[LLMC_HEADER / 4];
  shard_header shard;
} model_hdr;

/* The header of the model file of shard g with n parameters; returns its bytes
 * (LLMC_HEADER or SHARD_HEADER). */
static size_t model_header(model_hdr *h, const wf_gpt_dims *d, const wf_gpt_shard *g, uint64_t n)
{
  memset(h, 0, sizeof *h);
  if (whole_geo(g)) {
    int32_t v[8] = {LLMC_MAGIC, LLMC_VERSION, d->maxT, d->V, d->L, d->NH, d->C, d->Vp};
    memcpy(h->llmc, v, sizeof v);
    return LLMC_HEADER;
  }
  h->shard = (shard_header){SHARD_MAGIC, SHARD_VERSION,   d->L,     d->NH,      d->C,  d->maxT,
                            d->V,        d->Vp,           g->tp,    g->tp_rank, g->l0, g->l1,
                            g->chunks,   g->chunk_stride, g->first, g->last,    n,     {0}};
  return SHARD_HEADER;
}

/* ---- writing the shards ---------------------------------------------------------------- */

typedef struct shard_rec {
  bool has_model, has_optim, sharded;
  uint64_t model_bytes, model_hash, optim_bytes, optim_hash, lo, hi;
} shard_rec;

static void model_name(char *buf, size_t len, int pp, int tp)
{
  pathf(buf, len, "model-pp%02d-tp%02d.bin", pp, tp);
}

static void optim_name(char *buf, size_t len, int pp, int tp, int dp)
{
  if (dp < 0)
    pathf(buf, len, "optim-pp%02d-tp%02d.bin", pp, tp);
  else
    pathf(buf, len, "optim-pp%02d-tp%02d-dp%02d.bin", pp, tp, dp);
}

static wf_status write_model(const wf_ckpt_target *t, const char *stage, shard_rec *r, char *err)
{
  const wf_gpt_dims *d = wf_gpt_get_dims(t->model);
  wf_gpt_shard g = saved_geo(wf_gpt_get_shard(t->model));
  size_t n = wf_gpt_local_params(t->model);
  model_hdr h;
  size_t hb = model_header(&h, d, &g, n);
  char name[64];
  afile f;
  model_name(name, sizeof name, t->pp_rank, t->tp_rank);
  wf_status st = afile_open(&f, stage, name, err);
  if (st == WF_OK)
    st = afile_write(&f, &h, hb, err);
  if (st == WF_OK)
    st = afile_write(&f, wf_gpt_params(t->model), n * sizeof(float), err);
  if (st != WF_OK) {
    afile_abort(&f);
    return st;
  }
  r->has_model = true;
  return afile_commit(&f, &r->model_bytes, &r->model_hash, err);
}

/* This rank's AdamW state: elements [*lo, *hi) in m, v; *dp_index -1 when this rank
 * holds the whole state (no ZeRO). */
static wf_status optim_state(const wf_ckpt_target *t, uint64_t *lo, uint64_t *hi, float **m,
                             float **v, int *dp_index)
{
  size_t a = 0, b = wf_gpt_local_params(t->model);
  *dp_index = -1;
  if (t->dp) {
    wf_dp_shard_range(t->dp, &a, &b);
    wf_dp_adam_shard(t->dp, m, v);
    if (*m)
      *dp_index = rank_of(t->dp_comm);
  }
  *lo = a, *hi = b;
  if (*dp_index >= 0)
    return WF_OK;
  return wf_gpt_adam_state(t->model, m, v);
}

static wf_status write_optim(const wf_ckpt_target *t, const char *stage, int step, shard_rec *r,
                             char *err)
{
  float *m, *v;
  int dpi;
  wf_status st = optim_state(t, &r->lo, &r->hi, &m, &v, &dpi);
  if (st != WF_OK) {
    errf(err, "checkpoint: out of memory for the AdamW state");
    return st;
  }
  if (dpi < 0 && rank_of(t->dp_comm) != 0)
    return WF_OK; /* unsharded: dp 0 writes it */
  optim_header h = {OPT_MAGIC,
                    OPT_VERSION,
                    wf_gpt_local_params(t->model),
                    r->lo,
                    r->hi,
                    (uint64_t)step,
                    (uint32_t)t->pp_rank,
                    (uint32_t)t->tp_rank,
                    dpi < 0 ? OPT_UNSHARDED : (uint32_t)dpi,
                    (uint32_t)size_of(t->dp_comm),
                    {0}};
  size_t cnt = r->hi - r->lo;
  char name[64];
  afile f;
  optim_name(name, sizeof name, t->pp_rank, t->tp_rank, dpi);
  st = afile_open(&f, stage, name, err);
  if (st == WF_OK)
    st = afile_write(&f, &h, sizeof h, err);
  if (st == WF_OK && test_fail(rank_of(world_of(t)), step)) {
    errf(err, "%s: write failed after %zu bytes: %s (injected by WEFT_TEST_CKPT_FAIL)", f.path,
         sizeof h, strerror(ENOSPC));
    st = WF_EIO;
  }
  if (st == WF_OK)
    st = afile_write(&f, m, cnt * sizeof(float), err);
  if (st == WF_OK)
    st = afile_write(&f, v, cnt * sizeof(float), err);
  if (st != WF_OK) {
    afile_abort(&f);
    return st;
  }
  r->has_optim = true;
  r->sharded = dpi >= 0;
  return afile_commit(&f, &r->optim_bytes, &r->optim_hash, err);
}

/* ---- the manifest --------------------------------------------------------------------------- */

/* The config as {key: value} from wf_config_print's "key = value  (source)" lines. */
static json_t *config_json(const wf_config *cfg)
{
  char *text = NULL, *save = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  json_t *o = json_object();
  if (!f || !o) {
    if (f)
      fclose(f);
    free(text);
    return o;
  }
  wf_config_print(cfg, f);
  fclose(f);
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *eq = strstr(line, " = "), *src = strrchr(line, '(');
    if (!eq || !src || src < eq)
      continue;
    char *end = src;
    while (end > eq + 3 && end[-1] == ' ')
      end--;
    *end = '\0';
    char *k = line;
    while (*k == ' ')
      k++;
    *eq = '\0';
    for (char *e = eq - 1; e >= k && *e == ' '; e--)
      *e = '\0';
    const char *v = strcmp(eq + 3, "\"\"") ? eq + 3 : ""; /* the printer's empty string */
    json_object_set_new(o, k, json_string(v));
  }
  free(text);
  return o;
}

static json_t *file_json(const char *name, const char *kind, int pp, int tp, int dp, uint64_t lo,
                         uint64_t hi, uint64_t bytes, uint64_t hash)
{
  char hex[17];
  pathf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
  json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:I, s:s, s:[I,I]}", "name", name, "kind", kind, "pp",
                        pp, "tp", tp, "bytes", (json_int_t)bytes, "xxh3_64", hex, "range",
                        (json_int_t)lo, (json_int_t)hi);
  if (o)
    json_object_set_new(o, "dp", dp < 0 ? json_null() : json_integer(dp));
  return o;
}

/* A model file's entry: its format and the shard geometry it holds (n parameters). */
static json_t *model_json(const char *name, int pp, const wf_gpt_shard *g, uint64_t n,
                          uint64_t bytes, uint64_t hash)
{
  json_t *o = file_json(name, "model", pp, g->tp_rank, -1, 0, n, bytes, hash);
  if (!o)
    return NULL;
  json_object_set_new(o, "format", json_string(whole_geo(g) ? FMT_LLMC : FMT_SHARD));
  json_object_set_new(o, "shard",
                      json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:b, s:I}", "tp", g->tp,
                                "tp_rank", g->tp_rank, "l0", g->l0, "l1", g->l1, "chunks",
                                g->chunks, "chunk_stride", g->chunk_stride, "first", g->first,
                                "last", g->last, "params", (json_int_t)n));
  return o;
}

/* What one rank wrote, as REC_LEN uint64: status, pp, tp, dp, has_model, model
 * bytes, model hash, has_optim, sharded, optim bytes, optim hash, lo, hi, then its
 * shard's geometry (saved_geo): tp size, l0, l1, chunks, chunk_stride, first | last << 1,
 * and its parameter count. */
static void pack_rec(uint64_t *x, wf_status st, const wf_ckpt_target *t, const shard_rec *r)
{
  wf_gpt_shard g = saved_geo(wf_gpt_get_shard(t->model));
  uint64_t v[REC_LEN] = {(uint64_t)(-(int64_t)st),
                         (uint64_t)t->pp_rank,
                         (uint64_t)t->tp_rank,
                         (uint64_t)rank_of(t->dp_comm),
                         r->has_model,
                         r->model_bytes,
                         r->model_hash,
                         r->has_optim,
                         r->sharded,
                         r->optim_bytes,
                         r->optim_hash,
                         r->lo,
                         r->hi,
                         (uint64_t)g.tp,
                         (uint64_t)g.l0,
                         (uint64_t)g.l1,
                         (uint64_t)g.chunks,
                         (uint64_t)g.chunk_stride,
                         (uint64_t)g.first | (uint64_t)g.last << 1,
                         wf_gpt_local_params(t->model)};
  memcpy(x, v, sizeof v);
}

static wf_gpt_shard unpack_geo(const uint64_t *x)
{
  return (wf_gpt_shard){.tp = (int)x[13],
                        .tp_rank = (int)x[2],
                        .l0 = (int)x[14],
                        .l1 = (int)x[15],
                        .chunks = (int)x[16],
                        .chunk_stride = (int)x[17],
                        .first = x[18] & 1,
                        .last = (x[18] >> 1) & 1};
}

static json_t *files_json(const uint64_t *recs, int n)
{
  json_t *a = json_array();
  for (int r = 0; a && r < n; r++) {
    const uint64_t *x = recs + (size_t)r * REC_LEN;
    int pp = (int)x[1], tp = (int)x[2], dp = x[8] ? (int)x[3] : -1;
    wf_gpt_shard g = unpack_geo(x);
    char name[64];
    if (x[4]) {
      model_name(name, sizeof name, pp, tp);
      json_array_append_new(a, model_json(name, pp, &g, x[19], x[5], x[6]));
    }
    if (x[7]) {
      optim_name(name, sizeof name, pp, tp, dp);
      json_array_append_new(a, file_json(name, "optim", pp, tp, dp, x[11], x[12], x[9], x[10]));
    }
  }
  return a;
}

static char *manifest_text(const wf_ckpt_target *t, int step, const uint64_t *recs, int n)
{
  const wf_config *cfg = t->cfg;
  const wf_gpt_dims *d = wf_gpt_get_dims(t->model);
  uint64_t np = wf_gpt_num_params(d);
  int zero = t->dp && cfg->optim.zero; /* without a dp group the model holds it all */
  json_t *o = json_pack(
      "{s:s, s:i, s:s, s:f, s:i, s:i, s:{s:i, s:i, s:i, s:i}, s:{s:i, s:i, s:i, s:i, s:i, s:i, "
      "s:I}, s:{s:i, s:s, s:i}, s:{s:s, s:I}, s:{s:s, s:i, s:i, s:f, s:f, s:f, s:f}}",
      "format", FORMAT_NAME, "version", FORMAT_VERSION, "weft_version", WF_VERSION, "written_at",
      wf_wall_time(), "step", step, "steps", cfg->train.steps, "mesh", "dp", size_of(t->dp_comm),
      "tp", cfg->mesh.tp, "pp", cfg->mesh.pp, "world", size_of(world_of(t)), "model", "layers",
      d->L, "heads", d->NH, "d_model", d->C, "seq_len", d->maxT, "vocab", d->V, "padded_vocab",
      d->Vp, "params", (json_int_t)np, "data", "position_step", step, "path",
      cfg->data.path[0] ? cfg->data.path : "synthetic", "batch_size", cfg->train.batch_size, "rng",
      "kind", "philox4x32-10 counter-based: the state is the seed", "seed",
      (json_int_t)cfg->train.seed, "optimizer", "kind", "adamw", "t",
      step - (t->scaler ? t->scaler->skipped : 0), "zero", zero, "beta1", cfg->optim.beta1, "beta2",
      cfg->optim.beta2, "eps", cfg->optim.eps, "weight_decay", cfg->optim.weight_decay);
  if (!o)
    return NULL;
  json_object_set_new(o, "config", config_json(cfg));
  if (t->scaler) /* fp16 loss scaling: the scale and its counters go on with the run */
    json_object_set_new(o, "loss_scaler",
                        json_pack("{s:f, s:i, s:i}", "scale", t->scaler->scale, "good_steps",
                                  t->scaler->good_steps, "skipped", t->scaler->skipped));
  json_object_set_new(o, "files", files_json(recs, n));
  char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  json_decref(o);
  return text;
}

/* ---- publishing --------------------------------------------------------------------------------
 */

/* Move the finished staging directory to its final name. An older directory of the
 * same name (a checkpoint of this step from an earlier run) is swapped out
 * atomically, so `latest` never names a missing directory, then removed. Where the
 * filesystem cannot swap (no renameat2: some network filesystems) the old one is
 * first moved aside, which leaves a short window without it. */
static wf_status publish(const char *root, const char *stage, const char *final, char *err)
{
  struct stat sb;
  char aside[PATH_LEN];
  bool exists = stat(final, &sb) == 0;
  if (!exists && rename(stage, final) == 0)
    return fsync_dir(root, err);
  if (exists && renameat2(AT_FDCWD, stage, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
    wf_status st = fsync_dir(root, err);
    remove_tree(stage); /* now the old one */
    return st;
  }
  if (exists && (errno == EINVAL || errno == ENOSYS)) {
    pathf(aside, sizeof aside, "%s.old", stage);
    if (rename(final, aside) == 0 && rename(stage, final) == 0) {
      remove_tree(aside);
      return fsync_dir(root, err);
    }
  }
  errf(err, "%s: cannot rename %s into place: %s", final, stage, strerror(errno));
  return WF_EIO;
}

static int cmp_desc(const void *a, const void *b)
{
  int x = *(const int *)a, y = *(const int *)b;
  return (x < y) - (x > y);
}

/* Parse "step-NNNNNN" exactly (as step_name writes it); -1 otherwise. */
static int parse_step_name(const char *name)
{
  int step, used = 0;
  char back[32];
  if (sscanf(name, "step-%d%n", &step, &used) != 1 || name[used] || step < 0)
    return -1;
  step_name(back, sizeof back, step);
  return strcmp(back, name) ? -1 : step;
}

static bool stale_temp(const char *name)
{
  return !strncmp(name, ".tmp-step-", 10) || !strncmp(name, ".trash-", 7) ||
         (!strncmp(name, "." LATEST ".tmp.", sizeof LATEST + 5));
}

static void remove_entry(const char *root, const char *name, bool via_trash)
{
  char path[PATH_LEN], trash[PATH_LEN];
  pathf(path, sizeof path, "%s/%s", root, name);
  pathf(trash, sizeof trash, "%s/.trash-%s", root, name);
  /* A checkpoint is first renamed away, so a crash mid-delete never leaves a
   * half-deleted directory under a step name. */
  if (via_trash && rename(path, trash) == 0)
    wf_strlcpy(path, trash, sizeof path);
  if (remove_tree(path) != 0)
    WF_WARN("checkpoint: cannot remove %s: %s", path, strerror(errno));
}

/* Keep the newest `keep` step directories (0 = all) and the one `latest` names;
 * remove leftovers of interrupted writes. Failures are warnings: training goes on. */
static void prune(const char *root, int keep, int latest)
{
  DIR *dir = opendir(root);
  int *steps = NULL, n = 0, cap = 0;
  if (!dir) {
    WF_WARN("checkpoint: cannot list %s to prune it: %s", root, strerror(errno));
    return;
  }
  for (struct dirent *e; (e = readdir(dir)) != NULL;) {
    int s = parse_step_name(e->d_name);
    if (stale_temp(e->d_name))
      remove_entry(root, e->d_name, false);
    if (s < 0 || s == latest)
      continue;
    if (n == cap) {
      int *p = realloc(steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *steps);
      if (!p)
        break;
      steps = p;
    }
    steps[n++] = s;
  }
  closedir(dir);
  if (n > 1)
    qsort(steps, (size_t)n, sizeof *steps, cmp_desc);
  for (int i = keep > 0 ? keep - 1 : n; i < n; i++) { /* latest counts as one kept */
    char name[32];
    step_name(name, sizeof name, steps[i]);
    remove_entry(root, name, true);
  }
  free(steps);
  char err[ERR_LEN];
  if (fsync_dir(root, err) != WF_OK)
    WF_WARN("%s", err);
}

/* Rank 0: manifest into the staging directory, publish it, point `latest` at it. */
static wf_status finalize(const wf_ckpt_target *t, int step, const char *stage,
                          const uint64_t *recs, char *err)
{
  const char *root = t->cfg->train.checkpoint_dir;
  char name[32], final[PATH_LEN], line[40];
  char *text = manifest_text(t, step, recs, size_of(world_of(t)));
  if (!text) {
    errf(err, "checkpoint: cannot build the manifest (out of memory)");
    return WF_ENOMEM;
  }
  wf_status st = write_small(stage, MANIFEST, text, err);
  free(text);
  step_name(name, sizeof name, step);
  pathf(final, sizeof final, "%s/%s", root, name);
  if (st == WF_OK)
    st = publish(root, stage, final, err);
  pathf(line, sizeof line, "%s\n", name);
  if (st == WF_OK)
    st = write_small(root, LATEST, line, err);
  if (st == WF_OK)
    prune(root, t->cfg->train.keep, step);
  return st;
}

/* Rank 0: a fresh, empty staging directory. */
static wf_status make_stage(const char *root, const char *stage, char *err)
{
  if (remove_tree(stage) != 0) {
    errf(err, "%s: cannot remove the leftover of an interrupted checkpoint: %s", stage,
         strerror(errno));
    return WF_EIO;
  }
  if (mkdir(stage, 0755) != 0) {
    errf(err, "%s: cannot create: %s", stage, strerror(errno));
    return WF_EIO;
  }
  return fsync_dir(root, err);
}

wf_status wf_ckpt_save(const wf_ckpt_target *t, int step)
{
  wf_comm *w = world_of(t);
  int me = rank_of(w), n = size_of(w);
  const char *root = t->cfg->train.checkpoint_dir;
  char err[ERR_LEN] = "", stage[PATH_LEN], what[64];
  shard_rec rec = {0};
  uint64_t mine[REC_LEN], *recs = NULL;
  double t0 = wf_now();
  pathf(stage, sizeof stage, "%s/.tmp-step-%06d", root, step);
  pathf(what, sizeof what, "the checkpoint of step %d", step);
  wf_status st = me == 0 ? make_stage(root, stage, err) : WF_OK;
  if ((st = settle(w, st, err, false, what)) != WF_OK)
    return st;
  if (rank_of(t->dp_comm) == 0)
    st = write_model(t, stage, &rec, err);
  if (st == WF_OK)
    st = write_optim(t, stage, step, &rec, err);
  if ((st = settle(w, st, err, false, what)) != WF_OK) {
    if (me == 0)
      remove_tree(stage); /* best effort; `latest` still names the previous one */
    return st;
  }
  pack_rec(mine, WF_OK, t, &rec);
  recs = malloc((size_t)n * REC_LEN * sizeof *recs);
  st = recs ? gather_u64(w, mine, REC_LEN, recs) : WF_ENOMEM;
  if (st != WF_OK)
    errf(err, "checkpoint: cannot gather the file list: %s", wf_status_str(st));
  if (st == WF_OK && me == 0)
    st = finalize(t, step, stage, recs, err);
  free(recs);
  if ((st = settle(w, st, err, false, what)) != WF_OK)
    return st;
  if (me == 0)
    WF_INFO("checkpoint: step %d saved to %s/step-%06d in %.2f s", step, root, step, wf_now() - t0);
  return WF_OK;
}

/* ---- finding a checkpoint -------------------------------------------------------------------- */

static bool has_manifest(const char *dir)
{
  char path[PATH_LEN];
  pathf(path, sizeof path, "%s/" MANIFEST, dir);
  return is_file(path);
}

/* The newest step directory under root that has a manifest; -1 when none. */
static int newest_complete(const char *root)
{
  DIR *dir = opendir(root);
  int best = -1;
  if (!dir)
    return -1;
  for (struct dirent *e; (e = readdir(dir)) != NULL;) {
    char path[PATH_LEN];
    int s = parse_step_name(e->d_name);
    pathf(path, sizeof path, "%s/%s", root, e->d_name);
    if (s > best && has_manifest(path))
      best = s;
  }
  closedir(dir);
  return best;
}

/* The checkpoint `latest` names under root (or, when a crash came between publishing
 * a directory and writing `latest`, the newest complete one). *none: there is none. */
static wf_status find_latest(const char *root, char *dir, size_t len, bool *none, char *err)
{
  char path[PATH_LEN], name[128] = "";
  *none = false;
  pathf(path, sizeof path, "%s/" LATEST, root);
  FILE *f = fopen(path, "r");
  if (!f && errno != ENOENT) {
    errf(err, "%s: cannot read: %s", path, strerror(errno));
    return WF_EIO;
  }
  if (f) {
    if (!fgets(name, sizeof name, f))
      name[0] = '\0';
    fclose(f);
    name[strcspn(name, "\r\n")] = '\0';
    pathf(dir, len, "%s/%s", root, name);
    if (parse_step_name(name) < 0 || !has_manifest(dir)) {
      errf(err,
           "%s names '%s', which is not a complete checkpoint (no %s); set train.resume to "
           "one of the step directories in %s",
           path, name, MANIFEST, root);
      return WF_EFORMAT;
    }
    return WF_OK;
  }
  int best = newest_complete(root);
  if (best < 0) {
    *none = true;
    return WF_OK;
  }
  pathf(dir, len, "%s/step-%06d", root, best);
  if (wf_rt_rank() <= 0)
    WF_WARN("checkpoint: %s has no `latest` pointer; using the newest complete checkpoint %s", root,
            dir);
  return WF_OK;
}

static wf_status locate(const wf_config *cfg, char *dir, size_t len, bool *none, char *err)
{
  const char *r = cfg->train.resume, *root = cfg->train.checkpoint_dir;
  char path[PATH_LEN];
  *none = false;
  if (r[0] && strcmp(r, "auto")) {
    pathf(path, sizeof path, "%s/" LATEST, r);
    if (has_manifest(r)) {
      wf_strlcpy(dir, r, len);
      return WF_OK;
    }
    if (is_file(path))
      return find_latest(r, dir, len, none, err);
    errf(err,
         "train.resume=%s: not a checkpoint (no %s in it) nor a checkpoint directory (no %s in "
         "it)",
         r, MANIFEST, LATEST);
    return WF_ECONFIG;
  }
  if (!root[0]) {
    errf(err, "no checkpoint to use: set train.resume to a checkpoint directory, or "
              "train.checkpoint_dir to the directory holding `latest`");
    return WF_ECONFIG;
  }
  return find_latest(root, dir, len, none, err);
}

wf_status wf_ckpt_locate(const wf_config *cfg, char *dir, size_t dir_len, char *err, size_t err_len)
{
  char e[ERR_LEN] = "";
  bool none = false;
  wf_status st = locate(cfg, dir, dir_len, &none, e);
  if (st == WF_OK && none) {
    errf(e, "%s: no checkpoint there yet", cfg->train.checkpoint_dir);
    st = WF_EIO;
  }
  if (st != WF_OK)
    wf_strlcpy(err, e, err_len);
  return st;
}

/* ---- reading the manifest ----------------------------------------------------------------------
 */

/* A model entry's format and geometry. Entries written before shards existed have
 * neither: they are llm.c files of the whole model. */
static wf_status parse_model(json_t *o, entry *e, const manifest *m, const char *path, int i,
                             char *err)
{
  json_error_t je;
  json_t *fmt = json_object_get(o, "format"), *sh = json_object_get(o, "shard");
  int first = 1, last = 1;
  json_int_t n = (json_int_t)m->n;
  wf_gpt_shard *g = &e->geo;
  *g = saved_geo(&(wf_gpt_shard){.tp = 1, .l1 = m->dims.L, .first = true, .last = true});
  const char *f = fmt ? json_string_value(fmt) : FMT_LLMC; /* NULL: not a string */
  if (sh && json_unpack_ex(sh, &je, 0, "{s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:b, s:I}", "tp",
                           &g->tp, "tp_rank", &g->tp_rank, "l0", &g->l0, "l1", &g->l1, "chunks",
                           &g->chunks, "chunk_stride", &g->chunk_stride, "first", &first, "last",
                           &last, "params", &n) != 0) {
    errf(err, "%s: files[%d] ('%s'): shard: %s", path, i, e->name, je.text);
    return WF_EFORMAT;
  }
  g->first = first, g->last = last;
  const char *bad = wf_gpt_shard_check(&m->dims, g);
  if (!bad && (uint64_t)n != wf_gpt_shard_params(&m->dims, g))
    bad = "its parameter count does not fit its geometry";
  if (!bad && (e->lo != 0 || e->hi != (uint64_t)n || e->tp != g->tp_rank))
    bad = "its range or tp coordinate disagrees with its geometry";
  e->llmc = whole_geo(g);
  if (!bad && (!f || strcmp(f, e->llmc ? FMT_LLMC : FMT_SHARD)))
    bad = e->llmc ? "the whole model's file must have format " FMT_LLMC
                  : "a shard's file must have format " FMT_SHARD;
  if (!bad)
    return WF_OK;
  errf(err, "%s: files[%d] ('%s'): %s", path, i, e->name, bad);
  return WF_EFORMAT;
}

static wf_status parse_entry(json_t *o, entry *e, const manifest *m, const char *path, int i,
                             char *err)
{
  json_error_t je;
  const char *name, *kind, *hex;
  json_t *dp;
  json_int_t bytes, lo, hi;
  char *end;
  if (json_unpack_ex(o, &je, 0, "{s:s, s:s, s:i, s:i, s:o, s:I, s:s, s:[I,I]}", "name", &name,
                     "kind", &kind, "pp", &e->pp, "tp", &e->tp, "dp", &dp, "bytes", &bytes,
                     "xxh3_64", &hex, "range", &lo, &hi) != 0) {
    errf(err, "%s: files[%d]: %s", path, i, je.text);
    return WF_EFORMAT;
  }
  e->dp = json_is_integer(dp) ? (int)json_integer_value(dp) : -1;
  e->optim = !strcmp(kind, "optim");
  e->bytes = (uint64_t)bytes, e->lo = (uint64_t)lo, e->hi = (uint64_t)hi;
  e->hash = strtoull(hex, &end, 16);
  if (strlen(name) >= sizeof e->name || strchr(name, '/') || name[0] == '.' || *end ||
      strlen(hex) != 16 || (!e->optim && strcmp(kind, "model")) || lo < 0 || lo > hi ||
      (uint64_t)hi > m->n || bytes < 0 || e->pp < 0 || e->tp < 0) {
    errf(err, "%s: files[%d] ('%s') is malformed", path, i, name);
    return WF_EFORMAT;
  }
  wf_strlcpy(e->name, name, sizeof e->name);
  return e->optim ? WF_OK : parse_model(o, e, m, path, i, err);
}

static wf_status parse_files(json_t *files, manifest *m, const char *path, char *err)
{
  if (!json_is_array(files) || json_array_size(files) == 0) {
    errf(err, "%s: 'files' is not a non-empty list", path);
    return WF_EFORMAT;
  }
  m->n_files = (int)json_array_size(files);
  m->files = calloc((size_t)m->n_files, sizeof *m->files);
  if (!m->files) {
    errf(err, "%s: out of memory", path);
    return WF_ENOMEM;
  }
  for (int i = 0; i < m->n_files; i++) {
    wf_status st = parse_entry(json_array_get(files, (size_t)i), &m->files[i], m, path, i, err);
    if (st != WF_OK)
      return st;
  }
  return WF_OK;
}

static wf_status manifest_read(const char *dir, manifest *m, char *err)
{
  char path[PATH_LEN];
  json_error_t je;
  const char *format;
  int version;
  json_int_t n, seed;
  json_t *files;
  wf_gpt_dims *d = &m->dims;
  memset(m, 0, sizeof *m);
  pathf(path, sizeof path, "%s/" MANIFEST, dir);
  json_t *o = json_load_file(path, 0, &je);
  if (!o) {
    errf(err, "%s: unreadable (line %d: %s); resume from an older checkpoint", path, je.line,
         je.text);
    return WF_EFORMAT;
  }
  wf_status st = WF_EFORMAT;
  if (json_unpack_ex(o, &je, 0,
                     "{s:s, s:i, s:i, s:{s:i, s:i, s:i}, s:{s:i, s:i, s:i, s:i, s:i, s:i, s:I}, "
                     "s:{s:I}, s:{s:i}, s:o}",
                     "format", &format, "version", &version, "step", &m->step, "mesh", "dp", &m->dp,
                     "tp", &m->tp, "pp", &m->pp, "model", "layers", &d->L, "heads", &d->NH,
                     "d_model", &d->C, "seq_len", &d->maxT, "vocab", &d->V, "padded_vocab", &d->Vp,
                     "params", &n, "rng", "seed", &seed, "optimizer", "zero", &m->zero, "files",
                     &files) != 0) {
    errf(err, "%s: %s", path, je.text);
  } else if (strcmp(format, FORMAT_NAME) || version != FORMAT_VERSION) {
    errf(err, "%s: format '%s' version %d; this weft reads '%s' version %d", path, format, version,
         FORMAT_NAME, FORMAT_VERSION);
  } else if (wf_gpt_dims_check(d) || (uint64_t)n != wf_gpt_num_params(d) || m->step < 0) {
    errf(err, "%s: inconsistent model dims or step", path);
  } else {
    m->n = (uint64_t)n, m->seed = (uint64_t)seed;
    wf_ckpt_scaler *ls = &m->scaler;
    m->has_scaler = json_unpack(o, "{s:{s:F, s:i, s:i}}", "loss_scaler", "scale", &ls->scale,
                                "good_steps", &ls->good_steps, "skipped", &ls->skipped) == 0;
    st = parse_files(files, m, path, err);
  }
  json_decref(o);
  return st;
}

/* The model shape must match; name the first config key that differs. */
static wf_status check_compat(const wf_ckpt_target *t, const manifest *m, const char *dir,
                              char *err)
{
  const wf_gpt_dims *a = &m->dims, *b = wf_gpt_get_dims(t->model);
  const struct {
    const char *key;
    int saved, now;
  } f[] = {{"model.layers", a->L, b->L},        {"model.heads", a->NH, b->NH},
           {"model.d_model", a->C, b->C},       {"model.vocab", a->V, b->V},
           {"model.seq_len", a->maxT, b->maxT}, {"model.padded_vocab", a->Vp, b->Vp}};
  for (size_t i = 0; i < WF_ARRAY_LEN(f); i++) {
    if (f[i].saved != f[i].now) {
      errf(err,
           "checkpoint %s is incompatible: it was saved with %s = %d, this run has %s = %d; "
           "set %s=%d to resume it, or start a fresh train.checkpoint_dir",
           dir, f[i].key, f[i].saved, f[i].key, f[i].now, f[i].key, f[i].saved);
      return WF_ECONFIG;
    }
  }
  return WF_OK;
}

static const entry *find_model(const manifest *m, int pp, int tp)
{
  for (int i = 0; i < m->n_files; i++)
    if (!m->files[i].optim && m->files[i].pp == pp && m->files[i].tp == tp)
      return &m->files[i];
  return NULL;
}

/* The counted runs of every model file, as (full offset, length) pairs. */
typedef struct run_list {
  uint64_t (*r)[2];
  size_t len, cap;
  bool oom;
} run_list;

static void collect_run(void *user, const wf_gpt_run *r)
{
  run_list *l = user;
  if (!r->counted || l->oom)
    return;
  if (l->len == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 1024;
    void *p = realloc(l->r, cap * sizeof *l->r);
    if (!p) {
      l->oom = true;
      return;
    }
    l->r = p, l->cap = cap;
  }
  l->r[l->len][0] = r->full, l->r[l->len][1] = r->n;
  l->len++;
}

static int cmp_run(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* The llm.c name of the tensor holding full element x. */
static const char *kind_at(const wf_gpt_dims *d, uint64_t x)
{
  int k = WF_GPT_NUM_KINDS - 1;
  while (k > 0 && wf_gpt_kind_offset(d, (wf_param_kind)k) > x)
    k--;
  return wf_gpt_kind_name((wf_param_kind)k);
}

/* The model files must hold every parameter of the whole model exactly once (each
 * shard's counted runs; see wf_gpt_shard_runs), one file per (pp, tp). */
static wf_status check_model_cover(const manifest *m, const char *dir, char *err)
{
  run_list l = {0};
  for (int i = 0; i < m->n_files; i++) {
    const entry *e = &m->files[i];
    if (!e->optim && find_model(m, e->pp, e->tp) != e) {
      errf(err, "checkpoint %s: the manifest lists two model files of stage %d shard %d", dir,
           e->pp, e->tp);
      free(l.r);
      return WF_EFORMAT;
    }
    if (!e->optim)
      wf_gpt_shard_runs(&m->dims, &e->geo, collect_run, &l);
  }
  if (l.oom) {
    free(l.r);
    errf(err, "checkpoint %s: out of memory checking its model files", dir);
    return WF_ENOMEM;
  }
  qsort(l.r, l.len, sizeof *l.r, cmp_run);
  uint64_t at = 0;
  size_t i = 0;
  for (; i < l.len && l.r[i][0] == at; i++)
    at += l.r[i][1];
  bool tiled = i == l.len && at == m->n, twice = i < l.len && l.r[i][0] < at;
  uint64_t where = twice ? l.r[i][0] : at;
  free(l.r);
  if (tiled)
    return WF_OK;
  errf(err,
       "checkpoint %s: its model files do not hold every parameter exactly once (parameter %llu, "
       "in %s, is %s): the manifest lists an incomplete or overlapping set of shards",
       dir, (unsigned long long)where, kind_at(&m->dims, WF_MIN(where, m->n - 1)),
       twice ? "held twice" : "missing");
  return WF_EFORMAT;
}

/* ---- reading the shards -------------------------------------------------------------------------
 */

/* Open a checkpoint file and check its size against the manifest. */
static wf_status open_checked(const char *dir, const entry *e, int *fd, char *path, char *err)
{
  struct stat sb;
  pathf(path, PATH_LEN, "%s/%s", dir, e->name);
  *fd = open(path, O_RDONLY | O_CLOEXEC);
  if (*fd < 0) {
    errf(err, "%s: cannot open: %s (the checkpoint is incomplete)", path, strerror(errno));
    return WF_EIO;
  }
  if (fstat(*fd, &sb) != 0 || (uint64_t)sb.st_size != e->bytes) {
    errf(err, "%s: %s: %lld bytes, the manifest says %llu; resume from an older checkpoint", path,
         (uint64_t)sb.st_size < e->bytes ? "truncated" : "wrong size", (long long)sb.st_size,
         (unsigned long long)e->bytes);
    close(*fd);
    *fd = -1;
    return WF_EFORMAT;
  }
  return WF_OK;
}

static wf_status pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path, char *err)
{
  char *p = buf;
  while (n > 0) {
    ssize_t r = pread(fd, p, WF_MIN(n, (size_t)CHUNK), (off_t)off);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      errf(err, "%s: read failed at byte %llu: %s", path, (unsigned long long)off,
           r < 0 ? strerror(errno) : "unexpected end of file");
      return WF_EIO;
    }
    p += r, n -= (size_t)r, off += (uint64_t)r;
  }
  return WF_OK;
}

static wf_status check_hash(uint64_t got, const entry *e, const char *path, char *err)
{
  if (got == e->hash)
    return WF_OK;
  errf(err,
       "%s: checksum mismatch (xxh3_64 %016llx, the manifest says %016llx): the file is "
       "corrupt; resume from an older checkpoint",
       path, (unsigned long long)got, (unsigned long long)e->hash);
  return WF_EFORMAT;
}

/* A model file's header disagrees with its manifest entry: say what each holds. */
static wf_status header_mismatch(const char *path, const entry *e, const model_hdr *h, char *err)
{
  char saw[160], want[160];
  describe_geo(want, sizeof want, &e->geo);
  if (e->llmc || h->shard.magic != SHARD_MAGIC || h->shard.version != SHARD_VERSION) {
    errf(err, "%s: header does not match the manifest (which lists %s of %s)", path,
         e->llmc ? "an llm.c file" : "a weft shard", want);
    return WF_EFORMAT;
  }
  const shard_header *s = &h->shard;
  describe_geo(saw, sizeof saw,
               &(wf_gpt_shard){.tp = s->tp,
                               .tp_rank = s->tp_rank,
                               .l0 = s->l0,
                               .l1 = s->l1,
                               .chunks = s->chunks,
                               .chunk_stride = s->chunk_stride,
                               .first = s->first,
                               .last = s->last});
  errf(err,
       "%s: its header does not match the manifest: the file holds %s (%llu parameters of "
       "L=%d C=%d), the manifest lists %s (%llu); the file was moved or replaced: resume from "
       "an older checkpoint",
       path, saw, (unsigned long long)s->n, s->L, s->C, want, (unsigned long long)e->hi);
  return WF_EFORMAT;
}

/* The whole model file into params (its e->hi floats), hashed and checked, and its
 * header against the manifest's entry. */
static wf_status read_model(const char *dir, const entry *e, const wf_gpt_dims *d, float *params,
                            char *err)
{
  char path[PATH_LEN];
  model_hdr h, want;
  int fd;
  size_t hb = model_header(&want, d, &e->geo, e->hi), bytes = e->hi * sizeof(float);
  wf_status st = open_checked(dir, e, &fd, path, err);
  if (st != WF_OK)
    return st;
  if (e->bytes != hb + bytes) {
    errf(err, "%s: %llu bytes, but its shard needs %zu", path, (unsigned long long)e->bytes,
         hb + bytes);
    st = WF_EFORMAT;
  }
  if (st == WF_OK)
    st = pread_all(fd, &h, hb, 0, path, err);
  if (st == WF_OK)
    st = pread_all(fd, params, bytes, hb, path, err);
  close(fd);
  if (st != WF_OK)
    return st;
  XXH3_state_t *xx = XXH3_createState();
  if (!xx) {
    errf(err, "%s: out of memory for the checksum state", path);
    return WF_ENOMEM;
  }
  XXH3_64bits_reset(xx);
  XXH3_64bits_update(xx, &h, hb);
  XXH3_64bits_update(xx, params, bytes);
  st = check_hash(XXH3_64bits_digest(xx), e, path, err);
  XXH3_freeState(xx);
  if (st == WF_OK && memcmp(&h, &want, hb) != 0)
    st = header_mismatch(path, e, &h, err);
  return st;
}

/* The part of the optimizer state this rank restores: elements [lo, hi). */
typedef struct span {
  uint64_t lo, hi;
  float *m, *v; /* (hi - lo) each */
} span;

static wf_status check_opt_header(const optim_header *h, const entry *e, uint64_t n,
                                  const char *path, char *err)
{
  if (h->magic == OPT_MAGIC && h->version == OPT_VERSION && h->n == n && h->lo == e->lo &&
      h->hi == e->hi && e->bytes == OPT_HEADER + 8 * (e->hi - e->lo))
    return WF_OK;
  errf(err, "%s: header does not match the manifest (magic %08x, range [%llu, %llu) of %llu)", path,
       h->magic, (unsigned long long)h->lo, (unsigned long long)h->hi, (unsigned long long)h->n);
  return WF_EFORMAT;
}

/* The file bytes of elements [x0, x1) of part 0 (m) or 1 (v). */
static uint64_t part_offset(const entry *e, int part, uint64_t x)
{
  return OPT_HEADER + (uint64_t)part * 4 * (e->hi - e->lo) + 4 * (x - e->lo);
}

/* Copy the file bytes [off, off + n) (in buf) that fall in the span into it. */
static void scatter(const entry *e, const span *sp, uint64_t off, const char *buf, size_t n)
{
  uint64_t x0 = WF_MAX(e->lo, sp->lo), x1 = WF_MIN(e->hi, sp->hi);
  for (int part = 0; part < 2 && x0 < x1; part++) {
    uint64_t b0 = part_offset(e, part, x0), b1 = part_offset(e, part, x1);
    uint64_t c0 = WF_MAX(b0, off), c1 = WF_MIN(b1, off + n);
    if (c0 >= c1)
      continue;
    char *dst = (char *)((part ? sp->v : sp->m) + (x0 - sp->lo));
    memcpy(dst + (c0 - b0), buf + (c0 - off), c1 - c0);
  }
}

/* Read all of an optimizer file: check its checksum, keep what the span needs. */
static wf_status verify_optim(const char *dir, const entry *e, uint64_t n, const span *sp,
                              char *err)
{
  char path[PATH_LEN];
  int fd;
  wf_status st = open_checked(dir, e, &fd, path, err);
  if (st != WF_OK)
    return st;
  char *buf = malloc(CHUNK);
  XXH3_state_t *xx = XXH3_createState();
  if (!buf || !xx) {
    errf(err, "%s: out of memory", path);
    st = WF_ENOMEM;
  }
  if (st == WF_OK)
    XXH3_64bits_reset(xx);
  for (uint64_t off = 0; st == WF_OK && off < e->bytes; off += CHUNK) {
    size_t len = (size_t)WF_MIN((uint64_t)CHUNK, e->bytes - off);
    st = pread_all(fd, buf, len, off, path, err);
    if (st == WF_OK && off == 0)
      st = check_opt_header((const optim_header *)buf, e, n, path, err);
    if (st == WF_OK) {
      XXH3_64bits_update(xx, buf, len);
      scatter(e, sp, off, buf, len);
    }
  }
  if (st == WF_OK)
    st = check_hash(XXH3_64bits_digest(xx), e, path, err);
  XXH3_freeState(xx);
  free(buf);
  close(fd);
  return st;
}

/* Read only what the span needs of a file another rank verifies. */
static wf_status read_optim_part(const char *dir, const entry *e, uint64_t n, const span *sp,
                                 char *err)
{
  char path[PATH_LEN];
  optim_header h;
  int fd;
  uint64_t x0 = WF_MAX(e->lo, sp->lo), x1 = WF_MIN(e->hi, sp->hi);
  wf_status st = open_checked(dir, e, &fd, path, err);
  if (st != WF_OK)
    return st;
  st = pread_all(fd, &h, sizeof h, 0, path, err);
  if (st == WF_OK)
    st = check_opt_header(&h, e, n, path, err);
  if (st == WF_OK)
    st = pread_all(fd, sp->m + (x0 - sp->lo), 4 * (x1 - x0), part_offset(e, 0, x0), path, err);
  if (st == WF_OK)
    st = pread_all(fd, sp->v + (x0 - sp->lo), 4 * (x1 - x0), part_offset(e, 1, x0), path, err);
  close(fd);
  return st;
}

/* Elements whose AdamW state dp rank r (of D) restores: its ZeRO shard, or everything
 * on dp rank 0 (which then broadcasts it). */
static void restore_range(int r, int D, bool zero, uint64_t n, uint64_t *lo, uint64_t *hi)
{
  uint64_t shard = (n + (uint64_t)D - 1) / (uint64_t)D;
  *lo = zero ? WF_MIN((uint64_t)r * shard, n) : 0;
  *hi = zero ? WF_MIN(*lo + shard, n) : r == 0 ? n : 0;
}

/* Which dp rank of the (pp, tp) group reads file i whole and checks its checksum: the
 * lowest that restores exactly its range (it reads it whole anyway), else i mod D. */
static int verifier(const entry *e, int i, int D, bool zero, uint64_t n)
{
  for (int r = 0; r < D; r++) {
    uint64_t lo, hi;
    restore_range(r, D, zero, n, &lo, &hi);
    if (lo == e->lo && hi == e->hi)
      return r;
  }
  return i % D;
}

/* The optimizer files of (pp, tp) must cover [0, n) exactly once. */
static wf_status check_cover(const manifest *m, int pp, int tp, uint64_t n, const char *dir,
                             char *err)
{
  uint64_t at = 0;
  for (bool more = true; more;) {
    more = false;
    for (int i = 0; i < m->n_files; i++) {
      const entry *e = &m->files[i];
      if (e->optim && e->pp == pp && e->tp == tp && e->lo == at && e->hi > at) {
        at = e->hi;
        more = true;
      }
    }
  }
  if (at == n)
    return WF_OK;
  errf(err, "checkpoint %s: no optimizer file holds elements [%llu, %llu) of stage %d shard %d",
       dir, (unsigned long long)at, (unsigned long long)n, pp, tp);
  return WF_EFORMAT;
}

/* Every model file's optimizer state is there, and every optimizer file belongs to a
 * model file (whose geometry maps it). */
static wf_status check_optim_cover(const manifest *m, const char *dir, char *err)
{
  wf_status st = WF_OK;
  for (int i = 0; st == WF_OK && i < m->n_files; i++) {
    const entry *e = &m->files[i];
    if (!e->optim) {
      st = check_cover(m, e->pp, e->tp, e->hi, dir, err);
    } else if (!find_model(m, e->pp, e->tp)) {
      errf(err, "checkpoint %s: %s belongs to stage %d shard %d, which has no model file", dir,
           e->name, e->pp, e->tp);
      st = WF_EFORMAT;
    }
  }
  return st;
}

/* The saved shard at this rank's coordinates; the validated manifest has one when the
 * layouts match (same_layout). */
static const entry *my_model(const wf_ckpt_target *t, const manifest *m)
{
  return find_model(m, t->pp_rank, t->tp_rank);
}

static wf_status load_optim(const wf_ckpt_target *t, const manifest *m, const char *dir, char *err)
{
  int me = rank_of(t->dp_comm), D = size_of(t->dp_comm), dpi;
  uint64_t n = my_model(t, m)->hi; /* the shard's flat vector */
  span sp;
  wf_status st = optim_state(t, &sp.lo, &sp.hi, &sp.m, &sp.v, &dpi);
  if (st != WF_OK)
    errf(err, "checkpoint: out of memory for the AdamW state");
  bool zero = dpi >= 0;
  if (!zero && me != 0)
    sp.lo = sp.hi = 0; /* dp 0 restores it all and broadcasts */
  for (int i = 0; st == WF_OK && i < m->n_files; i++) {
    const entry *e = &m->files[i];
    if (!e->optim || e->pp != t->pp_rank || e->tp != t->tp_rank)
      continue;
    if (verifier(e, i, D, zero, n) == me)
      st = verify_optim(dir, e, n, &sp, err);
    else if (WF_MAX(e->lo, sp.lo) < WF_MIN(e->hi, sp.hi))
      st = read_optim_part(dir, e, n, &sp, err);
  }
  st = settle(world_of(t), st, err, false, "restoring the optimizer state");
  if (st != WF_OK || zero || size_of(t->dp_comm) == 1)
    return st;
  st = wf_comm_bcast(t->dp_comm, sp.m, (size_t)n, WF_COMM_F32, 0);
  if (st == WF_OK)
    st = wf_comm_bcast(t->dp_comm, sp.v, (size_t)n, WF_COMM_F32, 0);
  return st;
}

/* dp rank 0 of each (pp, tp) reads its model shard and broadcasts it over dp. */
static wf_status load_params(const wf_ckpt_target *t, const manifest *m, const char *dir, char *err)
{
  const wf_gpt_dims *d = wf_gpt_get_dims(t->model);
  wf_status st = WF_OK;
  if (rank_of(t->dp_comm) == 0)
    st = read_model(dir, my_model(t, m), d, wf_gpt_params(t->model), err);
  st = settle(world_of(t), st, err, false, "restoring the parameters");
  if (st == WF_OK && size_of(t->dp_comm) > 1)
    st = wf_comm_bcast(t->dp_comm, wf_gpt_params(t->model), wf_gpt_local_params(t->model),
                       WF_COMM_F32, 0);
  if (st == WF_OK)
    wf_gpt_params_changed(t->model); /* mixed precision's rounded weights follow */
  return st;
}

/* ---- resharding ---------------------------------------------------------------------------- */

static float *alloc_floats(uint64_t n, const char *what, const char *dir, char *err)
{
  float *p = n <= SIZE_MAX / sizeof(float) ? wf_mem_alloc((size_t)n * sizeof(float)) : NULL;
  if (!p)
    errf(err, "checkpoint %s: out of memory for %s (%llu floats)", dir, what,
         (unsigned long long)n);
  return p;
}

/* Read and verify model file e; add its counted parameters into full (zeros where no
 * other file has added yet). The whole model's file is read straight in: its bits, a
 * -0.0 included, as --save writes them on one rank. */
static wf_status add_model_file(const char *dir, const manifest *m, const entry *e, float *full,
                                char *err)
{
  if (whole_geo(&e->geo))
    return read_model(dir, e, &m->dims, full, err);
  float *buf = alloc_floats(e->hi, e->name, dir, err);
  wf_status st = buf ? read_model(dir, e, &m->dims, buf, err) : WF_ENOMEM;
  if (st == WF_OK)
    wf_gpt_shard_exchange(&m->dims, &e->geo, buf, 0, e->hi, full, true);
  wf_mem_free(buf);
  return st;
}

/* Read and verify optimizer file e; add its counted m and v into fm and fv. */
static wf_status add_optim_file(const char *dir, const manifest *m, const entry *e, float *fm,
                                float *fv, char *err)
{
  const entry *model = find_model(m, e->pp, e->tp); /* check_optim_cover: there is one */
  span sp = {e->lo, e->hi, alloc_floats(e->hi - e->lo, e->name, dir, err), NULL};
  sp.v = sp.m ? alloc_floats(e->hi - e->lo, e->name, dir, err) : NULL;
  wf_status st = sp.v ? verify_optim(dir, e, model->hi, &sp, err) : WF_ENOMEM;
  if (st == WF_OK) {
    wf_gpt_shard_exchange(&m->dims, &model->geo, sp.m, e->lo, e->hi, fm, true);
    wf_gpt_shard_exchange(&m->dims, &model->geo, sp.v, e->lo, e->hi, fv, true);
  }
  wf_mem_free(sp.m);
  wf_mem_free(sp.v);
  return st;
}

/* Whole-model parameters and AdamW m and v, assembled from every file of a checkpoint. */
typedef struct whole_state {
  float *p, *m, *v; /* (n) each, llm.c layout */
} whole_state;

/* The ranks share out the files (rank r reads and verifies files r, r + W, ...), each
 * adds what it read into zeroed whole-model vectors, and a sum over the job puts the
 * whole model on every rank: every element has exactly one contributor
 * (check_model_cover, check_optim_cover), so the sums are exact. st is this rank's
 * status so far, which joins the agreement before the sums. */
static wf_status assemble(const wf_ckpt_target *t, const manifest *m, const char *dir,
                          whole_state *w, wf_status st, char *err)
{
  wf_comm *c = world_of(t);
  int W = size_of(c);
  if (st == WF_OK && (!(w->p = alloc_floats(m->n, "the whole model", dir, err)) ||
                      !(w->m = alloc_floats(m->n, "the whole model", dir, err)) ||
                      !(w->v = alloc_floats(m->n, "the whole model", dir, err))))
    st = WF_ENOMEM;
  for (int i = rank_of(c); st == WF_OK && i < m->n_files; i += W) {
    const entry *e = &m->files[i];
    st = e->optim ? add_optim_file(dir, m, e, w->m, w->v, err)
                  : add_model_file(dir, m, e, w->p, err);
  }
  st = settle(c, st, err, false, "reading the checkpoint's shards");
  float *x[3] = {w->p, w->m, w->v};
  for (int i = 0; i < 3 && st == WF_OK && W > 1; i++)
    st = wf_comm_allreduce(c, x[i], x[i], (size_t)m->n, WF_COMM_F32, WF_COMM_SUM);
  return st;
}

/* A checkpoint of another tensor or pipeline layout: assemble the whole model, then
 * copy out this rank's slices of the parameters and of AdamW m and v (its ZeRO-1 range). */
static wf_status load_resharded(const wf_ckpt_target *t, const manifest *m, const char *dir,
                                char *err)
{
  const wf_gpt_dims *d = &m->dims;
  wf_gpt_shard g = saved_geo(wf_gpt_get_shard(t->model));
  whole_state w = {0};
  uint64_t lo, hi;
  float *mb, *vb;
  int dpi;
  wf_status st = optim_state(t, &lo, &hi, &mb, &vb, &dpi);
  if (st != WF_OK)
    errf(err, "checkpoint: out of memory for the AdamW state");
  st = assemble(t, m, dir, &w, st, err);
  if (st == WF_OK) {
    wf_gpt_import_full(t->model, 0, w.p);
    wf_gpt_shard_exchange(d, &g, mb, lo, hi, w.m, false);
    wf_gpt_shard_exchange(d, &g, vb, lo, hi, w.v, false);
  }
  wf_mem_free(w.p);
  wf_mem_free(w.m);
  wf_mem_free(w.v);
  return st;
}

/* Whether every rank holds exactly the shard the checkpoint saved at its (pp, tp)
 * coordinates: then the files load as they are, bit for bit, re-sliced over dp only.
 * Agreed over the job, so all ranks take the same path. */
static wf_status same_layout(const wf_ckpt_target *t, const manifest *m, bool *same)
{
  wf_comm *c = world_of(t);
  int n = size_of(c);
  const entry *e = my_model(t, m);
  wf_gpt_shard g = saved_geo(wf_gpt_get_shard(t->model));
  uint64_t mine = e && same_geo(&e->geo, &g) && m->pp == t->cfg->mesh.pp && m->tp == g.tp;
  uint64_t *all = malloc((size_t)n * sizeof *all);
  wf_status st = all ? gather_u64(c, &mine, 1, all) : WF_ENOMEM;
  *same = st == WF_OK;
  for (int r = 0; r < n && st == WF_OK; r++)
    *same = *same && all[r];
  free(all);
  return st;
}

/* Every rank must have found the same checkpoint (a checkpoint_dir that is not on a
 * shared filesystem would make them differ). */
static wf_status agree_on_step(const wf_ckpt_target *t, bool none, int step, char *err)
{
  wf_comm *w = world_of(t);
  int n = size_of(w);
  uint64_t mine[2] = {none, (uint64_t)step}, *all = malloc((size_t)n * 2 * sizeof *all);
  wf_status st = all ? gather_u64(w, mine, 2, all) : WF_ENOMEM;
  for (int r = 1; st == WF_OK && r < n; r++) {
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) {
      errf(err,
           "checkpoint: rank %d found %s, rank 0 found %s; train.checkpoint_dir must be on a "
           "filesystem every rank shares",
           r, all[2 * r] ? "no checkpoint" : "another step", all[0] ? "none" : "a checkpoint");
      st = WF_EIO;
    }
  }
  free(all);
  return settle(w, st, err, true, "finding the checkpoint");
}

static void note_differences(const wf_ckpt_target *t, const manifest *m, const char *dir, bool same)
{
  const wf_config *cfg = t->cfg;
  int dp = size_of(t->dp_comm), zero = t->dp ? cfg->optim.zero : 0;
  if (m->seed != cfg->train.seed)
    WF_WARN("checkpoint %s was trained with train.seed=%llu, this run has %llu: the data order "
            "changes from here on",
            dir, (unsigned long long)m->seed, (unsigned long long)cfg->train.seed);
  if (!same)
    WF_INFO("checkpoint: resharding the model and optimizer state from dp %d x tp %d x pp %d%s "
            "to dp %d x tp %d x pp %d%s",
            m->dp, m->tp, m->pp, m->zero ? " (ZeRO-1)" : "", dp, cfg->mesh.tp, cfg->mesh.pp,
            zero ? " (ZeRO-1)" : "");
  else if (m->dp != dp || m->zero != zero)
    WF_INFO("checkpoint: resharding the optimizer state from dp %d%s to dp %d%s", m->dp,
            m->zero ? " (ZeRO-1)" : "", dp, zero ? " (ZeRO-1)" : "");
  WF_INFO("checkpoint: resumed from %s at step %d", dir, m->step);
}

/* Everything a loader checks before reading a data file, identical on every rank. */
static wf_status check_manifest(const wf_ckpt_target *t, const manifest *m, const char *dir,
                                char *err)
{
  wf_status st = check_compat(t, m, dir, err);
  if (st == WF_OK)
    st = check_model_cover(m, dir, err);
  if (st == WF_OK)
    st = check_optim_cover(m, dir, err);
  return st;
}

/* Restore parameters and AdamW state from the checkpoint in dir. */
static wf_status load(const wf_ckpt_target *t, const manifest *m, const char *dir, char *err)
{
  bool same;
  wf_status st = same_layout(t, m, &same);
  if (st == WF_OK && same) {
    st = load_params(t, m, dir, err);
    if (st == WF_OK)
      st = load_optim(t, m, dir, err);
  } else if (st == WF_OK) {
    st = load_resharded(t, m, dir, err);
  }
  if (st == WF_OK && rank_of(world_of(t)) == 0)
    note_differences(t, m, dir, same);
  return st;
}

wf_status wf_ckpt_resume(const wf_ckpt_target *t, int *step)
{
  const wf_config *cfg = t->cfg;
  wf_comm *w = world_of(t);
  char dir[PATH_LEN] = "", err[ERR_LEN] = "";
  bool none = false;
  manifest m = {0};
  *step = 0;
  if (!cfg->train.resume[0])
    return WF_OK;
  wf_status st = locate(cfg, dir, sizeof dir, &none, err);
  if (st == WF_OK && !none)
    st = manifest_read(dir, &m, err);
  if (st == WF_OK && !none)
    st = check_manifest(t, &m, dir, err);
  st = settle(w, st, err, true, "reading the checkpoint to resume from");
  if (st == WF_OK)
    st = agree_on_step(t, none, m.step, err);
  if (st == WF_OK && none) {
    if (rank_of(w) == 0)
      WF_INFO("checkpoint: train.resume=auto and no checkpoint in %s yet: starting fresh",
              cfg->train.checkpoint_dir);
  } else if (st == WF_OK) {
    st = load(t, &m, dir, err);
    if (st == WF_OK)
      *step = m.step;
    if (st == WF_OK && t->scaler && m.has_scaler) /* else fp16 starts its scaler afresh */
      *t->scaler = m.scaler;
  }
  free(m.files);
  return st;
}

/* ---- before training
 * ----------------------------------------------------------------------------- */

static wf_status mkdir_p(const char *dir, char *err)
{
  char path[PATH_LEN];
  struct stat sb;
  wf_strlcpy(path, dir, sizeof path);
  for (char *p = path + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
      break;
    *p = '/';
  }
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    errf(err, "train.checkpoint_dir %s: cannot create %s: %s; point it at a writable directory",
         dir, path, strerror(errno));
    return WF_EIO;
  }
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    errf(err, "train.checkpoint_dir %s: not a directory", dir);
    return WF_EIO;
  }
  return WF_OK;
}

/* Write, fsync and remove a small file, as each rank will write its shards. */
static wf_status probe(const char *dir, int rank, char *err)
{
  char path[PATH_LEN], block[4096] = {0};
  pathf(path, sizeof path, "%s/.probe-%d-%ld", dir, rank, (long)getpid());
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && write(fd, block, sizeof block) == (ssize_t)sizeof block && fsync(fd) == 0;
  int e = errno;
  if (fd >= 0) {
    ok = close(fd) == 0 && ok;
    unlink(path);
  }
  if (ok)
    return WF_OK;
  errf(err, "train.checkpoint_dir %s is not writable from rank %d on %s: %s", dir, rank,
       wf_rt_host(), strerror(e));
  return WF_EIO;
}

/* One checkpoint must fit: model (header + params) and optimizer (m, v, headers) of
 * the whole model, plus the last stage's copy of the tied wte with pp > 1. */
static wf_status check_space(const wf_ckpt_target *t, const char *dir, char *err)
{
  struct statvfs vs;
  const wf_gpt_dims *d = wf_gpt_get_dims(t->model);
  const wf_config *cfg = t->cfg;
  double n = (double)wf_gpt_num_params(d);
  if (cfg->mesh.pp > 1)
    n += (double)wf_gpt_kind_numel(d, WF_P_WTE);
  double files = (double)cfg->mesh.tp * cfg->mesh.pp * (1 + size_of(t->dp_comm));
  double need = 12 * n + LLMC_HEADER * files + 65536;
  if (statvfs(dir, &vs) != 0)
    return WF_OK; /* cannot tell: the writes will say */
  double avail = (double)vs.f_bavail * (double)vs.f_frsize;
  if (avail >= need)
    return WF_OK;
  errf(err,
       "train.checkpoint_dir %s: %.1f MiB free, one checkpoint needs %.1f MiB; free space or "
       "choose another directory",
       dir, avail / 1048576.0, need / 1048576.0);
  return WF_EIO;
}

wf_status wf_ckpt_prepare(const wf_ckpt_target *t)
{
  const wf_config *cfg = t->cfg;
  const char *root = cfg->train.checkpoint_dir;
  wf_comm *w = world_of(t);
  int me = rank_of(w);
  char err[ERR_LEN] = "";
  wf_status st = WF_OK;
  if (!root[0]) {
    if (!strcmp(cfg->train.resume, "auto") || cfg->train.checkpoint_every > 0) {
      errf(err, "train.%s needs train.checkpoint_dir (where checkpoints go)",
           cfg->train.checkpoint_every > 0 ? "checkpoint_every" : "resume=auto");
      st = WF_ECONFIG;
    }
    return settle(w, st, err, true, "checking the checkpoint settings");
  }
  st = settle(w, me == 0 ? mkdir_p(root, err) : WF_OK, err, false, "creating train.checkpoint_dir");
  if (st == WF_OK)
    st = settle(w, probe(root, me, err), err, false, "checking train.checkpoint_dir");
  if (st == WF_OK)
    st = settle(w, me == 0 ? check_space(t, root, err) : WF_OK, err, false,
                "checking the free space in train.checkpoint_dir");
  return st;
}

/* ---- export
 * --------------------------------------------------------------------------------------- */

wf_status wf_ckpt_export_llmc(const char *dir, const char *out_path, char *err, size_t err_len)
{
  char e[ERR_LEN] = "";
  manifest m;
  wf_gpt *g = NULL;
  wf_status st = manifest_read(dir, &m, e);
  if (st == WF_OK)
    st = check_model_cover(&m, dir, e);
  if (st == WF_OK && (st = wf_gpt_create(&g, &m.dims, 1, 1)) != WF_OK)
    errf(e, "cannot allocate the model of %s", dir);
  if (st == WF_OK) /* the shards add into zeros, as --save's assembly does */
    memset(wf_gpt_params(g), 0, m.n * sizeof(float));
  for (int i = 0; st == WF_OK && i < m.n_files; i++)
    if (!m.files[i].optim)
      st = add_model_file(dir, &m, &m.files[i], wf_gpt_params(g), e);
  if (st == WF_OK)
    st = wf_gpt_save_llmc(g, out_path, e, sizeof e);
  if (st != WF_OK)
    wf_strlcpy(err, e, err_len);
  wf_gpt_destroy(g);
  free(m.files);
  return st;
}

/* ---- metrics
 * ---------------------------------------------------------------------------------------- */

static bool metrics_line_past(const char *line, int step)
{
  json_t *o = json_loads(line, 0, NULL);
  json_t *s = o ? json_object_get(o, "step") : NULL;
  bool past = json_is_integer(s) && json_integer_value(s) > step;
  json_decref(o);
  return past;
}

wf_status wf_ckpt_trim_metrics(const char *path, int step, char *err, size_t err_len)
{
  char dir[PATH_LEN], e[ERR_LEN] = "", *line = NULL, *text = NULL;
  size_t cap = 0, len = 0;
  bool dropped = false;
  FILE *in = fopen(path, "r"), *out = NULL;
  if (!in)
    return errno == ENOENT ? WF_OK : WF_EIO;
  out = open_memstream(&text, &len);
  for (ssize_t n; out && (n = getline(&line, &cap, in)) > 0;) {
    if (metrics_line_past(line, step))
      dropped = true;
    else
      fputs(line, out);
  }
  fclose(in);
  free(line);
  wf_status st = out ? WF_OK : WF_ENOMEM;
  if (out)
    fclose(out);
  const char *slash = strrchr(path, '/');
  pathf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
  if (st == WF_OK && dropped)
    st = write_small(dir[0] ? dir : "/", slash ? slash + 1 : path, text, e);
  free(text);
  if (st != WF_OK)
    wf_strlcpy(err, e[0] ? e : "train.metrics: out of memory", err_len);
  return st;
}
