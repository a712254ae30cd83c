/*
 * wf_ckpt.h - checkpoints: atomic sharded save, resume, resharding, export.
 *
 * A checkpoint is one directory per step under train.checkpoint_dir:
 *
 *   step-000120/
 *     model-pp00-tp00.bin          parameters of stage pp, tensor shard tp (dp 0
 *                                  writes it; under ZeRO-3 from every dp rank's
 *                                  shard, streamed to it). With tp = pp = 1 the shard is the
 *                                  whole model and the file is an llm.c checkpoint;
 *                                  otherwise a weft shard file whose header gives the
 *                                  shard's geometry (see ckpt_int.h).
 *     optim-pp00-tp00-dp03.bin     AdamW m and v of one element range of the (pp, tp)
 *                                  shard's flat parameter vector: one per dp rank
 *     optim-pp00-tp00.bin          under ZeRO-1, or the whole range, written by dp 0.
 *     manifest.json                config, mesh, step, data position, RNG, AdamW
 *                                  step, size and XXH3-64 of every file, and each
 *                                  model file's format and shard geometry; for a
 *                                  data.source stream, its exact position (every
 *                                  lane's: "data": {"stream": ...}, wf_data_state_json).
 *   latest                         "step-000120": the newest complete checkpoint.
 *
 * Atomicity: the files are written into a staging directory ".tmp-step-000120", each
 * with the runtime's atomic writer (wf_file.h); the manifest last. Then the staging
 * directory is renamed to "step-000120" (swapped atomically with an older one of the
 * same name), the parent is fsync()ed, and only then is `latest` replaced the same way.
 * A crash at any moment leaves `latest` naming a complete, checksummed checkpoint.
 * train.keep_checkpoints prunes the oldest step directories but never the one `latest` names.
 *
 * HSDP (mesh.fsdp = F < mesh.dp): every fsdp group of F dp ranks holds the whole sharded
 * state, so fsdp group 0 alone writes it, in exactly the files of a dp = F run of the same
 * ZeRO stage; the manifest says so (mesh.dp = F, mesh.replicas = dp / F). On resume each
 * fsdp group reads it as that dp = F run would, so the same mesh resumes bit for bit and
 * any other mesh reshards it like any ZeRO checkpoint.
 *
 * Names carry the (pp, tp) coordinates; the manifest lists each file with its
 * coordinates, element range and (model files) shard geometry, so a checkpoint saved on
 * one mesh (dp x tp x pp, any schedule, ZeRO-1 or not) loads on any other: on the same
 * tensor and pipeline layout each rank reads its own shard, on another the whole model
 * is assembled from the shards and re-sliced. Parameters and optimizer state pass
 * through host views of the device (wf_dev_map), so the files are the same whatever
 * device wrote them.
 *
 * Every function here is collective over the job (target->world) unless it says
 * otherwise, and all ranks return the same status: a failure on one rank (a write
 * error, a checksum mismatch) is agreed on; the failing rank logs what and where, and
 * rank 0 names the failing rank.
 */
#ifndef WF_CKPT_H
#define WF_CKPT_H

#include <stddef.h>

#include "wf_collectives.h"
#include "wf_config.h"
#include "wf_model.h"
#include "wf_optim.h"
#include "wf_runtime.h"

struct wf_data; /* wf_io.h */
/* Elements [lo, hi) of a rank's flat parameter vector held apart at params (a ZeRO-3 shard). */
typedef struct wf_ckpt_part {
  float *params;
  size_t lo, hi;
} wf_ckpt_part;

/* What a checkpoint saves and restores on this rank (everything borrowed). */
typedef struct wf_ckpt_target {
  const wf_config *cfg;
  wf_model *model;           /* this rank's parameters (the full model while tp = pp = 1) */
  wf_optim *optim;           /* this rank's optimizer state (a dp shard under ZeRO-1) */
  bool optim_sharded;        /* the optimizer holds this rank's ZeRO shard: one file per dp rank */
  float *param_shard;        /* ZeRO-3: the parameters of the optimizer's range (the model has no
                              * flat vector then); a resume writes them there alone. NULL = the
                              * model's flat parameters */
  wf_ckpt_part expert_shard; /* ZeRO-3 under expert parallelism: the experts' shard (over
                              * their edp group) beside param_shard (the dense tensors' over
                              * dp); params NULL otherwise */
  wf_comm *dp_comm;      /* this rank's dp group (HSDP: its fsdp group); NULL = one rank alone */
  wf_comm *edp_comm;     /* expert parallelism: the dp ranks holding this rank's experts (its
                          * rank 0 writes them, as dp rank 0 does without); NULL = none */
  int replica, replicas; /* HSDP: this rank's fsdp group and how many (0, 1 without HSDP; 0
                          * reads as 1): replica 0 writes, every replica reads */
  wf_comm *world;        /* every rank of the job; NULL = dp_comm */
  int pp_rank, tp_rank;  /* this rank's pipeline stage and tensor shard (0, 0 = the whole model) */
  struct wf_data *data;  /* the training data: a stream's position is saved and restored
                          * (datastate.c); NULL or another source: none */
  struct wf_ckpt_saver *saver; /* background writes (wf_ckpt_save_async); NULL: none */
} wf_ckpt_target;

/* Before training: when train.checkpoint_dir is set, create it and prove every rank can
 * write there and that one checkpoint fits in its free space; check that train.resume
 * can be honoured. An error stops the job before the first step. */
wf_status wf_ckpt_prepare(const wf_ckpt_target *t);

/* Honour train.resume: "" = fresh start (*step = 0); "auto" = the checkpoint `latest`
 * names in train.checkpoint_dir, or a fresh start when there is none (said once); when
 * `latest` lags (a newer step directory was published after `latest` was last written:
 * the job died between the two), the newest such checkpoint that is complete and whose
 * every file verifies against its manifest, said in one line;
 * otherwise a checkpoint directory (or a checkpoint_dir holding a `latest`). Restores
 * the parameters, the AdamW state and the fp16 loss scaler, re-sliced for this mesh
 * (bit for bit on the mesh that saved it), and sets *step to the last step the
 * checkpoint completed. Refuses a checkpoint of another model shape, naming the config
 * key that differs; a manifest whose model files do not hold the whole model exactly
 * once; and any file that is missing or whose size, checksum or header disagrees with
 * the manifest, naming the file. A data.source stream goes to the saved position (on any
 * dp), or, when the checkpoint has none, starts from its beginning (said once); a
 * position whose files, lanes or tokenizer are not this run's is refused. */
wf_status wf_ckpt_resume(const wf_ckpt_target *t, int *step);

/* Write the checkpoint of `step` (the last completed step) and prune; a background write
 * still under way ends first (wf_ckpt_settle). */
wf_status wf_ckpt_save(const wf_ckpt_target *t, int step);

/* ---- background writes (saver.c) ---------------------------------------------------------
 * train.checkpoint_async: at the step boundary every rank gathers the files it writes into
 * host memory (a snapshot: the parameters and the AdamW state of that step, hashed as they
 * are copied), rank 0 builds the manifest from every rank's record, and training goes on;
 * a thread per rank writes its files into the staging directory, and rank 0's, once every
 * file is there, writes the manifest, publishes the step and `latest`, and prunes, as
 * wf_ckpt_save does. A crash before that leaves `latest` on the previous checkpoint; a
 * staging directory left behind is removed by the next save. One write at a time: a
 * checkpoint that comes due while one is under way on any rank is deferred. A failed
 * write is agreed at the next checkpoint (or the end) and stops the run there. */
typedef struct wf_ckpt_saver wf_ckpt_saver;
wf_status wf_ckpt_saver_new(wf_ckpt_saver **out);
/* Not collective: a write under way is given up (rank 0's stops waiting for the others'
 * files and removes the stage), its thread joined. NULL is fine. */
void wf_ckpt_saver_free(wf_ckpt_saver *s);
/* Snapshot the checkpoint of `step` and start writing it; *deferred when a write is
 * still under way on some rank (nothing done: call again at a later boundary). An error
 * of the previous background write is returned here, agreed. */
wf_status wf_ckpt_save_async(const wf_ckpt_target *t, int step, bool *deferred);
/* Wait for the background write under way to be published (or to fail, agreed); WF_OK at
 * once when none is. */
wf_status wf_ckpt_settle(const wf_ckpt_target *t);

/* ---- a stop's writer (detached.c) --------------------------------------------------------
 * When a launcher ends the job (mpirun: SIGCONT, SIGTERM, then SIGKILL two seconds after the
 * first) and the step and the checkpoint would not fit before the SIGKILL, each rank forks
 * a process in a session of its own, which the launcher's kill does not reach, holding the
 * rank's memory at its last completed step; the rank itself goes on to end with the job.
 * These writers write that step's checkpoint as wf_ckpt_save would, agreeing through the
 * staging directory (no MPI after fork), and world rank 0's publishes it. Each holds
 * wf_ckpt_writers_lock while it runs; wf_ckpt_prepare waits for them. Their lines go to
 * WF_CKPT_WRITERS_LOG in train.checkpoint_dir (mpirun and the terminal may be gone). */
#define WF_CKPT_WRITERS_LOG "stop-writers.log"
/* Not collective: in the forked writer, the host memory of the step `step`; tag is the
 * same on every rank of the job and on none of another job's; pos: this rank's share of
 * the data position (wf_data_state_get of `step`; zeros for a rank that does not carry
 * one), npos long. */
wf_status wf_ckpt_write_detached(const wf_ckpt_target *t, int step, uint64_t tag,
                                 const uint64_t *pos, size_t npos);
/* The shared lock a writer holds (a descriptor, inherited across fork); -1 on failure. */
int wf_ckpt_writers_lock(const char *root);

/* --save's whole model (wf_model_num_params floats, the full layout) into *full on rank 0
 * of the job (malloc'd, the caller frees it; NULL on every other rank). Each rank passes
 * its parameters to rank 0 in bounded chunks: under ZeRO-3 its dp shard (HSDP: fsdp group
 * 0's), so no rank gathers the flat parameters; otherwise dp rank 0 its (pp, tp) shard. */
wf_status wf_ckpt_collect_model(const wf_ckpt_target *t, float **full);

/* Not collective. Resolve the checkpoint named by train.resume (a path), else the one
 * `latest` names in train.checkpoint_dir, into `dir`. */
wf_status wf_ckpt_locate(const wf_config *cfg, char *dir, size_t dir_len);

/* ---- weights (weights.c) ---------------------------------------------------------------
 * The whole model's weights in and out of a job, whatever holds them, in one place: what
 * model.init and --generate read, what --save and --export write. Every format goes
 * through the whole model's flat float32 array (wf_model.h's layout of its family):
 *  - llm.c GPT-2 checkpoints: version 3 (float32) and 5 (bf16), told by the header
 *    (GPT-2 only);
 *  - Hugging Face safetensors (the family's Hugging Face names: GPT2LMHeadModel's,
 *    LlamaForCausalLM's), told by the name's .safetensors or by the header; a sharded
 *    model's .safetensors.index.json; a Hugging Face model folder (config.json and the
 *    weights);
 *  - a weft checkpoint (a directory with a manifest, saved on any mesh), or a
 *    checkpoint directory whose `latest` names one (read only).
 * Not collective; errors are logged where they arise, naming the file. */
typedef enum wf_weights_fmt {
  WF_WEIGHTS_LLMC = 0,    /* "llmc": llm.c version 3, float32 (the default) */
  WF_WEIGHTS_LLMC_BF16,   /* "llmc-bf16": llm.c version 5, rounded to the nearest bf16 */
  WF_WEIGHTS_SAFETENSORS, /* "safetensors": float32 */
} wf_weights_fmt;
/* The format a name ("llmc", "llmc-bf16", "safetensors") stands for; false if none. */
bool wf_weights_fmt_parse(const char *name, wf_weights_fmt *f);
const char *wf_weights_fmt_describe(wf_weights_fmt f);
/* The dims of the model at `path`, which names it in its error messages as `what`
 * (e.g. "model.init"). */
wf_status wf_weights_peek(const char *path, const char *what, wf_model_dims *d);
/* The same, quietly: false when `path` holds no model weft can read (a checkpoint
 * directory whose `latest` or manifest is broken is the exception: its reader logs). */
bool wf_weights_probe(const char *path, wf_model_dims *d);
/* The parameters into full (wf_model_num_params(d) floats); refuses other dims. */
wf_status wf_weights_read(const char *path, const char *what, const wf_model_dims *d, float *full);
/* Elements [lo, hi) of shard s's flat parameter vector into dst (host, hi - lo floats),
 * with every check the whole read makes, and no whole-model array: an llm.c file is
 * read at those elements alone, safetensors a bounded piece of a tensor at a time, a
 * weft checkpoint's files streamed past (all verified), only the range kept. dst NULL
 * checks the range and keeps nothing, each file opened once. */
wf_status wf_weights_read_shard(const char *path, const char *what, const wf_model_dims *d,
                                const wf_model_shard *s, size_t lo, size_t hi, float *dst);
/* Peek and read through, bounded, keeping nothing (wf_weights_read_shard's check of
 * the whole model): everything that can be wrong with the weights, found before a job
 * starts (its dims in *d). */
wf_status wf_weights_check(const char *path, const char *what, wf_model_dims *d);
/* Write a model atomically in format f. Safetensors to a folder (a path ending in '/' or
 * an existing directory) or to a .safetensors.index.json path is a Hugging Face model
 * folder with config.json, sharded above shard_bytes (0: 5 GB, save_pretrained's). */
wf_status wf_weights_write(const char *path, wf_weights_fmt f, const wf_model_dims *d,
                           const float *full, size_t shard_bytes);

/* Not collective. Write the model of checkpoint `dir` (from any mesh) at `out_path` in
 * format f, after verifying every model file's checksum. */
wf_status wf_ckpt_export(const char *dir, const char *out_path, wf_weights_fmt f,
                         size_t shard_bytes);

/* worker --export: the weights the config names - model.init (any format above), else
 * the checkpoint train.resume names (else the latest in train.checkpoint_dir) - written
 * at out_path in format f, without training. The source's path into src. Not
 * collective. */
wf_status wf_weights_export(const wf_config *cfg, const char *out_path, wf_weights_fmt f, char *src,
                            size_t src_len);

#endif /* WF_CKPT_H */
