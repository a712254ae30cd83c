/*
 * config_int.h - private to the config files of runtime/ (config*.c).
 *
 * The config is driven by one table, wf__cfg_keys[]: one row per dotted key with
 * its type, where it lives in struct wf_config, its default (as text, parsed by
 * the same code that parses user input), its range or enum values and a one-line
 * doc. Aliases (the seeds' DistributedConfig names, mesh_shape) resolve to a row
 * of that table or to a special handler that sets several rows at once.
 *
 * Invariants:
 *  - cfg->source[i] belongs to wf__cfg_keys[i]; the table has at most
 *    WF_CONFIG_MAX_KEYS rows (checked at compile time).
 *  - A value is stored only when its source ranks at least as high as the source
 *    that set it last, so the precedence default < preset < file < env < cli
 *    holds whatever order the sources are applied in. WF_SRC_DERIVED ranks lowest:
 *    derived values never block a later explicit setting.
 *  - Every error goes through wf__cfg_fail, which prefixes where the value came
 *    from ("FILE:LINE: ", "environment WEFT_X: ", "command line: ").
 */
#ifndef WF_CONFIG_INT_H
#define WF_CONFIG_INT_H

#include <stddef.h>

#include "wf_config.h"

typedef enum wf__cfg_type {
  WF__CT_INT = 0,
  WF__CT_U64,
  WF__CT_DOUBLE,
  WF__CT_BOOL,
  WF__CT_STRING,
  WF__CT_ENUM,
  WF__CT_INTLIST, /* int array; variable length with a count, or fixed length */
  WF__CT_AXES,    /* mesh axis names: a permutation of dp, tp, pp */
  WF__CT_STRLIST, /* strings of `cap` bytes, at most `items` of them, with a count; a
                   * single value is a list of one */
  WF__CT_DBLLIST, /* doubles, at most `cap`, with a count; a single value is a list of one */
} wf__cfg_type;

/* Key flags. */
enum {
  WF__KF_DERIVED = 1u << 0,   /* computed by validation; cannot be set */
  WF__KF_FIXED_LEN = 1u << 1, /* INTLIST with exactly `cap` entries */
  WF__KF_MIN_OPEN = 1u << 2,  /* the lower bound is exclusive (lr > 0) */
};

typedef struct wf__cfg_enum {
  const char *name; /* the first name of a value is the one printed */
  int value;
} wf__cfg_enum;

typedef struct wf__cfg_key {
  const char *name;
  wf__cfg_type type;
  size_t off;                /* offsetof(wf_config, ...) */
  size_t cap;                /* STRING, STRLIST: buffer size; INTLIST, DBLLIST: max entries */
  size_t items;              /* STRLIST: max entries */
  size_t count_off;          /* INTLIST without FIXED_LEN, STRLIST, DBLLIST: offset of the
                              * int count */
  const char *def;           /* default in the key's own syntax; NULL = derived */
  double min, max;           /* numeric range (per entry for lists), inclusive */
  const wf__cfg_enum *enums; /* ENUM: terminated by a NULL name */
  unsigned flags;
  const char *doc;
} wf__cfg_key;

/* Special handlers for aliases that set more than one key. */
typedef enum wf__cfg_special { WF__SP_NONE = 0, WF__SP_MESH_SHAPE } wf__cfg_special;

/* What a user-given name refers to: a table row or a special handler. */
typedef struct wf__cfg_target {
  int key; /* index into wf__cfg_keys, or -1 for a special */
  wf__cfg_special special;
} wf__cfg_target;

typedef struct wf__cfg_preset {
  const char *name, *family;
  int layers, heads, d_model, seq_len, vocab;
  double lr; /* train.lr for this size (peak learning rate) */
  int kv_heads, ffn;
  double rope_theta;
  int tie;                      /* wf_tie */
  wf_rope_scaling rope_scaling; /* none unless given */
  /* mixture of experts (0: the family's): experts, top-k, head size, wf_switch of
   * norm_topk_prob, router_aux_loss_coef (0: the family's) */
  int experts, experts_per_token, head_dim, norm_topk;
  double aux_coef;
} wf__cfg_preset;

/* Where a value came from, for error messages. */
typedef struct wf__cfg_ctx {
  char *err;
  size_t err_len;
  wf_config_source src;
  const char *file; /* set when loading a file */
  int line;         /* 1-based line in `file` */
  const char *env;  /* the WEFT_ variable, when from the environment */
} wf__cfg_ctx;

extern const wf__cfg_key wf__cfg_keys[];
extern const int wf__cfg_nkeys;
extern const wf__cfg_preset wf__cfg_presets[];
extern const int wf__cfg_npresets;

/* Table look-ups (config_keys.c). */
int wf__cfg_key_index(const char *name);
bool wf__cfg_resolve(const char *name, wf__cfg_target *out);
bool wf__cfg_resolve_env(const char *var, wf__cfg_target *out, const char **name);
bool wf__cfg_env_skipped(const char *var);
const char *wf__cfg_unsupported(const char *name); /* why a seed name is refused, or NULL */
void wf__cfg_suggest(const char *name, bool env, char *out, size_t out_len);
const wf__cfg_preset *wf__cfg_preset_find(const char *name);
bool wf__cfg_target_is_list(wf__cfg_target t);
/* A list key that also takes a single value as a list of one (STRLIST, DBLLIST). */
bool wf__cfg_takes_one(wf__cfg_target t);

/* Writes "<where>: <key>: <message>" into ctx->err and returns WF_ECONFIG. */
wf_status wf__cfg_fail(const wf__cfg_ctx *ctx, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "unknown key 'x'; did you mean 'y'?" */
wf_status wf__cfg_unknown_key(const char *key, const wf__cfg_ctx *ctx);

/* Apply a textual value (command line, environment, defaults): lists are parsed
 * as YAML flow sequences (config_yaml.c). */
wf_status wf__cfg_apply_text(wf_config *cfg, wf__cfg_target t, const char *name, const char *text,
                             wf__cfg_ctx *ctx);

/* Apply one scalar, or a list given as an array of item texts (config.c). Lists of
 * lists only occur in mesh_shape, whose two lists arrive already split (axes NULL
 * for the flat form, which uses the axis names in effect). */
wf_status wf__cfg_set_scalar(wf_config *cfg, wf__cfg_target t, const char *name, const char *text,
                             wf__cfg_ctx *ctx);
wf_status wf__cfg_set_list(wf_config *cfg, wf__cfg_target t, const char *name,
                           const char *const *items, int n, wf__cfg_ctx *ctx);
wf_status wf__cfg_set_mesh_shape(wf_config *cfg, const char *name, const char *const *sizes,
                                 int n_sizes, const char *const *axes, int n_axes,
                                 wf__cfg_ctx *ctx);

/* Range checks shared by parsing and validation (config.c). */
bool wf__cfg_in_range(const wf__cfg_key *k, double v);
void wf__cfg_range_str(const wf__cfg_key *k, char *out, size_t len);   /* ">= 1 and <= 64" */
void wf__cfg_enum_names(const wf__cfg_enum *e, char *out, size_t len); /* "no|fp16|bf16" */

/* V rounded up to a multiple of 128 (llm.c's Vp). */
int wf__cfg_pad_vocab(int vocab);

#endif /* WF_CONFIG_INT_H */
