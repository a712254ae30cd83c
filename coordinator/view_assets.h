/*
 * view_assets.h - the live view's files, compiled into the coordinator (view.c serves
 * them). view_assets.c is generated at build time by view/embed.py from coordinator/view/
 * and npm's uplot (coordinator/meson.build).
 */
#ifndef WF_VIEW_ASSETS_H
#define WF_VIEW_ASSETS_H

#include <stddef.h>

typedef struct wf__asset {
  const char *path; /* "/index.html", "/uplot.js", ... */
  const char *type; /* its Content-Type */
  const unsigned char *data;
  size_t len;
} wf__asset;

extern const wf__asset wf__view_assets[];
extern const size_t wf__view_n_assets;

#endif /* WF_VIEW_ASSETS_H */
