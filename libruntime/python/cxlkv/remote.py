# SPDX-License-Identifier: MIT
"""The remote tier: pools in different racks share KV blocks through a
Mooncake Store (a distributed KV store with its own master and transfer
engine), below each rack's pool.  Off unless configured; see docs/remote.md
for the operator's view.

* Publish: a block a :class:`cxlkv.KvStore` publishes is queued here; a
  background thread leases it in the pool at once (a handoff lease to this
  tier, so the pool does not evict it before its push: docs/remote.md
  "Holding a block until its push"), and another reads a batch of held
  blocks back from the pool (its own KV handle, so the engine's handle is
  never taken), puts them into Mooncake under the same key and releases
  their leases.  The local publish only appends keys to a bounded queue.
* Lookup: when the pool holds fewer leading blocks than asked, the rest of
  the prefix is asked of Mooncake with one batched existence check; the
  leading hits are fetched into a registered staging buffer, verified, and
  published into the local pool, so the caller's next ``get`` (and every
  other host of this rack) finds them as local hits.
* Every object carries our own 64-byte header (magic, key, payload length,
  payload checksum, header checksum): a block whose header does not match
  the key asked for, or whose payload does not match its checksum, is
  refused and never reaches the pool.
* Faults: every call to Mooncake on the lookup path runs on one worker
  thread and is waited for at most ``timeout_s``.  A call that fails with an
  RPC error or runs late puts the tier in the degraded state: logged once,
  counted, lookups are local-only (they do not wait for Mooncake at all)
  until a probe, at most one per ``retry_s`` and never waited for, succeeds.

Mooncake is used through its Python module (``mooncake.store``): the
installed package exports no C interface.  It is imported only when a tier
is made, so the package works without it.
"""
import atexit
import collections
import concurrent.futures as cf
import ctypes as C
import dataclasses
import logging
import os
import socket
import struct
import threading
import time
import urllib.error
import urllib.request

import numpy as np

from . import _lib
from .keys import as_keys, to_hex

log = logging.getLogger("cxlkv.remote")

# ---- the block header -------------------------------------------------------
# 64 bytes, little-endian, in front of every payload in Mooncake:
#   0  magic  "CXKVRMT1"            8
#   8  header bytes (64)            u32
#  12  version (1)                  u32
#  16  key lo, key hi               u64 u64
#  32  payload bytes                u64
#  40  payload checksum             u64  (cxlkv_checksum64: XXH3-64)
#  48  header checksum              u64  (cxlkv_checksum64 of bytes 0..47)
#  56  zero                         u64
MAGIC = b"CXKVRMT1"
HEADER_BYTES = 64
_HDR = struct.Struct("<8sIIQQQQQQ")
assert _HDR.size == HEADER_BYTES

# Mooncake's status codes this module tells apart (its Python calls return
# them as negative ints).  Anything else is reported by number.
MC_NO_AVAILABLE_HANDLE = -200  # no segment has room for the object: the store is full
MC_NOT_FOUND = -704
MC_ALREADY_EXISTS = -705
MC_RPC_FAIL = -900
MC_RPC_TIMEOUT = -901
MC_INVALID_PARAMS = -600
_MC_NAMES = {MC_NOT_FOUND: "object not found", MC_RPC_FAIL: "RPC to the master failed",
             MC_RPC_TIMEOUT: "RPC to the master timed out", MC_INVALID_PARAMS: "invalid parameters",
             MC_NO_AVAILABLE_HANDLE: "no room in the store", MC_ALREADY_EXISTS: "object already exists"}
# Codes that say the master (not one object or one peer) is unreachable.
_MASTER_DOWN = {MC_RPC_FAIL, MC_RPC_TIMEOUT}


def mc_error(code):
    """Text of a Mooncake status code."""
    return f"Mooncake error {code} ({_MC_NAMES.get(code, 'see Mooncake types')})"


def checksum64(buf):
    """XXH3-64 of a buffer (an address and length pair, or a bytes-like
    object), computed by libcxlkv (``cxlkv_checksum64``)."""
    if isinstance(buf, tuple):
        addr, n = buf
    else:
        a = np.frombuffer(buf, dtype=np.uint8)
        addr, n = a.ctypes.data, a.size
    return int(_lib.lib().cxlkv_checksum64(addr, n))


def _header_into(view, key, length, payload_sum):
    """Write the header of ``key`` into ``view`` (a uint8 array of 64 bytes)."""
    lo, hi = int(key[0]), int(key[1])
    raw = _HDR.pack(MAGIC, HEADER_BYTES, 1, lo, hi, length, payload_sum, 0, 0)
    hsum = checksum64(raw[:48])
    view[:] = np.frombuffer(_HDR.pack(MAGIC, HEADER_BYTES, 1, lo, hi, length, payload_sum, hsum, 0), np.uint8)


def check_block(obj, key, got_bytes):
    """Why the object ``obj`` (a uint8 array: header then payload, of which
    ``got_bytes`` were received) is not block ``key``, or None if it is."""
    return check_parts(obj[:HEADER_BYTES], obj.ctypes.data + HEADER_BYTES, key, got_bytes)


def check_parts(hdr, payload_addr, key, got_bytes):
    """check_block of an object received in two places: its header ``hdr``
    (a uint8 array) and its payload at address ``payload_addr``."""
    if got_bytes < HEADER_BYTES:
        return f"{got_bytes} bytes, shorter than the {HEADER_BYTES}-byte block header"
    obj = hdr
    magic, hbytes, ver, lo, hi, length, psum, hsum, _ = _HDR.unpack(obj[:HEADER_BYTES].tobytes())
    if magic != MAGIC:
        return "no cxlkv block header (another writer's object, or damaged)"
    if hsum != checksum64(obj[:48].tobytes()):
        return "block header checksum mismatch"
    if hbytes != HEADER_BYTES or ver != 1:
        return f"block header version {ver} / size {hbytes} is not ours (1 / {HEADER_BYTES})"
    if (lo, hi) != (int(key[0]), int(key[1])):
        return f"block header names key {hi:016x}{lo:016x}"
    if length != got_bytes - HEADER_BYTES:
        return f"block header says {length} payload bytes, {got_bytes - HEADER_BYTES} arrived"
    if psum != checksum64((payload_addr, length)):
        return "payload checksum mismatch"
    return None


# ---- configuration ------------------------------------------------------------
_ENV = {  # RemoteConfig field: environment variable
    "master": "CXLKV_REMOTE_MASTER", "metadata_server": "CXLKV_REMOTE_METADATA",
    "protocol": "CXLKV_REMOTE_PROTOCOL", "local_hostname": "CXLKV_REMOTE_HOST",
    "rdma_devices": "CXLKV_REMOTE_RDMA_DEVICES", "segment_bytes": "CXLKV_REMOTE_SEGMENT_BYTES",
    "buffer_bytes": "CXLKV_REMOTE_BUFFER_BYTES", "namespace": "CXLKV_REMOTE_NAMESPACE",
    "timeout_s": "CXLKV_REMOTE_TIMEOUT_S", "retry_s": "CXLKV_REMOTE_RETRY_S",
    "batch_blocks": "CXLKV_REMOTE_BATCH_BLOCKS", "queue_blocks": "CXLKV_REMOTE_QUEUE_BLOCKS",
    "max_fetch_blocks": "CXLKV_REMOTE_MAX_FETCH_BLOCKS", "block_bytes": "CXLKV_REMOTE_BLOCK_BYTES",
    "publish": "CXLKV_REMOTE_PUBLISH", "fetch": "CXLKV_REMOTE_FETCH",
    "close_drain_s": "CXLKV_REMOTE_CLOSE_DRAIN_S", "hold_blocks": "CXLKV_REMOTE_HOLD_BLOCKS",
    "hold_ttl_s": "CXLKV_REMOTE_HOLD_TTL_S", "push_min_blocks": "CXLKV_REMOTE_PUSH_MIN_BLOCKS",
    "push_pressure_s": "CXLKV_REMOTE_PUSH_PRESSURE_S",
}


@dataclasses.dataclass(frozen=True)
class RemoteConfig:
    """Where the Mooncake Store is and how this process joins it.

    ``master``: the master's RPC address (``host:port``), required.
    ``metadata_server``: the transfer engine's metadata service
    (``http://host:port/metadata`` for the master's built-in HTTP one; default:
    the master's host, port 8080).  ``protocol``: ``tcp`` (or ``rdma`` with
    ``rdma_devices``).  ``local_hostname``: the address other racks reach this
    process at (default: the local address of the route to the master; a port
    is chosen by Mooncake).  ``segment_bytes``: memory this process lends to
    the store (0: none, this process only uses the others'); ``buffer_bytes``:
    Mooncake's own transfer buffer.
    ``namespace``: prefix of every object name, so several deployments can
    share one store.  ``timeout_s``: the longest a lookup waits for Mooncake;
    ``retry_s``: probe interval while degraded.  ``batch_blocks``: blocks per
    put or get call; ``queue_blocks``: publishes waiting to be pushed (more
    are dropped and counted); ``max_fetch_blocks``: the most blocks one lookup
    fetches; ``block_bytes``: the payload size to size the fetch buffer for
    (learned from publishes and objects; a hint only).  ``publish`` /
    ``fetch``: each direction can be turned off.  ``close_drain_s``: how long
    closing the tier (or the process exiting) waits for queued pushes while
    the store answers; what is left then is dropped and counted (the blocks
    stay in the local pool).  ``hold_blocks``: the most queued blocks held
    in the pool (leased to this tier, so not evicted) until their push; 0
    holds none; held blocks count against the pool's capacity, so keep it
    well below it.  ``hold_ttl_s``: a hold ends by itself after this long
    (a push later than that may find its block evicted).
    ``push_min_blocks``: while the store is short of room (it refused a put
    as full within the last ``push_pressure_s``; 0: always), a published
    block is pushed only once its chain reaches this many blocks; shorter
    chains stay in the rack's pool, and their blocks are pushed when a
    longer chain through them reaches it (docs/remote.md "Pushing
    selectively"); 0 pushes every block."""

    master: str
    metadata_server: str = ""
    protocol: str = "tcp"
    local_hostname: str = ""
    rdma_devices: str = ""
    segment_bytes: int = 512 << 20
    buffer_bytes: int = 64 << 20
    namespace: str = "default"
    timeout_s: float = 2.0
    retry_s: float = 1.0
    batch_blocks: int = 64
    queue_blocks: int = 8192
    max_fetch_blocks: int = 1024
    block_bytes: int = 0
    publish: bool = True
    fetch: bool = True
    close_drain_s: float = 2.0
    hold_blocks: int = 1024
    hold_ttl_s: float = 30.0
    push_min_blocks: int = 56
    push_pressure_s: float = 300.0

    def __post_init__(self):
        if not isinstance(self.master, str) or ":" not in self.master:
            raise ValueError(f"cxlkv: remote tier: master {self.master!r} is not host:port (the mooncake_master "
                             "RPC address)")
        for f in ("buffer_bytes", "batch_blocks", "queue_blocks", "max_fetch_blocks"):
            if int(getattr(self, f)) <= 0:
                raise ValueError(f"cxlkv: remote tier: {f} {getattr(self, f)} is not positive")
        if int(self.segment_bytes) < 0:  # 0: a member that lends the store no memory
            raise ValueError(f"cxlkv: remote tier: segment_bytes {self.segment_bytes} is negative")
        if self.timeout_s <= 0 or self.retry_s <= 0:
            raise ValueError("cxlkv: remote tier: timeout_s and retry_s must be positive")
        if int(self.hold_blocks) < 0:
            raise ValueError(f"cxlkv: remote tier: hold_blocks {self.hold_blocks} is negative")
        if not 0.001 <= self.hold_ttl_s <= (1 << 30) / 1000:  # a lease's time to live (docs/eviction.md)
            raise ValueError(f"cxlkv: remote tier: hold_ttl_s {self.hold_ttl_s} is not 0.001 .. 1073741.824")
        if int(self.push_min_blocks) < 0 or self.push_pressure_s < 0:
            raise ValueError(f"cxlkv: remote tier: push_min_blocks {self.push_min_blocks} and push_pressure_s "
                             f"{self.push_pressure_s} must not be negative")
        if self.close_drain_s < 0:
            raise ValueError(f"cxlkv: remote tier: close_drain_s {self.close_drain_s} is negative")
        if "/" in self.namespace:
            raise ValueError(f"cxlkv: remote tier: namespace {self.namespace!r} contains '/'")

    @property
    def metadata(self):
        if self.metadata_server:
            return self.metadata_server
        return f"http://{self.master.rsplit(':', 1)[0]}:8080/metadata"

    @classmethod
    def from_dict(cls, d):
        """A config from a mapping (an engine's extra config), values as
        given or as strings; unknown names raise ValueError naming them."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        bad = sorted(set(d) - set(fields))
        if bad:
            raise ValueError(f"cxlkv: remote tier: unknown settings {bad}; known: {sorted(fields)}")
        kw = {}
        for k, v in d.items():
            t = fields[k].type
            if t in ("int", int):
                kw[k] = int(v)
            elif t in ("float", float):
                kw[k] = float(v)
            elif t in ("bool", bool):
                kw[k] = v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes", "on")
            else:
                kw[k] = str(v)
        if "master" not in kw:
            raise ValueError("cxlkv: remote tier: no master (the mooncake_master RPC address, host:port)")
        return cls(**kw)

    @classmethod
    def from_env(cls, env=None):
        """The config the ``CXLKV_REMOTE_*`` variables give, or None when
        ``CXLKV_REMOTE_MASTER`` is unset or empty (the tier is off)."""
        env = os.environ if env is None else env
        if not env.get(_ENV["master"]):
            return None
        return cls.from_dict({k: env[v] for k, v in _ENV.items() if env.get(v)})


def _host_port(addr):
    """(host, port) of ``host:port`` or of a ``scheme://host:port/...`` URL; None if it names no port."""
    rest = addr.split("://", 1)[-1].split("/", 1)[0]
    host, sep, port = rest.rpartition(":")
    return (host.strip("[]"), int(port)) if sep and host and port.isdigit() else None


def _route_address(master):
    """The local address of the route to ``master`` (no packet is sent)."""
    hp = _host_port(master)
    if hp is None:  # _preflight refuses such a master before this is asked
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(hp)
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _preflight(master, metadata, timeout):
    """Why the store cannot be joined now, or None: the master's RPC port
    takes a TCP connection and an HTTP metadata server answers a GET (any
    status), each within ``timeout`` seconds.

    Mooncake's ``setup`` keeps the Python interpreter lock while it retries
    its master (measured: 20 tries of up to 30 s each against a master that
    accepts connections but does not answer; about 90 s against an address
    that drops them), so every thread of the process, the engine's too,
    would wait with it.  These checks release the lock; they cover a master
    that is down, unreachable or stopped (its HTTP server is its own), not
    one that stalls after answering them (docs/remote.md "Faults")."""
    hp = _host_port(master)
    if hp is None:
        return f"master address {master!r} is not host:port"
    try:
        socket.create_connection(hp, timeout).close()
    except OSError as e:
        return f"master {master} takes no connection in {timeout:g} s: {e}"
    if metadata.startswith(("http://", "https://")):
        # Straight to the server: a proxy set for the process must not answer for it.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            opener.open(metadata + ("&" if "?" in metadata else "?") + "key=cxlkv-preflight", timeout=timeout).close()
        except urllib.error.HTTPError:
            pass  # it answered (a name nobody wrote: 404)
        except (OSError, ValueError) as e:
            return f"metadata server {metadata} does not answer in {timeout:g} s: {e}"
    return None


class RemoteUnavailable(Exception):
    """Mooncake did not answer in time, or the tier is degraded."""


# ---- counters ---------------------------------------------------------------
COUNTERS = {
    "remote_lookup_blocks": "Blocks a lookup asked the remote tier for (past the pool's hits)",
    "remote_hit_blocks": "Blocks fetched from the remote tier, verified and put into the pool",
    "remote_hit_bytes": "Payload bytes of those blocks",
    "remote_miss_blocks": "Blocks asked of the remote tier that it did not hold",
    "remote_refused_blocks": "Remote blocks refused by their header (key, length or checksum)",
    "remote_fetch_failures": "Remote fetches that failed: lookup-path calls that failed or ran late, refused blocks",
    "remote_errors": "Remote calls that failed (an error code or an exception)",
    "remote_timeouts": "Remote calls that ran past timeout_s (the lookup went on local-only)",
    "remote_degraded": "Times the tier went local-only (master unreachable or late)",
    "remote_recovered": "Times the tier came back after being degraded",
    "remote_skipped_lookups": "Lookups served local-only because the tier was degraded",
    "remote_pushed_blocks": "Blocks put into the remote tier",
    "remote_pushed_bytes": "Payload bytes of those blocks",
    "remote_push_present_blocks": "Published blocks the remote tier held already (not sent again)",
    "remote_push_dropped_blocks": "Published blocks not pushed (the sum of the four remote_push_*_blocks reasons below)",
    "remote_push_evicted_blocks": "Published blocks not pushed: evicted from the pool before their push read them",
    "remote_push_store_full_blocks": "Published blocks not pushed: refused by a full store (after one retry)",
    "remote_push_queue_full_blocks": "Published blocks not pushed: the push queue was full",
    "remote_push_failed_blocks": "Published blocks not pushed: the tier degraded, a failed put or read, or closing",
    "remote_push_retried_blocks": "Pushes refused by a full store and tried once more",
    "remote_push_skipped_blocks": "Published blocks the push policy kept back at their publish (a chain shorter than "
                                  "push_min_blocks while the store was short of room; not a drop)",
}
# Why a published block was not pushed: the counter of each reason (their
# sum is remote_push_dropped_blocks, the pool's push_dropped_blocks).
_DROP_REASONS = {"evicted": "remote_push_evicted_blocks", "store_full": "remote_push_store_full_blocks",
                 "queue_full": "remote_push_queue_full_blocks", "failed": "remote_push_failed_blocks"}
# The counters the node's stats in the pool also carry (docs/remote.md
# "Counters"): each adds to the pool's counter of the same name without
# "remote_" (cxlkv_kv_remote_count), which `cxlkvctl stats`, cxlkvd's
# metrics and cxlkv.metrics.pool_exposition show as cxlkv_remote_<name>_total.
POOL_COUNTERS = ("remote_hit_blocks", "remote_hit_bytes", "remote_miss_blocks", "remote_fetch_failures",
                 "remote_degraded", "remote_pushed_blocks", "remote_pushed_bytes", "remote_push_dropped_blocks",
                 "remote_push_evicted_blocks", "remote_push_store_full_blocks", "remote_push_queue_full_blocks",
                 "remote_push_failed_blocks", "remote_push_skipped_blocks", "remote_push_present_blocks",
                 "remote_timeouts", "remote_recovered")


class PushPolicy:
    """Which published blocks a tier pushes (docs/remote.md "Pushing
    selectively").  A store smaller than what the racks publish keeps what
    it was given last; most published blocks are never asked for again, so
    while the store is short of room (it refused a put as full within the
    last ``pressure_s``; 0: always) a block is pushed only once its chain
    reaches ``min_blocks`` blocks: long prompts, the prefixes worth a
    fetch from another rack, keep the store's room.  A block kept back stays
    in the rack's pool; a later put that extends its chain to the bound
    pushes it too, root first.  ``min_blocks`` 0 pushes every block.

    Depths come from the chains the tier sees: a lookup's keys run from
    their root, a put's from its parent, whose depth is known when this
    process looked it up or published it (else 0 is assumed: the chain is
    at least as long as the put)."""

    ENTRIES = 1 << 16  # chains remembered: blocks, the oldest forgotten first

    def __init__(self, min_blocks, pressure_s):
        self.min_blocks = int(min_blocks)
        self.pressure_s = float(pressure_s)
        self.on = self.min_blocks > 1
        self._full_at = None
        self._lock = threading.Lock()
        self._chains = collections.OrderedDict()  # key (lo, hi): [depth, parent key or None, kept back]

    def store_full(self):
        """The store refused a put for want of room (the pusher)."""
        self._full_at = time.monotonic()

    def pressed(self):
        """Whether the bound applies now."""
        if not self.on:
            return False
        if self.pressure_s == 0:
            return True
        t = self._full_at
        return t is not None and time.monotonic() - t < self.pressure_s

    def _note(self, k, depth, parent, kept):
        e = self._chains.get(k)
        if e is None:
            self._chains[k] = [depth, parent, kept]
            if len(self._chains) > self.ENTRIES:
                self._chains.popitem(last=False)
        else:  # seen before: its depth and parent stand; it stays kept back only if it was
            e[0] = max(e[0], depth)
            e[2] = e[2] and kept
            self._chains.move_to_end(k)

    def looked_up(self, keys, have):
        """A lookup of ``keys`` (from their root) that the pool held ``have``
        of: the depths of the blocks a put may publish next."""
        if not self.on:
            return
        first = max(have - 1, 0)  # from the last hit: the parent of what is published next
        prev = None
        with self._lock:
            for i, k in enumerate(keys[first:].tolist(), start=first):
                k = tuple(k)
                self._note(k, i, prev, False)
                prev = k

    def admit(self, ks, ok, parent):
        """One put chain: ``ks`` its keys ((lo, hi) tuples), ``ok`` which are
        in the pool, ``parent`` the key above the first or None.  Returns the
        keys to push (blocks kept back before and now reached, root first,
        then this chain's) and how many of this chain's are kept back."""
        with self._lock:
            pe = self._chains.get(parent) if parent is not None else None
            pd = -1 if parent is None else (pe[0] if pe is not None else 0)
            push = pd + 1 + len(ks) >= self.min_blocks or not self.pressed()
            out = []
            if push:
                p = parent
                while p is not None:
                    e = self._chains.get(p)
                    if e is None or not e[2]:
                        break
                    e[2] = False
                    out.append(p)
                    p = e[1]
                out.reverse()
            kept = 0
            prev = parent
            for i, (k, good) in enumerate(zip(ks, ok)):
                self._note(k, pd + 1 + i, prev, good and not push)
                prev = k
                if good:
                    if push:
                        out.append(k)
                    else:
                        kept += 1
            return out, kept


class RemoteTier:
    """One process's member of a Mooncake Store for one pool and node.
    Usually made by :func:`attach` (from :class:`cxlkv.KvStore`), shared by
    every store of that pool and node in the process."""

    def __init__(self, pool, node, config, metrics=None, connect_wait=True):
        if isinstance(config, dict):
            config = RemoteConfig.from_dict(config)
        if not isinstance(config, RemoteConfig):
            raise TypeError(f"cxlkv: remote tier config must be a RemoteConfig or a dict, not "
                            f"{type(config).__name__}")
        self.cfg = config
        self.pool = pool
        self.node = node
        self.metrics = metrics
        self._lock = threading.Lock()        # counters, state
        self._fetch_lock = threading.Lock()  # one fetch at a time (one staging buffer)
        self.counters = {k: 0 for k in COUNTERS}
        self._client = None
        self._up = False
        self._why = "not connected yet"
        self._ever_up = False               # the tier has been up (its master answered) since it started
        self._back_at = None                # when it last came back after that (monotonic)
        self._inflight = 0                  # calls on the worker not yet returned (late ones included)
        self._last_probe = 0.0
        self._probe_future = None
        self._closed = False
        self._slot_payload = int(config.block_bytes)
        self._staging = None                # fetch staging: (array, registered client)
        self._pstaging = None               # push staging
        self._worker = cf.ThreadPoolExecutor(1, thread_name_prefix="cxlkv-remote-call")
        # The push pipeline (docs/remote.md "Holding a block until its
        # push"), entries (key lo, key hi, payload bytes, held, tries):
        # _queue: published, not held yet; _ready: held (or not holdable),
        # waiting for the pusher; _retry: refused by a full store once,
        # (due time, entry).  One condition guards all three.
        self._queue = collections.deque()
        self._ready = collections.deque()
        self._retry = collections.deque()
        self._qcv = threading.Condition()
        self._held_keys = set()             # keys this tier leases now: each leased once, released once
        self.hold_blocks = int(config.hold_blocks)
        self.hold_peak = 0                  # the most blocks held at once (stats: remote_hold_peak_blocks)
        self.policy = PushPolicy(config.push_min_blocks, config.push_pressure_s)
        # The consumer id of this tier's leases: its own, so that releasing
        # them never ends a lease an engine holds for its decode.
        self._consumer = int.from_bytes(os.urandom(8), "little") | 1
        # The tier's own KV handle of this node: the holder leases published
        # blocks through it, the pusher reads them back and releases the
        # leases through it, and the node's remote counters in the pool are
        # added through it (_count).
        from .kv import KvStore  # noqa: PLC0415 -- kv imports this module
        self._reader = KvStore(pool, node, remote=False)
        # Counting never waits for the handle's lock (the pusher holds it
        # through a pool read, and counts come from the engine's put and
        # lookup): cxlkv_kv_remote_count is safe beside the handle's other
        # calls (cxlkv.h); this lock only keeps close() from closing the
        # handle under a count.
        self._ctr_lock = threading.Lock()
        self._ctr_h = self._reader._h.value if _lib.has("cxlkv_kv_remote_count") else None
        self.hostname = ""
        # Connect now (bounded); a master that is not there yet leaves the
        # tier degraded, and the probes connect later.
        fut = self._submit(self._connect)
        if connect_wait:
            try:
                fut.result(timeout=max(config.timeout_s, 5.0))
            except Exception as e:  # noqa: BLE001 -- degraded, reported by _connect / below
                self._down(f"connect: {type(e).__name__}: {e}" if str(e) else "connect: no answer in time")
        self._holder = threading.Thread(target=self._hold_loop, name="cxlkv-remote-hold", daemon=True)
        self._holder.start()
        self._pusher = threading.Thread(target=self._push_loop, name="cxlkv-remote-push", daemon=True)
        self._pusher.start()
        pool._adopt(self)

    _close_rank = 0  # before the KV stores: its reader is one of them

    # ---- state ------------------------------------------------------------------
    @property
    def up(self):
        """Whether lookups ask Mooncake (False while degraded)."""
        return self._up

    def _count(self, name, v=1, also=None):
        """Add ``v`` to counter ``name`` (and to ``also`` in the same step,
        so that stats() never sees one without the other)."""
        names = (name,) if also is None else (name, also)
        with self._lock:
            for n in names:
                self.counters[n] += v
        for n in names:
            if self.metrics is not None:
                self.metrics.inc_remote(n, v)
            if v and n in POOL_COUNTERS and self._ctr_h:
                with self._ctr_lock:
                    if self._ctr_h:  # None once closed: later counts reach the process's metrics only
                        _lib.lib().cxlkv_kv_remote_count(self._ctr_h, n[len("remote_"):].encode(), int(v))

    def _fetch_failed(self, name, v=1):
        """Count ``name`` (an error, a timeout, refused blocks) on the lookup path."""
        self._count(name, v)
        self._count("remote_fetch_failures", v)

    def _down(self, why):
        with self._lock:
            was = self._up
            self._up = False
            self._why = why
        if was or self.counters["remote_degraded"] == 0:
            self._count("remote_degraded")
            log.warning("cxlkv remote tier (Mooncake Store of master %s): %s; serving from the local pool only "
                        "until it answers",
                        self.cfg.master, why)
        if self.metrics is not None:
            self.metrics.set_remote_up(False)

    def _recovered(self):
        with self._lock:
            was = self._up
            self._up = True
        if not was:
            if self._ever_up:
                self._back_at = time.monotonic()  # back after losing its master, not its first connect
            self._ever_up = True
            if self.counters["remote_degraded"]:
                self._count("remote_recovered")
                log.warning("cxlkv remote tier (Mooncake Store of master %s): answering again; remote lookups "
                            "resume",
                            self.cfg.master)
        if self.metrics is not None:
            self.metrics.set_remote_up(True)

    def stats(self):
        """The tier's counters (dict), its state (``remote_up``), the blocks
        it holds in the pool for their push now (``remote_held_blocks``) and
        the most it held at once (``remote_hold_peak_blocks``)."""
        with self._lock:
            d = dict(self.counters)
        d["remote_up"] = int(self._up)
        with self._qcv:
            d["remote_held_blocks"] = len(self._held_keys)
            d["remote_hold_peak_blocks"] = self.hold_peak
        d["remote_push_selective"] = int(self.policy.pressed())
        return d

    # ---- the worker -------------------------------------------------------------
    def _submit(self, fn, *args):
        with self._lock:
            self._inflight += 1

        def run():
            try:
                return fn(*args)
            finally:
                with self._lock:
                    self._inflight -= 1
        return self._worker.submit(run)

    def _call(self, what, fn, *args):
        """fn(*args) on the worker, waited for at most timeout_s.  A call
        still running from before (late) means Mooncake is not answering:
        RemoteUnavailable at once, nothing queued behind it, so the staging
        buffer a late call may still write is never handed to another."""
        with self._lock:
            busy = self._inflight
        if busy:
            raise RemoteUnavailable(f"{what}: an earlier call has not returned")
        fut = self._submit(fn, *args)
        try:
            return fut.result(timeout=self.cfg.timeout_s)
        except cf.TimeoutError:
            self._fetch_failed("remote_timeouts")
            self._down(f"{what} took longer than {self.cfg.timeout_s:g} s")
            raise RemoteUnavailable(f"{what}: no answer in {self.cfg.timeout_s:g} s") from None

    def _connect(self):
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as e:
            raise RuntimeError("cxlkv: remote tier: the Mooncake Store Python module (mooncake.store, package "
                               "mooncake-transfer-engine-non-cuda) is not installed: " + str(e)) from None
        why = _preflight(self.cfg.master, self.cfg.metadata, self.cfg.timeout_s)
        if why:
            self._down(why)
            return False
        c = MooncakeDistributedStore()
        host = self.cfg.local_hostname or _route_address(self.cfg.master)
        rc = c.setup(host, self.cfg.metadata, int(self.cfg.segment_bytes), int(self.cfg.buffer_bytes),
                     self.cfg.protocol, self.cfg.rdma_devices, self.cfg.master)
        if rc != 0:
            self._down(f"joining the store as {host} failed: {mc_error(rc)}")
            return False
        self._client = c
        self.hostname = c.get_hostname()
        self._recovered()
        return True

    def _probe(self):
        """One existence check of a name nobody writes: the master answers or not."""
        if self._client is None:
            return self._connect()
        r = self._client.batch_is_exist([f"cxlkv/{self.cfg.namespace}/probe"])
        if r and r[0] >= 0:
            self._recovered()
            return True
        self._why = mc_error(r[0] if r else 0)
        return False

    def _maybe_probe(self):
        """While degraded: start a probe if none runs and retry_s passed;
        never wait for it."""
        now = time.monotonic()
        with self._lock:
            if self._inflight or now - self._last_probe < self.cfg.retry_s or self._closed:
                return
            self._last_probe = now
        self._submit(self._probe)

    # ---- names ------------------------------------------------------------------
    def name(self, key):
        """The Mooncake object name of block ``key``: ``cxlkv/<namespace>/<key hex>``.
        The key already covers the engine's namespace (model, dtype, ranks)."""
        return f"cxlkv/{self.cfg.namespace}/{to_hex(key)}"

    # ---- staging ------------------------------------------------------------------
    def _staging_for(self, which, slots, payload):
        """A registered buffer of ``slots`` slots of header + ``payload``
        bytes (worker thread only for ``fetch``; the pusher for ``push``)."""
        cur = self._staging if which == "fetch" else self._pstaging
        need = slots * (HEADER_BYTES + payload)
        if cur is not None and cur[0].nbytes >= need and cur[1] is self._client:
            return cur[0]
        if cur is not None and cur[1] is self._client:
            self._client.unregister_buffer(cur[0].ctypes.data)
        # Whole 2 MiB steps: a few sizes over a run, not one per block size.
        arr = np.empty(max(need, 1 << 21) + (1 << 21) - 1 & ~((1 << 21) - 1), dtype=np.uint8)
        rc = self._client.register_buffer(arr.ctypes.data, arr.nbytes)
        if rc != 0:
            raise RuntimeError(f"registering a {arr.nbytes}-byte {which} buffer with Mooncake: {mc_error(rc)}")
        if which == "fetch":
            self._staging = (arr, self._client)
        else:
            self._pstaging = (arr, self._client)
        return arr

    # ---- publish ------------------------------------------------------------------
    def publish(self, keys, status, nbytes, parents=(None,), chain_lens=None):
        """Queue the blocks of a put that are in the pool now (status
        RESERVED or EXISTS) for the background push, as the push policy
        admits them; returns at once.  ``keys`` are chains: ``chain_lens``
        blocks each (default: one chain), each below its key in
        ``parents`` (None: a root)."""
        if not self.cfg.publish or self._closed or nbytes <= 0:
            return
        ok = (status == _lib.RESERVED) | (status == _lib.EXISTS)
        if not ok.any():
            return
        if self.policy.on:
            kl = [tuple(k) for k in as_keys(keys).tolist()]
            okl = ok.tolist()
            ks, kept, at = [], 0, 0
            for m, par in zip([len(kl)] if chain_lens is None else chain_lens, parents):
                p = None if par is None else tuple(int(x) for x in as_keys([par])[0])
                out, kb = self.policy.admit(kl[at:at + m], okl[at:at + m], p)
                ks += out
                kept += kb
                at += m
            self._count("remote_push_skipped_blocks", kept)
            if not ks:
                return
        else:
            ks = as_keys(keys)[ok]
        with self._qcv:
            room = self.cfg.queue_blocks - len(self._queue) - len(self._ready) - len(self._retry)
            if room < len(ks):
                self._dropped("queue_full", len(ks) - max(room, 0))
                ks = ks[:max(room, 0)]
            for k in ks:
                self._queue.append((int(k[0]), int(k[1]), int(nbytes), False, 0))
            self._qcv.notify_all()

    def _dropped(self, reason, n):
        """Count ``n`` published blocks not pushed, and why (_DROP_REASONS)."""
        if n:
            self._count("remote_push_dropped_blocks", n, also=_DROP_REASONS[reason])

    def flush(self, timeout=30.0):
        """Wait until every queued block was pushed or dropped (tests, benchmarks)."""
        end = time.monotonic() + timeout
        with self._qcv:
            while self._waiting() and time.monotonic() < end:
                self._qcv.wait(0.05)
            return not self._waiting()

    def _waiting(self):
        # caller holds _qcv
        return bool(self._queue or self._ready or self._retry or self._pushing or self._holding)

    _pushing = False
    _holding = False

    # Holding a block until its push (docs/remote.md): a handoff lease to
    # this tier (docs/eviction.md "Handoff leases"), taken as soon as the
    # block is queued.  Eviction skips a leased block; the lease ends when
    # the pusher releases it, after hold_ttl_s, or when this node dies
    # (docs/coherence.md "Liveness"), so a process that dies or hangs never
    # keeps a block for ever.  A lease on a block nobody read since its
    # publish marks the tier's read as the handoff, not a reuse, so the
    # push does not move the block to the pool's hot list.
    def _hold_loop(self):
        while True:
            with self._qcv:
                while not self._closed and not (self._queue and self._hold_room() > 0):
                    # With blocks queued, look again now and then: the tier
                    # going degraded (no holds) does not notify.
                    self._qcv.wait(0.5 if self._queue else None)
                if self._closed:
                    return
                take = min(len(self._queue), self._hold_room())
                batch = [self._queue.popleft() for _ in range(take)]
                # Each key is leased once: a key queued again while held
                # rides on the hold it has (released by the entry that took it).
                fresh = []
                if self.hold_blocks and self._up:
                    for i, e in enumerate(batch):
                        if (e[0], e[1]) not in self._held_keys:
                            self._held_keys.add((e[0], e[1]))
                            fresh.append(i)
                self._holding = True
            st = None
            if fresh:
                try:
                    ks = np.array([(batch[i][0], batch[i][1]) for i in fresh], dtype=np.uint64)
                    st = self._reader.lease(ks, self._consumer, self.node, int(self.cfg.hold_ttl_s * 1000))
                except Exception as e:  # noqa: BLE001 -- not held: the push still tries the pool
                    log.debug("cxlkv remote tier: holding %d blocks for their push: %s", len(fresh), e)
            with self._qcv:
                gone = 0
                for j, i in enumerate(fresh):
                    lo, hi, nb, _, tries = batch[i]
                    if st is not None and st[j] == _lib.RESERVED:
                        batch[i] = (lo, hi, nb, True, tries)
                        continue
                    self._held_keys.discard((lo, hi))
                    if st is not None and st[j] == _lib.MISS:
                        batch[i] = None  # evicted already: nothing left to push
                        gone += 1
                self._ready.extend(e for e in batch if e is not None)
                self.hold_peak = max(self.hold_peak, len(self._held_keys))
                # Counted before the batch stops being in hand, so that a
                # flush() that returns has every block counted.
                self._dropped("evicted", gone)
                self._holding = False
                self._qcv.notify_all()

    def _hold_room(self):
        """How many queued blocks the holder may take now (caller holds _qcv):
        up to hold_blocks held at once; without holds (0, or degraded,
        where the push drops them anyway) every queued block passes."""
        if not self.hold_blocks or not self._up:
            return len(self._queue)
        return self.hold_blocks - len(self._held_keys)

    def _push_loop(self):
        while True:
            with self._qcv:
                while not self._closed:
                    now = time.monotonic()
                    if self._ready or (self._retry and self._retry[0][0] <= now):
                        break
                    self._qcv.wait(self._retry[0][0] - now if self._retry else None)
                if self._closed:
                    return
                # Retries that are due first, then the held blocks, in order.
                src = self._retry if self._retry and self._retry[0][0] <= time.monotonic() else None
                head = src[0][1] if src is not None else self._ready[0]
                nbytes = head[2]
                batch = []
                if src is not None:
                    while src and len(batch) < self.cfg.batch_blocks and src[0][1][2] == nbytes and \
                            src[0][0] <= time.monotonic():
                        batch.append(src.popleft()[1])
                else:
                    while self._ready and len(batch) < self.cfg.batch_blocks and self._ready[0][2] == nbytes:
                        batch.append(self._ready.popleft())
                self._pushing = True
            out = ["failed"] * len(batch)
            try:
                self._push(batch, nbytes, out)
            except Exception as e:  # noqa: BLE001 -- a background thread must not die
                self._count("remote_errors")
                log.debug("cxlkv remote tier: push of %d blocks failed: %s", len(batch), e)
            finally:
                self._settle(batch, nbytes, out)

    def _settle(self, batch, nbytes, out):
        """Count each block of a push by its outcome, queue the ones a full
        store refused for one retry (still held), and release the holds of
        the others."""
        n = collections.Counter(out)
        if n["pushed"]:
            self._count("remote_pushed_blocks", n["pushed"])
            self._count("remote_pushed_bytes", n["pushed"] * nbytes)
        self._count("remote_push_present_blocks", n["present"])
        for why in ("evicted", "store_full", "failed"):
            self._dropped(why, n[why])
        self._count("remote_push_retried_blocks", n["retry"])
        done = [e for e, o in zip(batch, out) if o != "retry" and e[3]]
        if done:
            try:
                self._reader.lease_release(np.array([(e[0], e[1]) for e in done], dtype=np.uint64), self._consumer)
            except Exception as e:  # noqa: BLE001 -- the holds end by their ttl (or with this node)
                log.debug("cxlkv remote tier: releasing %d holds: %s", len(done), e)
        with self._qcv:
            for e in done:
                self._held_keys.discard((e[0], e[1]))
            due = time.monotonic() + self._retry_delay
            for e, o in zip(batch, out):
                if o == "retry":
                    self._retry.append((due, (e[0], e[1], e[2], e[3], e[4] + 1)))
            self._pushing = False
            self._qcv.notify_all()

    # A full store makes room by evicting (Mooncake's master does it in the
    # background): a block it refused is tried once more after this long.
    _retry_delay = 0.2
    # A master that comes back after a restart knows no segments until each
    # client notices and mounts its own again (seconds: Mooncake's clients
    # ping the master in the background), and until then refuses every put
    # as if the store were full.  For this long after the tier comes back, a
    # refused put is tried again every _retry_delay (still held), neither
    # dropped nor taken as a full store (docs/remote.md "Faults").
    _remount_grace_s = 15.0

    def _remounting(self):
        """Whether the tier came back from degraded within _remount_grace_s."""
        back = self._back_at
        return back is not None and time.monotonic() - back < self._remount_grace_s

    def _push(self, batch, nbytes, out):
        """Push ``batch`` (entries of one payload size); ``out[i]`` is set to
        the outcome of entry i: pushed, present (the store had it), evicted
        (gone from the pool), retry / store_full (a full store refused it),
        failed (left as is)."""
        if self._client is None or not self._up:
            # Degraded: not pushed (a later publish of the same prefix will be).
            self._maybe_probe()
            return
        from .layout import RawChunks  # noqa: PLC0415
        c = self._client
        keys = np.array([(e[0], e[1]) for e in batch], dtype=np.uint64)
        names = [self.name(k) for k in keys]
        t0 = time.monotonic()
        have = c.batch_is_exist(names)
        if any(h in _MASTER_DOWN for h in have):
            self._down(f"existence check before a push: {mc_error(min(have))}")
            return
        todo = []
        for i, h in enumerate(have):
            if h == 1:
                out[i] = "present"
            else:
                todo.append(i)
        if not todo:
            return
        slot = HEADER_BYTES + nbytes
        buf = self._staging_for("push", len(todo), nbytes)
        base = buf.ctypes.data
        src = RawChunks([base + j * slot + HEADER_BYTES for j in range(len(todo))], nbytes, 1)
        st = self._reader.get(keys[todo], src)
        got = []
        for j, i in enumerate(todo):
            if st[j] == _lib.RESERVED:
                got.append(j)
            elif st[j] == _lib.MISS:
                out[i] = "evicted"  # gone from the pool since its publish (not held, or its hold ended)
        for j in got:
            off = j * slot
            _header_into(buf[off:off + HEADER_BYTES], keys[todo[j]], nbytes,
                         checksum64((base + off + HEADER_BYTES, nbytes)))
        if not got:
            return
        r = c.batch_put_from([names[todo[j]] for j in got], [base + j * slot for j in got], [slot] * len(got))
        failed = []
        for j, x in zip(got, r):
            i = todo[j]
            if x == 0:
                out[i] = "pushed"
            elif x == MC_ALREADY_EXISTS:  # another rack put it since the existence check
                out[i] = "present"
            elif x == MC_NO_AVAILABLE_HANDLE and self._remounting():
                out[i] = "retry"  # not full: a restarted master before the clients mount their segments again
            elif x == MC_NO_AVAILABLE_HANDLE:
                out[i] = "retry" if batch[i][4] == 0 else "store_full"
                self.policy.store_full()
            else:
                failed.append(x)
        if failed:
            self._count("remote_errors")
            if any(x in _MASTER_DOWN for x in failed):
                self._down(f"put of {len(got)} blocks: {mc_error(failed[0])}")
        if time.monotonic() - t0 > 10 * self.cfg.timeout_s:
            log.debug("cxlkv remote tier: a push of %d blocks took %.1f s", len(got), time.monotonic() - t0)

    # ---- fetch --------------------------------------------------------------------
    def fill(self, store, keys, have):
        """Extend the pool's ``have`` leading hits of ``keys`` (an (n, 2)
        array) from the remote tier: the leading blocks Mooncake holds are
        fetched, verified and published into the pool through ``store``.
        Returns the new number of leading blocks the pool holds.  Never
        raises for a remote failure (it counts it and returns ``have``)."""
        n = len(keys)
        if have < n:
            self.policy.looked_up(keys, have)  # the depths of what a put publishes next
        if not self.cfg.fetch or have >= n or self._closed:
            return have
        if not self._up:
            self._count("remote_skipped_lookups")
            self._maybe_probe()
            return have
        if not self._fetch_lock.acquire(blocking=False):
            # Another thread is fetching: this lookup does not queue behind
            # the network; it answers with what the pool has.
            return have
        t0 = time.perf_counter()
        try:
            got = self._fill(store, keys, have, min(n, have + self.cfg.max_fetch_blocks))
        except RemoteUnavailable:
            got = have
        except Exception as e:  # noqa: BLE001 -- the local path must go on
            self._fetch_failed("remote_errors")
            log.warning("cxlkv remote tier: fetch failed: %s: %s", type(e).__name__, e)
            got = have
        finally:
            self._fetch_lock.release()
        if self.metrics is not None and got > have:
            self.metrics.observe_remote_fetch((got - have) * store.block_tokens, time.perf_counter() - t0)
        return got

    def _fill(self, store, keys, have, end):
        c = self._client
        rest = keys[have:end]
        names = [self.name(k) for k in rest]
        self._count("remote_lookup_blocks", len(names))
        ex = self._call("existence check", c.batch_is_exist, names)
        if any(x in _MASTER_DOWN for x in ex):
            self._fetch_failed("remote_errors")
            self._down(f"existence check: {mc_error(min(ex))}")
            return have
        m = 0
        while m < len(ex) and ex[m] == 1:
            m += 1
        self._count("remote_miss_blocks", len(ex) - m)
        if m == 0:
            return have
        pos = 0
        while pos < m:
            cnt = min(self.cfg.batch_blocks, m - pos)
            ok = self._fetch_batch(store, keys, have + pos, names[pos:pos + cnt])
            pos += ok
            if ok < cnt:
                break
        return have + pos

    def _fetch_batch(self, store, keys, first, names):
        """Fetch names (the blocks keys[first:first+len(names)]) and publish
        them into the pool; returns how many leading ones are there now."""
        if self.in_place:
            n = self._fetch_batch_in_place(store, keys, first, names)
            if n is not None:
                return n
        base, slot, good, length = self._get_verified(keys, first, names)
        if not good:
            return 0
        from .layout import RawChunks  # noqa: PLC0415
        src = RawChunks([base + i * slot + HEADER_BYTES for i in range(good)], length, 1)
        parent = keys[first - 1] if first > 0 else None
        st = store.put(keys[first:first + good], src, parent=parent, _remote=False)
        ok = 0
        while ok < good and st[ok] in (_lib.RESERVED, _lib.EXISTS):
            ok += 1
        self._count("remote_hit_blocks", ok)
        self._count("remote_hit_bytes", ok * length)
        return ok

    # ---- straight into the pool (docs/remote.md "Straight from the pool") ---------
    in_place = False  # fill lands payloads in reserved pool blocks (measured, not the default)

    def _pool_registered(self):
        """Register this process's mapping of the pool with Mooncake once, so
        that a get may land bytes anywhere in it."""
        reg = getattr(self, "_pool_reg", None)
        if reg is not None and reg is self._client:
            return True
        rc = self._client.register_buffer(self.pool.base, self.pool.size)
        if rc != 0:
            log.warning("cxlkv remote tier: registering the pool mapping with Mooncake: %s", mc_error(rc))
            return False
        self._pool_reg = self._client
        return True

    def _fetch_batch_in_place(self, store, keys, first, names):
        """_fetch_batch with no staging copy: the blocks are reserved in the
        pool, each object's payload lands at its reserved block (its header
        in a small registered buffer), then each is checked; the good leading
        ones are flushed (cxlkv_kv_flush_in_place, rule 3) and published,
        the others aborted.  None when it cannot be done here (the caller
        takes the staging path)."""
        L = _lib.lib()
        length = self._slot_payload
        if not length or not _lib.has("cxlkv_kv_flush_in_place") or not self._pool_registered():
            return None
        cnt = len(names)
        hdr = self._call("header buffer", self._staging_for, "fetch", cnt, 0)  # before anything is reserved
        ks = np.ascontiguousarray(keys[first:first + cnt], dtype=np.uint64)
        par = np.ascontiguousarray(keys[first - 1:first], dtype=np.uint64) if first > 0 else None
        blocks = (_lib.KvBlock * cnt)()
        st = np.zeros(cnt, np.int32)
        with store._lock:
            L.cxlkv_kv_reserve_chain(store.handle, par.ctypes.data_as(_lib._KEYP) if par is not None else None,
                                     ks.ctypes.data_as(_lib._KEYP), cnt, length, blocks, st.ctypes.data_as(_lib._I32P))
        lead = 0
        while lead < cnt and st[lead] == _lib.RESERVED:
            lead += 1
        addrs = (C.c_void_p * max(lead, 1))()
        if lead:
            with store._lock:
                L.cxlkv_kv_reserved_addrs(store.handle, blocks, lead, addrs, st.ctypes.data_as(_lib._I32P))
            while lead and any(st[:lead] != 0):
                lead = int(np.argmax(st[:lead] != 0))
        good = 0
        if lead:
            base = hdr.ctypes.data
            try:
                r = self._call(f"get of {lead} blocks into the pool", self._client.batch_get_into_multi_buffers,
                               names[:lead], [[base + i * HEADER_BYTES, addrs[i]] for i in range(lead)],
                               [[HEADER_BYTES, length]] * lead)
            except RemoteUnavailable:
                # A late get may still write into the reserved blocks: they
                # are aborted on the worker thread, after it returns (the
                # worker runs one call at a time), never before.
                def abort_late(blocks=blocks, n=cnt):
                    with store._lock:
                        if store._h:
                            L.cxlkv_kv_abort_many(store.handle, blocks, n, None)
                self._worker.submit(abort_late)
                raise
            for i in range(lead):
                got = r[i]
                if got < 0:
                    self._fetch_failed("remote_errors")
                    if got in _MASTER_DOWN:
                        self._down(f"get: {mc_error(got)}")
                    break
                why = check_parts(hdr[i * HEADER_BYTES:(i + 1) * HEADER_BYTES], addrs[i], ks[i], got)
                if why is not None:
                    self._fetch_failed("remote_refused_blocks")
                    self._refused(names[i], why)
                    break
                good += 1
        pst = np.zeros(cnt, np.int32)
        with store._lock:
            if good:
                L.cxlkv_kv_flush_in_place(store.handle, blocks, good, pst.ctypes.data_as(_lib._I32P))
                L.cxlkv_kv_publish_many(store.handle, blocks, good, pst.ctypes.data_as(_lib._I32P))
            rest = [i for i in range(good, cnt) if blocks[i].status == _lib.RESERVED]
            if rest:  # not landed, refused, or after them: back to the pool (children first: reversed order)
                tail = (_lib.KvBlock * len(rest))(*[blocks[i] for i in rest])
                L.cxlkv_kv_abort_many(store.handle, tail, len(rest), None)
        ok = 0
        while ok < good and pst[ok] == 0:
            ok += 1
        self._count("remote_hit_blocks", ok)
        self._count("remote_hit_bytes", ok * length)
        self.in_place_blocks += ok
        return ok

    in_place_blocks = 0  # blocks that came in that way (tests, benchmarks)

    def fetch_into(self, keys, buffers):
        """The other way to serve a remote hit, kept to measure it against
        :meth:`fill` (docs/remote.md, "Into the pool first"): the leading
        blocks of ``keys`` Mooncake holds, verified, copied straight into
        ``buffers`` (one writable contiguous buffer per key), not into the
        pool.  Returns how many leading buffers were filled."""
        keys = as_keys(keys)
        if not self._up:
            raise RemoteUnavailable("the remote tier is degraded")
        names = [self.name(k) for k in keys]
        with self._fetch_lock:
            ex = self._call("existence check", self._client.batch_is_exist, names)
            m = 0
            while m < len(ex) and ex[m] == 1:
                m += 1
            done = 0
            while done < m:
                cnt = min(self.cfg.batch_blocks, m - done)
                base, slot, good, length = self._get_verified(keys, done, names[done:done + cnt])
                buf = self._staging[0]
                for i in range(good):
                    dst = np.frombuffer(buffers[done + i], dtype=np.uint8)
                    if dst.size != length:
                        raise ValueError(f"cxlkv: remote block {names[done + i]} has {length} bytes, its buffer "
                                         f"{dst.size}")
                    dst[:] = buf[i * slot + HEADER_BYTES:i * slot + HEADER_BYTES + length]
                done += good
                if good < cnt:
                    break
            return done

    def _get_verified(self, keys, first, names):
        """Get names into the fetch staging buffer and check each against
        keys[first + i]: (staging address, slot bytes, leading blocks that
        passed, their payload bytes)."""
        c = self._client
        cnt = len(names)
        payload = self._slot_payload or (256 << 10)
        for attempt in range(2):
            slot = HEADER_BYTES + payload
            buf = self._call("fetch buffer", self._staging_for, "fetch", cnt, payload)
            base = buf.ctypes.data
            r = self._call(f"get of {cnt} blocks", c.batch_get_into, names,
                           [base + i * slot for i in range(cnt)], [slot] * cnt)
            if attempt == 0 and r and r[0] == MC_INVALID_PARAMS:
                # The first object is larger than the slot: size the slots for it.
                size = self._call("object size", c.get_size, names[0])
                if size <= HEADER_BYTES:
                    break
                payload = size - HEADER_BYTES
                continue
            break
        good = 0
        length = None
        for i, got in enumerate(r):
            if got < 0:
                self._fetch_failed("remote_errors")
                if got in _MASTER_DOWN:
                    self._down(f"get: {mc_error(got)}")
                elif got != MC_NOT_FOUND:
                    log.debug("cxlkv remote tier: get of %s: %s", names[i], mc_error(got))
                break
            obj = buf[i * slot:i * slot + got]
            why = check_block(obj, keys[first + i], got)
            if why is None and length not in (None, got - HEADER_BYTES):
                why = "payload size differs from the blocks before it in the prefix"
            if why is not None:
                self._fetch_failed("remote_refused_blocks")
                self._refused(names[i], why)
                break
            length = got - HEADER_BYTES
            good += 1
        if good:
            self._slot_payload = max(self._slot_payload, length)
        return base, slot, good, length

    def _refused(self, name, why):
        seen = self.__dict__.setdefault("_refusals", {})
        n = seen[why] = seen.get(why, 0) + 1
        if n & (n - 1) == 0:  # the first time a cause is seen, then at powers of two
            log.warning("cxlkv remote tier: refused remote block %s: %s%s", name, why,
                        f" ({n} times)" if n > 1 else "")

    # ---- closing ------------------------------------------------------------------
    def close(self, timeout=5.0):
        """Push what is queued for up to ``close_drain_s`` while the store
        answers (a prefill process that exits right after its last request
        still shares it), then stop the pusher (blocks still queued are
        dropped and counted) and leave the store; a Mooncake call that does
        not return in ``timeout`` seconds is left to its thread (the process
        may exit with it)."""
        if self._closed:
            return
        if self._up and self.cfg.close_drain_s > 0:
            self.flush(min(self.cfg.close_drain_s, timeout))
        self._closed = True
        with self._qcv:
            self._qcv.notify_all()
        # The holder and the pusher stop at their next look; what they leave
        # queued (a batch on its way settles itself) is dropped and counted.
        self._holder.join(timeout)
        self._pusher.join(timeout)
        with self._qcv:
            left = list(self._queue) + list(self._ready) + [e for _, e in self._retry]
            self._queue.clear()
            self._ready.clear()
            self._retry.clear()
        self._dropped("failed", len(left))
        held = [e for e in left if e[3]]
        if held:  # given back now rather than at their ttl
            try:
                self._reader.lease_release(np.array([(e[0], e[1]) for e in held], dtype=np.uint64), self._consumer)
            except Exception as e:  # noqa: BLE001 -- closing: they end by their ttl
                log.debug("cxlkv remote tier: releasing %d holds at close: %s", len(held), e)
            with self._qcv:
                for e in held:
                    self._held_keys.discard((e[0], e[1]))
        with self._ctr_lock:
            self._ctr_h = None
        if self._reader is not None:
            self._reader.close()
        client = self._client
        self._client = None
        if client is not None:
            fut = self._worker.submit(client.close)
            try:
                fut.result(timeout=timeout)
            except Exception:  # noqa: BLE001
                pass
        self._worker.shutdown(wait=False)
        with _shared_lock:
            for k, v in list(_shared.items()):
                if v is self:
                    del _shared[k]

    def _close_for_pool(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- attaching tiers to stores ---------------------------------------------------
_shared = {}
_shared_lock = threading.Lock()


def _close_shared_at_exit():
    # Tiers whose pool was never closed: their queued pushes get close()'s
    # bounded drain before the interpreter tears the pool down.
    with _shared_lock:
        tiers = list(_shared.values())
    for t in tiers:
        try:
            t.close()
        except Exception as e:  # noqa: BLE001 -- exiting; say why and go on
            log.warning("cxlkv remote tier: closing at exit: %s", e)


atexit.register(_close_shared_at_exit)


def attach(pool, node, remote, metrics=None):
    """The tier a :class:`cxlkv.KvStore` uses: None for ``remote=False``;
    ``remote`` itself if it is a :class:`RemoteTier`; otherwise the process's
    shared tier of (pool, node, config), made on first use, where the config
    is ``remote`` (a :class:`RemoteConfig` or dict) or, for ``remote=None``,
    the ``CXLKV_REMOTE_*`` environment (None when it names no master)."""
    if remote is False:
        return None
    if isinstance(remote, RemoteTier):
        return remote
    cfg = RemoteConfig.from_env() if remote is None else remote
    if cfg is None:
        return None
    if isinstance(cfg, dict):
        cfg = RemoteConfig.from_dict(cfg)
    key = (pool.uri, id(pool), int(node), cfg)
    with _shared_lock:
        t = _shared.get(key)
        if t is None or t._closed:
            t = _shared[key] = RemoteTier(pool, node, cfg, metrics=metrics)
        elif metrics is not None and t.metrics is None:
            t.metrics = metrics
            metrics.set_remote_up(t.up)
        return t
