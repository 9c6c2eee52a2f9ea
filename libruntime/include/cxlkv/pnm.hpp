// SPDX-License-Identifier: MIT
// Near-memory KV management for long contexts (docs/near-memory.md; the PNM design of
// DESIGN.md on a CPU engine beside the pool).
//
//   ContextStore   the "pnm" carve: per request a page table over pool pages
//                  and per (layer, KV head, page) min/max key digests,
//                  appended incrementally under the coherence contract
//   select_pages   score every page by the upper bound of q.k over it and
//                  keep the top pages of a token budget (+ sink and local)
//   attend         exact softmax attention over the selected (or all) pages,
//                  returning output and log-sum-exp; merge() joins partials
//   SteadySet      the hybrid mode's GPU-resident pages (Algorithm 1 masks)
//   EngineGroup    several near-memory engines (thread pools, one per NUMA
//                  node / pool device), requests spread data-parallel
//
// Shapes: queries are float [layers][q_heads][head_dim]; q_heads is a
// multiple of kv_heads and query head j reads KV head j / (q_heads/kv_heads)
// (grouped-query attention).  K and V handed to append() are
// [layers][kv_heads][ntokens][head_dim] in the context's element type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cxlkv/result.hpp"

struct cxlkv_pnm_slot;
struct cxlkv_pnm_ctx;
struct cxlkv_pnm_header;
struct cxlkv_pnm_part_stats;

namespace cxlkv {
class Region;
}
namespace cxlkv::gpu {
class CudaLibrary;
class GpuPool;
}

namespace cxlkv::pnm {

enum class Dtype : uint32_t { f32 = 0, bf16 = 1, f16 = 2 };  // = enum cxlkv_pnm_dtype
const char* to_string(Dtype d);
size_t dtype_size(Dtype d);

// How a context stores its page digests (docs/near-memory.md#digest-kinds;
// = enum cxlkv_pnm_digest_kind).  minmax: min and max in the KV element
// type (2 x head_dim elements a page); q8: int8 min and max with one scale
// per row, rounded outward so the score stays an upper bound (8 + 2 x
// head_dim bytes a page).
enum class DigestKind : uint32_t { minmax = 0, q8 = 1 };
const char* to_string(DigestKind k);

struct Geometry {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  Dtype dtype = Dtype::bf16;
  uint32_t page_tokens = 16;
  uint64_t max_tokens = 0;  // capacity: page table and digests are sized for it
  DigestKind digest = DigestKind::minmax;
  // Two-level digests: pages per group digest (a power of two, 2..1024),
  // scored first so that only the best groups' page digests are read; 1:
  // one level; 0: chosen when the context is made, kAutoGroupPages for a
  // capacity of at least kAutoGroupMinPages pages, else one level
  // (docs/near-memory.md#digest-kinds).  A made context's geometry() holds
  // the choice, 0 for one level.
  uint32_t group_pages = 0;
};

// The automatic choice of Geometry::group_pages: two levels pay (fewer
// digest bytes a step) once a context has many more pages than a step
// refines (SelectOptions::refine_pages, 512 at the default budget).
inline constexpr uint32_t kAutoGroupPages = 16;
inline constexpr uint64_t kAutoGroupMinPages = 4096;
// The group size a context of geometry g is made with (0: one level).
uint32_t effective_group_pages(const Geometry& g);
// Bytes of the digest rows (page rows, then group rows) a context of
// geometry g takes in its store's carve.
uint64_t digest_area_bytes(const Geometry& g);

struct StoreOptions {
  // Carve made on first use (later opens read the geometry from its header).
  uint64_t carve_bytes = 64ull << 20;
  uint32_t partitions = 4;
  uint32_t slots_per_partition = 64;
  // The partition this process writes (creates contexts in).  A partition
  // has one writer process at a time: open() takes an flock on a node-local
  // file, and a second writer of the same partition gets -EBUSY.
  uint32_t partition = 0;
  bool writer = true;  // false: read-only (a near-memory engine)
};

class ContextStore;
struct StepResult;

// One long context (a request).  A writer handle appends; any handle reads.
class Context {
 public:
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  uint64_t request_id() const { return request_id_; }
  ContextStore& store() const { return *store_; }
  const Geometry& geometry() const { return geo_; }
  uint32_t generation() const { return generation_; }
  bool writable() const { return writable_; }
  Region& region() const { return *region_; }
  uint64_t page_bytes() const;
  uint32_t pages_for(uint64_t ntokens) const {
    return static_cast<uint32_t>((ntokens + geo_.page_tokens - 1) / geo_.page_tokens);
  }
  // Group digests over the first ntokens tokens (0 for a one-level context).
  uint32_t groups_for(uint64_t ntokens) const {
    return geo_.group_pages ? (pages_for(ntokens) + geo_.group_pages - 1) / geo_.group_pages : 0;
  }
  // Bytes of one digest row (a page's or a group's) of one (layer, head).
  uint64_t digest_row_bytes() const { return row_bytes_; }

  // ---- writer -------------------------------------------------------------
  // Append ntokens tokens; k and v are [layers][kv_heads][ntokens][head_dim].
  // Pages come from the partition's heap; digests are computed on the CPU.
  // The tokens are published (visible to readers) when this returns.
  Result<void> append(const void* k, const void* v, uint32_t ntokens);
  // Append whole pages that already are in the pool (written by a GPU, or
  // another copy path) with their digests computed elsewhere (the GPU digest
  // kernel): page_offsets[i] is the pool offset of a page laid out as
  // cxlkv/format/pnm_format.h says, 64-aligned, past the superblock in pool space
  // that no carve holds (or in this partition's heap); digests are [layers][kv_heads][npages][2][head_dim].
  // ntokens: tokens in these pages (the last may be partial).  Only at a page
  // boundary (published tokens a multiple of page_tokens).
  Result<void> append_pages(std::span<const uint64_t> page_offsets, const void* digests,
                            uint64_t ntokens);
  // Append ntokens tokens whose K and V are in GPU memory (device pointers,
  // [layers][kv_heads][ntokens][head_dim]): the pages are copied GPU -> pool
  // with one batch (gpu.copy), the digests computed on the GPU by the pnm
  // digest kernel (gpu_digests); published once both completed (rule 5).
  // Only at a page boundary, like append_pages.
  Result<void> append_gpu(gpu::GpuPool& gpu, uint64_t k_dev, uint64_t v_dev, uint32_t ntokens,
                          void* stream = nullptr);
  // Tokens this handle has published (writer) or last read (reader).
  uint64_t tokens() const { return tokens_; }

  // ---- reader (rule 4: every read invalidates first) -----------------------
  // Fresh count of published tokens; -ESTALE when the context was destroyed
  // (or its slot reused) since this handle was made.
  Result<uint64_t> refresh();
  // Is the context still the one this handle names?  One fresh read.
  bool still_valid() const;
  // Digests of pages [page0, page0+npages) of (layer, head) into dst
  // (npages rows of digest_row_bytes(): [2][head_dim] elements of the dtype
  // for minmax, struct cxlkv_pnm_q8_row + int8 [2][head_dim] for q8).
  Result<void> read_digests(uint32_t layer, uint32_t head, uint32_t page0, uint32_t npages,
                            void* dst) const;
  // The same for group digests [group0, group0+ngroups) (two-level contexts).
  Result<void> read_group_digests(uint32_t layer, uint32_t head, uint32_t group0, uint32_t ngroups,
                                  void* dst) const;
  // Rows read for a step over ntokens tokens, before they are scored: a q8
  // row whose scale is not a finite positive number is damage, one that
  // covers fewer tokens than the count needs is stale; both -EBADMSG naming
  // the context, layer, head and page (or group).  Nothing to check for
  // minmax rows.
  Result<void> check_digest_rows(const void* rows, uint32_t first, uint32_t n, bool groups, uint32_t layer,
                                 uint32_t head, uint64_t ntokens) const;
  Result<void> read_page_table(uint32_t page0, uint32_t npages, uint64_t* dst) const;
  // The digests of (layer, head) in this process's mapping, to be read in
  // place, when the pool's domain is coherent (nothing to invalidate, rule 4
  // holds trivially); nullptr otherwise (read_digests stages them).
  const void* digests_in_place(uint32_t layer, uint32_t head) const;
  const void* group_digests_in_place(uint32_t layer, uint32_t head) const;
  // The K (kv=0) or V (kv=1) rows of (layer, head) of the page at page_off
  // in this process's mapping, to be read in place, when the pool's domain
  // is coherent (as digests_in_place); nullptr otherwise or out of range.
  const void* rows_in_place(uint64_t page_off, uint32_t layer, uint32_t kv, uint32_t head) const;
  // ntok rows (tokens 0..ntok-1 of the page) of K (kv=0) or V (kv=1).
  Result<void> read_rows(uint64_t page_off, uint32_t layer, uint32_t kv, uint32_t head,
                         uint32_t ntok, void* dst) const;

 private:
  friend class ContextStore;
  Context() = default;
  Result<void> publish(uint64_t new_tokens);
  Result<void> write_page_entry(uint32_t page, uint64_t off);
  // d: the page's min/max row in the KV element type, covering `tokens`
  // tokens; stored in the context's digest kind, and its group widened.
  // new_page: the first write of this page (a new group when it is the
  // group's first page).
  Result<void> write_digest(uint32_t layer, uint32_t head, uint32_t page, const void* d, uint32_t tokens,
                            bool new_page);
  void set_digest_layout(const cxlkv_pnm_ctx& c);
  Result<void> store_row(uint64_t off, const void* minmax, uint32_t tokens);
  Result<void> append_pages_impl(std::span<const uint64_t> page_offsets, const void* digests, uint64_t ntokens);
  // Why pool offset `off` cannot be a page of this context ("" when it can;
  // cxlkv/format/pnm_format.h).  `carves`: the pool's carve table, read on first need.
  std::string bad_page(uint64_t off, std::vector<std::pair<uint64_t, uint64_t>>& carves, bool& have_carves) const;

  ContextStore* store_ = nullptr;
  Region* region_ = nullptr;
  uint64_t slot_off_ = 0;  // pool offset of the slot
  uint32_t partition_ = 0;  // the partition holding the slot (and the heap of its tables and pages)
  uint64_t request_id_ = 0;
  uint32_t generation_ = 0;
  Geometry geo_{};
  uint32_t max_pages_ = 0;
  uint64_t page_table_off_ = 0, digest_off_ = 0;
  uint64_t row_bytes_ = 0, group_off_ = 0;  // digest row size; pool offset of the group rows
  uint32_t max_groups_ = 0;
  bool writable_ = false;
  uint64_t tokens_ = 0;
  std::vector<unsigned char> last_digest_;  // writer: digests of the last page, [l][h][2][d]
  uint64_t last_page_off_ = 0;              // writer: pool offset of the last page
  std::vector<unsigned char> last_group_;   // writer: min/max of the last group, [l][h][2][d]
};

class ContextStore {
 public:
  ~ContextStore();
  ContextStore(const ContextStore&) = delete;
  ContextStore& operator=(const ContextStore&) = delete;

  // Opens (making on first use) the "pnm" carve of `region`, which must
  // outlive the store.
  static Result<std::unique_ptr<ContextStore>> open(Region& region, const StoreOptions& opts = {});

  // A new context in this writer's partition.  -EEXIST: the request already
  // has one here; -ENOSPC: no free slot or heap space; -EINVAL: bad geometry.
  Result<std::unique_ptr<Context>> create(uint64_t request_id, const Geometry& g);
  // A read handle on the live context of request_id, in any partition (-ENOENT).
  Result<std::unique_ptr<Context>> find(uint64_t request_id);
  // Free a context of this writer's partition; read handles see -ESTALE.
  Result<void> destroy(uint64_t request_id);

  Region& region() const { return *region_; }
  uint32_t partitions() const { return nparts_; }
  uint32_t partition() const { return opts_.partition; }
  uint32_t slots_per_partition() const { return slots_; }
  // Heap bytes left in this writer's partition.
  uint64_t heap_free() const;
  // A writer's node-local lock file (flock'ed while the store is open,
  // removed when it closes); "" for a read-only store.
  const std::string& writer_lock_path() const { return lock_path_; }

  // ---- statistics (the pnm metrics family, cxlkv/metrics.hpp) --------------
  // What this process did through this store: digest builds of its
  // contexts, steps of the engines over contexts it opened.  A writer store
  // keeps them in its partition's stats lines (cxlkv/format/pnm_format.h; totals,
  // continued from the stored values at open) and stores them there after
  // every record; a read-only store keeps them in this process only.
  void record_digest_build(uint64_t tokens, uint64_t digest_bytes, bool gpu, uint64_t ns);
  void record_step(const StepResult& r, bool selected);
  void record_hybrid_step(uint64_t recall_bytes);
  // A copy of this store's statistics (what the partition's lines hold
  // after the last record, for a writer store).
  void stats(cxlkv_pnm_part_stats* out) const;

 private:
  friend class Context;
  ContextStore() = default;
  uint64_t part_off(uint32_t p) const { return carve_off_ + parts_off_ + uint64_t(p) * part_bytes_; }
  uint64_t slot_off(uint32_t p, uint32_t s) const { return part_off(p) + 64 + uint64_t(s) * 128; }
  Result<uint64_t> heap_alloc(uint64_t bytes);  // pool offset, 64-aligned
  Result<void> write_part();                   // publish the partition header (rule 3)
  void store_stats_locked();                   // the stats lines (writer; stats_mu_ held)

  Region* region_ = nullptr;
  StoreOptions opts_{};
  uint64_t carve_off_ = 0, carve_size_ = 0, parts_off_ = 0, part_bytes_ = 0;
  uint32_t nparts_ = 0, slots_ = 0;
  int lock_fd_ = -1;
  std::string lock_path_;
  uint64_t heap_next_ = 0, heap_end_ = 0;  // writer's view of its partition header
  uint32_t live_ = 0;
  uint64_t stats_off_ = 0;  // pool offset of this writer's partition stats; 0: none
  mutable std::mutex stats_mu_;
  std::unique_ptr<cxlkv_pnm_part_stats> stats_;
};

// Page digests computed on the GPU: K [rows][ntokens][head_dim] at k_dev ->
// [rows][npages][2][head_dim] at out_dev (device memory), by the pnm digest
// kernel of libcxlkv-cuda.so, or by its CPU reference (the kernel's own
// per-thread code in loops) when `lib` is the CPU stand-in.  Enqueued on
// `stream`.
Result<void> gpu_digests(gpu::CudaLibrary& lib, Dtype dtype, uint64_t k_dev, uint64_t out_dev, uint32_t rows,
                         uint64_t ntokens, uint32_t head_dim, uint32_t page_tokens, void* stream = nullptr);

// ---- scoring and selection ---------------------------------------------------

enum class ScoreMode {
  upper_bound,  // sum_d max(q_d min_d, q_d max_d): an upper bound of q.k over the page
  coarse,       // max(q.min, q.max): the paper's cheaper score (not a bound)
};
const char* to_string(ScoreMode m);

// Instruction set of the scoring / attention kernels, chosen once from CPUID
// (CXLKV_PNM_ISA=scalar|avx2|avx512 forces one; an unsupported one throws).
enum class Isa { scalar, avx2, avx512 };
const char* to_string(Isa i);
Isa default_isa();
bool isa_supported(Isa i);

struct SelectOptions {
  uint64_t token_budget = 2048;  // tokens of pages kept per (layer, KV head)
  uint32_t sink_pages = 1;       // first pages, always kept
  uint32_t local_pages = 1;      // most recent pages, always kept
  ScoreMode mode = ScoreMode::upper_bound;
  // Two-level contexts: pages whose digests are read after the group pass,
  // the best groups' (0: max(4 x the budget, 512)); one_level reads every
  // page digest instead (docs/near-memory.md#digest-kinds).
  uint32_t refine_pages = 0;
  bool one_level = false;
};

// Selected pages per (layer, KV head), each list ascending.
struct Selection {
  uint32_t layers = 0, kv_heads = 0;
  std::vector<std::vector<uint32_t>> pages;  // [layer * kv_heads + head]
  uint64_t digest_bytes = 0;                 // digest rows read to make it (select_pages)
  const std::vector<uint32_t>& at(uint32_t layer, uint32_t head) const {
    return pages[size_t(layer) * kv_heads + head];
  }
};

// Score pages: out[p] = max over the nq query heads of the score of page p.
// digests: [npages][2][dim] of dtype; q: [nq][dim].
void score_pages(Isa isa, Dtype dtype, const void* digests, uint32_t npages, uint32_t dim,
                 const float* q, uint32_t nq, ScoreMode mode, float* out);
// The same over q8 rows (struct cxlkv_pnm_q8_row + int8 [2][dim] each).
void score_q8_pages(Isa isa, const void* rows, uint32_t npages, uint32_t dim, const float* q, uint32_t nq,
                    ScoreMode mode, float* out);
// Top pages for a budget: sink and local pages always, then the best of the
// rest by score (partial sort; ties to the lower page) up to budget_pages in
// all.  Ascending page numbers.
std::vector<uint32_t> top_pages(const float* scores, uint32_t npages, uint32_t budget_pages,
                                uint32_t sink_pages, uint32_t local_pages);

// Score and select for one decode step over the first `ntokens` tokens.
Result<Selection> select_pages(const Context& ctx, std::span<const float> queries, uint32_t q_heads,
                               uint64_t ntokens, const SelectOptions& opts, Isa isa = default_isa());

// ---- attention ------------------------------------------------------------------

// Output [layers][q_heads][head_dim] and log-sum-exp [layers][q_heads] of
// softmax(scale * q.K) V over a set of tokens (natural log, scaled scores).
// An empty set has lse = -inf and output 0.
struct Partial {
  uint32_t layers = 0, q_heads = 0, head_dim = 0;
  std::vector<float> out;
  std::vector<float> lse;
};

// Exact attention over the selected pages (sel == nullptr: every page) of
// the first ntokens tokens.  scale 0: 1/sqrt(head_dim).
Result<Partial> attend(const Context& ctx, std::span<const float> queries, uint32_t q_heads,
                       uint64_t ntokens, const Selection* sel, float scale = 0.f,
                       Isa isa = default_isa());
// Attention of the nq query heads q ([nq][dim]) over ntok rows of K and V
// ([ntok][dim] of dtype), folded into running state m, l (per head) and acc
// ([nq][dim]): the online-softmax step every engine and the tests share.
void attend_rows(Isa isa, Dtype dtype, const void* k, const void* v, uint32_t ntok, uint32_t dim,
                 const float* q, uint32_t nq, float scale, float* m, float* l, float* acc);
// Merge two partials over disjoint token sets into the partial of their union.
Result<Partial> merge(const Partial& a, const Partial& b);
// The same on raw arrays: n rows of head_dim (out may alias out_a or out_b).
void merge_rows(size_t n, uint32_t head_dim, const float* out_a, const float* lse_a, const float* out_b,
                const float* lse_b, float* out, float* lse);

// ---- hybrid steady-token mode (Algorithm 1) ----------------------------------

// Pages as bit masks over a request's pages.
using PageMask = std::vector<uint64_t>;

// One step of Algorithm 1 for one (layer, KV head): given the resident set R
// (on the GPU) and this step's top set S: evict = R & ~S; candidates =
// S & ~R; recall = the best-scored candidates, as many as were evicted plus
// free capacity; resident' = (R & ~evict) | recall; the near-memory side
// computes over S & ~resident'.  GPU part + near-memory part = S.
struct SteadyStep {
  PageMask evict, recall, resident, near;
  uint32_t evicted = 0, recalled = 0;
};
SteadyStep steady_step(const PageMask& resident, std::span<const uint32_t> top,
                       std::span<const float> scores, uint32_t npages, uint32_t capacity);
PageMask to_mask(std::span<const uint32_t> pages, uint32_t npages);
std::vector<uint32_t> from_mask(const PageMask& m);

// ---- hybrid mode ------------------------------------------------------------------

struct HybridStats {
  uint32_t evicted = 0, recalled = 0, refreshed = 0;  // pages, summed over (layer, KV head)
  uint64_t recall_bytes = 0;                          // pool -> GPU this step
  uint64_t gpu_pages = 0, near_pages = 0;             // where the selected pages were computed
  // Pages selected both this step and the last (summed over (layer, KV
  // head)), and the steady (resident) set size this step allowed, summed:
  // the capacity, or with auto sizing the measured overlap
  // (docs/near-memory.md#hybrid-mode).
  uint64_t overlap = 0, steady = 0;
};


// One request in hybrid steady-token mode: up to `capacity` pages per
// (layer, KV head) stay resident in a GPU buffer; each step the near-memory
// side selects, Algorithm 1 decides evictions and recalls, recalls go
// through the GPU sparse-read path (one batch per step), the GPU part is
// attention over the resident pages, the near-memory part over the rest of
// the selection, and the two merge by log-sum-exp.  With a CUDA library the
// GPU part is one launch of the partial-attention kernel (cuda/pnm_digest.cu,
// per-thread code cuda/pnm_attend_core.h; -ENOSYS from a library built
// before it); with the CPU stand-in library
// (gpu::CudaLibrary::cpu_reference()) it runs the CPU kernels over the buffer.  The page holding the newest tokens is recalled
// again while resident (it grows between steps).
class HybridRequest {
 public:
  // auto_steady: `capacity` is the most pages a (layer, KV head) keeps
  // resident (the GPU buffer's size); each step's steady set is sized from
  // the measured step-to-step overlap of its selections instead (a moving
  // average, rounded up, at least 1): pages recalled beyond what the next
  // step keeps selecting are bytes moved for nothing.
  static Result<std::unique_ptr<HybridRequest>> create(Context& ctx, gpu::GpuPool& gpu, uint32_t capacity,
                                                       bool auto_steady = false);
  ~HybridRequest();
  HybridRequest(const HybridRequest&) = delete;
  HybridRequest& operator=(const HybridRequest&) = delete;

  Result<Partial> step(std::span<const float> queries, uint32_t q_heads, uint64_t ntokens, const SelectOptions& opts,
                       HybridStats* stats = nullptr, Isa isa = default_isa());
  const PageMask& resident(uint32_t layer, uint32_t head) const;
  uint32_t capacity() const { return capacity_; }

 private:
  HybridRequest() = default;
  Context* ctx_ = nullptr;
  gpu::GpuPool* gpu_ = nullptr;
  uint32_t capacity_ = 0;
  void* buf_ = nullptr;  // device buffer [layer][head][slot][K|V][page_tokens][head_dim]
  uint64_t piece_ = 0;   // bytes of one page's K (or V) rows of one head
  std::vector<PageMask> resident_;               // per (layer, head)
  std::vector<std::vector<int32_t>> slot_of_;    // per (layer, head): page -> slot, -1
  std::vector<std::vector<uint32_t>> free_;      // per (layer, head): free slots
  uint64_t last_page_ = UINT64_MAX;
  bool auto_steady_ = false;
  std::vector<PageMask> last_top_;  // per (layer, head): the last step's selection
  std::vector<float> overlap_avg_;  // per (layer, head): moving average of the overlap; < 0: none yet
};

// ---- engines ---------------------------------------------------------------------

struct EngineOptions {
  uint32_t threads = 1;
  int numa_node = -1;  // bind the threads to this node's CPUs (-1: no binding)
};
// -EINVAL naming the option when `opts` cannot be honoured: a NUMA node this
// host does not have, or one without CPUs to bind to (a memory-only node,
// such as CXL memory).  The Engine constructor binds best effort; callers
// that take the options from a user check them first (the C API does).
Result<void> check_engine_options(const EngineOptions& opts);

struct StepRequest {
  Context* ctx = nullptr;
  std::span<const float> queries;
  uint32_t q_heads = 0;
  uint64_t ntokens = 0;          // 0: the context's published count (fresh read, rule 4)
  SelectOptions select{};
  bool all_pages = false;        // attention over every page (no selection)
};

struct StepResult {
  Result<void> status;
  Selection selection;
  Partial partial;
  uint64_t ntokens = 0;
  double select_ms = 0, attend_ms = 0;
  uint64_t digest_bytes = 0, kv_bytes = 0;  // pool bytes read (digest rows as read, every level)
  // Bytes that cross the link to the GPU per step: near-memory attention
  // (queries in, output + log-sum-exp out) vs recalling the selected pages'
  // K and V vs recalling every page.
  uint64_t link_bytes_near = 0, link_bytes_selected = 0, link_bytes_all = 0;
};

// A near-memory engine: a thread pool beside the pool; a step splits its
// (layer, KV head) pairs over the threads.
class Engine {
 public:
  explicit Engine(const EngineOptions& opts = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  StepResult step(const StepRequest& req, Isa isa = default_isa());
  uint32_t threads() const;
  int numa_node() const;
  // Run f(i) for i in [0, n) on the pool's threads; returns when all are done.
  void parallel_for(uint32_t n, const std::function<void(uint32_t)>& f);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Several engines; requests are spread over them data-parallel (request i
// of a batch to engine i mod n: each engine serves whole requests, so there
// is no cross-engine reduction).
class EngineGroup {
 public:
  explicit EngineGroup(std::vector<EngineOptions> engines);
  // One engine per NUMA node that has CPUs (1 where there is no NUMA info).
  static std::vector<EngineOptions> per_numa_node(uint32_t threads_per_engine);
  std::vector<StepResult> step(std::span<const StepRequest> reqs, Isa isa = default_isa());
  size_t size() const { return engines_.size(); }
  Engine& engine(size_t i) { return *engines_[i]; }

 private:
  std::vector<std::unique_ptr<Engine>> engines_;
};

}  // namespace cxlkv::pnm
