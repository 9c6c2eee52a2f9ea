// SPDX-License-Identifier: MIT
// The copy algorithm shared by the CUDA kernels (cxlkv_cuda.cu, compiled by
// nvcc) and the CPU reference implementation in libcxlkv (compiled by g++),
// so the reference that tests compare the kernels against runs exactly the
// same per-thread index arithmetic, only with threads emulated in a loop.
//
// Work decomposition:
//   * A batch is cut into tiles: descriptor i covers tiles first[i] ..
//     first[i+1]-1 of at most `tile_bytes` each (tile_prefix()); the device
//     finds a tile's descriptor by binary search over first[] (tile_at()),
//     so only the descriptors (and the prefix) travel to the GPU -- inside
//     the kernel parameters for up to kInlineDescs of them.  tile_bytes is a
//     multiple of 16, so each tile keeps its descriptor's relative alignment.
//   * A launch shape (docs/gpu.md "Launch shapes") says how many threads copy one tile and how
//     many tiles one thread block holds:
//       block: 256 threads per tile of 16 KiB, 4 vectors in flight each --
//              large chunks;
//       warp:  one warp (32 threads) per tile of 4 KiB, 8 tiles per thread
//              block, 8 vectors in flight per thread -- small chunks (2-16
//              KiB) get a whole tile in flight per warp instead of one
//              16-byte vector per thread of a mostly idle 256-thread block.
//     choose_shape() picks one from the batch (mean descriptor length).
//   * Inside a tile, copy_tile_thread() picks the widest access width w
//     (16, 8, 4, 2 or 1 bytes) at which source and destination are
//     co-aligned, copies a head of bytes up to the first w-aligned
//     destination address, then the body in w-byte vectors (Unroll loads in
//     flight per thread before their stores: reads across PCIe have
//     microseconds of latency), then the tail bytes.
//   * Sparse reads flatten (piece, unit) pairs into one index space; each
//     thread copies one unit of the widest width that divides the piece
//     size and every base and stride.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cuda/cxlkv_cuda_abi.h"

#if defined(__CUDACC__)
#define CXLKV_HD __host__ __device__ __forceinline__
#else
#define CXLKV_HD inline
#endif

namespace cxlkv::copycore {

constexpr uint32_t kThreads = 256;      // threads per block of the copy kernels
constexpr uint32_t kUnroll = 4;         // block shape: vectors in flight per thread per round
constexpr uint64_t kTileBytes = 16384;  // block shape: bytes per tile = 256 threads x 4 x 16 B
constexpr uint32_t kWarpThreads = 32;
constexpr uint32_t kWarpUnroll = 8;         // warp shape: 32 threads x 8 x 16 B = one 4 KiB tile per round
constexpr uint64_t kWarpTileBytes = 4096;
constexpr uint64_t kWarpShapeMaxMean = 16384;  // auto: mean descriptor below this -> warp shape
constexpr uint32_t kInlineDescs = 128;  // small batches: descriptors ride in the kernel parameters
constexpr uint32_t kMaxGrid = 65535;    // thread blocks loop over tiles beyond this

static_assert(kTileBytes % 16 == 0 && kWarpTileBytes % 16 == 0, "tiles must preserve 16-byte relative alignment");

// Launch shapes (values of CXLKV_CUDA_SHAPE_*).
struct Shape {
  uint32_t id;
  uint64_t tile_bytes;
  uint32_t threads_per_tile;
  uint32_t tiles_per_block;  // threads per block = threads_per_tile * tiles_per_block = kThreads
  uint32_t unroll;
};
constexpr Shape kBlockShape{CXLKV_CUDA_SHAPE_BLOCK, kTileBytes, kThreads, 1, kUnroll};
constexpr Shape kWarpShape{CXLKV_CUDA_SHAPE_WARP, kWarpTileBytes, kWarpThreads, kThreads / kWarpThreads, kWarpUnroll};

// The shape for a batch: `forced` (CXLKV_CUDA_SHAPE_BLOCK / _WARP) or, for
// CXLKV_CUDA_SHAPE_AUTO, warp when the mean non-empty descriptor is small.
inline const Shape& choose_shape(const cxlkv_copy_desc* d, size_t n, uint32_t forced) {
  if (forced == CXLKV_CUDA_SHAPE_BLOCK) return kBlockShape;
  if (forced == CXLKV_CUDA_SHAPE_WARP) return kWarpShape;
  uint64_t bytes = 0, nonempty = 0;
  for (size_t i = 0; i < n; i++) bytes += d[i].len, nonempty += d[i].len != 0;
  return nonempty && bytes / nonempty < kWarpShapeMaxMean ? kWarpShape : kBlockShape;
}

struct alignas(16) Vec16 {
  uint32_t x, y, z, w;
};
struct alignas(8) Vec8 {
  uint32_t x, y;
};

// Loads and stores of one access unit.  On the GPU a typed access of the
// given width; on the CPU memcpy (no aliasing or alignment assumptions).
template <class T>
CXLKV_HD T load_unit(const unsigned char* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const T*>(p);
#else
  T v;
  memcpy(&v, p, sizeof v);
  return v;
#endif
}
template <class T>
CXLKV_HD void store_unit(unsigned char* p, const T& v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<T*>(p) = v;
#else
  memcpy(p, &v, sizeof v);
#endif
}

// Widest power of two <= 16 dividing x (x == 0 counts as 16-aligned).
CXLKV_HD uint32_t alignment_of(uint64_t x) {
  if ((x & 15) == 0) return 16;
  if ((x & 7) == 0) return 8;
  if ((x & 3) == 0) return 4;
  if ((x & 1) == 0) return 2;
  return 1;
}

// Widest width at which src and dst can both be aligned after the same head.
CXLKV_HD uint32_t coalign(uint64_t src, uint64_t dst) { return alignment_of(src ^ dst); }

template <class V, uint32_t Unroll>
CXLKV_HD void copy_vectors(unsigned char* dst, const unsigned char* src, uint64_t nvec,
                           uint32_t tid, uint32_t nthreads) {
  uint64_t i = tid;
  const uint64_t step = static_cast<uint64_t>(nthreads) * Unroll;
  for (; i + static_cast<uint64_t>(Unroll - 1) * nthreads < nvec; i += step) {
    V r[Unroll];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (uint32_t u = 0; u < Unroll; u++)
      r[u] = load_unit<V>(src + (i + static_cast<uint64_t>(u) * nthreads) * sizeof(V));
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (uint32_t u = 0; u < Unroll; u++)
      store_unit<V>(dst + (i + static_cast<uint64_t>(u) * nthreads) * sizeof(V), r[u]);
  }
  for (; i < nvec; i += nthreads) store_unit<V>(dst + i * sizeof(V), load_unit<V>(src + i * sizeof(V)));
}

// The share of one tile that thread `tid` of `nthreads` copies.
template <uint32_t Unroll = kUnroll>
CXLKV_HD void copy_tile_thread(const cxlkv_copy_desc& t, uint32_t tid, uint32_t nthreads) {
  unsigned char* dst = reinterpret_cast<unsigned char*>(static_cast<uintptr_t>(t.dst));
  const unsigned char* src = reinterpret_cast<const unsigned char*>(static_cast<uintptr_t>(t.src));
  const uint64_t len = t.len;
  const uint32_t w = coalign(t.src, t.dst);
  uint64_t head = (w - (t.dst & (w - 1))) & (w - 1);
  if (head > len) head = len;
  for (uint64_t i = tid; i < head; i += nthreads) dst[i] = src[i];
  const uint64_t nvec = (len - head) / w;
  unsigned char* vd = dst + head;
  const unsigned char* vs = src + head;
  switch (w) {
    case 16: copy_vectors<Vec16, Unroll>(vd, vs, nvec, tid, nthreads); break;
    case 8: copy_vectors<Vec8, Unroll>(vd, vs, nvec, tid, nthreads); break;
    case 4: copy_vectors<uint32_t, Unroll>(vd, vs, nvec, tid, nthreads); break;
    case 2: copy_vectors<uint16_t, Unroll>(vd, vs, nvec, tid, nthreads); break;
    default: copy_vectors<unsigned char, Unroll>(vd, vs, nvec, tid, nthreads); break;
  }
  for (uint64_t i = head + nvec * w + tid; i < len; i += nthreads) dst[i] = src[i];
}

// Tiles of a batch (host side).  count_tiles() first, then plan_tiles()
// into an array of that many entries.  Zero-length descriptors vanish.
inline uint64_t count_tiles(const cxlkv_copy_desc* d, size_t n) {
  uint64_t tiles = 0;
  for (size_t i = 0; i < n; i++) tiles += (d[i].len + kTileBytes - 1) / kTileBytes;
  return tiles;
}
inline void plan_tiles(const cxlkv_copy_desc* d, size_t n, cxlkv_copy_desc* out) {
  for (size_t i = 0; i < n; i++) {
    for (uint64_t off = 0; off < d[i].len; off += kTileBytes) {
      const uint64_t rest = d[i].len - off;
      *out++ = cxlkv_copy_desc{d[i].src + off, d[i].dst + off, rest < kTileBytes ? rest : kTileBytes};
    }
  }
}

// Tile prefix of a batch (host side): first[i] = index of descriptor i's
// first tile of `tile_bytes`, first[n] = the batch's tile count (returned).
// Zero-length descriptors own no tile.  Returns UINT64_MAX when the count
// does not fit the 32-bit prefix (the caller splits the batch).
inline uint64_t tile_prefix(const cxlkv_copy_desc* d, size_t n, uint64_t tile_bytes, uint32_t* first) {
  uint64_t t = 0;
  for (size_t i = 0; i < n; i++) {
    if (t > UINT32_MAX) return UINT64_MAX;
    first[i] = static_cast<uint32_t>(t);
    t += (d[i].len + tile_bytes - 1) / tile_bytes;
  }
  if (t > UINT32_MAX) return UINT64_MAX;
  first[n] = static_cast<uint32_t>(t);
  return t;
}

// Tile g (< first[n]) of a batch: the last descriptor whose first tile is
// <= g owns it (an empty descriptor shares its successor's `first`).
CXLKV_HD cxlkv_copy_desc tile_at(const cxlkv_copy_desc* d, const uint32_t* first, uint32_t n, uint32_t g,
                                 uint64_t tile_bytes) {
  uint32_t lo = 0, hi = n;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (first[mid] <= g) lo = mid;
    else hi = mid;
  }
  const uint64_t off = static_cast<uint64_t>(g - first[lo]) * tile_bytes;
  const uint64_t rest = d[lo].len - off;
  return cxlkv_copy_desc{d[lo].src + off, d[lo].dst + off, rest < tile_bytes ? rest : tile_bytes};
}

// The share of tile work of thread `thread` of thread block `block` (of
// `grid`) in a launch of shape S: the kernels' body, and the reference's.
template <uint64_t TileBytes, uint32_t ThreadsPerTile, uint32_t TilesPerBlock, uint32_t Unroll>
CXLKV_HD void copy_batch_thread(const cxlkv_copy_desc* d, const uint32_t* first, uint32_t n, uint32_t ntiles,
                                uint32_t block, uint32_t grid, uint32_t thread) {
  const uint32_t sub = thread / ThreadsPerTile, lane = thread % ThreadsPerTile;
  for (uint64_t g = static_cast<uint64_t>(block) * TilesPerBlock + sub; g < ntiles;
       g += static_cast<uint64_t>(grid) * TilesPerBlock)
    copy_tile_thread<Unroll>(tile_at(d, first, n, static_cast<uint32_t>(g), TileBytes), lane, ThreadsPerTile);
}

// Thread blocks of a launch of `ntiles` tiles in shape `s`.
inline uint32_t grid_for(uint64_t ntiles, const Shape& s) {
  const uint64_t b = (ntiles + s.tiles_per_block - 1) / s.tiles_per_block;
  return static_cast<uint32_t>(b < kMaxGrid ? b : kMaxGrid);
}

// ---- sparse read -------------------------------------------------------

// Access width for a sparse batch: divides the piece size and every base
// and stride, so every unit of every piece is aligned on both sides.
inline uint32_t sparse_width(const cxlkv_sparse_list* l, size_t n, uint64_t piece_bytes) {
  uint64_t bits = piece_bytes;
  for (size_t i = 0; i < n; i++) bits |= l[i].src_base | l[i].dst_base | l[i].src_stride | l[i].dst_stride;
  return alignment_of(bits);
}

// Index of the list holding piece p: the last list with first <= p (empty
// lists share their successor's `first` and are skipped by taking the last).
CXLKV_HD uint32_t sparse_list_of(const cxlkv_sparse_list* l, uint32_t nlists, uint64_t p) {
  uint32_t lo = 0, hi = nlists;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (l[mid].first <= p) lo = mid;
    else hi = mid;
  }
  return lo;
}

// Copy unit g of the flattened (piece, unit) space.
CXLKV_HD void sparse_unit(const cxlkv_sparse_list* lists, uint32_t nlists, const uint32_t* tokens,
                          uint64_t piece_bytes, uint32_t w, uint64_t g) {
  const uint64_t units = piece_bytes / w;
  const uint64_t p = g / units;
  const uint64_t u = g % units;
  const cxlkv_sparse_list& l = lists[sparse_list_of(lists, nlists, p)];
  const uint64_t src = l.src_base + static_cast<uint64_t>(tokens[p]) * l.src_stride + u * w;
  const uint64_t dst = l.dst_base + (p - l.first) * l.dst_stride + u * w;
  const unsigned char* s = reinterpret_cast<const unsigned char*>(static_cast<uintptr_t>(src));
  unsigned char* d = reinterpret_cast<unsigned char*>(static_cast<uintptr_t>(dst));
  switch (w) {
    case 16: store_unit<Vec16>(d, load_unit<Vec16>(s)); break;
    case 8: store_unit<Vec8>(d, load_unit<Vec8>(s)); break;
    case 4: store_unit<uint32_t>(d, load_unit<uint32_t>(s)); break;
    case 2: store_unit<uint16_t>(d, load_unit<uint16_t>(s)); break;
    default: *d = *s; break;
  }
}

// Host-side check of the list table: -EINVAL when it is not a prefix sum
// over `ntokens` indices.
inline int sparse_check(const cxlkv_sparse_list* l, size_t n, size_t ntokens, uint64_t piece_bytes) {
  if (piece_bytes == 0 || n > UINT32_MAX || ntokens > UINT32_MAX) return -22;
  uint64_t next = 0;
  for (size_t i = 0; i < n; i++) {
    if (l[i].first != next) return -22;
    next += l[i].count;
  }
  return next == ntokens ? 0 : -22;
}

}  // namespace cxlkv::copycore
