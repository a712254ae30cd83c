/*
 * mpi_check.h - CHECK for multi-rank tests: a failed condition prints the rank, the
 * place and a message, then aborts the whole job (so no rank waits in a collective for a
 * peer that already gave up). The including test sets world_rank after MPI_Init.
 */
#ifndef WF_TEST_MPI_CHECK_H
#define WF_TEST_MPI_CHECK_H

#include <mpi.h>
#include <stdio.h>

static int world_rank = -1;

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "[rank %d] %s:%d: check failed: %s: ", world_rank, __FILE__, __LINE__,       \
              #cond);                                                                              \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fputc('\n', stderr);                                                                         \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                \
    }                                                                                              \
  } while (0)

#endif /* WF_TEST_MPI_CHECK_H */
