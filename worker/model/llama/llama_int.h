/*
 * llama_int.h - private to the Llama family (llama.c: its description; block.c: its
 * compute): its tensors' indices in the description and its compute table.
 */
#ifndef WF_LLAMA_INT_H
#define WF_LLAMA_INT_H

#include "model_int.h"

/* The tensors, in layout order: the description's indices. The head is last, so a tied
 * model (no head: it reads the embedding) keeps every other index. */
enum {
  LL_EMB = 0, /* (Vp, C) embed_tokens */
  LL_LN1W,    /* (L, C) input_layernorm */
  LL_QKVW,    /* (L, NH hs + 2 KV hs, C) [q | k | v] */
  LL_OW,      /* (L, C, NH hs) o_proj */
  LL_LN2W,    /* (L, C) post_attention_layernorm */
  LL_GUW,     /* (L, 2F, C) [gate | up] */
  LL_DOWNW,   /* (L, C, F) down_proj */
  LL_NORMW,   /* (C) the final norm */
  LL_HEAD,    /* (Vp, C) lm_head: absent when tied */
  LL_N
};

extern const wf__family_ops wf__llama_ops;

#endif /* WF_LLAMA_INT_H */
