/* clock.c - monotonic and wall clocks. */
#include <time.h>

#include "wf_runtime.h"

uint64_t wf_now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double wf_now(void) { return (double)wf_now_ns() * 1e-9; }

double wf_wall_time(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
