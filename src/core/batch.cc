// Forward batch semantics and validation (SYSTEM.md section 3).
//
//   mode          q_len(b)            kv_len(b)                 out_cache_loc entries
//   DECODE        1                   seq_lens[b]               bs
//   EXTEND etc.   extend_seq_lens[b]  seq_lens[b]               sum(extend_seq_lens)
//   TARGET_VERIFY num_draft_tokens    seq_lens[b] + n           bs * n
//   IDLE          -                   -                         0
#include "mla/batch.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "mla/kv_pool.h"

namespace mla {
namespace {

constexpr bool has_extend_vectors(ForwardMode m) {
  return m == ForwardMode::kExtend || m == ForwardMode::kMixed || m == ForwardMode::kDraftExtend;
}

Status check_size(std::string_view field, std::size_t size, int64_t expected,
                  std::string_view expected_what) {
  MLA_CHECK_ARG(static_cast<int64_t>(size) == expected, "{} has {} entries, expected {} = {}",
                field, size, expected_what, expected);
  return Status::Ok();
}

// One request's rules. Instantiated per mode (kMode) so the per-request loop carries no mode
// branches.
template <ForwardMode kMode>
inline Status check_request(const ForwardBatch& batch, const BatchLimits& limits, int b,
                            bool extend_given) {
  constexpr ForwardMode mode = kMode;
  const int64_t row = batch.req_pool_indices[b];
  MLA_CHECK_ARG(row >= 0 && row <= limits.max_requests,
                "req_pool_indices[{}] = {} is outside 0..{} (max_requests)", b, row,
                limits.max_requests);
  const int64_t seq = batch.seq_lens[b];
  MLA_CHECK_ARG(seq >= 0, "seq_lens[{}] = {} is negative", b, seq);
  if constexpr (mode == ForwardMode::kDecode) {
    MLA_CHECK_ARG(seq >= 1, "seq_lens[{}] = {} must be >= 1 in decode (it counts the new token)", b,
                  seq);
  }
  if (extend_given) {
    const int64_t prefix = batch.extend_prefix_lens[b];
    const int64_t extend = batch.extend_seq_lens[b];
    MLA_CHECK_ARG(prefix >= 0, "extend_prefix_lens[{}] = {} is negative", b, prefix);
    MLA_CHECK_ARG(extend >= 0, "extend_seq_lens[{}] = {} is negative", b, extend);
    if constexpr (mode == ForwardMode::kDecode) {
      MLA_CHECK_ARG(extend == 1, "extend_seq_lens[{}] = {} must be 1 in decode", b, extend);
      MLA_CHECK_ARG(prefix == seq - 1,
                    "extend_prefix_lens[{}] = {} must be seq_lens[{}] - 1 = {} in decode", b,
                    prefix, b, seq - 1);
    } else if constexpr (mode == ForwardMode::kTargetVerify) {
      MLA_CHECK_ARG(extend == batch.num_draft_tokens,
                    "extend_seq_lens[{}] = {} must equal num_draft_tokens = {} in target_verify", b,
                    extend, batch.num_draft_tokens);
      MLA_CHECK_ARG(prefix == seq,
                    "extend_prefix_lens[{}] = {} must equal seq_lens[{}] = {} in target_verify "
                    "(seq_lens exclude the drafts)",
                    b, prefix, b, seq);
    } else {
      MLA_CHECK_ARG(seq >= prefix, "seq_lens[{}] = {} is below extend_prefix_lens[{}] = {}", b, seq,
                    b, prefix);
      MLA_CHECK_ARG(seq == prefix + extend,
                    "seq_lens[{}] = {} is not extend_prefix_lens[{}] + extend_seq_lens[{}] = "
                    "{} + {} = {}",
                    b, seq, b, b, prefix, extend, prefix + extend);
    }
  }
  if constexpr (mode == ForwardMode::kTargetVerify) {
    const int64_t kv = seq + batch.num_draft_tokens;
    MLA_CHECK_ARG(kv <= limits.max_context_len,
                  "seq_lens[{}] + num_draft_tokens = {} + {} = {} exceeds max_context_len = {}", b,
                  seq, batch.num_draft_tokens, kv, limits.max_context_len);
  } else {
    MLA_CHECK_ARG(seq <= limits.max_context_len, "seq_lens[{}] = {} exceeds max_context_len = {}",
                  b, seq, limits.max_context_len);
  }
  return Status::Ok();
}

// Repeated request rows: a row listed twice would read one request's keys for another. Row 0
// (the padding row, used by every padded CUDA-graph request) may repeat. A thread-local stamp
// per row (the batch's epoch) makes the check one load and one store per request, with no
// clearing pass and, once warm, no allocation.
class RowStamps {
 public:
  // Starts a batch over rows 0..num_rows-1.
  void begin(int64_t num_rows) {
    if (stamp_.size() < static_cast<std::size_t>(num_rows)) {
      stamp_.resize(static_cast<std::size_t>(num_rows), 0);
    }
    if (++epoch_ == 0) {  // wrapped: forget every stamp
      std::fill(stamp_.begin(), stamp_.end(), 0);
      epoch_ = 1;
    }
  }
  // False if the row was already seen in this batch.
  bool mark(int32_t row) {
    uint32_t& s = stamp_[static_cast<std::size_t>(row)];
    const bool fresh = row == 0 || s != epoch_;
    s = epoch_;
    return fresh;
  }

 private:
  std::vector<uint32_t> stamp_;
  uint32_t epoch_ = 0;
};

[[gnu::cold]] Status repeated_row(const ForwardBatch& batch, int b) {
  const int32_t row = batch.req_pool_indices[static_cast<std::size_t>(b)];
  int first = 0;
  while (batch.req_pool_indices[static_cast<std::size_t>(first)] != row) ++first;
  return make_status(StatusCode::kInvalidArgument,
                     "req_pool_indices[{}] = {} repeats "
                     "req_pool_indices[{}] (a request may appear once per batch)",
                     b, row, first);
}

}  // namespace

std::string_view forward_mode_name(ForwardMode m) {
  switch (m) {
    case ForwardMode::kDecode:
      return "decode";
    case ForwardMode::kExtend:
      return "extend";
    case ForwardMode::kMixed:
      return "mixed";
    case ForwardMode::kTargetVerify:
      return "target_verify";
    case ForwardMode::kDraftExtend:
      return "draft_extend";
    case ForwardMode::kIdle:
      return "idle";
  }
  return "unknown";
}

bool parse_forward_mode(std::string_view s, ForwardMode* out) {
  struct Name {
    std::string_view name;
    ForwardMode mode;
  };
  static constexpr Name kNames[] = {
      {"decode", ForwardMode::kDecode},
      {"extend", ForwardMode::kExtend},
      {"prefill", ForwardMode::kExtend},
      {"mixed", ForwardMode::kMixed},
      {"target_verify", ForwardMode::kTargetVerify},
      {"target-verify", ForwardMode::kTargetVerify},
      {"verify", ForwardMode::kTargetVerify},
      {"draft_extend", ForwardMode::kDraftExtend},
      {"draft-extend", ForwardMode::kDraftExtend},
      {"idle", ForwardMode::kIdle},
  };
  for (const Name& n : kNames) {
    if (n.name == s) {
      if (out != nullptr) *out = n.mode;
      return true;
    }
  }
  return false;
}

int32_t ForwardBatch::q_len(int b) const {
  switch (mode) {
    case ForwardMode::kDecode:
      return 1;
    case ForwardMode::kTargetVerify:
      return num_draft_tokens;
    case ForwardMode::kIdle:
      return 0;
    default:
      return extend_seq_lens[static_cast<std::size_t>(b)];
  }
}

int32_t ForwardBatch::kv_len(int b) const {
  if (mode == ForwardMode::kIdle) return 0;
  const int32_t seq = seq_lens[static_cast<std::size_t>(b)];
  return mode == ForwardMode::kTargetVerify ? seq + num_draft_tokens : seq;
}

int64_t ForwardBatch::num_tokens() const {
  switch (mode) {
    case ForwardMode::kDecode:
      return batch_size;
    case ForwardMode::kTargetVerify:
      return static_cast<int64_t>(batch_size) * num_draft_tokens;
    case ForwardMode::kIdle:
      return 0;
    default: {
      int64_t n = 0;
      for (int b = 0; b < batch_size; ++b) n += extend_seq_lens[static_cast<std::size_t>(b)];
      return n;
    }
  }
}

bool ForwardBatch::has_prefix() const {
  if (mode == ForwardMode::kTargetVerify) {
    for (int b = 0; b < batch_size; ++b) {
      if (seq_lens[static_cast<std::size_t>(b)] > 0) return true;
    }
    return false;
  }
  if (!has_extend_vectors(mode)) return false;
  for (int b = 0; b < batch_size && b < static_cast<int>(extend_prefix_lens.size()); ++b) {
    if (extend_prefix_lens[static_cast<std::size_t>(b)] > 0) return true;
  }
  return false;
}

Status validate_batch(const ForwardBatch& batch, const BatchLimits& limits) {
  MLA_CHECK_ARG(is_supported_page_size(limits.page_size), "page_size = {} is not served ({})",
                limits.page_size, page_sizes_text());
  const ForwardMode mode = batch.mode;
  MLA_CHECK_ARG(mode <= ForwardMode::kIdle, "mode = {} is not a forward mode",
                static_cast<int>(mode));
  const int bs = batch.batch_size;
  MLA_CHECK_ARG(bs >= 0, "batch_size = {} is negative", bs);

  if (mode == ForwardMode::kIdle) {
    MLA_CHECK_ARG(bs == 0, "batch_size = {} must be 0 in idle mode", bs);
  }
  MLA_RETURN_IF_ERROR(
      check_size("req_pool_indices", batch.req_pool_indices.size(), bs, "batch_size"));
  MLA_RETURN_IF_ERROR(check_size("seq_lens", batch.seq_lens.size(), bs, "batch_size"));

  // Extend vectors: required for extend/mixed/draft-extend; optional (both or neither) for
  // decode and verify; absent in idle.
  bool extend_given = true;
  if (!has_extend_vectors(mode) && batch.extend_prefix_lens.empty() &&
      batch.extend_seq_lens.empty()) {
    extend_given = false;
  } else {
    MLA_RETURN_IF_ERROR(
        check_size("extend_prefix_lens", batch.extend_prefix_lens.size(), bs, "batch_size"));
    MLA_RETURN_IF_ERROR(
        check_size("extend_seq_lens", batch.extend_seq_lens.size(), bs, "batch_size"));
  }

  if (mode == ForwardMode::kTargetVerify) {
    MLA_CHECK_ARG(batch.num_draft_tokens >= 1 && batch.num_draft_tokens <= limits.max_draft_tokens,
                  "num_draft_tokens = {} is outside 1..{} (max_draft_tokens) in target_verify",
                  batch.num_draft_tokens, limits.max_draft_tokens);
  } else {
    MLA_CHECK_ARG(batch.num_draft_tokens == 0, "num_draft_tokens = {} must be 0 in {} mode",
                  batch.num_draft_tokens, forward_mode_name(mode));
  }

  int64_t seq_sum = 0;
  int64_t tokens = 0;
  thread_local RowStamps rows_seen;
  rows_seen.begin(int64_t{limits.max_requests} + 1);
  const auto check_all = [&]<ForwardMode kMode>() -> Status {
    for (int b = 0; b < bs; ++b) {
      MLA_RETURN_IF_ERROR(check_request<kMode>(batch, limits, b, extend_given));
      if (!rows_seen.mark(batch.req_pool_indices[static_cast<std::size_t>(b)])) [[unlikely]] {
        return repeated_row(batch, b);
      }
      seq_sum += batch.seq_lens[static_cast<std::size_t>(b)];
      if constexpr (has_extend_vectors(kMode)) {
        tokens += batch.extend_seq_lens[static_cast<std::size_t>(b)];
      }
    }
    return Status::Ok();
  };
  switch (mode) {
    case ForwardMode::kDecode:
      MLA_RETURN_IF_ERROR(check_all.operator()<ForwardMode::kDecode>());
      break;
    case ForwardMode::kExtend:
      MLA_RETURN_IF_ERROR(check_all.operator()<ForwardMode::kExtend>());
      break;
    case ForwardMode::kMixed:
      MLA_RETURN_IF_ERROR(check_all.operator()<ForwardMode::kMixed>());
      break;
    case ForwardMode::kTargetVerify:
      MLA_RETURN_IF_ERROR(check_all.operator()<ForwardMode::kTargetVerify>());
      break;
    case ForwardMode::kDraftExtend:
      MLA_RETURN_IF_ERROR(check_all.operator()<ForwardMode::kDraftExtend>());
      break;
    case ForwardMode::kIdle:
      break;  // batch_size is 0 (checked above)
  }
  if (mode == ForwardMode::kDecode) tokens = bs;
  if (mode == ForwardMode::kTargetVerify)
    tokens = static_cast<int64_t>(bs) * batch.num_draft_tokens;

  const std::string_view tokens_what = mode == ForwardMode::kDecode ? "batch_size"
                                       : mode == ForwardMode::kTargetVerify
                                           ? "batch_size * num_draft_tokens"
                                           : "sum(extend_seq_lens)";
  MLA_RETURN_IF_ERROR(check_size("out_cache_loc", batch.out_cache_loc.size(), tokens, tokens_what));
  for (std::size_t t = 0; t < batch.out_cache_loc.size(); ++t) {
    const int64_t slot = batch.out_cache_loc[t];
    MLA_CHECK_ARG(slot >= 0 && slot < limits.num_slots,
                  "out_cache_loc[{}] = {} is outside 0..{} (num_slots = {})", t, slot,
                  limits.num_slots - 1, limits.num_slots);
  }
  MLA_CHECK_ARG(batch.seq_lens_sum == seq_sum, "seq_lens_sum = {} is not sum(seq_lens) = {}",
                batch.seq_lens_sum, seq_sum);
  // Slots are not checked for repeats: a bitset over a pool of ~10^5-10^6 slots misses the cache
  // and cost ~1.5 us per batch-256 plan (+40%); out_cache_loc comes from the engine's
  // allocator, and LatentKvPool never hands out a slot twice (kv_pool_property_test).
  return Status::Ok();
}

void finalize_batch(ForwardBatch& batch) {
  int64_t sum = 0;
  for (int32_t s : batch.seq_lens) sum += s;
  batch.seq_lens_sum = sum;
  const bool empty = batch.extend_prefix_lens.empty() && batch.extend_seq_lens.empty();
  if (!empty) return;
  if (batch.mode == ForwardMode::kDecode) {
    for (int32_t s : batch.seq_lens) {
      // Runs before validation: a bad seq_lens (even INT32_MIN) stays bad, never overflows.
      batch.extend_prefix_lens.push_back(s == std::numeric_limits<int32_t>::min() ? s : s - 1);
      batch.extend_seq_lens.push_back(1);
    }
  } else if (batch.mode == ForwardMode::kTargetVerify) {
    for (int32_t s : batch.seq_lens) {
      batch.extend_prefix_lens.push_back(s);
      batch.extend_seq_lens.push_back(batch.num_draft_tokens);
    }
  }
}

}  // namespace mla
