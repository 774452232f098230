#include "planning/chunked_prefix.h"

#include <algorithm>
#include <limits>

#include "mla/ops.h"

namespace mla::planning {

Status plan_chunked_prefix(std::span<const int32_t> prefix_lens, int64_t capacity,
                           ChunkedPrefixPlan* plan) {
  const int bs = static_cast<int>(prefix_lens.size());
  MLA_CHECK_ARG(capacity >= bs && capacity > 0,
                "chunked_prefix_capacity = {} must be at least the batch size {} (and > 0)",
                capacity, bs);
  int32_t max_prefix = 0;
  int64_t total = 0;
  for (int b = 0; b < bs; ++b) {
    MLA_CHECK_ARG(prefix_lens[b] >= 0, "extend_prefix_lens[{}] = {} is negative", b,
                  prefix_lens[b]);
    max_prefix = std::max(max_prefix, prefix_lens[b]);
    total += prefix_lens[b];
  }
  // cu_len is int32 (as the kernels read it): every chunk's total must fit.
  MLA_CHECK_ARG(total <= std::numeric_limits<int32_t>::max(),
                "extend_prefix_lens add up to {} tokens, beyond the int32 chunk offsets", total);
  const int64_t L = bs > 0 ? capacity / bs : capacity;
  const int64_t chunks = max_prefix == 0 ? 0 : (max_prefix + L - 1) / L;
  // The plan holds chunks x bs lengths (and as many MHA plans follow): bounded, so a capacity
  // far too small for the prefixes is an error, not gigabytes of plan (found by the
  // chunked_prefix fuzz target: capacity 1 against a 2^31-token prefix).
  MLA_CHECK_ARG(chunks * std::max(bs, 1) <= kMaxChunkPlanEntries,
                "chunked_prefix_capacity = {} gives chunks of {} tokens: the longest prefix ({}) "
                "needs {} chunks for {} requests, more than {} chunk entries; raise the capacity",
                capacity, L, max_prefix, chunks, bs, kMaxChunkPlanEntries);
  plan->batch_size = bs;
  plan->capacity = capacity;
  plan->chunk_len = L;
  plan->num_chunks = static_cast<int>(chunks);
  const int C = plan->num_chunks;
  plan->lens.resize(static_cast<std::size_t>(C) * bs);
  plan->cu_len.resize(static_cast<std::size_t>(C) * (bs + 1));
  plan->max_len.resize(C);
  plan->num_tokens.resize(C);
  plan->has_zero_kv.resize(C);
  plan->kv_offsets.resize(static_cast<std::size_t>(C) + 1);
  plan->kv_offsets[0] = 0;
  for (int c = 0; c < C; ++c) {
    const int64_t start = c * L;
    int32_t* lens = plan->lens.data() + static_cast<std::size_t>(c) * bs;
    int32_t* cu = plan->cu_len.data() + static_cast<std::size_t>(c) * (bs + 1);
    cu[0] = 0;
    int32_t longest = 0;
    bool zero = false;
    for (int b = 0; b < bs; ++b) {
      const int64_t len =
          std::max<int64_t>(std::min<int64_t>(prefix_lens[b], start + L) - start, 0);
      lens[b] = static_cast<int32_t>(len);
      cu[b + 1] = cu[b] + lens[b];
      longest = std::max(longest, lens[b]);
      zero = zero || len == 0;
    }
    plan->max_len[c] = longest;
    plan->num_tokens[c] = cu[bs];
    plan->has_zero_kv[c] = zero ? 1 : 0;
    plan->kv_offsets[c + 1] = plan->kv_offsets[c] + cu[bs];
  }
  return Status::Ok();
}

Status fill_chunk_kv_indices(std::span<const int32_t> req_rows,
                             std::span<const int32_t> req_to_token_host, int64_t row_stride,
                             int page_size, ChunkedPrefixPlan* plan) {
  const int bs = plan->batch_size;
  MLA_CHECK_ARG(static_cast<int>(req_rows.size()) == bs,
                "req_rows has {} entries, the chunk plan {} requests", req_rows.size(), bs);
  MLA_CHECK_ARG(page_size >= 1, "page_size = {} must be positive", page_size);
  const int64_t rows =
      row_stride > 0 ? static_cast<int64_t>(req_to_token_host.size()) / row_stride : 0;
  const int C = plan->num_chunks;
  // Every check before the first write: a rejected call leaves the plan as it was (found by
  // the chunked_prefix fuzz target: kv_indices used to be resized, and earlier chunks filled,
  // before a bad row or a chunk beyond max_context_len was reported).
  for (int b = 0; b < bs; ++b) {
    MLA_CHECK_ARG(req_rows[b] >= 0 && req_rows[b] < rows,
                  "req_pool_indices[{}] = {} is outside req_to_token's {} rows", b, req_rows[b],
                  rows);
  }
  for (int c = 0; c < C; ++c) {
    for (int b = 0; b < bs; ++b) {
      const int32_t len = plan->len(c, b);
      MLA_CHECK_ARG(len == 0 || plan->start(c) + len <= row_stride,
                    "chunk {} of request {} ends at token {} beyond max_context_len = {}", c, b,
                    plan->start(c) + len, row_stride);
    }
  }
  plan->kv_indices.resize(static_cast<std::size_t>(plan->kv_offsets[C]));
  for (int c = 0; c < C; ++c) {
    const int64_t start = plan->start(c);
    int32_t* out = plan->kv_indices.data() + plan->kv_offsets[c];
    for (int b = 0; b < bs; ++b) {
      const int32_t len = plan->len(c, b);
      for (int64_t i = start; i < start + len; ++i) {
        *out++ = static_cast<int32_t>(
            slot_of_token(req_to_token_host.data(), row_stride, req_rows[b], i, page_size));
      }
    }
  }
  return Status::Ok();
}

}  // namespace mla::planning
