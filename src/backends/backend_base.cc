#include "backends/backend_base.h"

#include <fmt/format.h>

#include <algorithm>

#include "mla/engine_planner.h"
#include "mla/memory.h"

namespace mla::backends {
namespace {

int64_t to_i64(std::size_t v) { return static_cast<int64_t>(v); }

}  // namespace

BackendBase::BackendBase(std::string name, const BackendContext& ctx, const OpSet* ops)
    : name_(std::move(name)),
      options_(ctx.options),
      pool_(ctx.pool),
      ops_(ops),
      staging_(name_ + ".upload_staging", name_, ctx.options.device),
      absorbed_plan_(name_ + ".absorbed_plan", name_, ctx.options.device),
      mha_plan_(name_ + ".mha_plan", name_, ctx.options.device),
      mha_chunk_plan_(name_ + ".mha_chunk_plan", name_, ctx.options.device),
      indices_(name_ + ".out_cache_loc", name_, ctx.options.device),
      mha_chunk_kv_(name_ + ".mha_chunk_kv", name_, ctx.options.device),
      mha_new_kv_(name_ + ".mha_new_kv", name_, ctx.options.device),
      lse_(name_ + ".lse", name_, ctx.options.device) {
  // Every planning decision sees the capacity the budget allows (SYSTEM.md 6, issue 14).
  options_.chunked_prefix_capacity = std::max<int64_t>(chunk_capacity(ctx.options, ops), 1);
}

// The carves of mha_chunk_kv (and of mha_new_kv, without slots), in order: the one function
// behind their size (chunk_rows_bytes, the fixed part in plan_mha_chunks) and their layout
// (layout_kv_rows).
void BackendBase::carve_kv_rows(WorkspaceCarver& c, const ChunkCarves& n, KvRows* s) {
  const auto H = static_cast<std::size_t>(n.num_heads);
  const auto rows = static_cast<std::size_t>(n.kv_rows);
  s->slots = c.carve_as<int32_t>("slots", static_cast<std::size_t>(n.num_slots));
  s->k = c.carve("k", rows * H * kQkHeadDim * 2);
  s->v = c.carve("v", rows * H * kVHeadDim * 2);
  s->up_ws = c.carve("up_project", n.up_bytes);
  s->up_ws_bytes = n.up_bytes;
}

std::size_t BackendBase::chunk_carves_bytes(const ChunkCarves& n) {
  WorkspaceCarver measure("mha_chunk_kv");
  KvRows unused;
  carve_kv_rows(measure, n, &unused);
  return measure.aligned_bytes();
}

std::size_t BackendBase::chunk_rows_bytes(int64_t rows, int num_heads, const OpSet* ops,
                                          bool with_slots) {
  ChunkCarves n;
  n.num_heads = num_heads;
  n.num_slots = with_slots ? rows : 0;
  n.kv_rows = rows;
  n.up_bytes =
      ops != nullptr && ops->up_project ? ops->up_project->workspace_bytes(rows, num_heads) : 0;
  return chunk_carves_bytes(n);
}

int64_t BackendBase::rows_within(std::size_t budget, int64_t max_rows, int num_heads,
                                 const OpSet* ops, bool with_slots) {
  int64_t lo = 0, hi = std::max<int64_t>(max_rows, 0);
  while (lo < hi) {  // the most rows whose bytes fit the budget
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (chunk_rows_bytes(mid, num_heads, ops, with_slots) <= budget) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

int64_t BackendBase::chunk_capacity(const BackendOptions& o, const OpSet* ops) {
  return rows_within(o.mha_chunk_kv_budget_bytes, o.chunked_prefix_capacity, o.model.num_heads, ops,
                     /*with_slots=*/true);
}

StatusOr<const OpSet*> BackendBase::resolve_ops(const BackendContext& ctx, std::string_view who) {
  const BackendOptions& o = ctx.options;
  MLA_CHECK_ARG(ctx.pool != nullptr, "{}: BackendContext.pool is null", who);
  MLA_RETURN_IF_ERROR(o.model.validate());
  const KvPoolConfig& pc = ctx.pool->config();
  MLA_CHECK_ARG(pc.device == o.device, "{}: options.device = {} but the kv pool is on {}", who,
                o.device.to_string(), pc.device.to_string());
  MLA_CHECK_ARG(pc.latent_dim == o.model.latent_dim() && pc.latent_dim == kLatentDim,
                "{}: kv pool latent_dim = {} but the model's kv_lora_rank + qk_rope_dim = {}", who,
                pc.latent_dim, o.model.latent_dim());
  MLA_CHECK_ARG(o.max_batch >= 1, "{}: options.max_batch = {} must be >= 1", who, o.max_batch);
  MLA_CHECK_ARG(o.max_q_len >= 1, "{}: options.max_q_len = {} must be >= 1", who, o.max_q_len);
  MLA_CHECK_ARG(o.chunked_prefix_capacity >= 1,
                "{}: options.chunked_prefix_capacity = {} must be >= 1", who,
                o.chunked_prefix_capacity);
  // The model, the pool's page size and dtype, the op set and its GPU (check_backend_config).
  MLA_ASSIGN_OR_RETURN(const OpSet* ops, check_backend_config(o, pc.page_size, pc.dtype, who));
  // The MHA op's limits, asked once here (check_backend_config asked the absorbed op's), not per
  // batch.
  if (ops->mha != nullptr) {
    if (const Status st = ops->mha->supports(o.model.num_heads); !st.ok()) {
      return Status(st.code(), fmt::format("{}: {}", who, st.message()));
    }
  }
  const int64_t rows = rows_within(o.mha_chunk_kv_budget_bytes, o.max_batch, o.model.num_heads, ops,
                                   /*with_slots=*/true);
  MLA_CHECK_ARG(rows >= o.max_batch,
                "{}: options.mha_chunk_kv_budget_bytes = {} holds {} up-projected rows of {} "
                "heads, fewer than max_batch = {} (a prefix chunk needs a row per request)",
                who, o.mha_chunk_kv_budget_bytes, rows, o.model.num_heads, o.max_batch);
  return ops;
}

std::size_t BackendBase::absorbed_op_workspace_bytes(const AttnCapacity& cap) const {
  return ops_->absorbed ? ops_->absorbed->workspace_bytes(cap) : 0;
}

Status BackendBase::validate(const ForwardBatch& batch) const {
  return validate_batch(batch, pool_->batch_limits(options_.max_q_len));
}

BackendBase::PlanTimer::~PlanTimer() {
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_)
          .count();
  b_->record_plan_ns(static_cast<uint64_t>(ns));
  // The call's uploads are enqueued: mark their staging buffer as in flight.
  b_->staging_.close(b_->stream_).ignore();
}

void BackendBase::record_plan_ns(uint64_t ns) {
  stats_.plan_ns_total += ns;
  stats_.plan_ns_last = ns;
  plan_ns_ring_[plan_ns_count_ % plan_ns_ring_.size()] =
      static_cast<uint32_t>(std::min<uint64_t>(ns, UINT32_MAX));
  ++plan_ns_count_;
}

double BackendBase::median_plan_ns() const {
  const std::size_t n = std::min<std::size_t>(plan_ns_count_, plan_ns_ring_.size());
  if (n == 0) return 0.0;
  median_scratch_.assign(plan_ns_ring_.begin(), plan_ns_ring_.begin() + to_i64(n));
  auto mid = median_scratch_.begin() + to_i64(n / 2);
  std::nth_element(median_scratch_.begin(), mid, median_scratch_.end());
  return static_cast<double>(*mid);
}

Status BackendBase::upload(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return Status::Ok();
  return staging_.upload(dst, src, bytes, stream_);
}

// ---------------------------------------------------------------------------------------------
// Host side of a batch: request rows, lengths and indptrs into the plan's reused vectors.
Status BackendBase::collect(const ForwardBatch& batch) {
  plan_.mode = batch.mode;
  BatchPlan::Host& h = plan_.host;
  h.req_rows.assign(batch.req_pool_indices.begin(), batch.req_pool_indices.end());
  const BatchShape s = resolve_lengths(batch.mode, batch.seq_lens, batch.extend_seq_lens,
                                       batch.num_draft_tokens, /*kv_extra=*/0, &h);
  plan_.batch_size = s.batch_size;
  plan_.num_tokens = s.num_tokens;
  plan_.kv_tokens = s.kv_tokens;
  plan_.max_q_len = s.max_q_len;
  plan_.has_prefix = s.has_prefix;
  return Status::Ok();
}

// Op scratch from the family's workspace: [reserved (never touched by ops) | op]. The measuring
// pass and the carving pass run the same function, so size and layout cannot drift.
StatusOr<BatchPlan::OpScratch> BackendBase::layout_op_scratch(std::size_t op_bytes,
                                                              bool fell_back) {
  const std::size_t reserved = reserved_workspace_bytes(fell_back);
  auto carve_all = [&](WorkspaceCarver& c) {
    c.carve("reserved.counters", reserved);
    return c.carve("ops", op_bytes);
  };
  WorkspaceCarver measure(name_);
  carve_all(measure);
  MLA_ASSIGN_OR_RETURN(WorkspaceView ws, op_workspace(measure.required_bytes(), fell_back));
  WorkspaceCarver carver(ws.name, ws.data, ws.bytes, ws.env_var);
  BatchPlan::OpScratch scratch;
  scratch.op = carve_all(carver);
  scratch.op_bytes = op_bytes;
  scratch.base = ws.data;
  MLA_RETURN_IF_ERROR(carver.status());
  return scratch;
}

Status BackendBase::layout_kv_rows(GrowableBuffer& buffer, int64_t num_slots, int64_t kv_rows,
                                   KvRows* rows) {
  ChunkCarves n;
  n.num_heads = options_.model.num_heads;
  n.num_slots = num_slots;
  n.kv_rows = kv_rows;
  n.up_bytes = ops_->up_project ? ops_->up_project->workspace_bytes(kv_rows, n.num_heads) : 0;
  return carve_buffer(buffer, [&](WorkspaceCarver& c) { carve_kv_rows(c, n, rows); });
}

// ---------------------------------------------------------------------------------------------
Status BackendBase::plan_absorbed(const AttnCapacity& cap, GrowableBuffer* eager_plan,
                                  void* graph_plan) {
  const AbsorbedAttentionOp* op = ops_->absorbed.get();
  if (op == nullptr) return unsupported("{}: op set '{}' has no absorbed op", name_, ops_->name);
  // The op's supports() was asked at construction (check_backend_config): its plan() is the one
  // place a batch's kernel is chosen.
  const KvPoolConfig& pc = pool_->config();
  AbsorbedProblem problem;
  problem.num_heads = options_.model.num_heads;
  problem.page_size = pc.page_size;
  problem.causal = true;
  problem.req_rows = plan_.host.req_rows;
  problem.q_lens = plan_.host.q_lens;
  problem.kv_lens = plan_.host.kv_lens;
  const std::size_t bytes = op->plan_bytes(cap);
  plan_.host.op_plan.resize(bytes);
  MLA_ASSIGN_OR_RETURN(const std::size_t used, op->plan(problem, cap, plan_.host.op_plan));
  void* dst = graph_plan;
  if (dst == nullptr) {
    MLA_RETURN_IF_ERROR(eager_plan->reserve(bytes));
    dst = eager_plan->data();
  }
  MLA_RETURN_IF_ERROR(upload(dst, plan_.host.op_plan.data(), used));
  plan_.absorbed_plan = dst;
  MLA_ASSIGN_OR_RETURN(plan_.op,
                       layout_op_scratch(absorbed_op_workspace_bytes(cap), plan_.fell_back));
  ++stats_.absorbed_plans;
  return Status::Ok();
}

// The MHA pass over the new tokens: ragged causal among them, or (one-shot with a prefix) one
// causal pass over the gathered prefix + new tokens.
Status BackendBase::plan_mha_main(ForwardMethod method) {
  const MhaAttentionOp* op = ops_->mha.get();
  if (op == nullptr) return unsupported("{}: op set '{}' has no mha op", name_, ops_->name);
  const bool gather = method == ForwardMethod::kMhaOneShot && plan_.has_prefix;
  MhaProblem problem;
  problem.num_heads = options_.model.num_heads;
  problem.causal = true;
  problem.qo_indptr = plan_.host.qo_indptr;
  problem.kv_indptr = gather ? plan_.host.kv_indptr : plan_.host.qo_indptr;
  plan_.mha_cap =
      AttnCapacity{plan_.batch_size, plan_.num_tokens, gather ? plan_.kv_tokens : plan_.num_tokens,
                   plan_.max_q_len, options_.model.num_heads};
  const std::size_t bytes = op->plan_bytes(plan_.mha_cap);
  plan_.host.op_plan.resize(bytes);
  MLA_ASSIGN_OR_RETURN(const std::size_t used,
                       op->plan(problem, plan_.mha_cap, plan_.host.op_plan));
  MLA_RETURN_IF_ERROR(mha_plan_.reserve(bytes));
  MLA_RETURN_IF_ERROR(upload(mha_plan_.data(), plan_.host.op_plan.data(), used));
  plan_.mha_plan = mha_plan_.data();
  MLA_ASSIGN_OR_RETURN(plan_.op,
                       layout_op_scratch(op->workspace_bytes(plan_.mha_cap), plan_.fell_back));
  if (gather) {
    // One-shot: every key of every request, read from the host req_to_token.
    const KvPoolConfig& pc = pool_->config();
    const auto& table = pool_->req_to_token_host();
    plan_.host.slots.resize(static_cast<std::size_t>(plan_.kv_tokens));
    int32_t* out = plan_.host.slots.data();
    for (int b = 0; b < plan_.batch_size; ++b) {
      for (int64_t i = 0; i < plan_.host.kv_lens[b]; ++i) {
        *out++ = static_cast<int32_t>(slot_of_token(table.data(), pc.max_context_len,
                                                    plan_.host.req_rows[b], i, pc.page_size));
      }
    }
    MLA_RETURN_IF_ERROR(
        layout_kv_rows(mha_chunk_kv_, plan_.kv_tokens, plan_.kv_tokens, &plan_.chunk));
    MLA_RETURN_IF_ERROR(upload(plan_.chunk.slots, plan_.host.slots.data(),
                               plan_.host.slots.size() * sizeof(int32_t)));
  } else {
    // The new tokens' k, v, up-projected by run_mha from the rows at out_cache_loc (the slots
    // are the plan's out_cache_loc: no slot list here).
    MLA_RETURN_IF_ERROR(layout_kv_rows(mha_new_kv_, 0, plan_.num_tokens, &plan_.new_kv));
  }
  ++stats_.mha_plans;
  return Status::Ok();
}

// Prefix chunks (SYSTEM.md 6): the planner, their slots, one non-causal MHA plan per chunk.
Status BackendBase::plan_mha_chunks() {
  const MhaAttentionOp* op = ops_->mha.get();
  if (op == nullptr) return unsupported("{}: op set '{}' has no mha op", name_, ops_->name);
  const KvPoolConfig& pc = pool_->config();
  // This batch's chunk capacity: the rows the mha_chunk_kv budget leaves after the slot list
  // (layout_kv_rows carves both from that buffer). The chunks' attention merges into the
  // layer's (o, lse) itself (MhaArgs::merge_into_output): no per-new-token partials here.
  const int H = options_.model.num_heads;
  int64_t prefix_total = 0;
  for (int32_t p : plan_.host.prefix_lens) prefix_total += p;
  ChunkCarves fixed_carves;  // what does not grow with the rows: the slot list
  fixed_carves.num_heads = H;
  fixed_carves.num_slots = prefix_total;
  const std::size_t fixed = chunk_carves_bytes(fixed_carves);
  const std::size_t budget = options_.mha_chunk_kv_budget_bytes;
  const int64_t capacity =
      fixed < budget ? rows_within(budget - fixed, options_.chunked_prefix_capacity, H, ops_,
                                   /*with_slots=*/false)
                     : 0;
  if (capacity < plan_.batch_size) {
    return make_status(StatusCode::kOutOfWorkspace,
                       "{}: {} new tokens and {} prefix tokens leave room for {} up-projected "
                       "rows in the mha_chunk_kv budget of {} bytes, fewer than the {} requests "
                       "of the batch (raise BackendOptions::mha_chunk_kv_budget_bytes)",
                       name_, plan_.num_tokens, prefix_total, capacity, budget, plan_.batch_size);
  }
  MLA_RETURN_IF_ERROR(
      planning::plan_chunked_prefix(plan_.host.prefix_lens, capacity, &plan_.chunks));
  MLA_RETURN_IF_ERROR(
      planning::fill_chunk_kv_indices(plan_.host.req_rows, pool_->req_to_token_host(),
                                      pc.max_context_len, pc.page_size, &plan_.chunks));
  const int C = plan_.chunks.num_chunks;
  plan_.chunk_caps.resize(C);
  plan_.chunk_plan_offsets.resize(C);
  std::size_t total = 0;
  // The ops carve of this batch may already serve the main pass (or an absorbed plan).
  plan_.mha_cap = AttnCapacity{plan_.batch_size, plan_.num_tokens, plan_.num_tokens,
                               plan_.max_q_len, options_.model.num_heads};
  std::size_t op_ws = std::max(op->workspace_bytes(plan_.mha_cap), plan_.op.op_bytes);
  int64_t max_rows = 0;
  for (int c = 0; c < C; ++c) {
    plan_.chunk_caps[c] =
        AttnCapacity{plan_.batch_size, plan_.num_tokens, plan_.chunks.num_tokens[c],
                     plan_.max_q_len, options_.model.num_heads};
    plan_.chunk_plan_offsets[c] = total;
    total = align_workspace(total + op->plan_bytes(plan_.chunk_caps[c]));
    op_ws = std::max(op_ws, op->workspace_bytes(plan_.chunk_caps[c]));
    max_rows = std::max(max_rows, plan_.chunks.num_tokens[c]);
  }
  plan_.host.op_plan.resize(total);
  MhaProblem problem;
  problem.num_heads = options_.model.num_heads;
  problem.causal = false;
  problem.qo_indptr = plan_.host.qo_indptr;
  for (int c = 0; c < C; ++c) {
    problem.kv_indptr = plan_.chunks.chunk_cu_len(c);
    const std::size_t bytes = op->plan_bytes(plan_.chunk_caps[c]);
    MLA_ASSIGN_OR_RETURN(
        const std::size_t used,
        op->plan(
            problem, plan_.chunk_caps[c],
            std::span<std::byte>(plan_.host.op_plan.data() + plan_.chunk_plan_offsets[c], bytes)));
    (void)used;
  }
  if (total > 0) {
    MLA_RETURN_IF_ERROR(mha_chunk_plan_.reserve(total));
    MLA_RETURN_IF_ERROR(upload(mha_chunk_plan_.data(), plan_.host.op_plan.data(), total));
  }
  plan_.chunk_plans = static_cast<const std::byte*>(mha_chunk_plan_.data());
  MLA_ASSIGN_OR_RETURN(plan_.op, layout_op_scratch(op_ws, plan_.fell_back));
  if (C > 0) {
    MLA_RETURN_IF_ERROR(layout_kv_rows(mha_chunk_kv_, to_i64(plan_.chunks.kv_indices.size()),
                                       max_rows, &plan_.chunk));
    MLA_RETURN_IF_ERROR(upload(plan_.chunk.slots, plan_.chunks.kv_indices.data(),
                               plan_.chunks.kv_indices.size() * sizeof(int32_t)));
  }
  ++stats_.mha_chunk_plans;
  stats_.chunks_planned += static_cast<uint64_t>(C);
  plan_.chunk_epoch = plan_.epoch;
  return Status::Ok();
}

PlanDescription BackendBase::describe_plan() const {
  PlanDescription d;
  d.backend = name_;
  if (plan_.epoch == 0) return d;
  d.mode = plan_.mode;
  d.method = plan_.method;
  d.fell_back = plan_.fell_back;
  d.num_tokens = plan_.num_tokens;
  const auto detail = [&d](std::string name, auto value) {
    d.details.emplace_back(std::move(name), fmt::format("{}", value));
  };
  detail("requests", plan_.batch_size);
  detail("kv tokens", plan_.kv_tokens);
  detail("op set", ops_->name);
  detail("op scratch bytes", plan_.op.op_bytes);
  if (plan_.method == ForwardMethod::kMhaChunked && plan_.has_prefix) {
    if (!plan_.chunks_planned()) {
      detail("prefix chunks", "not planned yet (init_mha_chunk_metadata plans them)");
    } else {
      d.chunk_capacity = plan_.chunks.capacity;
      d.chunk_len = plan_.chunks.chunk_len;
      for (int c = 0; c < plan_.chunks.num_chunks; ++c) {
        PlanDescription::Chunk ch;
        ch.start = plan_.chunks.start(c);
        for (int b = 0; b < plan_.chunks.batch_size; ++b) ch.lens.push_back(plan_.chunks.len(c, b));
        ch.num_tokens = plan_.chunks.num_tokens[static_cast<std::size_t>(c)];
        ch.has_zero_kv = plan_.chunks.has_zero_kv[static_cast<std::size_t>(c)] != 0;
        d.chunks.push_back(std::move(ch));
      }
    }
  }
  return d;
}

Status BackendBase::plan_prefix_chunks(const ForwardBatch& batch) {
  MLA_RETURN_IF_ERROR(collect(batch));
  const Status s = plan_mha_chunks();
  MLA_RETURN_IF_ERROR(staging_.close(stream_));
  return s;
}

Status BackendBase::plan_eager(const ForwardBatch& batch, ForwardMethod method, bool fell_back,
                               bool plan_chunks) {
  ++plan_.epoch;
  plan_.method = method;
  plan_.fell_back = fell_back;
  MLA_RETURN_IF_ERROR(collect(batch));
  const int64_t H = options_.model.num_heads;
  MLA_RETURN_IF_ERROR(
      indices_.reserve(static_cast<std::size_t>(plan_.num_tokens) * sizeof(int32_t)));
  MLA_RETURN_IF_ERROR(upload(indices_.data(), batch.out_cache_loc.data(),
                             batch.out_cache_loc.size() * sizeof(int32_t)));
  plan_.out_cache_loc = static_cast<const int32_t*>(indices_.data());
  MLA_RETURN_IF_ERROR(lse_.reserve(static_cast<std::size_t>(plan_.num_tokens * H) * sizeof(float)));
  plan_.lse = static_cast<float*>(lse_.data());
  if (batch.mode == ForwardMode::kIdle || plan_.num_tokens == 0) return Status::Ok();
  if (method == ForwardMethod::kAbsorbed) {
    const AttnCapacity cap{plan_.batch_size, plan_.num_tokens,    0,
                           plan_.max_q_len,  static_cast<int>(H), options_.batch_invariant};
    return plan_absorbed(cap, &absorbed_plan_, nullptr);
  }
  MLA_RETURN_IF_ERROR(plan_mha_main(method));
  if (method == ForwardMethod::kMhaChunked) {
    if (!plan_.has_prefix) {
      plan_.chunks.num_chunks = 0;
      plan_.chunk_epoch = plan_.epoch;
    } else if (plan_chunks) {
      MLA_RETURN_IF_ERROR(plan_mha_chunks());
    }
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// CUDA graphs: static buffers sized once; capture and replay plan into them in place.
Status BackendBase::init_cuda_graph_state(int max_bs, int64_t max_num_tokens) {
  MLA_CHECK_ARG(max_bs >= 1, "{}: max_bs = {} must be >= 1", name_, max_bs);
  MLA_CHECK_ARG(max_num_tokens >= max_bs,
                "{}: max_num_tokens = {} must be >= max_bs = {} (one token per request at least)",
                name_, max_num_tokens, max_bs);
  const AbsorbedAttentionOp* op = ops_->absorbed.get();
  if (op == nullptr) return unsupported("{}: op set '{}' has no absorbed op", name_, ops_->name);
  const int H = options_.model.num_heads;
  graph_cap_ = graph_capacity(max_bs, max_num_tokens, H, options_.batch_invariant);
  graph_ready_ = false;
  const Device dev = options_.device;
  MLA_ASSIGN_OR_RETURN(graph_plan_,
                       DeviceBuffer::allocate(dev, op->plan_bytes(graph_cap_),
                                              name_ + ".graph.absorbed_plan", name_, false));
  MLA_ASSIGN_OR_RETURN(
      graph_out_cache_loc_,
      DeviceBuffer::allocate(dev, static_cast<std::size_t>(max_num_tokens) * sizeof(int32_t),
                             name_ + ".graph.out_cache_loc", name_, false));
  MLA_ASSIGN_OR_RETURN(graph_lse_,
                       DeviceBuffer::allocate(dev, static_cast<std::size_t>(max_num_tokens * H) * 4,
                                              name_ + ".graph.lse", name_, false));
  // Graph batches never fall back. The graph's carve is not the plan of the batch last planned
  // (if any): that plan keeps its own size.
  MLA_ASSIGN_OR_RETURN(const BatchPlan::OpScratch graph_scratch,
                       layout_op_scratch(absorbed_op_workspace_bytes(graph_cap_), false));
  graph_workspace_base_ = graph_scratch.base;
  if (plan_.epoch != 0) {  // an on-demand workspace may have moved: carve the plan's again
    MLA_ASSIGN_OR_RETURN(plan_.op, layout_op_scratch(plan_.op.op_bytes, plan_.fell_back));
  }
  // Host vectors big enough that capture and replay never allocate.
  for (auto* v :
       {&plan_.host.req_rows, &plan_.host.q_lens, &plan_.host.kv_lens, &plan_.host.prefix_lens}) {
    v->reserve(static_cast<std::size_t>(max_bs));
  }
  plan_.host.qo_indptr.reserve(static_cast<std::size_t>(max_bs) + 1);
  plan_.host.kv_indptr.reserve(static_cast<std::size_t>(max_bs) + 1);
  plan_.host.out_cache_loc.reserve(static_cast<std::size_t>(max_num_tokens));
  plan_.host.op_plan.reserve(op->plan_bytes(graph_cap_));
  graph_ready_ = true;
  return Status::Ok();
}

// Plans `batch` padded to padded_bs requests into the static buffers. Padded requests: request
// row 0, seq_len = fill value, the same q_len as the graph's requests, slots in the dummy page.
Status BackendBase::plan_graph(const ForwardBatch& batch, int padded_bs) {
  MLA_CHECK_ARG(graph_ready_, "{}: init_cuda_graph_state was not called", name_);
  const ForwardMode m = batch.mode;
  MLA_CHECK_ARG(m == ForwardMode::kDecode || m == ForwardMode::kTargetVerify ||
                    m == ForwardMode::kDraftExtend,
                "{}: graphs capture decode, target_verify and draft_extend batches, not {}", name_,
                forward_mode_name(m));
  MLA_RETURN_IF_ERROR(validate(batch));
  const int bs = batch.batch_size;
  MLA_CHECK_ARG(padded_bs >= bs && padded_bs <= graph_cap_.max_batch,
                "{}: padded_bs = {} must be in [batch_size = {}, max_bs = {}]", name_, padded_bs,
                bs, graph_cap_.max_batch);
  ++plan_.epoch;
  plan_.method = ForwardMethod::kAbsorbed;
  plan_.fell_back = false;
  MLA_RETURN_IF_ERROR(collect(batch));
  const int32_t fill = cuda_graph_seq_len_fill_value();
  const int32_t pad_q = m == ForwardMode::kTargetVerify ? batch.num_draft_tokens : 1;
  BatchPlan::Host& h = plan_.host;
  h.out_cache_loc.assign(batch.out_cache_loc.begin(), batch.out_cache_loc.end());
  for (int b = bs; b < padded_bs; ++b) {
    h.req_rows.push_back(0);
    h.q_lens.push_back(pad_q);
    h.kv_lens.push_back(m == ForwardMode::kTargetVerify ? fill + pad_q : std::max(fill, pad_q));
    h.prefix_lens.push_back(h.kv_lens.back() - pad_q);
    h.qo_indptr.push_back(h.qo_indptr.back() + pad_q);
    h.kv_indptr.push_back(h.kv_indptr.back() + h.kv_lens.back());
    for (int t = 0; t < pad_q; ++t) h.out_cache_loc.push_back(0);  // dummy page slot 0
  }
  plan_.batch_size = padded_bs;
  plan_.num_tokens = h.qo_indptr.back();
  plan_.kv_tokens = h.kv_indptr.back();
  MLA_CHECK_ARG(plan_.num_tokens <= graph_cap_.max_q_tokens,
                "{}: padded batch has {} tokens, the graph state was sized for {}", name_,
                plan_.num_tokens, graph_cap_.max_q_tokens);
  MLA_RETURN_IF_ERROR(upload(graph_out_cache_loc_.data(), h.out_cache_loc.data(),
                             h.out_cache_loc.size() * sizeof(int32_t)));
  plan_.out_cache_loc = graph_out_cache_loc_.as<int32_t>();
  plan_.lse = graph_lse_.as<float>();
  MLA_RETURN_IF_ERROR(plan_absorbed(graph_cap_, nullptr, graph_plan_.data()));
  if (plan_.op.base != graph_workspace_base_) {
    return internal_error(
        "{}: the workspace moved after init_cuda_graph_state (an eager batch grew it); captured "
        "graphs would read a freed buffer, capture them again",
        name_);
  }
  return Status::Ok();
}

Status BackendBase::init_forward_metadata_capture_cuda_graph(const ForwardBatch& padded_batch) {
  PlanTimer timer(this);
  ++stats_.init_forward_metadata_calls;
  MLA_RETURN_IF_ERROR(plan_graph(padded_batch, padded_batch.batch_size));
  ++stats_.graph_captures;
  return Status::Ok();
}

Status BackendBase::init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch,
                                                            int padded_bs) {
  PlanTimer timer(this);
  ++stats_.init_forward_metadata_calls;
  MLA_RETURN_IF_ERROR(plan_graph(batch, padded_bs));
  ++stats_.graph_replays;
  return Status::Ok();
}

}  // namespace mla::backends
