# SPDX-License-Identifier: MIT
"""LMCache's multiprocess (MP) mode around real vLLM engines on the CPU, for
the engine tests and the engine benchmark.

In MP mode each vLLM engine runs LMCache's own connector
(``lmcache.integration.vllm.lmcache_mp_connector.LMCacheMPConnector``) and
talks over ZMQ to an LMCache server process, which holds the chunks in its
L1 (CPU memory) and, with an ``--l2-adapter``, in an L2 behind it.  On a CPU
worker LMCache picks its "engine-driven" transfer (the worker gathers its
paged KV into CPU buffers and ships them to the server, and scatters loads
back), so the server must offer that mode.

Two ways two engines share KV:

* plain LMCache (what LMCache itself offers on one host): one server, both
  engines connected to it; they share the server's L1.
* through a cxlkv pool: one server per engine (per host), each with the
  cxlkv native plugin as its L2 on its own node of the pool; a chunk one
  server stored reaches the other only through the pool.

:func:`lmcache_server` starts and stops a server, :func:`lmcache_engine_spec`
gives the ``lmcache`` key of a vllm_engine.py spec that connects to it.
"""
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from vllm_util import engine_env

CONNECTOR = "LMCacheMPConnector"
# LMCache's own connector, not vLLM's in-tree copy of it: vLLM 0.32's copy
# builds LMCache's MP adapters with keywords LMCache 0.5.6 no longer takes
# (server_url= where 0.5.6 takes server_urls=).
CONNECTOR_MODULE = "lmcache.integration.vllm.lmcache_mp_connector"
READY_LINE = "LMCache cache server is running..."


def free_port():
    """A TCP port free now on the loopback (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cxlkv_l2_adapter(uri, node, **params):
    """The ``--l2-adapter`` JSON of the cxlkv native plugin on ``node`` of
    the pool ``uri`` (``params``: the plugin's other keywords)."""
    return json.dumps({"type": "native_plugin", "module_path": "cxlkv.integrations.lmcache",
                       "class_name": "CxlkvNativePlugin", "adapter_params": dict(pool=uri, node=node, **params)})


class LMCacheServer:
    """A running LMCache MP server: its ``url`` for the connector, its
    Prometheus ``metrics_port``, the process and its log."""

    def __init__(self, proc, host, port, metrics_port, log_path):
        self.proc, self.host, self.port = proc, host, port
        self.metrics_port, self.log_path = metrics_port, log_path

    @property
    def url(self):
        return f"tcp://{self.host}:{self.port}"

    def log_tail(self, n=6000):
        with open(self.log_path, errors="replace") as f:
            return f.read()[-n:]

    def metrics(self):
        """The server's Prometheus samples, name -> value summed over labels
        (LMCache's own counters, e.g. ``lmcache_mp_lookup_hit_l2_tokens_total``)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{", 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                pass
        return out

    def metric(self, prefix):
        """Sum of the samples whose name starts with ``prefix`` and ends in
        ``_total`` (OpenTelemetry's Prometheus exporter appends the unit and
        ``_total`` to a counter's name)."""
        return sum(v for k, v in self.metrics().items() if k.startswith(prefix) and k.endswith("_total"))


def _wait_ready(srv, timeout):
    deadline = time.monotonic() + timeout
    while True:
        if srv.proc.poll() is not None:
            raise AssertionError(f"LMCache server exited ({srv.proc.returncode}) before it was ready:\n"
                                 f"{srv.log_tail()}")
        # The server logs READY_LINE after its request socket is bound; the
        # connect checks that the port is really its.
        if READY_LINE in srv.log_tail(1 << 20):
            with contextlib.suppress(OSError), socket.create_connection((srv.host, srv.port), timeout=1):
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"LMCache server not ready within {timeout} s:\n{srv.log_tail()}")
        time.sleep(0.2)


def stop_server(srv, timeout=30):
    """SIGINT first (the server's own shutdown: closes its L2 adapters, so
    the cxlkv plugin gives back its pins and detaches), SIGKILL of its
    process group if it does not exit in ``timeout`` s."""
    if srv.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(srv.proc.pid, signal.SIGINT)
        try:
            srv.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(60)


def start_server(workdir, name, l2_adapter=None, chunk_size=64, l1_gb=0.25, shm=False, extra_args=(),
                 env=None, timeout=180):
    """Start an LMCache MP server offering the engine-driven transfer of CPU
    workers; ``l2_adapter``: an ``--l2-adapter`` JSON (e.g.
    :func:`cxlkv_l2_adapter`), None for LMCache's L1 alone; ``shm``: move
    the KV between worker and server through a POSIX shared-memory segment
    instead of pickled messages.  Returns an :class:`LMCacheServer` once it
    accepts connections."""
    host, port, mport = "127.0.0.1", free_port(), free_port()
    args = [sys.executable, "-m", "lmcache.v1.multiprocess.server", "--host", host, "--port", str(port),
            "--chunk-size", str(chunk_size), "--supported-transfer-mode", "engine_driven",
            "--l1-size-gb", str(l1_gb), "--eviction-policy", "LRU", "--prometheus-port", str(mport)]
    if shm:
        args += ["--shm-name", f"cxlkv-lmc-{os.getpid()}-{port}"]
    if l2_adapter is not None:
        args += ["--l2-adapter", l2_adapter]
    args += list(extra_args)
    e = engine_env()
    # No usage reports to LMCache's collector from a test machine.
    e.update(LMCACHE_TRACK_USAGE="false", DO_NOT_TRACK="1")
    e.update(env or {})
    log_path = os.path.join(str(workdir), f"{name}.lmcache.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, env=e, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    srv = LMCacheServer(proc, host, port, mport, log_path)
    try:
        _wait_ready(srv, timeout)
    except BaseException:
        stop_server(srv)
        raise
    return srv


@contextlib.contextmanager
def lmcache_server(workdir, name="lmcache", **kw):
    """:func:`start_server` as a context manager: the server is stopped (and
    killed if need be) on the way out."""
    srv = start_server(workdir, name, **kw)
    try:
        yield srv
    finally:
        stop_server(srv)


def lmcache_engine_spec(server, **extra):
    """The ``lmcache`` key of a vllm_engine.py spec: LMCache's MP connector
    connected to ``server`` (an :class:`LMCacheServer` or a URL);
    ``extra``: further ``lmcache.mp.*`` settings, given without the prefix
    (e.g. ``mq_timeout=60``)."""
    url = server.url if isinstance(server, LMCacheServer) else str(server)
    cfg = {"lmcache.mp.server_urls": url, "lmcache.mp.mp_transfer_mode": "engine_driven"}
    cfg.update({f"lmcache.mp.{k}": v for k, v in extra.items()})
    return dict(connector=CONNECTOR, module_path=CONNECTOR_MODULE, extra=cfg)


def lmcache_env():
    """Environment of an engine running LMCache's connector (the ``env`` key
    of a vllm_engine.py spec)."""
    return {"LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1"}
