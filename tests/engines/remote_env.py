# SPDX-License-Identifier: MIT
"""Racks for the remote tier tests and benchmark: a Mooncake master (the
package's own ``mooncake_master`` binary, with its HTTP metadata server) and
one host process per rack (remote_rack.py), each rack with its own pool and
its own lock manager: the real ``cxlkvd`` of the build, started on the rack's
pool (formatted by ``cxlkvctl``) in the rack's namespace, as a rack's host
runs it (docs/operations.md "Run the lock manager: cxlkvd").

Where this process may make network namespaces (root, ``ip`` present), each
rack's host runs in a namespace of its own, joined to the others by a veth
link to a bridge in this namespace, where the master runs: traffic between
racks crosses veth links over TCP as it would cross a network.  Otherwise
(or with CXLKV_REMOTE_LOOPBACK=1) every process is on the loopback
interface, and ``Racks.mode`` says so."""
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def tool_path(name):
    """A tool of the build (``cxlkvd``, ``cxlkvctl``): in CXLKV_TEST_TOOLS
    (set by ctest), else CXLKV_BUILD/tools, else build/tools; FileNotFoundError
    naming where it looked when it is not there."""
    tools = os.environ.get("CXLKV_TEST_TOOLS") or os.path.join(
        os.environ.get("CXLKV_BUILD", os.path.join(ROOT, "build")), "tools")
    p = os.path.join(tools, name)
    if not os.access(p, os.X_OK):
        raise FileNotFoundError(f"no runnable {name} at {p}: build it first (make build), or set CXLKV_TEST_TOOLS "
                                "to the build's tools directory")
    return p


def mooncake_master_path():
    """The ``mooncake_master`` binary of the installed Mooncake package, or
    ImportError naming what is missing."""
    import mooncake  # noqa: PLC0415 -- ImportError is the caller's failure
    p = os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")
    if not os.access(p, os.X_OK):
        raise ImportError(f"the Mooncake package has no runnable mooncake_master at {p}")
    return p


def _free_port():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def _sh(*cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _ip_out(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True).stdout


def _links():
    """The names of this namespace's links."""
    return [m.split("@")[0] for m in re.findall(r"^\d+: ([^:]+):", _ip_out("-o", "link", "show"), re.M)]


STALE_ALIAS = "cxlkv-test-net:"  # the bridge's alias: STALE_ALIAS pid:start time:namespaces


def _start_time(pid):
    """A process's start time (clock ticks since boot), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _remove_stale_nets():
    """Bridges, veth links and namespaces that a Net of a process no longer
    alive made (a run killed before its close)."""
    for line in _ip_out("-o", "link", "show", "type", "bridge").splitlines():
        m = re.search(r"^\d+: ([^:@]+):.*alias " + re.escape(STALE_ALIAS) + r"(\d+):(\S*):(\S*)", line)
        if not m or _start_time(int(m.group(2))) == m.group(3):
            continue
        namespaces = [ns for ns in m.group(4).split(",") if ns.startswith("cxr")]
        for ns in namespaces:  # rack r's namespace cxr<r><tag>, its link cxv<r><tag>
            subprocess.run(["ip", "link", "del", "cxv" + ns[len("cxr"):]], capture_output=True)
        subprocess.run(["ip", "link", "del", m.group(1)], capture_output=True)
        for ns in namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


class Net:
    """A bridge in this namespace (the master's side) and one namespace per
    rack with a veth link to it, or loopback."""

    def __init__(self, racks, loopback=False):
        self.ns = {}
        self.addr = {}
        self.links = []
        self.mode = "loopback"
        if loopback or os.environ.get("CXLKV_REMOTE_LOOPBACK") == "1" or os.geteuid() != 0 or not shutil.which("ip"):
            self.master_addr = "127.0.0.1"
            for r in racks:
                self.addr[r] = "127.0.0.1"
            return
        # One run at a time picks its names and subnet, among those no live
        # run holds; what a killed run left is removed first.  Two bridges
        # with one subnet route the racks' replies into the wrong one, and
        # the racks' connections to the master hang.
        with open("/tmp/cxlkv-remote-net.lock", "a") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            try:
                self._make(racks)
            finally:
                fcntl.flock(lk, fcntl.LOCK_UN)

    def _make(self, racks):
        _remove_stale_nets()
        links = set(_links())
        used = {int(m) for m in re.findall(r"inet 10\.231\.(\d+)\.", _ip_out("-4", "-o", "addr", "show"))}
        base = os.getpid() % 150
        sub = next((100 + (base + k) % 150 for k in range(150) if 100 + (base + k) % 150 not in used), None)
        self.tag = next(t for t in [f"{os.getpid() % 100000}"] + [f"{os.getpid() % 10000}{k}" for k in range(10)]
                        + [f"{os.getpid() % 1000}{k:02d}" for k in range(100)]
                        if f"cxrb{t}" not in links)
        self.bridge = f"cxrb{self.tag}"
        try:
            if sub is None:
                raise OSError("every subnet 10.231.100-249.0/24 is in use")
            _sh("ip", "link", "add", self.bridge, "type", "bridge")
            self.links.append(self.bridge)
            # Who made it, for _remove_stale_nets: the pid and its start time.
            _sh("ip", "link", "set", self.bridge, "alias", f"{STALE_ALIAS}{os.getpid()}:{_start_time(os.getpid())}:"
                + ",".join(f"cxr{r}{self.tag}" for r in racks))
            _sh("ip", "addr", "add", f"10.231.{sub}.1/24", "dev", self.bridge)
            _sh("ip", "link", "set", self.bridge, "up")
            for i, r in enumerate(racks):
                ns, veth = f"cxr{r}{self.tag}", f"cxv{r}{self.tag}"
                _sh("ip", "netns", "add", ns)
                self.ns[r] = ns
                _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                self.links.append(veth)
                _sh("ip", "link", "set", veth, "master", self.bridge, "up")
                _sh("ip", "-n", ns, "addr", "add", f"10.231.{sub}.{10 + i}/24", "dev", "eth0")
                _sh("ip", "-n", ns, "link", "set", "eth0", "up")
                _sh("ip", "-n", ns, "link", "set", "lo", "up")
                self.addr[r] = f"10.231.{sub}.{10 + i}"
            self.master_addr = f"10.231.{sub}.1"
            self.mode = "netns+veth"
        except (subprocess.CalledProcessError, OSError) as e:
            why = e.stderr.decode(errors="replace").strip() if getattr(e, "stderr", None) else str(e)
            print(f"remote tests: no network namespaces ({why}); racks on loopback", file=sys.stderr)
            self.close()
            self.__init__(racks, loopback=True)

    def prefix(self, rack):
        """The command prefix that runs a program in ``rack``'s namespace."""
        return ["ip", "netns", "exec", self.ns[rack]] if rack in self.ns else []

    def close(self):
        for link in reversed(self.links):
            subprocess.run(["ip", "link", "del", link], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.links, self.ns = [], {}


class Master:
    """A mooncake_master with its HTTP metadata server; restartable on the
    same ports (a restarted master knows no objects: clients join again)."""

    def __init__(self, addr, logdir, extra_args=()):
        """``extra_args``: more mooncake_master flags (e.g. its eviction
        settings, ``-eviction_high_watermark_ratio=0.98``)."""
        self.addr = addr
        self.extra_args = list(extra_args)
        self.rpc_port, self.http_port, self.metrics_port = _free_port(), _free_port(), _free_port()
        self.log = os.path.join(logdir, "mooncake_master.log")
        self.proc = None
        self.start()

    @property
    def rpc(self):
        return f"{self.addr}:{self.rpc_port}"

    @property
    def metadata(self):
        return f"http://{self.addr}:{self.http_port}/metadata"

    def start(self):
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                [mooncake_master_path(), f"-rpc_port={self.rpc_port}", "-enable_http_metadata_server=true",
                 f"-http_metadata_server_port={self.http_port}", f"-metrics_port={self.metrics_port}",
                 "-client_ttl=3", "-default_kv_lease_ttl=500", "-logtostderr=true"] + self.extra_args,
                stdout=log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mooncake_master exited with {self.proc.returncode}; see {self.log}")
            try:
                socket.create_connection((self.addr, self.rpc_port), 0.2).close()
                socket.create_connection((self.addr, self.http_port), 0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"mooncake_master not listening on {self.rpc} after 20 s; see {self.log}")

    def kill(self):
        """SIGKILL, as a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self):
        self.kill()


class Cxlkvd:
    """The lock manager of one rack's pool: the build's ``cxlkvd`` in the
    foreground, in the rack's namespace, until it says it manages the
    pool's locks."""

    def __init__(self, name, net, uri, logdir):
        self.name = name
        self.log = os.path.join(logdir, f"cxlkvd-{name}.log")
        self.errf = open(self.log, "a+b")
        self.proc = subprocess.Popen(net.prefix(name) + [tool_path("cxlkvd"), "--pool", uri, "--foreground",
                                                         "--metrics-listen", "none"],
                                     stdin=subprocess.DEVNULL, stdout=self.errf, stderr=self.errf)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cxlkvd of rack {name} exited with {self.proc.returncode} on {uri}; see {self.log}")
            self.errf.seek(0)
            if b"managing locks" in self.errf.read():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"cxlkvd of rack {name} did not start managing the locks of {uri} in 60 s; see {self.log}")

    def stop(self):
        """SIGTERM (cxlkvd frees its lease and exits 0), SIGKILL if it hangs."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.errf.close()

    def kill(self):
        """SIGKILL: the rack's host died with its lock manager."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.errf.close()


def cxlkvctl_stats(uri, *args):
    """``cxlkvctl stats`` of a pool (its text, or what ``args`` ask for),
    as an operator runs it on a host of the pool's rack."""
    r = subprocess.run([tool_path("cxlkvctl"), "--pool", uri, "stats", *args], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"cxlkvctl stats of {uri} failed (exit {r.returncode}): {r.stderr.strip()}")
    return r.stdout


def pool_remote_counters(uri):
    """The remote tier counters a pool holds, summed over its nodes
    (``cxlkvctl stats --json``; docs/remote.md "Counters")."""
    return json.loads(cxlkvctl_stats(uri, "--json"))["total"]["remote"]


def set_capacity(uri, blocks):
    """Bound a pool's memory tier to ``blocks`` blocks (the pool-wide policy,
    docs/eviction.md "What is evicted first"), before any worker attaches:
    ``cxlkvctl kv --mem-capacity`` sets it as it attaches (the block its
    ``rm`` then names is not there, so that command itself fails), and
    ``index stats`` says whether it took."""
    subprocess.run([tool_path("cxlkvctl"), "--pool", uri, "kv", "rm", "--mem-capacity", str(blocks),
                    "cxlkv-capacity-probe"], capture_output=True, text=True, timeout=120)
    r = subprocess.run([tool_path("cxlkvctl"), "--pool", uri, "--json", "index", "stats"], capture_output=True,
                       text=True, timeout=120)
    got = json.loads(r.stdout)["max_blocks"] if r.returncode == 0 else None
    if got != blocks:
        raise RuntimeError(f"capacity of {uri}: index stats says max_blocks {got}, not {blocks}: {r.stderr.strip()}")


def format_pool(uri, index_entries=0):
    """A fresh pool of 8 nodes at ``uri`` (``cxlkvctl format --force``)."""
    cmd = [tool_path("cxlkvctl"), "--pool", uri, "format", "--max-nodes", "8", "--force"]
    if index_entries:
        cmd += ["--index-entries", str(index_entries)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"cxlkvctl format of {uri} failed (exit {r.returncode}): {r.stderr.strip()}")


class RackProc:
    """One rack's host process (remote_rack.py) and its command channel."""

    def __init__(self, name, net, master, logdir, namespace, block_bytes=64 << 10, timeout=1.0, segment_mib=256,
                 index_entries=0, remote=True, pool_mib=512, batch_blocks=64, capacity_blocks=0, hold_blocks=None,
                 push_min_blocks=None):
        self.name = name
        self.pool = f"shm:cxlkv-remote-{name}-{os.getpid()}:{pool_mib << 20}"
        self.errlog = open(os.path.join(logdir, f"rack-{name}.log"), "a")
        format_pool(self.pool, index_entries)
        self.cxlkvd = Cxlkvd(name, net, self.pool, logdir)
        if capacity_blocks:  # a pool too small for the workload: it evicts (docs/eviction.md)
            set_capacity(self.pool, capacity_blocks)
        env = dict(os.environ)
        cmd = net.prefix(name) + [sys.executable, os.path.join(HERE, "remote_rack.py"), "--name", name,
                                  "--pool", self.pool, "--master", master.rpc, "--metadata", master.metadata,
                                  "--host", net.addr[name], "--namespace", namespace,
                                  "--block-bytes", str(block_bytes), "--timeout", str(timeout),
                                  "--segment-mib", str(segment_mib), "--batch-blocks", str(batch_blocks)]
        if hold_blocks is not None:
            cmd += ["--hold-blocks", str(hold_blocks)]
        if push_min_blocks is not None:
            cmd += ["--push-min-blocks", str(push_min_blocks)]
        if not remote:
            cmd.append("--no-remote")
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errlog,
                                         env=env, text=True, bufsize=1)
            self.hello = self._read(60)
            if not self.hello.get("ready"):
                raise RuntimeError(f"rack {name} did not start: {self.hello}")
        except BaseException:
            self.kill()
            raise

    def _read(self, timeout):
        box = {}

        def rd():
            box["line"] = self.proc.stdout.readline()
        t = threading.Thread(target=rd, daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive():
            raise TimeoutError(f"rack {self.name}: no reply in {timeout} s; its stacks and the end of its log "
                               f"({self.errlog.name}):\n{self._stacks_and_log()}")
        if not box["line"]:
            raise RuntimeError(f"rack {self.name}: process ended (exit {self.proc.poll()}; see {self.errlog.name})")
        return json.loads(box["line"])

    def _stacks_and_log(self, chars=6000):
        """The rack's Python stacks (remote_rack.py prints them on SIGUSR1,
        even while a call into Mooncake holds the interpreter lock) and the
        end of its log, for the error of a rack that stopped answering."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
        self.errlog.flush()
        try:
            with open(self.errlog.name, errors="replace") as f:
                return f.read()[-chars:]
        except OSError as e:
            return f"(cannot read it: {e})"

    def send(self, op, **kw):
        self.proc.stdin.write(json.dumps(dict(op=op, **kw)) + "\n")
        self.proc.stdin.flush()

    def call(self, op, timeout=120, **kw):
        self.send(op, **kw)
        return self.reply(timeout)

    def reply(self, timeout=120):
        r = self._read(timeout)
        if r.get("error"):
            raise RuntimeError(f"rack {self.name}: {r['error']}")
        return r

    def kill(self):
        """The rack's host dies: its process and its cxlkvd, SIGKILL."""
        if getattr(self, "proc", None) is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.cxlkvd.kill()
        self._remove_pool()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.call("close", timeout=30)
            except (RuntimeError, TimeoutError, OSError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.cxlkvd.stop()
        self._remove_pool()
        self.errlog.close()

    def _remove_pool(self):
        name = self.pool.split(":")[1]
        for f in os.listdir("/dev/shm"):
            if f == name:
                os.unlink(os.path.join("/dev/shm", f))
        # node-local files of a killed rack: named after the pool id, which
        # only the pool knows; a killed rack's are left (they are small).


class Racks:
    """Master + racks (names) on their network."""

    def __init__(self, names, logdir, segment_mib=256, master_args=(), **rack_kw):
        """``segment_mib``: the memory each rack's client lends the store
        (an int, or {rack: MiB}; 0 lends none); ``master_args``: more
        mooncake_master flags."""
        os.makedirs(logdir, exist_ok=True)
        self.segment_mib = segment_mib if isinstance(segment_mib, dict) else {n: segment_mib for n in names}
        self.logdir = logdir
        self.net = Net(names)
        self.mode = self.net.mode
        self.rack_kw = rack_kw
        self.namespace = f"t{os.getpid()}"
        self.racks = {}
        try:
            self.master = Master(self.net.master_addr, logdir, master_args)
            for n in names:
                self.racks[n] = RackProc(n, self.net, self.master, logdir, self.namespace,
                                         segment_mib=self.segment_mib[n], **rack_kw)
        except BaseException:
            self.close()
            raise

    def __getitem__(self, name):
        return self.racks[name]

    def engine_env(self, name):
        """The environment that puts an engine's KV stores in rack ``name``
        on the racks' store, lending it no memory (the rack's host does, so
        what the engine pushed outlives it; docs/remote.md "With the engine
        adapters")."""
        return {"CXLKV_REMOTE_MASTER": self.master.rpc, "CXLKV_REMOTE_METADATA": self.master.metadata,
                "CXLKV_REMOTE_HOST": self.net.addr[name], "CXLKV_REMOTE_NAMESPACE": self.namespace,
                "CXLKV_REMOTE_SEGMENT_BYTES": "0", "CXLKV_REMOTE_TIMEOUT_S": "10"}

    def run_engine_until_pushed(self, name, workdir, engine, spec, want, timeout=900):
        """Run vLLM engine ``engine`` (vllm_util's ``spec``) in rack ``name``
        on the racks' store, holding it up after its rounds until the store
        holds every key of ``want`` (a background push is dropped when its
        process exits) or ``timeout`` s passed.  Returns the engine's OUT and
        the last ``keys_state`` of ``want`` (None if the engine never
        finished its rounds); the caller judges it."""
        from vllm_util import finish_engine, start_engine  # noqa: PLC0415 -- the engine environment only
        hold = os.path.join(str(workdir), f"{engine}.hold")
        if os.path.exists(hold):
            os.remove(hold)
        spec = dict(spec, env=dict(spec.get("env", {}), **self.engine_env(name)), hold_file=hold)
        p, out, logp = start_engine(workdir, engine, spec, prefix=self.net.prefix(name))
        state = None
        try:
            deadline = time.monotonic() + timeout
            while p.poll() is None and time.monotonic() < deadline:
                if os.path.exists(out):
                    state = self.racks[name].call("keys_state", keys=want)
                    if state["remote"] == [1] * len(want):
                        break
                time.sleep(0.2)
        finally:
            open(hold, "w").close()
        return finish_engine(p, out, logp), state

    def restart_rack(self, name):
        self.racks[name].kill()
        self.racks[name] = RackProc(name, self.net, self.master, self.logdir, self.namespace,
                                    segment_mib=self.segment_mib[name], **self.rack_kw)
        return self.racks[name]

    def close(self):
        for r in self.racks.values():
            r.close()
        if getattr(self, "master", None):
            self.master.stop()
        self.net.close()
