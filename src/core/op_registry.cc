#include <algorithm>
#include <mutex>
#include <utility>

#include "core/forwarding_op.h"
#include "mla/ops.h"

namespace mla {

namespace {

// ---- the device check in front of a set's ops (OpRegistry::add) ----
// Each wrapper forwards to the set's own op; run() first checks that the set has code for the
// device it runs on (check_device_code: a cached capability lookup and a compare, no string
// built unless it refuses), so a GPU the set has no code for gets kUnsupported, never a launch.
// Only sets that list compute capabilities (cuda) are wrapped: the cpu set's ops run unwrapped.
struct DeviceCheck {
  std::string set_name;
  std::vector<ComputeCapability> built_for;
  Status operator()(const ExecContext& ctx) const {
    return check_device_code(set_name, built_for, ctx.device);
  }
};

// The one device-checked run(), for every op interface.
template <typename Op, typename Args>
class DeviceChecked final : public Forwarding<Op> {
 public:
  DeviceChecked(std::shared_ptr<const Op> op, DeviceCheck check)
      : Forwarding<Op>(std::move(op)), check_(std::move(check)) {}
  Status run(const Args& args, const ExecContext& ctx) const override {
    MLA_RETURN_IF_ERROR(check_(ctx));
    return this->op_->run(args, ctx);
  }

 private:
  DeviceCheck check_;
};

template <typename Args, typename Op>
std::shared_ptr<const Op> checked(std::shared_ptr<const Op> op, const DeviceCheck& check) {
  if (op == nullptr) return op;
  return std::make_shared<const DeviceChecked<Op, Args>>(std::move(op), check);
}

OpSet with_device_check(OpSet set) {
  if (set.compute_capabilities.empty()) return set;
  const DeviceCheck check{set.name, set.compute_capabilities};
  set.absorbed = checked<AbsorbedArgs>(std::move(set.absorbed), check);
  set.mha = checked<MhaArgs>(std::move(set.mha), check);
  set.merge = checked<MergeArgs>(std::move(set.merge), check);
  set.kv_write = checked<KvWriteArgs>(std::move(set.kv_write), check);
  set.up_project = checked<UpProjectArgs>(std::move(set.up_project), check);
  set.head_gemm = checked<HeadGemmArgs>(std::move(set.head_gemm), check);
  return set;
}

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

void OpRegistry::add(OpSet set) {
  sets_.push_back(std::make_unique<OpSet>(with_device_check(std::move(set))));
}

Status check_op_set_device(const OpSet& set, Device device) {
  if (set.device != device.type) {
    return invalid_argument("op set '{}' is not for device {}", set.name, device.to_string());
  }
  return check_device_code(set.name, set.compute_capabilities, device);
}

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
