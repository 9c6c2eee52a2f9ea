// SPDX-License-Identifier: MIT
#include "workload/workload.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <list>
#include <random>
#include <unordered_map>
#include <unordered_set>

namespace cxlkv {

std::vector<Request> generate_workload(const GeneratorOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<double> in(o.input_mean, o.input_std), out(o.output_mean, o.output_std);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::exponential_distribution<double> gap(o.arrival_rate > 0 ? o.arrival_rate : 1.0);
  // Ids: group g's shared blocks are g*2^32 + i; unique blocks count up from 2^48.
  uint64_t next_unique = 1ull << 48;
  const uint32_t groups = std::max<uint32_t>(1, o.prefix_groups);
  // Zipf(1) popularity over groups.
  std::vector<double> cdf(groups);
  double acc = 0;
  for (uint32_t g = 0; g < groups; g++) cdf[g] = (acc += 1.0 / (g + 1));
  std::vector<Request> reqs;
  reqs.reserve(o.requests);
  double t = 0;
  for (uint32_t i = 0; i < o.requests; i++) {
    Request r;
    r.input_length = static_cast<uint32_t>(std::clamp(in(rng), 64.0, 65536.0));
    r.output_length = static_cast<uint32_t>(std::clamp(out(rng), 1.0, 8192.0));
    r.timestamp_ms = static_cast<uint64_t>(t * 1000);
    t += gap(rng);
    const uint32_t nblocks = (r.input_length + kTraceBlockTokens - 1) / kTraceBlockTokens;
    uint32_t shared = 0;
    uint64_t group = 0;
    if (u(rng) >= o.unique_fraction) {
      double x = u(rng) * acc;
      group = std::lower_bound(cdf.begin(), cdf.end(), x) - cdf.begin();
      // A shared prefix (system prompt, document) covers 30..90% of the prompt.
      shared = static_cast<uint32_t>(std::floor(nblocks * (0.3 + 0.6 * u(rng))));
    }
    for (uint32_t b = 0; b < nblocks; b++)
      r.hash_ids.push_back(b < shared ? (group << 32) + b : next_unique++);
    reqs.push_back(std::move(r));
  }
  return reqs;
}

namespace {

// Minimal field reader for one flat JSON object line.  A field that is
// missing or malformed sets *why, naming the field.
bool find_number(const std::string& line, const char* field, uint64_t* out, std::string* why) {
  std::string key = std::string("\"") + field + "\"";
  size_t p = line.find(key);
  if (p == std::string::npos || (p = line.find(':', p + key.size())) == std::string::npos) {
    *why = "no field \"" + std::string(field) + "\"";
    return false;
  }
  p++;
  while (p < line.size() && (line[p] == ' ' || line[p] == '\t')) p++;
  char* end = nullptr;
  // A JSON number: digits first (strtod would also take "nan", "inf", "-1", hex).
  double v = p < line.size() && line[p] >= '0' && line[p] <= '9' ? std::strtod(line.c_str() + p, &end) : -1;
  if (!(v >= 0 && v < 1.8e19)) {
    *why = "field \"" + std::string(field) + "\" is not a number from 0 to 2^64-1";
    return false;
  }
  *out = static_cast<uint64_t>(v);
  return true;
}

bool find_ids(const std::string& line, std::vector<uint64_t>* ids, std::string* why) {
  size_t p = line.find("\"hash_ids\"");
  if (p == std::string::npos) {
    *why = "no field \"hash_ids\"";
    return false;
  }
  p = line.find('[', p);
  size_t e = p == std::string::npos ? p : line.find(']', p);
  if (p == std::string::npos || e == std::string::npos) {
    *why = "field \"hash_ids\" is not a [list] (a line cut short?)";
    return false;
  }
  const char* s = line.c_str() + p + 1;
  const char* end = line.c_str() + e;
  while (s < end) {
    while (s < end && (*s == ' ' || *s == ',')) s++;
    if (s >= end) break;
    char* q = nullptr;
    errno = 0;
    unsigned long long v = *s >= '0' && *s <= '9' ? std::strtoull(s, &q, 10) : 0;
    if (q == nullptr || q == s || q > end || errno == ERANGE) {
      *why = "field \"hash_ids\" holds '" + std::string(s, std::min<size_t>(size_t(end - s), 24)) +
             "', not a block id from 0 to 2^64-1";
      return false;
    }
    ids->push_back(v);
    s = q;
  }
  return true;
}

}  // namespace

Result<std::vector<Request>> read_trace(const std::string& path, uint32_t max_requests) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Error(-errno, "trace " + path + ": cannot open: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return Error(-EISDIR, "trace " + path + ": is a directory, not a JSONL trace file");
  std::ifstream f(path);
  if (!f) return Error(-ENOENT, "trace " + path + ": cannot open: " + std::strerror(errno));
  std::vector<Request> reqs;
  std::string line;
  uint64_t lineno = 0;
  while (std::getline(f, line)) {
    lineno++;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string at = "trace " + path + ":" + std::to_string(lineno) + ": ";
    Request r;
    uint64_t ts = 0, in = 0, out = 0;
    std::string why;
    if (!find_number(line, "timestamp", &ts, &why) || !find_number(line, "input_length", &in, &why) ||
        !find_number(line, "output_length", &out, &why) || !find_ids(line, &r.hash_ids, &why))
      return Error(-EINVAL, at + why + " (each line: {\"timestamp\", \"input_length\", \"output_length\", "
                                       "\"hash_ids\": [...]})");
    if (in == 0 || in > (1u << 24))
      return Error(-EINVAL, at + "input_length " + std::to_string(in) + " out of range (1 to 2^24 tokens)");
    r.timestamp_ms = ts;
    r.input_length = static_cast<uint32_t>(in);
    r.output_length = static_cast<uint32_t>(std::min<uint64_t>(out, UINT32_MAX));
    // One block id per kTraceBlockTokens tokens of input: fewer would replay
    // a shorter prompt than the trace says (its tail counted as misses).
    uint64_t nblocks = (in + kTraceBlockTokens - 1) / kTraceBlockTokens;
    if (r.hash_ids.size() < nblocks)
      return Error(-EINVAL, at + "hash_ids has " + std::to_string(r.hash_ids.size()) + " block ids; input_length " +
                                std::to_string(in) + " needs " + std::to_string(nblocks) + " (one per " +
                                std::to_string(kTraceBlockTokens) + " tokens)");
    // Blocks beyond the input (a malformed trace) carry no tokens: drop them.
    if (r.hash_ids.size() > nblocks) r.hash_ids.resize(nblocks);
    reqs.push_back(std::move(r));
    if (max_requests && reqs.size() >= max_requests) break;
  }
  if (f.bad()) return Error(-EIO, "trace " + path + ": read error after line " + std::to_string(lineno));
  if (reqs.empty()) return Error(-EINVAL, "trace " + path + ": no requests (empty file?)");
  return reqs;
}

PrefixReuse theoretical_prefix_reuse(const std::vector<Request>& reqs) {
  PrefixReuse pr;
  std::unordered_set<uint64_t> seen;
  for (const Request& r : reqs) {
    uint64_t lead = 0;
    while (lead < r.hash_ids.size() && seen.count(r.hash_ids[lead])) lead++;
    pr.input_tokens += r.input_length;
    pr.reused_tokens += hit_tokens(r, lead);
    pr.blocks += r.hash_ids.size();
    for (uint64_t id : r.hash_ids) pr.unique_blocks += seen.insert(id).second;
  }
  return pr;
}

LruReference lru_reference(const std::vector<Request>& reqs, uint64_t capacity_blocks) {
  LruReference lr;
  std::list<uint64_t> order;  // front: most recently used
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where;
  where.reserve(capacity_blocks ? capacity_blocks * 2 : 1024);
  for (const Request& r : reqs) {
    uint64_t lead = 0;
    while (lead < r.hash_ids.size() && where.count(r.hash_ids[lead])) lead++;
    lr.input_tokens += r.input_length;
    lr.hit_tokens += hit_tokens(r, lead);
    lr.hit_blocks += lead;
    for (uint64_t id : r.hash_ids) {
      auto it = where.find(id);
      if (it != where.end()) {
        order.splice(order.begin(), order, it->second);
        continue;
      }
      if (capacity_blocks == 0) continue;
      order.push_front(id);
      where.emplace(id, order.begin());
      if (order.size() > capacity_blocks) {
        where.erase(order.back());
        order.pop_back();
        lr.evictions++;
      }
    }
  }
  return lr;
}

}  // namespace cxlkv
