// The torch custom ops of the Python package (namespace torch.ops.mla). Every op writes into
// tensors the caller passes and allocates nothing; attention ops split into a host plan (into
// pinned staging, then uploaded on the current stream) and a run that reads the plan. Arguments
// are checked here and by the library's ops before anything is written; a rejected call raises
// ValueError (argument errors) or RuntimeError and leaves every output untouched.
// Fake (meta) implementations live in python/mla/_ops.py.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "mla/backend.h"
#include "mla/gpu_support.h"
#include "mla/kv_pool.h"
#include "mla/memory.h"
#include "mla/model.h"
#include "mla/ops.h"
#include "mla/upload_staging.h"
#include "torch_args.h"
#include "torch_plan.h"

namespace mla::torch_ops {

// Host lengths as an int32 span: an int32 tensor is read in place; an int64 one (SGLang keeps
// its host mirrors seq_lens_cpu and req_pool_indices_cpu in int64) is narrowed into `scratch`,
// each value checked to fit, so the engine's tensors need no conversion (and no allocation) in
// Python. Both must be contiguous 1-D cpu tensors.
std::span<const int32_t> host_lengths(const at::Tensor& t, std::string_view name,
                                      std::string_view op, std::vector<int32_t>& scratch) {
  TORCH_CHECK_VALUE(t.defined(), "mla.", op, ": ", name, " is undefined");
  if (t.scalar_type() != at::kLong) {
    check_host_i32(t, name, op);
    return {t.data_ptr<int32_t>(), static_cast<std::size_t>(t.numel())};
  }
  TORCH_CHECK_VALUE(t.is_cpu(), "mla.", op, ": ", name, " is on ", t.device(),
                    "; planning reads host data, pass a cpu tensor");
  TORCH_CHECK_VALUE(t.dim() == 1 && t.is_contiguous(), "mla.", op, ": ", name,
                    " must be a contiguous 1-D tensor, got shape ", t.sizes(), " strides ",
                    t.strides());
  const int64_t* v = t.data_ptr<int64_t>();
  scratch.resize(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < scratch.size(); ++i) {
    TORCH_CHECK_VALUE(v[i] >= INT32_MIN && v[i] <= INT32_MAX, "mla.", op, ": ", name, "[", i,
                      "] = ", v[i], " does not fit int32");
    scratch[i] = static_cast<int32_t>(v[i]);
  }
  return scratch;
}

namespace {

int narrow_int(int64_t v, std::string_view name, std::string_view op) {
  TORCH_CHECK_VALUE(v >= 0 && v <= INT32_MAX, "mla.", op, ": ", name, " = ", v,
                    " must be in [0, 2^31)");
  return static_cast<int>(v);
}

void check_bytes_tensor(const at::Tensor& t, std::string_view name, std::string_view op) {
  TORCH_CHECK_VALUE(t.scalar_type() == at::kByte, "mla.", op, ": ", name, " has dtype ",
                    t.scalar_type(), ", expected uint8");
  TORCH_CHECK_VALUE(t.is_contiguous(), "mla.", op, ": ", name, " must be contiguous, got strides ",
                    t.strides());
}

// ---- plan staging: the pinned ring a plan holder uploads through ----
// One UploadStaging (two pinned buffers used in turn, an event recorded after each plan's upload
// and waited on before the buffer is written again) per plan holder, named by an int handle
// (the op schema carries no C++ object). Handles are checked against the live set, so a stale
// or made-up handle raises instead of being dereferenced.
struct PlanStaging {
  PlanStaging(Device d, std::string name) : device(d), ring(std::move(name), "python", d) {}
  Device device;
  UploadStaging ring;
};

std::mutex& staging_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<int64_t, std::unique_ptr<PlanStaging>>& staging_table() {
  static auto* t = new std::unordered_map<int64_t, std::unique_ptr<PlanStaging>>();
  return *t;  // leaked on purpose: handles may be freed from Python finalizers at exit
}

int64_t staging_new(c10::Device device) {
  constexpr std::string_view op = "staging_new";
  const ExecContext ctx = exec_context(device);
  (void)op_set_for(device, op);
  static int64_t next = 1;
  std::lock_guard<std::mutex> lock(staging_mutex());
  const int64_t handle = next++;
  staging_table().emplace(handle, std::make_unique<PlanStaging>(
                                      ctx.device, "python.plan_staging#" + std::to_string(handle)));
  return handle;
}

void staging_free(int64_t handle) {
  std::unique_ptr<PlanStaging> gone;  // destroyed outside the lock (waits for its uploads)
  {
    std::lock_guard<std::mutex> lock(staging_mutex());
    auto it = staging_table().find(handle);
    TORCH_CHECK_VALUE(it != staging_table().end(), "mla.staging_free: staging = ", handle,
                      " is not a live staging handle");
    gone = std::move(it->second);
    staging_table().erase(it);
  }
}

// Bytes of the ring's two pinned buffers (for a memory ledger).
std::vector<int64_t> staging_bytes(int64_t handle) {
  std::lock_guard<std::mutex> lock(staging_mutex());
  auto it = staging_table().find(handle);
  TORCH_CHECK_VALUE(it != staging_table().end(), "mla.staging_bytes: staging = ", handle,
                    " is not a live staging handle");
  return {static_cast<int64_t>(it->second->ring.capacity(0)),
          static_cast<int64_t>(it->second->ring.capacity(1))};
}

// Times a plan through this ring blocked the host on an upload that had not finished
// (UploadStaging::blocking_waits): the sync counter of planning.
int64_t staging_blocking_waits(int64_t handle) {
  std::lock_guard<std::mutex> lock(staging_mutex());
  auto it = staging_table().find(handle);
  TORCH_CHECK_VALUE(it != staging_table().end(), "mla.staging_blocking_waits: staging = ", handle,
                    " is not a live staging handle");
  return static_cast<int64_t>(it->second->ring.blocking_waits());
}

PlanStaging& staging_of(int64_t handle, const at::Device& device, std::string_view op) {
  std::lock_guard<std::mutex> lock(staging_mutex());
  auto it = staging_table().find(handle);
  TORCH_CHECK_VALUE(it != staging_table().end(), "mla.", op, ": staging = ", handle,
                    " is not a live staging handle (mla.ops.staging_new)");
  PlanStaging& s = *it->second;
  const bool same = device.is_cuda() ? s.device.is_cuda() &&
                                           (!device.has_index() || s.device.index == device.index())
                                     : s.device.is_cpu();
  TORCH_CHECK_VALUE(same, "mla.", op, ": staging = ", handle, " is for ", s.device.to_string(),
                    ", the plan is on ", device);
  return s;
}

// Plans on the host straight into `plan` (cpu), or into the staging ring's pinned bytes and
// uploads the bytes used into `plan` on torch's current stream (the ring's event is recorded
// after it). One op call per plan: no Python-side event or stream calls. Nothing is written to
// `plan` on error.
template <typename PlanFn>
void plan_and_upload(int64_t staging, const at::Tensor& plan, std::size_t plan_bytes,
                     std::string_view op, PlanFn&& plan_fn) {
  check_bytes_tensor(plan, "plan", op);
  TORCH_CHECK_VALUE(static_cast<std::size_t>(plan.numel()) >= plan_bytes, "mla.", op, ": plan has ",
                    plan.numel(), " bytes, the capacity needs ", plan_bytes);
  PlanStaging& s = staging_of(staging, plan.device(), op);
  if (plan.is_cpu()) {
    auto* dst = static_cast<std::byte*>(plan.data_ptr());
    StatusOr<std::size_t> used = plan_fn(std::span<std::byte>(dst, plan_bytes));
    throw_if_error(used.status(), op);
    return;
  }
  const ExecContext ctx = exec_context(plan.device());
  StatusOr<std::byte*> host = s.ring.stage(plan_bytes, ctx.stream);
  throw_if_error(host.status(), op);
  StatusOr<std::size_t> used = plan_fn(std::span<std::byte>(*host, plan_bytes));
  Status st =
      used.ok() ? s.ring.upload_staged(plan.data_ptr(), *host, *used, ctx.stream) : used.status();
  // Closes the call either way: the event orders the next reuse of this buffer after the copy.
  const Status closed = s.ring.close(ctx.stream);
  if (st.ok()) st = closed;
  throw_if_error(st, op);
}

// ---- absorbed (MQA) paged attention ----
std::vector<int64_t> absorbed_sizes(int64_t max_batch, int64_t max_q_tokens, int64_t max_q_len,
                                    int64_t num_heads, c10::Device device) {
  constexpr std::string_view op = "absorbed_sizes";
  const OpSet& set = op_set_for(device, op);
  AttnCapacity cap{narrow_int(max_batch, "max_batch", op), max_q_tokens, 0,
                   narrow_int(max_q_len, "max_q_len", op), narrow_int(num_heads, "num_heads", op)};
  return {static_cast<int64_t>(set.absorbed->plan_bytes(cap)),
          static_cast<int64_t>(set.absorbed->workspace_bytes(cap))};
}

// The extents tensor of a plan holder (int64 cpu [7]): what the last plan reads of its page table
// (mla::TableExtents: max_row, max_kv, flat_end, row_request, kv_request, flat_request) and its
// page_size, written by absorbed_plan and read by absorbed_run for the table-shape check.
constexpr int64_t kExtentsEntries = 7;

void check_extents_tensor(const at::Tensor& e, std::string_view op) {
  TORCH_CHECK_VALUE(e.defined() && e.is_cpu() && e.scalar_type() == at::kLong && e.dim() == 1 &&
                        e.numel() == kExtentsEntries && e.is_contiguous(),
                    "mla.", op, ": extents must be a contiguous int64 cpu tensor of ",
                    kExtentsEntries, " entries");
}

}  // namespace

// An absorbed plan of (req_rows, q_lens, kv_lens) into a plan holder's buffer through its staging
// ring, and its table extents (see kExtentsEntries) when given: what absorbed_plan and the
// engine planner's engine_plan (engine_ops.cc) both do.
void absorbed_plan_spans(std::span<const int32_t> req_rows, std::span<const int32_t> q_lens,
                         std::span<const int32_t> kv_lens, int64_t staging, const at::Tensor& plan,
                         const AttnCapacity& cap, int64_t page_size, bool causal,
                         const std::optional<at::Tensor>& extents, std::string_view op) {
  AbsorbedProblem p;
  p.req_rows = req_rows;
  p.q_lens = q_lens;
  p.kv_lens = kv_lens;
  if (extents.has_value()) check_extents_tensor(*extents, op);
  const OpSet& set = op_set_for(plan.device(), op);
  p.num_heads = cap.num_heads;
  p.page_size = narrow_int(page_size, "page_size", op);
  p.causal = causal;
  // The problem's checks (sizes, capacity, page size, every request's lengths) are the op's
  // plan() (check_absorbed_problem, ops.h), the same rule for every op set and the backends.
  plan_and_upload(staging, plan, set.absorbed->plan_bytes(cap), op,
                  [&](std::span<std::byte> host) { return set.absorbed->plan(p, cap, host); });
  if (extents.has_value()) {
    const TableExtents t = absorbed_table_extents(p.req_rows, p.kv_lens, p.page_size);
    int64_t* e = extents->data_ptr<int64_t>();
    e[0] = t.max_row;
    e[1] = t.max_kv;
    e[2] = t.flat_end;
    e[3] = t.row_request;
    e[4] = t.kv_request;
    e[5] = t.flat_request;
    e[6] = p.page_size;
  }
}

// An MHA plan of (qo_indptr, kv_indptr) into a plan holder's buffer through its staging ring:
// what mha_plan and engine_plan both do.
void mha_plan_spans(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                    int64_t staging, const at::Tensor& plan, const AttnCapacity& cap, bool causal,
                    std::string_view op) {
  TORCH_CHECK_VALUE(qo_indptr.size() == kv_indptr.size() && !qo_indptr.empty(), "mla.", op,
                    ": qo_indptr has ", qo_indptr.size(), " entries and kv_indptr ",
                    kv_indptr.size(), " (both batch_size + 1)");
  const OpSet& set = op_set_for(plan.device(), op);
  throw_if_error(set.mha->supports(cap.num_heads), op);
  MhaProblem p;
  p.num_heads = cap.num_heads;
  p.causal = causal;
  p.qo_indptr = qo_indptr;
  p.kv_indptr = kv_indptr;
  plan_and_upload(staging, plan, set.mha->plan_bytes(cap), op,
                  [&](std::span<std::byte> host) { return set.mha->plan(p, cap, host); });
}

namespace {

// req_rows, q_lens, kv_lens: int32 or int64 host tensors (one entry per request). extents
// (optional): written after a successful plan (see kExtentsEntries).
void absorbed_plan(const at::Tensor& req_rows, const at::Tensor& q_lens, const at::Tensor& kv_lens,
                   int64_t staging, const at::Tensor& plan, int64_t num_heads, int64_t page_size,
                   bool causal, int64_t max_batch, int64_t max_q_tokens, int64_t max_q_len,
                   const std::optional<at::Tensor>& extents) {
  constexpr std::string_view op = "absorbed_plan";
  thread_local std::vector<int32_t> rows_i32, q_i32, kv_i32;  // int64 inputs, narrowed
  const AttnCapacity cap{narrow_int(max_batch, "max_batch", op), max_q_tokens, 0,
                         narrow_int(max_q_len, "max_q_len", op),
                         narrow_int(num_heads, "num_heads", op)};
  absorbed_plan_spans(host_lengths(req_rows, "req_rows", op, rows_i32),
                      host_lengths(q_lens, "q_lens", op, q_i32),
                      host_lengths(kv_lens, "kv_lens", op, kv_i32), staging, plan, cap, page_size,
                      causal, extents, op);
}

// The page table is req_to_token (token-level) or block_table (page ids: [rows, max_blocks], or
// a flat page list whose rows start at the planned req_rows); exactly one is given.
void absorbed_run(const at::Tensor& q, const at::Tensor& kv_cache,
                  const std::optional<at::Tensor>& req_to_token, const at::Tensor& plan,
                  const at::Tensor& workspace, const at::Tensor& o, const at::Tensor& lse,
                  double sm_scale, double k_scale, const std::optional<at::Tensor>& block_table,
                  const std::optional<at::Tensor>& extents) {
  constexpr std::string_view op = "absorbed_run";
  const at::Device dev = q.device();
  const at::Tensor r2t = req_to_token.value_or(at::Tensor());
  const at::Tensor blocks = block_table.value_or(at::Tensor());
  check_same_device(dev,
                    {{&kv_cache, "kv_cache"},
                     {&r2t, "req_to_token"},
                     {&blocks, "block_table"},
                     {&plan, "plan"},
                     {&workspace, "workspace"},
                     {&o, "o"},
                     {&lse, "lse"}},
                    op);
  check_bytes_tensor(plan, "plan", op);
  check_bytes_tensor(workspace, "workspace", op);
  const OpSet& set = op_set_for(dev, op);
  AbsorbedArgs a;
  a.q = to_view(q, "q", op);
  a.kv_cache = to_view(kv_cache, "kv_cache", op);
  a.k_scale = static_cast<float>(k_scale);
  a.req_to_token = to_view(r2t, "req_to_token", op);
  a.block_table = to_view(blocks, "block_table", op);
  a.o = to_view(o, "o", op);
  a.lse = to_view(lse, "lse", op);
  a.sm_scale = static_cast<float>(sm_scale);
  a.plan = plan.data_ptr();
  a.workspace = workspace.numel() ? workspace.data_ptr() : nullptr;
  a.workspace_bytes = static_cast<std::size_t>(workspace.numel());
  if (extents.has_value()) {
    // The table's shape against what the plan reads, on the host before the op runs (the cuda
    // op reads the lengths on the device and cannot): the rule every op set shares.
    check_extents_tensor(*extents, op);
    const int64_t* e = extents->data_ptr<int64_t>();
    const TableExtents t{e[0], e[1], e[2], e[3], e[4], e[5]};
    StatusOr<PageTable> table = absorbed_page_table(a, library_device(dev));
    throw_if_error(
        table.ok() ? check_table_extents(*table, t, static_cast<int>(e[6])) : table.status(), op);
  }
  throw_if_error(set.absorbed->run(a, exec_context(dev)), op);
}

// ---- ragged MHA ----
std::vector<int64_t> mha_sizes(int64_t max_batch, int64_t max_q_tokens, int64_t max_kv_tokens,
                               int64_t max_q_len, int64_t num_heads, c10::Device device) {
  constexpr std::string_view op = "mha_sizes";
  const OpSet& set = op_set_for(device, op);
  AttnCapacity cap{narrow_int(max_batch, "max_batch", op), max_q_tokens, max_kv_tokens,
                   narrow_int(max_q_len, "max_q_len", op), narrow_int(num_heads, "num_heads", op)};
  return {static_cast<int64_t>(set.mha->plan_bytes(cap)),
          static_cast<int64_t>(set.mha->workspace_bytes(cap))};
}

void mha_plan(const at::Tensor& qo_indptr, const at::Tensor& kv_indptr, int64_t staging,
              const at::Tensor& plan, int64_t num_heads, bool causal, int64_t max_batch,
              int64_t max_q_tokens, int64_t max_kv_tokens, int64_t max_q_len) {
  constexpr std::string_view op = "mha_plan";
  check_host_i32(qo_indptr, "qo_indptr", op);
  check_host_i32(kv_indptr, "kv_indptr", op);
  const AttnCapacity cap{narrow_int(max_batch, "max_batch", op), max_q_tokens, max_kv_tokens,
                         narrow_int(max_q_len, "max_q_len", op),
                         narrow_int(num_heads, "num_heads", op)};
  mha_plan_spans({qo_indptr.data_ptr<int32_t>(), static_cast<std::size_t>(qo_indptr.numel())},
                 {kv_indptr.data_ptr<int32_t>(), static_cast<std::size_t>(kv_indptr.numel())},
                 staging, plan, cap, causal, op);
}

void mha_run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& plan,
             const at::Tensor& workspace, const at::Tensor& o, const at::Tensor& lse,
             double sm_scale, bool merge_into_output) {
  constexpr std::string_view op = "mha_run";
  const at::Device dev = q.device();
  check_same_device(
      dev,
      {{&k, "k"}, {&v, "v"}, {&plan, "plan"}, {&workspace, "workspace"}, {&o, "o"}, {&lse, "lse"}},
      op);
  check_bytes_tensor(plan, "plan", op);
  check_bytes_tensor(workspace, "workspace", op);
  const OpSet& set = op_set_for(dev, op);
  MhaArgs a;
  a.q = to_view(q, "q", op);
  a.k = to_view(k, "k", op);
  a.v = to_view(v, "v", op);
  a.o = to_view(o, "o", op);
  a.lse = to_view(lse, "lse", op);
  a.sm_scale = static_cast<float>(sm_scale);
  a.plan = plan.data_ptr();
  a.workspace = workspace.numel() ? workspace.data_ptr() : nullptr;
  a.workspace_bytes = static_cast<std::size_t>(workspace.numel());
  a.merge_into_output = merge_into_output;
  throw_if_error(set.mha->run(a, exec_context(dev)), op);
}

// ---- merge, kv write, gather + up-projection ----
void merge_state_(const at::Tensor& o_acc, const at::Tensor& lse_acc, const at::Tensor& o_b,
                  const at::Tensor& lse_b) {
  constexpr std::string_view op = "merge_state_";
  const at::Device dev = o_acc.device();
  check_same_device(dev, {{&lse_acc, "lse_acc"}, {&o_b, "o_b"}, {&lse_b, "lse_b"}}, op);
  const OpSet& set = op_set_for(dev, op);
  MergeArgs a;
  a.o_acc = to_view(o_acc, "o_acc", op);
  a.lse_acc = to_view(lse_acc, "lse_acc", op);
  a.o_b = to_view(o_b, "o_b", op);
  a.lse_b = to_view(lse_b, "lse_b", op);
  throw_if_error(set.merge->run(a, exec_context(dev)), op);
}

void kv_write(const at::Tensor& c_kv, const at::Tensor& k_pe, const at::Tensor& out_cache_loc,
              const at::Tensor& kv_cache, double k_scale) {
  constexpr std::string_view op = "kv_write";
  const at::Device dev = kv_cache.device();
  check_same_device(dev, {{&c_kv, "c_kv"}, {&k_pe, "k_pe"}, {&out_cache_loc, "out_cache_loc"}}, op);
  const OpSet& set = op_set_for(dev, op);
  KvWriteArgs a;
  a.c_kv = to_view(c_kv, "c_kv", op);
  a.k_pe = to_view(k_pe, "k_pe", op);
  a.out_cache_loc = to_view(out_cache_loc, "out_cache_loc", op);
  a.kv_cache = to_view(kv_cache, "kv_cache", op);
  a.k_scale = static_cast<float>(k_scale);
  throw_if_error(set.kv_write->run(a, exec_context(dev)), op);
}

int64_t up_project_workspace_bytes(int64_t max_tokens, int64_t num_heads, c10::Device device) {
  constexpr std::string_view op = "up_project_workspace_bytes";
  const OpSet& set = op_set_for(device, op);
  return static_cast<int64_t>(
      set.up_project->workspace_bytes(max_tokens, narrow_int(num_heads, "num_heads", op)));
}

void up_project(const at::Tensor& kv_cache, const at::Tensor& slots, const at::Tensor& kv_b_proj,
                const at::Tensor& workspace, const at::Tensor& k, const at::Tensor& v,
                double k_scale) {
  constexpr std::string_view op = "up_project";
  const at::Device dev = kv_cache.device();
  check_same_device(dev,
                    {{&slots, "slots"},
                     {&kv_b_proj, "kv_b_proj"},
                     {&workspace, "workspace"},
                     {&k, "k"},
                     {&v, "v"}},
                    op);
  check_bytes_tensor(workspace, "workspace", op);
  const OpSet& set = op_set_for(dev, op);
  UpProjectArgs a;
  a.kv_cache = to_view(kv_cache, "kv_cache", op);
  a.k_scale = static_cast<float>(k_scale);
  a.slots = to_view(slots, "slots", op);
  a.kv_b_proj = to_view(kv_b_proj, "kv_b_proj", op);
  a.k = to_view(k, "k", op);
  a.v = to_view(v, "v", op);
  a.workspace = workspace.numel() ? workspace.data_ptr() : nullptr;
  a.workspace_bytes = static_cast<std::size_t>(workspace.numel());
  throw_if_error(set.up_project->run(a, exec_context(dev)), op);
}

// ---- the forward-method rule (SYSTEM.md 6) of a family, for mla.Backend ----
// The C++ backends' own chooser (family_forward_method) over the lengths the engine keeps on
// the host: one rule for the C++ backends and the Python adapters. Returns the method's name:
// absorbed, mha_one_shot or mha_chunked.
std::string forward_method(const std::string& family, const std::string& mode,
                           const at::Tensor& prefix_lens, int64_t seq_lens_sum,
                           int64_t mha_prefix_threshold, int64_t chunked_prefix_capacity,
                           bool disable_chunked_prefix_cache, bool piecewise_cuda_graph,
                           bool batch_invariant) {
  constexpr std::string_view op = "forward_method";
  ForwardBatch batch;
  TORCH_CHECK_VALUE(parse_forward_mode(mode, &batch.mode), "mla.forward_method: mode = '", mode,
                    "' is not one of decode, extend, mixed, target_verify, draft_extend, idle");
  check_host_i32(prefix_lens, "prefix_lens", op);
  const auto* p = prefix_lens.data_ptr<int32_t>();
  batch.extend_prefix_lens.assign(p, p + prefix_lens.numel());
  batch.batch_size = static_cast<int>(batch.extend_prefix_lens.size());
  batch.seq_lens_sum = seq_lens_sum;
  BackendOptions o;
  o.mha_prefix_threshold = mha_prefix_threshold;
  o.chunked_prefix_capacity = chunked_prefix_capacity;
  o.disable_chunked_prefix_cache = disable_chunked_prefix_cache;
  o.piecewise_cuda_graph = piecewise_cuda_graph;
  o.batch_invariant = batch_invariant;
  StatusOr<ForwardMethod> m = family_forward_method(family, o, batch);
  throw_if_error(m.status(), op);
  return std::string(forward_method_name(*m));
}

// ---- what mla serves: the library's constants and rules, for Python (mla.support) ----
// [kv_lora_rank, qk_rope_dim, qk_nope_dim, v_head_dim, latent_dim, qk_head_dim, max_heads]
std::vector<int64_t> model_dims() {
  return {kKvLoraRank, kQkRopeDim, kQkNopeDim, kVHeadDim, kLatentDim, kQkHeadDim, kMaxHeads};
}

std::vector<int64_t> page_sizes() { return {std::begin(kPageSizes), std::end(kPageSizes)}; }

// torch's name of a latent cache dtype ("bfloat16"), and back.
constexpr std::pair<DType, std::string_view> kTorchDtypeNames[] = {
    {DType::kBF16, "bfloat16"}, {DType::kFP8E4M3, "float8_e4m3fn"}, {DType::kF32, "float32"}};

std::string torch_dtype_name(DType d) {
  for (const auto& [dtype, name] : kTorchDtypeNames) {
    if (dtype == d) return std::string(name);
  }
  return std::string(dtype_name(d));
}

std::vector<std::string> cache_dtypes() {
  std::vector<std::string> out;
  for (DType d : kCacheDTypes) out.push_back(torch_dtype_name(d));
  return out;
}

// Raises ValueError "<field> = <page_size> is not served (mla serves page sizes ...)" unless the
// page size is one of kPageSizes (mla::check_page_size).
void check_page_size(int64_t page_size, const std::string& field) {
  TORCH_CHECK_VALUE(page_size >= INT32_MIN && page_size <= INT32_MAX,
                    "mla.check_page_size: ", field, " = ", page_size, " is out of range");
  throw_if_error(mla::check_page_size(static_cast<int>(page_size), field), "check_page_size");
}

// The compute capability of a cuda device, [major, minor], by the library's query (the cuda
// runtime, or the fake a test installed with set_fake_compute_capability).
std::vector<int64_t> compute_capability(c10::Device device) {
  StatusOr<ComputeCapability> c = mla::compute_capability(library_device(device));
  throw_if_error(c.status(), "compute_capability");
  return {c->major, c->minor};
}

// The GPU rule for a given capability: "" when the cuda op set has code for it, else why not
// (what it needs, what `device` has). The capabilities are the registered cuda op set's, or, in
// a build without it, those its kernels are built for (kCudaKernelCapabilities).
std::string cuda_capability_refusal(int64_t major, int64_t minor, const std::string& device) {
  const OpSet* set = OpRegistry::global().default_for(DeviceType::kCuda);
  const std::span<const ComputeCapability> built_for =
      set != nullptr ? std::span<const ComputeCapability>(set->compute_capabilities)
                     : std::span<const ComputeCapability>(kCudaKernelCapabilities);
  const ComputeCapability found{static_cast<int>(major), static_cast<int>(minor)};
  const Status st =
      check_compute_capability(set != nullptr ? set->name : "cuda", built_for, found, device);
  return st.ok() ? std::string() : st.message();
}

// Test seam (gpu_support.h): every capability query answers (major, minor) until major < 0
// restores the runtime's. Python tests use it to fake a GPU the library has no code for.
void set_fake_compute_capability(int64_t major, int64_t minor) {
  if (major < 0) {
    set_compute_capability_query(nullptr);
    return;
  }
  const ComputeCapability fake{static_cast<int>(major), static_cast<int>(minor)};
  set_compute_capability_query([fake](Device d) -> StatusOr<ComputeCapability> {
    if (!d.is_cuda()) return unsupported("{} has no compute capability", d.to_string());
    return fake;
  });
}

// The construction check of a backend over an engine's own pools (check_backend_config): the
// head count, page size, cache dtype (torch's name: "torch.bfloat16" or "bfloat16"), the op set
// of the device and its GPU. Raises ValueError naming the field, its value and what is served.
void check_backend_config(const std::string& who, c10::Device device, int64_t num_heads,
                          int64_t page_size, const std::string& kv_cache_dtype) {
  constexpr std::string_view op = "check_backend_config";
  std::string_view name = kv_cache_dtype;
  if (name.starts_with("torch.")) name.remove_prefix(6);
  const auto* known = std::find_if(std::begin(kTorchDtypeNames), std::end(kTorchDtypeNames),
                                   [name](const auto& e) { return e.second == name; });
  if (known == std::end(kTorchDtypeNames) || !is_supported_cache_dtype(known->first)) {
    std::string served;
    for (const std::string& d : cache_dtypes())
      served += (served.empty() ? "torch." : " or torch.") + d;
    TORCH_CHECK_VALUE(false, "mla.", op, ": ", who, ": kv_cache_dtype = ", kv_cache_dtype,
                      " is not served (mla stores the latent cache in ", served, ")");
  }
  BackendOptions o;
  o.device = library_device(device);
  TORCH_CHECK_VALUE(num_heads >= INT32_MIN && num_heads <= INT32_MAX, "mla.", op, ": ", who,
                    ": num_heads = ", num_heads, " is out of range");
  TORCH_CHECK_VALUE(page_size >= INT32_MIN && page_size <= INT32_MAX, "mla.", op, ": ", who,
                    ": page_size = ", page_size, " is out of range");
  o.model.num_heads = static_cast<int>(num_heads);
  throw_if_error(
      mla::check_backend_config(o, static_cast<int>(page_size), known->first, who).status(), op);
}

}  // namespace
}  // namespace mla::torch_ops

using namespace mla::torch_ops;  // NOLINT: the registration below names the functions above

TORCH_LIBRARY(mla, m) {
  m.def(
      "forward_method(str family, str mode, Tensor prefix_lens, int seq_lens_sum, "
      "int mha_prefix_threshold, int chunked_prefix_capacity, bool disable_chunked_prefix_cache, "
      "bool piecewise_cuda_graph, bool batch_invariant) -> str",
      &forward_method);
  m.def("model_dims() -> int[]", &model_dims);
  m.def("page_sizes() -> int[]", &page_sizes);
  m.def("cache_dtypes() -> str[]", &cache_dtypes);
  m.def("check_page_size(int page_size, str field) -> ()", &check_page_size);
  m.def("compute_capability(Device device) -> int[]", &compute_capability);
  m.def("cuda_capability_refusal(int major, int minor, str device) -> str",
        &cuda_capability_refusal);
  m.def("set_fake_compute_capability(int major, int minor) -> ()", &set_fake_compute_capability);
  m.def(
      "check_backend_config(str who, Device device, int num_heads, int page_size, "
      "str kv_cache_dtype) -> ()",
      &check_backend_config);
  m.def("staging_new(Device device) -> int", &staging_new);
  m.def("staging_free(int staging) -> ()", &staging_free);
  m.def("staging_bytes(int staging) -> int[]", &staging_bytes);
  m.def("staging_blocking_waits(int staging) -> int", &staging_blocking_waits);
  m.def(
      "absorbed_sizes(int max_batch, int max_q_tokens, int max_q_len, int num_heads, "
      "Device device) -> int[]",
      &absorbed_sizes);
  m.def(
      "absorbed_plan(Tensor req_rows, Tensor q_lens, Tensor kv_lens, int staging, "
      "Tensor(b!) plan, int num_heads, int page_size, bool causal, int max_batch, "
      "int max_q_tokens, int max_q_len, Tensor(c!)? extents=None) -> ()");
  m.def(
      "absorbed_run(Tensor q, Tensor kv_cache, Tensor? req_to_token, Tensor plan, "
      "Tensor(a!) workspace, Tensor(b!) o, Tensor(c!) lse, float sm_scale, float k_scale, "
      "Tensor? block_table=None, Tensor? extents=None) -> ()");
  m.def(
      "mha_sizes(int max_batch, int max_q_tokens, int max_kv_tokens, int max_q_len, "
      "int num_heads, Device device) -> int[]",
      &mha_sizes);
  m.def(
      "mha_plan(Tensor qo_indptr, Tensor kv_indptr, int staging, Tensor(b!) plan, "
      "int num_heads, bool causal, int max_batch, int max_q_tokens, int max_kv_tokens, "
      "int max_q_len) -> ()");
  m.def(
      "mha_run(Tensor q, Tensor k, Tensor v, Tensor plan, Tensor(a!) workspace, Tensor(b!) o, "
      "Tensor(c!) lse, float sm_scale, bool merge_into_output=False) -> ()");
  m.def("merge_state_(Tensor(a!) o_acc, Tensor(b!) lse_acc, Tensor o_b, Tensor lse_b) -> ()");
  m.def(
      "kv_write(Tensor c_kv, Tensor k_pe, Tensor out_cache_loc, Tensor(a!) kv_cache, "
      "float k_scale) -> ()");
  m.def("up_project_workspace_bytes(int max_tokens, int num_heads, Device device) -> int",
        &up_project_workspace_bytes);
  m.def(
      "up_project(Tensor kv_cache, Tensor slots, Tensor kv_b_proj, Tensor(a!) workspace, "
      "Tensor(b!) k, Tensor(c!) v, float k_scale) -> ()");
}

// The same functions serve both devices: each picks the op set of its tensors' device.
#define MLA_TORCH_IMPLS(m)                 \
  m.impl("absorbed_plan", &absorbed_plan); \
  m.impl("absorbed_run", &absorbed_run);   \
  m.impl("mha_plan", &mha_plan);           \
  m.impl("mha_run", &mha_run);             \
  m.impl("merge_state_", &merge_state_);   \
  m.impl("kv_write", &kv_write);           \
  m.impl("up_project", &up_project);

TORCH_LIBRARY_IMPL(mla, CPU, m){MLA_TORCH_IMPLS(m)}
#ifdef MLA_TORCH_CUDA
TORCH_LIBRARY_IMPL(mla, CUDA, m) {
  MLA_TORCH_IMPLS(m)
}
#endif
