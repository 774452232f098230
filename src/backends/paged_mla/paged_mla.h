// paged_mla (the FlashInfer-MLA role, the parent): absorbed form for every mode over the paged
// latent cache read through req_to_token; MHA for extends without prefix (ragged, causal) and,
// with the chunked prefix cache enabled, for long prefixes (one-shot or chunked). Its ops run in
// one process-global, lazily created, not-zeroed workspace per device shared by every paged_mla
// instance (target and draft included). The prefix chunks are planned in init_mha_chunk_metadata.
#pragma once

#include <memory>

#include "backends/backend_base.h"

namespace mla::backends {

// Default size of the shared paged workspace. It holds the op scratch of one batch: the
// absorbed op's split-KV partials (an H200 with 132 SMs and 128 heads needs
// 132 * 128 * 513 * 4 B = 34.7 MB at q_len 1, less with fewer heads) or the MHA op's scratch.
// 40 MiB covers that and keeps the issue-4 budget (<= 64 MiB outside the KV pool at 128 heads,
// batch 256, q_len 2, graphs captured: plans and index buffers add < 2 MiB).
inline constexpr std::size_t kDefaultPagedWorkspaceBytes = 40u << 20;

class PagedMlaBackend : public BackendBase {
 public:
  // How it computes plain extends (planning/forward_method.h); family_forward_method reads it.
  static constexpr planning::ExtendRule kExtendRule = planning::ExtendRule::kPrefixThreshold;
  // `instance_name` names the instance's own buffers ("paged_mla.absorbed_plan"); the workspace
  // is always the shared "paged_mla.workspace".
  static StatusOr<std::unique_ptr<PagedMlaBackend>> create(const BackendContext& ctx,
                                                           std::string instance_name = "paged_mla");

  Status init_forward_metadata(const ForwardBatch& batch) override;
  // The parent planner: plans the prefix chunks of `batch` (the ragged pass over the new tokens
  // is planned by init_forward_metadata, so disable_ragged has nothing to skip here).
  Status init_mha_chunk_metadata(const ForwardBatch& batch, bool disable_ragged = false) override;
  ForwardMethod choose_forward_method(const ForwardBatch& batch) const override;

  const SharedWorkspace& workspace() const { return *workspace_; }
  // The shared "paged_mla.workspace" of `options.device` (created by its first user, sized by
  // options.paged_workspace_bytes, MLA_PAGED_WORKSPACE_BYTES or the default), held for `user`:
  // every paged_mla instance's, and chunked_mla's fallback's.
  static StatusOr<std::shared_ptr<SharedWorkspace>> acquire_workspace(const BackendOptions& options,
                                                                      std::string_view user);
  // What acquire_workspace asks the registry for (its size resolved; a malformed environment
  // value is kInvalidArgument): also what mla.Backend's paged_mla workspace is (family_workspace).
  static StatusOr<WorkspaceSpec> workspace_spec(const BackendOptions& options);

 protected:
  StatusOr<WorkspaceView> op_workspace(std::size_t needed, bool fell_back) override;
  std::unique_lock<std::mutex> lock_op_workspace() override {
    return workspace_ ? workspace_->lock_for_use() : std::unique_lock<std::mutex>();
  }

 private:
  PagedMlaBackend(std::string name, const BackendContext& ctx, const OpSet* ops)
      : BackendBase(std::move(name), ctx, ops) {}
  std::shared_ptr<SharedWorkspace> workspace_;
};

}  // namespace mla::backends
