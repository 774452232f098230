// The CUDA absorbed op over the page-table forms (include/mla/ops.h AbsorbedArgs): a block table
// of page ids [rows, max_blocks] and a flat page list (rows = offsets) are read in place and give
// the bits of the token-level req_to_token run, on both key load paths (cp.async below pages of
// 64, TMA from 64) and both cache dtypes; a page id past the cache is never read. Built only
// with MLA_CUDA=ON; skipped without a device.
#ifdef MLA_WITH_CUDA
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "conformance/case_gen.h"
#include "conformance/conformance.h"
#include "gpu/device_test_util.h"
#include "mla/memory.h"
#include "mla/ops.h"

namespace mla::testing {
namespace {

enum class Form { kTokens, kBlocks, kFlat };

struct Problem {
  int heads = 0, page = 1;
  DType dtype = DType::kBF16;
  float k_scale = 1.0f;
  std::vector<int32_t> q_lens, kv_lens;
  PagedLayout layout;
  LatentCache cache;
  std::vector<bf16> q;
  int64_t tokens = 0;
  std::vector<int32_t> flat, offsets;  // the flat page list and each request's offset into it
};

Problem make(uint64_t seed, int heads, int page, DType dtype, std::vector<int32_t> q_lens,
             std::vector<int32_t> kv_lens) {
  Problem p;
  Rng rng(seed);
  p.heads = heads;
  p.page = page;
  p.dtype = dtype;
  p.k_scale = dtype == DType::kFP8E4M3 ? 0.5f : 1.0f;
  p.q_lens = std::move(q_lens);
  p.kv_lens = std::move(kv_lens);
  p.layout = make_paged_layout(p.kv_lens, page, true, rng);
  p.cache = make_latent_cache(p.layout, dtype, p.k_scale, rng);
  for (int32_t q : p.q_lens) p.tokens += q;
  p.q = random_bf16(p.tokens * heads * 576, rng);
  p.flat = {0};  // an entry no request uses: offsets start at 1
  for (std::size_t b = 0; b < p.kv_lens.size(); ++b) {
    p.offsets.push_back(static_cast<int32_t>(p.flat.size()));
    const int32_t* row = p.layout.block_table.data() + p.layout.req_rows[b] * p.layout.max_blocks;
    for (int j = 0; j < (p.kv_lens[b] + page - 1) / page; ++j) p.flat.push_back(row[j]);
  }
  return p;
}

struct Outputs {
  std::vector<uint16_t> o;
  std::vector<uint32_t> lse;  // bits
};

// Plans (rows: the layout's pool rows, or the flat list's offsets), runs once into poisoned
// outputs and reads them back.
::testing::AssertionResult run(const AbsorbedAttentionOp& op, const Problem& p, Form form,
                               const std::vector<int32_t>& flat, Outputs* out) {
  const Device dev = Device::cuda();
  const AttnCapacity cap{static_cast<int>(p.q_lens.size()), p.tokens, 0, 8, p.heads};
  const std::vector<int32_t>& rows = form == Form::kFlat ? p.offsets : p.layout.req_rows;
  const AbsorbedProblem problem{p.heads, p.page, true, rows, p.q_lens, p.kv_lens};
  std::vector<std::byte> plan(op.plan_bytes(cap));
  if (const auto used = op.plan(problem, cap, plan); !used.ok()) {
    return ::testing::AssertionFailure() << "plan: " << used.status().to_string();
  }
  const std::vector<int32_t>& table = form == Form::kTokens   ? p.layout.req_to_token
                                      : form == Form::kBlocks ? p.layout.block_table
                                                              : flat;
  auto q = upload(p.q.data(), p.q.size() * 2, "q");
  auto kv = upload(p.cache.bytes.data(), p.cache.bytes.size(), "kv");
  auto tab = upload(table.data(), table.size() * 4, "table");
  auto plan_d = upload(plan.data(), plan.size(), "plan");
  auto ws = DeviceBuffer::allocate(dev, op.workspace_bytes(cap), "ws", "test", false);
  auto o = DeviceBuffer::allocate(dev, p.tokens * p.heads * 512 * 2, "o", "test", false);
  auto lse = DeviceBuffer::allocate(dev, p.tokens * p.heads * 4, "lse", "test", false);
  if (!(q.ok() && kv.ok() && tab.ok() && plan_d.ok() && ws.ok() && o.ok() && lse.ok())) {
    return ::testing::AssertionFailure() << "device allocation or upload failed";
  }
  DeviceRuntime* rt = device_runtime(DeviceType::kCuda);
  if (!rt->memset(o->data(), 0xff, o->bytes(), nullptr).ok() ||
      !rt->memset(lse->data(), 0xff, lse->bytes(), nullptr).ok()) {
    return ::testing::AssertionFailure() << "poisoning the outputs failed";
  }
  AbsorbedArgs a;
  a.q = TensorView(q->data(), DType::kBF16, dev, {p.tokens, p.heads, 576});
  a.kv_cache = TensorView(kv->data(), p.dtype, dev, {p.layout.num_slots, 576});
  a.k_scale = p.k_scale;
  switch (form) {
    case Form::kTokens:
      a.req_to_token =
          TensorView(tab->data(), DType::kI32, dev, {p.layout.num_rows, p.layout.max_context_len});
      break;
    case Form::kBlocks:
      a.block_table =
          TensorView(tab->data(), DType::kI32, dev, {p.layout.num_rows, p.layout.max_blocks});
      break;
    case Form::kFlat:
      a.block_table =
          TensorView(tab->data(), DType::kI32, dev, {static_cast<int64_t>(flat.size())});
      break;
  }
  a.o = TensorView(o->data(), DType::kBF16, dev, {p.tokens, p.heads, 512});
  a.lse = TensorView(lse->data(), DType::kF32, dev, {p.tokens, p.heads});
  a.sm_scale = 0.135234f;
  a.plan = plan_d->data();
  a.workspace = ws->data();
  a.workspace_bytes = ws->bytes();
  if (const Status st = op.run(a, ExecContext{dev, nullptr}); !st.ok()) {
    return ::testing::AssertionFailure() << "run: " << st.to_string();
  }
  out->o.resize(p.tokens * p.heads * 512);
  out->lse.resize(p.tokens * p.heads);
  if (const Status st = rt->copy_to_host(out->o.data(), o->data(), o->bytes(), nullptr); !st.ok()) {
    return ::testing::AssertionFailure() << st.to_string();
  }
  if (const Status st = rt->copy_to_host(out->lse.data(), lse->data(), lse->bytes(), nullptr);
      !st.ok()) {
    return ::testing::AssertionFailure() << st.to_string();
  }
  if (const Status st = rt->synchronize(nullptr); !st.ok()) {
    return ::testing::AssertionFailure() << "after the run: " << st.to_string();
  }
  return ::testing::AssertionSuccess();
}

class PageTableDevice : public CudaAbsorbedTest {};

TEST_F(PageTableDevice, BlockTableAndFlatListEqualReqToTokenBitwise) {
  for (int page : {1, 16, 32, 64, 128}) {
    for (DType dtype : {DType::kBF16, DType::kFP8E4M3}) {
      for (int heads : {16, 128}) {
        const std::string what = "page " + std::to_string(page) + " " +
                                 std::string(dtype_name(dtype)) + " h" + std::to_string(heads);
        const Problem p = make(mix_seed(base_seed(), 300 + page + heads), heads, page, dtype,
                               {1, 2, 1, 4}, {page + 1, 700, 3, 2 * page + 37});
        Outputs tokens, blocks, flat;
        ASSERT_TRUE(run(*op_, p, Form::kTokens, p.flat, &tokens)) << what;
        ASSERT_TRUE(run(*op_, p, Form::kBlocks, p.flat, &blocks)) << what;
        ASSERT_TRUE(run(*op_, p, Form::kFlat, p.flat, &flat)) << what;
        EXPECT_EQ(blocks.o, tokens.o) << what;
        EXPECT_EQ(blocks.lse, tokens.lse) << what;
        EXPECT_EQ(flat.o, tokens.o) << what;
        EXPECT_EQ(flat.lse, tokens.lse) << what;
        bool finite = true;
        for (uint32_t bits : tokens.lse) {
          float v;
          std::memcpy(&v, &bits, 4);
          finite = finite && std::isfinite(v);
        }
        EXPECT_TRUE(finite) << what << ": poisoned lse left in the output";
      }
    }
  }
}

TEST_F(PageTableDevice, PageIdPastTheCacheIsNeverRead) {
  // The cuda op checks no device table (a sync per call); an entry outside the cache must still
  // not be read: its keys load as zeros, the run completes and the context stays healthy.
  for (int page : {16, 64}) {
    Problem p = make(mix_seed(base_seed(), 400 + page), 16, page, DType::kBF16, {1, 1},
                     {3 * page, page + 5});
    std::vector<int32_t> flat = p.flat;
    flat[p.offsets[0] + 1] = 1 << 28;  // far past the cache (and its slot past int32)
    flat[p.offsets[1]] = -3;
    Outputs out;
    ASSERT_TRUE(run(*op_, p, Form::kFlat, flat, &out)) << "page " << page;
    for (uint32_t bits : out.lse) {
      float v;
      std::memcpy(&v, &bits, 4);
      EXPECT_TRUE(std::isfinite(v)) << "page " << page;
    }
  }
}

}  // namespace
}  // namespace mla::testing
#endif  // MLA_WITH_CUDA
