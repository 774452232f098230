#include "mla/fault_injection.h"

#include <atomic>

namespace mla::fault_injection {
namespace {

constexpr int kSites = 3;
struct State {
  std::atomic<uint64_t> count[kSites] = {};
  std::atomic<uint64_t> target[kSites] = {};  // 0: disarmed
  std::atomic<bool> fired[kSites] = {};
};
State& state() {
  static State s;
  return s;
}
int index(Site s) { return static_cast<int>(s); }

}  // namespace

std::string_view site_name(Site site) {
  switch (site) {
    case Site::kAllocation:
      return "allocation";
    case Site::kCopy:
      return "copy";
    case Site::kLaunch:
      return "launch";
  }
  return "?";
}

void fail_at(Site site, uint64_t k) {
  State& s = state();
  s.target[index(site)].store(0);
  s.count[index(site)].store(0);
  s.fired[index(site)].store(false);
  s.target[index(site)].store(k);
}

void reset() {
  for (int i = 0; i < kSites; ++i) fail_at(static_cast<Site>(i), 0);
}

uint64_t count(Site site) { return state().count[index(site)].load(); }
bool fired(Site site) { return state().fired[index(site)].load(); }

bool should_fail(Site site) {
  State& s = state();
  const uint64_t n = s.count[index(site)].fetch_add(1, std::memory_order_relaxed) + 1;
  const uint64_t t = s.target[index(site)].load(std::memory_order_relaxed);
  if (t == 0 || n != t) return false;
  s.fired[index(site)].store(true);
  return true;
}

Status injected(Site site, std::string_view what) {
  return make_status(site == Site::kAllocation ? StatusCode::kOutOfMemory : StatusCode::kCudaError,
                     "{}: injected {} failure (fault_injection)", what, site_name(site));
}

}  // namespace mla::fault_injection
