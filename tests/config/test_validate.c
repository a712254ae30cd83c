/*
 * test_validate.c - every rule of wf_config_validate, once where it holds and once
 * where it is broken, asserting that the message names the keys and the values.
 *
 * Configs are built with wf_config_set (source cli) from the gpt2-tiny defaults:
 * layers 4, heads 4, d_model 64, seq_len 64, vocab 256, batch 8, microbatches 1.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "wf_config.h"
#include "wf_model.h"

typedef struct case_ {
  wf_config cfg;
  char err[1024];
} case_;

/* Defaults plus "key=value" settings, NULL-terminated. */
static void build(case_ *t, const char *const *kv)
{
  wf_config_init(&t->cfg);
  for (; kv && *kv; kv++) {
    char key[128];
    const char *eq = strchr(*kv, '=');
    assert_non_null(eq);
    snprintf(key, sizeof key, "%.*s", (int)(eq - *kv), *kv);
    if (wf_config_set(&t->cfg, key, eq + 1, WF_SRC_CLI, t->err, sizeof t->err) != WF_OK)
      fail_msg("set %s: %s", *kv, t->err);
  }
}

static wf_status check(case_ *t, int world)
{
  t->err[0] = '\0';
  return wf_config_validate(&t->cfg, world, t->err, sizeof t->err);
}

/* The config must validate against `world`. */
#define GOOD(world, ...)                                                                           \
  do {                                                                                             \
    case_ t;                                                                                       \
    const char *kv[] = {__VA_ARGS__, NULL};                                                        \
    build(&t, kv);                                                                                 \
    if (check(&t, world) != WF_OK)                                                                 \
      fail_msg("expected OK, got: %s", t.err);                                                     \
  } while (0)

/* The config must fail against `world` with a message containing `sub`. */
#define BAD(world, sub, ...)                                                                       \
  do {                                                                                             \
    case_ t;                                                                                       \
    const char *kv[] = {__VA_ARGS__, NULL};                                                        \
    build(&t, kv);                                                                                 \
    assert_int_equal(check(&t, world), WF_ECONFIG);                                                \
    if (!strstr(t.err, sub))                                                                       \
      fail_msg("error '%s' lacks '%s'", t.err, sub);                                               \
  } while (0)

static void test_defaults_are_valid(void **state)
{
  case_ t;
  build(&t, NULL);
  assert_int_equal(check(&t, 0), WF_OK);
  assert_int_equal(check(&t, 1), WF_OK);
  assert_int_equal(check(&t, 8), WF_OK); /* dp = 8, batch 8 splits as 1 per rank */
}

static void test_nodes_times_procs(void **state)
{
  GOOD(8, "dist.num_nodes=2", "dist.procs_per_node=4");
  GOOD(0, "dist.num_nodes=2", "dist.procs_per_node=4", "dist.world_size=8");
  BAD(8, "dist.num_nodes=2 x dist.procs_per_node=3 = 6 processes, but the job has 8 ranks",
      "dist.num_nodes=2", "dist.procs_per_node=3");
  BAD(0, "dist.world_size=8 but dist.num_nodes=2 x dist.procs_per_node=3 = 6", "dist.num_nodes=2",
      "dist.procs_per_node=3", "dist.world_size=8");
  /* Only one of the two given: nothing to check. */
  GOOD(8, "dist.num_nodes=3");
}

static void test_world_size_matches_launcher(void **state)
{
  GOOD(4, "dist.world_size=4");
  BAD(8, "dist.world_size=4 but the job has 8 ranks", "dist.world_size=4");
}

static void test_rank_below_world(void **state)
{
  GOOD(8, "dist.rank=7");
  BAD(8, "dist.rank=8 is not below the world size 8; ranks run from 0 to 7", "dist.rank=8");
  /* Without a launcher world, dist.world_size is the world. */
  BAD(0, "dist.rank=4 is not below the world size 4", "dist.rank=4", "dist.world_size=4");
  GOOD(8, "dist.local_rank=3", "dist.num_nodes=2", "dist.procs_per_node=4");
  BAD(8, "dist.local_rank=4 is not below dist.procs_per_node=4", "dist.local_rank=4",
      "dist.num_nodes=2", "dist.procs_per_node=4");
}

static void test_mesh_product(void **state)
{
  GOOD(8, "mesh.dp=2", "mesh.tp=2", "mesh.pp=2");
  BAD(8, "mesh.dp=2 x mesh.tp=2 x mesh.pp=3 = 12, but the world size is 8", "mesh.dp=2",
      "mesh.tp=2", "mesh.pp=3");
  BAD(8, "leave mesh.dp unset (0) to derive it", "mesh.dp=1", "mesh.tp=2", "mesh.pp=2");
}

static void test_dp_derived(void **state)
{
  case_ t;
  const char *kv[] = {"mesh.tp=2", "mesh.pp=2", NULL};
  build(&t, kv);
  assert_int_equal(check(&t, 8), WF_OK);
  assert_int_equal(t.cfg.mesh.dp, 2); /* 8 / (2 * 2) */
  assert_int_equal(t.cfg.source[wf_config_key_find("mesh.dp")], WF_SRC_DERIVED);
  /* Validating again derives again: a changed tp gives a new dp, not a conflict. */
  assert_int_equal(wf_config_set(&t.cfg, "mesh.tp", "4", WF_SRC_CLI, t.err, sizeof t.err), WF_OK);
  assert_int_equal(check(&t, 8), WF_OK);
  assert_int_equal(t.cfg.mesh.dp, 1);
  BAD(8,
      "mesh.tp=3 x mesh.pp=1 = 3 does not divide the world size 8, so mesh.dp cannot be "
      "derived",
      "model.heads=3", "model.d_model=96", "mesh.tp=3");
}

static void test_world_zero_skips_world_rules(void **state)
{
  case_ t;
  const char *kv[] = {"mesh.tp=2", "mesh.pp=2", NULL};
  build(&t, kv);
  assert_int_equal(check(&t, 0), WF_OK);
  assert_int_equal(t.cfg.mesh.dp, 0); /* not derived: the world is unknown */
  GOOD(0, "mesh.dp=3", "mesh.tp=2", "train.batch_size=6");
}

static void test_padded_vocab_and_seq_len_derived(void **state)
{
  case_ t;
  const char *kv[] = {"model.vocab=50257", "model.seq_len=128", NULL};
  build(&t, kv);
  assert_int_equal(check(&t, 1), WF_OK);
  assert_int_equal(t.cfg.model.padded_vocab, 50304); /* ceil(50257 / 128) * 128 */
  assert_int_equal(t.cfg.train.seq_len, 128);        /* 0 means model.seq_len */
  assert_int_equal(t.cfg.source[wf_config_key_find("train.seq_len")], WF_SRC_DERIVED);
}

static void test_d_model_divisible_by_heads(void **state)
{
  GOOD(1, "model.heads=8", "model.d_model=64");
  BAD(1, "model.d_model=64 is not divisible by model.heads=3", "model.heads=3");
}

static void test_tp_divides_heads_d_model_vocab(void **state)
{
  GOOD(2, "mesh.tp=2");
  /* heads 4 are not divisible by tp 8 although d_model 64 is. */
  BAD(8, "mesh.tp=8 does not divide model.heads=4", "mesh.tp=8");
  /* tp 3 divides heads 6 and d_model 96 but not the padded vocabulary 256. */
  BAD(3, "mesh.tp=3 does not divide the padded vocabulary 256 (model.vocab=256", "model.heads=6",
      "model.d_model=96", "mesh.tp=3");
  /* tp | heads and heads | d_model imply tp | d_model, so the d_model rule is a guard
   * that no config passing the two rules before it can reach. */
}

static void test_pp_at_most_layers(void **state)
{
  GOOD(4, "mesh.pp=4");
  BAD(8, "mesh.pp=8 is more than model.layers=4", "mesh.pp=8");
}

static void test_pp_layers(void **state)
{
  GOOD(2, "mesh.pp=2", "parallel.pp_layers=[1,3]");
  BAD(2, "parallel.pp_layers has 3 entries but mesh.pp=2", "mesh.pp=2",
      "parallel.pp_layers=[1,1,2]");
  BAD(2, "parallel.pp_layers adds up to 3 layers but model.layers=4", "mesh.pp=2",
      "parallel.pp_layers=[1,2]");
  /* Entries below 1 are refused when set, and by validation when built directly. */
  case_ t;
  build(&t, NULL);
  assert_int_equal(
      wf_config_set(&t.cfg, "parallel.pp_layers", "[0,4]", WF_SRC_CLI, t.err, sizeof t.err),
      WF_ECONFIG);
  assert_non_null(strstr(t.err, "parallel.pp_layers: 0 is out of range; it must be >= 1"));
  t.cfg.mesh.pp = 2;
  t.cfg.parallel.n_pp_layers = 2;
  t.cfg.parallel.pp_layers[0] = 0;
  t.cfg.parallel.pp_layers[1] = 4;
  assert_int_equal(check(&t, 2), WF_ECONFIG);
  assert_non_null(strstr(t.err, "parallel.pp_layers[0]=0 is out of range"));
}

static void test_interleaved(void **state)
{
  GOOD(2, "train.schedule=interleaved", "mesh.pp=2", "parallel.virtual_stages=2",
       "train.microbatches=2");
  BAD(2, "train.schedule=interleaved needs parallel.virtual_stages >= 2 (it is 1)",
      "train.schedule=interleaved", "mesh.pp=2", "train.microbatches=2");
  BAD(2, "model.layers=6 is not divisible by mesh.pp=2 x parallel.virtual_stages=2 = 4",
      "train.schedule=interleaved", "model.layers=6", "mesh.pp=2", "parallel.virtual_stages=2",
      "train.microbatches=2");
  BAD(2, "train.microbatches=1 is not a multiple of mesh.pp=2", "train.schedule=interleaved",
      "mesh.pp=2", "parallel.virtual_stages=2");
  BAD(1, "parallel.virtual_stages=2 only applies to train.schedule=interleaved",
      "parallel.virtual_stages=2");
  GOOD(4, "train.schedule=interleaved", "mesh.pp=2", "parallel.virtual_stages=2",
       "train.microbatches=2", "optim.zero=1");
  /* ZeRO-2/3 compose with it: buckets end with their model chunk (zero.c) */
  GOOD(4, "train.schedule=interleaved", "mesh.pp=2", "parallel.virtual_stages=2",
       "train.microbatches=2", "optim.zero=2");
  GOOD(4, "train.schedule=interleaved", "mesh.pp=2", "parallel.virtual_stages=2",
       "train.microbatches=2", "optim.zero=3");
}

static void test_batch_and_microbatches(void **state)
{
  GOOD(4, "train.batch_size=8", "train.microbatches=2"); /* 2 per dp rank, 2 mb of 1 */
  BAD(4, "train.batch_size=10 is not divisible by mesh.dp=4; use a multiple of 4",
      "train.batch_size=10");
  BAD(2,
      "train.microbatches=3 does not divide the per-dp batch 4 (train.batch_size=8 / "
      "mesh.dp=2)",
      "train.microbatches=3");
  /* Unknown world: the per-rank batch is the whole batch. */
  BAD(0, "train.microbatches=3 does not divide the per-dp batch 8", "train.microbatches=3");
}

static void test_seq_len(void **state)
{
  GOOD(1, "train.seq_len=32");
  BAD(1, "train.seq_len=128 is more than model.seq_len=64", "train.seq_len=128");
  GOOD(2, "parallel.sequence=true", "mesh.tp=2");
  BAD(4, "train.seq_len=62 is not divisible by it", "parallel.sequence=true", "mesh.tp=4",
      "train.seq_len=62");
}

static void test_positive_values(void **state)
{
  /* Values assembled without wf_config_set (e.g. received as bytes) get the table's
   * ranges from validation. */
  static const struct {
    const char *msg;
    size_t off;
  } cases[] = {
      {"train.steps=0 is out of range; it must be >= 1", offsetof(wf_config, train.steps)},
      {"model.heads=0 is out of range", offsetof(wf_config, model.heads)},
      {"model.layers=0 is out of range", offsetof(wf_config, model.layers)},
      {"train.batch_size=0 is out of range", offsetof(wf_config, train.batch_size)},
      {"train.microbatches=0 is out of range", offsetof(wf_config, train.microbatches)},
      {"mesh.tp=0 is out of range", offsetof(wf_config, mesh.tp)},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    case_ t;
    build(&t, NULL);
    *(int *)((char *)&t.cfg + cases[i].off) = 0;
    assert_int_equal(check(&t, 0), WF_ECONFIG);
    if (!strstr(t.err, cases[i].msg))
      fail_msg("error '%s' lacks '%s'", t.err, cases[i].msg);
  }
  case_ t;
  build(&t, NULL);
  t.cfg.train.lr = 0;
  assert_int_equal(check(&t, 0), WF_ECONFIG);
  assert_non_null(strstr(t.err, "train.lr=0 is out of range; it must be > 0"));
  BAD(1, "train.min_lr=0.1 is above train.lr=0.01", "train.lr=0.01", "train.min_lr=0.1");
  BAD(1, "train.trace_steps=[5, 3] ends before it starts", "train.trace_steps=[5,3]");
  BAD(1, "train.eval_every=50 but train.eval_batches=0", "train.eval_batches=0");
  GOOD(1, "train.eval_batches=0", "train.eval_every=0");
}

static void test_ports(void **state)
{
  GOOD(1, "dist.master_port=29500", "runtime.metrics_port=9100");
  case_ t;
  build(&t, NULL);
  assert_int_equal(
      wf_config_set(&t.cfg, "runtime.metrics_port", "65536", WF_SRC_CLI, t.err, sizeof t.err),
      WF_ECONFIG);
  assert_non_null(strstr(t.err, "runtime.metrics_port: 65536 is out of range"));
  t.cfg.dist.master_port = -5;
  assert_int_equal(check(&t, 0), WF_ECONFIG);
  assert_non_null(strstr(t.err, "dist.master_port=-5 is out of range; it must be >= 0 and "
                                "<= 65535"));
  BAD(1, "dist.master_port and runtime.metrics_port are both 9000", "dist.master_port=9000",
      "runtime.metrics_port=9000");
}

/* Context parallelism: the world is dp x tp x pp x cp, a sequence is 2cp chunks, and
 * what cannot run split over cp is refused with the key to change. */
static void test_cp(void **state)
{
  GOOD(4, "mesh.cp=2", "mesh.tp=2", "model.seq_len=64");
  GOOD(8, "mesh.cp=2", "mesh.tp=2", "mesh.pp=2", "model.seq_len=64", "model.layers=2");
  GOOD(4, "mesh.cp=4", "model.seq_len=64", "parallel.cp_mode=allgather");
  BAD(4, "mesh.tp=1 x mesh.pp=1 x mesh.cp=3 = 3 does not divide the world size 4", "mesh.cp=3",
      "model.seq_len=60");
  BAD(4, "mesh.dp=4 x mesh.tp=1 x mesh.pp=1 x mesh.cp=2 = 8, but the world size is 4", "mesh.dp=4",
      "mesh.cp=2", "model.seq_len=64");
  /* 2 x cp = 8 chunks of a 60-token sequence */
  BAD(4, "train.seq_len=60 is not divisible by 8", "mesh.cp=4", "model.seq_len=60");
  /* 36 tokens over cp 2 are 18 per rank, which tp 4's sequence parallelism cannot split */
  BAD(8, "does not divide them; use a seq_len divisible by cp x tp = 8", "mesh.cp=2", "mesh.tp=4",
      "parallel.sequence=true", "model.seq_len=36");
  BAD(4, "mesh.cp=2 cannot run with HSDP", "mesh.cp=2", "mesh.fsdp=2", "optim.zero=1",
      "model.seq_len=64");
  BAD(2, "train.sample_every=5 generates from whole sequences", "mesh.cp=2", "train.sample_every=5",
      "model.seq_len=64");
}

static void test_zero_is_0_to_3(void **state)
{
  GOOD(2, "optim.zero=1");
  GOOD(2, "optim.zero=2");
  GOOD(2, "optim.zero=3");
  GOOD(2, "optim.zero=3", "precision=bf16");
  BAD(2, "optim.zero=2 shards over the data-parallel ranks (dp x cp), but mesh.dp=1",
      "optim.zero=2", "mesh.tp=2");
  GOOD(2, "optim.zero=2", "mesh.cp=2"); /* ZeRO shards over dp x cp */
  BAD(4, "mesh.fsdp=3 does not divide mesh.dp=4", "mesh.fsdp=3", "optim.zero=1");
  BAD(4, "optim.zero=0 shards nothing; set optim.zero=1, 2 or 3", "mesh.fsdp=2", "optim.zero=0");
  GOOD(4, "mesh.fsdp=2", "optim.zero=2");
  /* HSDP checkpoints: fsdp group 0 writes a dp = 2 run's files */
  GOOD(4, "mesh.fsdp=2", "optim.zero=3", "train.checkpoint_dir=/tmp/weft-validate-hsdp");
  GOOD(4, "mesh.fsdp=2", "optim.zero=1", "train.resume=/tmp/weft-validate-hsdp");
  case_ t;
  build(&t, NULL);
  t.cfg.optim.zero = 4;
  assert_int_equal(check(&t, 0), WF_ECONFIG);
  assert_non_null(strstr(t.err, "optim.zero=4 is out of range; it must be >= 0 and <= 3"));
  build(&t, NULL);
  t.cfg.precision = (wf_precision)7;
  assert_int_equal(check(&t, 0), WF_ECONFIG);
  assert_non_null(strstr(t.err, "precision=7 is not one of no|fp16|bf16"));
}

/* An fsdp axis (or mesh.fsdp) shards the parameters, as the seeds and JAX mean it:
 * optim.zero becomes 3 (derived) unless it is given; one dp rank shards nothing. */
static void test_fsdp_axis_means_zero3(void **state)
{
  (void)state;
  int zk = wf_config_key_find("optim.zero");
  const struct {
    const char *shape;
    int world;
    const char *zero; /* NULL: not given */
    int want, want_dp, want_fsdp;
  } cases[] = {
      {"[[2, 2], [data, fsdp]]", 4, NULL, 3, 4, 2}, /* HSDP: 2 replicas of 2 */
      {"[[4, 1], [fsdp, tp]]", 4, NULL, 3, 4, 0},   /* seed 001: FSDP over dp */
      {"[[4, 1], [fsdp, tp]]", 4, "1", 1, 4, 0},    /* optim.zero says otherwise */
      {"[[1, 1], [fsdp, tp]]", 1, NULL, 0, 1, 0},   /* one rank: nothing to shard */
      {"[[2, 2], [dp, tp]]", 4, NULL, 0, 2, 0},     /* no fsdp axis */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    case_ t;
    build(&t, NULL);
    assert_int_equal(
        wf_config_set(&t.cfg, "mesh_shape", cases[i].shape, WF_SRC_FILE, t.err, sizeof t.err),
        WF_OK);
    if (cases[i].zero)
      assert_int_equal(
          wf_config_set(&t.cfg, "optim.zero", cases[i].zero, WF_SRC_CLI, t.err, sizeof t.err),
          WF_OK);
    if (check(&t, cases[i].world) != WF_OK)
      fail_msg("%s: %s", cases[i].shape, t.err);
    assert_int_equal(t.cfg.optim.zero, cases[i].want);
    assert_int_equal(t.cfg.mesh.dp, cases[i].want_dp);
    assert_int_equal(t.cfg.mesh.fsdp, cases[i].want_fsdp);
    assert_int_equal(t.cfg.source[zk] == WF_SRC_DERIVED, !cases[i].zero && cases[i].want == 3);
  }
}

/* Loss scaling is fp16's: its keys are refused for bf16 and fp32 (they would do
 * nothing), and the dynamic scale's start and window with a fixed scale. */
static void test_loss_scale_needs_fp16(void **state)
{
  GOOD(1, "precision=bf16");
  GOOD(1, "mixed_precision=fp16", "optim.loss_scale=1024");
  GOOD(1, "precision=fp16", "optim.loss_scale_init=4096", "optim.loss_scale_window=100");
  BAD(1, "optim.loss_scale is set but precision=bf16: loss scaling applies only to precision=fp16",
      "precision=bf16", "optim.loss_scale=1024");
  BAD(1, "optim.loss_scale_window is set but precision=no", "optim.loss_scale_window=10");
  BAD(1, "optim.loss_scale_init is set but optim.loss_scale=1024 is a fixed scale",
      "precision=fp16", "optim.loss_scale=1024", "optim.loss_scale_init=4096");
}

/* RoPE scaling: the Llama presets carry their checkpoints' published values; GPT-2 has
 * no RoPE; a llama3 scaling outside Hugging Face's rules is refused, 0 = Llama 3.1's. */
static void test_rope_scaling(void **state)
{
  static const struct {
    const char *preset;
    wf_rope_scaling want;
  } presets[] = {{"llama-tiny", {WF_ROPE_NONE, 0, 0, 0, 0}},
                 {"llama-1b", {WF_ROPE_LLAMA3, 32, 1, 4, 8192}},
                 {"llama-8b", {WF_ROPE_LLAMA3, 8, 1, 4, 8192}}};
  for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
    case_ t;
    char kv[64];
    snprintf(kv, sizeof kv, "model.preset=%s", presets[i].preset);
    build(&t, (const char *const[]){kv, NULL});
    const wf_rope_scaling *got = &t.cfg.model.rope_scaling, *w = &presets[i].want;
    assert_int_equal(got->rope_type, w->rope_type);
    assert_true(got->factor == w->factor && got->low_freq_factor == w->low_freq_factor &&
                got->high_freq_factor == w->high_freq_factor);
    assert_int_equal(got->original_max_position_embeddings, w->original_max_position_embeddings);
  }
  GOOD(1, "model.preset=llama-tiny", "model.rope_scaling.rope_type=llama3");
  GOOD(1, "model.preset=llama-1b", "model.rope_scaling.factor=16");
  BAD(1, "GPT-2 has no rotary embeddings", "model.rope_scaling.rope_type=llama3");
  BAD(1, "factor must be at least 1", "model.preset=llama-tiny",
      "model.rope_scaling.rope_type=llama3", "model.rope_scaling.factor=0.5");
  BAD(1, "high_freq_factor must exceed its low_freq_factor", "model.preset=llama-tiny",
      "model.rope_scaling.rope_type=llama3", "model.rope_scaling.low_freq_factor=4");
  wf_rope_scaling r = wf_rope_scaling_resolve(&(wf_rope_scaling){WF_ROPE_LLAMA3, 0, 2, 0, 0});
  assert_true(r.factor == 8 && r.low_freq_factor == 2 && r.high_freq_factor == 4);
  assert_int_equal(r.original_max_position_embeddings, 8192);
  r = wf_rope_scaling_resolve(&(wf_rope_scaling){WF_ROPE_NONE, 8, 1, 4, 8192});
  assert_true(r.factor == 0 && r.original_max_position_embeddings == 0); /* none: all zero */
}

/* data.source: one path or a list (a glob's '*' as it is), weights and text keys one per
 * source, nothing beside data.path; the list values themselves as the table parses them. */
static void test_stream_keys(void **state)
{
  case_ t;
  GOOD(1, "data.source=web/*.jsonl.zst");
  GOOD(1, "data.source=[a.jsonl, b.jsonl.zst]", "data.mix=[0.7, 0.3]", "data.field=content");
  GOOD(1, "data.source=[a.jsonl, b.jsonl]", "data.field=[text, body]");
  const char *kv[] = {"data.source=*.jsonl", "data.mix=2.5", NULL};
  build(&t, kv);
  assert_int_equal(t.cfg.data.n_source, 1);
  assert_string_equal(t.cfg.data.source[0], "*.jsonl"); /* not a YAML alias */
  assert_int_equal(t.cfg.data.n_mix, 1);
  assert_true(t.cfg.data.mix[0] == 2.5);
  assert_int_equal(t.cfg.data.n_field, 1);
  assert_string_equal(t.cfg.data.field[0], "text"); /* the default */
  BAD(1, "data.source (1 JSON Lines source) and data.path='x.txt' both name the training data",
      "data.source=a.jsonl", "data.path=x.txt");
  BAD(1, "data.mix has 1 weight but data.source has 2 sources", "data.source=[a.jsonl, b.jsonl]",
      "data.mix=1");
  BAD(1, "data.mix is set but data.source is empty", "data.mix=[1]");
  BAD(1, "data.field has 2 names but data.source has 3 sources",
      "data.source=[a.jsonl, b.jsonl, c.jsonl]", "data.field=[text, body]");
  BAD(1, "a data.source stream has no end to hold out", "data.source=a.jsonl",
      "data.val_fraction=0.2");
  char err[512];
  wf_config_init(&t.cfg);
  assert_int_equal(wf_config_set(&t.cfg, "data.mix", "[1, 0]", WF_SRC_CLI, err, sizeof err),
                   WF_ECONFIG);
  assert_non_null(strstr(err, "data.mix: 0 is out of range; it must be > 0"));
  assert_int_equal(wf_config_set(&t.cfg, "data.mix", "[1, nan]", WF_SRC_CLI, err, sizeof err),
                   WF_ECONFIG);
  assert_non_null(strstr(err, "expected a number, got 'nan'"));
}

/* The model's rules on the model keys (worker/model's wf_model_config_check, in
 * rule_model's place): the family's name, GPT-2's fixed shape, the keys a dense family
 * has not, the MoE families' expert keys; and no validation without those rules. */
static void test_family_keys(void **state)
{
  case_ t;
  BAD(1,
      "model.family=gtp2 is not a model family weft knows; use one of gpt2, llama, olmoe, "
      "qwen3_moe, mixtral",
      "model.family=gtp2");
  GOOD(1, "model.kv_heads=4", "model.ffn=256"); /* GPT-2's own: heads 4, 4 x d_model 64 */
  BAD(1, "model.kv_heads=2: GPT-2 has no grouped-query attention", "model.kv_heads=2");
  BAD(1, "model.ffn=128: GPT-2's MLP is 4 x d_model = 256 wide", "model.ffn=128");
  BAD(1, "model.tie_embeddings=false: GPT-2 ties its head", "model.tie_embeddings=false");
  GOOD(1, "model.preset=llama-tiny", "model.kv_heads=2", "model.ffn=128");
  BAD(1, "model.experts=4: model.family=gpt2 has no experts", "model.experts=4");
  BAD(0, "mesh.ep=2: model.family=llama has no experts", "model.preset=llama-tiny", "mesh.ep=2");
  BAD(1, "model.head_dim=32: model.family=gpt2's heads are d_model / heads = 16 wide",
      "model.head_dim=32");
  GOOD(2, "model.preset=olmoe-tiny", "mesh.ep=2");
  BAD(1, "model.experts_per_token=5 is more than model.experts=4", "model.preset=olmoe-tiny",
      "model.experts=4", "model.experts_per_token=5");
  BAD(2, "mesh.ep=2 does not divide model.experts=3", "model.preset=mixtral-tiny",
      "model.experts=3", "mesh.ep=2");
  BAD(1, "model.head_dim=33: RoPE needs an even head size", "model.preset=qwen3-moe-tiny",
      "model.head_dim=33");
  BAD(2, "mesh.cp=2 with model.family=olmoe: the routers' load-balancing statistics",
      "model.preset=olmoe-tiny", "mesh.cp=2");
  build(&t, NULL);
  wf_config_set_model_check(NULL);
  assert_int_equal(check(&t, 1), WF_EINVAL);
  wf_config_set_model_check(wf_model_config_check);
  assert_non_null(strstr(t.err, "no model check"));
  assert_int_equal(check(&t, 1), WF_OK);
}

static void test_deterministic_and_untouched_on_failure(void **state)
{
  case_ a, b;
  const char *kv[] = {"mesh.tp=3", "model.heads=6", "model.d_model=96", NULL};
  build(&a, kv);
  build(&b, kv);
  wf_config before = a.cfg;
  assert_int_equal(check(&a, 8), WF_ECONFIG);
  assert_int_equal(check(&b, 8), WF_ECONFIG);
  assert_string_equal(a.err, b.err);
  assert_memory_equal(&a.cfg, &before, sizeof before);
}

int main(void)
{
  /* the model's rules on the model.* keys, as the worker's main sets them */
  wf_config_set_model_check(wf_model_config_check);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults_are_valid),
      cmocka_unit_test(test_family_keys),
      cmocka_unit_test(test_nodes_times_procs),
      cmocka_unit_test(test_world_size_matches_launcher),
      cmocka_unit_test(test_rank_below_world),
      cmocka_unit_test(test_mesh_product),
      cmocka_unit_test(test_dp_derived),
      cmocka_unit_test(test_world_zero_skips_world_rules),
      cmocka_unit_test(test_padded_vocab_and_seq_len_derived),
      cmocka_unit_test(test_d_model_divisible_by_heads),
      cmocka_unit_test(test_tp_divides_heads_d_model_vocab),
      cmocka_unit_test(test_pp_at_most_layers),
      cmocka_unit_test(test_pp_layers),
      cmocka_unit_test(test_interleaved),
      cmocka_unit_test(test_batch_and_microbatches),
      cmocka_unit_test(test_seq_len),
      cmocka_unit_test(test_positive_values),
      cmocka_unit_test(test_ports),
      cmocka_unit_test(test_zero_is_0_to_3),
      cmocka_unit_test(test_cp),
      cmocka_unit_test(test_fsdp_axis_means_zero3),
      cmocka_unit_test(test_loss_scale_needs_fp16),
      cmocka_unit_test(test_rope_scaling),
      cmocka_unit_test(test_stream_keys),
      cmocka_unit_test(test_deterministic_and_untouched_on_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
