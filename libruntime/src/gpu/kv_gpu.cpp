// SPDX-License-Identifier: MIT
// The KV store's write and read paths with GPU tensors on the engine side:
// whole blocks (publish / fetch / put_chain / get_many) and layer by layer
// (load_layers / save_layers; docs/gpu.md "Layer-wise transfers"), on every tier.
//
// Coherence: the payload reaches the pool by GPU DMA, which bypasses CPU
// caches (DDIO off, cuda/README.md), so no flush is needed for it; what
// matters is order.  Rule 5: publish -- the index entry that makes a block
// visible -- runs only after the DMA that filled the block has completed
// (wait_enqueued / the layer events).  On the read side the pins are
// dropped only after the copies completed, so eviction cannot reuse a block
// the GPU is still reading.  SSD-tier blocks are read by the store itself
// (fetch_many: checked against their key; docs/integrity.md "The SSD tier") into pinned staging
// memory, which only the CPU wrote and the GPU reads after the read.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <string>

#include "cuda/cxlkv_cuda_abi.h"
#include "cxlkv/gpu.hpp"
#include "cxlkv/keys.hpp"
#include "cxlkv/kv.hpp"
#include "index/prefix_index.hpp"
#include "kv/interleave.hpp"
#include "cxlkv/format/index_format.h"
#include "kv/store_index.hpp"
#include "util/log.hpp"

namespace cxlkv::gpu {

namespace {
constexpr auto kParentWait = std::chrono::milliseconds(5000);

std::string what_block(const BlockKey& k) { return "GPU path: block " + to_hex(k); }
}  // namespace

Result<GpuPool*> KvGpu::launcher() const {
  GpuPool* first = nullptr;
  for (GpuPool* g : devices_) {
    if (!g) continue;
    if (!first) first = g;
    else if (&g->library().ops() != &first->library().ops() || g->device() != first->device())
      return Error(-EINVAL, "GPU path: the pool devices' GpuPools are on different GPUs or libraries");
  }
  if (!first) return Error(-ENODEV, "GPU path: no pool device has a pinned GpuPool");
  return first;
}

Result<PoolResolver> KvGpu::mem_resolver(const Loc& loc, const BlockKey& key) const {
  const auto& pdevs = store_.devices();
  // A location outside a device's kv carve is a damaged entry: refused, never read or written.
  auto in_carve = [&](uint32_t d, uint64_t off, uint64_t len) -> Result<void> {
    const PoolDevice& dv = pdevs[d];
    const uint64_t lo = dv.payload_hi ? dv.payload_lo : 0, hi = dv.payload_hi ? dv.payload_hi : dv.size;
    if (off >= lo && off <= hi && len <= hi - off) return {};
    return Error(-EUCLEAN, what_block(key) + ": location [" + std::to_string(off) + ", +" + std::to_string(len) +
                               ") of device " + std::to_string(d) + " is outside its kv carve: not transferred");
  };
  auto gpu_pool = [&](uint32_t d) -> Result<GpuPool*> {
    if (d >= devices_.size() || !devices_[d])
      return Error(-ENODEV, what_block(key) + " is on pool device " + std::to_string(d) +
                                ", which has no pinned GpuPool");
    if (d >= pdevs.size())
      return Error(-ENODEV, what_block(key) + " names pool device " + std::to_string(d) + ", the store has " +
                                std::to_string(pdevs.size()));
    return devices_[d];
  };
  if (loc.tier != CXLKV_TIER_MEM)
    return Error(-EINVAL, what_block(key) + " is on tier " + std::to_string(loc.tier) + ", not pool memory");
  if (loc.dev == CXLKV_LOC_DEV_INTERLEAVED) {
    const cxlkv_index_config& cfg = store_index(store_).config();
    auto set = std::make_shared<InterleaveSet>(cfg.interleave_stripe, cfg.ndevices ? cfg.ndevices : 1, cfg.weights);
    const uint64_t ext = set->extent(loc.len);
    std::vector<GpuPool*> pools(set->devices());
    for (uint32_t d = 0; d < set->devices(); d++) {
      auto g = gpu_pool(d);
      if (!g) return g.error();
      pools[d] = g.value();
      CXLKV_TRY(in_carve(d, loc.off, ext));
    }
    const uint64_t base = loc.off, blen = loc.len;
    return PoolResolver([set, pools, base, blen](uint64_t x, uint64_t len, std::vector<DevicePiece>& out) -> Result<void> {
      if (x > blen || len > blen - x) return Error(-ERANGE, "bytes beyond the interleaved block");
      // The block's stripe map: logical byte x lives on device `dev` at base + doff.
      while (len) {
        uint32_t dev;
        uint64_t doff, run;
        set->map(x, &dev, &doff, &run);
        const uint64_t n = std::min(len, run);
        CXLKV_TRY(pools[dev]->pin().to_device(base + doff, n, out));
        x += n;
        len -= n;
      }
      return {};
    });
  }
  auto g = gpu_pool(loc.dev);
  if (!g) return g.error();
  CXLKV_TRY(in_carve(loc.dev, loc.off, loc.len));
  const PoolPin* pin = &g.value()->pin();
  const uint64_t base = loc.off, blen = loc.len;
  return PoolResolver([pin, base, blen](uint64_t x, uint64_t len, std::vector<DevicePiece>& out) -> Result<void> {
    if (x > blen || len > blen - x) return Error(-ERANGE, "bytes beyond the block");
    return pin->to_device(base + x, len, out);
  });
}

void KvGpu::staged_fetch(std::span<const KvPin> pins, std::span<const size_t> at, const PagedLayout& layout,
                         std::span<const uint64_t> block_ids, void* stream, std::span<int32_t> status) {
  if (at.empty()) return;
  auto lg = launcher();
  auto fail_all = [&](size_t from, const Error& e) {
    for (size_t k = from; k < at.size(); k++) status[at[k]] = e.code();
    log().warn("GPU path: SSD blocks not fetched: {}", e.message());
  };
  if (!lg) return fail_all(0, lg.error());
  GpuPool* gp = lg.value();
  const uint64_t bb = layout.block_bytes();
  size_t k = 0;
  while (k < at.size()) {
    // One slot: as many blocks as fit.  The store reads them (io_uring,
    // several in flight, each checked against its key) while the GPU is
    // still copying the previous slot.
    auto slot = gp->staging_acquire(bb);
    if (!slot) return fail_all(k, slot.error());
    const size_t per = std::max<size_t>(1, slot->bytes / bb);
    const size_t m = std::min(per, at.size() - k);
    std::vector<KvPin> group(m);
    std::vector<Chunk> chunks(m);
    std::vector<uint32_t> nch(m, 1);
    std::vector<int32_t> st(m, 0);
    for (size_t j = 0; j < m; j++) {
      group[j] = pins[at[k + j]];
      chunks[j] = Chunk{slot->host + j * bb, bb};
    }
    auto f = store_.fetch_many(group, chunks, nch, st);
    std::vector<cxlkv_copy_desc> descs;
    for (size_t j = 0; j < m; j++) {
      const size_t i = at[k + j];
      if (!f) st[j] = f.error().code();
      if (st[j] != 0) {
        status[i] = st[j];
        continue;
      }
      const uint64_t base = slot->dev + j * bb;
      PoolResolver r = [base](uint64_t x, uint64_t len, std::vector<DevicePiece>& out) -> Result<void> {
        out.push_back({base + x, len});
        return {};
      };
      if (auto p = plan_block(layout, block_ids[i], 0, layout.num_layers, r, Direction::scatter, descs); !p)
        status[i] = p.error().code();
    }
    if (!descs.empty()) {
      if (auto c = gp->copy(descs, stream); !c)
        for (size_t j = 0; j < m; j++)
          if (status[at[k + j]] == 0) status[at[k + j]] = c.error().code();
    }
    if (auto rel = gp->staging_release(slot.value(), stream); !rel) {
      // Without the event the slot's next user cannot know the copy is done: wait here.
      (void)gp->wait_enqueued(stream);
    }
    k += m;
  }
}

Result<GpuPublishReport> KvGpu::publish(std::span<const BlockKey> chain, const BlockKey* parent,
                                        const PagedLayout& layout, std::span<const uint64_t> block_ids,
                                        void* stream) {
  CXLKV_TRY(layout.validate());
  if (chain.size() != block_ids.size())
    return Error(-EINVAL, "GPU publish: " + std::to_string(chain.size()) + " keys but " +
                              std::to_string(block_ids.size()) + " GPU blocks");
  const uint64_t bytes = layout.block_bytes();
  GpuPublishReport rep;
  std::vector<KvReservation> mine;
  std::vector<cxlkv_copy_desc> descs;
  auto abort_all = [&](size_t from) {
    for (size_t i = from; i < mine.size(); i++) (void)store_.abort(mine[i]);
  };

  for (size_t i = 0; i < chain.size(); i++) {
    auto r = store_.reserve(chain[i], i ? &chain[i - 1] : parent, bytes);
    if (!r) {
      abort_all(0);
      return Error(r.error().code(), "GPU publish: " + r.error().message());
    }
    if (r->status == 1) {
      rep.already_cached++;
      continue;
    }
    if (r->status == 2) {
      rep.busy++;
      continue;
    }
    mine.push_back(r.value());
    if (r->length != bytes) {
      abort_all(0);
      return Error(-EINVAL, "GPU publish: block " + to_hex(chain[i]) + " reserved " + std::to_string(r->length) +
                                " bytes, the layout's blocks are " + std::to_string(bytes));
    }
    auto res = mem_resolver(Loc{r->loc_tier, r->loc_dev, r->loc_off, r->length}, chain[i]);
    if (!res) {
      abort_all(0);
      return res.error();
    }
    if (auto p = plan_block(layout, block_ids[i], 0, layout.num_layers, res.value(), Direction::gather, descs); !p) {
      abort_all(0);
      return Error(p.error().code(), "GPU publish: " + p.error().message());
    }
  }

  if (!descs.empty()) {
    auto lg = launcher();
    if (!lg) {
      abort_all(0);
      return lg.error();
    }
    GpuPool* gp = lg.value();
    auto g = gp->copy(descs, stream);
    // rule 5: the index entries are written only after the DMA has completed
    // (a failed launch is waited for too, before its space can be reused).
    auto w = gp->wait_enqueued(stream);
    if (!g || !w) {
      abort_all(0);
      const Error& e = !g ? g.error() : w.error();
      return Error(e.code(), "GPU publish: " + e.message());
    }
  }

  // Publish parents before children (the index refuses a child of an
  // unpublished parent with -EAGAIN; a parent another node is writing is
  // waited for once).
  for (size_t i = 0; i < mine.size(); i++) {
    auto p = store_.publish(mine[i]);
    if (!p && p.error().code() == -EAGAIN) {
      const BlockKey* pk = parent;
      for (size_t j = 1; j < chain.size(); j++)
        if (chain[j] == mine[i].key) pk = &chain[j - 1];
      if (pk && store_.wait_ready(*pk, kParentWait)) p = store_.publish(mine[i]);
    }
    if (!p) {
      abort_all(i);
      return Error(p.error().code(), "GPU publish of block " + to_hex(mine[i].key) + " (" + std::to_string(i) +
                                         " of " + std::to_string(mine.size()) + " published): " + p.error().message());
    }
    rep.written++;
  }
  return rep;
}

Result<void> KvGpu::fetch(std::span<const BlockKey> keys, const PagedLayout& layout,
                          std::span<const uint64_t> block_ids, void* stream) {
  CXLKV_TRY(layout.validate());
  if (keys.size() != block_ids.size())
    return Error(-EINVAL, "GPU fetch: " + std::to_string(keys.size()) + " keys but " +
                              std::to_string(block_ids.size()) + " GPU blocks");
  // All or nothing: every block is pinned before anything is copied.
  const size_t n = keys.size();
  std::vector<KvPin> pins(n);
  std::vector<int32_t> st(n);
  CXLKV_TRY(store_.pin_many(keys, pins, st));
  for (size_t i = 0; i < n; i++) {
    if (st[i] == 0 && pins[i].length == layout.block_bytes()) continue;
    std::vector<int32_t> ust(n);
    (void)store_.unpin_many(pins, ust);
    const int code = st[i] == kKvMiss ? -ENOENT : st[i] != 0 ? st[i] : -EINVAL;
    return Error(code, "GPU fetch of block " + to_hex(keys[i]) + ": " +
                           (st[i] == kKvMiss ? std::string("not cached")
                            : st[i] != 0     ? std::string(std::strerror(-st[i]))
                                             : "holds " + std::to_string(pins[i].length) +
                                                   " bytes, the layout's blocks are " +
                                                   std::to_string(layout.block_bytes())));
  }
  std::vector<int32_t> status(n);
  std::vector<uint64_t> ids(block_ids.begin(), block_ids.end());
  // The pins taken above are handed over to a layer load of one group.
  auto ll = launcher();
  if (!ll) {
    std::vector<int32_t> ust(n);
    (void)store_.unpin_many(pins, ust);
    return ll.error();
  }
  std::unique_ptr<LayerLoad> load(new LayerLoad(*this, ll.value()));
  load->layers_ = layout.num_layers;
  load->per_group_ = layout.num_layers;
  load->pins_ = std::move(pins);
  load->status_ = std::move(st);
  // Enqueue all layers as one group.
  std::vector<cxlkv_copy_desc> descs;
  std::vector<size_t> ssd;
  for (size_t i = 0; i < n; i++) {
    const KvPin& p = load->pins_[i];
    if (p.loc_tier == CXLKV_TIER_SSD) {
      ssd.push_back(i);
      continue;
    }
    auto res = mem_resolver(Loc{p.loc_tier, p.loc_dev, p.loc_off, p.length}, keys[i]);
    if (!res) {
      load->status_[i] = res.error().code();
      (void)load->finish(status);
      return res.error();
    }
    if (auto r = plan_block(layout, ids[i], 0, layout.num_layers, res.value(), Direction::scatter, descs); !r) {
      load->status_[i] = r.error().code();
      (void)load->finish(status);
      return Error(r.error().code(), "GPU fetch: " + r.error().message());
    }
  }
  Result<void> res;
  if (!descs.empty())
    if (auto c = ll.value()->copy(descs, stream); !c) res = Error(c.error().code(), "GPU fetch: " + c.error().message());
  if (res) staged_fetch(load->pins_, ssd, layout, ids, stream, load->status_);
  // The pins outlive the DMA reading the blocks, even after a failure.
  if (auto w = ll.value()->wait_enqueued(stream); !w && res) res = Error(w.error().code(), "GPU fetch: " + w.error().message());
  auto f = load->finish(status);
  if (!res) return res;
  if (!f) return f.error();
  for (size_t i = 0; i < n; i++)
    if (status[i] != 0)
      return Error(status[i] == kKvMiss ? -ENOENT : status[i],
                   "GPU fetch of block " + to_hex(keys[i]) + ": " +
                       (status[i] == kKvMiss ? std::string("not cached (SSD block failed its checks)")
                                             : std::string(std::strerror(-status[i]))));
  return {};
}

Result<size_t> KvGpu::put_chain(const BlockKey* parent, std::span<const BlockKey> keys, const PagedLayout& layout,
                                std::span<const uint64_t> block_ids, void* stream, std::span<int32_t> status) {
  // One save whose every layer is gathered in one launch.
  auto s = save_layers(parent, keys, layout, block_ids, status);
  if (!s) return s.error();
  LayerSave& sv = *s.value();
  if (sv.blocks_reserved()) {
    std::vector<cxlkv_copy_desc> descs;
    for (size_t k = 0; k < sv.members_.size(); k++) {
      if (sv.member_error_[k]) continue;
      const size_t i = sv.members_[k];
      if (auto p = plan_block(layout, block_ids[i], 0, layout.num_layers, sv.resolvers_[k], Direction::gather, descs); !p)
        sv.member_error_[k] = p.error().code();
    }
    if (auto c = sv.gp_->copy(descs, stream); !c) {
      for (auto& e : sv.member_error_)
        if (!e) e = c.error().code();
      log().warn("GPU put_chain: {}", c.error().message());
    }
    void* ev = nullptr;
    if (int rc = sv.gp_->library().ops().event_record(stream, &ev); rc < 0) {
      (void)sv.gp_->sync(stream);
      for (auto& e : sv.member_error_)
        if (!e) e = rc;
    } else {
      sv.events_.push_back(ev);
    }
    std::fill(sv.saved_.begin(), sv.saved_.end(), 1);
    sv.saved_count_ = sv.layers_;
  }
  return sv.finish(status);
}

Result<size_t> KvGpu::get_many(std::span<const BlockKey> keys, const PagedLayout& layout,
                               std::span<const uint64_t> block_ids, void* stream, std::span<int32_t> status) {
  CXLKV_TRY(layout.validate());
  auto l = load_layers(keys, layout, block_ids, stream, layout.num_layers, status);
  if (!l) return l.error();
  return l.value()->finish(status);
}

// ---- layer-wise load --------------------------------------------------------------

Result<std::unique_ptr<LayerLoad>> KvGpu::load_layers(std::span<const BlockKey> keys, const PagedLayout& layout,
                                                      std::span<const uint64_t> block_ids, void* stream,
                                                      uint32_t layers_per_group, std::span<int32_t> status) {
  CXLKV_TRY(layout.validate());
  const size_t n = keys.size();
  if (block_ids.size() != n || status.size() < n)
    return Error(-EINVAL, "GPU layer load: " + std::to_string(n) + " keys, " + std::to_string(block_ids.size()) +
                              " GPU blocks, " + std::to_string(status.size()) + " status entries");
  if (layers_per_group == 0) return Error(-EINVAL, "GPU layer load: layers_per_group is 0");
  for (size_t i = 0; i < n; i++)
    if (block_ids[i] >= layout.num_blocks)
      return Error(-EINVAL, "GPU layer load: block id " + std::to_string(block_ids[i]) + " is out of range (layout has " +
                                std::to_string(layout.num_blocks) + " blocks)");
  auto lg = launcher();
  if (!lg) return lg.error();
  GpuPool* gp = lg.value();
  const uint32_t L = layout.num_layers;
  const uint32_t per = std::min(layers_per_group, L);

  std::unique_ptr<LayerLoad> load(new LayerLoad(*this, gp));
  load->layers_ = L;
  load->per_group_ = per;
  load->pins_.resize(n);
  load->status_.assign(n, 0);
  CXLKV_TRY(store_.pin_many(keys, load->pins_, load->status_));

  struct Member {
    size_t at;
    PoolResolver pool;
  };
  std::vector<Member> mem;
  std::vector<size_t> ssd;
  for (size_t i = 0; i < n; i++) {
    const KvPin& p = load->pins_[i];
    if (!p.pinned()) continue;
    if (p.length != layout.block_bytes()) {
      load->status_[i] = -EINVAL;
      log().warn("GPU layer load: block {} holds {} bytes, the layout's blocks are {}", to_hex(keys[i]), p.length,
                 layout.block_bytes());
      continue;
    }
    if (p.loc_tier == CXLKV_TIER_SSD) {
      ssd.push_back(i);
      continue;
    }
    auto r = mem_resolver(Loc{p.loc_tier, p.loc_dev, p.loc_off, p.length}, keys[i]);
    if (!r) {
      load->status_[i] = r.error().code();
      log().warn("GPU layer load: {}", r.error().message());
      continue;
    }
    mem.push_back({i, std::move(r.value())});
  }
  // SSD blocks first, every layer, through the staging ring: they are in
  // place before the first group's event.
  staged_fetch(load->pins_, ssd, layout, block_ids, stream, load->status_);

  const cxlkv_cuda_ops& o = gp->library().ops();
  for (uint32_t lo = 0; lo < L; lo += per) {
    const uint32_t hi = std::min(L, lo + per);
    std::vector<cxlkv_copy_desc> descs;
    for (const Member& m : mem) {
      if (load->status_[m.at] != 0) continue;
      if (auto r = plan_block(layout, block_ids[m.at], lo, hi, m.pool, Direction::scatter, descs); !r) {
        load->status_[m.at] = r.error().code();
        log().warn("GPU layer load: block {}: {}", to_hex(keys[m.at]), r.error().message());
      }
    }
    if (!descs.empty())
      if (auto c = gp->copy(descs, stream); !c) {
        for (const Member& m : mem)
          if (load->status_[m.at] == 0) load->status_[m.at] = c.error().code();
        log().warn("GPU layer load: layers [{}, {}): {}", lo, hi, c.error().message());
      }
    void* ev = nullptr;
    if (int rc = o.event_record(stream, &ev); rc < 0) {
      // Without events nobody could wait per layer: finish what is enqueued and refuse.
      Error e = gp->library().error(rc, "GPU layer load: event after layers [" + std::to_string(lo) + ", " +
                                            std::to_string(hi) + ")");
      std::vector<int32_t> st(n);
      (void)load->finish(st);
      return e;
    }
    load->events_.push_back(ev);
  }
  for (size_t i = 0; i < n; i++)
    if (load->status_[i] == 0) load->loading_++;
  for (size_t i = 0; i < n; i++) status[i] = load->status_[i];
  return load;
}

void* LayerLoad::event(uint32_t layer) const {
  if (finished_ || layer >= layers_) return nullptr;
  return events_[layer / per_group_];
}

Result<void> LayerLoad::wait_layer(uint32_t layer) {
  void* e = event(layer);
  if (!e) return Error(-EINVAL, "GPU layer load: layer " + std::to_string(layer) + " is not part of this load (" +
                                    std::to_string(layers_) + " layers" + (finished_ ? ", finished" : "") + ")");
  if (int rc = gp_->library().ops().event_sync(e); rc < 0)
    return gp_->library().error(rc, "GPU layer load: layer " + std::to_string(layer));
  return {};
}

Result<void> LayerLoad::stream_wait_layer(uint32_t layer, void* stream) {
  void* e = event(layer);
  if (!e) return Error(-EINVAL, "GPU layer load: layer " + std::to_string(layer) + " is not part of this load (" +
                                    std::to_string(layers_) + " layers" + (finished_ ? ", finished" : "") + ")");
  if (int rc = gp_->library().ops().stream_wait_event(stream, e); rc < 0)
    return gp_->library().error(rc, "GPU layer load: stream wait for layer " + std::to_string(layer));
  return {};
}

Result<bool> LayerLoad::layer_ready(uint32_t layer) {
  void* e = event(layer);
  if (!e) return Error(-EINVAL, "GPU layer load: layer " + std::to_string(layer) + " is not part of this load");
  int rc = gp_->library().ops().event_query(e);
  if (rc == -EAGAIN) return false;
  if (rc < 0) return gp_->library().error(rc, "GPU layer load: layer " + std::to_string(layer));
  return true;
}

Result<size_t> LayerLoad::finish(std::span<int32_t> status) {
  if (finished_) return Error(-EINVAL, "GPU layer load: finished already");
  finished_ = true;
  const cxlkv_cuda_ops& o = gp_->library().ops();
  const size_t n = pins_.size();
  // Every group's copies complete before any pin is dropped.
  int failed = 0;
  for (void* e : events_) {
    if (int rc = o.event_sync(e); rc < 0 && !failed) failed = rc;
    (void)o.event_destroy(e);
  }
  events_.clear();
  if (failed) {
    log().warn("GPU layer load: {}", o.last_error());
    for (auto& s : status_)
      if (s == 0) s = failed;
  }
  std::vector<int32_t> ust(n);
  auto u = kg_.store_.unpin_many(pins_, ust);
  size_t ok = 0;
  for (size_t i = 0; i < n; i++) {
    if (status_[i] == 0 && pins_[i].pinned() && u && ust[i] != 0) status_[i] = ust[i];
    if (status_[i] == 0) ok++;
    if (i < status.size()) status[i] = status_[i];
  }
  if (!u) return u.error();
  return ok;
}

LayerLoad::~LayerLoad() {
  if (!finished_) (void)finish({});
}

// ---- layer-wise save --------------------------------------------------------------

Result<std::unique_ptr<LayerSave>> KvGpu::save_layers(const BlockKey* parent, std::span<const BlockKey> keys,
                                                      const PagedLayout& layout, std::span<const uint64_t> block_ids,
                                                      std::span<int32_t> status) {
  CXLKV_TRY(layout.validate());
  const size_t n = keys.size();
  if (block_ids.size() != n || status.size() < n)
    return Error(-EINVAL, "GPU layer save: " + std::to_string(n) + " keys, " + std::to_string(block_ids.size()) +
                              " GPU blocks, " + std::to_string(status.size()) + " status entries");
  for (size_t i = 0; i < n; i++)
    if (block_ids[i] >= layout.num_blocks)
      return Error(-EINVAL, "GPU layer save: block id " + std::to_string(block_ids[i]) + " is out of range (layout has " +
                                std::to_string(layout.num_blocks) + " blocks)");
  auto lg = launcher();
  if (!lg) return lg.error();
  std::unique_ptr<LayerSave> s(new LayerSave(*this, lg.value()));
  s->layout_ = layout;
  s->layers_ = layout.num_layers;
  s->saved_.assign(layout.num_layers, 0);
  if (parent) s->has_parent_ = true, s->parent_ = *parent;
  s->keys_.assign(keys.begin(), keys.end());
  s->ids_.assign(block_ids.begin(), block_ids.end());
  s->rs_.resize(n);
  s->status_.assign(n, 0);
  CXLKV_TRY(store_.reserve_chain(parent, keys, layout.block_bytes(), s->rs_, s->status_));
  for (size_t i = 0; i < n; i++) {
    const KvReservation& r = s->rs_[i];
    if (!r.reserved()) continue;
    s->members_.push_back(i);
    int32_t err = 0;
    PoolResolver res;
    if (r.length != layout.block_bytes()) {
      err = -EINVAL;
    } else if (auto m = mem_resolver(Loc{r.loc_tier, r.loc_dev, r.loc_off, r.length}, keys[i]); !m) {
      err = m.error().code();
      log().warn("GPU layer save: {}", m.error().message());
    } else {
      res = std::move(m.value());
    }
    s->resolvers_.push_back(std::move(res));
    s->member_error_.push_back(err);
  }
  for (size_t i = 0; i < n; i++) status[i] = s->status_[i];
  return s;
}

Result<void> LayerSave::save_layer(uint32_t layer, void* stream) {
  if (done_) return Error(-EINVAL, "GPU layer save: finished already");
  if (layer >= layers_)
    return Error(-EINVAL, "GPU layer save: layer " + std::to_string(layer) + " of a " + std::to_string(layers_) +
                              "-layer layout");
  if (saved_[layer]) return Error(-EALREADY, "GPU layer save: layer " + std::to_string(layer) + " saved already");
  std::vector<cxlkv_copy_desc> descs;
  for (size_t k = 0; k < members_.size(); k++) {
    if (member_error_[k]) continue;
    if (auto p = plan_block(layout_, ids_[members_[k]], layer, layer + 1, resolvers_[k], Direction::gather, descs); !p) {
      member_error_[k] = p.error().code();
      log().warn("GPU layer save: block {}: {}", to_hex(keys_[members_[k]]), p.error().message());
    }
  }
  if (!descs.empty())
    if (auto c = gp_->copy(descs, stream); !c) {
      for (auto& e : member_error_)
        if (!e) e = c.error().code();
      return Error(c.error().code(), "GPU layer save: layer " + std::to_string(layer) + ": " + c.error().message());
    }
  // The event tells finish() when this layer's DMA -- on whichever stream
  // the engine used -- has completed (rule 5).
  void* ev = nullptr;
  if (int rc = gp_->library().ops().event_record(stream, &ev); rc < 0) {
    (void)gp_->sync(stream);
    for (auto& e : member_error_)
      if (!e) e = rc;
    return gp_->library().error(rc, "GPU layer save: event after layer " + std::to_string(layer));
  }
  events_.push_back(ev);
  saved_[layer] = 1;
  saved_count_++;
  return {};
}

Result<void> LayerSave::wait_all() {
  const cxlkv_cuda_ops& o = gp_->library().ops();
  int failed = 0;
  for (void* e : events_) {
    if (int rc = o.event_sync(e); rc < 0 && !failed) failed = rc;
    (void)o.event_destroy(e);
  }
  events_.clear();
  if (failed) return gp_->library().error(failed, "GPU layer save: a layer's copy failed");
  return {};
}

Result<size_t> LayerSave::finish(std::span<int32_t> status) {
  if (done_) return Error(-EINVAL, "GPU layer save: finished already");
  done_ = true;
  // rule 5: every layer's DMA has completed before any index entry is written.
  auto w = wait_all();
  const size_t n = keys_.size();
  std::vector<int32_t> written(n, kKvReserved);
  const bool all_layers = saved_count_ == layers_;
  for (size_t k = 0; k < members_.size(); k++) {
    int32_t e = member_error_[k];
    if (!e && !w) e = w.error().code();
    if (!e && !all_layers) e = -ENODATA;
    written[members_[k]] = e;
  }
  if (!all_layers && !members_.empty())
    log().warn("GPU layer save: {} of {} layers saved: the {} reserved block(s) are aborted", saved_count_, layers_,
               members_.size());
  auto r = kg_.store_.settle_chain(has_parent_ ? &parent_ : nullptr, keys_, rs_, written, status_);
  for (size_t i = 0; i < n && i < status.size(); i++) status[i] = status_[i];
  return r;
}

void LayerSave::abort() {
  if (done_) return;
  done_ = true;
  (void)wait_all();  // the enqueued DMA completes before the space can be reused
  std::vector<KvReservation> undo;
  for (size_t i : members_) undo.push_back(rs_[i]);
  std::vector<int32_t> ust(undo.size());
  (void)kg_.store_.abort_many(undo, ust);  // in reverse: children before their parents
}

LayerSave::~LayerSave() { abort(); }

}  // namespace cxlkv::gpu
