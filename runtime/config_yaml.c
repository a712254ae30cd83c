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
 *  - Nesting deeper than MAX_NESTING is refused from libyaml's event stream before the
 *    document is built: building a 100k-deep document takes libyaml most of a minute.
 *  - A key given twice (YAML forbids it; libyaml keeps both) is an error naming both
 *    lines, also when one is nested (`train: {steps: 1}`) and the other dotted
 *    (`train.steps: 2`): both name train.steps.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <yaml.h>

#include "config_int.h"

#define MAX_ITEMS   (WF_MAX_STAGES + 1) /* one more than any list may hold */
#define MAX_DEPTH   8                   /* mappings walked as sections */
#define MAX_NESTING 32                  /* mappings and lists, any kind: a config needs 4 */

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

/* A key name the file gave, and where (for duplicates). */
typedef struct seen_key {
  char name[256];
  int line;
} seen_key;

typedef struct walker {
  wf_config *cfg;
  yaml_document_t *doc;
  wf__cfg_ctx *ctx;
  int pass; /* 0: mesh_axis_names only; 1: everything else */
  seen_key *seen;
  int n_seen, cap_seen;
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
  const char *lead = text + strspn(text, " \t");
  if (!wf__cfg_target_is_list(t) || (wf__cfg_takes_one(t) && *lead != '[' && *lead))
    return wf__cfg_set_scalar(cfg, t, name, text, ctx); /* a path, as it is (a glob's '*') */
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

/* Pass 1 remembers every name (sections and keys) with its line; one given before is
 * an error naming both lines. */
static wf_status note_key(walker *w, const char *name, int line)
{
  if (w->pass != 1)
    return WF_OK;
  for (int i = 0; i < w->n_seen; i++)
    if (strcmp(w->seen[i].name, name) == 0)
      return wf__cfg_fail(w->ctx, name,
                          "given twice, on lines %d and %d (YAML does not allow a key twice); "
                          "keep one",
                          w->seen[i].line, line);
  if (w->n_seen == w->cap_seen) {
    int cap = w->cap_seen ? 2 * w->cap_seen : 64;
    seen_key *grown = realloc(w->seen, (size_t)cap * sizeof *grown);
    if (!grown)
      return WF_ENOMEM;
    w->seen = grown;
    w->cap_seen = cap;
  }
  wf_strlcpy(w->seen[w->n_seen].name, name, sizeof w->seen[w->n_seen].name);
  w->seen[w->n_seen++].line = line;
  return WF_OK;
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
    wf_status dup = note_key(w, name, line_of(k));
    if (dup != WF_OK)
      return dup;
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
  if (!root || (root->type == YAML_SCALAR_NODE && root->data.scalar.length == 0))
    return WF_OK; /* an empty document sets nothing (the caller refuses a file that does) */
  if (root->type != YAML_MAPPING_NODE) {
    ctx->line = line_of(root);
    return wf__cfg_fail(ctx, NULL,
                        "the top level must be a mapping of keys to values, "
                        "like `train: {steps: 100}`");
  }
  walker w = {cfg, doc, ctx, 0, NULL, 0, 0};
  wf_status st = walk_mapping(&w, root, "", 0);
  if (st == WF_OK) {
    w.pass = 1;
    st = walk_mapping(&w, root, "", 0);
  }
  free(w.seen);
  return st;
}

/* Read the file's events up to its end or the first nesting deeper than MAX_NESTING,
 * which is refused at once; then rewind for the document loader. */
static wf_status check_nesting(FILE *f, wf__cfg_ctx *ctx)
{
  yaml_parser_t parser;
  yaml_event_t ev;
  wf_status st = WF_OK;
  int depth = 0;
  if (!yaml_parser_initialize(&parser))
    return WF_ENOMEM;
  yaml_parser_set_input_file(&parser, f);
  for (bool done = false; !done && st == WF_OK;) {
    if (!yaml_parser_parse(&parser, &ev))
      break; /* the loader reports the syntax error */
    if (ev.type == YAML_MAPPING_START_EVENT || ev.type == YAML_SEQUENCE_START_EVENT)
      depth++;
    else if (ev.type == YAML_MAPPING_END_EVENT || ev.type == YAML_SEQUENCE_END_EVENT)
      depth--;
    done = ev.type == YAML_STREAM_END_EVENT;
    if (depth > MAX_NESTING) {
      ctx->line = (int)ev.start_mark.line + 1;
      st = wf__cfg_fail(ctx, NULL,
                        "nested more than %d levels deep; a weft config needs at most 4 "
                        "(section, key, list, list)",
                        MAX_NESTING);
    }
    yaml_event_delete(&ev);
  }
  yaml_parser_delete(&parser);
  rewind(f);
  return st;
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

/* The path names a regular file: a directory would read as a YAML error, and a FIFO
 * would block fopen() until someone writes to it. */
static wf_status check_regular(const char *path, char *err, size_t err_len)
{
  struct stat st;
  const char *what = NULL;
  wf_status status = WF_ECONFIG;
  if (stat(path, &st) != 0)
    what = strerror(errno), status = WF_EIO;
  else if (S_ISDIR(st.st_mode))
    what = "it is a directory";
  else if (!S_ISREG(st.st_mode))
    what = "it is not a regular file";
  if (!what)
    return WF_OK;
  if (err && err_len)
    snprintf(err, err_len,
             "--config %s: cannot read the config file: %s; --config takes a YAML file such as "
             "examples/fortunes.yaml",
             path, what);
  return status;
}

wf_status wf_config_load_file(wf_config *cfg, const char *path, char *err, size_t err_len)
{
  wf__cfg_ctx ctx = {.err = err, .err_len = err_len, .src = WF_SRC_FILE, .file = path};
  if (!cfg || !path)
    return WF_EINVAL;
  wf_status st = check_regular(path, err, err_len);
  if (st != WF_OK)
    return st;
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (err && err_len)
      snprintf(err, err_len, "%s: cannot open the config file: %s; check the --config path", path,
               strerror(errno));
    return WF_EIO;
  }
  st = check_nesting(f, &ctx);
  wf_config tmp = *cfg;
  yaml_parser_t parser;
  yaml_document_t doc;
  if (st != WF_OK)
    goto out_file;
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
  if (st == WF_OK && memcmp(&tmp, cfg, sizeof tmp) == 0) {
    /* a file that sets nothing is a mistake (the wrong file, or one not yet written),
     * not a wish to train on the defaults */
    if (err && err_len)
      snprintf(err, err_len,
               "--config %s: the file sets no config key (it is empty, or holds only comments "
               "or empty sections); write keys into it, e.g. `train: {steps: 100}`, or leave "
               "--config out to train on the defaults",
               path);
    st = WF_ECONFIG;
  }
  if (st == WF_OK)
    *cfg = tmp;
  yaml_document_delete(&doc);
out_parser:
  yaml_parser_delete(&parser);
out_file:
  fclose(f);
  return st;
}
