#include "backends/ondemand_mla/ondemand_mla.h"

namespace mla::backends {

StatusOr<std::unique_ptr<OndemandMlaBackend>> OndemandMlaBackend::create(
    const BackendContext& ctx) {
  MLA_ASSIGN_OR_RETURN(const OpSet* ops, resolve_ops(ctx, "ondemand_mla"));
  if (device_runtime(ctx.options.device.type) == nullptr) {
    return unsupported("ondemand_mla: no runtime for {}", ctx.options.device.to_string());
  }
  // Allocates nothing: the workspace appears with the first batch that needs it.
  return std::unique_ptr<OndemandMlaBackend>(new OndemandMlaBackend(ctx, ops));
}

StatusOr<WorkspaceView> OndemandMlaBackend::op_workspace(std::size_t needed, bool) {
  MLA_RETURN_IF_ERROR(workspace_.reserve(needed));  // grows only when needed > capacity
  return WorkspaceView{workspace_.data(), workspace_.capacity(), workspace_.name(), {}};
}

}  // namespace mla::backends
