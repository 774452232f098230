// Which form a batch uses, and the chunked_mla fallback rule (SYSTEM.md 5 and 6). Pure host
// functions. The fallback rule lives here, once: chunked_mla's init_forward_metadata and
// init_mha_chunk_metadata and the method chooser all call should_fall_back().
#pragma once

#include <cstdint>

#include "mla/backend.h"
#include "mla/batch.h"

namespace mla::planning {

enum class BackendFamily : uint8_t { kPagedMla, kChunkedMla, kOndemandMla };

// Any request of an extend or mixed batch with a cached prefix.
bool batch_has_prefix(const ForwardBatch& batch);

// Whether the configuration can ever fall back (then the fallback's resources are created at
// construction): disable_chunked_prefix_cache or piecewise-graph mode.
bool fallback_possible(const BackendOptions& options);

// The fallback rule of chunked_mla and ondemand_mla, for one batch:
//   (disable_chunked_prefix_cache and any request has a prefix) or piecewise-graph mode or
//   batch_invariant,
// for plain extends (extend, mixed) only: decode, verify, draft-extend and idle never fall back.
bool should_fall_back(const BackendOptions& options, const ForwardBatch& batch);

// SYSTEM.md 6, last paragraph:
//  - decode, target-verify, draft-extend, idle: absorbed;
//  - piecewise-graph mode or batch_invariant: absorbed for every backend;
//  - paged_mla: MHA when no request has a prefix or (sum(prefix) >= mha_prefix_threshold and the
//    chunked prefix cache is enabled); one-shot when sum(seq_lens) fits in one chunk's capacity,
//    else chunked; otherwise absorbed;
//  - chunked_mla / ondemand_mla: chunked MHA unless should_fall_back(), then absorbed.
ForwardMethod choose_forward_method(BackendFamily family, const BackendOptions& options,
                                    const ForwardBatch& batch);

}  // namespace mla::planning
