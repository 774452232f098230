// The plan of one batch (SYSTEM.md 4): everything init_forward_metadata (or a graph capture or
// replay, or init_mha_chunk_metadata for the prefix chunks) decided and prepared for the batch,
// and everything the layer calls (forward_decode / forward_extend / save_kv_cache) read. A
// backend holds one BatchPlan, rebuilt in place for every batch: its vectors keep their
// capacity, so planning allocates nothing once warm. Nothing of a batch lives outside it.
//
// The decisions are made once per batch and stored here: the method and, for the chunked-prefix
// families, whether the batch takes the fallback (planning::decide_batch_method answers both).
// The buffers the device pointers point into belong to the backend (they outlive the batch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mla/batch.h"
#include "mla/forward_method.h"
#include "mla/ops.h"
#include "planning/chunked_prefix.h"

namespace mla::backends {

struct BatchPlan {
  // ---- decisions ----
  uint64_t epoch = 0;  // +1 per planned batch; 0 = nothing planned yet
  ForwardMode mode = ForwardMode::kDecode;
  ForwardMethod method = ForwardMethod::kAbsorbed;
  // chunked_mla / ondemand_mla (SYSTEM.md 5): the batch takes paged_mla's absorbed paged prefill.
  // Then `method` is kAbsorbed and the ops run on the fallback's resources (chunked_mla: the
  // shared paged_mla workspace created at construction; ondemand_mla: its own workspace).
  bool fell_back = false;

  // ---- the batch, lengths per mode resolved once (ForwardBatch::q_len / kv_len) ----
  int batch_size = 0;      // graph: padded
  int64_t num_tokens = 0;  // T, new tokens (graph: padded)
  int64_t kv_tokens = 0;   // sum of kv_len
  int max_q_len = 1;
  bool has_prefix = false;  // some request has kv_len > q_len
  // Host copies the planners read: the lengths per mode (resolve_lengths, mla/batch.h: the rule
  // the engine adapters share) and the batch's rows and slots.
  struct Host : BatchLengths {
    std::vector<int32_t> req_rows;
    std::vector<int32_t> out_cache_loc;  // graph: padded
    std::vector<int32_t> slots;          // one-shot gather list
    std::vector<std::byte> op_plan;      // an op's host plan before its upload
  } host;

  // ---- the MHA passes ----
  AttnCapacity mha_cap;  // the pass over the new tokens (one-shot: with the gathered prefix)
  // Prefix chunks of kMhaChunked with a prefix (SYSTEM.md 6): planned for this batch when
  // chunk_epoch == epoch (chunked_mla: by init_forward_metadata; paged_mla: by
  // init_mha_chunk_metadata).
  uint64_t chunk_epoch = 0;
  planning::ChunkedPrefixPlan chunks;
  std::vector<AttnCapacity> chunk_caps;         // [C]
  std::vector<std::size_t> chunk_plan_offsets;  // [C] into the uploaded chunk plans
  bool chunks_planned() const { return chunk_epoch == epoch; }

  // ---- device side: what the layer calls hand the ops ----
  const int32_t* out_cache_loc = nullptr;  // i32 [T]
  float* lse = nullptr;                    // f32 [T, H], used when the caller wants no lse
  const void* absorbed_plan = nullptr;     // the absorbed op's plan (eager or graph buffer)
  const void* mha_plan = nullptr;          // the MHA op's plan of the pass over the new tokens
  const std::byte* chunk_plans = nullptr;  // the MHA op's plans of the prefix chunks
  struct OpScratch {                       // carved from the workspace the plan's ops use
    void* op = nullptr;
    std::size_t op_bytes = 0;
    void* base = nullptr;  // the workspace the carve came from
  } op;
  struct KvRows {              // up-projected latent rows, carved from a backend buffer
    int32_t* slots = nullptr;  // [num slots] the rows' slots (when the plan uploads them)
    void* k = nullptr;         // bf16 [N, H, 192]
    void* v = nullptr;         // bf16 [N, H, 128]
    void* up_ws = nullptr;     // the up-projection's workspace
    std::size_t up_ws_bytes = 0;
  };
  // The backend up-projects every latent row an MHA pass reads (the one owner of the
  // up-projection; the layer only writes q):
  KvRows chunk;   // "<backend>.mha_chunk_kv": one prefix chunk's rows at a time (slots: every
                  // chunk's kv_indices), or the one-shot gather of prefix + new tokens
  KvRows new_kv;  // "<backend>.mha_new_kv": the new tokens' rows (slots: out_cache_loc), for an
                  // MHA pass without the one-shot gather when the caller brings no k, v
};

}  // namespace mla::backends
