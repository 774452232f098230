#include <algorithm>
#include <mutex>
#include <utility>

#include "mla/ops.h"

namespace mla {

namespace {

struct Providers {
  std::mutex mu;
  std::vector<std::pair<DeviceType, OpSetProvider>> pending;
  OpRegistry* built = nullptr;
};

Providers& providers() {
  static Providers p;
  return p;
}

}  // namespace

bool register_op_set_provider(DeviceType device, OpSetProvider provider) {
  Providers& p = providers();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.built != nullptr) {
    provider(*p.built);
  } else {
    p.pending.emplace_back(device, provider);
  }
  return true;
}

OpRegistry& OpRegistry::global() {
  static OpRegistry* registry = [] {
    auto* r = new OpRegistry();
    Providers& p = providers();
    std::lock_guard<std::mutex> lock(p.mu);
    // Load order between libraries is unspecified: run the providers in device order.
    std::stable_sort(p.pending.begin(), p.pending.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [device, provider] : p.pending) provider(*r);
    p.pending.clear();
    p.built = r;
    return r;
  }();
  return *registry;
}

void OpRegistry::add(OpSet set) { sets_.push_back(std::make_unique<OpSet>(std::move(set))); }

const OpSet* OpRegistry::find(std::string_view name) const {
  for (const auto& s : sets_)
    if (s->name == name) return s.get();
  return nullptr;
}

const OpSet* OpRegistry::default_for(DeviceType device) const {
  for (const auto& s : sets_)
    if (s->device == device) return s.get();
  return nullptr;
}

std::vector<const OpSet*> OpRegistry::list() const {
  std::vector<const OpSet*> out;
  for (const auto& s : sets_) out.push_back(s.get());
  return out;
}

}  // namespace mla
