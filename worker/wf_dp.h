/*
 * wf_dp.h - data parallelism: gradient averaging over the dp group, and the sharded
 * optimizer (ZeRO-1).
 *
 * Plain data parallelism (optim.zero = 0): gradients are averaged with bucketed,
 * non-blocking all-reduces. The model announces during the last micro-batch's
 * backward when each layer's gradients are final (wf_gpt_set_grad_hook); a bucket is
 * launched as soon as all its tensors are final, so communication overlaps the rest
 * of backward. wf_dp_finish() waits for what is still in flight; the time it waits
 * is the gradient communication that was NOT hidden, and the step log shows it.
 *
 * ZeRO-1 (optim.zero = 1): the flat gradient vector is reduce-scattered so each dp
 * rank owns the average of one contiguous shard of ceil(n/dp) elements (the last
 * shard is padded with zeros), runs AdamW on its shard only (so the m and v state
 * per rank is about 1/dp of the model), and the updated shards are all-gathered back
 * into every rank's full parameters.
 *
 * Both paths compute the same mathematics as one rank: the average over dp ranks of
 * per-rank mean gradients is the mean over the global batch.
 */
#ifndef WF_DP_H
#define WF_DP_H

#include <stddef.h>

#include "wf_collectives.h"
#include "wf_model.h"
#include "wf_runtime.h"

typedef struct wf_dp wf_dp;

typedef struct wf_dp_opts {
  wf_comm *comm;       /* the dp group (size 1 is allowed: everything is local) */
  wf_gpt *model;       /* borrowed */
  size_t bucket_bytes; /* optim.bucket_mb; 0 = one bucket per layer */
  int zero;            /* 0 or 1 */
} wf_dp_opts;

typedef struct wf_dp_stats {
  double exposed_ms;           /* time waiting for gradient communication after backward */
  double comm_bytes;           /* bytes reduced this step (per rank) */
  size_t optimizer_bytes;      /* AdamW state held by this rank */
  int buckets, launched_early; /* buckets, and how many started during backward */
} wf_dp_stats;

wf_status wf_dp_create(wf_dp **out, const wf_dp_opts *o);
void wf_dp_destroy(wf_dp *dp); /* accepts NULL */

/* Arm the overlap for the coming backward (the last micro-batch of the step):
 * installs the model's gradient hook. */
void wf_dp_arm(wf_dp *dp);
/* Complete the gradient reduction: afterwards every rank holds the averaged
 * gradients (zero = 0) or the averaged gradient shard (zero = 1). */
wf_status wf_dp_finish(wf_dp *dp);
/* Sum of squares of the gradients this rank counts (wf_gpt_kind_counted), over the
 * dp group (after finish), identical on every dp rank. Summed over the tp and pp
 * groups it is the square of the global gradient norm. */
wf_status wf_dp_grad_sumsq(wf_dp *dp, double *ss);
/* AdamW (per wf_gpt_update's rules) and, under ZeRO-1, the parameter all-gather. */
wf_status wf_dp_update(wf_dp *dp, float lr, float beta1, float beta2, float eps, float weight_decay,
                       float grad_scale, int t);
void wf_dp_get_stats(const wf_dp *dp, wf_dp_stats *out);

/* For checkpoints: the elements [*lo, *hi) of the flat parameter vector whose AdamW
 * state this rank holds ([0, n) without ZeRO), and under ZeRO-1 that state itself,
 * (*hi - *lo) elements each of m and v. Without ZeRO *m = *v = NULL: the model holds
 * the full state (wf_gpt_adam_state). */
void wf_dp_shard_range(const wf_dp *dp, size_t *lo, size_t *hi);
void wf_dp_adam_shard(wf_dp *dp, float **m, float **v);

#endif /* WF_DP_H */
