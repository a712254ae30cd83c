/*
 * config_yaml.c - YAML files and YAML-flow values, through libyaml's document API.
 *
 * A file is a tree of mappings. Nested mappings and dotted keys are the same
 * thing: `train: {steps: 10}` and `train.steps: 10` both name train.steps. A
 * mapping whose path is not a key is walked as a section; a scalar or a list is
 * handed to config.c as text (lists as arrays of item texts), so the file, the
 * command line and the environment share one parser per type.
 *
 * Invariants:
 *  - Errors name FILE:LINE (libyaml marks are 0-based; messages are 1-based).
 *  - A file that fails leaves the config untouched: it is loaded into a copy.
 *  - The document is walked twice: first mesh_axis_names only, then the rest, so a
 *    flat mesh_shape uses the axis names of the same file wherever they appear.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <yaml.h>

#include "config_int.h"

#define MAX_ITEMS (WF_MAX_STAGES + 1) /* one more than any list may hold */
#define MAX_DEPTH 8

static const char *scalar(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

static int line_of(const yaml_node_t *n) { return (int)n->start_mark.line + 1; }

/* YAML's null ("", "~", "null") is the empty string for string keys. */
static const char *scalar_text(const yaml_node_t *n)
{
  const char *s = scalar(n);
  if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
      (strcmp(s, "~") == 0 || strcasecmp(s, "null") == 0))
    return "";
  return s;
}

typedef struct walker {
  wf_config *cfg;
  yaml_document_t *doc;
  wf__cfg_ctx *ctx;
  int pass; /* 0: mesh_axis_names only; 1: everything else */
} walker;

static int seq_len(const yaml_node_t *n)
{
  return (int)(n->data.sequence.items.top - n->data.sequence.items.start);
}

static yaml_node_t *seq_item(yaml_document_t *doc, const yaml_node_t *n, int i)
{
  return yaml_document_get_node(doc, n->data.sequence.items.start[i]);
}

/* The texts of a sequence of scalars: at most MAX_ITEMS are filled in, but *n is the
 * real length. Every list consumer rejects a length over its capacity (at most
 * WF_MAX_STAGES) before reading an item, so a longer list gets a clear count. */
static wf_status seq_texts(yaml_document_t *doc, const yaml_node_t *seq, const char *name,
                           const char **items, int *n, wf__cfg_ctx *ctx)
{
  *n = seq_len(seq);
  for (int i = 0; i < WF_MIN(*n, MAX_ITEMS); i++) {
    const yaml_node_t *it = seq_item(doc, seq, i);
    if (ctx->file)
      ctx->line = line_of(it);
    if (it->type != YAML_SCALAR_NODE)
      return wf__cfg_fail(ctx, name, "expected a list of single values, got a nested %s",
                          it->type == YAML_MAPPING_NODE ? "mapping" : "list");
    items[i] = scalar(it);
  }
  return WF_OK;
}

/* mesh_shape as [[sizes], [names]]; anything else is a flat list of sizes. */
static bool is_shape_pair(yaml_document_t *doc, const yaml_node_t *n)
{
  return seq_len(n) == 2 && seq_item(doc, n, 0)->type == YAML_SEQUENCE_NODE &&
         seq_item(doc, n, 1)->type == YAML_SEQUENCE_NODE;
}

static wf_status apply_seq(wf_config *cfg, wf__cfg_target t, const char *name, yaml_document_t *doc,
                           const yaml_node_t *n, wf__cfg_ctx *ctx)
{
  const char *a[MAX_ITEMS], *b[MAX_ITEMS];
  int na = 0, nb = 0;
  if (t.key < 0 && is_shape_pair(doc, n)) {
    if (seq_texts(doc, seq_item(doc, n, 0), name, a, &na, ctx) != WF_OK ||
        seq_texts(doc, seq_item(doc, n, 1), name, b, &nb, ctx) != WF_OK)
      return WF_ECONFIG;
    return wf__cfg_set_mesh_shape(cfg, name, a, na, b, nb, ctx);
  }
  if (!wf__cfg_target_is_list(t))
    return wf__cfg_set_list(cfg, t, name, NULL, 0, ctx); /* reports the type error */
  if (seq_texts(doc, n, name, a, &na, ctx) != WF_OK)
    return WF_ECONFIG;
  return wf__cfg_set_list(cfg, t, name, a, na, ctx);
}

static wf_status apply_node(wf_config *cfg, wf__cfg_target t, const char *name,
                            yaml_document_t *doc, const yaml_node_t *n, wf__cfg_ctx *ctx)
{
  switch (n->type) {
  case YAML_SCALAR_NODE: return wf__cfg_set_scalar(cfg, t, name, scalar_text(n), ctx);
  case YAML_SEQUENCE_NODE: return apply_seq(cfg, t, name, doc, n, ctx);
  default: break;
  }
  if (wf__cfg_target_is_list(t))
    return wf__cfg_fail(ctx, name, "expected a list, got a mapping");
  return wf__cfg_fail(ctx, name, "expected a single value, got a mapping");
}

wf_status wf__cfg_apply_text(wf_config *cfg, wf__cfg_target t, const char *name, const char *text,
                             wf__cfg_ctx *ctx)
{
  if (!wf__cfg_target_is_list(t))
    return wf__cfg_set_scalar(cfg, t, name, text, ctx);
  yaml_parser_t parser;
  yaml_document_t doc;
  wf_status st;
  if (!yaml_parser_initialize(&parser))
    return WF_ENOMEM;
  yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
  if (!yaml_parser_load(&parser, &doc)) {
    st = wf__cfg_fail(ctx, name, "cannot parse '%s' as a YAML list like [1, 3]: %s", text,
                      parser.problem ? parser.problem : "syntax error");
    goto out_parser;
  }
  const yaml_node_t *root = yaml_document_get_root_node(&doc);
  if (!root)
    st = wf__cfg_set_list(cfg, t, name, NULL, 0, ctx);
  else if (root->type == YAML_SCALAR_NODE)
    st = wf__cfg_set_scalar(cfg, t, name, text, ctx); /* reports "expected a list" */
  else
    st = apply_node(cfg, t, name, &doc, root, ctx);
  yaml_document_delete(&doc);
out_parser:
  yaml_parser_delete(&parser);
  return st;
}

/* ---- files ----------------------------------------------------------------------- */

/* Whether some key starts with "name." (so `name:` is a section, not a key). */
static bool is_section(const char *name)
{
  size_t n = strlen(name);
  for (int i = 0; i < wf_config_key_count(); i++) {
    const char *k = wf_config_key_name(i);
    if (strncmp(k, name, n) == 0 && k[n] == '.')
      return true;
  }
  return strcmp(name, "distributed") == 0;
}

static wf_status walk_mapping(walker *w, const yaml_node_t *map, const char *prefix, int depth);

static wf_status walk_value(walker *w, const char *name, const yaml_node_t *v, int depth)
{
  wf__cfg_target t;
  bool known = wf__cfg_resolve(name, &t);
  if (!known && v->type == YAML_MAPPING_NODE && depth < MAX_DEPTH)
    return walk_mapping(w, v, name, depth + 1);
  bool axes = known && t.key == wf_config_key_find("mesh.axis_names");
  if (w->pass == 0)
    return axes ? apply_node(w->cfg, t, name, w->doc, v, w->ctx) : WF_OK;
  if (axes)
    return WF_OK; /* applied in pass 0 */
  if (known)
    return apply_node(w->cfg, t, name, w->doc, v, w->ctx);
  if (is_section(name) && v->type == YAML_SCALAR_NODE && scalar_text(v)[0] == '\0')
    return WF_OK; /* "train:" with nothing under it */
  if (is_section(name))
    return wf__cfg_fail(w->ctx, name,
                        "is a section, not a key; put its keys under it, "
                        "like `train: {steps: 100}`");
  return wf__cfg_unknown_key(name, w->ctx);
}

static wf_status walk_mapping(walker *w, const yaml_node_t *map, const char *prefix, int depth)
{
  for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
    const yaml_node_t *k = yaml_document_get_node(w->doc, p->key);
    const yaml_node_t *v = yaml_document_get_node(w->doc, p->value);
    w->ctx->line = line_of(k);
    if (k->type != YAML_SCALAR_NODE || scalar(k)[0] == '\0')
      return wf__cfg_fail(w->ctx, NULL, "a key must be a plain name like train.steps");
    char name[256];
    int n = snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", scalar(k));
    if (n >= (int)sizeof name)
      return wf__cfg_fail(w->ctx, NULL, "key '%.40s...' is too long", name);
    if (v->type != YAML_MAPPING_NODE)
      w->ctx->line = line_of(v);
    wf_status st = walk_value(w, name, v, depth);
    if (st != WF_OK)
      return st;
  }
  return WF_OK;
}

static wf_status load_doc(wf_config *cfg, yaml_document_t *doc, wf__cfg_ctx *ctx)
{
  const yaml_node_t *root = yaml_document_get_root_node(doc);
  if (!root)
    return WF_OK; /* an empty file sets nothing */
  if (root->type != YAML_MAPPING_NODE) {
    ctx->line = line_of(root);
    return wf__cfg_fail(ctx, NULL,
                        "the top level must be a mapping of keys to values, "
                        "like `train: {steps: 100}`");
  }
  walker w = {cfg, doc, ctx, 0};
  wf_status st = walk_mapping(&w, root, "", 0);
  if (st != WF_OK)
    return st;
  w.pass = 1;
  return walk_mapping(&w, root, "", 0);
}

static wf_status syntax_error(const yaml_parser_t *p, wf__cfg_ctx *ctx)
{
  ctx->line = (int)p->problem_mark.line + 1;
  if (p->context)
    return wf__cfg_fail(ctx, NULL, "YAML syntax error: %s (%s, line %d)",
                        p->problem ? p->problem : "invalid YAML", p->context,
                        (int)p->context_mark.line + 1);
  return wf__cfg_fail(ctx, NULL, "YAML syntax error: %s", p->problem ? p->problem : "invalid YAML");
}

wf_status wf_config_load_file(wf_config *cfg, const char *path, char *err, size_t err_len)
{
  wf__cfg_ctx ctx = {.err = err, .err_len = err_len, .src = WF_SRC_FILE, .file = path};
  if (!cfg || !path)
    return WF_EINVAL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (err && err_len)
      snprintf(err, err_len, "%s: cannot open the config file: %s; check the --config path", path,
               strerror(errno));
    return WF_EIO;
  }
  wf_status st = WF_OK;
  wf_config tmp = *cfg;
  yaml_parser_t parser;
  yaml_document_t doc;
  if (!yaml_parser_initialize(&parser)) {
    st = WF_ENOMEM;
    goto out_file;
  }
  yaml_parser_set_input_file(&parser, f);
  if (!yaml_parser_load(&parser, &doc)) {
    st = syntax_error(&parser, &ctx);
    goto out_parser;
  }
  st = load_doc(&tmp, &doc, &ctx);
  if (st == WF_OK)
    *cfg = tmp;
  yaml_document_delete(&doc);
out_parser:
  yaml_parser_delete(&parser);
out_file:
  fclose(f);
  return st;
}
