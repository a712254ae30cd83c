/*
 * ckpt_int.h - private to worker/ckpt: file formats, the manifest in memory, and the
 * pieces the store, the writers, the readers and the resharder share.
 *
 * Files of a checkpoint (wf_ckpt.h has the directory layout):
 *  - model-ppPP-tpTT.bin: the parameters of the (pp, tp) shard, written by its dp rank 0.
 *    While the shard is a whole GPT-2 (tp = pp = 1) the file is llm.c's GPT-2 checkpoint
 *    (the llm.c header codec of wf_model.h, then the float32 parameters), so it is also
 *    a valid model.init. Any other shard, and any other family's whole model, is a weft
 *    shard file: a 128-byte header {magic "WFMS", version 1, L, NH, C, maxT, V, Vp, tp,
 *    tp_rank, l0, l1, chunks, chunk_stride, first, last, n, KV, F (0: NH, 4C)} then the
 *    n float32 parameters of the shard's flat
 *    vector (wf_model_params' local layout). The manifest names each model file's format
 *    and records the same geometry.
 *  - optim-ppPP-tpTT[-dpDD].bin: a 64-byte header {magic "WFOP", version 1, n, lo, hi,
 *    t, pp, tp, dp, dp size} then float32 m[lo, hi) and float32 v[lo, hi) of the (pp, tp)
 *    shard's flat parameter vector of n elements. dp is 0xffffffff for the unsharded
 *    file.
 *  - manifest.json: everything else, and {name, bytes, xxh3} of every file.
 *
 * Error idiom: the worker's. Errors are logged where they arise, with the file and
 * what to do; every step that can fail on one rank ends with wf__ckpt_agree, so all
 * ranks return the same status and none waits in a collective the others have left.
 * Steps every rank would fail alike (reading the manifest, the configuration's
 * refusals) run on rank 0 alone, or are refused by rank 0 alone (WF_REFUSE), so a job
 * prints each error once.
 *
 * The files are little-endian, as llm.c's are (checked at compile time).
 */
#ifndef WF_CKPT_INT_H
#define WF_CKPT_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "wf_check.h"
#include "wf_ckpt.h"
#include "wf_device.h"
#include "wf_file.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint files are little-endian; add byte swapping for this host"
#endif

#define WF__MANIFEST       "manifest.json"
#define WF__LATEST         "latest"
#define WF__STOP_STAGE     "-stop-" /* in a stop's writers' staging directory (detached.c) */
#define WF__FORMAT_NAME    "weft-checkpoint"
#define WF__FORMAT_VERSION 1
#define WF__OPT_MAGIC      0x504f4657u /* "WFOP" little-endian */
#define WF__OPT_VERSION    1u
#define WF__OPT_HEADER     64
#define WF__OPT_UNSHARDED  0xffffffffu
#define WF__SHARD_MAGIC    0x534d4657u /* "WFMS" little-endian */
#define WF__SHARD_VERSION  1u
#define WF__SHARD_HEADER   128
#define WF__FMT_LLMC       "llmc-gpt2-v3"
#define WF__FMT_SHARD      "weft-shard-v1"
#define WF__CHUNK          (4u << 20) /* bytes per read call (a multiple of 4) */
#define WF__PATH_LEN       (WF_PATH_MAX + 64)

typedef struct wf__optim_header {
  uint32_t magic, version;
  uint64_t n, lo, hi, t;
  uint32_t pp, tp, dp, dp_size;
  uint8_t pad[WF__OPT_HEADER - 56];
} wf__optim_header;
_Static_assert(sizeof(wf__optim_header) == WF__OPT_HEADER, "optimizer header is 64 bytes");

typedef struct wf__shard_header {
  uint32_t magic, version;
  int32_t L, NH, C, maxT, V, Vp;
  int32_t tp, tp_rank, l0, l1, chunks, chunk_stride, first, last;
  uint64_t n;
  int32_t KV, F; /* kv heads and the MLP's width; 0: the defaults (NH, 4C), GPT-2's */
  uint8_t pad[WF__SHARD_HEADER - 80];
} wf__shard_header;
_Static_assert(sizeof(wf__shard_header) == WF__SHARD_HEADER, "model shard header is 128 bytes");

/* Big enough for either model file header. */
typedef union wf__model_hdr {
  int32_t llmc[WF_LLMC_HEADER_INTS];
  wf__shard_header shard;
} wf__model_hdr;

/* One file of a checkpoint, as the manifest lists it. */
typedef struct wf__entry {
  char name[64];
  bool optim;      /* else the model */
  int pp, tp, dp;  /* dp -1: unsharded (or the model) */
  uint64_t lo, hi; /* element range of the (pp, tp) shard's flat parameter vector */
  uint64_t bytes, hash;
  bool llmc;          /* model: an llm.c file (the whole model), else a weft shard file */
  wf_model_shard geo; /* model: the shard's geometry (wf__saved_geo) */
} wf__entry;

typedef struct wf__manifest {
  int step, dp, tp, pp, zero;
  int steps;    /* the saving run's train.steps (its learning-rate schedule); 0: not recorded */
  int replicas; /* HSDP: the fsdp groups of dp ranks that held this state (1 without) */
  uint64_t n, seed;
  wf_model_dims dims;
  int n_files;
  wf__entry *files;
  bool has_scaler; /* "loss_scaler": written by precision=fp16 runs */
  wf_optim_scaler scaler;
} wf__manifest;

/* What one rank wrote of a checkpoint. */
typedef struct wf__shard_rec {
  bool has_model, has_optim, sharded;
  uint64_t model_bytes, model_hash, optim_bytes, optim_hash, lo, hi;
} wf__shard_rec;

/* The part of the optimizer state this rank restores: elements [lo, hi), in host
 * views of m and v. */
typedef struct wf__span {
  uint64_t lo, hi;
  float *m, *v; /* (hi - lo) each */
} wf__span;

/* ---- helpers (store.c) ---------------------------------------------------------------- */

/* snprintf for paths and names, which are bounded and would only be cut. */
void wf__pathf(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void wf__step_name(char *buf, size_t len, int step);
/* "the checkpoint of step N", what a save's agreement names (wf__ckpt_agree). */
void wf__ckpt_what(char *buf, size_t len, int step);
int wf__parse_step_name(const char *name);
wf_comm *wf__ckpt_world(const wf_ckpt_target *t);
int wf__rank_of(wf_comm *c);
int wf__size_of(wf_comm *c);
/* Agree on every rank's outcome of `what` (see the error idiom above): WF_OK, or the
 * lowest failing rank's status on every rank; rank 0 names the failing rank when it is
 * not itself. */
wf_status wf__ckpt_agree(const wf_ckpt_target *t, wf_status mine, const char *what);
int wf__remove_tree(const char *path);
bool wf__is_file(const char *path);
bool wf__has_manifest(const char *dir);
/* Publish the staging directory under its final name and point `latest` at it. */
wf_status wf__publish(const char *root, const char *stage, const char *final);
void wf__prune(const char *root, int keep, int latest);
/* The staging directories a stop's writers left (detached.c; once none runs). */
void wf__remove_stop_stages(const char *root);
/* Find the checkpoint train.resume (or `latest` in train.checkpoint_dir) names;
 * *none: train.resume=auto found none yet. Not collective. */
wf_status wf__locate(const wf_config *cfg, char *dir, size_t len, bool *none);
/* A checkpoint (a directory with a manifest), or the one `latest` names in a checkpoint
 * directory, into dir; an error naming `path` when it is neither. Not collective. */
wf_status wf__resolve(const char *path, char *dir, size_t len);

/* ---- shard files (shard.c) -------------------------------------------------------------- */

wf_model_shard wf__saved_geo(const wf_model_shard *s);
bool wf__same_geo(const wf_model_shard *a, const wf_model_shard *b);
bool wf__whole_geo(const wf_model_shard *g);
bool wf__llmc_geo(const wf_model_dims *d, const wf_model_shard *g);
void wf__model_name(char *buf, size_t len, int pp, int tp);
void wf__optim_name(char *buf, size_t len, int pp, int tp, int dp);
/* This rank's optimizer range and whether it is a dp shard (per-dp-rank files). */
void wf__optim_range(const wf_ckpt_target *t, uint64_t *lo, uint64_t *hi);
/* This rank's model file and optimizer file of the checkpoint of `step` into stage; keep
 * (a snapshot) NULL: written at once, else gathered in memory and handed over in *keep
 * (not committed; the saver writes it), its size and hash in r as for a written file. */
wf_status wf__write_model(const wf_ckpt_target *t, const char *stage, int step, wf__shard_rec *r,
                          wf_afile *keep);
wf_status wf__write_optim(const wf_ckpt_target *t, const char *stage, int step, wf__shard_rec *r,
                          wf_afile *keep);
/* ---- saving (save.c), at once or from a snapshot (saver.c) ------------------------------
 * Each step is collective and agreed, as wf_ckpt_save is. */
/* A fresh staging directory for `step` (its path into stage). */
wf_status wf__save_begin(const wf_ckpt_target *t, int step, char *stage, size_t len);
/* This rank's files into the stage, its record of them into *rec; keep (a snapshot): the
 * files gathered in memory into keep[*kept...] instead (2 at most), for the saver. Not
 * agreed, and collective only under ZeRO-3 (every dp rank streams its shard). */
wf_status wf__write_mine(const wf_ckpt_target *t, int step, const char *stage, wf__shard_rec *rec,
                         wf_afile *keep, int *kept);
/* wf__write_mine, agreed: a failure anywhere drops the files and the stage. */
wf_status wf__save_files(const wf_ckpt_target *t, int step, const char *stage, wf__shard_rec *rec,
                         wf_afile *keep, int *kept);
/* Every rank's record and the data position: the manifest's text on rank 0 (*text, to
 * free; NULL elsewhere). */
wf_status wf__save_manifest(const wf_ckpt_target *t, int step, const wf__shard_rec *rec,
                            char **text);
/* Not collective (rank 0, once every file is in the stage): the manifest, the step
 * published and `latest` replaced, then the oldest beyond `keep` pruned. */
wf_status wf__save_publish(const char *root, int keep, int step, const char *stage,
                           const char *text);

/* Rank 0, before anything reads or prunes root: wait for a stop's writers (detached.c)
 * of the last job there to finish. Not collective. */
wf_status wf__wait_for_writers(const char *root);

/* Test hook (WEFT_TEST_CKPT_DELAY_MS): hold a file of the checkpoint of `step`
 * half-written. */
void wf__ckpt_test_delay(int step);
/* The whole model file of entry e into params (its e->hi floats, host memory), hashed
 * and checked, and its header against the manifest's entry. */
wf_status wf__read_model(const char *dir, const wf__entry *e, const wf_model_dims *d,
                         float *params);
/* One piece a streamed read keeps: `bytes` of a file's data (past its header) from
 * byte `off`, into dst. A read's copies are sorted by off and do not overlap. */
typedef struct wf__copy {
  uint64_t off, bytes;
  char *dst;
} wf__copy;
/* Model file e streamed past (its header checked, every byte hashed against the
 * manifest), keeping only what the copies want: no rank holds the file whole. */
wf_status wf__read_model_copies(const char *dir, const wf__entry *e, const wf_model_dims *d,
                                const wf__copy *c, size_t nc);
/* The same of optimizer file e, of a shard of n parameters: its data is m then v. */
wf_status wf__read_optim_copies(const char *dir, const wf__entry *e, uint64_t n, const wf__copy *c,
                                size_t nc);
/* The copies of file e (model or optimizer) read where they lie, unverified: for a rank
 * whose file another rank streams and verifies (the job agrees on the outcome). */
wf_status wf__read_copies(const char *dir, const wf__entry *e, const wf_model_dims *d,
                          const wf__copy *c, size_t nc);
/* Elements [lo, hi) of model file e alone into dst (ZeRO-3's shard): verify, the whole
 * file hashed as it streams past; else the range read where it lies (another rank
 * verifies the file). */
wf_status wf__read_model_range(const char *dir, const wf__entry *e, const wf_model_dims *d,
                               uint64_t lo, uint64_t hi, float *dst, bool verify);
/* Read all of an optimizer file, check its checksum, keep what the span needs; or read
 * only the span's part of a file another rank verifies. */
wf_status wf__verify_optim(const char *dir, const wf__entry *e, uint64_t n, const wf__span *sp);
wf_status wf__read_optim_part(const char *dir, const wf__entry *e, uint64_t n, const wf__span *sp);
/* Read all of entry e's file and check its size and checksum (nothing is kept). */
wf_status wf__verify_file(const char *dir, const wf__entry *e);

/* ---- streaming parameters to a writer (stream.c) ------------------------------------------ */

/* What a rank passes to the writer: elements [lo, hi) of the flat vector of its (pp, tp)
 * shard of geometry geo (lo == hi: nothing). */
typedef struct wf__piece {
  uint64_t lo, hi;
  wf_model_shard geo;
} wf__piece;

/* The writer's use of x, elements [lo, hi) of piece p (host memory, at most WF__CHUNK
 * bytes). */
typedef wf_status (*wf__sink)(void *user, const wf__piece *p, const float *x, uint64_t lo,
                              uint64_t hi);

/* Collective over c (NULL: this rank alone): every rank's piece, mine (x: its elements,
 * device memory), reaches the sink on rank `root` in chunks, rank by rank in rank order.
 * It always runs to the end (a failed sink is skipped after its failure, a failed device
 * read sends zeros), so the caller agrees on the returned statuses. */
wf_status wf__stream_pieces(wf_comm *c, int root, const wf__piece *mine, wf_dev *dev,
                            const float *x, wf__sink sink, void *user);

/* ---- the manifest (manifest.c) ---------------------------------------------------------- */

#define WF__REC_LEN 20 /* uint64 per rank in the save gather (see wf__pack_rec) */
struct json_t;
void wf__pack_rec(uint64_t *x, const wf_ckpt_target *t, const wf__shard_rec *r);
/* stream: the data position's JSON (wf__data_state_capture; NULL: none), taken over. */
char *wf__manifest_text(const wf_ckpt_target *t, int step, const uint64_t *recs, int n,
                        struct json_t *stream);
/* Every config key as a JSON string, as the manifest's "config" holds them. */
struct json_t *wf__config_json(const wf_config *cfg);
/* train.resume: "" resumes the run train.checkpoint_dir holds (the same run only),
 * "never" starts over there, "auto" is "" for restarts, anything else names one. */
bool wf__resume_implicit(const wf_config *cfg);
bool wf__resume_never(const wf_config *cfg);
wf_status wf__manifest_parse(const char *text, const char *path, wf__manifest *m);
/* Read and parse dir's manifest; *text (may be NULL) gets its bytes (to free). */
wf_status wf__manifest_read(const char *dir, wf__manifest *m, char **text);
const wf__entry *wf__find_model(const wf__manifest *m, int pp, int tp);
/* Runs of shards (wf_model_shard_runs_in) clipped to their local elements [lo, hi): where
 * each lies in the whole model (full) and in the shard (local). */
typedef struct wf__run {
  uint64_t full, local, n;
} wf__run;
typedef struct wf__runs {
  wf__run *r;
  size_t len, cap;
  bool counted, oom;
} wf__runs;
/* Append shard g's runs inside [lo, hi) to s (the counted alone: counted, as a saved
 * file's, each element once over a mesh); false when out of memory. */
bool wf__runs_add(wf__runs *s, const wf_model_dims *d, const wf_model_shard *g, uint64_t lo,
                  uint64_t hi, bool counted);
/* By their place in the whole model. */
void wf__runs_sort(wf__runs *s);
/* The model files hold every parameter exactly once; every optimizer file belongs to a
 * model file, and each model file's state is covered. */
wf_status wf__check_model_cover(const wf__manifest *m, const char *dir);
wf_status wf__check_optim_cover(const wf__manifest *m, const char *dir);

/* ---- the data position (datastate.c) ------------------------------------------------------ */

/* Collective over the job: a data.source stream's position before step + 1, as JSON on
 * rank 0 (*stream, to json_decref; NULL elsewhere, and for other sources). */
wf_status wf__data_state_capture(const wf_ckpt_target *t, int step, struct json_t **stream);
/* Collective over the job: every rank's stream to the position in manifest `text` of
 * checkpoint dir (a checkpoint without one: the stream starts over, said once). */
wf_status wf__data_state_restore(const wf_ckpt_target *t, const char *text, const char *dir);

/* ---- resharding (reshard.c) --------------------------------------------------------------- */

/* Read and verify model file e and add its counted parameters into full (host). */
wf_status wf__add_model_file(const char *dir, const wf__manifest *m, const wf__entry *e,
                             float *full);
wf_status wf__load_resharded(const wf_ckpt_target *t, const wf__manifest *m, const char *dir);
/* The whole model of checkpoint `dir` (saved on any mesh): its dims, and its parameters
 * assembled into full (wf_model_num_params(d) floats), every file's checksum verified.
 * A checkpoint of other dims than d is refused. Not collective. */
wf_status wf__ckpt_model_dims(const char *dir, wf_model_dims *d);
wf_status wf__ckpt_model_read(const char *dir, const wf_model_dims *d, float *full);
/* Elements [lo, hi) of shard s's flat parameter vector alone from checkpoint dir (any
 * mesh), into dst: every model file streamed past and verified as the whole read does,
 * only the range kept. Not collective. */
wf_status wf__ckpt_model_read_shard(const char *dir, const wf_model_dims *d,
                                    const wf_model_shard *s, size_t lo, size_t hi, float *dst);

#endif /* WF_CKPT_INT_H */
