// run_conformance_case: inputs on the device, poisoned outputs with guard bytes, host plan,
// upload, run, download, written/guard checks, comparison with the reference.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>

#include "conformance/case_gen.h"
#include "conformance/compare.h"
#include "conformance/conformance.h"
#include "conformance/reference.h"
#include "mla/memory.h"
#include "mla/model.h"

namespace mla::testing {
namespace {

constexpr std::size_t kGuardBytes = 256;
constexpr uint8_t kGuardByte = 0xA5;
constexpr uint8_t kPoisonByte = 0xFF;     // bf16 0xFFFF, f32 0xFFFFFFFF, fp8 0xFF: all NaN
constexpr uint8_t kWorkspaceByte = 0xCD;  // workspaces and plan tails are not zeroed
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// An output (or in/out) tensor: device storage with guard bytes on both sides.
struct OutputSpec {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;  // for messages
  std::size_t bytes = 0;
  std::vector<std::byte> initial;  // empty: poison; else uploaded before every run
  DeviceBuffer buffer;             // kGuardBytes + bytes + kGuardBytes
  void* data() const { return static_cast<std::byte*>(buffer.data()) + kGuardBytes; }
  std::vector<std::byte> result;  // downloaded after the last run
};

// Everything one case needs on the device; owns its buffers.
class Harness {
 public:
  explicit Harness(Device device) : device_(device), rt_(device_runtime(device.type)) {}
  Status ready() const {
    if (rt_ == nullptr || !device_available(device_)) {
      return unsupported("device {} is not available", device_.to_string());
    }
    return Status::Ok();
  }
  Device device() const { return device_; }

  // Uploads host bytes; returns the device pointer.
  StatusOr<void*> upload(std::span<const std::byte> host, std::string name) {
    MLA_ASSIGN_OR_RETURN(DeviceBuffer buf,
                         DeviceBuffer::allocate(device_, std::max<std::size_t>(host.size(), 1),
                                                std::move(name), "test", false));
    MLA_RETURN_IF_ERROR(rt_->copy_to_device(buf.data(), host.data(), host.size(), nullptr));
    void* p = buf.data();
    inputs_.push_back(std::move(buf));
    return p;
  }
  // Scratch filled with kWorkspaceByte (not zero).
  StatusOr<void*> scratch(std::size_t bytes, std::string name) {
    MLA_ASSIGN_OR_RETURN(DeviceBuffer buf,
                         DeviceBuffer::allocate(device_, std::max<std::size_t>(bytes, 1),
                                                std::move(name), "test", false));
    MLA_RETURN_IF_ERROR(rt_->memset(buf.data(), kWorkspaceByte, buf.bytes(), nullptr));
    void* p = buf.data();
    inputs_.push_back(std::move(buf));
    return p;
  }
  // Declares an output; returns its index.
  StatusOr<OutputSpec*> output(std::string name, DType dtype, std::vector<int64_t> shape,
                               std::vector<std::byte> initial = {}) {
    auto spec = std::make_unique<OutputSpec>();
    spec->name = std::move(name);
    spec->dtype = dtype;
    spec->shape = std::move(shape);
    int64_t n = 1;
    for (int64_t d : spec->shape) n *= d;
    spec->bytes = static_cast<std::size_t>(n) * dtype_size(dtype);
    spec->initial = std::move(initial);
    MLA_ASSIGN_OR_RETURN(spec->buffer,
                         DeviceBuffer::allocate(device_, spec->bytes + 2 * kGuardBytes,
                                                "conformance." + spec->name, "test", false));
    outputs_.push_back(std::move(spec));
    return outputs_.back().get();
  }
  // Poisons (or re-initialises) every output and fills its guards.
  Status prepare_outputs() {
    for (auto& o : outputs_) {
      MLA_RETURN_IF_ERROR(rt_->memset(o->buffer.data(), kGuardByte, o->buffer.bytes(), nullptr));
      if (o->initial.empty()) {
        MLA_RETURN_IF_ERROR(rt_->memset(o->data(), kPoisonByte, o->bytes, nullptr));
      } else {
        MLA_RETURN_IF_ERROR(rt_->copy_to_device(o->data(), o->initial.data(), o->bytes, nullptr));
      }
    }
    return rt_->synchronize(nullptr);
  }
  // Downloads every output; checks the guards. Returns a failure message or "".
  StatusOr<std::string> collect_outputs() {
    MLA_RETURN_IF_ERROR(rt_->synchronize(nullptr));
    std::string problems;
    for (auto& o : outputs_) {
      std::vector<std::byte> all(o->buffer.bytes());
      MLA_RETURN_IF_ERROR(rt_->copy_to_host(all.data(), o->buffer.data(), all.size(), nullptr));
      o->result.assign(all.begin() + kGuardBytes, all.begin() + kGuardBytes + o->bytes);
      for (std::size_t i = 0; i < all.size(); ++i) {
        const bool guard = i < kGuardBytes || i >= kGuardBytes + o->bytes;
        if (guard && static_cast<uint8_t>(all[i]) != kGuardByte) {
          problems += fmt::format("{}: guard byte {} {} the tensor was overwritten; ", o->name,
                                  i < kGuardBytes ? kGuardBytes - i : i - kGuardBytes - o->bytes,
                                  i < kGuardBytes ? "before" : "after");
          break;
        }
      }
    }
    MLA_RETURN_IF_ERROR(rt_->synchronize(nullptr));
    return problems;
  }
  const std::vector<std::unique_ptr<OutputSpec>>& outputs() const { return outputs_; }

 private:
  Device device_;
  DeviceRuntime* rt_;
  std::vector<DeviceBuffer> inputs_;
  std::vector<std::unique_ptr<OutputSpec>> outputs_;
};

// What a prepared case compares against: per output, the expected values (NaN where the output
// must stay untouched, i.e. keep its poison) and the tolerance.
struct Expected {
  std::vector<double> values;
  Tolerance tol;
  bool is_lse = false;
};

struct Prepared {
  std::function<Status()> launch;  // runs the op once (outputs already prepared)
  std::vector<Expected> expected;  // one per harness output, same order
  std::string skip_reason;         // non-empty: skipped
};

TensorView view(void* p, DType t, Device d, std::initializer_list<int64_t> dims) {
  return TensorView(p, t, d, dims);
}

int64_t sum_of(const std::vector<int32_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

std::vector<int32_t> indptr_of(const std::vector<int32_t>& lens) {
  std::vector<int32_t> p(lens.size() + 1, 0);
  for (std::size_t i = 0; i < lens.size(); ++i) p[i + 1] = p[i] + lens[i];
  return p;
}

std::vector<std::byte> bytes_of_bf16(const std::vector<bf16>& v) {
  const auto s = as_bytes_of(v);
  return {s.begin(), s.end()};
}

AttnCapacity capacity_for(const ConformanceCase& c) {
  const int f = std::max(1, c.capacity_factor);
  AttnCapacity cap;
  cap.max_batch = static_cast<int>(c.q_lens.size()) * f;
  cap.max_q_tokens = std::max<int64_t>(1, sum_of(c.q_lens)) * f;
  cap.max_kv_tokens = std::max<int64_t>(1, sum_of(c.kv_lens)) * f;
  int32_t max_q = 1;
  for (int32_t q : c.q_lens) max_q = std::max(max_q, q);
  cap.max_q_len = max_q * f;
  cap.num_heads = c.num_heads;
  return cap;
}

// Plans on the host into a poisoned blob and uploads it (the full plan_bytes, as a backend does).
template <typename Op, typename Problem>
StatusOr<void*> plan_and_upload(const Op& op, const Problem& problem, const AttnCapacity& cap,
                                Harness& h) {
  std::vector<std::byte> blob(std::max<std::size_t>(op.plan_bytes(cap), 1),
                              std::byte{kWorkspaceByte});
  MLA_ASSIGN_OR_RETURN(std::size_t used, op.plan(problem, cap, blob));
  if (used > blob.size()) {
    return internal_error("plan() reports {} bytes used, plan_bytes(cap) is {}", used, blob.size());
  }
  return h.upload(blob, "conformance.plan");
}

Tolerance lse_tol() { return lse_tolerance(); }

StatusOr<Prepared> prepare_absorbed(const OpSet& ops, const ConformanceCase& c, Harness& h) {
  Prepared p;
  if (!ops.absorbed) return Prepared{{}, {}, "absorbed op not in this set"};
  if (Status s = ops.absorbed->supports(c.num_heads, c.page_size, c.cache_dtype); !s.ok()) {
    if (s.code() == StatusCode::kUnsupported) return Prepared{{}, {}, s.message()};
    return s;
  }
  Rng rng(c.seed);
  const int hc = c.num_heads;
  const int64_t t = sum_of(c.q_lens);
  PagedLayout layout = make_paged_layout(c.kv_lens, c.page_size, c.shuffle_pages, rng);
  LatentCache cache = make_latent_cache(layout, c.cache_dtype, c.k_scale, rng);
  std::vector<bf16> q = random_bf16(t * hc * kLatentDim, rng);
  const Device d = h.device();

  MLA_ASSIGN_OR_RETURN(void* q_dev, h.upload(as_bytes_of(q), "q"));
  MLA_ASSIGN_OR_RETURN(void* cache_dev, h.upload(cache.bytes, "kv_cache"));
  // The page table in the case's form: token-level req_to_token or a block table of page ids.
  const std::vector<int32_t>& table = c.block_table ? layout.block_table : layout.req_to_token;
  const int64_t table_cols = c.block_table ? layout.max_blocks : layout.max_context_len;
  MLA_ASSIGN_OR_RETURN(void* table_dev, h.upload(as_bytes_of(table),
                                                 c.block_table ? "block_table" : "req_to_token"));
  MLA_ASSIGN_OR_RETURN(OutputSpec * o, h.output("o", DType::kBF16, {t, hc, kKvLoraRank}));
  MLA_ASSIGN_OR_RETURN(OutputSpec * lse, h.output("lse", DType::kF32, {t, hc}));

  const AttnCapacity cap = capacity_for(c);
  AbsorbedProblem problem;
  problem.num_heads = hc;
  problem.page_size = c.page_size;
  problem.causal = c.causal;
  problem.req_rows = layout.req_rows;
  problem.q_lens = c.q_lens;
  problem.kv_lens = c.kv_lens;
  MLA_ASSIGN_OR_RETURN(void* plan_dev, plan_and_upload(*ops.absorbed, problem, cap, h));
  const std::size_t ws_bytes = ops.absorbed->workspace_bytes(cap);
  MLA_ASSIGN_OR_RETURN(void* ws, h.scratch(ws_bytes, "workspace"));

  AbsorbedArgs args;
  args.q = view(q_dev, DType::kBF16, d, {t, hc, kLatentDim});
  args.kv_cache = view(cache_dev, c.cache_dtype, d, {layout.num_slots, kLatentDim});
  args.k_scale = c.k_scale;
  (c.block_table ? args.block_table : args.req_to_token) =
      view(table_dev, DType::kI32, d, {layout.num_rows, table_cols});
  args.o = view(o->data(), DType::kBF16, d, {t, hc, kKvLoraRank});
  args.lse = view(lse->data(), DType::kF32, d, {t, hc});
  args.sm_scale = c.sm_scale;
  args.plan = plan_dev;
  args.workspace = ws;
  args.workspace_bytes = ws_bytes;
  const OpSet* set = &ops;
  const ExecContext ctx{d, nullptr};
  p.launch = [set, args, ctx] { return set->absorbed->run(args, ctx); };

  AbsorbedRefProblem rp;
  rp.num_heads = hc;
  rp.page_size = c.page_size;
  rp.causal = c.causal;
  rp.sm_scale = c.sm_scale;
  rp.cache_dtype = c.cache_dtype;
  rp.k_scale = c.k_scale;
  rp.row_stride = table_cols;
  (c.block_table ? rp.block_table : rp.req_to_token) = table;
  rp.req_rows = layout.req_rows;
  rp.q_lens = c.q_lens;
  rp.kv_lens = c.kv_lens;
  RefAttention ref = reference_absorbed(rp, to_float(q), cache.stored);
  p.expected.push_back({std::move(ref.o), default_tolerance(DType::kBF16), false});
  p.expected.push_back({std::move(ref.lse), lse_tol(), true});
  return p;
}

std::vector<double> widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// A random partial state's LSEs for `rows` rows, with every kind of row a merge meets: empty
// (-inf) on either side or both, and one side dominating by far. `other` (may be empty) is the
// second state's, adjusted in place to make those patterns.
std::vector<float> random_state_lse(int64_t rows, Rng& rng, std::vector<float>* other) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<float> lse(static_cast<std::size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    lse[i] = static_cast<float>(rng.normal() * 3.0);
    if (i % 7 == 3) lse[i] = -kInf;  // only the other state has keys
    if (other == nullptr) continue;
    float& b = (*other)[i];
    if (i % 11 == 5) b = -kInf;           // only this one has keys
    if (i % 13 == 0) lse[i] = b = -kInf;  // neither: o = 0, lse = -inf
    if (i % 17 == 8) b = lse[i] + 40.0f;  // b dominates (exp underflows in fp32)
  }
  return lse;
}

StatusOr<Prepared> prepare_mha(const OpSet& ops, const ConformanceCase& c, Harness& h) {
  Prepared p;
  if (!ops.mha) return Prepared{{}, {}, "mha op not in this set"};
  if (Status s = ops.mha->supports(c.num_heads); !s.ok()) {
    if (s.code() == StatusCode::kUnsupported) return Prepared{{}, {}, s.message()};
    return s;
  }
  Rng rng(c.seed);
  const int hc = c.num_heads;
  const int64_t tq = sum_of(c.q_lens), tk = sum_of(c.kv_lens);
  std::vector<bf16> q = random_bf16(tq * hc * kQkHeadDim, rng);
  std::vector<bf16> k = random_bf16(tk * hc * kQkHeadDim, rng);
  std::vector<bf16> v = random_bf16(tk * hc * kVHeadDim, rng);
  const std::vector<int32_t> qo_indptr = indptr_of(c.q_lens), kv_indptr = indptr_of(c.kv_lens);
  const Device d = h.device();
  MLA_ASSIGN_OR_RETURN(void* q_dev, h.upload(as_bytes_of(q), "q"));
  MLA_ASSIGN_OR_RETURN(void* k_dev, h.upload(as_bytes_of(k), "k"));
  MLA_ASSIGN_OR_RETURN(void* v_dev, h.upload(as_bytes_of(v), "v"));
  // merge_into_output: the state (o, lse) starts from; its empty rows hold o = 0.
  std::vector<bf16> o_init;
  std::vector<float> lse_init;
  std::vector<std::byte> o_init_bytes, lse_init_bytes;
  if (c.merge_into_output) {
    o_init = random_bf16(tq * hc * kVHeadDim, rng);
    lse_init = random_state_lse(tq * hc, rng, nullptr);
    for (int64_t i = 0; i < tq * hc; ++i) {
      if (lse_init[i] != -std::numeric_limits<float>::infinity()) continue;
      std::fill_n(o_init.begin() + i * kVHeadDim, kVHeadDim, bf16::from_float(0.f));
    }
    o_init_bytes = bytes_of_bf16(o_init);
    const auto lb = as_bytes_of(lse_init);
    lse_init_bytes.assign(lb.begin(), lb.end());
  }
  MLA_ASSIGN_OR_RETURN(OutputSpec * o,
                       h.output("o", DType::kBF16, {tq, hc, kVHeadDim}, std::move(o_init_bytes)));
  MLA_ASSIGN_OR_RETURN(OutputSpec * lse,
                       h.output("lse", DType::kF32, {tq, hc}, std::move(lse_init_bytes)));

  const AttnCapacity cap = capacity_for(c);
  MhaProblem problem;
  problem.num_heads = hc;
  problem.causal = c.causal;
  problem.qo_indptr = qo_indptr;
  problem.kv_indptr = kv_indptr;
  MLA_ASSIGN_OR_RETURN(void* plan_dev, plan_and_upload(*ops.mha, problem, cap, h));
  const std::size_t ws_bytes = ops.mha->workspace_bytes(cap);
  MLA_ASSIGN_OR_RETURN(void* ws, h.scratch(ws_bytes, "workspace"));

  MhaArgs args;
  args.q = view(q_dev, DType::kBF16, d, {tq, hc, kQkHeadDim});
  args.k = view(k_dev, DType::kBF16, d, {tk, hc, kQkHeadDim});
  args.v = view(v_dev, DType::kBF16, d, {tk, hc, kVHeadDim});
  args.o = view(o->data(), DType::kBF16, d, {tq, hc, kVHeadDim});
  args.lse = view(lse->data(), DType::kF32, d, {tq, hc});
  args.sm_scale = c.sm_scale;
  args.plan = plan_dev;
  args.workspace = ws;
  args.workspace_bytes = ws_bytes;
  args.merge_into_output = c.merge_into_output;
  const OpSet* set = &ops;
  const ExecContext ctx{d, nullptr};
  p.launch = [set, args, ctx] { return set->mha->run(args, ctx); };

  RefAttention ref = reference_mha(to_float(q), to_float(k), to_float(v), qo_indptr, kv_indptr, hc,
                                   c.sm_scale, c.causal);
  if (c.merge_into_output) {
    ref = reference_merge(widen(to_float(o_init)), widen(lse_init), ref.o, ref.lse, tq * hc,
                          kVHeadDim);
  }
  p.expected.push_back({std::move(ref.o), default_tolerance(DType::kBF16), false});
  p.expected.push_back({std::move(ref.lse), lse_tol(), true});
  return p;
}

StatusOr<Prepared> prepare_merge(const OpSet& ops, const ConformanceCase& c, Harness& h) {
  Prepared p;
  if (!ops.merge) return Prepared{{}, {}, "merge op not in this set"};
  Rng rng(c.seed);
  const int hc = c.num_heads, dim = c.merge_dim;
  const int64_t t = c.num_tokens, rows = t * hc;
  std::vector<bf16> o_a = random_bf16(rows * dim, rng), o_b = random_bf16(rows * dim, rng);
  std::vector<float> lse_b(static_cast<std::size_t>(rows));
  for (float& x : lse_b) x = static_cast<float>(rng.normal() * 3.0);
  std::vector<float> lse_a = random_state_lse(rows, rng, &lse_b);
  const Device d = h.device();
  MLA_ASSIGN_OR_RETURN(void* o_b_dev, h.upload(as_bytes_of(o_b), "o_b"));
  MLA_ASSIGN_OR_RETURN(void* lse_b_dev, h.upload(as_bytes_of(lse_b), "lse_b"));
  const auto lse_a_bytes = as_bytes_of(lse_a);
  MLA_ASSIGN_OR_RETURN(OutputSpec * o_acc,
                       h.output("o_acc", DType::kBF16, {t, hc, dim}, bytes_of_bf16(o_a)));
  MLA_ASSIGN_OR_RETURN(OutputSpec * lse_acc,
                       h.output("lse_acc", DType::kF32, {t, hc},
                                std::vector<std::byte>(lse_a_bytes.begin(), lse_a_bytes.end())));
  MergeArgs args;
  args.o_acc = view(o_acc->data(), DType::kBF16, d, {t, hc, dim});
  args.lse_acc = view(lse_acc->data(), DType::kF32, d, {t, hc});
  args.o_b = view(o_b_dev, DType::kBF16, d, {t, hc, dim});
  args.lse_b = view(lse_b_dev, DType::kF32, d, {t, hc});
  const OpSet* set = &ops;
  const ExecContext ctx{d, nullptr};
  p.launch = [set, args, ctx] { return set->merge->run(args, ctx); };
  RefAttention ref = reference_merge(widen(to_float(o_a)), widen(lse_a), widen(to_float(o_b)),
                                     widen(lse_b), rows, dim);
  p.expected.push_back({std::move(ref.o), default_tolerance(DType::kBF16), false});
  p.expected.push_back({std::move(ref.lse), lse_tol(), true});
  return p;
}

StatusOr<Prepared> prepare_kv_write(const OpSet& ops, const ConformanceCase& c, Harness& h) {
  Prepared p;
  if (!ops.kv_write) return Prepared{{}, {}, "kv_write op not in this set"};
  Rng rng(c.seed);
  const int64_t t = c.num_tokens;
  const int64_t stride = c.src_row_stride > 0 ? c.src_row_stride : kKvLoraRank;
  const int pg = std::max(1, c.page_size);
  const int64_t num_slots = ((t + pg - 1) / pg + 3) * pg;
  // Distinct slots outside the dummy page, shuffled.
  std::vector<int32_t> all(static_cast<std::size_t>(num_slots - pg));
  std::iota(all.begin(), all.end(), pg);
  std::shuffle(all.begin(), all.end(), rng.engine());
  std::vector<int32_t> loc(all.begin(), all.begin() + t);
  std::vector<bf16> c_kv_buf = random_bf16(t * stride, rng);
  std::vector<bf16> k_pe = random_bf16(t * kQkRopeDim, rng);
  std::vector<float> c_kv(static_cast<std::size_t>(t * kKvLoraRank));
  for (int64_t i = 0; i < t; ++i) {
    for (int j = 0; j < kKvLoraRank; ++j)
      c_kv[i * kKvLoraRank + j] = c_kv_buf[i * stride + j].to_float();
  }
  const Device d = h.device();
  MLA_ASSIGN_OR_RETURN(void* c_kv_dev, h.upload(as_bytes_of(c_kv_buf), "c_kv"));
  MLA_ASSIGN_OR_RETURN(void* k_pe_dev, h.upload(as_bytes_of(k_pe), "k_pe"));
  MLA_ASSIGN_OR_RETURN(void* loc_dev, h.upload(as_bytes_of(loc), "out_cache_loc"));
  MLA_ASSIGN_OR_RETURN(OutputSpec * cache,
                       h.output("kv_cache", c.cache_dtype, {num_slots, kLatentDim}));
  KvWriteArgs args;
  args.c_kv = view(c_kv_dev, DType::kBF16, d, {t, kKvLoraRank});
  args.c_kv.stride[0] = stride;
  args.k_pe = view(k_pe_dev, DType::kBF16, d, {t, kQkRopeDim});
  args.out_cache_loc = view(loc_dev, DType::kI32, d, {t});
  args.kv_cache = view(cache->data(), c.cache_dtype, d, {num_slots, kLatentDim});
  args.k_scale = c.k_scale;
  const OpSet* set = &ops;
  const ExecContext ctx{d, nullptr};
  p.launch = [set, args, ctx] { return set->kv_write->run(args, ctx); };
  std::vector<double> rows = reference_kv_write(c_kv, to_float(k_pe), t, c.cache_dtype, c.k_scale);
  std::vector<double> expect(static_cast<std::size_t>(num_slots * kLatentDim), kNaN);  // untouched
  for (int64_t i = 0; i < t; ++i) {
    std::copy(rows.begin() + i * kLatentDim, rows.begin() + (i + 1) * kLatentDim,
              expect.begin() + static_cast<int64_t>(loc[i]) * kLatentDim);
  }
  p.expected.push_back({std::move(expect), default_tolerance(c.cache_dtype), false});
  return p;
}

StatusOr<Prepared> prepare_up_project(const OpSet& ops, const ConformanceCase& c, Harness& h) {
  Prepared p;
  if (!ops.up_project) return Prepared{{}, {}, "up_project op not in this set"};
  Rng rng(c.seed);
  const int hc = c.num_heads;
  PagedLayout layout = make_paged_layout(c.kv_lens, c.page_size, c.shuffle_pages, rng);
  LatentCache cache = make_latent_cache(layout, c.cache_dtype, c.k_scale, rng);
  std::vector<int32_t> slots;
  for (std::size_t b = 0; b < c.kv_lens.size(); ++b) {
    for (int64_t i = 0; i < c.kv_lens[b]; ++i) {
      slots.push_back(static_cast<int32_t>(layout.slot(static_cast<int>(b), i)));
    }
  }
  const int64_t n = static_cast<int64_t>(slots.size());
  std::vector<bf16> w = random_bf16(int64_t{hc} * kKvBProjRowsPerHead * kKvLoraRank, rng);
  const Device d = h.device();
  MLA_ASSIGN_OR_RETURN(void* cache_dev, h.upload(cache.bytes, "kv_cache"));
  MLA_ASSIGN_OR_RETURN(void* slots_dev, h.upload(as_bytes_of(slots), "slots"));
  MLA_ASSIGN_OR_RETURN(void* w_dev, h.upload(as_bytes_of(w), "kv_b_proj"));
  MLA_ASSIGN_OR_RETURN(OutputSpec * k, h.output("k", DType::kBF16, {n, hc, kQkHeadDim}));
  MLA_ASSIGN_OR_RETURN(OutputSpec * v, h.output("v", DType::kBF16, {n, hc, kVHeadDim}));
  const int64_t cap_tokens = std::max<int64_t>(1, n) * std::max(1, c.capacity_factor);
  const std::size_t ws_bytes = ops.up_project->workspace_bytes(cap_tokens, hc);
  MLA_ASSIGN_OR_RETURN(void* ws, h.scratch(ws_bytes, "workspace"));
  UpProjectArgs args;
  args.kv_cache = view(cache_dev, c.cache_dtype, d, {layout.num_slots, kLatentDim});
  args.k_scale = c.k_scale;
  args.slots = view(slots_dev, DType::kI32, d, {n});
  args.kv_b_proj = view(w_dev, DType::kBF16, d, {int64_t{hc} * kKvBProjRowsPerHead, kKvLoraRank});
  args.k = view(k->data(), DType::kBF16, d, {n, hc, kQkHeadDim});
  args.v = view(v->data(), DType::kBF16, d, {n, hc, kVHeadDim});
  args.workspace = ws;
  args.workspace_bytes = ws_bytes;
  const OpSet* set = &ops;
  const ExecContext ctx{d, nullptr};
  p.launch = [set, args, ctx] { return set->up_project->run(args, ctx); };
  RefUpProject ref =
      reference_up_project(cache.stored, c.cache_dtype, c.k_scale, slots, to_float(w), hc);
  p.expected.push_back({std::move(ref.k), default_tolerance(DType::kBF16), false});
  p.expected.push_back({std::move(ref.v), default_tolerance(DType::kBF16), false});
  return p;
}

StatusOr<Prepared> prepare_head_gemm(const OpSet& ops, const ConformanceCase& c, Harness& h) {
  Prepared p;
  if (!ops.head_gemm) return Prepared{{}, {}, "head_gemm op not in this set"};
  Rng rng(c.seed);
  const int hc = c.num_heads, kk = c.gemm_k, nn = c.gemm_n;
  const int64_t t = c.num_tokens;
  const int64_t xs = c.x_row_stride > 0 ? c.x_row_stride : kk;
  const int64_t ys = c.y_row_stride > 0 ? c.y_row_stride : nn;
  // Canonical shapes live in a kv_b_proj [H * 256, 512]; anything else in a dense [H, rows, cols].
  const bool q_abs = !c.transpose_w && kk == kQkNopeDim && nn == kKvLoraRank;
  const bool o_proj = c.transpose_w && kk == kKvLoraRank && nn == kVHeadDim;
  int64_t w_head_stride, w_row_stride, w_offset = 0, w_elems;
  if (q_abs || o_proj) {
    w_row_stride = kKvLoraRank;
    w_head_stride = kKvBProjRowsPerHead * kKvLoraRank;
    w_offset = o_proj ? kQkNopeDim * kKvLoraRank : 0;
    w_elems = int64_t{hc} * kKvBProjRowsPerHead * kKvLoraRank;
  } else {
    const int64_t rows = c.transpose_w ? nn : kk, cols = c.transpose_w ? kk : nn;
    w_row_stride = cols;
    w_head_stride = rows * cols;
    w_elems = int64_t{hc} * rows * cols;
  }
  std::vector<bf16> x_buf = random_bf16(t * hc * xs, rng);
  std::vector<bf16> w = random_bf16(w_elems, rng);
  std::vector<float> x(static_cast<std::size_t>(t * hc * kk));
  for (int64_t r = 0; r < t * hc; ++r) {
    for (int i = 0; i < kk; ++i) x[r * kk + i] = x_buf[r * xs + i].to_float();
  }
  const Device d = h.device();
  MLA_ASSIGN_OR_RETURN(void* x_dev, h.upload(as_bytes_of(x_buf), "x"));
  MLA_ASSIGN_OR_RETURN(void* w_dev, h.upload(as_bytes_of(w), "w"));
  MLA_ASSIGN_OR_RETURN(OutputSpec * y, h.output("y", DType::kBF16, {t, hc, ys}));
  HeadGemmArgs args;
  args.x = view(x_dev, DType::kBF16, d, {t, hc, kk});
  args.x.stride[1] = xs;
  args.x.stride[0] = hc * xs;
  args.w = view(static_cast<bf16*>(w_dev) + w_offset, DType::kBF16, d, {w_elems - w_offset});
  args.w_head_stride = w_head_stride;
  args.w_row_stride = w_row_stride;
  args.transpose_w = c.transpose_w;
  args.y = view(y->data(), DType::kBF16, d, {t, hc, nn});
  args.y.stride[1] = ys;
  args.y.stride[0] = hc * ys;
  const OpSet* set = &ops;
  const ExecContext ctx{d, nullptr};
  p.launch = [set, args, ctx] { return set->head_gemm->run(args, ctx); };
  std::vector<float> wf = to_float(w);
  std::vector<double> ref =
      reference_head_gemm(x, std::span<const float>(wf).subspan(w_offset), t, hc, kk, nn,
                          w_head_stride, w_row_stride, c.transpose_w);
  std::vector<double> expect(static_cast<std::size_t>(t * hc * ys), kNaN);  // pad untouched
  for (int64_t r = 0; r < t * hc; ++r) {
    std::copy(ref.begin() + r * nn, ref.begin() + (r + 1) * nn, expect.begin() + r * ys);
  }
  p.expected.push_back({std::move(expect), default_tolerance(DType::kBF16), false});
  return p;
}

StatusOr<Prepared> prepare(const OpSet& ops, const ConformanceCase& c, Harness& h) {
  switch (c.op) {
    case OpKind::kAbsorbed:
      return prepare_absorbed(ops, c, h);
    case OpKind::kMha:
      return prepare_mha(ops, c, h);
    case OpKind::kMerge:
      return prepare_merge(ops, c, h);
    case OpKind::kKvWrite:
      return prepare_kv_write(ops, c, h);
    case OpKind::kUpProject:
      return prepare_up_project(ops, c, h);
    case OpKind::kHeadGemm:
      return prepare_head_gemm(ops, c, h);
  }
  return internal_error("unknown op kind");
}

// Elements still holding the poison pattern where a value was expected.
int64_t count_unwritten(const OutputSpec& o, const std::vector<double>& expected) {
  const std::size_t es = dtype_size(o.dtype);
  int64_t n = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (std::isnan(expected[i])) continue;
    bool poison = true;
    for (std::size_t b = 0; b < es && poison; ++b) {
      poison = static_cast<uint8_t>(o.result[i * es + b]) == kPoisonByte;
    }
    n += poison;
  }
  return n;
}

std::string case_prefix(const ConformanceCase& c) {
  return fmt::format("case {} (seed {}, MLA_TEST_SEED={})", c.name, c.seed, base_seed());
}

}  // namespace

CaseResult run_conformance_case(const OpSet& ops, const ConformanceCase& c, Device device,
                                const RunOptions& options) {
  CaseResult r;
  r.name = c.name;
  auto fail = [&](const std::string& msg) {
    r.passed = false;
    r.message = case_prefix(c) + ": " + msg;
    return r;
  };
  Harness h(device);
  if (Status s = h.ready(); !s.ok()) {
    r.skipped = true;
    r.skip_reason = s.message();
    return r;
  }
  StatusOr<Prepared> prepared = prepare(ops, c, h);
  if (!prepared.ok()) return fail("setup/plan failed: " + prepared.status().to_string());
  if (!prepared->skip_reason.empty()) {
    r.skipped = true;
    r.skip_reason = prepared->skip_reason;
    return r;
  }
  std::vector<std::vector<std::byte>> first;
  const int reps = options.check_determinism ? 2 : 1;
  for (int rep = 0; rep < reps; ++rep) {
    if (Status s = h.prepare_outputs(); !s.ok()) return fail("poison failed: " + s.to_string());
    if (Status s = prepared->launch(); !s.ok()) return fail("run failed: " + s.to_string());
    StatusOr<std::string> guards = h.collect_outputs();
    if (!guards.ok()) return fail("download failed: " + guards.status().to_string());
    if (!guards->empty()) return fail(*guards);
    if (rep == 0) {
      for (const auto& o : h.outputs()) first.push_back(o->result);
    } else {
      for (std::size_t i = 0; i < first.size(); ++i) {
        if (first[i] != h.outputs()[i]->result) {
          r.deterministic = false;
          r.message = case_prefix(c) + ": " + h.outputs()[i]->name +
                      " differs bitwise between two identical runs; ";
        }
      }
    }
  }
  if (!options.compare) {
    r.passed = r.deterministic;
    return r;
  }
  std::string problems = r.message.empty() ? "" : r.message;
  bool ok = r.deterministic;
  for (std::size_t i = 0; i < h.outputs().size(); ++i) {
    const OutputSpec& o = *h.outputs()[i];
    const Expected& e = prepared->expected[i];
    if (int64_t n = count_unwritten(o, e.values); n > 0) {
      ok = false;
      problems += fmt::format("{}: {} of {} elements not written (still poison); ", o.name, n,
                              e.values.size());
      continue;
    }
    std::vector<float> out = decode_to_float(o.result, o.dtype);
    Comparison cmp = compare_values(o.name, out, e.values, e.tol);
    if (e.is_lse) {
      r.lse_max_abs_err = std::max(r.lse_max_abs_err, cmp.max_abs_err);
    } else {
      r.max_rel_err = std::max(r.max_rel_err, cmp.global_rel_err);
      r.max_abs_err = std::max(r.max_abs_err, cmp.max_abs_err);
    }
    if (!cmp.ok) {
      ok = false;
      problems += cmp.message + " at " + index_string(cmp.worst_index, o.shape) + "; ";
    }
  }
  r.passed = ok;
  if (!ok) {
    r.message =
        problems.rfind(case_prefix(c), 0) == 0 ? problems : case_prefix(c) + ": " + problems;
  }
  return r;
}

StatusOr<bool> run_twice_bitwise_equal(const OpSet& ops, const ConformanceCase& c, Device device) {
  RunOptions opt;
  opt.check_determinism = true;
  opt.compare = false;
  CaseResult r = run_conformance_case(ops, c, device, opt);
  if (r.skipped) return unsupported("{}: skipped: {}", c.name, r.skip_reason);
  if (!r.deterministic) return false;
  if (!r.passed) return internal_error("{}", r.message);
  return true;
}

void PrintTo(const ConformanceCase& c, std::ostream* os) {
  *os << c.name << " (seed " << c.seed << ")";
}

std::string describe_result(const CaseResult& r) {
  if (r.skipped) return fmt::format("SKIP {} ({})", r.name, r.skip_reason);
  if (!r.passed) return fmt::format("FAIL {}: {}", r.name, r.message);
  return fmt::format("PASS {} rel {:.2e} abs {:.2e} lse {:.2e}", r.name, r.max_rel_err,
                     r.max_abs_err, r.lse_max_abs_err);
}

}  // namespace mla::testing
