// chunked_mla (the TRT-LLM-MLA role, derived from paged_mla's role): its own absorbed decode
// path, the chunked-prefix MHA form for every extend (planned inside init_forward_metadata), and
// its own process-global zero-initialised workspace. A batch for which
// planning::decide_batch_method says so falls back to paged_mla's absorbed paged prefill: the
// decision is a field of the batch's plan (BatchPlan::fell_back), and the batch is planned into
// that plan like any other, its ops running in the fallback's resources (PagedFallback below:
// paged_mla's shared workspace). Those resources are created at construction when the
// configuration makes a fallback possible, never otherwise and never lazily.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "backends/backend_base.h"
#include "backends/paged_mla/paged_mla.h"
#include "planning/forward_method.h"

namespace mla::backends {

// Default size of the zeroed chunked workspace: the counters region (one int32 per request and
// head at max_batch 256 x 128 heads = 128 KiB) plus the op scratch, sized like paged_mla's
// (34.7 MB of split-KV partials on a 132-SM H200 at 128 heads, q_len 1).
inline constexpr std::size_t kDefaultChunkedWorkspaceBytes = 40u << 20;

// What chunked_mla's fallback runs on (SYSTEM.md 5, seed requirement 1): the parent's resources,
// i.e. the shared not-zeroed "paged_mla.workspace" (the fallback's absorbed kernels write
// partials there, never into the zeroed workspace), held under the name "chunked_mla.fallback",
// and the parent planner's counters. Not a backend: it plans nothing and holds no batch.
class PagedFallback {
 public:
  static StatusOr<std::unique_ptr<PagedFallback>> create(const BackendOptions& options,
                                                         std::string name);
  std::string_view name() const { return name_; }
  const SharedWorkspace& workspace() const { return *workspace_; }
  // The planning done for batches that fell back (their plans' absorbed and MHA passes) and the
  // parent planner's prefix chunks (init_mha_chunk_metadata of such a batch). The backend's own
  // planning_stats() count the same work too: the plans are its own.
  const PlanningStats& planning_stats() const { return stats_; }

 private:
  friend class ChunkedMlaBackend;
  explicit PagedFallback(std::string name) : name_(std::move(name)) {}
  std::string name_;
  std::shared_ptr<SharedWorkspace> workspace_;
  PlanningStats stats_;
};

class ChunkedMlaBackend : public BackendBase {
 public:
  // How it (and ondemand_mla) computes plain extends; family_forward_method reads it.
  static constexpr planning::ExtendRule kExtendRule = planning::ExtendRule::kChunkedUnlessFallback;
  // kAuto: create the fallback's resources iff a fallback is possible. kNever: tests only, to
  // prove the backend copes with an absent parent planner.
  enum class ParentPolicy : uint8_t { kAuto, kNever };
  static StatusOr<std::unique_ptr<ChunkedMlaBackend>> create(
      const BackendContext& ctx, ParentPolicy parent = ParentPolicy::kAuto);
  // The zeroed "chunked_mla.workspace" it acquires (size resolved: options.
  // chunked_workspace_bytes, MLA_CHUNKED_WORKSPACE_BYTES or the default; kOutOfWorkspace when
  // that leaves no byte after the counters): also mla.Backend's chunked_mla workspace.
  static StatusOr<WorkspaceSpec> workspace_spec(const BackendOptions& options);
  // The counters at the start of that workspace (one int32 per request and head at max_batch,
  // aligned), which the ops never touch.
  static std::size_t counter_bytes(const BackendOptions& options);

  // Decides the batch's method and fallback once (planning::decide_batch_method) and plans it.
  Status init_forward_metadata(const ForwardBatch& batch) override;
  // Does nothing unless the planned batch fell back (its plan says so); then, if the parent
  // planner's resources exist, plans the batch's prefix chunks as the parent's planner would.
  // disable_ragged is the parent's flag: accepted, otherwise ignored. `batch` must be the batch
  // init_forward_metadata planned (kInvalidArgument otherwise, for a batch that fell back).
  Status init_mha_chunk_metadata(const ForwardBatch& batch, bool disable_ragged = false) override;
  ForwardMethod choose_forward_method(const ForwardBatch& batch) const override;
  // The plan's description, naming the fallback when the batch took it.
  PlanDescription describe_plan() const override;

  // The fallback's resources (paged_mla's role as the parent), or nullptr when the
  // configuration cannot fall back (or ParentPolicy::kNever, or ondemand_mla).
  const PagedFallback* parent() const { return fallback_.get(); }

 protected:
  ChunkedMlaBackend(std::string name, const BackendContext& ctx, const OpSet* ops)
      : BackendBase(std::move(name), ctx, ops) {}
  StatusOr<WorkspaceView> op_workspace(std::size_t needed, bool fell_back) override;
  std::unique_lock<std::mutex> lock_op_workspace() override;
  std::size_t reserved_workspace_bytes(bool fell_back) const override;
  // ondemand_mla runs its fallback on its own workspace: it needs no PagedFallback.
  virtual bool falls_back_locally() const { return false; }

 private:
  // Whether the plan's ops run in the fallback's workspace.
  bool on_fallback(bool fell_back) const { return fell_back && fallback_ != nullptr; }
  std::shared_ptr<SharedWorkspace> workspace_;
  std::unique_ptr<PagedFallback> fallback_;
};

}  // namespace mla::backends
