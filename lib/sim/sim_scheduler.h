// The scheduler of `mla run`: turns a stream of requests (sim_workload.h) into forward batches
// over a LatentKvPool, the way a serving engine's scheduler does, so a backend sees realistic
// batches. Pure host code (no attention runs here), unit-tested in tests/unit/cli_*.
//
// Per step:
//  1. requests whose arrival_step has come join the waiting queue (FIFO);
//  2. the pool must hold this step's growth: every decoding request's next token(s) and the rest
//     of every admitted prompt. When its free pages fall short, cached prefixes are evicted
//     (least recently used) and then running requests are preempted, the most recently admitted
//     first, recompute-style as vLLM and SGLang do: the victim's pages are freed, it goes back
//     to the front of the waiting queue, and when admitted again it prefills its prompt plus the
//     tokens it had generated (their KV is recomputed), then decodes on. The oldest running
//     request is never preempted for a younger one, so it always progresses: no livelock;
//  3. requests still in prefill continue (chunked prefill: at most max_batch_tokens new tokens
//     per step across the batch), then waiting requests are admitted while a request row is free
//     and the free pages, less this step's growth, cover the new request's prompt (plus, after
//     a preemption, its generated tokens). Admission never reads a request's output length: it
//     learns it as the request decodes, as a server does. A request of a prefix group whose
//     system prompt is cached starts with that prefix shared (LatentKvPool::share_prefix,
//     page-aligned): a prefix-cache hit. Cached prefixes are held by their own pool rows and
//     evicted least-recently-used when rows or pages run short. A request that alone cannot
//     fit the pool at its peak length is rejected by create();
//  4. the batch: EXTEND when only prefill work exists (or speculative decoding is on, which does
//     not mix), MIXED when prefill and decode work exist and mixing is enabled, DECODE when only
//     decode work exists; with speculative_tokens N > 0, decode work is a TARGET_VERIFY batch of
//     N tokens per request instead, and after it a DRAFT_EXTEND batch of each request's accepted
//     tokens (a random count in 1..N) follows;
//  5. complete_step() commits the outcome: prefill progress, generated tokens, rejected drafts
//     truncated, finished requests freed, new prefix-cache entries.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "mla/batch.h"
#include "mla/kv_pool.h"
#include "mla/status.h"
#include "sim_workload.h"

namespace mla::sim {

struct SchedulerConfig {
  int max_running_requests = 32;
  int64_t max_batch_tokens = 1024;  // new tokens per step (chunked prefill splits prompts)
  bool enable_mixed = true;         // MIXED batches of prefill chunks and decodes
  int speculative_tokens = 0;       // N draft tokens per verify; 0 = no speculative decoding
  int max_prefix_entries = 8;       // cached system prompts held at once
  uint64_t seed = 1;                // accepted-draft counts

  // Request rows a pool needs for this configuration (running requests + cached prefixes).
  int pool_rows() const { return max_running_requests + max_prefix_entries; }
  Status validate() const;
};

// One batch and which requests it holds (request_ids[b] is the id of batch entry b).
struct Step {
  int64_t index = 0;  // 0, 1, ... over all batches
  int64_t clock = 0;  // scheduler step (arrivals); a DRAFT_EXTEND shares its verify's clock
  ForwardBatch batch;
  std::vector<int> request_ids;
  int num_prefill = 0;    // MIXED: the first num_prefill entries are prefill chunks
  int num_recompute = 0;  // prefill entries that re-prefill a preempted request
};

// When each request went through the stages a serving engineer times, as step indices
// (Step::index; -1 = not yet). The driver turns them into seconds on its timeline.
struct RequestEvents {
  int64_t arrived = -1;      // the step during whose scheduling it joined the waiting queue
  int64_t scheduled = -1;    // the step of its first prefill chunk (first admission)
  int64_t first_token = -1;  // the step whose prefill produced its first output token
  int64_t finished = -1;     // the step that produced its last output token
  int preemptions = 0;
};

struct SchedulerStats {
  int64_t steps = 0;
  std::map<ForwardMode, int64_t> batches;  // per mode
  std::map<ForwardMode, int64_t> tokens;   // new (query) tokens per mode
  int64_t prefix_hits = 0;                 // requests admitted with a shared prefix
  int64_t prefix_hit_tokens = 0;           // tokens shared instead of prefilled
  int64_t prefix_evictions = 0;
  int64_t prefill_chunks = 0;  // prefill pieces that did not finish a prompt
  int64_t drafts_proposed = 0;
  int64_t drafts_accepted = 0;  // accepted tokens, bonus included
  int64_t finished = 0;
  int max_batch_size = 0;
  int64_t peak_used_pages = 0;
  int64_t preemptions = 0;         // running requests preempted (recompute-style)
  int64_t preempted_requests = 0;  // distinct requests preempted at least once
  int64_t preempted_tokens = 0;    // KV tokens the preemptions discarded (recomputed later)
  int64_t recompute_tokens = 0;    // tokens re-prefilled after a preemption
};

class Scheduler {
 public:
  // The pool must have at least config.pool_rows() request rows; every request must fit the
  // pool's max_context_len (validate_request) and, alone, the pool's pages.
  static StatusOr<std::unique_ptr<Scheduler>> create(LatentKvPool* pool, SchedulerConfig config,
                                                     std::vector<RequestSpec> requests);
  ~Scheduler();

  // True when every request has finished.
  bool done() const;
  // Builds the next batch and allocates pool slots for its new tokens (out_cache_loc).
  StatusOr<Step> next_step();
  // Commits the outcome of the batch last returned by next_step().
  Status complete_step(const Step& step);
  // Frees the cached prefixes (and any request still running). Idempotent.
  Status release_all();

  const SchedulerStats& stats() const { return stats_; }
  const std::vector<RequestSpec>& requests() const { return requests_; }
  // Tokens each request generated so far (indexed by request id).
  const std::vector<int32_t>& generated() const { return generated_; }
  const std::vector<RequestEvents>& events() const { return events_; }
  // Prompt tokens prefilled for the first time plus output tokens generated: the work done,
  // re-prefills after a preemption not counted twice (the progress bar).
  int64_t progress_tokens() const { return progress_tokens_; }

 private:
  struct Running {
    int id = 0;
    int row = 0;
    int32_t len = 0;         // tokens with a slot (committed KV)
    int32_t prefilled = 0;   // tokens of the prefill target processed
    int32_t target = 0;      // prefill target: the prompt, plus the generated tokens after a
                             // preemption (what is known at admission; never the output length)
    bool recompute = false;  // re-prefilling after a preemption
  };
  struct PrefixEntry {
    int row = 0;
    int32_t len = 0;
    int64_t last_use = 0;
  };

  Scheduler(LatentKvPool* pool, SchedulerConfig config, std::vector<RequestSpec> requests);
  int64_t pages(int64_t tokens) const;
  // Pages this step may still allocate: the rest of every admitted prefill target and each
  // decoding request's next token(s).
  int64_t step_growth_pages() const;
  // Evicts cached prefixes, then preempts the most recently admitted requests, until the free
  // pages cover step_growth_pages().
  Status make_room();
  Status preempt(std::size_t running_index);
  int32_t aligned_prefix(const RequestSpec& r) const;
  Status evict_one(int keep_group, bool* evicted);
  Status try_admit(const RequestSpec& r, bool* admitted);
  Status add_prefill_chunk(Running& run, int64_t* budget, Step* step);
  Status add_decode(Running& run, Step* step);
  Status maybe_cache_prefix(const Running& run);
  Status finish(std::size_t running_index, int64_t step_index);
  void record(const Step& step);

  LatentKvPool* pool_;
  SchedulerConfig config_;
  std::vector<RequestSpec> requests_;
  std::vector<int32_t> generated_;
  std::vector<RequestEvents> events_;
  std::vector<int32_t> prompt_done_;  // prompt tokens prefilled at least once, per request
  int64_t progress_tokens_ = 0;
  std::size_t next_arrival_ = 0;
  std::deque<int> waiting_;
  std::vector<Running> running_;
  std::map<int, PrefixEntry> prefix_cache_;  // by prefix_group
  std::vector<int> draft_pending_;           // request ids owed a DRAFT_EXTEND
  std::map<int, int32_t> draft_prefix_;      // request id -> committed length before the verify
  int64_t clock_ = 0;
  int64_t step_index_ = 0;
  std::mt19937_64 rng_;
  SchedulerStats stats_;
};

}  // namespace mla::sim
