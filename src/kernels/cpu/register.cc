// Placeholder until the cpu ops land: registers an empty cpu op set.
#include "mla/ops.h"

namespace mla {
void register_cpu_ops(OpRegistry& registry) {
  OpSet set;
  set.name = "cpu";
  set.device = DeviceType::kCpu;
  registry.add(std::move(set));
}
}  // namespace mla
