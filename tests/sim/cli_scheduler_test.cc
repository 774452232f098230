// Invariants of the `mla run` scheduler (lib/sim/sim_scheduler.h) over whole simulated runs:
// every batch is valid for the pool, its out_cache_loc are the pool's slots of exactly its new
// tokens, budgets and limits hold, every request finishes with its output length, prefixes are
// shared, and the pool is empty again at the end.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <set>

#include "mla/kv_pool.h"
#include "sim/sim_scheduler.h"
#include "sim/sim_workload.h"

namespace mla::sim {
namespace {

std::unique_ptr<LatentKvPool> make_pool(int page_size, int64_t pool_tokens, int rows,
                                        int max_context_len = 4096) {
  KvPoolConfig pc;
  pc.num_layers = 1;
  pc.page_size = page_size;
  pc.num_pages = pool_tokens / page_size;
  pc.max_requests = rows;
  pc.max_context_len = max_context_len;
  pc.latent_dim = 8;  // the scheduler never reads the cache; keep it small
  auto pool = LatentKvPool::create(pc);
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  return pool.ok() ? std::move(pool).value() : nullptr;
}

using StepHook = std::function<void(const Step&, const LatentKvPool&)>;

// Runs the scheduler to the end checking the per-step invariants; returns the stats.
SchedulerStats run_all(LatentKvPool* pool, const SchedulerConfig& cfg,
                       std::vector<RequestSpec> reqs, const StepHook& hook = nullptr) {
  auto sched_or = Scheduler::create(pool, cfg, reqs);
  EXPECT_TRUE(sched_or.ok()) << sched_or.status().to_string();
  if (!sched_or.ok()) return {};
  Scheduler& sched = **sched_or;
  const BatchLimits limits = pool->batch_limits();
  int64_t guard = 0;
  while (!sched.done() && ++guard < 100000) {
    auto step = sched.next_step();
    EXPECT_TRUE(step.ok()) << step.status().to_string();
    if (!step.ok()) return {};
    const ForwardBatch& b = step->batch;
    EXPECT_TRUE(validate_batch(b, limits).ok()) << validate_batch(b, limits).to_string();
    EXPECT_GE(b.batch_size, 1);
    EXPECT_LE(b.batch_size, cfg.max_running_requests);
    EXPECT_EQ(static_cast<int>(step->request_ids.size()), b.batch_size);
    if (b.mode == ForwardMode::kExtend || b.mode == ForwardMode::kMixed) {
      EXPECT_LE(b.num_tokens(), cfg.max_batch_tokens);
    }
    if (cfg.speculative_tokens > 0) {
      EXPECT_NE(b.mode, ForwardMode::kMixed);
      EXPECT_NE(b.mode, ForwardMode::kDecode);
    }
    // out_cache_loc: the slots of each entry's new tokens, distinct, never the dummy page.
    std::set<int32_t> rows, slots;
    std::size_t t = 0;
    for (int i = 0; i < b.batch_size; ++i) {
      const int row = b.req_pool_indices[i];
      EXPECT_TRUE(rows.insert(row).second) << "row " << row << " twice in one batch";
      const int32_t first = b.kv_len(i) - b.q_len(i);
      EXPECT_GE(pool->request_len(row), b.kv_len(i));
      for (int32_t tok = first; tok < b.kv_len(i) && t < b.out_cache_loc.size(); ++tok, ++t) {
        EXPECT_EQ(b.out_cache_loc[t], pool->slot(row, tok)) << "entry " << i << " token " << tok;
        EXPECT_GE(b.out_cache_loc[t], pool->config().page_size);
        EXPECT_TRUE(slots.insert(b.out_cache_loc[t]).second);
      }
    }
    EXPECT_EQ(t, b.out_cache_loc.size());
    if (hook) hook(*step, *pool);
    Status s = sched.complete_step(*step);
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (!s.ok()) return {};
  }
  EXPECT_TRUE(sched.done());
  for (const RequestSpec& r : sched.requests()) {
    EXPECT_EQ(sched.generated()[static_cast<std::size_t>(r.id)], r.output_len)
        << "request " << r.id;
  }
  SchedulerStats stats = sched.stats();
  EXPECT_EQ(stats.finished, static_cast<int64_t>(reqs.size()));
  EXPECT_LE(stats.peak_used_pages, pool->config().num_pages);
  EXPECT_TRUE(sched.release_all().ok());
  EXPECT_EQ(pool->free_pages(), pool->config().num_pages);
  return stats;
}

std::vector<RequestSpec> workload(int n, uint64_t seed) {
  WorkloadConfig c;
  c.num_requests = n;
  c.seed = seed;
  auto w = generate_workload(c);
  EXPECT_TRUE(w.ok());
  return w.ok() ? *w : std::vector<RequestSpec>{};
}

TEST(CliScheduler, DefaultWorkloadProducesExtendMixedDecodeAndPrefixHits) {
  for (int page_size : {1, 16, 64}) {
    SCOPED_TRACE(page_size);
    SchedulerConfig cfg;
    auto pool = make_pool(page_size, 32768, cfg.pool_rows());
    ASSERT_NE(pool, nullptr);
    const SchedulerStats s = run_all(pool.get(), cfg, workload(40, 3));
    EXPECT_GT(s.batches.count(ForwardMode::kExtend), 0u);
    EXPECT_GT(s.batches.count(ForwardMode::kMixed), 0u);
    EXPECT_GT(s.batches.count(ForwardMode::kDecode), 0u);
    EXPECT_GT(s.prefix_hits, 0);
    EXPECT_EQ(s.prefix_hit_tokens % page_size, 0);
  }
}

TEST(CliScheduler, SpeculativeRunsVerifyThenDraftExtend) {
  SchedulerConfig cfg;
  cfg.speculative_tokens = 3;
  auto pool = make_pool(16, 32768, cfg.pool_rows());
  ASSERT_NE(pool, nullptr);
  ForwardMode last = ForwardMode::kIdle;
  std::vector<int> verify_ids;
  const SchedulerStats s =
      run_all(pool.get(), cfg, workload(24, 5), [&](const Step& step, const LatentKvPool&) {
        const ForwardBatch& b = step.batch;
        if (b.mode == ForwardMode::kTargetVerify) {
          EXPECT_EQ(b.num_draft_tokens, 3);
          verify_ids = step.request_ids;
        }
        if (b.mode == ForwardMode::kDraftExtend) {
          EXPECT_EQ(last, ForwardMode::kTargetVerify);
          for (int i = 0; i < b.batch_size; ++i) {
            EXPECT_GE(b.extend_seq_lens[i], 1);
            EXPECT_LE(b.extend_seq_lens[i], 3);
          }
          EXPECT_LE(step.request_ids.size(), verify_ids.size());
        }
        last = b.mode;
      });
  EXPECT_GT(s.batches.count(ForwardMode::kTargetVerify), 0u);
  EXPECT_GT(s.batches.count(ForwardMode::kDraftExtend), 0u);
  EXPECT_EQ(s.batches.count(ForwardMode::kDecode), 0u);
  EXPECT_GT(s.drafts_accepted, 0);
  EXPECT_LT(s.drafts_accepted, s.drafts_proposed);
}

TEST(CliScheduler, SmallBudgetChunksPrefillsIntoExtendsWithPrefix) {
  SchedulerConfig cfg;
  cfg.max_batch_tokens = 64;
  cfg.enable_mixed = false;
  auto pool = make_pool(16, 32768, cfg.pool_rows());
  ASSERT_NE(pool, nullptr);
  bool continued_chunk = false;
  const SchedulerStats s =
      run_all(pool.get(), cfg, workload(12, 9), [&](const Step& step, const LatentKvPool&) {
        if (step.batch.mode != ForwardMode::kExtend) return;
        for (int i = 0; i < step.batch.batch_size; ++i) {
          continued_chunk |= step.batch.extend_prefix_lens[i] > 0;
        }
      });
  EXPECT_GT(s.prefill_chunks, 0);
  EXPECT_TRUE(continued_chunk);
  EXPECT_EQ(s.batches.count(ForwardMode::kMixed), 0u);
}

TEST(CliScheduler, TightPoolMakesRequestsWaitButNeverRunsOut) {
  SchedulerConfig cfg;
  auto reqs = workload(30, 11);
  int64_t biggest = 0;
  for (const RequestSpec& r : reqs)
    biggest = std::max<int64_t>(biggest, r.prompt_len + r.output_len);
  // Room for about two of the largest requests: admission must hold the rest back.
  auto pool = make_pool(16, (biggest * 2 + 31) / 16 * 16, cfg.pool_rows());
  ASSERT_NE(pool, nullptr);
  int max_bs = 0;
  const SchedulerStats s =
      run_all(pool.get(), cfg, reqs, [&](const Step& step, const LatentKvPool&) {
        max_bs = std::max(max_bs, step.batch.batch_size);
      });
  EXPECT_LT(max_bs, 30);
  EXPECT_GT(s.peak_used_pages, pool->config().num_pages / 2);
}

TEST(CliScheduler, PrefixHitSharesTheCachedSlots) {
  std::vector<RequestSpec> reqs(2);
  reqs[0] = RequestSpec{0, 0, 100, 2, 1, 70};
  reqs[1] = RequestSpec{1, 50, 90, 3, 1, 70};  // arrives after request 0 finished
  SchedulerConfig cfg;
  auto pool = make_pool(16, 4096, cfg.pool_rows());
  ASSERT_NE(pool, nullptr);
  std::vector<int32_t> first_slots;
  bool checked = false;
  const SchedulerStats s =
      run_all(pool.get(), cfg, reqs, [&](const Step& step, const LatentKvPool& p) {
        const ForwardBatch& b = step.batch;
        if (b.mode != ForwardMode::kExtend) return;
        if (step.request_ids[0] == 0) {
          first_slots.assign(b.out_cache_loc.begin(), b.out_cache_loc.begin() + 64);
        } else {
          EXPECT_EQ(b.extend_prefix_lens[0], 64);  // 70 rounded down to the page size
          EXPECT_EQ(b.extend_seq_lens[0], 26);
          for (int t = 0; t < 64; ++t) EXPECT_EQ(p.slot(b.req_pool_indices[0], t), first_slots[t]);
          checked = true;
        }
      });
  EXPECT_TRUE(checked);
  EXPECT_EQ(s.prefix_hits, 1);
  EXPECT_EQ(s.prefix_hit_tokens, 64);
}

TEST(CliScheduler, RejectsRequestsThatCannotFit) {
  SchedulerConfig cfg;
  auto pool = make_pool(16, 256, cfg.pool_rows());
  ASSERT_NE(pool, nullptr);
  std::vector<RequestSpec> reqs(1);
  reqs[0] = RequestSpec{0, 0, 300, 10, 0, 0};
  auto s = Scheduler::create(pool.get(), cfg, reqs);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("request 0"), std::string::npos) << s.status().message();

  auto few_rows = make_pool(16, 4096, 4);
  ASSERT_NE(few_rows, nullptr);
  auto r = Scheduler::create(few_rows.get(), cfg, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("request rows"), std::string::npos);

  cfg.speculative_tokens = 9;
  auto pool2 = make_pool(16, 4096, cfg.pool_rows());
  EXPECT_FALSE(Scheduler::create(pool2.get(), cfg, {}).ok());
}

// Pages this step writes (its out_cache_loc) belong to exactly one live request: no two
// requests are ever handed the same page, however tight the pool.
void expect_written_pages_exclusive(const Step& step, const LatentKvPool& pool) {
  const int p = pool.config().page_size;
  for (int32_t slot : step.batch.out_cache_loc) {
    EXPECT_EQ(pool.allocator().ref_count(slot / p), 1)
        << "slot " << slot << " of step " << step.index;
  }
  EXPECT_LE(pool.config().num_pages - pool.free_pages(), pool.config().num_pages);
}

// Eight requests whose prompts fit together but whose outputs do not: admission (prompts only)
// takes all eight, decodes then run out of pages and the scheduler preempts; every request
// still finishes with its full output and the pool ends empty (run_all's checks).
TEST(CliScheduler, PreemptsWhenDecodesOutgrowThePool) {
  std::vector<RequestSpec> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back(RequestSpec{i, 0, 100, 200, 0, 0});
  SchedulerConfig cfg;
  auto pool = make_pool(16, 1024, cfg.pool_rows());  // 64 pages; one request peaks at 19
  ASSERT_NE(pool, nullptr);
  int max_bs = 0;
  const SchedulerStats s =
      run_all(pool.get(), cfg, reqs, [&](const Step& step, const LatentKvPool& p) {
        expect_written_pages_exclusive(step, p);
        if (step.batch.mode == ForwardMode::kDecode)
          max_bs = std::max(max_bs, step.batch.batch_size);
      });
  EXPECT_EQ(max_bs, 8);  // the prompts were all admitted at once: output lengths unknown
  EXPECT_GT(s.preemptions, 0);
  EXPECT_GT(s.preempted_requests, 0);
  EXPECT_GT(s.recompute_tokens, 0);
  EXPECT_GE(s.peak_used_pages, 60);
}

// A preempted request comes back at the front of the queue and re-prefills its prompt plus
// the tokens it had generated, then generates the rest; the oldest request is never the victim.
TEST(CliScheduler, PreemptedRequestRePrefillsPromptAndGeneratedTokens) {
  std::vector<RequestSpec> reqs{RequestSpec{0, 0, 32, 40, 0, 0}, RequestSpec{1, 0, 32, 40, 0, 0},
                                RequestSpec{2, 1, 16, 4, 0, 0}};
  SchedulerConfig cfg;
  auto pool = make_pool(16, 128, cfg.pool_rows());  // 8 pages; each of 0 and 1 peaks at 5
  ASSERT_NE(pool, nullptr);
  auto sched_or = Scheduler::create(pool.get(), cfg, reqs);
  ASSERT_TRUE(sched_or.ok()) << sched_or.status().to_string();
  Scheduler& sched = **sched_or;
  std::map<int, int32_t> generated_at_preemption;
  std::map<int, int> preemptions_seen;
  bool re_prefill_seen = false;
  int guard = 0;
  while (!sched.done() && ++guard < 10000) {
    auto step = sched.next_step();
    ASSERT_TRUE(step.ok()) << step.status().to_string();
    for (int id : {0, 1, 2}) {  // preempted while next_step() made room?
      const RequestEvents& e = sched.events()[static_cast<std::size_t>(id)];
      if (e.preemptions > preemptions_seen[id]) {
        preemptions_seen[id] = e.preemptions;
        generated_at_preemption[id] = sched.generated()[static_cast<std::size_t>(id)];
      }
    }
    for (std::size_t i = 0; i < step->request_ids.size(); ++i) {
      const int id = step->request_ids[i];
      const bool prefill =
          step->batch.mode == ForwardMode::kExtend ||
          (step->batch.mode == ForwardMode::kMixed && static_cast<int>(i) < step->num_prefill);
      if (prefill && generated_at_preemption.count(id)) {
        EXPECT_EQ(step->batch.extend_prefix_lens[i], 0);  // its KV was freed: from scratch
        EXPECT_EQ(step->batch.seq_lens[i], reqs[id].prompt_len + generated_at_preemption[id]);
        EXPECT_GT(step->num_recompute, 0);
        generated_at_preemption.erase(id);
        re_prefill_seen = true;
      }
    }
    ASSERT_TRUE(sched.complete_step(*step).ok());
  }
  ASSERT_TRUE(sched.done());
  EXPECT_TRUE(re_prefill_seen);
  EXPECT_EQ(sched.events()[0].preemptions, 0);  // the oldest always progresses
  EXPECT_GT(sched.stats().preemptions, 0);
  for (const RequestSpec& r : reqs) {
    const RequestEvents& e = sched.events()[static_cast<std::size_t>(r.id)];
    EXPECT_EQ(sched.generated()[static_cast<std::size_t>(r.id)], r.output_len);
    EXPECT_GE(e.arrived, 0);
    EXPECT_GE(e.scheduled, e.arrived);
    EXPECT_GE(e.first_token, e.scheduled);
    EXPECT_GE(e.finished, e.first_token);
  }
  int64_t total = 0;
  for (const RequestSpec& r : reqs) total += r.prompt_len + r.output_len;
  EXPECT_EQ(sched.progress_tokens(), total);  // re-prefills not counted twice
  EXPECT_TRUE(sched.release_all().ok());
  EXPECT_EQ(pool->free_pages(), pool->config().num_pages);
}

// Property: over seeds, page sizes, speculative decoding and mixing, with pools from barely
// the largest request to roomy, every request finishes with its output length, written pages
// are never shared, the pool is empty at the end and nothing livelocks (run_all's guard).
TEST(CliScheduler, PreemptionPropertyEveryRequestFinishesOnTightPools) {
  int64_t preemptions = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    for (int page_size : {1, 16, 64}) {
      for (int spec : {0, 2}) {
        for (double room : {1.0, 1.5, 3.0}) {
          SCOPED_TRACE(testing::Message() << "seed " << seed << " page " << page_size << " spec "
                                          << spec << " room " << room);
          WorkloadConfig wc;
          wc.num_requests = 16;
          wc.seed = seed;
          wc.prompt_median = 64;
          wc.prompt_max = 512;
          wc.output_median = 48;
          wc.output_max = 200;
          auto w = generate_workload(wc);
          ASSERT_TRUE(w.ok());
          int64_t biggest = 0;
          for (const RequestSpec& r : *w)
            biggest = std::max<int64_t>(biggest, r.prompt_len + r.output_len - 1 + spec);
          SchedulerConfig cfg;
          cfg.speculative_tokens = spec;
          cfg.enable_mixed = seed % 2 == 1;
          cfg.max_batch_tokens = 256;
          cfg.seed = seed;
          const int64_t pages = static_cast<int64_t>(
              room * static_cast<double>((biggest + page_size - 1) / page_size) + 1);
          auto pool = make_pool(page_size, pages * page_size, cfg.pool_rows());
          ASSERT_NE(pool, nullptr);
          const SchedulerStats s = run_all(pool.get(), cfg, *w, expect_written_pages_exclusive);
          EXPECT_EQ(s.finished, 16);
          preemptions += s.preemptions;
        }
      }
    }
  }
  EXPECT_GT(preemptions, 0);
}

TEST(CliScheduler, CompleteStepOutOfOrderIsAnError) {
  SchedulerConfig cfg;
  auto pool = make_pool(1, 4096, cfg.pool_rows());
  ASSERT_NE(pool, nullptr);
  auto sched = Scheduler::create(pool.get(), cfg, workload(4, 1));
  ASSERT_TRUE(sched.ok());
  auto a = (*sched)->next_step();
  ASSERT_TRUE(a.ok());
  Step stale = *a;
  stale.index = 7;
  EXPECT_FALSE((*sched)->complete_step(stale).ok());
  EXPECT_TRUE((*sched)->complete_step(*a).ok());
}

}  // namespace
}  // namespace mla::sim
