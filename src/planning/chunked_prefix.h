// The chunked-prefix planner (SYSTEM.md 6): splits every request's cached prefix into chunks so
// that one chunk holds at most `capacity` tokens across the batch. Pure host function over host
// data; the output vectors are reused across calls (no allocation once warm).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mla/status.h"

namespace mla::planning {

struct ChunkedPrefixPlan {
  int batch_size = 0;
  int64_t capacity = 0;              // tokens per chunk across the batch
  int64_t chunk_len = 0;             // L = capacity / batch_size (floor)
  int num_chunks = 0;                // C = ceil(max prefix / L); 0 without a prefix
  std::vector<int32_t> lens;         // [C, bs]  len[c, b]
  std::vector<int32_t> cu_len;       // [C, bs + 1]  per chunk [0, cumsum_b len[c, b]]
  std::vector<int32_t> max_len;      // [C]
  std::vector<int64_t> num_tokens;   // [C]  = cu_len[c, bs]
  std::vector<uint8_t> has_zero_kv;  // [C]  some request has len 0 in chunk c
  std::vector<int64_t> kv_offsets;   // [C + 1]  chunk c's slots: kv_indices[kv_offsets[c] ..)
  std::vector<int32_t> kv_indices;   // [sum of num_tokens]  slots, filled by fill_chunk_kv_indices

  int64_t start(int c) const { return c * chunk_len; }  // start[c, b], the same for every b
  int32_t len(int c, int b) const { return lens[static_cast<std::size_t>(c) * batch_size + b]; }
  std::span<const int32_t> chunk_cu_len(int c) const {
    return {cu_len.data() + static_cast<std::size_t>(c) * (batch_size + 1),
            static_cast<std::size_t>(batch_size) + 1};
  }
};

// Most chunk entries (chunks x batch size) a plan may hold: 4M, ~100 MB of plan arrays.
inline constexpr int64_t kMaxChunkPlanEntries = int64_t{1} << 22;

// Lengths only: L, C, len, cu_len, max_len, num_tokens, has_zero_kv, kv_offsets.
//   L = capacity / bs; C = ceil(max_b prefix[b] / L) (0 when no prefix)
//   len[c, b] = max(min(prefix[b], c*L + L) - c*L, 0)
// kInvalidArgument when capacity < batch size (L would be 0), a prefix is negative, or the plan
// would hold more than kMaxChunkPlanEntries chunk entries. Writes nothing on error.
Status plan_chunked_prefix(std::span<const int32_t> prefix_lens, int64_t capacity,
                           ChunkedPrefixPlan* plan);

// kv_indices[c] = concat_b req_to_token[req_rows[b], start[c] : start[c] + len[c, b]], read from
// the host copy of req_to_token ([rows, row_stride]) through page_size (ops.h slot_of_token).
Status fill_chunk_kv_indices(std::span<const int32_t> req_rows,
                             std::span<const int32_t> req_to_token_host, int64_t row_stride,
                             int page_size, ChunkedPrefixPlan* plan);

}  // namespace mla::planning
