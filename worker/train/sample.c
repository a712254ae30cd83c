/*
 * sample.c - samples from the model: every train.sample_every steps while training, and
 * worker --generate from model.init.
 *
 * A sample is train.sample_tokens tokens drawn one at a time after the prompt
 * (train.sample_prompt, or --generate's; "" starts a document: the tokenizer's
 * wf_tokenizer_bos, GPT-2's <|endoftext|> or Llama 3's <|begin_of_text|>, or a newline
 * byte without a tokenizer). Each draw runs the model's forward pass through the pipeline on
 * the context (the prompt and the tokens drawn so far; its last T tokens once longer),
 * padded to the training length T with token 0: attention is causal, so the padding
 * cannot reach the logits at the context's last position, which are the ones read. Every
 * row of every micro-batch holds the same context, so whichever micro-batch the model
 * kept the logits of holds that row.
 *
 * Any mesh draws the one-rank sample. The last stage's tp ranks of dp rank 0 put their
 * vocabulary slices of the row into a zeroed row of Vp, and a sum over the world gives
 * every rank the whole row (exact: one non-zero term per element). Every rank then draws
 * the same token from the same numbers with wf_sample_token, a pure function of the row,
 * the seed and the draw's index, so no rank waits on another to learn the next token.
 *
 * Text: decoded by data.tokenizer when given, else the ids are bytes, with non-printable
 * bytes written as \xNN (and, on the one-line form the step lines use, \n and \t too);
 * an id the tokenizer (or, without one, a byte) cannot stand for is written <ID>.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_int.h"

#define SAMPLE_STREAM 0x53414d50u /* "SAMP": the draws' RNG stream, apart from init's */

typedef struct cand {
  double logit;
  int id;
} cand;

/* Most likely first; equal logits by the lower id, so the order is total. */
static int by_logit(const void *a, const void *b)
{
  const cand *x = a, *y = b;
  if (x->logit != y->logit)
    return x->logit < y->logit ? 1 : -1;
  return x->id - y->id;
}

int wf_sample_token(const float *logits, int V, int top_k, double temperature, uint64_t seed,
                    uint64_t stream, uint64_t index)
{
  cand *c = malloc((size_t)V * sizeof *c);
  if (!c)
    return -1;
  for (int i = 0; i < V; i++)
    c[i] = (cand){(double)logits[i] / temperature, i};
  qsort(c, (size_t)V, sizeof *c, by_logit);
  int k = top_k > 0 && top_k < V ? top_k : V;
  double total = 0, max = c[0].logit;
  for (int i = 0; i < k; i++) /* softmax over the top k, shifted by their max */
    total += (c[i].logit = exp(c[i].logit - max));
  double u = (double)wf_rng_uniform(seed, SAMPLE_STREAM ^ stream, index) * total, cum = 0;
  int id = c[k - 1].id; /* u * total can round up to the total: the last candidate */
  for (int i = 0; i < k; i++) {
    cum += c[i].logit;
    if (u < cum) {
      id = c[i].id;
      break;
    }
  }
  free(c);
  return id;
}

/* ---- the context ------------------------------------------------------------------------ */

typedef struct context {
  wf__trainer *tr;
  int *ids, n, cap; /* prompt and tokens so far */
} context;

static wf_status push(context *c, int id)
{
  if (c->n == c->cap) {
    int cap = c->cap ? 2 * c->cap : 256;
    int *p = realloc(c->ids, (size_t)cap * sizeof *p);
    if (!p)
      return WF_ENOMEM;
    c->ids = p, c->cap = cap;
  }
  c->ids[c->n++] = id;
  return WF_OK;
}

/* The prompt's ids (tok, else bytes) into c, each checked against the vocabulary V; an
 * empty prompt is the start of a document, and so is every prompt's head under a
 * tokenizer that says so (wf_tokenizer_adds_bos: Llama 3). */
static wf_status prompt_ids(const wf_tokenizer *tok, int V, const char *prompt, context *c,
                            char *err, size_t len)
{
  wf_status st = WF_OK;
  wf_tokens t = {0};
  if (tok && wf_tokenizer_encode(tok, prompt, strlen(prompt), &t) != WF_OK)
    st = WF_ENOMEM;
  size_t n = tok ? t.n : strlen(prompt);
  int bos = tok ? wf_tokenizer_bos(tok) : -1;
  /* Llama 3's prompts start a document, as Meta's generation encodes them */
  size_t lead = tok && n > 0 && bos >= 0 && wf_tokenizer_adds_bos(tok) && t.ids[0] != bos;
  for (size_t i = 0; st == WF_OK && i < n + lead; i++) {
    int id = i < lead ? bos : tok ? t.ids[i - lead] : (unsigned char)prompt[i];
    if (id >= V) {
      snprintf(err, len, "the sample's prompt has %s %d, outside the model's vocabulary of %d: %s",
               tok ? "token" : "byte", id, V,
               tok ? "data.tokenizer is not the model's"
                   : "give bytes below it, or data.tokenizer");
      st = WF_ECONFIG;
    } else {
      st = push(c, id);
    }
  }
  if (st == WF_OK && c->n == 0)
    st = push(c, bos >= 0 && bos < V ? bos : V > '\n' ? '\n' : 0);
  if (st == WF_ENOMEM)
    snprintf(err, len, "out of memory encoding the sample's prompt");
  wf_tokens_free(&t);
  return st;
}

wf_status wf_sample_check(const wf_config *cfg, const char *prompt, int V, char *err, size_t len)
{
  wf_tokenizer *tok = NULL;
  context c = {0};
  wf_status st = WF_OK;
  if (!prompt && cfg->train.sample_every == 0)
    return WF_OK;
  if (cfg->data.tokenizer[0])
    st = wf_tokenizer_load(&tok, cfg->data.tokenizer, err, len);
  if (st == WF_OK && tok)
    st = wf_tokenizer_fits(tok, V, err, len);
  if (st == WF_OK)
    st = prompt_ids(tok, V, prompt ? prompt : cfg->train.sample_prompt, &c, err, len);
  free(c.ids);
  wf_tokenizer_destroy(tok);
  return st;
}

/* The trainer's prompt ids, logged when refused (wf_sample_check said it first). */
static wf_status encode_prompt(context *c, const char *prompt)
{
  wf_status st = WF_OK;
  char err[1024] = "";
  st = prompt_ids(c->tr->tok, c->tr->dims.V, prompt, c, err, sizeof err);
  WF_REFUSE(st == WF_OK, st, "%s", err);
fail:
  return st;
}

/* The batch of every draw: the context's last T tokens in every row, padded with 0; one
 * document (starts 0) where the pipeline carries documents. */
static wf_status context_cb(void *user, int mb, int *inputs, int *targets, int *starts)
{
  context *c = user;
  int T = c->tr->T, first = c->n > T ? c->n - T : 0, len = c->n - first;
  (void)mb;
  for (int b = 0; b < c->tr->B; b++) {
    for (int t = 0; t < T; t++) {
      inputs[b * T + t] = t < len ? c->ids[first + t] : 0;
      targets[b * T + t] = 0;
      if (starts)
        starts[b * T + t] = 0;
    }
  }
  return WF_OK;
}

/* The logits at the context's last position, whole, on every rank. */
static wf_status next_logits(context *c, float *row, bool contribute)
{
  wf_status st = WF_OK;
  wf__trainer *tr = c->tr;
  int Vp = tr->dims.Vp, Vl = Vp / tr->tp, pos = WF_MIN(c->n, tr->T) - 1;
  double loss = 0;
  memset(row, 0, (size_t)Vp * sizeof *row);
  tr->split = WF_DATA_VAL; /* a forward like evaluation's */
  WF_TRY(wf_pipe_forward(tr->pipe, context_cb, c, &loss));
  if (wf_model_get_shard(tr->model)->last && contribute)
    WF_TRY(wf_model_logits_read(tr->model, row + (size_t)wf__comm_rank(tr->tp_comm) * Vl,
                                (size_t)pos * Vl, (size_t)Vl));
  if (tr->world)
    WF_TRY(wf_comm_allreduce(tr->world, row, row, (size_t)Vp, WF_COMM_F32, WF_COMM_SUM));
fail:
  return st;
}

/* ---- text ------------------------------------------------------------------------------- */

/* Text as the terminal should show it: with a tokenizer, whole UTF-8 characters as they
 * are; a byte that starts none (a token may hold part of a character, and a sample may
 * end inside one) is written \xNN, as are control bytes. */
static void put_escaped(FILE *out, const unsigned char *s, size_t n, bool utf8, bool one_line)
{
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = s[i];
    size_t len = utf8 && ch >= 0x80 ? wf_utf8_char_len(s + i, n - i) : 0;
    if (ch == '\n' || ch == '\t')
      one_line ? fprintf(out, "\\%c", ch == '\n' ? 'n' : 't') : fputc(ch, out);
    else if (ch == '\\')
      fputs("\\\\", out);
    else if (ch >= 0x20 && ch < 0x7f)
      fputc(ch, out);
    else if (len > 0)
      fwrite(s + i, 1, len, out), i += len - 1;
    else
      fprintf(out, "\\x%02x", ch);
  }
}

/* The bytes of one id: the tokenizer's, or the byte itself; "<ID>" for an id neither
 * knows (a model's vocabulary may be larger than its tokenizer's, or than 256 without
 * one). */
static size_t id_bytes(const wf__trainer *tr, int id, char *out, size_t cap)
{
  size_t len = 0;
  int32_t one = id;
  if (tr->tok && wf_tokenizer_decode(tr->tok, &one, 1, out, cap, &len) == WF_OK && len <= cap)
    return len;
  if (!tr->tok && id < 256) {
    out[0] = (char)id;
    return 1;
  }
  return (size_t)snprintf(out, cap, "<%d>", id);
}

/* ids[0 .. n) as text on out. */
static wf_status print_text(wf__trainer *tr, FILE *out, const int *ids, int n, bool one_line)
{
  wf_status st = WF_OK;
  enum { MOST = 256 }; /* bytes of one token (GPT-2's longest is 128) */
  size_t len = 0;
  char *buf = NULL;
  WF_CHECK_ALLOC(buf = malloc((size_t)n * MOST + 1));
  for (int i = 0; i < n; i++)
    len += id_bytes(tr, ids[i], buf + len, MOST);
  put_escaped(out, (const unsigned char *)buf, len, tr->tok != NULL, one_line);
fail:
  free(buf);
  return st;
}

static wf_status load_tokenizer(wf__trainer *tr)
{
  wf_status st = WF_OK;
  char err[1024] = "";
  if (tr->tok || !tr->cfg->data.tokenizer[0])
    return WF_OK;
  st = wf_tokenizer_load(&tr->tok, tr->cfg->data.tokenizer, err, sizeof err);
  WF_REFUSE(st == WF_OK, st, "%s", err);
fail:
  return st;
}

wf_status wf__sample(wf__trainer *tr, int step, const char *prompt, int dp_rank, FILE *out)
{
  wf_status st = WF_OK;
  const wf_config *cfg = tr->cfg;
  context c = {.tr = tr};
  float *row = NULL;
  WF_TRY(load_tokenizer(tr));
  WF_TRY(encode_prompt(&c, prompt));
  WF_CHECK_ALLOC(row = malloc((size_t)tr->dims.Vp * sizeof *row));
  int n0 = c.n;
  for (int i = 0; i < cfg->train.sample_tokens; i++) {
    WF_TRY(next_logits(&c, row, dp_rank == 0));
    int id =
        wf_sample_token(row, tr->dims.V, cfg->train.sample_top_k, cfg->train.sample_temperature,
                        cfg->train.sample_seed, (uint64_t)step, (uint64_t)i);
    WF_CHECK(id >= 0, WF_ENOMEM, "out of memory drawing a sample");
    WF_TRY(push(&c, id));
  }
  if (wf_rt_rank() <= 0 && out) {
    bool one_line = step > 0;
    if (one_line)
      fprintf(out, "sample %d/%d: ", step, tr->steps);
    WF_TRY(print_text(tr, out, c.ids, n0, one_line));
    WF_TRY(print_text(tr, out, c.ids + n0, c.n - n0, one_line));
    fputc('\n', out);
    fflush(out);
  }
fail:
  free(c.ids);
  free(row);
  return st;
}

wf_status wf_train_generate(const wf_config *cfg, const char *prompt, const wf_train_hooks *comms)
{
  wf_status st = WF_OK;
  wf__trainer tr;
  wf_train_hooks quiet = wf__quiet_hooks(comms);
  wf_config *one = malloc(sizeof *one);
  if (!one) {
    WF_ERROR("--generate: out of memory");
    return WF_ENOMEM;
  }
  /* One sequence is all a sample needs (training's batch would only repeat it), and no
   * data: the trainer's source is the synthetic one, never read. */
  *one = *cfg;
  one->train.batch_size = 1;
  one->data.path[0] = one->data.val_path[0] = '\0';
  one->data.n_source = one->data.n_mix = 0, one->data.document_mask = false;
  /* Without the dp group: every dp replica runs the whole context (only dp rank 0's
   * logits count), as the debug state does. */
  st = wf__train_setup(&tr, one, &quiet, 1, false);
  if (st == WF_OK)
    st = wf__sample(&tr, 0, prompt, comms && comms->dp ? wf_comm_rank(comms->dp) : 0, stdout);
  wf__train_teardown(&tr);
  free(one);
  return st;
}
