/*
 * wf_build_id.h - which source a binary was built from.
 *
 * The build id is the commit the build tree's sources were checked out at, with "-dirty"
 * when a tracked file differed from it, or "unknown" outside a git checkout
 * (scripts/build_id.sh, run by meson's vcs_tag at every build). It lives in a library of
 * its own (build_id_dep), linked only by the programs that print it (the worker, the GPU
 * probe, the kernel bench), so a new commit relinks those and nothing else. Results
 * files name it (bench/results/).
 */
#ifndef WF_BUILD_ID_H
#define WF_BUILD_ID_H

/* "<40 hex digits>[-dirty]" or "unknown"; a static string. */
const char *wf_build_id(void);

#endif
