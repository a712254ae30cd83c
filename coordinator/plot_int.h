/*
 * plot_int.h - private to the `coordinator` binary: `coordinator plot` (plot.c).
 */
#ifndef WF_PLOT_INT_H
#define WF_PLOT_INT_H

/* Draw the loss and throughput of a train.metrics file into OUT (.svg or .png) with
 * gnuplot. Returns the exit status: 0, 1 (gnuplot failed), 2 (a bad file or name). */
int wf__plot(const char *in, const char *out);

#endif /* WF_PLOT_INT_H */
