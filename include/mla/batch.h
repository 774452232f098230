// Forward batches (SYSTEM.md section 3) and their validation.
#pragma once

#include <cstdint>
#include <span>
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

// The per-mode lengths of one batch (SYSTEM.md 3), resolved once: what every planner reads. The
// one rule for the C++ backends (BackendBase::collect, over their ForwardBatch) and the engine
// adapters (EnginePlanner, over an engine's own host lengths; mla.Backend in Python). The output
// vectors keep their capacity, so a warm caller allocates nothing.
struct BatchLengths {
  std::vector<int32_t> q_lens;       // [bs] new (query) tokens per request
  std::vector<int32_t> kv_lens;      // [bs] keys each request attends to (prefix + new)
  std::vector<int32_t> prefix_lens;  // [bs] kv_len - q_len
  std::vector<int32_t> qo_indptr;    // [bs + 1] cumulative q_lens
  std::vector<int32_t> kv_indptr;    // [bs + 1] cumulative kv_lens
};

// Totals of the lengths just resolved.
struct BatchShape {
  int batch_size = 0;
  int64_t num_tokens = 0;   // sum of q_len
  int64_t kv_tokens = 0;    // sum of kv_len
  int32_t max_q_len = 1;    // at least 1
  bool has_prefix = false;  // some request has kv_len > q_len
};

// q_len / kv_len per mode (ForwardBatch::q_len / kv_len):
//   decode: q 1, kv seq;  target_verify: q num_draft_tokens, kv seq + num_draft_tokens;
//   extend, mixed, draft_extend: q extend_seq_lens[b], kv seq;  idle: q 0, kv 0.
// kv_extra is added to every kv_len (an engine's draft step i of an EAGLE chain decode sees
// i + 1 draft tokens written past its committed seq_len; 0 otherwise). extend_seq_lens is read
// only by the extend modes. Does not validate (validate_batch / check_engine_lengths do).
BatchShape resolve_lengths(ForwardMode mode, std::span<const int32_t> seq_lens,
                           std::span<const int32_t> extend_seq_lens, int32_t num_draft_tokens,
                           int32_t kv_extra, BatchLengths* out);

// The checks of an engine's host lengths before resolve_lengths (the engine adapters' request
// checks; the C++ backends run validate_batch over their own pool instead): one entry per
// request in every given field, no negative length, extend modes with extend_seq_lens, prefix
// (when given, extend and mixed) + extend == seq, target_verify with num_draft_tokens >= 1,
// kv_extra >= 0. kInvalidArgument naming the field, the request and the values.
Status check_engine_lengths(ForwardMode mode, std::span<const int32_t> seq_lens,
                            std::span<const int32_t> extend_seq_lens,
                            std::span<const int32_t> extend_prefix_lens, int32_t num_draft_tokens,
                            int32_t kv_extra);

// Fills seq_lens_sum and, for decode/verify, the implied extend vectors, so callers can build a
// batch from the essentials. Does not validate.
void finalize_batch(ForwardBatch& batch);

}  // namespace mla
