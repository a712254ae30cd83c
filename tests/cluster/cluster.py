"""A test cluster of real hosts on this machine: network namespaces as nodes.

    with Cluster(["node0", "node1"], extra=["login"]) as c:
        c.run("node0", ["hostname"])                      # -> "node0"
        p = c.popen("node0", ["mpirun", "--hostfile", c.hostfile(2), ...])

Each host is
  * a network namespace `<run>-<name>` whose eth0 (a veth pair) is a port of one bridge
    in a switch namespace `<run>-sw`, with the address 10.77.0.<n>/24. The range exists
    only inside these namespaces: the machine's own interfaces, routes and addresses
    are never touched, and two runs side by side have switches of their own;
  * a host name (a UTS namespace per command, named for the host) and an /etc/hosts
    that maps every host of the cluster to its address (`ip netns exec` shows each
    namespace /etc/netns/<namespace>/hosts as /etc/hosts);
  * a login node (host "login") has a /tmp of its own; the other hosts share the
    machine's file system, as a cluster's nodes share theirs. The build and the
    source are on every host wherever they live: those under /tmp are bind-mounted
    into the login node's own /tmp at their own paths (`see`, below), and the cluster
    checks that every host sees them before a test uses it (Unseen says which does not);
  * a CPU set of its own where the machine has the cpuset cgroup: the compute nodes
    get the machine's cores dealt out one by one (node i: core i mod cores), so hwloc
    and weft see a node's cores as on a machine of its own. Without it every node would
    bind its ranks to every core: a dp 2 step across two such nodes took 156 ms
    against 8 ms (issue 30). Service hosts (login, head) get no CPU set.
The file system is shared (one build, one checkpoint directory, as on a cluster with
a shared file system), and so is the process table.

Commands run on a host through node-exec (beside this file), which Open MPI also uses
as its remote launch agent (`rsh_agent()`), with a clean environment as ssh would give.

Tear-down kills every process left in the cluster's namespaces, deletes the namespaces
(and with them every veth and the bridge), the /etc/netns files and the cgroups. It runs
on exit, on SIGTERM/SIGINT (meson's timeout) and on an exception; a run that was killed
outright is swept by the next one (its namespaces carry its pid, and a namespace whose
pid is gone is removed). A machine where namespaces cannot be made raises Skip.
"""
import atexit
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_EXEC = os.path.join(HERE, "node-exec")
SUBNET = "10.77.0"
CPUSET_ROOT = "/sys/fs/cgroup/cpuset"
PREFIX = "wfc"  # namespaces: wfc<pid>-<host>


class Skip(Exception):
    """The machine cannot host the cluster (the reason is the message)."""


class Unseen(Exception):
    """A host cannot see a path the tests run from (the message says which and why)."""


REPO = os.path.dirname(os.path.dirname(HERE))  # the source, seen by every host


def build_root(path):
    """The meson build folder that holds path (the nearest with build.ninja), else the
    folder of path itself: what a host needs to run a binary of the build."""
    d = path if os.path.isdir(path) else os.path.dirname(path)
    while d != os.path.dirname(d):
        if os.path.isfile(os.path.join(d, "build.ninja")):
            return d
        d = os.path.dirname(d)
    return path if os.path.isdir(path) else os.path.dirname(path)


def under(path, top):
    return path == top or path.startswith(top.rstrip("/") + "/")


def private_tmp_shares(paths):
    """The folders among paths' build roots and the source that lie under /tmp, none
    inside another: what the login node's private /tmp must show."""
    roots = sorted({build_root(os.path.abspath(p)) for p in paths} | {REPO})
    tmp = [r for r in roots if under(r, "/tmp") and r != "/tmp"]
    return [r for r in tmp if not any(o != r and under(r, o) for o in tmp)]


def sh(cmd, check=True, timeout=30, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def ns_pids(ns):
    p = sh(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in p.stdout.split()] if p.returncode == 0 else []


def kill_ns(ns, sig=signal.SIGKILL):
    """Signal every process in namespace ns until none is left (a process may fork
    while we kill its parent); returns how many were killed."""
    n = 0
    for _ in range(50):
        pids = [p for p in ns_pids(ns) if p != os.getpid()]
        if not pids:
            return n
        for pid in pids:
            try:
                os.kill(pid, sig)
                n += 1
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return n


def remove_cgroup(path):
    """A cgroup directory goes when its last task is gone; kill what is left."""
    if not os.path.isdir(path):
        return
    for sub in sorted((os.path.join(path, d) for d in os.listdir(path)
                       if os.path.isdir(os.path.join(path, d))), reverse=True):
        remove_cgroup(sub)
    for _ in range(100):
        try:
            with open(os.path.join(path, "tasks")) as f:
                pids = [int(x) for x in f.read().split()]
        except OSError:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.rmdir(path)
            return
        except OSError:
            time.sleep(0.05)


def sweep_stale():
    """Remove what killed runs left: namespaces, /etc/netns entries and cgroups whose
    owner pid is gone."""
    names = sh(["ip", "netns", "list"], check=False).stdout.split("\n")
    for line in names:
        m = re.match(rf"({PREFIX}(\d+)-\S+)", line)
        if m and not pid_alive(int(m.group(2))):
            kill_ns(m.group(1))
            sh(["ip", "netns", "delete", m.group(1)], check=False)
    for base, pattern in (("/tmp", "node"), ("/var/tmp", "cluster-.*")):
        for d in os.listdir(base):
            m = re.match(rf"{PREFIX}(\d+)-{pattern}$", d)
            if m and not pid_alive(int(m.group(1))) and \
                    not os.environ.get("WEFT_TEST_CLUSTER_KEEP"):
                shutil.rmtree(os.path.join(base, d), ignore_errors=True)
    for base in ("/etc/netns", CPUSET_ROOT):
        if not os.path.isdir(base):
            continue
        for d in os.listdir(base):
            m = re.match(rf"{PREFIX}(\d+)(-|$)", d)
            if m and not pid_alive(int(m.group(1))):
                path = os.path.join(base, d)
                if base == CPUSET_ROOT:
                    remove_cgroup(path)
                else:
                    shutil.rmtree(path, ignore_errors=True)


class Cluster:
    """Compute nodes `nodes` (node i gets 10.77.0.(11+i)) and service hosts `extra`
    (login, head: 10.77.0.(2+j)), up from __enter__ to __exit__."""

    def __init__(self, nodes, extra=(), scratch=None, cpusets=True, see=()):
        self.nodes = list(nodes)
        # What every host must see: the test's binaries and scripts, and the source.
        self.see = [os.path.abspath(p) for p in see] + [REPO]
        self.extra = list(extra)
        self.hosts = self.nodes + self.extra
        self.run_id = f"{PREFIX}{os.getpid()}"
        self.addr = {h: f"{SUBNET}.{11 + i}" for i, h in enumerate(self.nodes)}
        self.addr.update({h: f"{SUBNET}.{2 + j}" for j, h in enumerate(self.extra)})
        # The cluster's shared file system (the build, checkpoints, Slurm's state): not
        # under /tmp, which the login node has a private one of.
        self.scratch = scratch or tempfile.mkdtemp(prefix=f"{self.run_id}-cluster-", dir="/var/tmp")
        self.dir = os.path.join(self.scratch, "cluster")
        self.cpuset = None  # root of this run's cpusets, when the machine has them
        self.cores = {}     # node -> its cores ("0", "1")
        self.made = []      # namespaces made, in order
        self.want_cpusets = cpusets  # False: every node sees every core (for comparison)
        self.up = False

    # --- life cycle -------------------------------------------------------------------
    def __enter__(self):
        if os.geteuid() != 0:
            raise Skip("the cluster tests need root (network namespaces, veth pairs, cgroups)")
        if not shutil.which("ip") or not shutil.which("unshare"):
            raise Skip("the cluster tests need iproute2 (ip) and util-linux (unshare)")
        sweep_stale()
        probe = f"{self.run_id}-probe"
        p = sh(["ip", "netns", "add", probe], check=False)
        if p.returncode != 0:
            raise Skip(f"network namespaces are not permitted here ({p.stderr.strip()})")
        sh(["ip", "netns", "delete", probe], check=False)
        atexit.register(self.down)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
            self._build()
            self._check_seen()
        except BaseException:
            self.down()
            raise
        self.up = True
        return self

    def __exit__(self, *exc):
        self.down()
        return False

    def _on_signal(self, sig, frame):
        raise SystemExit(f"cluster: got signal {sig}; tearing the cluster down")

    def ns(self, host):
        return f"{self.run_id}-{host}"

    def _build(self):
        os.makedirs(os.path.join(self.dir, "nodes"), exist_ok=True)
        os.makedirs(self.node_tmp(), mode=0o700, exist_ok=True)
        os.makedirs(os.path.join(self.dir, "stage"), exist_ok=True)  # node-exec's, for /tmp
        shares = "\n".join(private_tmp_shares(self.see))
        sw = self.ns("sw")
        self._netns_add(sw)
        sh(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        sh(["ip", "-n", sw, "link", "set", "br0", "up"])
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self.addr[h]} {h}\n" for h in self.hosts)
        self._make_cpusets()
        for h in self.hosts:
            ns = self.ns(h)
            self._netns_add(ns)
            sh(["ip", "-n", sw, "link", "add", self.port(h), "type", "veth", "peer", "name", "eth0",
                "netns", ns])
            sh(["ip", "-n", sw, "link", "set", self.port(h), "master", "br0", "up"])
            sh(["ip", "-n", ns, "addr", "add", f"{self.addr[h]}/24", "dev", "eth0"])
            sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write(hosts)
            cg = os.path.join(self.cpuset, h) if self.cpuset and h in self.cores else ""
            with open(os.path.join(self.dir, "nodes", h), "w") as f:
                f.write(f"netns={ns}\ncpuset={cg}\nmntns=/proc/{os.getpid()}/ns/mnt\n"
                        f"private_tmp={1 if h == 'login' else ''}\n"
                        f"stage={shlex.quote(os.path.join(self.dir, 'stage'))}\n"
                        f"shares={shlex.quote(shares)}\n"
                        f"cgroups='{cgroup_mounts()}'\n")
        with open(os.path.join(self.dir, "rsh"), "w") as f:
            # ssh gives the remote command a login environment, not the caller's: only
            # what mpirun passes (its -x variables, OMPI_*) reaches the remote ranks.
            f.write("#!/bin/sh\n# Open MPI's remote launch agent for this test cluster.\n"
                    "host=$1; shift\n"
                    f"exec env -i PATH=\"$PATH\" HOME=\"$HOME\" LANG=C.UTF-8 {NODE_EXEC} "
                    f"{self.dir} \"$host\" /bin/sh -c \"$*\"\n")
        os.chmod(os.path.join(self.dir, "rsh"), 0o755)

    def _check_seen(self):
        """Every host sees every path of self.see, or Unseen names the first host that
        does not, the paths and why (one message: the test stops there)."""
        gone = [p for p in self.see if not os.path.exists(p)]
        if gone:
            raise Unseen(f"cluster: {', '.join(gone)} not found on this machine")
        probe = 'for p; do [ -e "$p" ] || echo "$p"; done'
        runs = {h: self.popen(h, ["/bin/sh", "-c", probe, "sh"] + self.see, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                for h in self.hosts}  # all at once: a node-exec takes ~0.1-1 s
        for h, p in runs.items():
            out, err = p.communicate(timeout=60)
            missing = out.split("\n")[:-1]
            if p.returncode == 0 and not missing:
                continue
            why = err.strip() or (
                "its /tmp is its own and shows only "
                f"{', '.join(private_tmp_shares(self.see)) or 'nothing'} of the machine's"
                if h == "login" else "it shares the machine's file system, yet does not")
            raise Unseen(f"cluster: host {h} cannot see {', '.join(missing) or 'the build'}"
                         f" (node-exec exit {p.returncode}): {why}")

    def _netns_add(self, ns):
        sh(["ip", "netns", "add", ns])
        self.made.append(ns)

    def _make_cpusets(self):
        """One cpuset cgroup per compute node: its cores dealt round-robin."""
        if not self.want_cpusets or not os.path.isfile(os.path.join(CPUSET_ROOT, "cpuset.cpus")):
            return
        try:
            with open(os.path.join(CPUSET_ROOT, "cpuset.effective_cpus")) as f:
                cpus = parse_cpulist(f.read())
            with open(os.path.join(CPUSET_ROOT, "cpuset.effective_mems")) as f:
                mems = f.read().strip()
            root = os.path.join(CPUSET_ROOT, self.run_id)
            os.mkdir(root)
            self.cpuset = root
            write(os.path.join(root, "cpuset.cpus"), ",".join(map(str, cpus)))
            write(os.path.join(root, "cpuset.mems"), mems)
            for i, h in enumerate(self.nodes):
                core = cpus[i % len(cpus)]
                os.mkdir(os.path.join(root, h))
                write(os.path.join(root, h, "cpuset.cpus"), str(core))
                write(os.path.join(root, h, "cpuset.mems"), mems)
                self.cores[h] = str(core)
        except OSError:
            if self.cpuset:
                remove_cgroup(self.cpuset)
            self.cpuset = None
            self.cores = {}

    def down(self):
        """Kill what runs on the hosts, delete every namespace, file and cgroup made, and
        the scratch folder unless WEFT_TEST_CLUSTER_KEEP is set. Safe to call twice and
        after a partial build."""
        for ns in reversed(self.made):
            kill_ns(ns)
        for ns in reversed(self.made):
            sh(["ip", "netns", "delete", ns], check=False)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        self.made = []
        if self.cpuset:
            remove_cgroup(self.cpuset)
            self.cpuset = None
        shutil.rmtree(self.node_tmp(), ignore_errors=True)
        if self.scratch and not os.environ.get("WEFT_TEST_CLUSTER_KEEP"):
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None
        self.up = False

    def node_tmp(self):
        """A folder in /tmp for what a node keeps to itself (rank 0's job directory: its
        Unix socket and job file). The compute nodes share /tmp; the login node does not
        see it, as on a cluster."""
        return f"/tmp/{self.run_id}-node"

    # --- running things on hosts --------------------------------------------------------
    def cmd(self, host, argv):
        """argv run on host (a list for subprocess)."""
        return [NODE_EXEC, self.dir, host] + list(argv)

    def popen(self, host, argv, **kw):
        return subprocess.Popen(self.cmd(host, argv), **kw)

    def run(self, host, argv, timeout=120, **kw):
        return subprocess.run(self.cmd(host, argv), capture_output=True, text=True,
                              timeout=timeout, **kw)

    def rsh_agent(self):
        return os.path.join(self.dir, "rsh")

    def hostfile(self, nodes, slots, name="hosts"):
        """A hostfile of `nodes` with `slots` each (rewritten in place when called again:
        a relaunch reads the new list)."""
        path = os.path.join(self.scratch, name)
        with open(path + ".new", "w") as f:
            f.write("".join(f"{n} slots={slots}\n" for n in nodes))
        os.replace(path + ".new", path)
        return path

    def pids(self, host):
        return ns_pids(self.ns(host))

    # --- faults -------------------------------------------------------------------------
    def port(self, host):
        return f"p-{host}"[:15]

    def kill_host(self, host):
        """Every process of the host killed at once (a power loss, a kernel panic)."""
        return kill_ns(self.ns(host))

    def link(self, host, up):
        """The host's switch port down (its cable pulled) or up again. Nothing is said to
        either side: packets just stop, as in a partition."""
        sh(["ip", "-n", self.ns("sw"), "link", "set", self.port(host), "up" if up else "down"])

    def has_qdisc(self, kind):
        """Whether the kernel offers queueing discipline `kind` (tried on a throwaway
        device in the switch namespace)."""
        sw = self.ns("sw")
        sh(["ip", "-n", sw, "link", "add", "qprobe", "type", "veth", "peer", "name", "qprobe1"],
           check=False)
        args = {"tbf": ["rate", "1mbit", "burst", "32kbit", "latency", "50ms"],
                "netem": ["delay", "10ms"]}[kind]
        ok = sh(["tc", "-n", sw, "qdisc", "add", "dev", "qprobe", "root", kind] + args,
                check=False).returncode == 0
        sh(["ip", "-n", sw, "link", "delete", "qprobe"], check=False)
        return ok

    def slow_link(self, host, rate):
        """Shape the host's link to `rate` (e.g. "20mbit") both ways with tbf: the switch
        port (traffic to the host) and the host's eth0 (traffic from it)."""
        tbf = ["root", "tbf", "rate", rate, "burst", "64kbit", "latency", "400ms"]
        sh(["tc", "-n", self.ns("sw"), "qdisc", "replace", "dev", self.port(host)] + tbf)
        sh(["tc", "-n", self.ns(host), "qdisc", "replace", "dev", "eth0"] + tbf)

    def fast_link(self, host):
        sh(["tc", "-n", self.ns("sw"), "qdisc", "del", "dev", self.port(host), "root"], check=False)
        sh(["tc", "-n", self.ns(host), "qdisc", "del", "dev", "eth0", "root"], check=False)


def cgroup_mounts():
    """The machine's cgroup hierarchies under /sys/fs/cgroup as "dir:type:options", for
    node-exec to mount in a node's own /sys."""
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, mnt, kind, opts = line.split()[:4]
            if kind in ("cgroup", "cgroup2") and mnt.startswith("/sys/fs/cgroup/"):
                keep = [o for o in opts.split(",") if o not in ("rw", "ro", "relatime", "nosuid",
                                                                "nodev", "noexec")]
                out.append(f"{mnt[len('/sys/fs/cgroup/'):]}:{kind}:{','.join(keep) or '-'}")
    return " ".join(out)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def parse_cpulist(text):
    out = []
    for part in text.strip().split(","):
        if "-" in part:
            a, b = part.split("-")
            out += range(int(a), int(b) + 1)
        elif part:
            out.append(int(part))
    return out
