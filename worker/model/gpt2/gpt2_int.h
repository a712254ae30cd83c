/*
 * gpt2_int.h - private to the GPT-2 family (gpt2.c: its description; block.c: its
 * compute): its tensors' indices in the description and its compute table.
 */
#ifndef WF_GPT2_INT_H
#define WF_GPT2_INT_H

#include "model_int.h"

/* The tensors, in llm.c's checkpoint order: the description's indices. */
enum {
  G_WTE = 0,  /* (Vp, C) tied to the head */
  G_WPE,      /* (maxT, C) */
  G_LN1W,     /* (L, C) */
  G_LN1B,     /* (L, C) */
  G_QKVW,     /* (L, 3C, C) */
  G_QKVB,     /* (L, 3C) */
  G_ATTPROJW, /* (L, C, C) */
  G_ATTPROJB, /* (L, C) */
  G_LN2W,     /* (L, C) */
  G_LN2B,     /* (L, C) */
  G_FCW,      /* (L, 4C, C) */
  G_FCB,      /* (L, 4C) */
  G_FCPROJW,  /* (L, C, 4C) */
  G_FCPROJB,  /* (L, C) */
  G_LNFW,     /* (C) */
  G_LNFB,     /* (C) */
  G_N
};

extern const wf__family_ops wf__gpt2_ops;

#endif /* WF_GPT2_INT_H */
