# SPDX-License-Identifier: MIT
"""One rack's host for the remote tier tests and benchmark: its own pool
(a shared-memory file, formatted and given its own ``cxlkvd`` by
remote_env.py before this process starts), a KV store with a remote tier
joined to the test's Mooncake master, driven by JSON lines on stdin (one
reply line on stdout per command).  Run inside the rack's network namespace
(``ip netns exec``) by remote_env.py.

Blocks are made from (seed, index), so every process knows the bytes a block
must have: a block read back is compared, never trusted."""
import argparse
import faulthandler
import hashlib
import json
import logging
import os
import signal
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import pool_env  # noqa: E402,F401  (the package and libcxlkv of this checkout)
import cxlkv  # noqa: E402
from cxlkv import remote  # noqa: E402


def chain(seed, n, block_tokens=16):
    """The keys of prefix ``seed``: n blocks of tokens made from the seed."""
    toks = (np.arange(n * block_tokens, dtype=np.int64) * 7919 + seed * 104729) % 50000
    return cxlkv.block_keys(toks, block_tokens, extras=b"remote-test")


def block(seed, i, nbytes):
    """The bytes of block i of prefix ``seed``."""
    return np.random.default_rng([seed, i]).integers(0, 256, nbytes, dtype=np.uint8)


class _NoTier:
    """Stands for the tier of a rack run without one (--no-remote)."""
    hostname = ""
    up = False

    def flush(self, timeout):
        return True

    def close(self):
        pass


class Rack:
    def __init__(self, a):
        self.a = a
        self.uri = a.pool
        self.pool = cxlkv.Pool(self.uri)
        cfg = False if a.no_remote else remote.RemoteConfig(
            master=a.master, metadata_server=a.metadata, local_hostname=a.host, segment_bytes=a.segment_mib << 20,
            buffer_bytes=32 << 20, namespace=a.namespace, timeout_s=a.timeout, retry_s=0.5,
            batch_blocks=a.batch_blocks, block_bytes=a.block_bytes,
            **({"hold_blocks": a.hold_blocks} if a.hold_blocks >= 0 else {}),
            **({"push_min_blocks": a.push_min_blocks} if a.push_min_blocks >= 0 else {}))
        self.metrics = cxlkv.metrics.Metrics(labels={"rack": a.name})
        self.store = cxlkv.KvStore(self.pool, 1, metrics=self.metrics, block_tokens=16, remote=cfg)
        self.tier = self.store.remote or _NoTier()
        self.nbytes = a.block_bytes

    # ---- commands ---------------------------------------------------------------
    def publish(self, seed, n, flush=True, nbytes=0):
        keys = chain(seed, n)
        bufs = [block(seed, i, nbytes or self.nbytes) for i in range(n)]
        t0 = time.perf_counter()
        st = self.store.put(keys, bufs)
        put_s = time.perf_counter() - t0
        pushed = self.tier.flush(60) if flush else None
        return dict(ok=int(cxlkv.put_ok(st).sum()), put_s=put_s, flushed=pushed)

    def fetch(self, seed, n, in_place=False):
        """Local hits, hits with the remote tier, then the bytes of every
        hit compared with what they must be, then local hits again.
        ``in_place``: the tier lands payloads straight in reserved pool
        blocks (docs/remote.md "Straight from the pool")."""
        keys = chain(seed, n)
        local0 = self.store.lookup(keys, remote=False)
        t0 = time.perf_counter()
        self.tier.in_place = in_place
        try:
            hit = self.store.lookup(keys)
        finally:
            self.tier.in_place = False
        lookup_s = time.perf_counter() - t0
        bufs = [np.zeros(self.nbytes, np.uint8) for _ in range(hit)]
        st = self.store.get(keys[:hit], bufs) if hit else np.zeros(0, np.int32)
        read = int(cxlkv.get_ok(st).sum())
        wrong = sum(1 for i in range(hit) if st[i] == 0 and not np.array_equal(bufs[i], block(seed, i, self.nbytes)))
        digest = hashlib.sha256(b"".join(b.tobytes() for b in bufs[:read])).hexdigest()
        return dict(local_before=local0, hit=hit, read=read, wrong=wrong, lookup_s=lookup_s,
                    local_after=self.store.lookup(keys, remote=False), sha256=digest)

    def publish_burst(self, seeds, n):
        """Publish the prefixes ``seeds`` (n blocks each) one put each, as
        fast as the local path goes; nothing waits for the push."""
        ok = 0
        for s_ in seeds:
            ok += self.publish(s_, n, flush=False)["ok"]
        return dict(ok=ok)

    def fill(self, first_seed, chains, n):
        """Eviction pressure: ``chains`` prefixes of n blocks from
        ``first_seed`` on, published by a store of another node of this
        rack's pool that has no remote tier (they are never pushed)."""
        if getattr(self, "_filler", None) is None:
            self._filler = cxlkv.KvStore(self.pool, 2, remote=False)
        ok = 0
        for s_ in range(first_seed, first_seed + chains):
            ok += int(cxlkv.put_ok(self._filler.put(chain(s_, n), [block(s_, i, self.nbytes)
                                                                  for i in range(n)])).sum())
        return dict(ok=ok)

    def slow_store(self, put_s):
        """Every put of the tier into the store (a batch) takes ``put_s``
        seconds longer from now on: a store slower than the publishes."""
        real = getattr(self.tier._client, "_real", self.tier._client)

        class Slow:
            _real = real

            def __getattr__(self, name):
                return getattr(real, name)

            def batch_put_from(self, *args):
                time.sleep(put_s)
                return real.batch_put_from(*args)
        new = Slow() if put_s else real
        # The tier's registered buffers name the client they belong to.
        for attr in ("_staging", "_pstaging"):
            cur = getattr(self.tier, attr)
            if cur is not None and cur[1] is self.tier._client:
                setattr(self.tier, attr, (cur[0], new))
        self.tier._client = new
        return {}

    def flush(self, timeout=60):
        """Wait for the tier's queued pushes (pushed or dropped)."""
        return dict(flushed=self.tier.flush(timeout))

    def set_hold(self, hold_blocks):
        """The most blocks the tier holds in the pool for their push."""
        self.tier.hold_blocks = hold_blocks
        return {}

    def in_store(self, seeds, n):
        """How many blocks of the prefixes ``seeds`` the store holds."""
        c = getattr(self.tier._client, "_real", self.tier._client)
        names = [self.tier.name(k) for s_ in seeds for k in chain(s_, n)]
        return dict(held=sum(1 for x in c.batch_is_exist(names) if x == 1), asked=len(names))

    def expected_sha256(self, seed, n):
        return dict(sha256=hashlib.sha256(b"".join(block(seed, i, self.nbytes).tobytes()
                                                   for i in range(n))).hexdigest())

    def soak(self, seeds, n, seconds):
        """Fetch the prefixes ``seeds`` round and round for ``seconds``: the
        slowest lookup, blocks read, wrong blocks, remote hits."""
        end = time.monotonic() + seconds
        worst = rounds = wrong = read = 0
        while time.monotonic() < end:
            for s in seeds:
                r = self.fetch(s, n)
                worst = max(worst, r["lookup_s"])
                wrong += r["wrong"]
                read += r["read"]
                rounds += 1
            time.sleep(0.05)
        return dict(worst_lookup_s=worst, rounds=rounds, wrong=wrong, read=read)

    def publish_loop(self, first_seed, n, seconds):
        """Publish prefix first_seed, first_seed+1, ... every 0.2 s for
        ``seconds``; the slowest put (the local path) and the seeds."""
        end = time.monotonic() + seconds
        seed, worst, seeds = first_seed, 0.0, []
        while time.monotonic() < end:
            r = self.publish(seed, n, flush=False)
            worst = max(worst, r["put_s"])
            seeds.append(seed)
            seed += 1
            time.sleep(0.2)
        return dict(worst_put_s=worst, seeds=seeds)

    def damage(self, seed, n, index, how):
        """Replace the object of block ``index`` of prefix ``seed`` in
        Mooncake by a damaged one: ``payload`` (a byte of the payload
        changed, header kept), ``key`` (another block's whole object),
        ``short`` (the object cut short), ``foreign`` (no header at all)."""
        keys = chain(seed, n)
        c = self.tier._client
        name = self.tier.name(keys[index])
        good = np.frombuffer(c.get(name), dtype=np.uint8).copy()
        if how == "payload":
            bad = good.copy()
            bad[remote.HEADER_BYTES + 100] ^= 0x40
        elif how == "key":
            bad = np.frombuffer(c.get(self.tier.name(keys[index + 1])), dtype=np.uint8)
        elif how == "short":
            bad = good[:len(good) // 2]
        elif how == "foreign":
            bad = block(seed, index, self.nbytes)
        else:
            raise ValueError(how)
        rc_rm = c.remove(name, True)
        rc = c.put(name, bad.tobytes())
        return dict(removed=rc_rm, put=rc, old=len(good), new=len(bad))

    def keys_state(self, keys):
        """For keys given as [lo, hi] pairs (an engine's, say): which this
        rack's pool holds (1 or 0), and which Mooncake holds (1), does not (0)
        or could not tell (a negative Mooncake code)."""
        ks = np.array(keys, dtype=np.uint64).reshape(-1, 2)
        held = [int(x) for x in self.tier._client.batch_is_exist([self.tier.name(k) for k in ks])] \
            if self.store.remote is not None else []
        return dict(local=[self.store.lookup(ks[i:i + 1], remote=False) for i in range(len(ks))], remote=held)

    # ---- benchmark (tools/bench/remote_bench.py) ----------------------------------
    def publish_many(self, seeds, n, nbytes=0):
        for s_ in seeds:
            self.publish(s_, n, flush=False, nbytes=nbytes)
        return dict(flushed=self.tier.flush(300))

    def bench_fetch(self, seeds, n, how, nbytes=0):
        """Per prefix of ``seeds`` (published by the other rack, not here):
        ``fill`` -- seconds of the lookup that fetches it into this pool, then
        of the local get of it (pool to buffers); ``inplace`` -- the same
        with the payloads landing in reserved pool blocks; ``direct`` -- seconds of
        fetching it straight into buffers (no pool).  Bytes are checked.
        ``nbytes``: the blocks' size when not the rack's (``fill`` only)."""
        out = dict(remote_s=[], local_s=[], blocks=[], wrong=0)
        nb = nbytes or self.nbytes
        bufs = [np.zeros(nb, np.uint8) for _ in range(n)]
        for s_ in seeds:
            keys = chain(s_, n)
            if how in ("fill", "inplace"):
                # inplace: the fetch lands payloads in reserved pool blocks
                # (docs/remote.md "Straight from the pool"), no staging copy.
                self.tier.in_place = how == "inplace"
                t0 = time.perf_counter()
                hit = self.store.lookup(keys)
                t1 = time.perf_counter()
                self.tier.in_place = False
                st = self.store.get(keys[:hit], bufs[:hit])
                t2 = time.perf_counter()
                out["local_s"].append(t2 - t1)
                hit = int(cxlkv.get_ok(st).sum())
            elif how == "direct":
                t0 = time.perf_counter()
                hit = self.tier.fetch_into(keys, bufs)
                t1 = time.perf_counter()
            else:  # "raw": Mooncake's own get of the objects, nothing checked or copied
                c = self.tier._client
                names = [self.tier.name(k) for k in keys]
                slot = remote.HEADER_BYTES + self.nbytes
                if getattr(self, "_raw", None) is None:
                    self._raw = np.empty(n * slot, np.uint8)
                    c.register_buffer(self._raw.ctypes.data, self._raw.nbytes)
                base = self._raw.ctypes.data
                t0 = time.perf_counter()
                r = c.batch_get_into(names, [base + i * slot for i in range(n)], [slot] * n)
                t1 = time.perf_counter()
                out["remote_s"].append(t1 - t0)
                out["blocks"].append(sum(1 for x in r if x == slot))
                # What the tier adds to that get, timed apart (what a fetch
                # landing straight in the pool would save is the insert):
                # the header and payload checks, then the insert into the pool.
                t2 = time.perf_counter()
                bad = sum(1 for i in range(n) if remote.check_block(self._raw[i * slot:(i + 1) * slot], keys[i], slot))
                t3 = time.perf_counter()
                from cxlkv.layout import RawChunks
                st = self.store.put(keys, RawChunks([base + i * slot + remote.HEADER_BYTES for i in range(n)],
                                                    self.nbytes, 1), _remote=False)
                t4 = time.perf_counter()
                out.setdefault("check_s", []).append(t3 - t2)
                out.setdefault("insert_s", []).append(t4 - t3)
                out["wrong"] += bad + int((~cxlkv.put_ok(st)).sum())
                continue
            out["remote_s"].append(t1 - t0)
            out["blocks"].append(hit)
            out["wrong"] += sum(1 for i in range(hit) if not np.array_equal(bufs[i], block(s_, i, nb)))
        return out

    def bench_prefill(self, model_dir, tokens, reps, threads=0):
        """Recompute, the other way to get a prefix's KV: seconds of the
        prefill (one forward pass over ``tokens`` prompt tokens, which fills
        the KV cache) of the engine tests' tiny Llama model (tiny_model.py,
        written to ``model_dir`` once) through transformers on this host's
        CPU, ``reps`` times; and the KV bytes per token the model keeps
        (K and V of every layer and KV head, in its dtype)."""
        import torch
        import transformers
        from tiny_model import make_tiny_llama
        if threads:
            torch.set_num_threads(threads)
        ids_of = lambda c, n: torch.randint(0, c.vocab_size, (1, n), generator=torch.Generator().manual_seed(1))  # noqa: E731
        if getattr(self, "_tiny", (None,))[0] != model_dir:
            m = transformers.LlamaForCausalLM.from_pretrained(make_tiny_llama(model_dir)).eval()
            with torch.inference_mode():
                m(ids_of(m.config, tokens), use_cache=True)  # warm-up, not timed (first-call set-up)
            self._tiny = (model_dir, m)
        m = self._tiny[1]
        c = m.config
        head = c.hidden_size // c.num_attention_heads
        kv_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * head * m.dtype.itemsize
        ids = ids_of(c, tokens)
        times = []
        with torch.inference_mode():
            for _ in range(reps):
                t0 = time.perf_counter()
                m(ids, use_cache=True)
                times.append(time.perf_counter() - t0)
        return dict(s=times, kv_bytes_per_token=kv_per_token, threads=torch.get_num_threads())

    def bench_put(self, seed, n, reps):
        """Seconds of a put of n blocks with the remote tier on and, on the
        same pool, with a store that has none; then of the background push
        of the blocks the put with the tier queued (each timed alone: on a
        host with spare cores the push runs beside the engine)."""
        off = cxlkv.KvStore(self.pool, 2, remote=False)
        on_s, off_s, push_s = [], [], []
        bufs = [block(seed, i, self.nbytes) for i in range(n)]
        for r in range(reps):
            for store, acc, sd in ((self.store, on_s, seed + 2 * r), (off, off_s, seed + 2 * r + 1)):
                keys = chain(sd, n)
                t0 = time.perf_counter()
                store.put(keys, bufs)
                acc.append(time.perf_counter() - t0)
                if store is self.store:
                    self.tier.flush(120)
                    push_s.append(time.perf_counter() - t0 - acc[-1])
        off.close()
        return dict(on_s=on_s, off_s=off_s, push_s=push_s)

    def sock_listen(self, nbytes):
        """A TCP receiver on this rack's address: each connection reads
        ``nbytes`` into one buffer, then answers one byte."""
        import socket
        import threading
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((self.a.host, 0))
        srv.listen(4)
        sink = np.empty(nbytes, np.uint8)

        def serve():
            while True:
                c, _ = srv.accept()
                with c:
                    view = memoryview(sink)
                    while True:
                        got = 0
                        while got < nbytes:
                            k = c.recv_into(view[got:], nbytes - got)
                            if k == 0:
                                break
                            got += k
                        if got < nbytes:
                            break
                        c.sendall(b"k")
        threading.Thread(target=serve, daemon=True).start()
        return dict(port=srv.getsockname()[1])

    def sock_send(self, host, port, nbytes, reps):
        """Seconds to send ``nbytes`` to a sock_listen receiver and hear it
        has them all, ``reps`` times on one connection."""
        import socket
        buf = np.random.default_rng(1).integers(0, 256, nbytes, dtype=np.uint8)
        times = []
        with socket.create_connection((host, port)) as c:
            for _ in range(reps):
                t0 = time.perf_counter()
                c.sendall(memoryview(buf))
                c.recv(1)
                times.append(time.perf_counter() - t0)
        return dict(s=times)

    def replay(self, reqs, block_tokens):
        """Serve trace requests (hash_ids, input_length) in order: per
        request the tokens that were local hits, remote hits (brought into
        the pool by the lookup) and misses (then published, as prefill
        would)."""
        local = rem = miss = 0
        ns = b"replay"
        for hashes, length in reqs:
            keys = cxlkv.keys_from_hashes(hashes, ns)
            n = len(keys)
            tok = [block_tokens] * n
            if n:
                tok[-1] = max(0, length - block_tokens * (n - 1))
            here = self.store.lookup(keys, remote=False)
            have = self.store.lookup(keys) if self.store.remote is not None else here
            local += sum(tok[:here])
            rem += sum(tok[here:have])
            miss += sum(tok[have:])
            if have < n:
                bufs = [np.full(self.nbytes, (i + 7) & 0xFF, np.uint8) for i in range(have, n)]
                self.store.put(keys[have:], bufs, parent=keys[have - 1] if have else None)
        return dict(local=local, remote=rem, miss=miss)

    def stats(self):
        return dict(stats=self.store.stats(), hostname=self.tier.hostname,
                    in_place_blocks=getattr(self.tier, "in_place_blocks", 0),
                    exposition=self.metrics.exposition(), pool_exposition=cxlkv.metrics.pool_exposition(self.pool))

    def close(self):
        if getattr(self, "_filler", None) is not None:
            self._filler.close()
        self.store.close()
        self.tier.close()
        for node in range(8):
            self.pool.remove_node_local(node)
        self.pool.close()
        try:
            os.unlink("/dev/shm/" + self.uri.split(":")[1])
        except OSError:
            pass
        return {}


def main():
    ap = argparse.ArgumentParser()
    for f in ("name", "pool", "master", "metadata", "host", "namespace"):
        ap.add_argument("--" + f, required=True)
    ap.add_argument("--block-bytes", type=int, default=64 << 10)
    ap.add_argument("--segment-mib", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=1.0)
    ap.add_argument("--batch-blocks", type=int, default=64)
    ap.add_argument("--no-remote", action="store_true")
    ap.add_argument("--hold-blocks", type=int, default=-1, help="the tier's hold_blocks (default: its own)")
    ap.add_argument("--push-min-blocks", type=int, default=-1, help="the tier's push_min_blocks (default: its own)")
    a = ap.parse_args()
    # The harness asks for the stacks of a rack that stopped answering.
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    logging.basicConfig(level=os.environ.get("CXLKV_REMOTE_RACK_LOG", "WARNING"), stream=sys.stderr,
                        format=f"rack {a.name}: %(levelname)s %(name)s: %(message)s")
    rack = Rack(a)
    out = sys.stdout
    # Mooncake's own logging goes to stderr; only our replies go to stdout.
    print(json.dumps(dict(ready=True, hostname=rack.tier.hostname, up=rack.tier.up)), file=out, flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            res = getattr(rack, op)(**cmd)
            res["error"] = None
        except Exception as e:  # noqa: BLE001 -- reported to the test
            res = dict(error=f"{type(e).__name__}: {e}")
        print(json.dumps(res, default=int), file=out, flush=True)
        if op == "close":
            break
    os._exit(0)  # Mooncake's teardown may wait for a dead master


if __name__ == "__main__":
    main()
