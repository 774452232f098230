// Fuzz target `kv_pool`: sequences of KV pool operations (allocate a request row, extend it,
// share a prefix, truncate, copy-on-write on extending a shared page, free) on a small cpu
// LatentKvPool, checked after every operation against a plain model of the pool (per row: the
// token values it must read back). Every extend writes a fresh value into each new token's
// cache row, so a write that lands in another request's page (a missed copy-on-write) or a slot
// handed out twice shows up as a wrong read-back.
// Invariants: no crash or sanitizer report; an operation the model rejects is kInvalidArgument
// naming the field (or kOutOfMemory when pages or rows run out) and changes nothing; after
// every operation each live row reads back its tokens, reference counts equal the number of
// rows holding each page, the free page count is what the model says; after freeing every row
// all pages are free.
#include <algorithm>
#include <cstdint>
#include <map>
#include <set>

#include "fuzz/fuzz_target.h"
#include "mla/kv_pool.h"

namespace {

using namespace mla;

struct Model {
  std::map<int, std::vector<uint32_t>> rows;  // live row -> token values
};

uint32_t read_value(const LatentKvPool& pool, int32_t slot) {
  uint32_t v;
  std::memcpy(&v, pool.layer_cache(0).ptr<std::byte>() + static_cast<std::size_t>(slot) * 4 * 2,
              sizeof(v));
  return v;
}
void write_value(LatentKvPool& pool, int32_t slot, uint32_t v) {
  std::memcpy(pool.layer_cache(0).ptr<std::byte>() + static_cast<std::size_t>(slot) * 4 * 2, &v,
              sizeof(v));
}

std::string check_state(const LatentKvPool& pool, const Model& m) {
  const auto& c = pool.config();
  std::map<int32_t, int> holders;  // page -> rows holding it
  for (const auto& [row, values] : m.rows) {
    FUZZ_CHECK(pool.request_len(row) == static_cast<int32_t>(values.size()),
               "row {}: length {} vs model {}", row, pool.request_len(row), values.size());
    std::set<int32_t> pages;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const int32_t slot = pool.slot(row, static_cast<int>(i));
      FUZZ_CHECK(slot >= c.page_size && slot < pool.num_slots(), "row {} token {}: slot {}", row, i,
                 slot);
      FUZZ_CHECK(slot % c.page_size == static_cast<int32_t>(i % c.page_size),
                 "row {} token {}: slot {} not at its page offset", row, i, slot);
      FUZZ_CHECK(read_value(pool, slot) == values[i], "row {} token {}: reads {} expected {}", row,
                 i, read_value(pool, slot), values[i]);
      pages.insert(slot / c.page_size);
    }
    for (int32_t p : pages) holders[p]++;
    // The device copy of req_to_token (cpu here) matches the host copy.
    const int32_t* dev =
        pool.req_to_token().ptr<int32_t>() + static_cast<std::size_t>(row) * c.max_context_len;
    for (std::size_t i = 0; i < values.size(); ++i) {
      FUZZ_CHECK(dev[i] == pool.slot(row, static_cast<int>(i)), "row {} token {}: device table",
                 row, i);
    }
  }
  for (int32_t p = 1; p <= c.num_pages; ++p) {
    const auto it = holders.find(p);
    const int want = it == holders.end() ? 0 : it->second;
    FUZZ_CHECK(pool.allocator().ref_count(p) == want, "page {}: ref_count {} held by {} rows", p,
               pool.allocator().ref_count(p), want);
  }
  FUZZ_CHECK(pool.free_pages() == c.num_pages - static_cast<int64_t>(holders.size()),
             "free pages {} with {} of {} in use", pool.free_pages(), holders.size(), c.num_pages);
  return "";
}

// The pool's observable state, to prove that a rejected operation changed nothing.
struct Snapshot {
  std::vector<int32_t> table;
  int64_t free_pages;
  std::vector<int32_t> lens, refs;
  bool operator==(const Snapshot&) const = default;
};
Snapshot snapshot(const LatentKvPool& pool) {
  Snapshot s{pool.req_to_token_host(), pool.free_pages(), {}, {}};
  for (int r = 0; r <= pool.config().max_requests; ++r) s.lens.push_back(pool.request_len(r));
  for (int64_t p = 0; p <= pool.config().num_pages; ++p) {
    s.refs.push_back(pool.allocator().ref_count(static_cast<int32_t>(p)));
  }
  return s;
}

std::string check_rejection(const Status& s, const Snapshot& before, const LatentKvPool& pool,
                            const char* op) {
  FUZZ_CHECK(s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kOutOfMemory,
             "{}: code of {}", op, s.to_string());
  FUZZ_CHECK(fuzz::names_a_field(s.message(),
                                 {"row", "src", "dst", "len", "new_len", "pages", "request rows"}),
             "{}: no field named: {}", op, s.message());
  FUZZ_CHECK(snapshot(pool) == before, "{} failed ({}) but changed the pool", op, s.message());
  return "";
}

}  // namespace

MLA_FUZZ_TARGET(kv_pool) {
  fuzz::ByteReader in(data, size);
  constexpr int kPages[] = {1, 16, 32, 64, 128};
  KvPoolConfig c;
  c.num_layers = 1;
  c.page_size = kPages[in.u8() % 5];
  c.max_requests = static_cast<int>(in.range(1, 8));
  c.max_context_len = static_cast<int>(in.range(1, 4 * c.page_size + 3));
  c.num_pages = in.range(0, 12);
  c.latent_dim = 4;  // bf16: 8 bytes per slot, the first 4 hold the token's value
  auto created = LatentKvPool::create(c);
  FUZZ_CHECK(created.ok(), "create: {}", created.status().to_string());
  LatentKvPool& pool = **created;
  Model m;
  uint32_t next_value = 1;
  auto live_or_any = [&](uint8_t pick) {
    if (!m.rows.empty() && pick % 8 != 0) {
      auto it = m.rows.begin();
      std::advance(it, pick % m.rows.size());
      return it->first;
    }
    return static_cast<int>(static_cast<int8_t>(pick)) % (c.max_requests + 3);  // maybe bad
  };
  for (int step = 0; step < 64 && !in.empty(); ++step) {
    const uint8_t op = in.u8() % 6;
    const Snapshot before = snapshot(pool);
    if (op == 0) {  // allocate a row
      auto r = pool.alloc_request();
      if (r.ok()) {
        FUZZ_CHECK(!m.rows.count(*r), "row {} handed out twice", *r);
        m.rows[*r] = {};
      } else {
        FUZZ_CHECK(static_cast<int>(m.rows.size()) == c.max_requests, "alloc failed: {}",
                   r.status().to_string());
        FUZZ_RETURN_IF_FAILED(check_rejection(r.status(), before, pool, "alloc_request"));
      }
    } else if (op == 1 || op == 2) {  // extend (op 2: by a partial page, to set up COW)
      const int row = live_or_any(in.u8());
      const int32_t add = op == 1 ? in.mostly(0, 2 * c.page_size + 1, 32)
                                  : static_cast<int32_t>(in.range(1, c.page_size));
      const auto it = m.rows.find(row);
      const int64_t old_len = it == m.rows.end() ? 0 : static_cast<int64_t>(it->second.size());
      const int64_t new_len64 = old_len + add;
      const int32_t new_len =
          static_cast<int32_t>(std::clamp<int64_t>(new_len64, INT32_MIN, INT32_MAX));
      std::vector<int32_t> slots;
      const Status s = pool.extend_request(row, new_len, &slots);
      if (s.ok()) {
        FUZZ_CHECK(it != m.rows.end() && add >= 0 && new_len <= c.max_context_len,
                   "extend of row {} to {} accepted", row, new_len);
        FUZZ_CHECK(static_cast<int64_t>(slots.size()) == add, "{} slots for {} tokens",
                   slots.size(), add);
        for (int32_t slot : slots) {
          write_value(pool, slot, next_value);
          it->second.push_back(next_value++);
        }
      } else {
        FUZZ_RETURN_IF_FAILED(check_rejection(s, before, pool, "extend_request"));
        if (s.code() == StatusCode::kOutOfMemory) {
          FUZZ_CHECK(it != m.rows.end() && new_len <= c.max_context_len,
                     "out of memory on an invalid extend");
        }
      }
    } else if (op == 3) {  // truncate
      const int row = live_or_any(in.u8());
      const auto it = m.rows.find(row);
      const int32_t len = it == m.rows.end()
                              ? in.mostly(0, 4, 4)
                              : in.mostly(0, static_cast<int64_t>(it->second.size()), 16);
      const Status s = pool.truncate_request(row, len);
      if (s.ok()) {
        FUZZ_CHECK(it != m.rows.end() && len >= 0 && len <= static_cast<int32_t>(it->second.size()),
                   "truncate of row {} to {} accepted", row, len);
        it->second.resize(static_cast<std::size_t>(len));
      } else {
        FUZZ_RETURN_IF_FAILED(check_rejection(s, before, pool, "truncate_request"));
      }
    } else if (op == 4) {  // share a prefix into a fresh or empty row
      const int src = live_or_any(in.u8());
      int dst = live_or_any(in.u8());
      if (in.boolean()) {
        auto r = pool.alloc_request();
        if (r.ok()) {
          m.rows[*r] = {};
          dst = *r;
        }
      }
      const Snapshot before2 = snapshot(pool);
      const auto its = m.rows.find(src);
      const int32_t src_len = its == m.rows.end() ? 0 : static_cast<int32_t>(its->second.size());
      int32_t len = in.boolean() ? (src_len / c.page_size - static_cast<int32_t>(in.range(0, 1))) *
                                       c.page_size
                                 : in.mostly(0, src_len + 1, 8);
      const Status s = pool.share_prefix(src, dst, len);
      if (s.ok()) {
        const auto itd = m.rows.find(dst);
        FUZZ_CHECK(its != m.rows.end() && itd != m.rows.end() && src != dst &&
                       itd->second.empty() && len >= 0 && len <= src_len && len % c.page_size == 0,
                   "share_prefix({}, {}, {}) accepted", src, dst, len);
        itd->second.assign(its->second.begin(), its->second.begin() + len);
      } else {
        FUZZ_RETURN_IF_FAILED(check_rejection(s, before2, pool, "share_prefix"));
      }
    } else {  // free
      const int row = live_or_any(in.u8());
      const Status s = pool.free_request(row);
      if (s.ok()) {
        FUZZ_CHECK(m.rows.erase(row) == 1, "free of row {} accepted", row);
      } else {
        FUZZ_RETURN_IF_FAILED(check_rejection(s, before, pool, "free_request"));
      }
    }
    FUZZ_RETURN_IF_FAILED(check_state(pool, m));
  }
  for (const auto& [row, values] : m.rows) {
    const Status s = pool.free_request(row);
    FUZZ_CHECK(s.ok(), "final free of row {}: {}", row, s.to_string());
  }
  FUZZ_CHECK(pool.free_pages() == c.num_pages, "{} of {} pages free after freeing every row",
             pool.free_pages(), c.num_pages);
  return "";
}
