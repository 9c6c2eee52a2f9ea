// SPDX-License-Identifier: MIT
// Helper for kv_crash_test: a node that is killed with SIGKILL in the middle
// of its work.
//   kv_crash_helper POOL NODE writer KEYS...   reserve + write (not publish) KEYS as
//                                              a chain below a published first key
//   kv_crash_helper POOL NODE reader KEY       pin KEY
//   kv_crash_helper POOL NODE batch-writer ROOT  put_chain a chain of 32 blocks below
//                                              ROOT, then reserve_chain another and
//                                              write_many half of it
//   kv_crash_helper POOL NODE batch-reader KEYS... pin_many + fetch_many KEYS
//   kv_crash_helper POOL NODE put-chain-loop    put_chain 16-block chains of 2 MiB
//                                              blocks (chain c: ids 1000+c*16+i, block
//                                              i filled with byte c*16+i) one after the
//                                              other, READY after the first, until killed;
//                                              chains 0..5 again and again (removed
//                                              between cycles): the pool never fills
// Prints "READY" when in position, then sleeps until killed.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cxlkv/kv.hpp"
#include "cxlkv/region.hpp"
#include "cxlkv/sync.hpp"
#include "index/prefix_index.hpp"
#include "kv/store_index.hpp"

using namespace cxlkv;

int main(int argc, char** argv) {
  if (argc < 4 || (argc < 5 && std::string(argv[3]) != "put-chain-loop")) return 2;
  auto region = Region::open(argv[1]);
  if (!region) return std::fprintf(stderr, "%s\n", region.error().message().c_str()), 1;
  NodeOptions no;
  no.node = static_cast<uint32_t>(std::atoi(argv[2]));
  no.heartbeat = true;
  auto node = NodeContext::attach(*region.value(), no);
  if (!node) return std::fprintf(stderr, "%s\n", node.error().message().c_str()), 1;
  auto s = open_kv_session(*region.value(), *node.value());
  if (!s) return std::fprintf(stderr, "%s\n", s.error().message().c_str()), 1;
  KvStore& kv = s.value()->store();
  std::string mode = argv[3];
  std::vector<BlockKey> keys;
  for (int i = 4; i < argc; i++) {
    BlockKey k;
    if (!parse_key(argv[i], &k)) return 2;
    keys.push_back(k);
  }
  std::vector<std::byte> buf(4096, std::byte{0x77});
  Chunk ch{buf.data(), buf.size()};
  if (mode == "writer") {
    // keys[0] is published by the test; reserve the rest and write half of the payload.
    for (size_t i = 1; i < keys.size(); i++) {
      auto r = kv.reserve(keys[i], &keys[i - 1], buf.size());
      if (!r || !r->reserved()) return std::fprintf(stderr, "reserve failed\n"), 1;
      if (!kv.write(*r, {&ch, 1})) return 1;
    }
  } else if (mode == "batch-writer") {
    // Chain c = ids c*100+1 .. c*100+32 below ROOT; block i of chain c holds
    // bytes c*32+i.  Chain 0 is put whole; chain 1 is reserved and half
    // written, then the helper is killed before it publishes.
    auto chain_of = [](uint64_t c) {
      std::vector<uint64_t> ids(32);
      for (size_t i = 0; i < ids.size(); i++) ids[i] = c * 100 + i + 1;
      return keys_from_ids(ids);
    };
    std::vector<std::vector<std::byte>> bufs(32);
    std::vector<Chunk> chunks(32);
    std::vector<uint32_t> nchunks(32, 1);
    std::vector<int32_t> st(32);
    auto fill = [&](uint64_t c) {
      for (size_t i = 0; i < bufs.size(); i++) {
        bufs[i].assign(4096, std::byte(static_cast<uint8_t>(c * 32 + i)));
        chunks[i] = Chunk{bufs[i].data(), bufs[i].size()};
      }
    };
    fill(0);
    auto put = kv.put_chain(&keys[0], chain_of(0), 4096, chunks, nchunks, st);
    if (!put || put.value() != 32) return std::fprintf(stderr, "put_chain failed\n"), 1;
    fill(1);
    auto chain = chain_of(1);
    std::vector<KvReservation> rs(32);
    auto res = kv.reserve_chain(&keys[0], chain, 4096, rs, st);
    if (!res || res.value() != 32) return std::fprintf(stderr, "reserve_chain failed\n"), 1;
    auto w = kv.write_many(std::span(rs).first(16), chunks, nchunks, st);
    if (!w || w.value() != 16) return std::fprintf(stderr, "write_many failed\n"), 1;
  } else if (mode == "batch-reader") {
    // pin_many + fetch_many, killed before unpin_many.
    std::vector<std::vector<std::byte>> bufs(keys.size(), std::vector<std::byte>(4096));
    std::vector<Chunk> chunks;
    for (auto& b : bufs) chunks.push_back(Chunk{b.data(), b.size()});
    std::vector<uint32_t> nchunks(keys.size(), 1);
    std::vector<int32_t> st(keys.size());
    std::vector<KvPin> pins(keys.size());
    auto p = kv.pin_many(keys, pins, st);
    if (!p || p.value() != keys.size()) return std::fprintf(stderr, "pin_many failed\n"), 1;
    auto f = kv.fetch_many(pins, chunks, nchunks, st);
    if (!f || f.value() != keys.size()) return std::fprintf(stderr, "fetch_many failed\n"), 1;
  } else if (mode == "put-chain-loop") {
    constexpr size_t kN = 16, kBytes = 2u << 20;
    std::vector<std::vector<std::byte>> bufs(kN, std::vector<std::byte>(kBytes));
    std::vector<Chunk> chunks(kN);
    std::vector<uint32_t> nchunks(kN, 1);
    std::vector<int32_t> st(kN);
    // Chains 0..kChains-1 over and over, each cycle removing the last one's
    // chains (leaves first) before it starts: the pool never fills, so the
    // kill lands on a put_chain that evicts nothing (the test's accounting
    // of what the dead writer left assumes nothing else went).
    constexpr uint64_t kChains = 6;  // 96 of the 122 chunks of a 256 MiB pool
    for (uint64_t n = 0;; n++) {
      const uint64_t c = n % kChains;
      if (c == 0 && n > 0)
        for (uint64_t r = kChains; r-- > 0;) {
          std::vector<uint64_t> ids(kN);
          for (size_t i = 0; i < kN; i++) ids[i] = 1000 + r * kN + i;
          auto keys = keys_from_ids(ids);
          for (size_t i = kN; i-- > 0;)
            if (auto rm = store_index(kv).remove(keys[i]); !rm)
              return std::fprintf(stderr, "remove of chain %llu block %zu failed: %s\n", (unsigned long long)r, i,
                                  rm.error().message().c_str()),
                     1;
        }
      std::vector<uint64_t> ids(kN);
      for (size_t i = 0; i < kN; i++) {
        ids[i] = 1000 + c * kN + i;
        std::fill(bufs[i].begin(), bufs[i].end(), std::byte(static_cast<uint8_t>(c * kN + i)));
        chunks[i] = Chunk{bufs[i].data(), kBytes};
      }
      auto put = kv.put_chain(nullptr, keys_from_ids(ids), kBytes, chunks, nchunks, st);
      if (!put || put.value() != kN)
        return std::fprintf(stderr, "put_chain of chain %llu failed: %s\n", (unsigned long long)c,
                            put ? kv.last_block_error().c_str() : put.error().message().c_str()),
               1;
      if (n == 0) {
        std::printf("READY\n");
        std::fflush(stdout);
      }
    }
  } else if (mode == "reader") {
    if (!kv.pin(keys[0])) return std::fprintf(stderr, "pin failed\n"), 1;
  } else {
    return 2;
  }
  std::printf("READY\n");
  std::fflush(stdout);
  for (;;) pause();
}
