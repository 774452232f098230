// Which form a batch uses, and the fallback rule of the chunked-prefix families (SYSTEM.md 5
// and 6). Pure host functions over the batch and the options they read; they know no backend:
// each backend picks its ExtendRule. The fallback rule lives here, once: the method chooser calls
// should_fall_back(), and a backend's init_forward_metadata asks decide_batch_method() once per
// batch and keeps the answer in the batch's plan (init_mha_chunk_metadata reads it there).
#pragma once

#include <cstdint>
#include <span>

#include "mla/batch.h"
#include "mla/forward_method.h"

namespace mla::planning {

// The options the rules read (a backend fills them from its BackendOptions).
struct MethodOptions {
  bool disable_chunked_prefix_cache = false;
  bool piecewise_cuda_graph = false;
  bool batch_invariant = false;         // every batch absorbed (BackendOptions::batch_invariant)
  int64_t mha_prefix_threshold = 0;     // paged rule: sum(prefix) at which MHA pays off
  int64_t chunked_prefix_capacity = 0;  // paged rule: one-shot when sum(seq_lens) fits
};

// How plain extends (extend, mixed) are computed:
//   kPrefixThreshold: MHA when no request has a prefix, or sum(prefix) >= mha_prefix_threshold
//     and the chunked prefix cache is enabled; one-shot when sum(seq_lens) fits one chunk's
//     capacity, else chunked; otherwise absorbed (paged_mla);
//   kChunkedUnlessFallback: chunked MHA unless should_fall_back(), then absorbed (chunked_mla,
//     ondemand_mla).
enum class ExtendRule : uint8_t { kPrefixThreshold, kChunkedUnlessFallback };

// What the rules read of a batch: its mode, the cached prefix of each request and sum(seq_lens).
// The C++ backends take it from their ForwardBatch (facts_of), the engine adapters from the
// engine's host lengths (EnginePlanner): one rule for both.
struct BatchFacts {
  ForwardMode mode = ForwardMode::kDecode;
  std::span<const int32_t> prefix_lens;  // [bs] (read for extend and mixed only)
  int64_t seq_lens_sum = 0;
};
BatchFacts facts_of(const ForwardBatch& batch);

// Any request of an extend or mixed batch with a cached prefix.
bool batch_has_prefix(const BatchFacts& batch);
bool batch_has_prefix(const ForwardBatch& batch);

// Whether the configuration can ever fall back (then the fallback's resources are created at
// construction): disable_chunked_prefix_cache, piecewise-graph mode or batch_invariant.
bool fallback_possible(const MethodOptions& options);

// The fallback rule of chunked_mla and ondemand_mla, for one batch:
//   (disable_chunked_prefix_cache and any request has a prefix) or piecewise-graph mode or
//   batch_invariant,
// for plain extends (extend, mixed) only: decode, verify, draft-extend and idle never fall back.
bool should_fall_back(const MethodOptions& options, const BatchFacts& batch);
bool should_fall_back(const MethodOptions& options, const ForwardBatch& batch);

// SYSTEM.md 6, last paragraph:
//  - decode, target-verify, draft-extend, idle: absorbed;
//  - piecewise-graph mode or batch_invariant: absorbed for every rule;
//  - plain extends: the ExtendRule.
ForwardMethod choose_forward_method(ExtendRule rule, const MethodOptions& options,
                                    const BatchFacts& batch);
ForwardMethod choose_forward_method(ExtendRule rule, const MethodOptions& options,
                                    const ForwardBatch& batch);

// Both answers for one batch, the fallback rule asked once: what a chunked-prefix backend's
// init_forward_metadata needs (the method, and whether it is the fallback's absorbed prefill).
struct BatchMethod {
  ForwardMethod method = ForwardMethod::kAbsorbed;
  bool fell_back = false;  // should_fall_back(options, batch)
};
BatchMethod decide_batch_method(ExtendRule rule, const MethodOptions& options,
                                const BatchFacts& batch);
BatchMethod decide_batch_method(ExtendRule rule, const MethodOptions& options,
                                const ForwardBatch& batch);

}  // namespace mla::planning
