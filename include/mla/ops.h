// The ops: one abstract interface per op, one implementation per device, registered by name.
// Backends compose ops; ops know nothing of backends.
//
// Plan/run split (attention ops): plan() is a pure host function over host data that writes a
// self-contained plan (request rows, lengths, schedule) into caller-provided host bytes; the
// caller uploads those bytes once into a device buffer sized by plan_bytes(capacity); run() reads
// the plan from that device buffer, allocates nothing and never syncs, so it can be captured in a
// CUDA graph and replayed after re-planning into the same buffer. The launch shape of run()
// depends only on the capacity, never on the batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mla/gpu_support.h"
#include "mla/status.h"
#include "mla/tensor.h"
#include "mla/types.h"

namespace mla {

struct ExecContext {
  Device device = Device::cpu();
  void* stream = nullptr;  // cudaStream_t on cuda; unused on cpu
};

// Slot of token i of pool row r, read straight from req_to_token (no token-level copy):
//   page_size == 1: req_to_token[r, i]
//   otherwise:      req_to_token[r, (i / P) * P] + i % P   (pages are P-aligned in slot space)
inline int64_t slot_of_token(const int32_t* req_to_token, int64_t row_stride, int row, int64_t i,
                             int page_size) {
  if (page_size == 1) return req_to_token[row * row_stride + i];
  const int64_t first = req_to_token[row * row_stride + (i / page_size) * page_size];
  return first + i % page_size;
}

// Slot of token i of row r of a block table of page ids (FlashMLA's and vLLM's form,
// [rows, max_blocks]): block_table[r, i / P] * P + i % P.
inline int64_t slot_of_block(const int32_t* block_table, int64_t row_stride, int row, int64_t i,
                             int page_size) {
  const int64_t page = block_table[row * row_stride + i / page_size];
  return page * page_size + i % page_size;
}

// Capacity that plan and workspace buffers are sized for, once (graphs, fixed workspaces).
struct AttnCapacity {
  int max_batch = 0;          // requests
  int64_t max_q_tokens = 0;   // sum of q_len
  int64_t max_kv_tokens = 0;  // MHA: sum of kv_len (ragged K/V rows); absorbed: unused
  int max_q_len = 1;          // absorbed: longest q_len per request the plan must handle
  int num_heads = 0;
  // BackendOptions::batch_invariant: a request's split of its keys (and the tile rows) must not
  // depend on the other requests of the batch (cuda absorbed: fixed split boundaries).
  bool batch_invariant = false;
};

// ---------------------------------------------------------------------------------------------
// Absorbed (MQA) paged attention: q [T, H, 576] against the paged latent cache.
// logits = sm_scale * (q[:, :, :512] . c_kv + q[:, :, 512:] . k_pe) (times k_scale for fp8),
// o = softmax @ c_kv -> [T, H, 512], lse natural log, [T, H]. Causal is bottom-right aligned:
// query j of a request with q_len q and kv_len k sees keys 0 .. k - q + j (FlashMLA's
// tril(diagonal = k - q)), so with k < q the first q - k queries see none. A row that sees no
// key (kv_len 0, or such a query) -> o = 0, lse = -inf. Head counts: cpu any >= 1; cuda 1..128.
// Tokens of request b are rows qo_indptr[b] .. qo_indptr[b+1] of q.
struct AbsorbedProblem {
  int num_heads = 0;
  int page_size = 1;
  bool causal = true;
  std::span<const int32_t> req_rows;  // [bs] pool row of each request in req_to_token
  std::span<const int32_t> q_lens;    // [bs]
  std::span<const int32_t> kv_lens;   // [bs] (any, causal too: see above)
};

// The request checks of an absorbed problem against the capacity it is planned for: the one
// rule every op set's plan() applies (the torch binding and the backends reach it through
// plan()). kInvalidArgument naming the field, the request and the value; nothing is written.
//   check_absorbed_shape (O(1)): req_rows, q_lens and kv_lens have one entry per request, the
//     batch size is at most cap.max_batch, num_heads >= 1 and equal to cap.num_heads (0 in a
//     capacity: any), page_size one of kPageSizes (kv_pool.h);
//   check_absorbed_requests (per request): q_lens[b], kv_lens[b], req_rows[b] >= 0,
//     q_lens[b] <= cap.max_q_len, and sum(q_lens) <= cap.max_q_tokens. Causal kv_len < q_len is
//     allowed (see above).
// An op's own limits (the cuda op's 1..kMaxHeads heads) are its supports(). A planner that
// checks the requests in its own fast pass calls check_absorbed_requests only when that pass
// finds a bad one, for the message (cuda build_plan).
Status check_absorbed_shape(const AbsorbedProblem& problem, const AttnCapacity& cap);
Status check_absorbed_requests(const AbsorbedProblem& problem, const AttnCapacity& cap);
Status check_absorbed_problem(const AbsorbedProblem& problem, const AttnCapacity& cap);  // both

// The page table is given in one of two forms, read in place (no token-level copy): exactly one
// of req_to_token and block_table is set (the other left empty, data null). The plan's req_rows
// index the rows of whichever is given.
struct AbsorbedArgs {
  TensorView q;             // bf16 [T, H, 576]
  TensorView kv_cache;      // bf16 | fp8e4m3 [num_slots, 576]
  float k_scale = 1.0f;     // applied only when kv_cache is fp8
  TensorView req_to_token;  // i32 [rows, max_context_len]: SGLang's token-level table
  // i32 [rows, max_blocks]: page ids (FlashMLA / vLLM), or i32 [num_pages] flat: the page list
  // of a request starts at element req_rows[b] (FlashInfer's kv_indices, req_rows = kv_indptr).
  TensorView block_table;
  TensorView o;    // bf16 [T, H, 512]
  TensorView lse;  // f32 [T, H]
  float sm_scale = 0.f;
  const void* plan = nullptr;  // device copy of plan() output
  void* workspace = nullptr;   // workspace_bytes(capacity) bytes, contents need not be zero
  std::size_t workspace_bytes = 0;
};

// The page table of an absorbed run, whichever form AbsorbedArgs carries, checked by
// absorbed_page_table: exactly one form set, i32 [rows, cols] on `device`, column stride 1.
struct PageTable {
  const int32_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;
  bool block = false;  // block table of page ids; else token-level req_to_token
  bool flat = false;   // 1-D block table: row r starts at element r (row_stride 1)
  std::string_view name = "req_to_token";  // the AbsorbedArgs field, for errors
  int64_t slot(int row, int64_t i, int page_size) const {
    return block ? slot_of_block(data, row_stride, row, i, page_size)
                 : slot_of_token(data, row_stride, row, i, page_size);
  }
};
StatusOr<PageTable> absorbed_page_table(const AbsorbedArgs& args, Device device);

// What a plan of (req_rows, kv_lens) reads of its page table, for the table-shape check of a run
// (the cuda op reads the lengths on the device, so the torch binding keeps these from the plan):
// over the requests with keys (a request without keys reads no entry), the largest row, the
// most keys and the end of a flat page list (req_rows[b] + ceil(kv_lens[b] / page_size)), each
// with the first request that reaches it (-1: none).
struct TableExtents {
  int64_t max_row = -1;
  int64_t max_kv = 0;
  int64_t flat_end = 0;
  int64_t row_request = -1;
  int64_t kv_request = -1;
  int64_t flat_request = -1;
};
TableExtents absorbed_table_extents(std::span<const int32_t> req_rows,
                                    std::span<const int32_t> kv_lens, int page_size);
// The table-shape rule of an absorbed run, one for every op set and the torch binding: every
// request with keys has its row in the table, and the entries its keys read in that row
// (req_to_token: column ((kv_len - 1) / P) * P, the first slot of its last page; a block table:
// ceil(kv_len / P) page ids; a flat list: up to entry req_rows[b] + ceil(kv_len / P) - 1).
// kInvalidArgument naming the table, the request and what it reads.
Status check_table_extents(const PageTable& table, const TableExtents& extents, int page_size);

class AbsorbedAttentionOp {
 public:
  virtual ~AbsorbedAttentionOp() = default;
  virtual Status supports(int num_heads, int page_size, DType cache_dtype) const = 0;
  virtual std::size_t plan_bytes(const AttnCapacity& cap) const = 0;
  virtual std::size_t workspace_bytes(const AttnCapacity& cap) const = 0;
  // Pure host function; returns the bytes of host_plan used. Errors if the problem exceeds cap.
  virtual StatusOr<std::size_t> plan(const AbsorbedProblem& problem, const AttnCapacity& cap,
                                     std::span<std::byte> host_plan) const = 0;
  virtual Status run(const AbsorbedArgs& args, const ExecContext& ctx) const = 0;
};

// ---------------------------------------------------------------------------------------------
// Ragged MHA attention, head dims 192 (q, k) and 128 (v). Request b: q rows qo_indptr[b]..,
// k/v rows kv_indptr[b]... Causal bottom-right as above. kv_len 0 -> o = 0, lse = -inf.
struct MhaProblem {
  int num_heads = 0;
  bool causal = true;
  std::span<const int32_t> qo_indptr;  // [bs + 1]
  std::span<const int32_t> kv_indptr;  // [bs + 1]
};

struct MhaArgs {
  TensorView q;    // bf16 [Tq, H, 192]
  TensorView k;    // bf16 [Tk, H, 192]
  TensorView v;    // bf16 [Tk, H, 128]
  TensorView o;    // bf16 [Tq, H, 128]; in/out when merge_into_output
  TensorView lse;  // f32 [Tq, H]; in/out (and required) when merge_into_output
  float sm_scale = 0.f;
  const void* plan = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // (o, lse) already hold a state of the same rows over other keys (a previous pass): the op
  // merges its result into them as MergeOp does (below), from its fp32 state, instead of
  // overwriting them. A row that sees no key here keeps (o, lse) as they were (both empty:
  // o = 0, lse = -inf). Rows of the plan only; o and lse elsewhere are not touched. The chunked
  // prefix path uses it, so it needs no second output buffer and no merge pass per chunk.
  bool merge_into_output = false;
};

class MhaAttentionOp {
 public:
  virtual ~MhaAttentionOp() = default;
  virtual Status supports(int num_heads) const = 0;
  virtual std::size_t plan_bytes(const AttnCapacity& cap) const = 0;
  virtual std::size_t workspace_bytes(const AttnCapacity& cap) const = 0;
  virtual StatusOr<std::size_t> plan(const MhaProblem& problem, const AttnCapacity& cap,
                                     std::span<std::byte> host_plan) const = 0;
  virtual Status run(const MhaArgs& args, const ExecContext& ctx) const = 0;
};

// ---------------------------------------------------------------------------------------------
// Merge of two partial states of the same rows (SYSTEM.md 1), in place into (o_acc, lse_acc):
// m = max(la, lb); wa = exp(la - m); wb = exp(lb - m); o = (wa oa + wb ob) / (wa + wb);
// lse = m + log(wa + wb); both -inf -> o = 0, lse = -inf.
struct MergeArgs {
  TensorView o_acc;    // bf16 [T, H, D] in/out
  TensorView lse_acc;  // f32 [T, H] in/out
  TensorView o_b;      // bf16 [T, H, D]
  TensorView lse_b;    // f32 [T, H]
};

class MergeOp {
 public:
  virtual ~MergeOp() = default;
  virtual Status run(const MergeArgs& args, const ExecContext& ctx) const = 0;
};

// ---------------------------------------------------------------------------------------------
// Latent KV write: kv_cache[out_cache_loc[t]] = [c_kv[t] | k_pe[t]] (fp8: value / k_scale).
struct KvWriteArgs {
  TensorView c_kv;           // bf16 [T, 512] (row stride may exceed 512)
  TensorView k_pe;           // bf16 [T, 64]
  TensorView out_cache_loc;  // i32 [T]
  TensorView kv_cache;       // bf16 | fp8 [num_slots, 576]
  float k_scale = 1.0f;
};

class KvWriteOp {
 public:
  virtual ~KvWriteOp() = default;
  virtual Status run(const KvWriteArgs& args, const ExecContext& ctx) const = 0;
};

// ---------------------------------------------------------------------------------------------
// Gather latent rows by slot list and up-project through kv_b_proj:
//   k[n, h] = [c_kv[slot_n] @ W_UK[h]^T | k_pe[slot_n]]   (192)
//   v[n, h] =  c_kv[slot_n] @ W_UV[h]^T                   (128)
// kv_b_proj is bf16 [H * 256, 512]: rows h*256 .. h*256+127 are W_UK[h], the next 128 W_UV[h].
struct UpProjectArgs {
  TensorView kv_cache;  // bf16 | fp8 [num_slots, 576]
  float k_scale = 1.0f;
  TensorView slots;           // i32 [N] on the op's device
  TensorView kv_b_proj;       // bf16 [H * 256, 512]
  TensorView k;               // bf16 [N, H, 192] out
  TensorView v;               // bf16 [N, H, 128] out
  void* workspace = nullptr;  // workspace_bytes(N, H) bytes of scratch
  std::size_t workspace_bytes = 0;
};

class UpProjectOp {
 public:
  virtual ~UpProjectOp() = default;
  virtual std::size_t workspace_bytes(int64_t max_tokens, int num_heads) const = 0;
  virtual Status run(const UpProjectArgs& args, const ExecContext& ctx) const = 0;
};

// ---------------------------------------------------------------------------------------------
// Per-head GEMM (the absorbed projections): for every t, h:
//   y[t, h, :] = x[t, h, :] @ W_h          (transpose_w = false; W_h is [K, N])
//   y[t, h, :] = x[t, h, :] @ W_h^T        (transpose_w = true;  W_h is [N, K])
// W_h starts at w + h * w_head_stride elements, rows of w_row_stride elements.
// x and y may be strided views (e.g. y = the first 512 columns of q [T, H, 576]).
// q_abs = head_gemm(q_nope, W_UK, transpose=false); o = head_gemm(o_latent, W_UV, true).
struct HeadGemmArgs {
  TensorView x;  // bf16 [T, H, K]
  TensorView w;  // bf16 base of the weight
  int64_t w_head_stride = 0;
  int64_t w_row_stride = 0;
  bool transpose_w = false;
  TensorView y;  // bf16 [T, H, N]
};

class HeadGemmOp {
 public:
  virtual ~HeadGemmOp() = default;
  virtual Status run(const HeadGemmArgs& args, const ExecContext& ctx) const = 0;
};

// ---------------------------------------------------------------------------------------------
// One implementation of every op for one device. Several sets may exist per device (e.g. a
// first kernel and a faster one); the first registered for a device is its default.
struct OpSet {
  std::string name;  // "cpu", "cuda"
  DeviceType device = DeviceType::kCpu;
  std::shared_ptr<const AbsorbedAttentionOp> absorbed;
  std::shared_ptr<const MhaAttentionOp> mha;
  std::shared_ptr<const MergeOp> merge;
  std::shared_ptr<const KvWriteOp> kv_write;
  std::shared_ptr<const UpProjectOp> up_project;
  std::shared_ptr<const HeadGemmOp> head_gemm;
  // The GPUs the set's device code is built for (empty: no such restriction, e.g. the cpu set).
  // OpRegistry::add puts a check in front of every run() of a set that lists some, so the set
  // refuses a device it has no code for (check_op_set_device) before anything is launched.
  std::vector<ComputeCapability> compute_capabilities;
};

// Whether `set` has code for `device`: Ok, or kUnsupported naming the compute capabilities the
// set is built for and the one `device` has (gpu_support.h's rule). What backends and the torch
// ops check when they pick a set, and what each run() of a registered set checks first.
Status check_op_set_device(const OpSet& set, Device device);

class OpRegistry {
 public:
  // Holds the sets the op libraries registered (register_op_set_provider), cpu first.
  static OpRegistry& global();
  void add(OpSet set);
  const OpSet* find(std::string_view name) const;
  const OpSet* default_for(DeviceType device) const;
  std::vector<const OpSet*> list() const;

 private:
  std::vector<std::unique_ptr<OpSet>> sets_;
};

// Op libraries register their set here: a static registrar in the library (linked whole) calls
// this at load time, and OpRegistry::global() runs the providers, in DeviceType order, when it is
// first used (a provider registered later is run at once). Core knows no op implementation.
// Returns true (for `static const bool registered = ...`).
using OpSetProvider = void (*)(OpRegistry& registry);
bool register_op_set_provider(DeviceType device, OpSetProvider provider);

}  // namespace mla
