// Fault injection (mla/fault_injection.h): for every k, the k-th allocation (or device copy)
// of a whole serving scenario fails: pool creation, backend construction, layer creation, CUDA
// graph state, then a few steps (extend, decode, extend over a shared prefix on the chunked
// path, target-verify, graph capture and replay), each planned and run through every layer.
// Every failure must come back from the public call as a Status with the right code
// (allocation: kOutOfMemory or kOutOfWorkspace; copy: kCudaError), never an abort; once the
// scenario's objects are gone the ledger is back at its baseline (and ASan's leak check, in the
// asan-ubsan preset, sees no host leak); and the same process then runs the scenario again with
// results bitwise equal to a run that never failed.
#include "mla/fault_injection.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "backends/backend_fixture.h"

namespace mla {
namespace {

namespace fi = fault_injection;

struct Scenario {
  std::string backend;
  bool disable_chunked_prefix_cache = false;
  bool graph = false;
};

std::string name_of(const Scenario& s) {
  return s.backend + (s.disable_chunked_prefix_cache ? "+no_chunked_prefix" : "") +
         (s.graph ? "+graph" : "");
}

void PrintTo(const Scenario& s, std::ostream* os) { *os << name_of(s); }

struct Outcome {
  Status status;
  std::string where;                     // the call that failed
  std::vector<std::vector<float>> outs;  // o of every layer of every step
};

#define SCENARIO_TRY(what, expr) \
  do {                           \
    Status s_ = (expr);          \
    if (!s_.ok()) {              \
      r.status = s_;             \
      r.where = (what);          \
      return r;                  \
    }                            \
  } while (0)

// Grows request `row` by `add` tokens, appending the new slots to batch->out_cache_loc.
Status grow(LatentKvPool& pool, int row, int32_t add, ForwardBatch* batch) {
  std::vector<int32_t> slots;
  MLA_RETURN_IF_ERROR(pool.extend_request(row, pool.request_len(row) + add, &slots));
  batch->out_cache_loc.insert(batch->out_cache_loc.end(), slots.begin(), slots.end());
  return Status::Ok();
}

// The whole scenario from nothing; every object it creates is gone when it returns.
Outcome run_scenario(const Scenario& sc) {
  Outcome r;
  constexpr int kLayers = 2;
  KvPoolConfig pc;
  pc.num_layers = kLayers;
  pc.page_size = 16;
  pc.max_requests = 6;
  pc.max_context_len = 128;
  pc.num_pages = 32;
  auto pool_or = LatentKvPool::create(pc);
  SCENARIO_TRY("LatentKvPool::create", pool_or.status());
  LatentKvPool& pool = **pool_or;

  BackendContext ctx;
  ctx.pool = &pool;
  ctx.options = testing::small_options(16);
  ctx.options.max_batch = 8;
  ctx.options.chunked_prefix_capacity = 24;  // several prefix chunks
  ctx.options.mha_prefix_threshold = 16;     // paged_mla takes the chunked MHA path too
  ctx.options.paged_workspace_bytes = 2u << 20;
  ctx.options.chunked_workspace_bytes = 2u << 20;
  ctx.options.disable_chunked_prefix_cache = sc.disable_chunked_prefix_cache;
  auto backend_or = BackendRegistry::global().create(sc.backend, ctx);
  SCENARIO_TRY("BackendRegistry::create", backend_or.status());
  AttentionBackend& backend = **backend_or;
  // Weights drawn once for the whole test (drawing 2M normals per layer per run dominated the
  // sweep under ASan); the layers hold views of them.
  static const std::vector<bf16> weights = [] {
    testing::Rng wrng(100);
    return testing::random_bf16(int64_t{16} * 256 * 512, wrng, 0.05f);
  }();
  const TensorView w(const_cast<bf16*>(weights.data()), DType::kBF16, Device::cpu(),
                     {16 * 256, 512});
  std::vector<std::unique_ptr<MlaLayer>> layers;
  for (int l = 0; l < kLayers; ++l) {
    auto layer = MlaLayer::create(ctx.options.model, l, w, Device::cpu());
    SCENARIO_TRY("MlaLayer::create", layer.status());
    layers.push_back(std::move(layer).value());
  }
  if (sc.graph) SCENARIO_TRY("init_cuda_graph_state", backend.init_cuda_graph_state(4, 64));

  testing::Rng rng(7);
  // Runs every layer over `batch` (planned unless `planned`), appending each layer's o.
  auto forward = [&](const ForwardBatch& batch, bool planned) -> Status {
    if (!planned) MLA_RETURN_IF_ERROR(plan_batch(backend, batch));
    const int64_t T = batch.num_tokens();
    for (auto& layer : layers) {
      testing::LayerInputs in = testing::random_layer_inputs(T, 16, rng);
      std::vector<bf16> o(static_cast<std::size_t>(T * 16 * 128));
      std::vector<float> lse(static_cast<std::size_t>(T * 16));
      MLA_RETURN_IF_ERROR(layer->forward(
          backend, in.q_nope_view(), in.q_pe_view(), in.c_kv_view(), in.k_pe_view(),
          TensorView(o.data(), DType::kBF16, Device::cpu(), {T, 16, 128}), ExecContext{},
          TensorView(lse.data(), DType::kF32, Device::cpu(), {T, 16})));
      r.outs.push_back(testing::to_float(o));
    }
    return Status::Ok();
  };

  // Step 1: extend without prefix, two requests.
  std::vector<int> rows;
  ForwardBatch b1;
  b1.mode = ForwardMode::kExtend;
  for (int32_t len : {20, 37}) {
    auto row = pool.alloc_request();
    SCENARIO_TRY("alloc_request", row.status());
    rows.push_back(*row);
    SCENARIO_TRY("extend_request", grow(pool, *row, len, &b1));
    b1.req_pool_indices.push_back(*row);
    b1.seq_lens.push_back(len);
    b1.extend_prefix_lens.push_back(0);
    b1.extend_seq_lens.push_back(len);
  }
  b1.batch_size = 2;
  finalize_batch(b1);
  SCENARIO_TRY("step 1 (extend)", forward(b1, false));

  // Step 2: decode both.
  ForwardBatch b2;
  b2.mode = ForwardMode::kDecode;
  for (int row : rows) {
    SCENARIO_TRY("extend_request", grow(pool, row, 1, &b2));
    b2.req_pool_indices.push_back(row);
    b2.seq_lens.push_back(pool.request_len(row));
  }
  b2.batch_size = 2;
  finalize_batch(b2);
  SCENARIO_TRY("step 2 (decode)", forward(b2, false));

  // Step 3: a new request shares the second one's first 32 tokens (a prefix cache hit), then
  // extends by 9: an extend with a prefix (chunked MHA, or the fallback when disabled).
  {
    auto row = pool.alloc_request();
    SCENARIO_TRY("alloc_request", row.status());
    SCENARIO_TRY("share_prefix", pool.share_prefix(rows[1], *row, 32));
    rows.push_back(*row);
  }
  ForwardBatch b3;
  b3.mode = ForwardMode::kExtend;
  b3.req_pool_indices = {rows[2], rows[0]};
  b3.extend_prefix_lens = {32, pool.request_len(rows[0])};
  SCENARIO_TRY("extend_request", grow(pool, rows[2], 9, &b3));
  SCENARIO_TRY("extend_request", grow(pool, rows[0], 3, &b3));
  b3.extend_seq_lens = {9, 3};
  b3.seq_lens = {41, b3.extend_prefix_lens[1] + 3};
  b3.batch_size = 2;
  finalize_batch(b3);
  SCENARIO_TRY("step 3 (extend over a prefix)", forward(b3, false));

  // Step 4: target-verify with 2 draft tokens for all three, then the drafts are rejected.
  ForwardBatch b4;
  b4.mode = ForwardMode::kTargetVerify;
  b4.num_draft_tokens = 2;
  for (int row : rows) {
    b4.req_pool_indices.push_back(row);
    b4.seq_lens.push_back(pool.request_len(row));
    SCENARIO_TRY("extend_request", grow(pool, row, 2, &b4));
  }
  b4.batch_size = 3;
  finalize_batch(b4);
  SCENARIO_TRY("step 4 (target verify)", forward(b4, false));
  for (int row : rows) {
    SCENARIO_TRY("truncate_request", pool.truncate_request(row, pool.request_len(row) - 2));
  }

  // Step 5 (graph): capture a padded decode of 4, then replay it for the three requests.
  if (sc.graph) {
    ForwardBatch cap;
    cap.mode = ForwardMode::kDecode;
    cap.batch_size = 4;
    cap.req_pool_indices = {0, 0, 0, 0};
    cap.seq_lens = {1, 1, 1, 1};
    cap.out_cache_loc = {0, 1, 2, 3};
    finalize_batch(cap);
    SCENARIO_TRY("capture", backend.init_forward_metadata_capture_cuda_graph(cap));
    ForwardBatch b5;
    b5.mode = ForwardMode::kDecode;
    for (int row : rows) {
      SCENARIO_TRY("extend_request", grow(pool, row, 1, &b5));
      b5.req_pool_indices.push_back(row);
      b5.seq_lens.push_back(pool.request_len(row));
    }
    b5.batch_size = 3;
    finalize_batch(b5);
    SCENARIO_TRY("replay", backend.init_forward_metadata_replay_cuda_graph(b5, 4));
    ForwardBatch padded = b5;  // the layers run the padded batch the graph was captured with
    padded.batch_size = 4;
    padded.req_pool_indices.push_back(0);
    padded.seq_lens.push_back(1);
    padded.out_cache_loc.push_back(0);
    finalize_batch(padded);
    SCENARIO_TRY("step 5 (graph replay)", forward(padded, true));
  }
  for (int row : rows) SCENARIO_TRY("free_request", pool.free_request(row));
  SCENARIO_TRY("pool pages",
               pool.free_pages() == pc.num_pages
                   ? Status::Ok()
                   : internal_error("{} of {} pages free", pool.free_pages(), pc.num_pages));
  return r;
}

struct LedgerState {
  std::size_t records = 0, bytes = 0;
  bool operator==(const LedgerState&) const = default;
};
LedgerState ledger_state() {
  LedgerState s;
  for (const auto& rec : MemoryLedger::global().snapshot()) {
    ++s.records;
    s.bytes += rec.bytes;
  }
  return s;
}

class FaultInjection : public ::testing::TestWithParam<Scenario> {
 protected:
  void SetUp() override {
    fi::reset();
    WorkspaceRegistry::global().release_all_for_testing();
  }
  void TearDown() override {
    fi::reset();
    WorkspaceRegistry::global().release_all_for_testing();
  }

  // Fails the k-th event at `site` for every k the scenario reaches; checks each failure.
  void sweep(fi::Site site, std::vector<StatusCode> allowed) {
    const Scenario sc = GetParam();
    const LedgerState baseline = ledger_state();
    const Outcome clean = run_scenario(sc);
    ASSERT_TRUE(clean.status.ok()) << clean.where << ": " << clean.status.to_string();
    const uint64_t events = fi::count(site);
    ASSERT_GT(events, 0u);
    WorkspaceRegistry::global().release_all_for_testing();
    ASSERT_EQ(ledger_state(), baseline);
    int failed_calls = 0, recoveries = 0;
    std::string last_where;
    // Every k when there are few events (allocations: 12-17); else the first 16 and 24 spread
    // evenly over the rest (copies: the layers' strided copies run into the thousands, and each
    // k is a whole scenario under ASan).
    std::vector<uint64_t> ks;
    for (uint64_t k = 1; k <= events; ++k) {
      if (events <= 64 || k <= 16 || k == events ||
          (k - 16) % std::max<uint64_t>(1, (events - 16) / 24) == 0) {
        ks.push_back(k);
      }
    }
    for (uint64_t k : ks) {
      SCOPED_TRACE(fmt::format("{}: {} {} of {}", name_of(sc), fi::site_name(site), k, events));
      fi::fail_at(site, k);
      const Outcome hit = run_scenario(sc);
      ASSERT_TRUE(fi::fired(site));
      fi::reset();
      if (!hit.status.ok()) {
        ++failed_calls;
        EXPECT_TRUE(std::find(allowed.begin(), allowed.end(), hit.status.code()) != allowed.end())
            << hit.where << " returned " << hit.status.to_string();
        EXPECT_NE(hit.status.message().find("injected"), std::string::npos)
            << hit.where
            << " returned another error than the injected one: " << hit.status.to_string();
      } else {
        // A failure the library absorbed (e.g. a best-effort path) must not change a result.
        EXPECT_EQ(hit.outs, clean.outs) << "the failure was swallowed and changed the outputs";
      }
      // Shared workspaces are process-global: once released, nothing may remain.
      WorkspaceRegistry::global().release_all_for_testing();
      ASSERT_EQ(ledger_state(), baseline)
          << "ledger not back at its baseline after a failure in " << hit.where;
      // The process is still able to build everything again and compute the same results:
      // checked after the first failure in each call site and after the last k (a full run per
      // k would take minutes under ASan).
      if (hit.where != last_where || k == events) {
        const Outcome again = run_scenario(sc);
        ASSERT_TRUE(again.status.ok()) << again.where << ": " << again.status.to_string();
        ASSERT_EQ(again.outs, clean.outs) << "results differ after recovering";
        WorkspaceRegistry::global().release_all_for_testing();
        ++recoveries;
      }
      last_where = hit.where;
    }
    EXPECT_GT(failed_calls, 0);
    std::printf("%s: %llu %s events, %zu failed on purpose, %d failed calls, %d recovery runs\n",
                name_of(sc).c_str(), static_cast<unsigned long long>(events),
                std::string(fi::site_name(site)).c_str(), ks.size(), failed_calls, recoveries);
    RecordProperty("events", static_cast<int>(events));
  }
};

TEST_P(FaultInjection, EveryAllocationFailureIsOutOfMemoryAndLeavesNothing) {
  sweep(fi::Site::kAllocation, {StatusCode::kOutOfMemory, StatusCode::kOutOfWorkspace});
}

TEST_P(FaultInjection, EveryCopyFailureIsACudaErrorAndLeavesNothing) {
  if (GetParam().graph || GetParam().disable_chunked_prefix_cache) {
    GTEST_SKIP()
        << "copy faults: the three plain backends only (about 1.5 minutes each under ASan)";
  }
  sweep(fi::Site::kCopy, {StatusCode::kCudaError});
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultInjection,
                         ::testing::Values(Scenario{"paged_mla"}, Scenario{"chunked_mla"},
                                           Scenario{"ondemand_mla"}, Scenario{"chunked_mla", true},
                                           Scenario{"paged_mla", false, true},
                                           Scenario{"ondemand_mla", false, true}),
                         [](const ::testing::TestParamInfo<Scenario>& info) {
                           std::string n = name_of(info.param);
                           for (char& c : n) {
                             if (c == '+') c = '_';
                           }
                           return n;
                         });

TEST(FaultInjectionHook, CountsAndFiresOnceAtTheArmedEvent) {
  fi::reset();
  fi::fail_at(fi::Site::kAllocation, 2);
  auto a = DeviceBuffer::allocate(Device::cpu(), 64, "test.a", "test", false);
  EXPECT_TRUE(a.ok());
  EXPECT_FALSE(fi::fired(fi::Site::kAllocation));
  auto b = DeviceBuffer::allocate(Device::cpu(), 64, "test.b", "test", true);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(b.status().message().find("test.b"), std::string::npos) << b.status().message();
  EXPECT_TRUE(fi::fired(fi::Site::kAllocation));
  auto c = DeviceBuffer::allocate(Device::cpu(), 64, "test.c", "test", false);
  EXPECT_TRUE(c.ok());
  EXPECT_EQ(fi::count(fi::Site::kAllocation), 3u);
  // A zeroed allocation whose memset fails frees its memory and records nothing.
  const auto before = MemoryLedger::global().snapshot().size();
  fi::fail_at(fi::Site::kCopy, 1);
  auto d = DeviceBuffer::allocate(Device::cpu(), 64, "test.d", "test", true);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kCudaError);
  EXPECT_EQ(MemoryLedger::global().snapshot().size(), before);
  fi::reset();
}

}  // namespace
}  // namespace mla
