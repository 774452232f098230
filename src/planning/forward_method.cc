#include "planning/forward_method.h"

#include <algorithm>

namespace mla::planning {
namespace {

bool is_plain_extend(ForwardMode m) {
  return m == ForwardMode::kExtend || m == ForwardMode::kMixed;
}

int64_t prefix_sum(const ForwardBatch& batch) {
  int64_t sum = 0;
  const int n = std::min<int>(batch.batch_size, static_cast<int>(batch.extend_prefix_lens.size()));
  for (int b = 0; b < n; ++b) sum += batch.extend_prefix_lens[static_cast<std::size_t>(b)];
  return sum;
}

}  // namespace

bool batch_has_prefix(const ForwardBatch& batch) {
  if (!is_plain_extend(batch.mode)) return false;
  const int n = std::min<int>(batch.batch_size, static_cast<int>(batch.extend_prefix_lens.size()));
  for (int b = 0; b < n; ++b) {
    if (batch.extend_prefix_lens[static_cast<std::size_t>(b)] > 0) return true;
  }
  return false;
}

bool fallback_possible(const MethodOptions& options) {
  return options.disable_chunked_prefix_cache || options.piecewise_cuda_graph ||
         options.batch_invariant;
}

bool should_fall_back(const MethodOptions& options, const ForwardBatch& batch) {
  if (!is_plain_extend(batch.mode)) return false;
  return (options.disable_chunked_prefix_cache && batch_has_prefix(batch)) ||
         options.piecewise_cuda_graph || options.batch_invariant;
}

BatchMethod decide_batch_method(ExtendRule rule, const MethodOptions& options,
                                const ForwardBatch& batch) {
  BatchMethod d;
  d.fell_back = should_fall_back(options, batch);
  if (!is_plain_extend(batch.mode) || d.fell_back) return d;  // absorbed
  d.method = rule == ExtendRule::kChunkedUnlessFallback
                 ? ForwardMethod::kMhaChunked
                 : choose_forward_method(rule, options, batch);
  return d;
}

ForwardMethod choose_forward_method(ExtendRule rule, const MethodOptions& options,
                                    const ForwardBatch& batch) {
  if (!is_plain_extend(batch.mode)) return ForwardMethod::kAbsorbed;
  if (rule == ExtendRule::kChunkedUnlessFallback) {
    return should_fall_back(options, batch) ? ForwardMethod::kAbsorbed : ForwardMethod::kMhaChunked;
  }
  if (options.piecewise_cuda_graph || options.batch_invariant) return ForwardMethod::kAbsorbed;
  const bool has_prefix = batch_has_prefix(batch);
  const bool mha = !has_prefix || (prefix_sum(batch) >= options.mha_prefix_threshold &&
                                   !options.disable_chunked_prefix_cache);
  if (!mha) return ForwardMethod::kAbsorbed;
  return batch.seq_lens_sum <= options.chunked_prefix_capacity ? ForwardMethod::kMhaOneShot
                                                               : ForwardMethod::kMhaChunked;
}

}  // namespace mla::planning
