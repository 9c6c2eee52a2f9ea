// SPDX-License-Identifier: MIT
#include "coherence/noncoherent_sim.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace cxlkv {

namespace {
constexpr uintptr_t kLine = 64;

std::string hex(uintptr_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%jx", static_cast<uintmax_t>(v));
  return b;
}
}  // namespace

class NonCoherentSim::Node final : public MemoryDomain {
 public:
  Node(NonCoherentSim& sim, uint32_t id)
      : sim_(sim), id_(id), rng_(sim.opts_.seed + id), coin_(0.0, 1.0) {}

  DomainMode mode() const override { return DomainMode::flush; }
  // A 64-byte aligned store_nt is one buffered piece, landing whole.
  bool publish_line_whole() const override { return true; }
  std::string describe() const override {
    return "noncoherent-sim(node " + std::to_string(id_) + " of " +
           std::to_string(sim_.nodes_.size()) + ", evict_probability " +
           std::to_string(sim_.opts_.evict_probability) +
           (sim_.opts_.buffer_until_fence ? ", buffer_until_fence" : "") +
           (sim_.opts_.prefetch_probability > 0
                ? ", prefetch_probability " + std::to_string(sim_.opts_.prefetch_probability)
                : "") +
           ")";
  }

  void load(void* dst, const void* src, size_t n) override {
    std::lock_guard g(sim_.mu_);
    check(src, n, "load");
    c_.loads++;
    for_each_piece(src, n, [&](uintptr_t line, size_t off, size_t len, size_t done) {
      drain_line(line);  // our own buffered writes to this line land first
      auto it = cache_.find(line);
      if (it != cache_.end()) {
        c_.cached_loads++;
        if (!it->second.dirty &&
            std::memcmp(it->second.bytes.data() + off, mem(line) + off, len) != 0)
          c_.stale_loads++;
      } else {
        it = fill(line);
      }
      std::memcpy(static_cast<char*>(dst) + done, it->second.bytes.data() + off, len);
      background();
    });
  }

  void store(void* dst, const void* src, size_t n) override {
    std::lock_guard g(sim_.mu_);
    check(dst, n, "store");
    c_.stores++;
    for_each_piece(dst, n, [&](uintptr_t line, size_t off, size_t len, size_t done) {
      drain_line(line);
      auto it = cache_.find(line);
      if (it == cache_.end()) it = fill(line);  // write-allocate: the whole line
      std::memcpy(it->second.bytes.data() + off, static_cast<const char*>(src) + done, len);
      it->second.dirty = true;
      background();
    });
  }

  void store_nt(void* dst, const void* src, size_t n) override {
    std::lock_guard g(sim_.mu_);
    check(dst, n, "store_nt");
    c_.nt_stores++;
    for_each_piece(dst, n, [&](uintptr_t line, size_t off, size_t len, size_t done) {
      drain_line(line);
      drop_line(line, /*buffered=*/false);  // the NT store evicts our copy (written back if dirty)
      write_memory(line, off, static_cast<const char*>(src) + done, len);
      background();
    });
  }

  void flush(const void* p, size_t n) override { writeback_drop(p, n, "flush"); }
  void flush_bulk(const void* p, size_t n) override { writeback_drop(p, n, "flush_bulk"); }
  void invalidate(const void* p, size_t n) override { writeback_drop(p, n, "invalidate"); }

  void fence() override {
    std::lock_guard g(sim_.mu_);
    c_.fences++;
    drain_all();  // without buffer_until_fence nothing is pending: accesses are sequential
  }

  void copy_to_pool(void* dst, const void* src, size_t n) override { store_nt(dst, src, n); }
  void copy_from_pool(void* dst, const void* src, size_t n) override {
    invalidate(src, n);  // rule 6
    fence();             // rule 4
    load(dst, src, n);
  }

  void publish_line(void* dst64, const void* src64) override {
    if (reinterpret_cast<uintptr_t>(dst64) % kLine != 0)
      throw std::invalid_argument("NonCoherentSim node " + std::to_string(id_) +
                                  ": publish_line to unaligned address " +
                                  hex(reinterpret_cast<uintptr_t>(dst64)));
    store_nt(dst64, src64, kLine);
  }

  // ---- used by NonCoherentSim (mutex held) ----------------------------------
  void writeback_all_locked() {
    drain_all();
    for (auto& [line, l] : cache_)
      if (l.dirty) writeback_now(line, l.bytes.data());
    cache_.clear();
    keys_.clear();
  }
  void drop_all_locked() {
    for (auto& [line, l] : cache_)
      if (l.dirty) c_.dropped++;
    c_.dropped += pending_.size();
    pending_.clear();
    cache_.clear();
    keys_.clear();
  }
  SimCounters counters_locked() const { return c_; }

 private:
  struct Line {
    std::array<char, kLine> bytes;
    bool dirty = false;
    size_t key_index = 0;  // position in keys_ (for O(1) random eviction)
  };
  using Cache = std::unordered_map<uintptr_t, Line>;
  // A write on its way to memory (buffer_until_fence): bytes [off, off+len) of a line.
  struct Pending {
    uintptr_t line;
    size_t off, len;
    std::array<char, kLine> bytes;
  };

  char* mem(uintptr_t line) { return reinterpret_cast<char*>(line); }
  bool buffering() const { return sim_.opts_.buffer_until_fence; }

  void check(const void* p, size_t n, const char* op) const {
    if (n == 0) return;
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uintptr_t lo = reinterpret_cast<uintptr_t>(sim_.mem_);
    if (a < lo || a - lo > sim_.bytes_ || n > sim_.bytes_ - (a - lo))
      throw std::out_of_range("NonCoherentSim node " + std::to_string(id_) + ": " + op + " of " +
                              std::to_string(n) + " bytes at " + hex(a) +
                              " is outside the simulated pool [" + hex(lo) + ", " +
                              hex(lo + sim_.bytes_) + ")");
  }

  // Calls f(line, offset in line, length, bytes done before) for each line piece.
  template <class F>
  void for_each_piece(const void* p, size_t n, F&& f) {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    size_t done = 0;
    while (done < n) {
      const uintptr_t line = a & ~(kLine - 1);
      const size_t off = a - line;
      const size_t len = std::min<size_t>(kLine - off, n - done);
      f(line, off, len, done);
      a += len;
      done += len;
    }
  }

  Cache::iterator fill(uintptr_t line) {
    auto [it, inserted] = cache_.try_emplace(line);
    std::memcpy(it->second.bytes.data(), mem(line), kLine);
    it->second.dirty = false;
    it->second.key_index = keys_.size();
    keys_.push_back(line);
    return it;
  }

  // Bytes on their way to memory: straight there, or into the buffer.
  void write_memory(uintptr_t line, size_t off, const char* src, size_t len) {
    if (!buffering()) {
      std::memcpy(mem(line) + off, src, len);
      return;
    }
    Pending p{line, off, len, {}};
    std::memcpy(p.bytes.data() + off, src, len);
    pending_.push_back(p);
  }

  void writeback_now(uintptr_t line, const char* bytes) {
    std::memcpy(mem(line), bytes, kLine);  // whole line, as hardware does
    c_.writebacks++;
  }

  void erase(Cache::iterator it) {
    const size_t i = it->second.key_index;
    const uintptr_t last = keys_.back();
    keys_[i] = last;
    cache_[last].key_index = i;
    keys_.pop_back();
    cache_.erase(it);
  }

  // Drop our copy of a line, writing it back whole if dirty.  `buffered`:
  // the write-back is a flush instruction's, which waits for a fence under
  // buffer_until_fence; evictions write back at once.
  void drop_line(uintptr_t line, bool buffered) {
    auto it = cache_.find(line);
    if (it == cache_.end()) return;
    if (it->second.dirty) {
      if (buffered && buffering()) {
        write_memory(line, 0, it->second.bytes.data(), kLine);
        c_.writebacks++;
      } else {
        writeback_now(line, it->second.bytes.data());
      }
    }
    erase(it);
  }

  // Apply this node's buffered writes to one line, in program order.
  void drain_line(uintptr_t line) {
    if (pending_.empty()) return;
    size_t keep = 0;
    for (size_t i = 0; i < pending_.size(); i++) {
      Pending& p = pending_[i];
      if (p.line == line)
        std::memcpy(mem(line) + p.off, p.bytes.data() + p.off, p.len);
      else
        pending_[keep++] = p;
    }
    pending_.resize(keep);
  }

  void drain_all() {
    for (Pending& p : pending_) std::memcpy(mem(p.line) + p.off, p.bytes.data() + p.off, p.len);
    pending_.clear();
  }

  void maybe_evict() {
    const double p = sim_.opts_.evict_probability;
    if (p <= 0.0) return;
    if (!keys_.empty() && coin_(rng_) < p) {
      const uintptr_t line =
          keys_[std::uniform_int_distribution<size_t>(0, keys_.size() - 1)(rng_)];
      c_.evictions++;
      drop_line(line, /*buffered=*/false);
    }
    // A random buffered line reaches memory early, ahead of older ones.
    if (!pending_.empty() && coin_(rng_) < p) {
      c_.early_drains++;
      drain_line(pending_[std::uniform_int_distribution<size_t>(0, pending_.size() - 1)(rng_)].line);
    }
  }

  // A prefetcher pulls a random pool line into our cache (clean, current
  // memory contents), where it may go stale.
  void maybe_prefetch() {
    const double p = sim_.opts_.prefetch_probability;
    if (p <= 0.0 || coin_(rng_) >= p) return;
    const size_t lines = sim_.bytes_ / kLine;
    const uintptr_t line = reinterpret_cast<uintptr_t>(sim_.mem_) +
                           kLine * std::uniform_int_distribution<size_t>(0, lines - 1)(rng_);
    if (cache_.count(line) != 0) return;
    drain_line(line);  // our own buffered writes to it land first
    fill(line);
    c_.prefetches++;
  }

  // Background activity after each line access: evictions, early drains, prefetches.
  void background() {
    maybe_evict();
    maybe_prefetch();
  }

  void writeback_drop(const void* p, size_t n, const char* op) {
    std::lock_guard g(sim_.mu_);
    check(p, n, op);
    for_each_piece(p, n, [&](uintptr_t line, size_t, size_t, size_t) {
      drain_line(line);
      drop_line(line, /*buffered=*/true);
    });
  }

  NonCoherentSim& sim_;
  uint32_t id_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> coin_;
  Cache cache_;
  std::vector<uintptr_t> keys_;
  std::vector<Pending> pending_;
  SimCounters c_;
};

NonCoherentSim::NonCoherentSim(void* memory, size_t bytes, NonCoherentSimOptions opts)
    : mem_(static_cast<char*>(memory)), bytes_(bytes), opts_(opts) {
  if (memory == nullptr || reinterpret_cast<uintptr_t>(memory) % kLine != 0 || bytes % kLine != 0)
    throw std::invalid_argument("NonCoherentSim: pool memory must be non-null, 64-byte aligned "
                                "and a multiple of 64 bytes (got " +
                                hex(reinterpret_cast<uintptr_t>(memory)) + ", " +
                                std::to_string(bytes) + " bytes)");
  if (opts.nodes == 0) throw std::invalid_argument("NonCoherentSim: nodes must be at least 1");
  if (!(opts.evict_probability >= 0.0 && opts.evict_probability <= 1.0))
    throw std::invalid_argument("NonCoherentSim: evict_probability must be in [0, 1]");
  if (!(opts.prefetch_probability >= 0.0 && opts.prefetch_probability <= 1.0))
    throw std::invalid_argument("NonCoherentSim: prefetch_probability must be in [0, 1]");
  for (uint32_t i = 0; i < opts.nodes; i++) nodes_.push_back(std::make_unique<Node>(*this, i));
}

NonCoherentSim::~NonCoherentSim() = default;

MemoryDomain& NonCoherentSim::node(uint32_t i) {
  if (i >= nodes_.size())
    throw std::out_of_range("NonCoherentSim: node " + std::to_string(i) + " of " +
                            std::to_string(nodes_.size()));
  return *nodes_[i];
}

void NonCoherentSim::writeback_all(uint32_t i) {
  auto& n = static_cast<Node&>(node(i));
  std::lock_guard g(mu_);
  n.writeback_all_locked();
}

void NonCoherentSim::drop_all(uint32_t i) {
  auto& n = static_cast<Node&>(node(i));
  std::lock_guard g(mu_);
  n.drop_all_locked();
}

SimCounters NonCoherentSim::counters(uint32_t i) const {
  if (i >= nodes_.size())
    throw std::out_of_range("NonCoherentSim: node " + std::to_string(i) + " of " +
                            std::to_string(nodes_.size()));
  std::lock_guard g(mu_);
  return nodes_[i]->counters_locked();
}

SimCounters NonCoherentSim::total() const {
  std::lock_guard g(mu_);
  SimCounters t;
  for (auto& n : nodes_) {
    SimCounters c = n->counters_locked();
    t.loads += c.loads;
    t.cached_loads += c.cached_loads;
    t.stale_loads += c.stale_loads;
    t.stores += c.stores;
    t.nt_stores += c.nt_stores;
    t.writebacks += c.writebacks;
    t.evictions += c.evictions;
    t.dropped += c.dropped;
    t.fences += c.fences;
    t.early_drains += c.early_drains;
    t.prefetches += c.prefetches;
  }
  return t;
}

}  // namespace cxlkv
