#include "mla/engine_planner.h"

#include <algorithm>
#include <cstdint>

#include "backends/backend_base.h"
#include "backends/chunked_mla/chunked_mla.h"
#include "backends/ondemand_mla/ondemand_mla.h"
#include "backends/paged_mla/paged_mla.h"
#include "planning/chunked_prefix.h"

namespace mla {
namespace backends {

StatusOr<planning::ExtendRule> family_extend_rule(std::string_view family) {
  if (family == "paged_mla") return PagedMlaBackend::kExtendRule;
  if (family == "chunked_mla") return ChunkedMlaBackend::kExtendRule;
  if (family == "ondemand_mla") return OndemandMlaBackend::kExtendRule;
  return invalid_argument(
      "backend '{}' has no forward-method rule (known: paged_mla, chunked_mla, ondemand_mla)",
      family);
}

}  // namespace backends

StatusOr<FamilyWorkspace> family_workspace(std::string_view family, const BackendOptions& options) {
  MLA_RETURN_IF_ERROR(backends::family_extend_rule(family).status());
  FamilyWorkspace w;
  if (family == "ondemand_mla") return w;  // kOnDemand: sized by use
  if (family == "paged_mla") {
    MLA_ASSIGN_OR_RETURN(const WorkspaceSpec paged,
                         backends::PagedMlaBackend::workspace_spec(options));
    w.policy = WorkspacePolicy::kSharedLazy;
    w.bytes = paged.bytes;
    return w;
  }
  MLA_ASSIGN_OR_RETURN(const WorkspaceSpec spec,
                       backends::ChunkedMlaBackend::workspace_spec(options));
  w.policy = WorkspacePolicy::kSharedZeroed;
  w.bytes = spec.bytes;
  w.reserved = backends::ChunkedMlaBackend::counter_bytes(options);
  // The fallback's resources exist iff a fallback is possible (ChunkedMlaBackend::create).
  if (planning::fallback_possible(backends::method_options(options))) {
    MLA_ASSIGN_OR_RETURN(const WorkspaceSpec paged,
                         backends::PagedMlaBackend::workspace_spec(options));
    w.fallback_bytes = paged.bytes;
  }
  return w;
}

AttnCapacity graph_capacity(int max_bs, int64_t max_num_tokens, int num_heads,
                            bool batch_invariant) {
  const int q_len = static_cast<int>((max_num_tokens + max_bs - 1) / std::max(max_bs, 1));
  return AttnCapacity{max_bs, max_num_tokens, 0, std::max(q_len, 1), num_heads, batch_invariant};
}

StatusOr<int> prefix_chunk_lens(std::span<const int32_t> prefix_lens, int64_t capacity,
                                std::vector<int32_t>* lens) {
  planning::ChunkedPrefixPlan plan;
  MLA_RETURN_IF_ERROR(planning::plan_chunked_prefix(prefix_lens, capacity, &plan));
  lens->assign(plan.lens.begin(), plan.lens.end());
  return plan.num_chunks;
}

std::string_view engine_method_name(EngineMethod m) {
  switch (m) {
    case EngineMethod::kAbsorbed:
      return "absorbed";
    case EngineMethod::kMha:
      return "mha";
    case EngineMethod::kMhaChunked:
      return "mha_chunked";
  }
  return "?";
}

StatusOr<EnginePlanner> EnginePlanner::create(std::string_view family,
                                              const BackendOptions& options,
                                              int64_t max_extend_tokens) {
  MLA_ASSIGN_OR_RETURN(const planning::ExtendRule rule, backends::family_extend_rule(family));
  MLA_CHECK_ARG(options.max_batch >= 1, "{}: max_batch = {} must be >= 1", family,
                options.max_batch);
  MLA_CHECK_ARG(options.max_q_len >= 1, "{}: max_q_len = {} must be >= 1", family,
                options.max_q_len);
  MLA_CHECK_ARG(options.model.num_heads >= 1, "{}: num_heads = {} must be >= 1", family,
                options.model.num_heads);
  EnginePlanner p(std::string(family), rule == planning::ExtendRule::kPrefixThreshold, options);
  MLA_CHECK_ARG(max_extend_tokens >= 1, "{}: max_extend_tokens = {} must be >= 1", family,
                max_extend_tokens);
  // The adapters have no one-shot MHA form (the engine gathers the prefix chunks itself).
  p.options_.chunked_prefix_capacity = 0;
  p.max_extend_tokens_ = max_extend_tokens;
  return p;
}

AttnCapacity EnginePlanner::initial_eager_capacity() const {
  if (family_ == "ondemand_mla") return AttnCapacity{};  // allocated on first use
  const int64_t tokens = static_cast<int64_t>(options_.max_batch) * options_.max_q_len;
  return AttnCapacity{
      options_.max_batch,      tokens, 0, options_.max_q_len, options_.model.num_heads,
      options_.batch_invariant};
}

bool EnginePlanner::fits(const AttnCapacity& cap, const BatchShape& s) const {
  return cap.max_batch >= 1 && s.batch_size <= cap.max_batch && s.num_tokens <= cap.max_q_tokens &&
         s.max_q_len <= cap.max_q_len;
}

// The family's growth policy: never shrink; paged_mla and chunked_mla keep at least their
// construction capacity, ondemand_mla holds what the batches so far needed.
AttnCapacity EnginePlanner::grown(const BatchShape& s) const {
  const AttnCapacity base = eager_.max_batch >= 1 ? eager_ : initial_eager_capacity();
  AttnCapacity c = base;
  c.max_batch = std::max({base.max_batch, s.batch_size, 1});
  c.max_q_tokens = std::max({base.max_q_tokens, s.num_tokens, int64_t{1}});
  c.max_q_len = std::max({base.max_q_len, s.max_q_len, 1});
  c.num_heads = options_.model.num_heads;
  c.batch_invariant = options_.batch_invariant;
  return c;
}

// The MHA holder: at least max_batch requests and max_extend_tokens new tokens (ragged causal:
// its keys are the new tokens), grown to what a batch needs, never shrunk.
AttnCapacity EnginePlanner::grown_mha(const BatchShape& s) const {
  AttnCapacity c;
  c.max_batch = std::max({mha_.max_batch, options_.max_batch, s.batch_size});
  c.max_q_tokens = std::max({mha_.max_q_tokens, max_extend_tokens_, s.num_tokens});
  c.max_kv_tokens = c.max_q_tokens;
  c.max_q_len = static_cast<int>(std::min<int64_t>(c.max_q_tokens, INT32_MAX));
  c.num_heads = options_.model.num_heads;
  return c;
}

Status EnginePlanner::check_prefix_chunks(std::span<const int32_t> cu, int num_chunks,
                                          std::vector<AttnCapacity>* caps) const {
  const std::size_t bs = lengths_.prefix_lens.size();
  MLA_CHECK_ARG(num_chunks >= 0 && cu.size() == static_cast<std::size_t>(num_chunks) * (bs + 1),
                "prefix chunks: {} entries for {} chunks of {} requests (expected [chunks, {}])",
                cu.size(), num_chunks, bs, bs + 1);
  caps->clear();
  std::vector<int64_t> covered(bs, 0);
  int64_t q_tokens = lengths_.qo_indptr.empty() ? 0 : lengths_.qo_indptr.back();
  int32_t max_q = 1;
  for (int32_t q : lengths_.q_lens) max_q = std::max(max_q, q);
  for (int c = 0; c < num_chunks; ++c) {
    const int32_t* row = cu.data() + static_cast<std::size_t>(c) * (bs + 1);
    MLA_CHECK_ARG(row[0] == 0, "prefix chunk {}: cumulative lengths start at {}, not 0", c, row[0]);
    for (std::size_t b = 0; b < bs; ++b) {
      MLA_CHECK_ARG(row[b + 1] >= row[b],
                    "prefix chunk {}: request {} has {} keys (cumulative {} -> {})", c, b,
                    row[b + 1] - row[b], row[b], row[b + 1]);
      covered[b] += row[b + 1] - row[b];
    }
    caps->push_back(AttnCapacity{static_cast<int>(bs), std::max<int64_t>(q_tokens, 1),
                                 std::max<int64_t>(row[bs], 1), max_q, options_.model.num_heads});
  }
  for (std::size_t b = 0; b < bs; ++b) {
    MLA_CHECK_ARG(covered[b] == lengths_.prefix_lens[b],
                  "prefix chunks cover {} keys of request {}, whose cached prefix has {} "
                  "(the chunks must cover every prefix key exactly once)",
                  covered[b], b, lengths_.prefix_lens[b]);
  }
  return Status::Ok();
}

AttnCapacity EnginePlanner::grown_chunk(const AttnCapacity& held, const AttnCapacity& needed) {
  AttnCapacity c = needed;
  c.max_batch = std::max(held.max_batch, needed.max_batch);
  c.max_q_tokens = std::max(held.max_q_tokens, needed.max_q_tokens);
  c.max_kv_tokens = std::max(held.max_kv_tokens, needed.max_kv_tokens);
  c.max_q_len = std::max(held.max_q_len, needed.max_q_len);
  return c;
}

Status EnginePlanner::plan(const EngineBatch& batch, EngineDecision* out) {
  MLA_RETURN_IF_ERROR(check_engine_lengths(batch.mode, batch.seq_lens, batch.extend_seq_lens,
                                           batch.extend_prefix_lens, batch.num_draft_tokens,
                                           batch.kv_extra));
  MLA_CHECK_ARG(batch.req_rows.size() == batch.seq_lens.size(),
                "req_pool_indices has {} entries, seq_lens {} (one per request)",
                batch.req_rows.size(), batch.seq_lens.size());
  EngineDecision d;
  d.shape = resolve_lengths(batch.mode, batch.seq_lens, batch.extend_seq_lens,
                            batch.num_draft_tokens, batch.kv_extra, &lengths_);
  int64_t seq_sum = 0;
  for (int32_t s : batch.seq_lens) seq_sum += s;
  const planning::BatchMethod m = planning::decide_batch_method(
      threshold_rule_ ? planning::ExtendRule::kPrefixThreshold
                      : planning::ExtendRule::kChunkedUnlessFallback,
      backends::method_options(options_),
      planning::BatchFacts{batch.mode, lengths_.prefix_lens, seq_sum});
  // Only the chunked-prefix families have a fallback (paged_mla's own rule already gives the
  // absorbed form there; its backend reports no fallback).
  d.fell_back = !threshold_rule_ && m.fell_back;
  if (m.method == ForwardMethod::kAbsorbed) {
    d.method = EngineMethod::kAbsorbed;
  } else {
    d.method = d.shape.has_prefix ? EngineMethod::kMhaChunked : EngineMethod::kMha;
  }
  const bool nothing = batch.mode == ForwardMode::kIdle || d.shape.num_tokens == 0;
  if (!nothing && d.method != EngineMethod::kAbsorbed) {
    const bool fits_mha = mha_.max_batch >= 1 && d.shape.batch_size <= mha_.max_batch &&
                          d.shape.num_tokens <= mha_.max_q_tokens;
    d.target = fits_mha ? PlanTarget::kMha : PlanTarget::kGrowMha;
    d.capacity = fits_mha ? mha_ : grown_mha(d.shape);
  } else if (!nothing) {
    const bool graphable =
        batch.mode == ForwardMode::kDecode || batch.mode == ForwardMode::kTargetVerify;
    if (graphable && fits(graph_, d.shape)) {
      d.target = PlanTarget::kGraph;
      d.capacity = graph_;
    } else if (fits(eager_, d.shape)) {
      d.target = PlanTarget::kEager;
      d.capacity = eager_;
    } else {
      d.target = PlanTarget::kGrowEager;
      d.capacity = grown(d.shape);
    }
  }
  *out = d;
  return Status::Ok();
}

}  // namespace mla
