#include "planning/forward_method.h"

#include <algorithm>

namespace mla::planning {
namespace {

bool is_plain_extend(ForwardMode m) {
  return m == ForwardMode::kExtend || m == ForwardMode::kMixed;
}

int64_t prefix_sum(const BatchFacts& batch) {
  int64_t sum = 0;
  for (int32_t p : batch.prefix_lens) sum += p;
  return sum;
}

}  // namespace

BatchFacts facts_of(const ForwardBatch& batch) {
  const std::size_t n = std::min<std::size_t>(
      static_cast<std::size_t>(std::max(batch.batch_size, 0)), batch.extend_prefix_lens.size());
  return BatchFacts{batch.mode, std::span<const int32_t>(batch.extend_prefix_lens.data(), n),
                    batch.seq_lens_sum};
}

bool batch_has_prefix(const BatchFacts& batch) {
  if (!is_plain_extend(batch.mode)) return false;
  return std::any_of(batch.prefix_lens.begin(), batch.prefix_lens.end(),
                     [](int32_t p) { return p > 0; });
}

bool batch_has_prefix(const ForwardBatch& batch) { return batch_has_prefix(facts_of(batch)); }

bool fallback_possible(const MethodOptions& options) {
  return options.disable_chunked_prefix_cache || options.piecewise_cuda_graph ||
         options.batch_invariant;
}

bool should_fall_back(const MethodOptions& options, const BatchFacts& batch) {
  if (!is_plain_extend(batch.mode)) return false;
  return (options.disable_chunked_prefix_cache && batch_has_prefix(batch)) ||
         options.piecewise_cuda_graph || options.batch_invariant;
}

bool should_fall_back(const MethodOptions& options, const ForwardBatch& batch) {
  return should_fall_back(options, facts_of(batch));
}

BatchMethod decide_batch_method(ExtendRule rule, const MethodOptions& options,
                                const BatchFacts& batch) {
  BatchMethod d;
  d.fell_back = should_fall_back(options, batch);
  if (!is_plain_extend(batch.mode) || d.fell_back) return d;  // absorbed
  d.method = rule == ExtendRule::kChunkedUnlessFallback
                 ? ForwardMethod::kMhaChunked
                 : choose_forward_method(rule, options, batch);
  return d;
}

BatchMethod decide_batch_method(ExtendRule rule, const MethodOptions& options,
                                const ForwardBatch& batch) {
  return decide_batch_method(rule, options, facts_of(batch));
}

ForwardMethod choose_forward_method(ExtendRule rule, const MethodOptions& options,
                                    const BatchFacts& batch) {
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

ForwardMethod choose_forward_method(ExtendRule rule, const MethodOptions& options,
                                    const ForwardBatch& batch) {
  return choose_forward_method(rule, options, facts_of(batch));
}

}  // namespace mla::planning
