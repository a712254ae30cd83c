#!/usr/bin/env python3
"""Run a cluster test as it runs for a user who cloned weft into /tmp on a fresh machine.

    from_tmp.py SOURCE_ROOT BUILD_ROOT TEST.py ARG ...

The test runs in a mount namespace of its own whose /tmp is an empty tmpfs holding the
source at /tmp/weft, and with it the build when it lies inside the source (else at
/tmp/weft-build): bind mounts of SOURCE_ROOT and BUILD_ROOT, nothing copied or rebuilt.
Every argument that names a path in either is rewritten to its place there. The cluster's hosts enter the test's mount
namespace, so they see the machine as the test does, and the login node, whose /tmp is
its own, must be shown the build and the source (tests/cluster/cluster.py): this is the
case a checkout outside /tmp never meets. The machine's own /tmp is not touched.

Not root, or no unshare: the test runs unchanged (it then skips, 77, saying why).
"""
import os
import shutil
import sys

VIEW = "/tmp/weft"  # the clone, as `git clone ... /tmp/weft` would place it
VIEW_BUILD = "/tmp/weft-build"  # a build folder outside the source (meson setup /elsewhere)


def inside(path, root):
    return path == root or path.startswith(root + "/")


def moved(path, src, build):
    """path's place in the view (path itself when it lies in neither tree)."""
    if inside(path, src):
        return VIEW + path[len(src):]
    if inside(path, build):
        return VIEW_BUILD + path[len(build):]
    return path


def main(argv):
    src, build = os.path.realpath(argv[0]), os.path.realpath(argv[1])
    test = [sys.executable] + argv[2:]
    if os.geteuid() != 0 or not shutil.which("unshare"):
        os.execv(test[0], test)
    here = [moved(os.path.realpath(a), src, build) if os.path.isabs(a) else a for a in test[1:]]
    # The tmpfs is made in a staging folder of the build tree (in this namespace only),
    # the trees are bind-mounted into it, and it is then moved onto /tmp: a source that
    # itself lives under /tmp is still reachable while the view is assembled.
    stage = os.path.join(build, "tests", "cluster", "tmp-stage")
    os.makedirs(stage, exist_ok=True)
    script = r'''
set -e
mount -t tmpfs -o mode=1777 tmp "$STAGE"
mkdir "$STAGE/weft"
mount --bind "$SRC" "$STAGE/weft"
case "$BUILD/" in
"$SRC"/*) ;;
*) mkdir "$STAGE/weft-build" && mount --bind "$BUILD" "$STAGE/weft-build" ;;
esac
mount --move "$STAGE" /tmp
echo "from_tmp: running from /tmp/weft, a /tmp of its own with bind mounts of $SRC" \
     "(the source) and $BUILD (the build)"
cd "$CWD"
exec "$@"
'''
    os.environ.update(STAGE=stage, SRC=src, BUILD=build,
                      CWD=moved(os.path.realpath(os.getcwd()), src, build))
    os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", "--",
                          "/bin/sh", "-c", script, "sh", test[0]] + here)


if __name__ == "__main__":
    main(sys.argv[1:])
