// Property tests of the latent KV pool over random operation sequences (alloc, extend,
// truncate, share_prefix, free). A shadow model holds what each live request should see; after
// every operation the pool is checked against it and against the invariants:
//   - req_to_token (host) matches the shadow, unused entries are 0, device copy == host copy;
//   - slots are page-contiguous and P-aligned, never in the dummy page;
//   - a slot held by two live requests is held at the same token index (a shared prefix), and
//     a page's reference count equals the number of live requests using it;
//   - free pages + pages in use == num_pages (free count conserved);
//   - OutOfMemory leaves everything unchanged and happens exactly when pages are short;
//   - at the end every page comes back and can be handed out again.
// Seeds are in the test names; the run of one seed is deterministic.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <set>

#include "mla/kv_pool.h"

namespace mla {
namespace {

struct PropertyParam {
  int page_size;
  uint32_t seed;
};

void PrintTo(const PropertyParam& p, std::ostream* os) {
  *os << "page_size " << p.page_size << ", seed " << p.seed;
}

class KvPoolProperty : public ::testing::TestWithParam<PropertyParam> {
 protected:
  void SetUp() override {
    P_ = GetParam().page_size;
    rng_.seed(GetParam().seed);
    config_.num_layers = 1;
    config_.latent_dim = 8;  // contents do not matter here; keeps the buffers small
    config_.page_size = P_;
    config_.max_requests = 6;
    config_.max_context_len = 5 * P_ + 3;
    config_.num_pages = 16;  // a request may need 6 pages: running out is common
    auto pool = LatentKvPool::create(config_);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    pool_ = std::move(pool).value();
  }

  int rand_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  int64_t pages_for(int64_t n) const { return (n + P_ - 1) / P_; }

  // Pages a shadow request uses.
  std::vector<int32_t> pages_of(const std::vector<int32_t>& slots) const {
    std::vector<int32_t> pages;
    for (std::size_t i = 0; i < slots.size(); i += static_cast<std::size_t>(P_)) {
      pages.push_back(slots[i] / P_);
    }
    return pages;
  }

  struct Snapshot {
    std::vector<int32_t> table;
    int64_t free_pages;
    std::vector<int32_t> lens, refs;
    bool operator==(const Snapshot&) const = default;
  };
  Snapshot snapshot() const {
    Snapshot s{pool_->req_to_token_host(), pool_->free_pages(), {}, {}};
    for (int r = 0; r <= config_.max_requests; ++r) s.lens.push_back(pool_->request_len(r));
    for (int p = 0; p <= config_.num_pages; ++p) s.refs.push_back(pool_->allocator().ref_count(p));
    return s;
  }

  void check_invariants(const std::string& where) {
    SCOPED_TRACE(where);
    const int ctx = config_.max_context_len;
    const auto& table = pool_->req_to_token_host();
    // Rows match the shadow; unused entries are the dummy slot 0.
    for (int r = 0; r <= config_.max_requests; ++r) {
      auto it = shadow_.find(r);
      const std::size_t len = it == shadow_.end() ? 0 : it->second.size();
      ASSERT_EQ(pool_->request_len(r), static_cast<int32_t>(len)) << "row " << r;
      for (int i = 0; i < ctx; ++i) {
        const int32_t want =
            static_cast<std::size_t>(i) < len ? it->second[static_cast<std::size_t>(i)] : 0;
        ASSERT_EQ(table[static_cast<std::size_t>(r) * ctx + i], want)
            << "row " << r << " token " << i;
      }
    }
    // Device copy == host copy.
    ASSERT_EQ(std::memcmp(pool_->req_to_token().data, table.data(), table.size() * 4), 0);
    // Layout, ownership and reference counts.
    std::map<int32_t, int> holders;        // page -> live requests using it
    std::map<int32_t, int> token_of_slot;  // slot -> token index of its holders
    for (const auto& [row, slots] : shadow_) {
      for (std::size_t i = 0; i < slots.size(); ++i) {
        const int32_t s = slots[i];
        ASSERT_GE(s, P_) << "row " << row << " token " << i << " in the dummy page";
        ASSERT_LT(s, pool_->num_slots());
        ASSERT_EQ(s % P_, static_cast<int32_t>(i % static_cast<std::size_t>(P_)));
        ASSERT_EQ(s - s % P_, slots[i - i % static_cast<std::size_t>(P_)]);
        auto [it, fresh] = token_of_slot.emplace(s, static_cast<int>(i));
        ASSERT_TRUE(fresh || it->second == static_cast<int>(i))
            << "slot " << s << " held at token " << it->second << " and token " << i;
      }
      for (int32_t page : pages_of(slots)) ++holders[page];
    }
    int64_t used = 0;
    for (int32_t p = 1; p <= config_.num_pages; ++p) {
      const int want = holders.count(p) ? holders[p] : 0;
      ASSERT_EQ(pool_->allocator().ref_count(p), want) << "page " << p;
      used += want > 0;
    }
    ASSERT_EQ(pool_->free_pages() + used, config_.num_pages);
  }

  int pick_live() {
    if (shadow_.empty()) return -1;
    auto it = shadow_.begin();
    std::advance(it, rand_int(0, static_cast<int>(shadow_.size()) - 1));
    return it->first;
  }

  void op_alloc() {
    auto row = pool_->alloc_request();
    if (static_cast<int>(shadow_.size()) == config_.max_requests) {
      ASSERT_EQ(row.status().code(), StatusCode::kOutOfMemory);
      return;
    }
    ASSERT_TRUE(row.ok()) << row.status().to_string();
    ASSERT_EQ(shadow_.count(*row), 0u);
    shadow_[*row] = {};
  }

  void op_extend() {
    const int row = pick_live();
    if (row < 0) return;
    auto& slots = shadow_[row];
    const int old_len = static_cast<int>(slots.size());
    const int ctx = config_.max_context_len;
    const bool too_long = rand_int(0, 19) == 0;
    const int new_len =
        too_long ? ctx + rand_int(1, 3) : rand_int(old_len, std::min(ctx, old_len + 2 * P_ + 1));
    // Pages needed, from the shadow: new pages plus a copy of a shared partly filled tail page.
    int64_t need = pages_for(new_len) - pages_for(old_len);
    if (old_len % P_ != 0 && new_len > old_len) {
      const int32_t tail = slots[static_cast<std::size_t>(old_len - 1)] / P_;
      int holders = 0;
      for (const auto& [r, s] : shadow_) {
        for (int32_t p : pages_of(s)) holders += p == tail;
      }
      need += holders > 1;
    }
    const Snapshot before = snapshot();
    std::vector<int32_t> fresh;
    const Status s = pool_->extend_request(row, new_len, &fresh);
    if (too_long) {
      ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
      ASSERT_TRUE(snapshot() == before);
      return;
    }
    if (need > before.free_pages) {
      ++out_of_memory_;
      ASSERT_EQ(s.code(), StatusCode::kOutOfMemory) << s.to_string();
      ASSERT_TRUE(snapshot() == before) << "OutOfMemory changed the pool";
      return;
    }
    ASSERT_TRUE(s.ok()) << s.to_string();
    extends_ += new_len > old_len;
    ASSERT_EQ(fresh.size(), static_cast<std::size_t>(new_len - old_len));
    const auto& table = pool_->req_to_token_host();
    const std::size_t base = static_cast<std::size_t>(row) * ctx;
    for (int i = 0; i < new_len; ++i) {
      const int32_t now = table[base + static_cast<std::size_t>(i)];
      if (i >= old_len) {
        ASSERT_EQ(now, fresh[static_cast<std::size_t>(i - old_len)]);
        // New tokens are written only into pages this request holds alone.
        ASSERT_EQ(pool_->allocator().ref_count(now / P_), 1) << "token " << i;
      } else if (i < old_len - old_len % P_) {
        ASSERT_EQ(now, slots[static_cast<std::size_t>(i)]) << "full pages never move";
      }
    }
    slots.assign(table.begin() + static_cast<int64_t>(base),
                 table.begin() + static_cast<int64_t>(base) + new_len);
  }

  void op_truncate() {
    const int row = pick_live();
    if (row < 0) return;
    auto& slots = shadow_[row];
    const int new_len = rand_int(0, static_cast<int>(slots.size()));
    ASSERT_TRUE(pool_->truncate_request(row, new_len).ok());
    slots.resize(static_cast<std::size_t>(new_len));
  }

  void op_share() {
    const int src = pick_live();
    if (src < 0) return;
    int dst = -1;
    for (const auto& [r, s] : shadow_) {
      if (r != src && s.empty()) dst = r;
    }
    if (dst < 0) return;
    const int max_pages = static_cast<int>(shadow_[src].size()) / P_;
    const int len = rand_int(0, max_pages) * P_;
    ASSERT_TRUE(pool_->share_prefix(src, dst, len).ok());
    shares_ += len > 0;
    shadow_[dst].assign(shadow_[src].begin(), shadow_[src].begin() + len);
  }

  void op_free() {
    const int row = pick_live();
    if (row < 0) return;
    ASSERT_TRUE(pool_->free_request(row).ok());
    shadow_.erase(row);
  }

  int P_ = 1;
  std::mt19937 rng_;
  KvPoolConfig config_;
  std::unique_ptr<LatentKvPool> pool_;
  std::map<int, std::vector<int32_t>> shadow_;
  int extends_ = 0, out_of_memory_ = 0, shares_ = 0;  // coverage of the interesting paths
};

TEST_P(KvPoolProperty, RandomOperationSequences) {
  constexpr int kSteps = 600;
  for (int step = 0; step < kSteps; ++step) {
    const int dice = rand_int(0, 99);
    std::string what;
    if (dice < 15) {
      what = "alloc";
      op_alloc();
    } else if (dice < 55) {
      what = "extend";
      op_extend();
    } else if (dice < 70) {
      what = "truncate";
      op_truncate();
    } else if (dice < 88) {
      what = "share";
      op_share();
    } else {
      what = "free";
      op_free();
    }
    if (HasFatalFailure()) FAIL() << "step " << step << " (" << what << ")";
    check_invariants(fmt::format("after step {} ({})", step, what));
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(extends_, 20);
  EXPECT_GT(out_of_memory_, 0);
  EXPECT_GT(shares_, 0);
  // Everything comes back: free all, then the whole pool can be handed out again.
  while (!shadow_.empty()) op_free();
  check_invariants("after freeing everything");
  EXPECT_EQ(pool_->free_pages(), config_.num_pages);
  int64_t taken = 0;
  while (taken < config_.num_pages) {
    auto row = pool_->alloc_request();
    ASSERT_TRUE(row.ok());
    const int64_t len =
        std::min<int64_t>(config_.max_context_len, (config_.num_pages - taken) * P_);
    ASSERT_TRUE(pool_->extend_request(*row, static_cast<int32_t>(len), nullptr).ok());
    taken += pages_for(len);
  }
  EXPECT_EQ(pool_->free_pages(), 0);
}

std::vector<PropertyParam> property_params() {
  std::vector<PropertyParam> params;
  for (int p : {1, 16, 64, 128}) {
    for (uint32_t seed : {1u, 2u, 3u, 20261202u}) params.push_back({p, seed});
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Pool, KvPoolProperty, ::testing::ValuesIn(property_params()),
                         [](const ::testing::TestParamInfo<PropertyParam>& info) {
                           return fmt::format("P{}_Seed{}", info.param.page_size, info.param.seed);
                         });

}  // namespace
}  // namespace mla
