// A backend family's per-batch planning over an engine's own pools (SGLang keeps the latent
// cache and req_to_token as its torch tensors; docs/design-decisions.md): the decisions the C++
// backends make for a batch over their own pool, made by the same functions, for the engine
// adapters (mla.Backend in Python, bound through torch.ops.mla.engine_*). Per batch, one call:
// the engine's host lengths are checked (check_engine_lengths) and resolved per mode
// (resolve_lengths, as BackendBase::collect), the method and the fallback are decided once
// (planning::decide_batch_method with the family's ExtendRule, as the backends'
// init_forward_metadata), and the plan holder the batch is planned into is picked: the CUDA-graph
// holder for absorbed decode / target-verify batches that fit it, else the eager one, grown by
// the family's capacity policy when the batch needs more; MHA batches the MHA holder. Holds no
// device memory: the holders are the caller's. Host vectors are reused, so a warm planner allocates
// nothing.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mla/backend.h"
#include "mla/ops.h"
#include "mla/workspace.h"

namespace mla {

// The static capacity a CUDA graph's absorbed plan is sized for (BackendBase's graph state and
// the adapters' graph holder): max_bs requests, max_num_tokens tokens, q_len up to
// ceil(max_num_tokens / max_bs).
AttnCapacity graph_capacity(int max_bs, int64_t max_num_tokens, int num_heads,
                            bool batch_invariant);

// The chunked-prefix planner (SYSTEM.md 6, the one the C++ backends plan their prefix chunks
// with): len[c, b] of every chunk into *lens ([C, bs], row-major); returns C (0 without a
// prefix). kInvalidArgument as plan_chunked_prefix (capacity below the batch size, ...).
StatusOr<int> prefix_chunk_lens(std::span<const int32_t> prefix_lens, int64_t capacity,
                                std::vector<int32_t>* lens);

// One batch as an engine keeps it on the host (spans over its host mirrors).
struct EngineBatch {
  ForwardMode mode = ForwardMode::kDecode;
  std::span<const int32_t> req_rows;            // [bs] rows of req_to_token
  std::span<const int32_t> seq_lens;            // [bs] as ForwardBatch::seq_lens
  std::span<const int32_t> extend_seq_lens;     // [bs] extend modes
  std::span<const int32_t> extend_prefix_lens;  // [bs] extend modes (optional: checked when given)
  int32_t num_draft_tokens = 0;                 // target_verify
  int32_t kv_extra = 0;                         // draft step i of a chain decode: i + 1
};

// The form of a batch in the adapters' vocabulary (SGLang's AttnForwardMethod): an MHA batch
// without a cached prefix is one ragged causal pass; with one, the engine gathers the prefix
// chunks and the backend merges one pass per chunk. The adapters have no one-shot form.
enum class EngineMethod : uint8_t { kAbsorbed, kMha, kMhaChunked };
std::string_view engine_method_name(EngineMethod m);  // "absorbed", "mha", "mha_chunked"

// Where the batch's absorbed plan goes.
enum class PlanTarget : uint8_t {
  kNone,       // nothing to plan with the absorbed op (idle, no tokens, or an MHA batch)
  kEager,      // the eager holder holds it
  kGraph,      // the CUDA-graph holder (decode / target_verify within its capacity)
  kGrowEager,  // the eager holder is missing or too small: build one of `capacity`, plan again
  kMha,        // an MHA batch: the ragged causal pass over the new tokens in the MHA holder
  kGrowMha,    // the MHA holder is missing or too small: build one of `capacity`, plan again
};

struct EngineDecision {
  EngineMethod method = EngineMethod::kAbsorbed;
  bool fell_back = false;  // chunked_mla / ondemand_mla: paged_mla's absorbed prefill
  BatchShape shape;
  PlanTarget target = PlanTarget::kNone;
  AttnCapacity capacity;  // the holder's (kEager, kGraph, kMha) or the one to build (kGrow*)
};

// The workspace a family's ops run in, as its C++ backend has it (the families' workspace table,
// docs/architecture.md), for an adapter that runs the ops on buffers of its own (mla.Backend):
//   paged_mla     kSharedLazy "paged_mla.workspace" of `bytes`, one per device, shared;
//   chunked_mla   kSharedZeroed "chunked_mla.workspace" of `bytes` whose first `reserved` bytes
//                 (the counters) the ops never touch; a batch that falls back runs in the
//                 paged_mla.workspace of `fallback_bytes` (> 0 iff a fallback is possible);
//   ondemand_mla  kOnDemand "ondemand_mla.workspace": bytes 0, sized by what its ops need, grown
//                 only when a batch needs more (its fallback too).
// The sizes are the backends' own (PagedMlaBackend / ChunkedMlaBackend::workspace_spec).
struct FamilyWorkspace {
  WorkspacePolicy policy = WorkspacePolicy::kOnDemand;
  std::size_t bytes = 0;
  std::size_t reserved = 0;
  std::size_t fallback_bytes = 0;
};
// kInvalidArgument for an unknown family or a malformed size variable, kOutOfWorkspace for a
// chunked_mla workspace its counters fill (as the backends' construction).
StatusOr<FamilyWorkspace> family_workspace(std::string_view family, const BackendOptions& options);

class EnginePlanner {
 public:
  // options: model.num_heads, max_batch, max_q_len, mha_prefix_threshold,
  // disable_chunked_prefix_cache, piecewise_cuda_graph, batch_invariant.
  // max_extend_tokens: the new tokens of an MHA batch the MHA holder is first sized for.
  static StatusOr<EnginePlanner> create(std::string_view family, const BackendOptions& options,
                                        int64_t max_extend_tokens = 8192);

  std::string_view family() const { return family_; }
  int num_heads() const { return options_.model.num_heads; }
  // The eager holder a backend builds at construction (paged_mla, chunked_mla: the capacity of
  // max_batch requests of max_q_len tokens), or none (ondemand_mla: max_batch 0, first use).
  AttnCapacity initial_eager_capacity() const;
  // The holders the caller has (max_batch 0: none). Planning picks among them.
  void set_eager_capacity(const AttnCapacity& cap) { eager_ = cap; }
  void set_graph_capacity(const AttnCapacity& cap) { graph_ = cap; }
  void set_mha_capacity(const AttnCapacity& cap) { mha_ = cap; }
  const AttnCapacity& graph_capacity() const { return graph_; }
  // The family's workspace for the planner's options (family_workspace).
  StatusOr<FamilyWorkspace> workspace() const { return family_workspace(family_, options_); }

  // Checks and decides one batch (see the file comment); the lengths are kept (lengths()).
  // Writes nothing of the decision on error.
  Status plan(const EngineBatch& batch, EngineDecision* out);
  // The prefix chunks of the MHA-chunked batch last planned, as the engine gathers them: cu
  // [num_chunks, bs + 1] row-major, per chunk the cumulative keys per request. They must cover
  // every request's cached prefix exactly (each row starts at 0 and never decreases, and the
  // chunks of request b add up to its prefix length): kInvalidArgument naming the chunk, the
  // request and the lengths otherwise. *caps gets each chunk's non-causal MHA capacity.
  Status check_prefix_chunks(std::span<const int32_t> cu, int num_chunks,
                             std::vector<AttnCapacity>* caps) const;
  // The capacity of a prefix-chunk holder that has `held` and must take `needed`: never shrunk.
  static AttnCapacity grown_chunk(const AttnCapacity& held, const AttnCapacity& needed);
  // The per-mode lengths of the batch last planned (req_rows: its rows).
  const BatchLengths& lengths() const { return lengths_; }

 private:
  EnginePlanner(std::string family, bool threshold_rule, const BackendOptions& options)
      : family_(std::move(family)), threshold_rule_(threshold_rule), options_(options) {}
  bool fits(const AttnCapacity& cap, const BatchShape& s) const;
  AttnCapacity grown(const BatchShape& s) const;
  AttnCapacity grown_mha(const BatchShape& s) const;

  std::string family_;
  bool threshold_rule_;  // the family's ExtendRule is kPrefixThreshold (paged_mla)
  BackendOptions options_;
  int64_t max_extend_tokens_ = 0;
  AttnCapacity eager_, graph_, mha_;
  BatchLengths lengths_;
};

}  // namespace mla
