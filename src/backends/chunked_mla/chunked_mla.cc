#include "backends/chunked_mla/chunked_mla.h"

namespace mla::backends {

StatusOr<std::unique_ptr<ChunkedMlaBackend>> ChunkedMlaBackend::create(const BackendContext& ctx,
                                                                       ParentPolicy parent) {
  MLA_ASSIGN_OR_RETURN(const OpSet* ops, resolve_ops(ctx, "chunked_mla"));
  MLA_ASSIGN_OR_RETURN(
      const std::size_t bytes,
      resolve_workspace_bytes(ctx.options.chunked_workspace_bytes, kChunkedWorkspaceEnv,
                              kDefaultChunkedWorkspaceBytes));
  std::unique_ptr<ChunkedMlaBackend> b(new ChunkedMlaBackend("chunked_mla", ctx, ops));
  WorkspaceSpec spec{"chunked_mla.workspace", ctx.options.device, bytes,
                     WorkspacePolicy::kSharedZeroed, kChunkedWorkspaceEnv};
  MLA_ASSIGN_OR_RETURN(b->workspace_, WorkspaceRegistry::global().acquire(spec, b->name()));
  MLA_CHECK_CODE(StatusCode::kOutOfWorkspace, bytes > b->reserved_workspace_bytes(),
                 "workspace 'chunked_mla.workspace' has {} bytes, its counters alone need {}; "
                 "set {}",
                 bytes, b->reserved_workspace_bytes(), kChunkedWorkspaceEnv);
  // Seed requirement 1: the fallback's parent resources exist from construction on when (and
  // only when) the configuration makes a fallback possible.
  if (parent == ParentPolicy::kAuto && planning::fallback_possible(method_options(ctx.options))) {
    MLA_ASSIGN_OR_RETURN(b->parent_, PagedMlaBackend::create(ctx, "chunked_mla.fallback"));
  }
  return b;
}

StatusOr<WorkspaceView> ChunkedMlaBackend::op_workspace(std::size_t) {
  return WorkspaceView{workspace_->data(), workspace_->bytes(), workspace_->name(),
                       workspace_->env_var()};
}

// Counters at the start of the zeroed workspace: one int32 per (request, head) at max_batch.
// The ops get the bytes after them, so op scratch never touches the counters.
std::size_t ChunkedMlaBackend::reserved_workspace_bytes() const {
  return align_workspace(static_cast<std::size_t>(options_.max_batch) *
                         static_cast<std::size_t>(options_.model.num_heads) * sizeof(int32_t));
}

ForwardMethod ChunkedMlaBackend::choose_forward_method(const ForwardBatch& batch) const {
  return planning::choose_forward_method(kExtendRule, method_options(options_), batch);
}

ForwardMethod ChunkedMlaBackend::forward_method() const {
  return delegated() ? parent_->forward_method() : method_;
}

PlanDescription ChunkedMlaBackend::describe_plan() const {
  if (!delegated()) return BackendBase::describe_plan();
  PlanDescription d = parent_->describe_plan();
  d.details.insert(d.details.begin(), {"planned by", std::string(parent_->name())});
  d.backend = name_;
  d.fell_back = true;
  return d;
}

Status ChunkedMlaBackend::init_forward_metadata(const ForwardBatch& batch) {
  PlanTimer timer(this);
  ++stats_.init_forward_metadata_calls;
  MLA_RETURN_IF_ERROR(validate(batch));
  // Decided afresh for every batch, so an extend's fallback never leaks into the next batch; the
  // fallback rule is asked once for both the fallback and the method.
  const planning::BatchMethod d =
      planning::decide_batch_method(kExtendRule, method_options(options_), batch);
  fell_back_ = d.fell_back;
  if (fell_back_) {
    ++stats_.fallbacks;
    if (parent_) {
      ++batch_epoch_;
      method_ = ForwardMethod::kAbsorbed;
      return parent_->init_forward_metadata(batch);
    }
    if (!falls_back_locally()) {
      return internal_error(
          "chunked_mla: the batch falls back to paged_mla's absorbed prefill, but the paged_mla "
          "resources were not created (they are created at construction when "
          "disable_chunked_prefix_cache, piecewise_cuda_graph or batch_invariant is set)");
    }
    return plan_eager(batch, ForwardMethod::kAbsorbed, false);
  }
  return plan_eager(batch, d.method, /*plan_chunks=*/true);
}

Status ChunkedMlaBackend::init_mha_chunk_metadata(const ForwardBatch& batch, bool disable_ragged) {
  ++stats_.mha_chunk_metadata_calls;
  // Seed requirement 2: the one fallback rule decides; outside a fallback there is nothing to do
  // (the chunks were planned by init_forward_metadata).
  if (!planning::should_fall_back(method_options(options_), batch)) {
    ++stats_.mha_chunk_metadata_skipped;
    return Status::Ok();
  }
  if (parent_ == nullptr) return Status::Ok();  // no parent planner: nothing to delegate to
  return parent_->init_mha_chunk_metadata(batch, disable_ragged);
}

Status ChunkedMlaBackend::forward_extend(const AttentionInputs& in, const AttentionOutputs& out,
                                         const ExecContext& ctx) {
  if (delegated()) return parent_->forward_extend(in, out, ctx);
  return BackendBase::forward_extend(in, out, ctx);
}

Status ChunkedMlaBackend::save_kv_cache(int layer, const TensorView& c_kv, const TensorView& k_pe,
                                        const ExecContext& ctx) {
  if (delegated()) return parent_->save_kv_cache(layer, c_kv, k_pe, ctx);
  return BackendBase::save_kv_cache(layer, c_kv, k_pe, ctx);
}

TensorView ChunkedMlaBackend::out_cache_loc() const {
  return delegated() ? parent_->out_cache_loc() : BackendBase::out_cache_loc();
}

Status ChunkedMlaBackend::init_cuda_graph_state(int max_bs, int64_t max_num_tokens) {
  MLA_RETURN_IF_ERROR(BackendBase::init_cuda_graph_state(max_bs, max_num_tokens));
  // Piecewise graphs run extends through the fallback: its static buffers exist before capture.
  if (parent_ && options_.piecewise_cuda_graph) {
    MLA_RETURN_IF_ERROR(parent_->init_cuda_graph_state(max_bs, max_num_tokens));
  }
  return Status::Ok();
}

}  // namespace mla::backends
