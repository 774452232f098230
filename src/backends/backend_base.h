// The machinery the three backend families share: per-batch host planning into one BatchPlan
// (batch_plan.h), one upload into accounted device buffers, the absorbed path, the MHA paths
// (ragged, one-shot, chunked prefix), the kv write and the static graph buffers. Families decide
// which workspace backs the ops (op_workspace), which method a batch uses (and whether it falls
// back) and when chunks are planned.
// Device-agnostic: everything goes through the OpSet and the DeviceRuntime.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "backends/batch_plan.h"
#include "mla/backend.h"
#include "mla/upload_staging.h"
#include "mla/workspace.h"
#include "planning/forward_method.h"

namespace mla::backends {

// A window of a workspace handed to the ops.
struct WorkspaceView {
  void* data = nullptr;
  std::size_t bytes = 0;
  std::string_view name;     // "paged_mla.workspace"
  std::string_view env_var;  // the variable that sizes it ("" for on-demand)
};

// The options the forward-method rules read (planning/forward_method.h).
inline planning::MethodOptions method_options(const BackendOptions& o) {
  planning::MethodOptions m;
  m.disable_chunked_prefix_cache = o.disable_chunked_prefix_cache;
  m.piecewise_cuda_graph = o.piecewise_cuda_graph;
  m.batch_invariant = o.batch_invariant;
  m.mha_prefix_threshold = o.mha_prefix_threshold;
  m.chunked_prefix_capacity = o.chunked_prefix_capacity;
  return m;
}

// The ExtendRule of a registered family (paged_mla, chunked_mla, ondemand_mla): the one map from
// name to rule (family_forward_method and EnginePlanner read it). kInvalidArgument naming the
// name otherwise.
StatusOr<planning::ExtendRule> family_extend_rule(std::string_view family);

class BackendBase : public AttentionBackend {
 public:
  // Up-projected rows per MHA pass: the largest N <= options.chunked_prefix_capacity whose k, v,
  // up-projection scratch and slot list fit options.mha_chunk_kv_budget_bytes (0 when not even
  // one does). A chunked batch gets fewer: what its slot list and per-new-token partials leave.
  static int64_t chunk_capacity(const BackendOptions& options, const OpSet* ops);
  // Bytes of `rows` up-projected rows in mha_chunk_kv: k, v, up-projection scratch (+ slots).
  static std::size_t chunk_rows_bytes(int64_t rows, int num_heads, const OpSet* ops,
                                      bool with_slots);
  static int64_t rows_within(std::size_t budget, int64_t max_rows, int num_heads, const OpSet* ops,
                             bool with_slots);

  std::string_view name() const override { return name_; }
  const BackendOptions& options() const override { return options_; }
  ForwardMethod forward_method() const override { return plan_.method; }
  bool fell_back() const override { return plan_.fell_back; }
  PlanDescription describe_plan() const override;
  const PlanningStats& planning_stats() const override { return stats_; }
  LatentKvPool* pool() const override { return pool_; }
  double median_plan_ns() const override;

  Status forward_decode(const AttentionInputs& in, const AttentionOutputs& out,
                        const ExecContext& ctx) override;
  Status forward_extend(const AttentionInputs& in, const AttentionOutputs& out,
                        const ExecContext& ctx) override;
  Status save_kv_cache(int layer, const TensorView& c_kv, const TensorView& k_pe,
                       const ExecContext& ctx) override;
  TensorView out_cache_loc() const override;

  Status init_cuda_graph_state(int max_bs, int64_t max_num_tokens) override;
  Status init_forward_metadata_capture_cuda_graph(const ForwardBatch& padded_batch) override;
  Status init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch, int padded_bs) override;

  void set_stream(void* stream) override {
    stream_ = stream;
    pool_->set_stream(stream);
  }
  void* stream() const { return stream_; }
  const UploadStaging& staging() const { return staging_; }

  const OpSet& ops() const { return *ops_; }
  bool graph_ready() const { return graph_ready_; }
  // The plan of the batch last planned: what the layer calls read.
  const BatchPlan& plan() const { return plan_; }

 protected:
  BackendBase(std::string name, const BackendContext& ctx, const OpSet* ops);
  // Checks the context (pool, model, op set) shared by every family.
  static StatusOr<const OpSet*> resolve_ops(const BackendContext& ctx, std::string_view who);

  // The workspace the ops of a batch use (`fell_back`: of a batch that took the fallback,
  // BatchPlan::fell_back): at least `needed` bytes (kOutOfWorkspace otherwise, or grown for
  // on-demand families).
  virtual StatusOr<WorkspaceView> op_workspace(std::size_t needed, bool fell_back) = 0;
  // Exclusive use of the shared workspace of the plan's ops while a layer's ops run (empty for
  // owned workspaces).
  virtual std::unique_lock<std::mutex> lock_op_workspace() { return {}; }
  // Bytes at the start of that workspace that the ops never touch (chunked_mla's counters).
  virtual std::size_t reserved_workspace_bytes(bool fell_back) const {
    (void)fell_back;
    return 0;
  }
  // Scratch the absorbed op gets for a capacity (ondemand_mla sizes its split-KV partials).
  virtual std::size_t absorbed_op_workspace_bytes(const AttnCapacity& cap) const;

  // Validates the batch against the pool (writes nothing on error).
  Status validate(const ForwardBatch& batch) const;
  // Eager planning of a validated batch into a new plan for `method` (and the fallback flag,
  // both decided by the caller once for the batch) in the growable buffers. Chunked MHA also
  // plans the prefix chunks when plan_chunks is set (else init_mha_chunk_metadata does).
  Status plan_eager(const ForwardBatch& batch, ForwardMethod method, bool fell_back,
                    bool plan_chunks);
  // The chunked-prefix planner, into the plan of the batch last planned by plan_eager.
  Status plan_prefix_chunks(const ForwardBatch& batch);

  // Timing and counting around a planning call.
  class PlanTimer {
   public:
    explicit PlanTimer(BackendBase* b) : b_(b), t0_(std::chrono::steady_clock::now()) {}
    ~PlanTimer();

   private:
    BackendBase* b_;
    std::chrono::steady_clock::time_point t0_;
  };

  std::string name_;
  BackendOptions options_;
  LatentKvPool* pool_ = nullptr;
  const OpSet* ops_ = nullptr;
  PlanningStats stats_;
  BatchPlan plan_;  // of the batch last planned (rebuilt in place per batch)

 private:
  using KvRows = BatchPlan::KvRows;
  Status collect(const ForwardBatch& batch);  // the plan's batch fields from the batch
  // Op scratch of `op_bytes` from the workspace op_workspace(.., fell_back) gives.
  StatusOr<BatchPlan::OpScratch> layout_op_scratch(std::size_t op_bytes, bool fell_back);
  // KvRows for `kv_rows` rows (and a slot list of num_slots) carved from `buffer`.
  Status layout_kv_rows(GrowableBuffer& buffer, int64_t num_slots, int64_t kv_rows, KvRows* rows);
  // What mha_chunk_kv (and mha_new_kv, without slots) holds: a slot list, up-projected k / v rows
  // and the up-projection's workspace.
  struct ChunkCarves {
    int num_heads = 0;
    int64_t num_slots = 0;
    int64_t kv_rows = 0;
    std::size_t up_bytes = 0;
  };
  static void carve_kv_rows(WorkspaceCarver& c, const ChunkCarves& n, KvRows* s);
  static std::size_t chunk_carves_bytes(const ChunkCarves& n);
  Status upload(void* dst, const void* src, std::size_t bytes);
  Status plan_absorbed(const AttnCapacity& cap, GrowableBuffer* eager_plan, void* graph_plan);
  Status plan_mha_main(ForwardMethod method);
  Status plan_mha_chunks();
  StatusOr<TensorView> lse_view(const AttentionOutputs& out, int64_t tokens) const;
  Status run_absorbed(const AttentionInputs& in, const AttentionOutputs& out,
                      const ExecContext& ctx);
  Status run_mha(const AttentionInputs& in, const AttentionOutputs& out, const ExecContext& ctx);
  // Up-projects the latent rows of `slots` [n] of in.layer into rows.k / rows.v.
  Status run_up_project(const AttentionInputs& in, const KvRows& rows, const int32_t* slots,
                        int64_t n, const ExecContext& ctx);
  Status plan_graph(const ForwardBatch& batch, int padded_bs);
  void record_plan_ns(uint64_t ns);

  void* stream_ = nullptr;         // uploads are ordered on it (set_stream)
  UploadStaging staging_;          // "<name>.upload_staging[0|1]"  pinned host
  GrowableBuffer absorbed_plan_;   // "<name>.absorbed_plan"  plan_bytes(batch)
  GrowableBuffer mha_plan_;        // "<name>.mha_plan"  ragged / one-shot plan
  GrowableBuffer mha_chunk_plan_;  // "<name>.mha_chunk_plan"  one plan per prefix chunk
  GrowableBuffer indices_;         // "<name>.out_cache_loc"  i32 [T]
  GrowableBuffer mha_chunk_kv_;    // "<name>.mha_chunk_kv"  KvRows of a prefix chunk / one-shot
  GrowableBuffer mha_new_kv_;      // "<name>.mha_new_kv"  KvRows of the new tokens
  GrowableBuffer lse_;             // "<name>.lse"  f32 [T, H] when the caller wants no lse

  // Static graph state (init_cuda_graph_state): never reallocated by capture or replay.
  bool graph_ready_ = false;
  AttnCapacity graph_cap_;
  DeviceBuffer graph_plan_;           // "<name>.graph.absorbed_plan"  plan_bytes(graph cap)
  DeviceBuffer graph_out_cache_loc_;  // "<name>.graph.out_cache_loc"  i32 [max tokens]
  DeviceBuffer graph_lse_;            // "<name>.graph.lse"  f32 [max tokens, H]
  void* graph_workspace_base_ = nullptr;

  std::array<uint32_t, 256> plan_ns_ring_{};
  uint64_t plan_ns_count_ = 0;
  mutable std::vector<uint32_t> median_scratch_;
};

}  // namespace mla::backends
