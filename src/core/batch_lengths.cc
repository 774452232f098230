// The per-mode lengths of a batch (mla/batch.h: resolve_lengths, check_engine_lengths).
#include <algorithm>

#include "mla/batch.h"

namespace mla {
namespace {

bool reads_extend_lens(ForwardMode m) {
  return m == ForwardMode::kExtend || m == ForwardMode::kMixed || m == ForwardMode::kDraftExtend;
}

}  // namespace

BatchShape resolve_lengths(ForwardMode mode, std::span<const int32_t> seq_lens,
                           std::span<const int32_t> extend_seq_lens, int32_t num_draft_tokens,
                           int32_t kv_extra, BatchLengths* out) {
  const int bs = static_cast<int>(seq_lens.size());
  out->q_lens.resize(static_cast<std::size_t>(bs));
  out->kv_lens.resize(static_cast<std::size_t>(bs));
  out->prefix_lens.resize(static_cast<std::size_t>(bs));
  out->qo_indptr.resize(static_cast<std::size_t>(bs) + 1);
  out->kv_indptr.resize(static_cast<std::size_t>(bs) + 1);
  out->qo_indptr[0] = 0;
  out->kv_indptr[0] = 0;
  const bool idle = mode == ForwardMode::kIdle;
  const bool per_request_q = reads_extend_lens(mode);
  const int32_t q_fixed = mode == ForwardMode::kDecode ? 1 : idle ? 0 : num_draft_tokens;
  const int32_t kv_plus = kv_extra + (mode == ForwardMode::kTargetVerify ? num_draft_tokens : 0);
  BatchShape s;
  s.batch_size = bs;
  int32_t qo = 0, kvo = 0;
  for (int b = 0; b < bs; ++b) {
    const int32_t q = per_request_q ? extend_seq_lens[static_cast<std::size_t>(b)] : q_fixed;
    const int32_t kv = idle ? 0 : seq_lens[static_cast<std::size_t>(b)] + kv_plus;
    out->q_lens[b] = q;
    out->kv_lens[b] = kv;
    out->prefix_lens[b] = kv - q;
    qo += q;
    kvo += kv;
    out->qo_indptr[b + 1] = qo;
    out->kv_indptr[b + 1] = kvo;
    s.max_q_len = std::max(s.max_q_len, q);
    s.has_prefix = s.has_prefix || kv > q;
  }
  s.num_tokens = qo;
  s.kv_tokens = kvo;
  return s;
}

Status check_engine_lengths(ForwardMode mode, std::span<const int32_t> seq_lens,
                            std::span<const int32_t> extend_seq_lens,
                            std::span<const int32_t> extend_prefix_lens, int32_t num_draft_tokens,
                            int32_t kv_extra) {
  const std::size_t bs = seq_lens.size();
  MLA_CHECK_ARG(kv_extra >= 0, "kv_extra = {} must be >= 0", kv_extra);
  if (mode == ForwardMode::kTargetVerify) {
    MLA_CHECK_ARG(num_draft_tokens >= 1,
                  "num_draft_tokens = {}: a target_verify batch needs the number of draft "
                  "tokens (>= 1)",
                  num_draft_tokens);
  }
  const bool ext = reads_extend_lens(mode);
  // Only plain extends promise prefix + extend == seq (a draft-extend batch's prefix lengths are
  // the engine's own bookkeeping; the rules do not read them).
  const bool plain = mode == ForwardMode::kExtend || mode == ForwardMode::kMixed;
  if (ext) {
    MLA_CHECK_ARG(extend_seq_lens.size() == bs,
                  "extend_seq_lens has {} entries, seq_lens {} (one per request)",
                  extend_seq_lens.size(), bs);
  }
  if (plain && !extend_prefix_lens.empty()) {
    MLA_CHECK_ARG(extend_prefix_lens.size() == bs,
                  "extend_prefix_lens has {} entries, seq_lens {} (one per request)",
                  extend_prefix_lens.size(), bs);
  }
  for (std::size_t b = 0; b < bs; ++b) {
    MLA_CHECK_ARG(seq_lens[b] >= 0, "seq_lens[{}] = {} is negative", b, seq_lens[b]);
    if (!ext) continue;
    MLA_CHECK_ARG(extend_seq_lens[b] >= 0 && extend_seq_lens[b] <= seq_lens[b],
                  "extend_seq_lens[{}] = {} must be in [0, seq_lens[{}] = {}]", b,
                  extend_seq_lens[b], b, seq_lens[b]);
    if (plain && !extend_prefix_lens.empty()) {
      MLA_CHECK_ARG(
          extend_prefix_lens[b] + extend_seq_lens[b] == seq_lens[b],
          "extend_prefix_lens[{}] = {} + extend_seq_lens[{}] = {} must equal seq_lens[{}] = {}", b,
          extend_prefix_lens[b], b, extend_seq_lens[b], b, seq_lens[b]);
    }
  }
  return Status::Ok();
}

}  // namespace mla
