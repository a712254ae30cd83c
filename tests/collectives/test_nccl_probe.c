/*
 * test_nccl_probe.c - the NCCL module loads (or says why not) on any machine.
 *
 * On a machine without a GPU the module must still load when it was built: that
 * proves libweft_nccl.so links against NCCL and the CUDA runtime and exports the
 * entry point of the right ABI; only the device count is then missing. Without the
 * CUDA build the probe must fail cleanly with a reason. No MPI is needed.
 */
#include <stdio.h>
#include <string.h>

#include "wf_collectives.h"

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);                     \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

int main(void)
{
  char why[512] = "";
  int version = -1;
  wf_status st = wf_comm_nccl_probe(&version, why, sizeof why);
  printf("nccl probe: %s (NCCL version code %d): %s\n", wf_status_str(st), version, why);
  CHECK(why[0] != '\0');
#if WF_TEST_NCCL_MODULE
  /* Built: the module loaded, so NCCL's version is known (2.x: 20000 and up). */
  CHECK(version >= 20000);
  CHECK(st == WF_OK || (st == WF_ENODEV && strstr(why, "no CUDA device") != NULL));
#else
  CHECK(st == WF_ENODEV && version == 0 && strstr(why, "cannot load") != NULL);
#endif
  return 0;
}
