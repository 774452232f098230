// Forward batches (SYSTEM.md section 3) and their validation.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "mla/status.h"

namespace mla {

enum class ForwardMode : uint8_t {
  kDecode,        // one new token per request; seq_lens include it
  kExtend,        // prefill, maybe with a cached prefix; seq_lens = prefix + extend
  kMixed,         // extend and decode requests together (decode rows: extend_seq_len 1)
  kTargetVerify,  // each request scores num_draft_tokens drafts; seq_lens EXCLUDE the drafts
  kDraftExtend,   // draft model extends by a variable number of accepted tokens per request
  kIdle,          // no tokens
};
std::string_view forward_mode_name(ForwardMode m);
bool parse_forward_mode(std::string_view s, ForwardMode* out);
inline bool is_extend_like(ForwardMode m) {  // layers call forward_extend for these
  return m == ForwardMode::kExtend || m == ForwardMode::kMixed || m == ForwardMode::kTargetVerify ||
         m == ForwardMode::kDraftExtend;
}

// Host view of one forward batch. All vectors are host data: planning never reads device memory.
struct ForwardBatch {
  ForwardMode mode = ForwardMode::kDecode;
  int batch_size = 0;
  std::vector<int32_t> req_pool_indices;    // [bs] row of req_to_token (row 0 = padding row)
  std::vector<int32_t> seq_lens;            // [bs] see ForwardMode for what it counts
  std::vector<int32_t> extend_prefix_lens;  // [bs] extend/mixed/draft-extend; empty for decode
  std::vector<int32_t> extend_seq_lens;     // [bs] new tokens per request; empty for decode
  std::vector<int32_t> out_cache_loc;       // [num_tokens] slot written for each new token
  int num_draft_tokens = 0;                 // target-verify only
  int64_t seq_lens_sum = 0;                 // sum(seq_lens), as the engine passes it

  // Derived per-request lengths, valid once validate() passed.
  int32_t q_len(int b) const;   // new (query) tokens of request b
  int32_t kv_len(int b) const;  // keys request b attends to (prefix + new)
  int64_t num_tokens() const;   // sum of q_len
  bool has_prefix() const;      // any request with a cached prefix (extend-like modes)
};

// What the batch is checked against.
struct BatchLimits {
  int max_requests = 0;     // req_to_token has max_requests + 1 rows
  int max_context_len = 0;  // columns of req_to_token
  int64_t num_slots = 0;    // rows of the latent cache, dummy page included
  int page_size = 1;
  int max_draft_tokens = 8;
};

// Rejects every malformed field with kInvalidArgument naming the field and the values:
// batch_size vs vector sizes, negative lengths, seq_len below prefix, extend lengths that do not
// add up to out_cache_loc, request rows or slots out of range, lengths beyond max_context_len,
// mode-specific rules (decode q_len 1, verify num_draft_tokens in [1, max_draft_tokens], ...),
// seq_lens_sum mismatch, a request row listed twice (row 0, the padding row of graph batches,
// may repeat). Writes nothing. Repeated out_cache_loc slots are not checked (cost; see batch.cc).
Status validate_batch(const ForwardBatch& batch, const BatchLimits& limits);

// Fills seq_lens_sum and, for decode/verify, the implied extend vectors, so callers can build a
// batch from the essentials. Does not validate.
void finalize_batch(ForwardBatch& batch);

}  // namespace mla
