/*
 * build_id.c - the build id compiled in (wf_build_id.h). wf_build_id_gen.h is written
 * by meson's vcs_tag from build_id.h.in at every build, and rewritten only when the id
 * changes, so only this file recompiles then.
 */
#include "wf_build_id.h"

#include "wf_build_id_gen.h"

const char *wf_build_id(void) { return WF_BUILD_ID; }
