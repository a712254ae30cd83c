/*
 * model_int.h - private to worker/model: the model's struct, its activation slots, the
 * family's compute table, the helpers both families' blocks are built from, and the
 * types the safetensors codec's three files share.
 *
 * Error idiom (the worker's): every function that can fail returns a wf_status, logs
 * what failed where it failed, and callers propagate with WF_TRY / goto fail. Kernel
 * launches report through wf_dev_check(), which the forward and backward passes call
 * before they return.
 *
 * Memory: every tensor here is memory of the model's device (wf_device.h): reached by
 * kernels and collectives only; the host reads and writes it through staged views.
 *
 * Legend: B batch, T time, C d_model, L layers, NH heads, hs = C/NH, V vocab, Vp padded
 * vocab, N = B*T rows, R = rows of the replicated regions (N, or N/tp under sequence
 * parallelism), nl = layers in a slot.
 */
#ifndef WF_MODEL_INT_H
#define WF_MODEL_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "storage.h"
#include "wf_check.h"
#include "wf_device.h"
#include "wf_model.h"

/* ---- carving one allocation into tensors ------------------------------------------- */

/* One tensor to carve: where its pointer goes, its elements, whether it is an
 * activation (stored in the model's format, storage.h) or fp32 (statistics, scratch
 * that accumulates, tokens), and whether it is attention's core state, which selective
 * recompute drops from the slot and rebuilds before backward. */
typedef struct wf__carve_item {
  void **p;
  size_t n;
  bool act;
  bool core;
} wf__carve_item;
#define WF__F32(ptr, count)                                                                        \
  {                                                                                                \
    (void **)(ptr), (count), false, false                                                          \
  }
#define WF__ACT(ptr, count)                                                                        \
  {                                                                                                \
    (void **)(ptr), (count), true, false                                                           \
  }
#define WF__CORE(ptr, count)                                                                       \
  {                                                                                                \
    (void **)(ptr), (count), false, true                                                           \
  }

/* Where items go: the core items into `core`, the others into `mem` (either NULL: just
 * count), each 64-byte aligned, activations fmt's elements; the floats (4-byte units)
 * the non-core items take, and those of the core items in *core_floats (may be NULL). */
typedef struct wf__carve_to {
  void *mem, *core;
  int fmt;
} wf__carve_to;
size_t wf__carve(const wf__carve_item *t, size_t n, const wf__carve_to *to, size_t *core_floats);

/* ---- geometry ------------------------------------------------------------------------ */

/* The sizes every carve is made of, from the model's options alone: the resolved dims,
 * tp, the micro-batch (B x T, N = B*T rows, R replicated rows), local heads, local
 * vocabulary rows, the activations' storage format (the model's precision; 16 bits
 * under mixed precision) and the kernels of that format, whose attention sizes apply. */
typedef struct wf__geo {
  wf_model_dims d;
  size_t B, T, N, R, C, tp, Vl;
  size_t cp; /* context-parallel ranks (1: none); T is this rank's rows per sequence */
  size_t ep; /* expert-parallel ranks (1: none) */
  bool docs; /* slots keep document starts and positions */
  int NHl, KVl;
  int fmt;
  const wf_kset *k;
} wf__geo;

/* A layer's saved activations: the items kept in the slot, and attention's core state
 * (beside them, or in the shared core buffer under selective recompute); and what the
 * layer keeps in the slot whatever the recompute (`keep`: a router's statistics, which
 * the stage adds up before any backward). */
typedef struct wf__layer_mem {
  void *saved, *core;
  float *keep;
} wf__layer_mem;

/* ---- activations ------------------------------------------------------------------ */

/* Activations of one micro-batch in one slot, for one chunk's layers, carved from one
 * allocation sized for Bmax x Tmax. A layer's saved intermediates are the family's
 * (family ops' layer_floats each, `saved`; with attention's core state unless selective
 * recompute drops it); every layer's output (the residual stream entering the next) is
 * `out`; the head's norm is the family's (`head`), its logits and loss are the engine's.
 * Activations (void *) are stored in the model's format (storage.h), the rest fp32. */
typedef struct wf__slot {
  void *encoded;                /* (R,C) the stage's input */
  float *saved;                 /* (nl, layer_floats) */
  void *out;                    /* (nl,R,C) */
  float *head;                  /* (head_floats): last stage */
  void *logits;                 /* (N,Vp/tp): last stage; dlogits after backward */
  float *row_max, *row_sumexp;  /* (N) global over the vocabulary */
  float *target_logit, *losses; /* (N) */
  int *inputs, *targets;        /* (N) this micro-batch's tokens */
  float *keep;                  /* (lc, keep_floats) what each layer keeps (wf__layer_mem) */
  int *starts, *pos;            /* (N) its document starts and positions (docs models) */
  bool has_docs;                /* this micro-batch came with starts */
  int B, T, chunk;
  bool live;         /* forward done, backward not */
  bool have_targets; /* computed a loss, so backward may run */
} wf__slot;

/* Scratch shared by all slots: one layer's worth, reused layer after layer. fp32 but
 * for rdy; `full` holds an activation (in its format) or a gradient. */
typedef struct wf__dacts {
  float *proj;   /* (N,C) row-parallel partial output (tp > 1; else ysum takes it) */
  float *ysum;   /* (R,C) its sum over tp, which the residual stream then stores */
  float *full;   /* (N,C) a gathered input or output gradient (sequence parallelism) */
  float *dres;   /* (N,C) gradient of the residual stream (R rows used) */
  float *dc;     /* (N,C) partial input gradient of a column-parallel matmul (tp > 1; else
                  * dl takes it) */
  float *dl;     /* (N,C) a norm's output gradient after the tp reduction (R rows) */
  float *stats;  /* (tp+1,N,3) every rank's packed xent row statistics, then this rank's */
  void *rdy;     /* (N,C) the residual stream's gradient in the activation format for a
                  * GEMM (16-bit formats; empty at fp32, where GEMMs read it in place) */
  float *fam;    /* (scratch_floats) the family's backward scratch */
  float *consts; /* (const_floats) the family's tables, written once (RoPE's angles) */
  float *side;   /* (side_floats) the side band of the micro-batch backward runs: its
                  * statistics summed over every stage (wf__family_ops.side_floats) */
} wf__dacts;

/* ---- a family's compute ------------------------------------------------------------- */

/* What a family computes, in the model's own memory. Sizes are floats (4-byte units) for
 * geometry g. `mem` is one layer's intermediates. A block's forward reads x (R,C) and
 * writes y (R,C), both activations; its backward finds d y in m->da.dres and leaves d x
 * there, adding into the parameter gradients. The head reads the last layer's output x
 * and ends in the loss (wf__head_loss_forward); its backward leaves d x in m->da.dres.
 * The embedding writes a->encoded from a->inputs; its backward reads m->da.dres. The
 * memory plan is the family's: what a layer and the head save for backward (carved
 * with wf__carve, activations in the model's format), backward's scratch and its
 * constant tables (wf_model_mem_plan adds them up). core_forward rebuilds a layer's
 * attention core state (selective recompute) from what the slot kept.
 * Every op computes through m->k, the kernels of the model's storage format: a family
 * has one code path for every precision. */
/* The normalisation a family's blocks and head use (prenorm.c). */
typedef enum wf__norm_kind { WF__LAYERNORM, WF__RMSNORM } wf__norm_kind;

typedef struct wf__family_ops {
  /* the kernel ops the family calls (wf_kreg.h), checked at set-up for the model's
   * element type and device */
  const wf_op_id *kernels;
  int n_kernels;
  wf__norm_kind norm;
  /* floats of one layer's saved activations besides attention's core state, and those
   * of the core state (*core) */
  size_t (*layer_floats)(const wf__geo *g, size_t *core);
  size_t (*head_floats)(const wf__geo *g);
  size_t (*scratch_floats)(const wf__geo *g);
  /* tables the family computes with and never changes (0: none), filled by prepare once
   * the model is allocated (NULL: nothing to fill) */
  size_t (*const_floats)(const wf__geo *g);
  wf_status (*prepare)(wf_model *m);
  wf_status (*embed_forward)(wf_model *m, wf__slot *a);
  wf_status (*embed_backward)(wf_model *m, wf__slot *a);
  wf_status (*block_forward)(wf_model *m, wf__layer_mem mem, const void *x, void *y, int l, int B,
                             int T);
  wf_status (*core_forward)(wf_model *m, wf__layer_mem mem, int l, int B, int T);
  wf_status (*block_backward)(wf_model *m, wf__layer_mem mem, const void *x, int l, int B, int T);
  wf_status (*head_forward)(wf_model *m, wf__slot *a, const void *x);
  wf_status (*head_backward)(wf_model *m, wf__slot *a, const void *x, float dloss);
  /* A family whose layers couple across the whole model (a load-balancing loss over every
   * layer's routing) keeps per-layer statistics in the slot (keep_floats per layer) and
   * carries their running sums across stages as a side band: side_floats floats that
   * follow the activations in every stage input, output and gradient message. At the end
   * of a chunk's forward side_forward writes its output's side band (its input's plus
   * the chunk's layers'); the first chunk's input starts from zeros. Backward finds the
   * whole model's sums in m->da.side. All NULL or 0: none. */
  size_t (*keep_floats)(const wf__geo *g);
  size_t (*side_floats)(const wf__geo *g);
  wf_status (*side_forward)(wf_model *m, wf__slot *a);
} wf__family_ops;

struct wf_model {
  wf_model_dims d; /* resolved */
  const wf_family *fam;
  const wf__family_ops *ops;
  wf_model_desc desc;
  wf_model_shard s;
  wf_dev *dev;      /* borrowed */
  const wf_kset *k; /* the device's kernels for the model's storage format */
  wf_tp_regions tp; /* the region operators (ops NULL: identity) */
  wf_cp_regions cp; /* context parallelism's attention (ops NULL: the device's kernels) */
  wf_ep_regions ep; /* the experts' exchange (ops NULL: every expert local) */
  bool sequence;    /* sequence parallelism is on (tp > 1) */
  int nl;           /* layers on this rank: v chunks of lc layers */
  int nchunk, lc;
  int NHl, KVl, Vl; /* local heads, local kv heads, local vocabulary rows */
  int Bmax, Tmax, n_slots, in_use, peak;
  size_t num_params;              /* local */
  size_t off[WF_MAX_TENSORS + 1]; /* local offset of each tensor; [n] = total */
  size_t layer_floats;            /* one layer's saved intermediates (without the core state) */
  size_t core_floats;             /* attention's core state of one layer */
  size_t slot_floats;
  wf__geo g; /* the carves' sizes */
  float *params, *grads;
  wf_precision prec; /* the activations' storage format: WF_PREC_NO = fp32, or bf16/fp16 */
  size_t esize;      /* bytes of one activation element */
  void *wlow;        /* mixed precision: the 16-bit copy of the parameters, else NULL */
  float loss_scale;  /* backward's loss gradient is multiplied by it (fp16 loss scaling) */
  float dloss;       /* the running backward's loss gradient scale: dloss_scale x loss_scale
                      * (what a family's losses outside the head are scaled by) */
  float *act_mem, *dact_mem;
  double *loss_acc; /* (1) the sum of micro-batch losses since wf_model_take_loss */
  double *aux_acc;  /* (3) the sums of the auxiliary losses (wf_model_take_aux) */
  float *stats;     /* (nl, keep_floats) the layers' kept statistics since wf_model_take_stats */
  size_t keep_floats, side_floats; /* the family's per layer and per stage message */
  int *bad_token;                  /* (2) wf_tokens_check's answer */
  wf__slot *a;                     /* n_slots */
  int *host_pos;                   /* docs models: (Bmax Tmax) positions made on the host */
  /* The micro-batch whose blocks run now (set by the engine for each forward and
   * backward): its document starts and positions on the device, NULL when it has none */
  const int *mb_starts, *mb_pos;
  void *inbox_mem; /* the spare stage inputs' allocation */
  void **inbox;    /* n_inbox: spare stage inputs (each a slot's input, or one of
                    * inbox_mem's: forwards trade them, see wf_model_stage_inbox) */
  int n_inbox;
  wf_recompute recompute; /* full: slots keep layer outputs only; selective: no core state */
  float *re_saved;        /* full: one layer's intermediates; selective: one core state */
  wf__dacts da;
  size_t dres_n; /* elements of da.dres the last backward left: its stage input's gradient */
  wf_model_grad_hook hook; /* told when each group of gradients is final (dp overlap) */
  void *hook_user;
  /* ZeRO-2: where each (tensor, local layer) gradient lives instead of `grads`
   * (WF_MAX_TENSORS x gstride entries, NULL = in `grads`); see wf_model_set_grad_tensor */
  float **gptr;
  float **pptr; /* ZeRO-3: the same for the parameters (wf_model_set_param_tensor) */
  void **lptr;  /* ZeRO-3 with mixed precision: a GEMM weight's 16-bit copy, else NULL */
  int gstride;
  wf_model_unit_hook unit_hook; /* ZeRO-3: told before each layer's forward and backward */
  void *unit_user;
};

/* ---- shared across the model's files --------------------------------------------- */

/* layout.c: local layer i (chunk-major) <-> global layer l, and the shard geometry the
 * initialisation walks row by row: local tensor (t, layer) as `rows` rows of `cols`
 * elements; local row i is a run of full row full_row(i), from column col0, of a full
 * row of full_cols elements. */
int wf__global_layer(const wf_model *m, int i);
int wf__local_layer(const wf_model *m, int l);
typedef struct wf__geom {
  size_t rows, cols, full_cols, col0;
} wf__geom;
wf__geom wf__tensor_geom(const wf_model_dims *d, const wf_tensor_desc *t, const wf_model_shard *s);
size_t wf__full_index(const wf_model_dims *d, const wf_tensor_desc *t, const wf_model_shard *s,
                      const wf__geom *g, size_t i);
bool wf__tensor_present(const wf_tensor_desc *t, const wf_model_shard *s);

/* model.c: the slot's layer j intermediates (or the shared recompute buffers), the
 * residual entering local layer j (j = lc: the chunk's output), GEMM weights (their
 * 16-bit copy under mixed precision), and the residual stream's fp32 gradient (N, C) in
 * the activation format for a GEMM (stored into da.rdy; itself at fp32). */
wf__layer_mem wf__layer_saved(const wf_model *m, const wf__slot *a, int j);
void *wf__layer_input(const wf_model *m, const wf__slot *a, int j);
const void *wf__gemm_weight(wf_model *m, int t, int layer);
const void *wf__res_grad(wf_model *m, const float *dy, size_t N);
/* The chunk of slot work: whether it holds the embeddings / the head. */
bool wf__chunk_first(const wf_model *m, int c);
bool wf__chunk_last(const wf_model *m, int c);
/* The side band of a stage message (input, output or gradient) x of a B x T micro-batch:
 * after its activations, at the next 64-byte boundary; NULL when the family has none. */
float *wf__side(const wf_model *m, const void *x, int B, int T);
/* Real (non-padding) vocabulary columns in this rank's slice. */
int wf__local_real_vocab(const wf_model *m);
/* Rows of the replicated regions for N tokens: N, or N / tp with sequence parallelism. */
size_t wf__rows(const wf_model *m, size_t N);

/* ops.c: the region operators (through m->tp, the identity without it), and the
 * pieces of a Megatron block both families share. */
wf_status wf__enter_fwd(wf_model *m, const void **out, const void *x, void *full, size_t N,
                        size_t C);
wf_status wf__enter_bwd(wf_model *m, float *dx, float *dfull, size_t N, size_t C);
wf_status wf__leave_fwd(wf_model *m, float *y, float *partial, size_t N, size_t C);
wf_status wf__leave_bwd(wf_model *m, const float **out, const float *dy, float *full, size_t N,
                        size_t C);
wf_status wf__zero(wf_model *m, float *p, size_t n);
/* n floats summed over tp in place (the identity without tensor parallelism). */
wf_status wf__tp_sum(wf_model *m, float *x, size_t n);
/* Where a row-parallel branch's fp32 partial output (N, C) lands before leaving the tp
 * region (wf__leave_fwd into da.ysum): da.proj under tensor parallelism, else da.ysum. */
float *wf__partial(wf_model *m);
/* Row-parallel matmul of the activation x (N, IC) by weight tensor w of layer l: the
 * partial product in fp32 (with bias tensor b, -1 none, added on tp rank 0 only so the
 * sum adds it once), then leaving the tp region: the sum, fp32 (rows(N), C), in
 * m->da.ysum, for the residual stream to add and store. */
wf_status wf__row_parallel(wf_model *m, const void *x, int w, int b, int l, int N, int IC);
/* Column-parallel matmul backward from the full input x (N, C): dout (N, OC) in the
 * activation format (as GELU's, SwiGLU's and attention's backward write it, or the
 * logits' gradient written in place); weight w, bias b (-1 none) gradients are added to;
 * the input gradient, summed over tp by entering's backward, lands in m->da.dl (rows(N),
 * C). */
wf_status wf__column_backward(wf_model *m, const void *dout, const void *x, int w, int b, int l,
                              int N, int OC);
/* The vocabulary-parallel head after the family's final norm xn (rows(N), C, an
 * activation): logits of this rank's vocabulary slice by weight tensor w, and with
 * targets the mean cross-entropy, combined over tp, added to the loss sum. */
wf_status wf__head_loss_forward(wf_model *m, wf__slot *a, const void *xn, int w);
/* Its backward: the logits become their gradient (loss gradient dloss / N per position
 * times the loss scale), then the column-parallel backward through w: d xn in m->da.dl. */
wf_status wf__head_loss_backward(wf_model *m, wf__slot *a, const void *xn, int w, float dloss);

/* The embedding (first chunk): this rank's vocabulary rows of token table wte, plus
 * position table wpe (-1: none; added on tp rank 0 only) leaving the tp region into
 * a->encoded; its backward: the residual gradient leaves the tp region and lands in
 * wte's rows and in wpe. */
wf_status wf__embed_forward(wf_model *m, wf__slot *a, int wte, int wpe);
wf_status wf__embed_backward(wf_model *m, wf__slot *a, int wte, int wpe);

/* Attention, wherever it runs: the device's kernels on this rank's whole sequences, or
 * context parallelism's (m->cp), whose core state is the rows' log-sum-exp (B, NH, T)
 * and whose scratch is its own. Sizes in floats for local heads NH of q width Cq;
 * NKV 0 selects the multi-head kernels (GPT-2), else grouped-query ones. Backward reads
 * the forward's output (context parallelism needs it; the kernels do not). */
size_t wf__attention_saved(const wf__geo *g, int Cq, int NH);
size_t wf__attention_scratch(const wf__geo *g, int Cq, int NH);
wf_status wf__attention_forward(wf_model *m, void *out, void *att, const void *qkv, int B, int T,
                                int Cq, int NH, int NKV);
wf_status wf__attention_backward(wf_model *m, void *dqkv, float *scratch, const void *dout,
                                 const void *qkv, const void *att, const void *out, int B, int T,
                                 int Cq, int NH, int NKV);
/* RoPE on the rows' global positions (context parallelism's two chunks each start at
 * their own position), in place on qkv's q and k heads; backward likewise on dqkv. */
void wf__rope_forward(wf_model *m, void *qkv, int B, int T, int hs);
void wf__rope_backward(wf_model *m, void *dqkv, int B, int T, int hs);

/* ---- safetensors (safetensors.c: mapping, names, writer; safetensors_read.c: reader;
 * safetensors_dims.c: a file's dimensions) ---- */

#define WF_ST_MAX_FILES 4096 /* a sharded model's files */

/* One Hugging Face tensor against the flat array: rows x cols of weft's layout from
 * `off` (a row group of a tensor, or all of it), the file's shape. */
typedef struct wf__st_spec {
  char name[128];
  int ndim;
  int64_t shape[2]; /* the file's shape (transposed: (cols, rows)) */
  bool transpose;
  size_t off; /* first element in `full` */
  size_t rows, cols;
  int tensor;
} wf__st_spec;

/* One open safetensors file and its parsed header. */
typedef struct wf__st_file {
  const char *path;
  int fd;
  uint64_t size, data_start; /* file size; first byte after the header */
  struct json_t *header;
} wf__st_file;

typedef enum wf__st_dtype { DT_F32 = 0, DT_BF16, DT_F16 } wf__st_dtype;

/* One header entry, checked against the file. */
typedef struct wf__st_tinfo {
  wf__st_dtype dt;
  int ndim;
  int64_t shape[4];
  uint64_t begin, end; /* byte range in the data section */
} wf__st_tinfo;

/* A model's files: one, or a sharded model's (the index's weight_map names each
 * tensor's); opened on first use. */
typedef struct wf__st_source {
  const char *path; /* what the caller named */
  const wf_family *fam;
  struct json_t *index; /* the weight_map, or NULL for one file */
  wf__st_file files[WF_ST_MAX_FILES];
  char names[WF_ST_MAX_FILES][WF_PATH_MAX];
  int n;
} wf__st_source;

/* The error idiom of the codec: the message into err (or logged when err is NULL). */
wf_status wf__st_fail(char *err, size_t len, wf_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool wf__st_ends_with(const char *s, const char *suffix);
void wf__st_dir_of(char *out, size_t len, const char *path);
/* The mapping (safetensors.c). */
size_t wf__st_numel(const wf__st_spec *s);
bool wf__st_plain(const wf__st_spec *s);
size_t wf__st_largest(const wf__st_spec *s, int n);
wf__st_spec *wf__st_alloc_specs(const wf_model_dims *d, wf_model_dims *r, wf_model_desc *desc,
                                int *n);
void wf__st_from_file(const wf__st_spec *s, const float *f, float *w);
double wf__st_json_num(struct json_t *v);
void wf__st_field_set(wf_model_dims *d, wf_hf_field f, double x);
/* The files (safetensors_read.c). */
wf_status wf__st_src_open(wf__st_source **out, const char *path, char *err, size_t len);
void wf__st_src_close(wf__st_source *s);
wf_status wf__st_src_file(wf__st_source *s, const char *file, wf__st_file **out, char *err,
                          size_t len);
struct json_t *wf__st_src_find(wf__st_source *s, const char *name, wf__st_file **f, char *err,
                               size_t len);
wf_status wf__st_parse_info(const wf__st_file *f, const char *name, struct json_t *t,
                            wf__st_tinfo *ti, char *err, size_t len);

/* The families (gpt2/, llama/). */
/* prenorm.c: the pre-norm residual sublayer and the normalised head, shared by the
 * families (the file's comment walks through a sublayer). A norm is its tensors (weight
 * w, bias b, -1 none: RMSNorm has none) and what its forward saved: its output (R, C) in
 * the activation format, LayerNorm's means (R, NULL under RMSNorm) and the rstds (R). */
typedef struct wf__norm {
  int w, b;
  void *out;
  float *mean, *rstd;
} wf__norm;
/* A sublayer's way in: n->out = norm(x), or with res, res = x + da.ysum (the previous
 * sublayer's output) and n->out = norm(res) in one op; then into the tp region: *xin is
 * what the sublayer reads (N, C). */
wf_status wf__prenorm_forward(wf_model *m, const wf__norm *n, const void **xin, void *res,
                              const void *x, int l, int N);
/* Its way out, backward: the residual stream's gradient out of the tp region, and the
 * backward of the row-parallel product (weight w, bias b, -1 none) that ended it, whose
 * input was x (N, IC): the weight's and bias's gradients, and x's into dx (N, IC) in the
 * activation format. */
wf_status wf__row_parallel_backward(wf_model *m, void *dx, const void *x, int w, int b, int l,
                                    int N, int IC);
/* Its way in, backward: the column-parallel product (w, b, OC outputs) that began it from
 * its output gradient dout (N, OC) and n->out re-gathered, then the norm's backward from
 * its input x into da.dres. */
wf_status wf__prenorm_backward(wf_model *m, const wf__norm *n, const void *dout, int w, int b,
                               int OC, const void *x, int l, int N);
/* The norm's backward alone: da.dres gets the gradient of its input x (R rows) from da.dl. */
void wf__norm_backward(wf_model *m, const wf__norm *n, const void *x, int l, int R);
/* The head: the final norm (w, b) of the stage output x, the logits of tensor `head` and
 * the loss; backward back to da.dres. Its saved state is wf__head_floats in the slot. */
size_t wf__head_floats(const wf__geo *z);
wf_status wf__head_forward(wf_model *m, wf__slot *a, const void *x, int w, int b, int head);
wf_status wf__head_backward(wf_model *m, wf__slot *a, const void *x, int w, int b, int head,
                            float dloss);

/* A config's model keys (family.c): the message in err (err NULL: none), WF_ECONFIG; the
 * rules of a family with neither experts nor a head size of its own (a check_keys). */
wf_status wf__keys_fail(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
wf_status wf__family_dense_keys(const wf_config *c, char *err, size_t len);

extern const wf_family wf__family_gpt2;
extern const wf_family wf__family_llama;
extern const wf_family wf__family_olmoe;
extern const wf_family wf__family_qwen3_moe;
extern const wf_family wf__family_mixtral;

#endif /* WF_MODEL_INT_H */
