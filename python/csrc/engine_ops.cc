// The engine planner bound for mla.Backend (torch.ops.mla.engine_*): a backend family's per-batch
// planning over an engine's own pools (mla::backends::EnginePlanner, the same lengths, checks,
// method and fallback rule as the C++ backends), named by an int handle as the plan stagings are
// (docs/design-decisions.md, "Plan staging in the op library"). The plan holders (device plan
// buffer, staging ring, extents) are the Python backend's mla.ops.AbsorbedPlan objects,
// registered here once; one engine_plan call per batch checks the engine's host lengths, decides,
// and plans the absorbed op into the holder the planner picked.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "mla/engine_planner.h"
#include "torch_args.h"
#include "torch_plan.h"

namespace mla::torch_ops {
namespace {

struct Holder {
  int64_t staging = 0;
  at::Tensor plan, extents;
  AttnCapacity cap;
};

struct EngineState {
  explicit EngineState(EnginePlanner p) : planner(std::move(p)) {}
  EnginePlanner planner;
  int64_t page_size = 1;
  Holder eager, graph, mha;
  std::vector<Holder> chunks;                   // one per prefix chunk index, reused across batches
  std::vector<int32_t> rows, seq, ext, prefix;  // int64 inputs, narrowed
};

std::mutex& engine_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<int64_t, std::unique_ptr<EngineState>>& engine_table() {
  static auto* t = new std::unordered_map<int64_t, std::unique_ptr<EngineState>>();
  return *t;  // leaked on purpose: handles may be freed from Python finalizers at exit
}

EngineState& engine_of(int64_t handle, std::string_view op) {
  std::lock_guard<std::mutex> lock(engine_mutex());
  auto it = engine_table().find(handle);
  TORCH_CHECK_VALUE(it != engine_table().end(), "mla.", op, ": engine = ", handle,
                    " is not a live engine planner handle (torch.ops.mla.engine_new)");
  return *it->second;
}

int to_int(int64_t v, std::string_view name, std::string_view op) {
  TORCH_CHECK_VALUE(v >= 0 && v <= INT32_MAX, "mla.", op, ": ", name, " = ", v,
                    " must be in [0, 2^31)");
  return static_cast<int>(v);
}

std::vector<int64_t> capacity_list(const AttnCapacity& c) {
  return {c.max_batch, c.max_q_tokens, c.max_q_len};
}

// [handle, max_batch, max_q_tokens, max_q_len of the eager holder to build now (0: none)]
std::vector<int64_t> engine_new(const std::string& family, int64_t num_heads, int64_t page_size,
                                int64_t max_batch, int64_t max_q_len, int64_t max_extend_tokens,
                                int64_t mha_prefix_threshold, bool disable_chunked_prefix_cache,
                                bool piecewise_cuda_graph, bool batch_invariant) {
  constexpr std::string_view op = "engine_new";
  BackendOptions o;
  o.model.num_heads = to_int(num_heads, "num_heads", op);
  o.max_batch = to_int(max_batch, "max_batch", op);
  o.max_q_len = to_int(max_q_len, "max_q_len", op);
  o.mha_prefix_threshold = mha_prefix_threshold;
  o.disable_chunked_prefix_cache = disable_chunked_prefix_cache;
  o.piecewise_cuda_graph = piecewise_cuda_graph;
  o.batch_invariant = batch_invariant;
  StatusOr<EnginePlanner> p = EnginePlanner::create(family, o, max_extend_tokens);
  throw_if_error(p.status(), op);
  auto state = std::make_unique<EngineState>(std::move(p).value());
  state->page_size = page_size;
  const AttnCapacity first = state->planner.initial_eager_capacity();
  static int64_t next = 1;
  std::lock_guard<std::mutex> lock(engine_mutex());
  const int64_t handle = next++;
  engine_table().emplace(handle, std::move(state));
  return {handle, first.max_batch, first.max_q_tokens, first.max_q_len};
}

void engine_free(int64_t handle) {
  std::unique_ptr<EngineState> gone;
  std::lock_guard<std::mutex> lock(engine_mutex());
  auto it = engine_table().find(handle);
  TORCH_CHECK_VALUE(it != engine_table().end(), "mla.engine_free: engine = ", handle,
                    " is not a live engine planner handle");
  gone = std::move(it->second);
  engine_table().erase(it);
}

// Registers a plan holder: kind 0 the eager absorbed one, 1 the CUDA-graph absorbed one (both
// with their extents tensor), 2 the MHA one (the ragged causal pass over the new tokens), 3 the
// one of prefix chunk `index` (non-causal); its staging handle, plan buffer and capacity.
void engine_set_holder(int64_t engine, int64_t kind, int64_t staging, const at::Tensor& plan,
                       const std::optional<at::Tensor>& extents, int64_t max_batch,
                       int64_t max_q_tokens, int64_t max_q_len, int64_t max_kv_tokens,
                       int64_t index) {
  constexpr std::string_view op = "engine_set_holder";
  EngineState& e = engine_of(engine, op);
  TORCH_CHECK_VALUE(kind >= 0 && kind <= 3, "mla.", op, ": kind = ", kind,
                    " is not 0 (eager), 1 (graph), 2 (mha) or 3 (prefix chunk)");
  TORCH_CHECK_VALUE(index >= 0 && index < (int64_t{1} << 20), "mla.", op, ": index = ", index,
                    " is out of range");
  TORCH_CHECK_VALUE(kind >= 2 || extents.has_value(), "mla.", op,
                    ": an absorbed plan holder needs its extents tensor");
  Holder h;
  h.staging = staging;
  h.plan = plan;
  h.extents = extents.value_or(at::Tensor());
  h.cap = AttnCapacity{to_int(max_batch, "max_batch", op), max_q_tokens, max_kv_tokens,
                       to_int(max_q_len, "max_q_len", op), e.planner.num_heads()};
  if (kind == 0) {
    e.eager = h;
    e.planner.set_eager_capacity(h.cap);
  } else if (kind == 1) {
    e.graph = h;
    e.planner.set_graph_capacity(h.cap);
  } else if (kind == 2) {
    e.mha = h;
    e.planner.set_mha_capacity(h.cap);
  } else {
    if (e.chunks.size() <= static_cast<std::size_t>(index)) {
      e.chunks.resize(static_cast<std::size_t>(index) + 1);
    }
    e.chunks[static_cast<std::size_t>(index)] = h;
  }
}

// The capacity of a CUDA graph's plan holder: [max_bs, max_num_tokens, max_q_len].
std::vector<int64_t> engine_graph_capacity(int64_t max_bs, int64_t max_num_tokens) {
  constexpr std::string_view op = "engine_graph_capacity";
  TORCH_CHECK_VALUE(max_bs >= 1 && max_num_tokens >= max_bs, "mla.", op, ": max_bs = ", max_bs,
                    " and max_num_tokens = ", max_num_tokens,
                    " (max_bs >= 1, at least one token per request)");
  return capacity_list(graph_capacity(to_int(max_bs, "max_bs", op), max_num_tokens, 0, false));
}

// One batch: [target, method, fell_back, batch_size, num_tokens, max_q_len, has_prefix,
// capacity max_batch, max_q_tokens, max_q_len, max_kv_tokens]. target: PlanTarget (0 none,
// 1 eager, 2 graph, 3 grow the eager holder, 4 mha, 5 grow the MHA holder: build a holder of the
// capacity, register it, call again); method: EngineMethod (0 absorbed, 1 mha, 2 mha_chunked).
// The plan is made into the holder of the target (absorbed: eager or graph; MHA: the ragged
// causal pass over the new tokens).
std::vector<int64_t> engine_plan(int64_t engine, const std::string& mode,
                                 const at::Tensor& req_rows, const at::Tensor& seq_lens,
                                 const std::optional<at::Tensor>& extend_seq_lens,
                                 const std::optional<at::Tensor>& extend_prefix_lens,
                                 int64_t num_draft_tokens, int64_t kv_extra) {
  constexpr std::string_view op = "engine_plan";
  EngineState& e = engine_of(engine, op);
  EngineBatch b;
  TORCH_CHECK_VALUE(parse_forward_mode(mode, &b.mode), "mla.", op, ": mode = '", mode,
                    "' is not one of decode, extend, mixed, target_verify, draft_extend, idle");
  b.req_rows = host_lengths(req_rows, "req_pool_indices", op, e.rows);
  b.seq_lens = host_lengths(seq_lens, "seq_lens", op, e.seq);
  if (extend_seq_lens.has_value()) {
    b.extend_seq_lens = host_lengths(*extend_seq_lens, "extend_seq_lens", op, e.ext);
  }
  if (extend_prefix_lens.has_value()) {
    b.extend_prefix_lens = host_lengths(*extend_prefix_lens, "extend_prefix_lens", op, e.prefix);
  }
  b.num_draft_tokens = to_int(num_draft_tokens, "num_draft_tokens", op);
  b.kv_extra = to_int(kv_extra, "kv_extra", op);
  EngineDecision d;
  throw_if_error(e.planner.plan(b, &d), op);
  const BatchLengths& l = e.planner.lengths();
  if (d.target == PlanTarget::kEager || d.target == PlanTarget::kGraph) {
    const Holder& h = d.target == PlanTarget::kGraph ? e.graph : e.eager;
    absorbed_plan_spans(b.req_rows, l.q_lens, l.kv_lens, h.staging, h.plan, h.cap, e.page_size,
                        /*causal=*/true, h.extents, op);
  } else if (d.target == PlanTarget::kMha) {
    mha_plan_spans(l.qo_indptr, l.qo_indptr, e.mha.staging, e.mha.plan, e.mha.cap,
                   /*causal=*/true, op);
  }
  const AttnCapacity& c = d.capacity;
  return {static_cast<int64_t>(d.target),
          static_cast<int64_t>(d.method),
          d.fell_back,
          d.shape.batch_size,
          d.shape.num_tokens,
          d.shape.max_q_len,
          d.shape.has_prefix,
          c.max_batch,
          c.max_q_tokens,
          c.max_q_len,
          c.max_kv_tokens};
}

bool holds(const AttnCapacity& held, const AttnCapacity& needed) {
  return held.max_batch >= needed.max_batch && held.max_q_tokens >= needed.max_q_tokens &&
         held.max_kv_tokens >= needed.max_kv_tokens && held.max_q_len >= needed.max_q_len;
}

// The prefix chunks of the MHA-chunked batch last planned (cu: int32 cpu [chunks, bs + 1], the
// cumulative keys per request of each chunk, as the engine gathers them), checked to cover every
// request's prefix exactly (EnginePlanner::check_prefix_chunks), then one non-causal MHA plan per
// chunk into its holder. [0, chunks] when planned; [1, index, max_batch, max_q_tokens, max_q_len,
// max_kv_tokens] when the holder of chunk `index` is missing or too small (build it, register
// it, call again; nothing was planned).
std::vector<int64_t> engine_plan_chunks(int64_t engine, const at::Tensor& cu) {
  constexpr std::string_view op = "engine_plan_chunks";
  EngineState& e = engine_of(engine, op);
  TORCH_CHECK_VALUE(cu.defined() && cu.is_cpu() && cu.scalar_type() == at::kInt && cu.dim() == 2 &&
                        cu.is_contiguous(),
                    "mla.", op,
                    ": prefix chunks must be a contiguous int32 cpu tensor [chunks, "
                    "batch_size + 1], got ",
                    cu.sizes(), " ", cu.scalar_type(), " on ", cu.device());
  const int chunks = static_cast<int>(cu.size(0));
  const std::span<const int32_t> all(cu.data_ptr<int32_t>(), static_cast<std::size_t>(cu.numel()));
  thread_local std::vector<AttnCapacity> caps;
  throw_if_error(e.planner.check_prefix_chunks(all, chunks, &caps), op);
  for (int c = 0; c < chunks; ++c) {
    const std::size_t i = static_cast<std::size_t>(c);
    if (i >= e.chunks.size() || !e.chunks[i].plan.defined() || !holds(e.chunks[i].cap, caps[i])) {
      const AttnCapacity g = i < e.chunks.size() && e.chunks[i].plan.defined()
                                 ? EnginePlanner::grown_chunk(e.chunks[i].cap, caps[i])
                                 : caps[i];
      return {1, c, g.max_batch, g.max_q_tokens, g.max_q_len, g.max_kv_tokens};
    }
  }
  const std::vector<int32_t>& qo = e.planner.lengths().qo_indptr;
  const std::size_t row = qo.size();
  for (int c = 0; c < chunks; ++c) {
    const Holder& h = e.chunks[static_cast<std::size_t>(c)];
    mha_plan_spans(qo, all.subspan(static_cast<std::size_t>(c) * row, row), h.staging, h.plan,
                   h.cap, /*causal=*/false, op);
  }
  return {0, chunks};
}

at::Tensor i32_tensor(const std::vector<int32_t>& v) {
  at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::kInt);
  std::copy(v.begin(), v.end(), t.data_ptr<int32_t>());
  return t;
}

// The lengths of the batch last planned, as new int32 cpu tensors:
// [q_lens, kv_lens, prefix_lens, qo_indptr, kv_indptr].
std::vector<at::Tensor> engine_lengths(int64_t engine) {
  const BatchLengths& l = engine_of(engine, "engine_lengths").planner.lengths();
  return {i32_tensor(l.q_lens), i32_tensor(l.kv_lens), i32_tensor(l.prefix_lens),
          i32_tensor(l.qo_indptr), i32_tensor(l.kv_indptr)};
}

// The family's workspace (mla::family_workspace): [policy (0 shared, 1 shared-zeroed,
// 2 on-demand), bytes, reserved, fallback_bytes], what mla.Backend backs its ops with.
std::vector<int64_t> engine_workspace(int64_t engine) {
  constexpr std::string_view op = "engine_workspace";
  StatusOr<FamilyWorkspace> w = engine_of(engine, op).planner.workspace();
  throw_if_error(w.status(), op);
  return {static_cast<int64_t>(w->policy), static_cast<int64_t>(w->bytes),
          static_cast<int64_t>(w->reserved), static_cast<int64_t>(w->fallback_bytes)};
}

// The chunked-prefix planner (SYSTEM.md 6, prefix_chunk_lens): len[c, b] of every
// chunk, int32 [num_chunks, bs], for prefix lengths (int32 / int64 cpu) and a capacity.
at::Tensor chunk_plan(const at::Tensor& prefix_lens, int64_t capacity) {
  constexpr std::string_view op = "chunk_plan";
  std::vector<int32_t> scratch;
  const std::span<const int32_t> p = host_lengths(prefix_lens, "prefix_lens", op, scratch);
  std::vector<int32_t> lens;
  StatusOr<int> chunks = prefix_chunk_lens(p, capacity, &lens);
  throw_if_error(chunks.status(), op);
  at::Tensor out = at::empty({*chunks, static_cast<int64_t>(p.size())}, at::kInt);
  std::copy(lens.begin(), lens.end(), out.data_ptr<int32_t>());
  return out;
}

}  // namespace
}  // namespace mla::torch_ops

TORCH_LIBRARY_FRAGMENT(mla, m) {
  using namespace mla::torch_ops;  // NOLINT: the registration below names the functions above
  m.def(
      "engine_new(str family, int num_heads, int page_size, int max_batch, int max_q_len, "
      "int max_extend_tokens, int mha_prefix_threshold, bool disable_chunked_prefix_cache, "
      "bool piecewise_cuda_graph, bool batch_invariant) -> int[]",
      &engine_new);
  m.def("engine_free(int engine) -> ()", &engine_free);
  m.def(
      "engine_set_holder(int engine, int kind, int staging, Tensor plan, Tensor? extents, "
      "int max_batch, int max_q_tokens, int max_q_len, int max_kv_tokens, int index=0) -> ()",
      &engine_set_holder);
  m.def("engine_graph_capacity(int max_bs, int max_num_tokens) -> int[]", &engine_graph_capacity);
  m.def(
      "engine_plan(int engine, str mode, Tensor req_rows, Tensor seq_lens, "
      "Tensor? extend_seq_lens, Tensor? extend_prefix_lens, int num_draft_tokens, "
      "int kv_extra) -> int[]",
      &engine_plan);
  m.def("engine_plan_chunks(int engine, Tensor cu) -> int[]", &engine_plan_chunks);
  m.def("engine_lengths(int engine) -> Tensor[]", &engine_lengths);
  m.def("chunk_plan(Tensor prefix_lens, int capacity) -> Tensor", &chunk_plan);
  m.def("engine_workspace(int engine) -> int[]", &engine_workspace);
}
