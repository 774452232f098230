#include "backends/chunked_mla/chunked_mla.h"

namespace mla::backends {

StatusOr<std::unique_ptr<PagedFallback>> PagedFallback::create(const BackendOptions& options,
                                                               std::string name) {
  std::unique_ptr<PagedFallback> f(new PagedFallback(std::move(name)));
  MLA_ASSIGN_OR_RETURN(f->workspace_, PagedMlaBackend::acquire_workspace(options, f->name_));
  return f;
}

StatusOr<std::unique_ptr<ChunkedMlaBackend>> ChunkedMlaBackend::create(const BackendContext& ctx,
                                                                       ParentPolicy parent) {
  MLA_ASSIGN_OR_RETURN(const OpSet* ops, resolve_ops(ctx, "chunked_mla"));
  MLA_ASSIGN_OR_RETURN(const WorkspaceSpec spec, workspace_spec(ctx.options));
  std::unique_ptr<ChunkedMlaBackend> b(new ChunkedMlaBackend("chunked_mla", ctx, ops));
  MLA_ASSIGN_OR_RETURN(b->workspace_, WorkspaceRegistry::global().acquire(spec, b->name()));
  // Seed requirement 1: the fallback's parent resources exist from construction on when (and
  // only when) the configuration makes a fallback possible.
  if (parent == ParentPolicy::kAuto && planning::fallback_possible(method_options(ctx.options))) {
    MLA_ASSIGN_OR_RETURN(b->fallback_, PagedFallback::create(ctx.options, "chunked_mla.fallback"));
  }
  return b;
}

StatusOr<WorkspaceSpec> ChunkedMlaBackend::workspace_spec(const BackendOptions& options) {
  MLA_ASSIGN_OR_RETURN(
      const std::size_t bytes,
      resolve_workspace_bytes(options.chunked_workspace_bytes, kChunkedWorkspaceEnv,
                              kDefaultChunkedWorkspaceBytes));
  MLA_CHECK_CODE(StatusCode::kOutOfWorkspace, bytes > counter_bytes(options),
                 "workspace 'chunked_mla.workspace' has {} bytes, its counters alone need {}; "
                 "set {}",
                 bytes, counter_bytes(options), kChunkedWorkspaceEnv);
  return WorkspaceSpec{"chunked_mla.workspace", options.device, bytes,
                       WorkspacePolicy::kSharedZeroed, kChunkedWorkspaceEnv};
}

std::size_t ChunkedMlaBackend::counter_bytes(const BackendOptions& options) {
  return align_workspace(static_cast<std::size_t>(options.max_batch) *
                         static_cast<std::size_t>(options.model.num_heads) * sizeof(int32_t));
}

StatusOr<WorkspaceView> ChunkedMlaBackend::op_workspace(std::size_t, bool fell_back) {
  const SharedWorkspace& ws = on_fallback(fell_back) ? *fallback_->workspace_ : *workspace_;
  return WorkspaceView{ws.data(), ws.bytes(), ws.name(), ws.env_var()};
}

std::unique_lock<std::mutex> ChunkedMlaBackend::lock_op_workspace() {
  if (on_fallback(plan_.fell_back)) return fallback_->workspace_->lock_for_use();
  return workspace_ ? workspace_->lock_for_use() : std::unique_lock<std::mutex>();
}

// Counters at the start of the zeroed workspace: one int32 per (request, head) at max_batch.
// The ops get the bytes after them, so op scratch never touches the counters. The fallback's
// workspace has none.
std::size_t ChunkedMlaBackend::reserved_workspace_bytes(bool fell_back) const {
  if (on_fallback(fell_back)) return 0;
  return counter_bytes(options_);
}

ForwardMethod ChunkedMlaBackend::choose_forward_method(const ForwardBatch& batch) const {
  return planning::choose_forward_method(kExtendRule, method_options(options_), batch);
}

PlanDescription ChunkedMlaBackend::describe_plan() const {
  PlanDescription d = BackendBase::describe_plan();
  if (plan_.epoch != 0 && on_fallback(plan_.fell_back)) {
    d.details.insert(d.details.begin(), {"planned by", std::string(fallback_->name())});
  }
  return d;
}

Status ChunkedMlaBackend::init_forward_metadata(const ForwardBatch& batch) {
  PlanTimer timer(this);
  ++stats_.init_forward_metadata_calls;
  MLA_RETURN_IF_ERROR(validate(batch));
  // Decided once for the batch and kept in its plan, so an extend's fallback never leaks into
  // the next batch and no later call asks the rule again.
  const planning::BatchMethod d =
      planning::decide_batch_method(kExtendRule, method_options(options_), batch);
  if (d.fell_back && fallback_ == nullptr && !falls_back_locally()) {
    return internal_error(
        "chunked_mla: the batch falls back to paged_mla's absorbed prefill, but the paged_mla "
        "resources were not created (they are created at construction when "
        "disable_chunked_prefix_cache, piecewise_cuda_graph or batch_invariant is set)");
  }
  if (!d.fell_back) return plan_eager(batch, d.method, false, /*plan_chunks=*/true);
  ++stats_.fallbacks;
  const PlanningStats before = stats_;
  MLA_RETURN_IF_ERROR(plan_eager(batch, d.method, true, /*plan_chunks=*/false));
  if (fallback_ != nullptr) {
    PlanningStats& f = fallback_->stats_;
    ++f.init_forward_metadata_calls;
    f.absorbed_plans += stats_.absorbed_plans - before.absorbed_plans;
  }
  return Status::Ok();
}

Status ChunkedMlaBackend::init_mha_chunk_metadata(const ForwardBatch& batch, bool disable_ragged) {
  (void)disable_ragged;  // the parent's flag: its ragged pass is planned by init_forward_metadata
  ++stats_.mha_chunk_metadata_calls;
  // Seed requirement 2: the batch's plan says whether it fell back; outside a fallback there is
  // nothing to do (the chunks were planned by init_forward_metadata).
  if (plan_.epoch == 0 || !plan_.fell_back) {
    ++stats_.mha_chunk_metadata_skipped;
    return Status::Ok();
  }
  MLA_CHECK_ARG(batch.mode == plan_.mode && batch.batch_size == plan_.batch_size,
                "chunked_mla: init_mha_chunk_metadata got a {} batch of {} requests, but the "
                "batch planned last is a {} batch of {} (pass the batch init_forward_metadata "
                "planned)",
                forward_mode_name(batch.mode), batch.batch_size, forward_mode_name(plan_.mode),
                plan_.batch_size);
  if (fallback_ == nullptr) return Status::Ok();  // no parent planner: nothing to delegate to
  MLA_RETURN_IF_ERROR(validate(batch));
  PlanningStats& f = fallback_->stats_;
  ++f.mha_chunk_metadata_calls;
  const uint64_t chunks_before = stats_.chunks_planned;
  MLA_RETURN_IF_ERROR(plan_prefix_chunks(batch));
  ++f.mha_chunk_plans;
  f.chunks_planned += stats_.chunks_planned - chunks_before;
  return Status::Ok();
}

}  // namespace mla::backends
