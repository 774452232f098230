// ondemand_mla (the Tokenspeed role, derived from chunked_mla's role): chunked_mla's methods and
// fallback rule, but its own workspace, allocated on first use and grown only when a larger
// batch needs more: num_SMs * heads * max_q_len * (512 + 1) * 4 bytes of split-KV partials
// (o_latent + lse per split, f32). Neither parent's workspace is ever allocated for it: a
// fallback runs the absorbed form on its own workspace.
#pragma once

#include <memory>

#include "backends/chunked_mla/chunked_mla.h"

namespace mla::backends {

class OndemandMlaBackend : public ChunkedMlaBackend {
 public:
  static StatusOr<std::unique_ptr<OndemandMlaBackend>> create(const BackendContext& ctx);

  // num_SMs * heads * max_q_len * (512 + 1) * 4, num_SMs from device_runtime().
  std::size_t split_kv_bytes(int max_q_len) const;
  const GrowableBuffer& workspace() const { return workspace_; }

 protected:
  StatusOr<WorkspaceView> op_workspace(std::size_t needed) override;
  std::size_t reserved_workspace_bytes() const override { return 0; }
  std::size_t absorbed_op_workspace_bytes(const AttnCapacity& cap) const override;
  bool falls_back_locally() const override { return true; }

 private:
  OndemandMlaBackend(const BackendContext& ctx, const OpSet* ops, int num_sms)
      : ChunkedMlaBackend("ondemand_mla", ctx, ops),
        num_sms_(num_sms),
        workspace_("ondemand_mla.workspace", "ondemand_mla", ctx.options.device) {}
  int num_sms_;
  GrowableBuffer workspace_;
};

}  // namespace mla::backends
