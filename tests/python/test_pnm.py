# SPDX-License-Identifier: MIT
"""cxlkv.pnm: a long context appended from Python (numpy and torch bf16) is
read by a second store handle; attention with the whole context as budget
equals a float64 numpy reference; on planted-needle KV a small budget keeps
most of the attention mass; on the small real-attention model's keys the
captured mass is reported against T_budget; merging two partials equals the
union."""
import ctypes as C
import os

import numpy as np
import pytest

import cxlkv
from cxlkv import _lib, pnm
from conftest import make_uri

L, H, QH, D = 2, 2, 4, 32


@pytest.fixture
def pool():
    uri, path = make_uri("pnm", 64 << 20)
    o = _lib.FormatOpts(C.sizeof(_lib.FormatOpts), 0, 4, 1 << 1, 0, 0, 0)  # CXLKV_FORMAT_F_NO_STANDARD
    _lib.check(_lib.lib().cxlkv_pool_format(uri.encode(), C.byref(o)), "format")
    p = cxlkv.Pool(uri)
    yield p
    p.close()
    os.unlink(path)


def reference(q, k, v, pages_per_head, page_tokens):
    """float64 attention of q [L][QH][D] over the listed pages of k, v [L][H][n][D]."""
    n = k.shape[2]
    out = np.zeros(q.shape)
    lse = np.zeros(q.shape[:2])
    for l in range(L):
        for j in range(QH):
            h = j // (QH // H)
            idx = np.concatenate([np.arange(p * page_tokens, min(n, (p + 1) * page_tokens))
                                  for p in pages_per_head[l * H + h]])
            s = (k[l, h, idx].astype(np.float64) @ q[l, j].astype(np.float64)) / np.sqrt(D)
            m = s.max()
            w = np.exp(s - m)
            out[l, j] = (w[:, None] * v[l, h, idx]).sum(0) / w.sum()
            lse[l, j] = m + np.log(w.sum())
    return out, lse


def test_full_budget_equals_a_float64_reference(pool):
    rng = np.random.default_rng(1)
    n = 200
    k = rng.standard_normal((L, H, n, D)).astype(np.float32)
    v = rng.standard_normal((L, H, n, D)).astype(np.float32)
    with pnm.PnmStore(pool, carve_bytes=8 << 20) as ws, pnm.PnmStore(pool, readonly=True) as rs:
        w = ws.create(11, L, H, D, max_tokens=1024, dtype="f32")
        w.append(k[:, :, :70], v[:, :, :70])
        w.append(k[:, :, 70:], v[:, :, 70:])
        r = rs.find(11)
        assert r.refresh() == n
        q = rng.standard_normal((L, QH, D)).astype(np.float32)
        out, lse, stats = r.attend(q, token_budget=1 << 20, engine=pnm.Engine(2))
        np_pages = (n + 15) // 16
        want, want_lse = reference(q, k, v, [list(range(np_pages))] * (L * H), 16)
        assert np.abs(out - want).max() < 1e-4
        assert np.abs(lse - want_lse).max() < 1e-4
        assert stats["ntokens"] == n and stats["selected_pages"] == L * H * np_pages
        # Two disjoint halves merge into the whole.
        sel = r.select(q, token_budget=48)
        assert all(len(s) == 3 and s[0] == 0 and s[-1] == np_pages - 1 for s in sel)
        out_s, lse_s, _ = r.attend(q, token_budget=48)
        want_s, _ = reference(q, k, v, sel, 16)
        assert np.abs(out_s - want_s).max() < 1e-4
        rest = [sorted(set(range(np_pages)) - set(s.tolist())) for s in sel]
        want_r, want_rl = reference(q, k, v, rest, 16)
        m, ml = pnm.merge(out_s, lse_s, want_r.astype(np.float32), want_rl.astype(np.float32))
        assert np.abs(m - want).max() < 1e-4
        ws.destroy(11)
        with pytest.raises(cxlkv.CxlkvError) as e:
            r.refresh()
        assert "destroyed" in str(e.value)


def test_q8_two_level_context_attends_over_its_selection_and_reads_fewer_digest_bytes(pool):
    rng = np.random.default_rng(4)
    n = 640  # 40 pages, 10 groups of 4
    k = rng.standard_normal((L, H, n, D)).astype(np.float32)
    v = rng.standard_normal((L, H, n, D)).astype(np.float32)
    with pnm.PnmStore(pool, carve_bytes=8 << 20) as ws, pnm.PnmStore(pool, readonly=True) as rs:
        for rid, kind, groups in ((21, "minmax", 0), (22, "q8", 4)):
            w = ws.create(rid, L, H, D, max_tokens=1024, dtype="f32", digest=kind, group_pages=groups)
            w.append(k, v)
        flat, two = rs.find(21), rs.find(22)
        assert (flat.digest, flat.group_pages, two.digest, two.group_pages) == ("minmax", 1, "q8", 4)
        q = rng.standard_normal((L, QH, D)).astype(np.float32)
        _, _, stats = two.attend(q, token_budget=64, refine_pages=8)
        sel = two.select(q, token_budget=64)
        want, want_lse = reference(q, k, v, [s.tolist() for s in sel], 16)
        _, _, flat_stats = flat.attend(q, token_budget=64)
        # refine_pages=8: 10 group rows + 2 groups of 4 page rows, 8 + 2 x 32 bytes each.
        assert stats["digest_bytes"] == L * H * (10 + 8) * (8 + 2 * D)
        assert flat_stats["digest_bytes"] == L * H * 40 * 2 * D * 4
        out_d, lse_d, _ = two.attend(q, token_budget=64)
        assert np.abs(out_d - want).max() < 1e-4 and np.abs(lse_d - want_lse).max() < 1e-4
        with pytest.raises(cxlkv.CxlkvError) as e:
            ws.create(23, L, H, D, max_tokens=1024, group_pages=3)
        assert "group_pages 3" in str(e.value)
        with pytest.raises(ValueError):
            ws.create(24, L, H, D, max_tokens=1024, digest="int4")
        # group_pages=0 (the default): the store's choice, two levels of 16
        # from 4096 pages of capacity; 1: one level at any size.
        assert ws.create(25, 1, 1, 8, max_tokens=4096 * 4, page_tokens=4).group_pages == 16
        assert ws.create(26, 1, 1, 8, max_tokens=4096 * 4, page_tokens=4, group_pages=1).group_pages == 1
        assert ws.create(27, 1, 1, 8, max_tokens=4095 * 4, page_tokens=4).group_pages == 1


def test_planted_needles_keep_most_attention_mass_with_a_small_budget(pool):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(2)
    n, needles = 4096, [777, 2222, 3500]
    k = torch.randn((L, H, n, D), generator=g) * 0.3
    v = torch.randn((L, H, n, D), generator=g)
    # Query heads of one KV head ask about the same thing (as grouped heads
    # of a trained model tend to): a shared direction plus a little noise.
    base = torch.randn((L, H, D), generator=g)
    q = base.repeat_interleave(QH // H, dim=1) + 0.1 * torch.randn((L, QH, D), generator=g)
    for t in needles:  # keys aligned with their KV head's query direction
        k[:, :, t] = base * 2.5
    with pnm.PnmStore(pool, carve_bytes=16 << 20) as ws, pnm.PnmStore(pool, readonly=True) as rs:
        w = ws.create(12, L, H, D, max_tokens=n, dtype="bf16")
        w.append(k.to(torch.bfloat16), v.to(torch.bfloat16))
        r = rs.find(12)
        kb = k.to(torch.bfloat16).float().numpy()
        sel = r.select(q.numpy(), token_budget=256)
        for s in sel:
            for t in needles:
                assert t // 16 in s, "a needle page was not selected"
        # Mass of the full softmax captured by the selected pages.
        for l in range(L):
            for j in range(QH):
                h = j // (QH // H)
                s = kb[l, h] @ q[l, j].numpy() / np.sqrt(D)
                p = np.exp(s - s.max())
                p /= p.sum()
                kept = np.concatenate([np.arange(pg * 16, pg * 16 + 16) for pg in sel[l * H + h]])
                assert p[kept].sum() > 0.9


def test_bad_input_is_refused(pool):
    with pnm.PnmStore(pool, carve_bytes=8 << 20) as ws:
        with pytest.raises(ValueError):
            ws.create(1, L, H, D, max_tokens=64, dtype="int8")
        w = ws.create(1, L, H, D, max_tokens=64, dtype="f16")
        with pytest.raises(ValueError):
            w.append(np.zeros((L, H, 4, D + 1)), np.zeros((L, H, 4, D + 1)))
        with pytest.raises(cxlkv.CxlkvError) as e:
            w.append(np.zeros((L, H, 65, D)), np.zeros((L, H, 65, D)))
        assert "capacity" in str(e.value)
        with pytest.raises(cxlkv.CxlkvError):
            w.attend(np.zeros((L, 3, D)))  # 3 query heads over 2 KV heads
        with pytest.raises(cxlkv.CxlkvError) as e:
            pnm.PnmStore(pool)  # partition 0 already has a writer
        assert e.value.errno == 16  # EBUSY


def test_selection_on_a_real_attention_models_keys_captures_mass_growing_with_the_budget(pool, capsys):
    """Keys and the decode query of the small Llama-style model (tests/python/
    tiny_llama.py: RoPE, grouped-query heads) on a 1023-token prompt: the
    fraction of the full softmax mass held by the selected pages, against
    T_budget.  It never falls as the budget grows (a larger budget selects a
    superset), is 1 with the whole context as budget, and with the
    per-dimension upper bound beats keeping the same number of pages blindly
    (sink + most recent pages only)."""
    torch = pytest.importorskip("torch")
    from tiny_llama import Config, PagedCache, TinyLlama

    torch.set_num_threads(1)
    cfg = Config()
    model = TinyLlama(cfg)
    n, bt = 1023, 16
    blocks = (n + 1 + bt - 1) // bt
    cache = PagedCache("sglang", cfg, blocks, bt, torch.float32)
    table = list(range(blocks))
    rng = np.random.default_rng(5)
    model.forward(rng.integers(0, cfg.vocab, n).tolist(), 0, cache, table)
    # The decode step's queries: rope() is called with q, then k, per layer.
    seen, rope = [], model.rope
    model.rope = lambda x, pos: seen.append(rope(x, pos)) or seen[-1]
    model.forward([int(rng.integers(0, cfg.vocab))], n, cache, table)
    model.rope = rope
    q = torch.stack([seen[2 * l][0] for l in range(cfg.layers)]).numpy()  # [layers][heads][head]
    k = torch.stack([cache.read(l, table, n + 1)[0].permute(1, 0, 2) for l in range(cfg.layers)]).numpy()
    v = torch.stack([cache.read(l, table, n + 1)[1].permute(1, 0, 2) for l in range(cfg.layers)]).numpy()
    ntok = n + 1
    with pnm.PnmStore(pool, carve_bytes=16 << 20) as ws:
        w = ws.create(21, cfg.layers, cfg.kv_heads, cfg.head, max_tokens=ntok, dtype="f32", page_tokens=bt)
        w.append(k, v)
        _, lse_all, _ = w.attend(q, all_pages=True)
        rows = []
        last = 0.0
        for budget in (64, 128, 256, 512, ntok):
            _, lse, st = w.attend(q, token_budget=budget)
            mass = float(np.exp(lse.astype(np.float64) - lse_all).mean())
            # Blind: sink page + the most recent pages, as many as the budget's.
            _, lse_b, _ = w.attend(q, token_budget=bt, sink_pages=1, local_pages=budget // bt - 1)
            blind = float(np.exp(lse_b.astype(np.float64) - lse_all).mean())
            rows.append((budget, mass, blind))
            assert mass >= last - 1e-6, f"mass fell from {last} to {mass} at budget {budget}"
            last = mass
        with capsys.disabled():
            print("\ntiny_llama keys, %d tokens: T_budget, attention mass captured (upper bound), blind" % ntok)
            for b, m, bl in rows:
                print("  %5d  %.4f  %.4f" % (b, m, bl))
        assert abs(rows[-1][1] - 1.0) < 1e-5
        for b, m, bl in rows[:-1]:
            assert m >= bl - 1e-3, f"budget {b}: selection {m:.4f} < blind {bl:.4f}"


def test_closing_the_pool_first_closes_pnm_stores_and_contexts(tmp_path):
    """pool.close() with a PnmStore and a context open: their later calls
    raise ValueError naming them (before: SIGSEGV in cxlkv_pnm_find on the
    unmapped pool).  Run in a child process so a crash fails only this test."""
    import subprocess
    import sys
    uri, path = make_uri("pnmclose", 64 << 20)
    script = tmp_path / "pnm_close.py"
    script.write_text(f"""
import ctypes as C, numpy as np, cxlkv
from cxlkv import _lib, pnm
o = _lib.FormatOpts(C.sizeof(_lib.FormatOpts), 0, 4, 1 << 1, 0, 0, 0)
_lib.check(_lib.lib().cxlkv_pool_format({uri!r}.encode(), C.byref(o)), "format")
p = cxlkv.Pool({uri!r})
st = pnm.PnmStore(p, carve_bytes=8 << 20)
ctx = st.create(7, layers=1, kv_heads=1, head_dim=32, max_tokens=64, dtype="f32")
p.close()
for call in (lambda: st.find(7), lambda: ctx.append(np.zeros((1, 1, 16, 32), np.float32), np.zeros((1, 1, 16, 32), np.float32))):
    try:
        call()
        print("answered")
    except ValueError as e:
        print("closed" if "is closed" in str(e) else e)
ctx.close(); st.close()  # harmless now
""")
    try:
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.split() == ["closed", "closed"], (r.returncode, r.stdout, r.stderr[-3000:])
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_closing_while_another_thread_attends_waits_for_the_call(tmp_path):
    """A thread loops attend() while the main thread closes the pool (or the
    store): the close waits for the call in progress, the thread's next call
    raises ValueError naming the context (before: SIGSEGV, the context freed
    and the pool unmapped under the running call).  Many rounds, in a child
    process so a crash fails only this test."""
    import subprocess
    import sys
    uri, path = make_uri("pnmrace", 64 << 20)
    script = tmp_path / "pnm_race.py"
    script.write_text(f"""
import ctypes as C, random, threading, time, numpy as np, cxlkv
from cxlkv import _lib, pnm
o = _lib.FormatOpts(C.sizeof(_lib.FormatOpts), 0, 4, 1 << 1, 0, 0, 0)
_lib.check(_lib.lib().cxlkv_pool_format({uri!r}.encode(), C.byref(o)), "format")
L, H, D, N = 2, 2, 64, 2048
p = cxlkv.Pool({uri!r})
st = pnm.PnmStore(p, carve_bytes=16 << 20, partitions=1)
rng = np.random.default_rng(1)
st.create(7, layers=L, kv_heads=H, head_dim=D, max_tokens=N, dtype="f32").append(
    rng.standard_normal((L, H, N, D), np.float32), rng.standard_normal((L, H, N, D), np.float32))
p.close()
q = rng.standard_normal((L, H, D), np.float32)
calls = 0
for rnd in range(40):
    p = cxlkv.Pool({uri!r})
    rs = pnm.PnmStore(p, readonly=True)
    ctx = rs.find(7)
    ctx.attend(q, all_pages=True)
    started, ended = threading.Event(), []
    def loop():
        global calls
        try:
            while True:
                ctx.attend(q, all_pages=True)
                calls += 1
                started.set()
        except ValueError as e:
            ended.append(str(e))
        except Exception as e:  # noqa: BLE001
            ended.append("unexpected: %r" % e)
        started.set()
    t = threading.Thread(target=loop)
    t.start()
    started.wait(10)
    time.sleep(random.random() * 0.003)
    (p.close if rnd % 2 == 0 else rs.close)()
    t.join(30)
    assert not t.is_alive(), "attend thread still running after close"
    assert ended and "context 7 is closed" in ended[0], ended
    try:
        ctx.refresh()
        raise SystemExit("a call after close answered")
    except ValueError:
        pass
    p.close()
print("ok", calls)
""")
    try:
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and r.stdout.startswith("ok"), (r.returncode, r.stdout, r.stderr[-3000:])
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_a_refused_store_open_leaves_no_carve_without_a_header(pool):
    """Options that cannot lay out a carve are refused before the carve is
    made: the next open with good options works (before: every open failed
    "not initialised (no magic) after 2 s" until `cxlkvctl carve rm pnm`)."""
    with pytest.raises(cxlkv.CxlkvError) as e:
        pnm.PnmStore(pool, carve_bytes=8 << 20, slots_per_partition=2**32 - 1)
    assert e.value.errno == 22 and "too small" in str(e.value), str(e.value)
    assert "pnm" not in [c["name"] for c in pool.carves()]
    with pnm.PnmStore(pool, carve_bytes=8 << 20) as st:
        st.create(1, L, H, D, max_tokens=64, dtype="f32")
