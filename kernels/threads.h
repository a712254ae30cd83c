/*
 * threads.h - the kernels' thread budget (their loops and GEMMs share it).
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/threads.c; the CUDA twin has the same arguments plus a stream.
 */
#ifndef WF_KERNELS_THREADS_H
#define WF_KERNELS_THREADS_H

#include <stddef.h>
#include <stdint.h>

/* Thread budget (n >= 1; smaller is taken as 1) for the kernels' parallel loops and
 * GEMMs. One pool (the kernels' own; workers spin ~0.4 ms after a task, then sleep)
 * runs both: OpenBLAS is pinned to one thread per call and large GEMMs are split
 * across the pool, so no two thread pools compete for the cores. Until it is set, the
 * budget is the number of CPUs the process may run on. Process-wide, like OpenBLAS's
 * own setting; set it before running kernels, not concurrently with them. Results
 * are bit-identical from run to run for a given budget. */
void wf_kernels_set_threads(int n);
int wf_kernels_threads(void);

#endif /* WF_KERNELS_THREADS_H */
