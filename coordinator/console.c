/* console.c - the `coordinator` console client (work in progress: see wf_control.h). */
#include <stdio.h>

int main(void)
{
  fprintf(stderr, "coordinator: the console is not built yet\n");
  return 1;
}
