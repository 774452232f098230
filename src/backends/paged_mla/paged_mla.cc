#include "backends/paged_mla/paged_mla.h"

#include "planning/forward_method.h"

namespace mla::backends {

StatusOr<WorkspaceSpec> PagedMlaBackend::workspace_spec(const BackendOptions& options) {
  MLA_ASSIGN_OR_RETURN(const std::size_t bytes,
                       resolve_workspace_bytes(options.paged_workspace_bytes, kPagedWorkspaceEnv,
                                               kDefaultPagedWorkspaceBytes));
  return WorkspaceSpec{"paged_mla.workspace", options.device, bytes, WorkspacePolicy::kSharedLazy,
                       kPagedWorkspaceEnv};
}

StatusOr<std::shared_ptr<SharedWorkspace>> PagedMlaBackend::acquire_workspace(
    const BackendOptions& options, std::string_view user) {
  MLA_ASSIGN_OR_RETURN(const WorkspaceSpec spec, workspace_spec(options));
  return WorkspaceRegistry::global().acquire(spec, user);
}

StatusOr<std::unique_ptr<PagedMlaBackend>> PagedMlaBackend::create(const BackendContext& ctx,
                                                                   std::string instance_name) {
  MLA_ASSIGN_OR_RETURN(const OpSet* ops, resolve_ops(ctx, instance_name));
  std::unique_ptr<PagedMlaBackend> b(new PagedMlaBackend(std::move(instance_name), ctx, ops));
  MLA_ASSIGN_OR_RETURN(b->workspace_, acquire_workspace(ctx.options, b->name()));
  return b;
}

StatusOr<WorkspaceView> PagedMlaBackend::op_workspace(std::size_t, bool) {
  return WorkspaceView{workspace_->data(), workspace_->bytes(), workspace_->name(),
                       workspace_->env_var()};
}

ForwardMethod PagedMlaBackend::choose_forward_method(const ForwardBatch& batch) const {
  return planning::choose_forward_method(kExtendRule, method_options(options_), batch);
}

Status PagedMlaBackend::init_forward_metadata(const ForwardBatch& batch) {
  PlanTimer timer(this);
  ++stats_.init_forward_metadata_calls;
  MLA_RETURN_IF_ERROR(validate(batch));
  return plan_eager(batch, choose_forward_method(batch), /*fell_back=*/false,
                    /*plan_chunks=*/false);
}

Status PagedMlaBackend::init_mha_chunk_metadata(const ForwardBatch& batch, bool disable_ragged) {
  (void)disable_ragged;
  ++stats_.mha_chunk_metadata_calls;
  MLA_RETURN_IF_ERROR(validate(batch));
  return plan_prefix_chunks(batch);
}

}  // namespace mla::backends
