// The cpu op set "cpu" (the cpu device's default), registered with core's op registry when the
// library is loaded (mla links this library whole).
#include "kernels/cpu/cpu_common.h"
#include "mla/ops.h"

namespace mla {

namespace {

void register_cpu_ops(OpRegistry& registry) {
  OpSet set;
  set.name = "cpu";
  set.device = DeviceType::kCpu;
  set.absorbed = cpu::make_absorbed_op();
  set.mha = cpu::make_mha_op();
  set.merge = cpu::make_merge_op();
  set.kv_write = cpu::make_kv_write_op();
  set.up_project = cpu::make_up_project_op();
  set.head_gemm = cpu::make_head_gemm_op();
  registry.add(std::move(set));
}

[[maybe_unused]] const bool kRegistered =
    register_op_set_provider(DeviceType::kCpu, &register_cpu_ops);

}  // namespace

}  // namespace mla
