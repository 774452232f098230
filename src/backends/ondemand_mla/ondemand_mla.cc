#include "backends/ondemand_mla/ondemand_mla.h"

#include <algorithm>

namespace mla::backends {

StatusOr<std::unique_ptr<OndemandMlaBackend>> OndemandMlaBackend::create(
    const BackendContext& ctx) {
  MLA_ASSIGN_OR_RETURN(const OpSet* ops, resolve_ops(ctx, "ondemand_mla"));
  const DeviceRuntime* rt = device_runtime(ctx.options.device.type);
  if (rt == nullptr) {
    return unsupported("ondemand_mla: no runtime for {}", ctx.options.device.to_string());
  }
  const int sms = std::max(1, rt->multiprocessor_count(ctx.options.device.index));
  // Allocates nothing: the workspace appears with the first batch that needs it.
  return std::unique_ptr<OndemandMlaBackend>(new OndemandMlaBackend(ctx, ops, sms));
}

std::size_t OndemandMlaBackend::split_kv_bytes(int max_q_len) const {
  return static_cast<std::size_t>(num_sms_) * static_cast<std::size_t>(options_.model.num_heads) *
         static_cast<std::size_t>(max_q_len) * (512 + 1) * 4;
}

std::size_t OndemandMlaBackend::absorbed_op_workspace_bytes(const AttnCapacity& cap) const {
  return std::max(split_kv_bytes(cap.max_q_len), BackendBase::absorbed_op_workspace_bytes(cap));
}

StatusOr<WorkspaceView> OndemandMlaBackend::op_workspace(std::size_t needed) {
  MLA_RETURN_IF_ERROR(workspace_.reserve(needed));  // grows only when needed > capacity
  return WorkspaceView{workspace_.data(), workspace_.capacity(), workspace_.name(), {}};
}

}  // namespace mla::backends
