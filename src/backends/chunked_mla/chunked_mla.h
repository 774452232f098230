// chunked_mla (the TRT-LLM-MLA role, derived from paged_mla's role): its own absorbed decode
// path, the chunked-prefix MHA form for every extend (planned inside init_forward_metadata), and
// its own process-global zero-initialised workspace. Falls back to paged_mla's absorbed paged
// prefill when planning::should_fall_back() says so; the paged_mla resources that fallback needs
// are created at construction when the configuration makes a fallback possible, never otherwise
// and never lazily.
#pragma once

#include <memory>

#include "backends/backend_base.h"
#include "backends/paged_mla/paged_mla.h"
#include "planning/forward_method.h"

namespace mla::backends {

// Default size of the zeroed chunked workspace: the counters region (one int32 per request and
// head at max_batch 256 x 128 heads = 128 KiB) plus the op scratch, sized like paged_mla's
// (34.7 MB of split-KV partials on a 132-SM H200 at 128 heads, q_len 1).
inline constexpr std::size_t kDefaultChunkedWorkspaceBytes = 40u << 20;

class ChunkedMlaBackend : public BackendBase {
 public:
  // How it (and ondemand_mla) computes plain extends; family_forward_method reads it.
  static constexpr planning::ExtendRule kExtendRule = planning::ExtendRule::kChunkedUnlessFallback;
  // kAuto: create the paged_mla fallback resources iff a fallback is possible. kNever: tests
  // only, to prove the backend copes with an absent parent planner.
  enum class ParentPolicy : uint8_t { kAuto, kNever };
  static StatusOr<std::unique_ptr<ChunkedMlaBackend>> create(
      const BackendContext& ctx, ParentPolicy parent = ParentPolicy::kAuto);

  Status init_forward_metadata(const ForwardBatch& batch) override;
  // Does nothing unless the batch falls back; then delegates to the parent planner if it
  // exists. disable_ragged is the parent's flag: passed through, otherwise ignored.
  Status init_mha_chunk_metadata(const ForwardBatch& batch, bool disable_ragged = false) override;
  ForwardMethod choose_forward_method(const ForwardBatch& batch) const override;
  ForwardMethod forward_method() const override;
  bool fell_back() const override { return fell_back_; }
  // The parent's plan when the batch was delegated to it, else the own.
  PlanDescription describe_plan() const override;

  Status forward_extend(const AttentionInputs& in, const AttentionOutputs& out,
                        const ExecContext& ctx) override;
  Status save_kv_cache(int layer, const TensorView& c_kv, const TensorView& k_pe,
                       const ExecContext& ctx) override;
  TensorView out_cache_loc() const override;
  Status init_cuda_graph_state(int max_bs, int64_t max_num_tokens) override;
  void set_stream(void* stream) override {
    BackendBase::set_stream(stream);
    if (parent_) parent_->set_stream(stream);
  }

  // The paged_mla instance serving the fallback, or nullptr.
  const PagedMlaBackend* parent() const { return parent_.get(); }

 protected:
  ChunkedMlaBackend(std::string name, const BackendContext& ctx, const OpSet* ops)
      : BackendBase(std::move(name), ctx, ops) {}
  StatusOr<WorkspaceView> op_workspace(std::size_t needed) override;
  std::unique_lock<std::mutex> lock_op_workspace() override {
    return workspace_ ? workspace_->lock_for_use() : std::unique_lock<std::mutex>();
  }
  std::size_t reserved_workspace_bytes() const override;
  // ondemand_mla runs its fallback on its own absorbed path instead of a paged_mla parent.
  virtual bool falls_back_locally() const { return false; }

  std::unique_ptr<PagedMlaBackend> parent_;

 private:
  bool delegated() const { return fell_back_ && parent_ != nullptr; }
  std::shared_ptr<SharedWorkspace> workspace_;
};

}  // namespace mla::backends
