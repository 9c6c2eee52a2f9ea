#!/usr/bin/python3
"""Damaged-pool campaign: every metadata region of a pool, damaged one way at
a time, against every reader we ship.

docs/operations.md "Bad input, damage and interruptions" and
docs/integrity.md "Checked metadata" promise that a damaged pool is refused
with a message naming the pool and the cause, never a crash, a hang, or
other bytes with exit status 0: bad input never crashes and never loses data
that was already published.
This program checks that promise from the outside, with the built binaries:

1. formats small file: pools (a lock-mode pool, an index-service pool with its
   rpc.index carve, and a pool with a near-memory "pnm" carve), writes a known
   set of blocks (random bytes; sizes below and above the 1 KiB owner granule
   and a run of whole chunks) and one long context;
2. lists targets from the on-pool layout (uapi/*.h): the superblock and its
   carve table, the control carve (header, lease, node table, lock slots,
   grants, doorbells), the index carve (header, config, stripes, node stats,
   the blocks' entry lines and extension records, empty lines), the alloc
   carve (header, bitmap, chunk table, inboxes, state, quarantine, owner
   records, object store), the rpc.index carve (header, server line, ring
   lines) and the pnm carve (header, partition, slot lines, page table,
   digests);
3. for each (target, kind, seed) damages a fresh copy of the pool file and runs
   the readers: a `cxlkvd` start (`--index-service` on that pool) with a
   timeout, `cxlkvctl kv get` of every block (bytes compared with what was
   written), `kv check`, `kv ls`, `stats`, `info`, and in Python a
   `cxlkv.Pool` open + `KvStore.get` of every block (or `PnmStore` find +
   attend, compared with the sound pool's answer);
4. classes each reader run: accepted (exit 0, right bytes), refused (non-zero
   exit, a message naming the pool, a carve or the superblock), unclear
   (non-zero exit, a message that names none of them), crash (death by a
   signal), hang (past its timeout), wrong (exit 0, other bytes).  A damaged
   input is counted by its worst reader.

Kinds: random (random bytes over the target), flip (one bit), zero, ones
(0xff), forge (one aligned field set to a plausible value: 0, 1, +-1, x2, an
offset a line or a granule away, another block's offset; the checksum or
check that covers the field is recomputed, so the forgery passes it).

  damage_campaign.py [--tools DIR] [--seeds N] [--kinds k,k] [--classes c,c] [--target NAME]
                     [--sample N] [--order-seed N] [--budget-s S] [--python]
                     [--pnm] [--json FILE] [--results FILE] [--assert]

Inputs run in a fixed shuffled order (--order-seed), so --sample N or a
budget spreads over every class and kind; a finding prints its target,
kind and seed, and --target NAME --kinds KIND --seeds SEED+1 runs it again.

--results merges damage.* figures into a flat JSON results file (make bench);
--assert exits 1 when any crash, hang or wrong-with-status-0 was seen (make
test).  Exit 77 when the tools are missing.
"""
import argparse
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

LINE = 64
MASK64 = (1 << 64) - 1

# --- checksums of uapi/cxlkv_pool.h, cxlkv/format/index_format.h, pnm_format.h, objstore_format.h


def fnv64(b, ck_off, ck_len):
    """cxlkv_hdr_checksum(): FNV-1a 64 with the checksum bytes read as 0."""
    h = 0xcbf29ce484222325
    for i, c in enumerate(b):
        if ck_off <= i < ck_off + ck_len:
            c = 0
        h = ((h ^ c) * 0x100000001b3) & MASK64
    return h


def fnv32(b, ck_off=None, ck_len=4):
    h = 0x811c9dc5
    for i, c in enumerate(b):
        if ck_off is not None and ck_off <= i < ck_off + ck_len:
            c = 0
        h = ((h ^ c) * 0x01000193) & 0xffffffff
    return h


def bitmap_word_sum(index, word):
    """cxlkv_bitmap_word_sum() (cxlkv/format/alloc_format.h)."""
    z = word ^ ((index * 0x9e3779b97f4a7c15) & MASK64) ^ 0xa0761d6478bd642f
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & MASK64
    return z ^ (z >> 31)


def u32(b, o):
    return struct.unpack_from("<I", b, o)[0]


def u64(b, o):
    return struct.unpack_from("<Q", b, o)[0]


# Fixers: after a forge, make the region's checksum agree again.  Each takes
# the pool image (bytearray) and rewrites one checksum in place.

def fix_sb(img):
    struct.pack_into("<Q", img, 64, fnv64(img[0:4096], 64, 8))


def fix_hdr32(base, n, ck):
    def f(img):
        struct.pack_into("<I", img, base + ck, fnv64(img[base:base + n], ck, 4) & 0xffffffff)
    return f


def fix_alloc_hdr(base):
    def f(img):
        struct.pack_into("<Q", img, base + 120, fnv64(img[base:base + 128], 120, 8))
    return f


def fix_entry(off):
    def f(img):
        h = fnv32(img[off:off + 60])
        struct.pack_into("<I", img, off + 60, h or 1)
    return f


def fix_check_at(off, ck):
    """FNV-1a 32 of a line with its check word read as 0 (pnm ctx/count, objstore entry)."""
    def f(img):
        struct.pack_into("<I", img, off + ck, fnv32(img[off:off + LINE], ck))
    return f


def fix_bitmap(bitmap, nwords, state):
    def f(img):
        s = 0
        for i in range(nwords):
            s ^= bitmap_word_sum(i, u64(img, bitmap + 8 * i))
        struct.pack_into("<Q", img, state, s)
    return f


# --- running the binaries

class Run:
    def __init__(self, rc, out, err, status):
        self.rc, self.out, self.err, self.status = rc, out, err, status


def run(cmd, timeout, env, stdin=None):
    """Runs cmd in its own process group; a timeout kills the group."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return Run(None, out, err, "hang")
    if p.returncode < 0:
        return Run(p.returncode, out, err, "crash")
    return Run(p.returncode, out, err, "ok" if p.returncode == 0 else "fail")


class Daemon:
    """cxlkvd --foreground, started and stopped by the campaign."""

    def __init__(self, tools, uri, env, service, errpath):
        cmd = [os.path.join(tools, "cxlkvd"), "--pool", uri, "--foreground", "--metrics-listen", "none",
               "--lease-ms", "300"]
        if service:
            cmd.append("--index-service")
        self.errf = open(errpath, "w+b")
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.errf, env=env,
                                  start_new_session=True, stdin=subprocess.DEVNULL)
        self.service = service

    def wait_up(self, timeout):
        """Up when it says it manages the pool's locks (and serves the index);
        returns None while running, else its Run."""
        t0 = time.monotonic()
        want = b"managing locks"
        while time.monotonic() - t0 < timeout:
            rc = self.p.poll()
            self.errf.seek(0)
            err = self.errf.read()
            if rc is not None:
                return Run(rc, b"", err, "crash" if rc < 0 else ("ok" if rc == 0 else "fail"))
            if want in err:
                return None
            time.sleep(0.02)
        return None  # still starting: the readers will tell

    def stop(self, timeout):
        """SIGTERM: exit 0 expected (cxlkvd stops on SIGTERM: docs/operations.md)."""
        rc = self.p.poll()
        if rc is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                rc = self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
                self.errf.seek(0)
                return Run(None, b"", self.errf.read(), "hang")
        self.errf.seek(0)
        err = self.errf.read()
        self.errf.close()
        if rc < 0:
            return Run(rc, b"", err, "crash")
        return Run(rc, b"", err, "ok" if rc == 0 else "fail")


# --- the pools

PY_KV = r"""
import sys, json, numpy as np, cxlkv
uri, node, spec = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
pool = cxlkv.Pool(uri)
kv = cxlkv.KvStore(pool, node=node)
res = []
for key, path in spec:
    want = open(path, "rb").read()
    buf = np.zeros(len(want), dtype=np.uint8)
    st = kv.get([key], [buf])
    if st[0] == cxlkv.MISS:
        res.append(["miss", 3, ""])
    elif st[0] != 0:
        res.append(["fail", int(st[0]), kv.last_error or ""])
    else:
        res.append(["ok" if buf.tobytes() == want else "wrong", 0, ""])
kv.close(); pool.close()
print(json.dumps(res))
"""

PY_PNM_MAKE = r"""
import sys, json, numpy as np, cxlkv
from cxlkv import pnm
uri, out = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(7)
L, H, D, n = 2, 2, 32, 100
k = rng.standard_normal((L, H, n, D)).astype(np.float32)
v = rng.standard_normal((L, H, n, D)).astype(np.float32)
q = rng.standard_normal((L, 4, D)).astype(np.float32)
pool = cxlkv.Pool(uri)
ws = pnm.PnmStore(pool, carve_bytes=4 << 20)
w = ws.create(11, L, H, D, max_tokens=256, dtype="f32")
w.append(k, v)
o, lse, _ = w.attend(q, all_pages=True)
np.savez(out, q=q, out=o, lse=lse)
w.close(); ws.close(); pool.close()
"""

PY_PNM_READ = r"""
import sys, json, numpy as np, cxlkv
from cxlkv import pnm
uri, ref = sys.argv[1], np.load(sys.argv[2])
pool = cxlkv.Pool(uri)
rs = pnm.PnmStore(pool, readonly=True)
r = rs.find(11)
o, lse, st = r.attend(ref["q"], all_pages=True)
same = np.array_equal(o, ref["out"]) and np.array_equal(lse, ref["lse"])
print(json.dumps([["ok" if same else "wrong", 0, ""]]))
"""


class Pool:
    """A sound pool file and what was written into it."""

    def __init__(self, kind, path, size):
        self.kind, self.path, self.size = kind, path, size
        self.uri = "file:" + path
        self.blocks = []      # (key hex, payload file)
        self.pnm_ref = None
        self.targets = []
        self.carves = {}


def cmd_ok(r, what):
    if r.status != "ok":
        raise SystemExit(f"damage_campaign: setup: {what} failed ({r.status} {r.rc}): "
                         f"{r.err.decode(errors='replace').strip()}")


class Campaign:
    def __init__(self, args):
        self.a = args
        self.tools = args.tools
        self.ctl = os.path.join(self.tools, "cxlkvctl")
        self.work = tempfile.mkdtemp(prefix="cxlkv-dmg-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.env = dict(os.environ)
        # A KV call whose lock never comes (a damaged lease or lock slot, a
        # manager that refused the pool) fails after this instead of 30 s
        # (CXLKV_LOCK_TIMEOUT_MS: docs/locks.md "Lock waits").
        self.env["CXLKV_LOCK_TIMEOUT_MS"] = "1500"
        self.env.setdefault("CXLKV_LOG", "warn")
        self.env["CXLKV_PREFAULT"] = "0"
        # The Python readers use this checkout's package (over CXLKV_LIB).
        pkg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "libruntime", "python")
        self.env["PYTHONPATH"] = os.path.normpath(pkg) + (":" + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        self.pool_ids = set()
        self.stats = {}
        self.findings = []
        self.messages = {}

    # -- set-up

    def ctlrun(self, pool_uri, *argv, timeout=20):
        return run([self.ctl, "--pool", pool_uri, *argv], timeout, self.env)

    def make_kv_pool(self, kind):
        path = os.path.join(self.work, f"base-{kind}")
        p = Pool(kind, path, 32 << 20)
        argv = ["format", "--size", "32M", "--max-nodes", "4", "--max-locks", "256", "--index-entries", "256"]
        if kind == "service":
            argv.append("--index-service")
        cmd_ok(self.ctlrun(p.uri, *argv), "format")
        d = Daemon(self.tools, p.uri, self.env, kind == "service", os.path.join(self.work, "setup-d.err"))
        r = d.wait_up(10)
        if r is not None:
            cmd_ok(r, "cxlkvd")
        rng = random.Random(1234 if kind == "locks" else 4321)
        # Below the 1 KiB owner granule, within one chunk, and a run of whole
        # 2 MiB chunks (the three ways a start is checked: docs/integrity.md
        # "Block owners: overlapping entries").
        sizes = [300, 1000, 5000, 70000, (2 << 20) + 4096]
        for i, n in enumerate(sizes):
            f = os.path.join(self.work, f"{kind}-b{i}")
            with open(f, "wb") as fh:
                fh.write(rng.randbytes(n))
            r = self.ctlrun(p.uri, "kv", "put", f"block-{kind}-{i}", f)
            cmd_ok(r, "kv put")
            p.blocks.append((r.out.split()[0].decode(), f))
        p.new_block = os.path.join(self.work, f"{kind}-new")
        with open(p.new_block, "wb") as fh:
            fh.write(rng.randbytes(70000))
        # A second chain root put and removed: a TOMBSTONE / freed space
        # that readers must skip.
        f = os.path.join(self.work, f"{kind}-gone")
        with open(f, "wb") as fh:
            fh.write(os.urandom(3000))
        cmd_ok(self.ctlrun(p.uri, "kv", "put", "gone", f), "kv put")
        cmd_ok(self.ctlrun(p.uri, "kv", "rm", "gone"), "kv rm")
        cmd_ok(d.stop(10), "cxlkvd stop")
        info = json.loads(self.ctlrun(p.uri, "--json", "info").out)
        p.carves = {c["name"]: (c["offset"], c["size"]) for c in info["carves"]}
        self.pool_ids.add(info["pool_id"])
        return p

    def make_pnm_pool(self):
        path = os.path.join(self.work, "base-pnm")
        p = Pool("pnm", path, 16 << 20)
        cmd_ok(self.ctlrun(p.uri, "format", "--size", "16M", "--max-nodes", "4", "--no-standard"), "format")
        ref = os.path.join(self.work, "pnm-ref.npz")
        cmd_ok(run([sys.executable, "-c", PY_PNM_MAKE, p.uri, ref], 60, self.env), "pnm context")
        p.pnm_ref = ref
        info = json.loads(self.ctlrun(p.uri, "--json", "info").out)
        p.carves = {c["name"]: (c["offset"], c["size"]) for c in info["carves"]}
        self.pool_ids.add(info["pool_id"])
        return p

    # -- targets: (class, name, offset, length, fixer or None, forge values)

    def targets(self, p):
        img = open(p.path, "rb").read()
        t = []

        def add(cls, name, off, n=LINE, fix=None, vals=()):
            t.append((cls, name, off, n, fix, tuple(vals)))

        # superblock (uapi/cxlkv_pool.h)
        ncarves = u32(img, 28)
        add("superblock", "sb.line0", 0, 64, fix_sb)
        add("superblock", "sb.line1", 64, 64, fix_sb)
        for i in range(ncarves):
            add("carve_table", f"sb.carve[{i}]", 128 + 64 * i, 64, fix_sb,
                (2 << 20, 4 << 20, u64(img, 128 + 64 * i + 32) + (2 << 20)))
        add("superblock", "sb.reserved", 128 + 64 * ncarves, 64, fix_sb)

        if p.kind == "pnm":
            c0, _ = p.carves["pnm"]
            add("pnm", "pnm.header", c0, 64, fix_hdr32(c0, 64, 36))
            parts_off, part_bytes, spp = u64(img, c0 + 16), u64(img, c0 + 24), u32(img, c0 + 32)
            stats_off = u64(img, c0 + 40)
            if stats_off:
                add("pnm", "pnm.part_stats", c0 + stats_off)
            part = c0 + parts_off
            add("pnm", "pnm.partition", part)
            for s in range(min(spp, 2)):
                so = part + 64 + 128 * s
                add("pnm", f"pnm.slot[{s}].ctx", so, 64, fix_check_at(so, 48))
                add("pnm", f"pnm.slot[{s}].count", so + 64, 64, fix_check_at(so + 64, 12))
            ctx = part + 64
            pt, dg = u64(img, ctx + 32), u64(img, ctx + 40)
            if 0 < pt < len(img) - 128:
                add("pnm", "pnm.page_table", pt, 64, None, (0, 4096, u64(img, pt) + 64, u64(img, pt + 8)))
                add("pnm", "pnm.page_table.line1", pt + 64)
            if 0 < dg < len(img) - 128:
                add("pnm", "pnm.digests", dg)
            return t

        # control carve (uapi/cxlkv_ctrl.h)
        c0, _ = p.carves["control"]
        max_nodes, max_locks = u32(img, c0 + 12), u32(img, c0 + 16)
        lease, nodes, locks, grants, bells = (u64(img, c0 + o) for o in (24, 32, 40, 48, 56))
        add("control", "control.header", c0, 64, fix_hdr32(c0, 64, 20), (c0, 64, 4096))
        add("control", "control.lease", c0 + lease)
        for n in range(max_nodes):
            add("control", f"control.node[{n}]", c0 + nodes + 64 * n)
        i0, _ = p.carves["index"]
        lock_base = u32(img, i0 + 56)
        nstripes = u32(img, i0 + 28)
        for lk in sorted({0, 1, 2, 3, 5, 72, lock_base, lock_base + nstripes - 1}):
            if lk >= max_locks:
                continue
            for n in range(max_nodes):
                add("control", f"control.lock[{lk}][{n}]", c0 + locks + (lk * max_nodes + n) * 64)
            add("control", f"control.grant[{lk}]", c0 + grants + 64 * lk)
        for n in range(max_nodes):
            add("control", f"control.doorbell[{n}]", c0 + bells + 64 * n)

        # index carve (cxlkv/format/index_format.h)
        nslots = u64(img, i0 + 16)
        stripe_off, stats_off, entry_off = u64(img, i0 + 32), u64(img, i0 + 40), u64(img, i0 + 48)
        ext_off = (entry_off + nslots * 64 + 4095) // 4096 * 4096
        add("index", "index.header", i0, 64, fix_hdr32(i0, 64, 60), (64, 4096, nslots * 2))
        add("index", "index.config", i0 + 64)
        for s in range(nstripes):
            add("index", f"index.stripe[{s}]", i0 + stripe_off + 64 * s)
        for n in range(min(max_nodes, 4)):
            add("index", f"index.stats[{n}]", i0 + stats_off + 40 * 64 * n)
        locs = []
        empty = 0
        for s in range(nslots):
            eo = i0 + entry_off + 64 * s
            if img[eo + 30] != 0:
                locs.append(u64(img, eo + 16))
        for s in range(nslots):
            eo = i0 + entry_off + 64 * s
            if img[eo + 30] != 0:
                lo = u64(img, eo + 16)
                vals = [lo + 1, lo + 64, lo + 1023, lo + 1024, lo - 1024, lo + (2 << 20)] + \
                    [x for x in locs if x != lo][:2]
                add("index_entry", f"index.entry[{s}]", eo, 64, fix_entry(eo), vals)
                add("index_entry", f"index.ext[{s}]", i0 + ext_off + 32 * s, 32)
            elif empty < 2:
                empty += 1
                add("index_entry", f"index.entry[{s}](empty)", eo, 64, fix_entry(eo))

        # alloc carve (cxlkv/format/alloc_format.h)
        a0, _ = p.carves["alloc"]
        nchunks, bitmap, table, inbox = u64(img, a0 + 32), u64(img, a0 + 40), u64(img, a0 + 48), u64(img, a0 + 56)
        objstore, state = u64(img, a0 + 96), u64(img, a0 + 112)
        add("alloc", "alloc.header.line0", a0, 64, fix_alloc_hdr(a0), (64, nchunks + 1, nchunks * 2))
        add("alloc", "alloc.header.line1", a0 + 64, 64, fix_alloc_hdr(a0), (64, 4096))
        nwords = (nchunks + 63) // 64
        bfix = fix_bitmap(a0 + bitmap, nwords, a0 + state)
        add("alloc_bitmap", "alloc.bitmap", a0 + bitmap, max(8, 8 * nwords) if nwords < 8 else 64, bfix,
            (0, MASK64, u64(img, a0 + bitmap) ^ 1, u64(img, a0 + bitmap) ^ 2, u64(img, a0 + bitmap) >> 1))
        add("alloc_bitmap", "alloc.state", a0 + state)
        used = [c for c in range(nchunks) if (u64(img, a0 + bitmap + 8 * (c // 64)) >> (c % 64)) & 1]
        for c in sorted(set(used[:6] + [nchunks - 1])):
            add("alloc", f"alloc.chunk[{c}]", a0 + table + 8 * c, 8, None, (0, 1, 0xffff, 0x10001))
        for n in range(min(max_nodes, 2)):
            add("alloc", f"alloc.inbox[{n}]", a0 + inbox + 64 * n)
        q0 = a0 + state + 64
        add("alloc", "alloc.quarantine[0]", q0)
        owner_off = state + 64 + (nchunks * 32 + 63) // 64 * 64
        granules = u64(img, a0 + 16) // 1024
        for c in used[:4]:
            add("alloc_owner", f"alloc.owner[chunk {c}]", a0 + owner_off + 8 * granules * c, 64, None,
                (0, 1, 2, 0x100000000, 0x1000000400))
        add("objstore", "objstore.header", a0 + objstore, 64, None, (0, 1, 64, 4096))
        add("objstore", "objstore.entry[0]", a0 + objstore + u64(img, a0 + objstore + 16), 64,
            fix_check_at(a0 + objstore + u64(img, a0 + objstore + 16), 20))

        # rpc.index carve (cxlkv/format/rpc_format.h)
        if "rpc.index" in p.carves:
            r0, _ = p.carves["rpc.index"]
            add("rpc", "rpc.header", r0, 64, fix_hdr32(r0, 64, 28), (64, 4096, 1))
            server_off, rings_off, ring_bytes = u64(img, r0 + 32), u64(img, r0 + 40), u64(img, r0 + 48)
            depth, req_lines = u32(img, r0 + 16), u32(img, r0 + 20)
            add("rpc", "rpc.server", r0 + server_off)
            for ring in range(2):
                rb = r0 + rings_off + ring * ring_bytes
                for ln, what in ((0, "client"), (1, "doorbell"), (2, "ack")):
                    add("rpc", f"rpc.ring[{ring}].{what}", rb + 64 * ln)
                for slot in range(2):
                    add("rpc", f"rpc.ring[{ring}].req[{slot}]", rb + 64 * (3 + slot * req_lines))
                    add("rpc", f"rpc.ring[{ring}].resp[{slot}]",
                        rb + 64 * (3 + depth * req_lines + slot))
        return t

    # -- damage

    def damage(self, img, target, kind, rng):
        cls, name, off, n, fix, vals = target
        if kind == "random":
            img[off:off + n] = rng.randbytes(n)
        elif kind == "flip":
            b = rng.randrange(n * 8)
            img[off + b // 8] ^= 1 << (b % 8)
        elif kind == "zero":
            img[off:off + n] = bytes(n)
        elif kind == "ones":
            img[off:off + n] = b"\xff" * n
        elif kind == "forge":
            # One aligned field set to a plausible value; then the checksum
            # that covers the region is recomputed so the forgery passes it.
            width = rng.choice((4, 8)) if n >= 8 else 4
            fo = off + rng.randrange(n // width) * width
            old = int.from_bytes(img[fo:fo + width], "little")
            m = (1 << (8 * width)) - 1
            cands = [0, 1, (old + 1) & m, (old - 1) & m, (old * 2) & m, (old + 64) & m, (old + 1024) & m,
                     (old + (2 << 20)) & m] + [v & m for v in vals]
            v = rng.choice(cands)
            img[fo:fo + width] = v.to_bytes(width, "little")
            if fix:
                fix(img)
        else:
            raise ValueError(kind)

    # -- readers

    def classify(self, r, names):
        if r.status in ("crash", "hang"):
            return r.status
        if r.status == "ok":
            return "accepted"
        # kv check reports what it found on stdout (exit 1: problems found).
        msg = (r.err + r.out).decode(errors="replace").lower()
        return "refused" if any(w in msg for w in names) else "unclear"

    def readers(self, p, path):
        """Runs every reader on the damaged copy at path; yields (reader, outcome, detail)."""
        uri = "file:" + path
        names = ["pool", "superblock", "carve", "control", "index", "alloc", "rpc", "pnm", "objstore",
                 "not cached"]
        tmo = self.a.timeout
        if p.kind == "pnm":
            for argv in (["info"], ["carve", "list"]):
                r = self.ctlrun(uri, *argv, timeout=tmo)
                yield " ".join(argv), self.classify(r, names), r
            r = run([sys.executable, "-c", PY_PNM_READ, uri, p.pnm_ref], tmo * 3, self.env)
            yield from self.py_results("py pnm attend", r, names)
            return
        d = Daemon(self.tools, uri, self.env, p.kind == "service", path + ".d.err")
        dr = d.wait_up(5)
        if dr is not None:
            yield "cxlkvd start", self.classify(dr, names), dr
        # A writer first: a damaged allocator (a forged bitmap or chunk
        # table) may hand it published space; the gets below then show
        # whether a published block's bytes are served changed
        # (a reuse is seen for as long as it lasts: docs/integrity.md
        # "Space reuse seen at fetch").
        r = self.ctlrun(uri, "kv", "put", "damage-new-block", p.new_block, timeout=tmo)
        yield "kv put new", self.classify(r, names), r
        for key, f in p.blocks:
            out = path + ".out"
            r = self.ctlrun(uri, "kv", "get", key, out, timeout=tmo)
            o = self.classify(r, names)
            if o == "accepted":
                with open(f, "rb") as a, open(out, "rb") as b:
                    if a.read() != b.read():
                        o = "wrong"
            if os.path.exists(out):
                os.unlink(out)
            yield f"kv get {os.path.basename(f)}", o, r
        for argv in (["kv", "check"], ["kv", "ls"], ["stats"], ["index", "stats"], ["info"]):
            r = self.ctlrun(uri, *argv, timeout=tmo)
            yield " ".join(argv), self.classify(r, names), r
        if self.a.python:
            spec = json.dumps(p.blocks)
            r = run([sys.executable, "-c", PY_KV, uri, "2", spec], tmo * 3, self.env)
            yield from self.py_results("py kv get", r, names)
        if dr is None:
            r = d.stop(tmo)
            yield "cxlkvd stop", self.classify(r, names), r
        else:
            d.errf.close()

    def py_results(self, what, r, names):
        if r.status == "ok":
            try:
                res = json.loads(r.out.decode().strip().splitlines()[-1])
            except (ValueError, IndexError):
                yield what, "unclear", r
                return
            for st, _rc, msg in res:
                if st == "ok":
                    yield what, "accepted", r
                elif st == "miss":
                    # A clean miss: the status says "not cached" (docs/api.md "Python").
                    yield what, "refused", Run(1, b"", b"not cached", "fail")
                elif st == "wrong":
                    yield what, "wrong", r
                else:
                    yield what, "refused" if any(w in msg.lower() for w in names) else "unclear", \
                        Run(1, b"", msg.encode(), "fail")
        else:
            # A Python exception ends the reader: its last line is the message.
            yield what, self.classify(r, names), r

    def cleanup(self, path):
        for f in os.listdir("/dev/shm"):
            if f.startswith("cxlkv-node-") and any(pid in f for pid in self.pool_ids):
                try:
                    os.unlink(os.path.join("/dev/shm", f))
                except OSError:
                    pass
        for suffix in ("", ".d.err", ".out"):
            try:
                os.unlink(path + suffix)
            except OSError:
                pass

    # -- the campaign

    RANK = ["accepted", "refused", "unclear", "wrong", "hang", "crash"]

    def trial(self, p, base_img, target, kind, seed):
        rng = random.Random(f"{target[1]}/{kind}/{seed}")
        img = bytearray(base_img)
        self.damage(img, target, kind, rng)
        path = os.path.join(self.work, "trial")
        with open(path, "wb") as f:
            f.write(img)
        # A damaged pool id names other node-local files: clean those too.
        self.pool_ids.add(bytes(img[32:48]).hex())
        worst = "accepted"
        for reader, outcome, r in self.readers(p, path):
            if self.RANK.index(outcome) > self.RANK.index(worst):
                worst = outcome
            if outcome != "accepted":
                self.messages.setdefault(r.err.decode(errors="replace").strip()[-160:], [outcome, reader, target[1], kind])
            if outcome in ("crash", "hang", "wrong", "unclear"):
                self.findings.append({
                    "pool": p.kind, "target": target[1], "kind": kind, "seed": seed, "reader": reader,
                    "outcome": outcome, "rc": r.rc,
                    "stderr": r.err.decode(errors="replace").strip()[-300:]})
        self.cleanup(path)
        st = self.stats.setdefault(target[0], {k: 0 for k in ["tried"] + self.RANK})
        st["tried"] += 1
        st[worst] += 1
        return worst

    def main(self):
        t0 = time.monotonic()
        pools = []
        try:
            pools.append(self.make_kv_pool("locks"))
            pools.append(self.make_kv_pool("service"))
            if self.a.pnm:
                pools.append(self.make_pnm_pool())
            work = []
            for p in pools:
                p.targets = self.targets(p)
                self.ntargets += len(p.targets)
                for tg in p.targets:
                    if self.a.classes and tg[0] not in self.a.classes:
                        continue
                    if self.a.target and tg[1] != self.a.target:
                        continue
                    for kind in self.a.kinds:
                        for seed in range(self.a.seeds):
                            if kind in ("zero", "ones") and seed > 0:
                                continue  # the same bytes every seed
                            work.append((p, tg, kind, seed))
            # Shuffled (deterministically): a --sample or a time budget still
            # spreads over every target class and kind.
            random.Random(self.a.order_seed).shuffle(work)
            if self.a.sample:
                work = work[:self.a.sample]
            images = {p.kind: open(p.path, "rb").read() for p in pools}
            done = 0
            for p, tg, kind, seed in work:
                if self.a.budget_s and time.monotonic() - t0 > self.a.budget_s:
                    break
                self.trial(p, images[p.kind], tg, kind, seed)
                done += 1
            self.planned, self.done = len(work), done
        finally:
            for f in os.listdir("/dev/shm"):
                if f.startswith("cxlkv-node-") and any(pid in f for pid in self.pool_ids):
                    try:
                        os.unlink(os.path.join("/dev/shm", f))
                    except OSError:
                        pass
            shutil.rmtree(self.work, ignore_errors=True)
        self.elapsed = time.monotonic() - t0
        return self.report()

    def totals(self):
        tot = {k: 0 for k in ["tried"] + self.RANK}
        for st in self.stats.values():
            for k, v in st.items():
                tot[k] += v
        return tot

    def report(self):
        tot = self.totals()
        print(f"damage campaign: {self.done} of {self.planned} damaged inputs in {self.elapsed:.0f} s "
              f"(kinds {','.join(self.a.kinds)}, seeds {self.a.seeds})")
        hdr = f"{'target class':<14} {'tried':>6} {'refused':>8} {'accepted':>9} {'unclear':>8} " \
              f"{'crash':>6} {'hang':>5} {'wrong':>6}"
        print(hdr)
        for cls in sorted(self.stats):
            s = self.stats[cls]
            print(f"{cls:<14} {s['tried']:>6} {s['refused']:>8} {s['accepted']:>9} {s['unclear']:>8} "
                  f"{s['crash']:>6} {s['hang']:>5} {s['wrong']:>6}")
        s = tot
        print(f"{'total':<14} {s['tried']:>6} {s['refused']:>8} {s['accepted']:>9} {s['unclear']:>8} "
              f"{s['crash']:>6} {s['hang']:>5} {s['wrong']:>6}")
        seen = set()
        for f in self.findings:
            k = (f["target"], f["kind"], f["reader"], f["outcome"])
            if k in seen:
                continue
            seen.add(k)
            print(f"  {f['outcome']}: pool {f['pool']} target {f['target']} damage {f['kind']} seed {f['seed']}: "
                  f"{f['reader']} rc {f['rc']}: {f['stderr'][-200:]!r}")
        if self.a.json:
            with open(self.a.json, "w") as fh:
                json.dump({"totals": tot, "classes": self.stats, "findings": self.findings,
                           "messages": self.messages}, fh, indent=1)
        if self.a.results:
            res = {}
            if os.path.exists(self.a.results):
                with open(self.a.results) as fh:
                    res = json.load(fh)
            names = {"tried": "inputs", "refused": "refused", "accepted": "accepted", "unclear": "unclear",
                     "crash": "crashes", "hang": "hangs", "wrong": "wrong_status0"}
            for k, n in names.items():
                res[f"damage.{n}"] = tot[k]
            for cls, st in self.stats.items():
                for k in ("tried", "crash", "hang", "wrong"):
                    res[f"damage.{cls}.{names[k]}"] = st[k]
            res["damage.targets"] = self.ntargets
            res["damage.planned"] = self.planned
            res["damage.seconds"] = round(self.elapsed, 1)
            os.makedirs(os.path.dirname(os.path.abspath(self.a.results)), exist_ok=True)
            with open(self.a.results, "w") as fh:
                json.dump(res, fh, indent=1, sort_keys=True)
        bad = tot["crash"] + tot["hang"] + tot["wrong"]
        return 1 if (self.a.assert_clean and bad) else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    build = os.environ.get("CXLKV_BUILD", "build")
    ap.add_argument("--tools", default=os.environ.get("CXLKV_TEST_TOOLS", os.path.join(build, "tools")))
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--kinds", default="random,flip,zero,ones,forge")
    ap.add_argument("--budget-s", type=float, default=0, help="stop starting inputs after this long (0: none)")
    ap.add_argument("--timeout", type=float, default=15, help="seconds a reader may run before it is a hang")
    ap.add_argument("--python", action="store_true", help="also read every block through the Python package")
    ap.add_argument("--pnm", action="store_true", help="also damage a pnm carve (needs numpy)")
    ap.add_argument("--sample", type=int, default=0, help="damaged inputs to try (0: every one)")
    ap.add_argument("--order-seed", type=int, default=0, help="seed of the shuffled order of the inputs")
    ap.add_argument("--classes", default="", help="only these target classes (comma-separated)")
    ap.add_argument("--target", default="", help="only the target of this name (as a finding prints it)")
    ap.add_argument("--json")
    ap.add_argument("--results")
    ap.add_argument("--assert", dest="assert_clean", action="store_true")
    a = ap.parse_args()
    a.kinds = a.kinds.split(",")
    a.classes = [c for c in a.classes.split(",") if c]
    for tool in ("cxlkvctl", "cxlkvd"):
        if not os.access(os.path.join(a.tools, tool), os.X_OK):
            print(f"damage_campaign: no {tool} in {a.tools}: skipped", file=sys.stderr)
            return 77
    if (a.python or a.pnm) and subprocess.run([sys.executable, "-c", "import numpy"],
                                              stderr=subprocess.DEVNULL).returncode != 0:
        print(f"damage_campaign: {sys.executable} lacks numpy: no Python readers, no pnm carve", file=sys.stderr)
        a.python = a.pnm = False
    c = Campaign(a)
    c.ntargets = 0
    return c.main()


if __name__ == "__main__":
    sys.exit(main())
