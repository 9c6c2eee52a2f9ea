# SPDX-License-Identifier: MIT
"""Metrics an engine operator expects, in Prometheus text format.

Two sources, one naming scheme (``cxlkv_`` prefix, units in the name:
``_seconds``, ``_bytes``, ``_total``):

* The pool-wide KV statistics every node writes into the pool (counters and
  latency histograms): :func:`pool_exposition` returns the text of the C call
  ``cxlkv_stats_prometheus``, the very function behind ``cxlkvctl stats
  --prometheus`` (one definition, ``libruntime/include/cxlkv/metrics.hpp``).
* This process's client view (what an engine asked and got, in tokens):
  :class:`Metrics`, counted by :class:`cxlkv.KvStore` (``metrics=``) and the
  engine adapters: ``cxlkv_client_query_tokens_total``,
  ``cxlkv_client_hit_tokens_total``, ``cxlkv_client_load_bytes_total``,
  ``cxlkv_client_store_bytes_total``, ``cxlkv_client_lease_expiries_total``
  and the histograms ``cxlkv_client_{lookup,load,store}_seconds``.  With a
  remote tier (:mod:`cxlkv.remote`): ``cxlkv_client_remote_*_total`` per
  tier counter (hits, bytes, refused blocks, errors, timeouts, pushes), the
  gauge ``cxlkv_client_remote_up`` and ``cxlkv_client_remote_fetch_seconds``.
  ``cxlkv_client_hit_tokens_total`` counts the pool's own hits; the remote
  tier's are ``cxlkv_client_remote_hit_tokens_total``.
"""
import bisect
import os
import ctypes as C
import threading

from . import _lib

# Histogram bucket bounds (seconds): 2^k ns for k = 10 .. 32, the pool's
# octave buckets, so client and pool histograms line up.
BUCKETS = tuple(2.0 ** k * 1e-9 for k in range(10, 33))


def pool_exposition(pool):
    """Prometheus text of every node's KV statistics in ``pool``."""
    L = _lib.lib()
    with pool._lock:  # the mapping stays while the C call reads it
        n = _lib.check(L.cxlkv_stats_prometheus(pool.handle, None, 0), f"metrics of {pool.uri}")
        buf = C.create_string_buffer(n + 1)
        _lib.check(L.cxlkv_stats_prometheus(pool.handle, buf, n + 1), f"metrics of {pool.uri}")
    return buf.value.decode()


class _Histogram:
    def __init__(self):
        self.counts = [0] * (len(BUCKETS) + 1)
        self.sum = 0.0
        self.n = 0

    def observe(self, v):
        self.counts[bisect.bisect_left(BUCKETS, v)] += 1
        self.sum += v
        self.n += 1


class Metrics:
    """Client-side counters and latency histograms of one process (thread-safe)."""

    COUNTERS = {
        "cxlkv_client_query_tokens_total": "Tokens whose KV was looked up",
        "cxlkv_client_hit_tokens_total": "Tokens whose KV the pool held",
        "cxlkv_client_load_bytes_total": "KV bytes loaded from the pool",
        "cxlkv_client_store_bytes_total": "KV bytes stored into the pool",
        "cxlkv_client_stored_blocks_total": "Blocks in the pool after a store (written or already there)",
        "cxlkv_client_lease_expiries_total": "Leases this process released after they had ended (ttl or consumer death)",
        "cxlkv_client_loaded_blocks_total": "Blocks an engine adapter read into the engine's KV cache",
        "cxlkv_client_load_failed_blocks_total": "Blocks an engine adapter could not load (the engine recomputes them)",
        "cxlkv_client_adapter_load_seconds_total": "Seconds an engine adapter spent in its load calls (keys, pins, copies)",
        "cxlkv_client_adapter_save_seconds_total": "Seconds an engine adapter spent in its save calls (keys, copies, publish)",
        "cxlkv_client_raw_load_seconds_total":
            "Seconds the raw scatter-reads of an adapter's loaded blocks took beside them (adapter option raw_baseline)",
        "cxlkv_client_raw_load_blocks_total": "Blocks the raw_baseline option copied beside an adapter's loads",
        "cxlkv_client_raw_save_seconds_total":
            "Seconds the raw gather-writes of an adapter's saved blocks took beside them (adapter option raw_baseline)",
        "cxlkv_client_raw_save_blocks_total": "Blocks the raw_baseline option copied beside an adapter's saves",
    }
    # The remote tier's counters (cxlkv.remote.COUNTERS), one per name there:
    # remote_hit_blocks -> cxlkv_client_remote_hit_blocks_total.
    REMOTE_COUNTERS = {}
    HISTOGRAMS = {
        "cxlkv_client_lookup_seconds": "Latency of a lookup call",
        "cxlkv_client_load_seconds": "Latency of a load (get) call",
        "cxlkv_client_store_seconds": "Latency of a store (put) call",
        "cxlkv_client_remote_fetch_seconds": "Latency of a remote tier fetch that brought blocks into the pool",
    }
    GAUGES = {
        "cxlkv_client_remote_up": "1 while the remote tier answers, 0 while it is degraded (local-only)",
    }

    def __init__(self, labels=None):
        self._lock = threading.Lock()
        self.labels = dict(labels or {})
        if not Metrics.REMOTE_COUNTERS:
            from .remote import COUNTERS as rc  # noqa: PLC0415
            Metrics.REMOTE_COUNTERS = {f"cxlkv_client_{k}_total": v for k, v in rc.items()}
            Metrics.REMOTE_COUNTERS["cxlkv_client_remote_hit_tokens_total"] = \
                "Tokens whose KV a lookup brought from the remote tier into the pool"
        self.counters = {k: 0 for k in {**self.COUNTERS, **self.REMOTE_COUNTERS}}
        self.hist = {k: _Histogram() for k in self.HISTOGRAMS}
        self.gauges = {}  # set once a remote tier reports

    def inc_remote(self, name, v=1):
        """Add ``v`` to the remote tier's counter ``name`` (a key of
        :data:`cxlkv.remote.COUNTERS`)."""
        self.inc(f"cxlkv_client_{name}_total", v)

    def set_remote_up(self, up):
        """Set the gauge ``cxlkv_client_remote_up`` (1: the remote tier answers,
        0: degraded); the remote tier's series are exposed from then on."""
        with self._lock:
            self.gauges["cxlkv_client_remote_up"] = 1 if up else 0

    def observe_remote_fetch(self, tokens, seconds):
        """Count one remote fetch that brought ``tokens`` tokens' blocks into the pool."""
        with self._lock:
            self.counters["cxlkv_client_remote_hit_tokens_total"] += tokens
            self.hist["cxlkv_client_remote_fetch_seconds"].observe(seconds)

    def inc(self, name, v=1):
        """Add ``v`` to counter ``name`` (one of :attr:`COUNTERS`)."""
        with self._lock:
            self.counters[name] += v

    def observe_lookup(self, queried_blocks, hit_blocks, block_tokens, seconds):
        """Count one lookup: blocks asked and hit (as tokens) and its latency."""
        with self._lock:
            self.counters["cxlkv_client_query_tokens_total"] += queried_blocks * block_tokens
            self.counters["cxlkv_client_hit_tokens_total"] += hit_blocks * block_tokens
            self.hist["cxlkv_client_lookup_seconds"].observe(seconds)

    def observe_load(self, nbytes, seconds):
        """Count one load (get): bytes read and its latency."""
        with self._lock:
            self.counters["cxlkv_client_load_bytes_total"] += nbytes
            self.hist["cxlkv_client_load_seconds"].observe(seconds)

    def observe_store(self, nbytes, blocks, seconds):
        """Count one store (put): bytes written, blocks now in the pool, latency."""
        with self._lock:
            self.counters["cxlkv_client_store_bytes_total"] += nbytes
            self.counters["cxlkv_client_stored_blocks_total"] += blocks
            self.hist["cxlkv_client_store_seconds"].observe(seconds)

    def hit_rate(self):
        """Hit tokens / queried tokens (0 when nothing was queried)."""
        q = self.counters["cxlkv_client_query_tokens_total"]
        return self.counters["cxlkv_client_hit_tokens_total"] / q if q else 0.0

    def exposition(self):
        """Prometheus text of this process's client metrics."""
        lab = ",".join(f'{k}="{v}"' for k, v in sorted(self.labels.items()))
        out = []
        with self._lock:
            # The remote tier's series appear once a tier reports (its gauge is set).
            remote = "cxlkv_client_remote_up" in self.gauges
            for name, help_ in {**self.COUNTERS, **(self.REMOTE_COUNTERS if remote else {})}.items():
                out += [f"# HELP {name} {help_}", f"# TYPE {name} counter",
                        f"{name}{{{lab}}} {self.counters[name]}" if lab else f"{name} {self.counters[name]}"]
            for name, help_ in self.HISTOGRAMS.items():
                if name.startswith("cxlkv_client_remote_") and not remote:
                    continue
                h = self.hist[name]
                out += [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
                acc = 0
                pre = lab + "," if lab else ""
                for le, c in zip(BUCKETS, h.counts):
                    acc += c
                    out.append(f'{name}_bucket{{{pre}le="{le:.9g}"}} {acc}')
                out.append(f'{name}_bucket{{{pre}le="+Inf"}} {h.n}')
                sfx = f"{{{lab}}}" if lab else ""
                out += [f"{name}_sum{sfx} {h.sum:.9g}", f"{name}_count{sfx} {h.n}"]
            for name, v in self.gauges.items():
                out += [f"# HELP {name} {self.GAUGES[name]}", f"# TYPE {name} gauge",
                        f"{name}{{{lab}}} {v}" if lab else f"{name} {v}"]
        return "\n".join(out) + "\n"

    def counters_total(self):
        """The sum of every counter: it moves whenever one does (for a writer
        that rewrites its textfile only after a change)."""
        with self._lock:
            return sum(self.counters.values())

    def write_textfile(self, path):
        """Write :meth:`exposition` to ``path`` whole (a temporary file renamed
        over it), for a Prometheus node exporter's textfile collector or a
        test reading what an engine's worker process did."""
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(self.exposition())
        os.replace(tmp, path)

    def counter(self, name):
        """The value of counter ``name``."""
        with self._lock:
            return self.counters[name]


def read_textfile(path):
    """The samples of a file :meth:`Metrics.write_textfile` wrote: {name: value},
    labels dropped (one process's file has one label set)."""
    out = {}
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, _, value = line.rpartition(" ")
            out[name.split("{", 1)[0]] = float(value)
    return out


def exposition(pool=None, metrics=None):
    """The pool's text (if ``pool``) followed by the client metrics (if given)."""
    parts = []
    if pool is not None:
        parts.append(pool_exposition(pool))
    if metrics is not None:
        parts.append(metrics.exposition())
    return "".join(parts)
