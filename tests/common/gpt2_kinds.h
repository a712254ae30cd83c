/*
 * gpt2_kinds.h - GPT-2's tensors as the tests state them on their own: llm.c's
 * checkpoint order (train_gpt2.c's ParameterTensors), which the GPT-2 family's
 * description must follow (test_model checks it, name by name), so a test can address a
 * tensor by its llm.c place without reading the model's description.
 */
#ifndef WF_TEST_GPT2_KINDS_H
#define WF_TEST_GPT2_KINDS_H

#include <stdbool.h>

typedef int wf_param_kind;

enum {
  WF_P_WTE = 0,  /* (Vp, C) */
  WF_P_WPE,      /* (maxT, C) */
  WF_P_LN1W,     /* (L, C) */
  WF_P_LN1B,     /* (L, C) */
  WF_P_QKVW,     /* (L, 3C, C) */
  WF_P_QKVB,     /* (L, 3C) */
  WF_P_ATTPROJW, /* (L, C, C) */
  WF_P_ATTPROJB, /* (L, C) */
  WF_P_LN2W,     /* (L, C) */
  WF_P_LN2B,     /* (L, C) */
  WF_P_FCW,      /* (L, 4C, C) */
  WF_P_FCB,      /* (L, 4C) */
  WF_P_FCPROJW,  /* (L, C, 4C) */
  WF_P_FCPROJB,  /* (L, C) */
  WF_P_LNFW,     /* (C) */
  WF_P_LNFB,     /* (C) */
  WF_GPT_NUM_KINDS
};

static inline bool gpt2_layered(int k)
{
  return k != WF_P_WTE && k != WF_P_WPE && k != WF_P_LNFW && k != WF_P_LNFB;
}

static inline const char *gpt2_name(int k)
{
  static const char *const names[WF_GPT_NUM_KINDS] = {
      "wte",  "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb",
      "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb"};
  return k >= 0 && k < WF_GPT_NUM_KINDS ? names[k] : "?";
}

#endif /* WF_TEST_GPT2_KINDS_H */
