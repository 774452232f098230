#include <mutex>

#include "mla/ops.h"

namespace mla {

OpRegistry& OpRegistry::global() {
  static OpRegistry* registry = [] {
    auto* r = new OpRegistry();
    register_cpu_ops(*r);
#ifdef MLA_WITH_CUDA
    register_cuda_ops(*r);
#endif
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
