// ondemand_mla (the Tokenspeed role, derived from chunked_mla's role): chunked_mla's methods and
// fallback rule, but its own workspace, allocated on first use and grown only when a larger
// batch needs more. Neither parent's workspace is ever allocated for it: a fallback runs the
// absorbed form on its own workspace.
//
// Size: what the ops report for the batch (for the absorbed op, its split-KV partials), not
// SYSTEM.md's `num_SMs * heads * max_q_len * (512 + 1) * 4`. That formula assumes one partial of
// heads x q_len rows per SM; at 128 heads and q_len 2 it is 69.3 MB, which alone breaks issue 4's
// budget (<= 64 MiB outside the KV pool, q_len up to 2, graphs captured), and the issue wins over
// SYSTEM.md. The CUDA absorbed op cuts rows into 64-row tiles with at most 2 partials per SM:
// 2 * num_SMs * 64 * 513 * 4 B = 34.7 MB on 132 SMs for any head count and q_len (the formula's
// value at heads x q_len = 128). See docs/design-decisions.md.
#pragma once

#include <memory>

#include "backends/chunked_mla/chunked_mla.h"

namespace mla::backends {

class OndemandMlaBackend : public ChunkedMlaBackend {
 public:
  static StatusOr<std::unique_ptr<OndemandMlaBackend>> create(const BackendContext& ctx);

  const GrowableBuffer& workspace() const { return workspace_; }

 protected:
  // Fallback batches too: their plans run on this workspace.
  StatusOr<WorkspaceView> op_workspace(std::size_t needed, bool fell_back) override;
  std::size_t reserved_workspace_bytes(bool) const override { return 0; }
  bool falls_back_locally() const override { return true; }

 private:
  OndemandMlaBackend(const BackendContext& ctx, const OpSet* ops)
      : ChunkedMlaBackend("ondemand_mla", ctx, ops),
        workspace_("ondemand_mla.workspace", "ondemand_mla", ctx.options.device) {}
  GrowableBuffer workspace_;
};

}  // namespace mla::backends
