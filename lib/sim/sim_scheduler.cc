#include "sim_scheduler.h"

#include <algorithm>

namespace mla::sim {

Status SchedulerConfig::validate() const {
  MLA_CHECK_ARG(max_running_requests >= 1, "scheduler.max_running_requests = {} must be >= 1",
                max_running_requests);
  MLA_CHECK_ARG(max_batch_tokens >= 1, "scheduler.max_batch_tokens = {} must be >= 1",
                max_batch_tokens);
  MLA_CHECK_ARG(speculative_tokens >= 0, "scheduler.speculative_tokens = {} is negative",
                speculative_tokens);
  MLA_CHECK_ARG(max_prefix_entries >= 0, "scheduler.max_prefix_entries = {} is negative",
                max_prefix_entries);
  return Status::Ok();
}

Scheduler::Scheduler(LatentKvPool* pool, SchedulerConfig config, std::vector<RequestSpec> requests)
    : pool_(pool),
      config_(config),
      requests_(std::move(requests)),
      generated_(requests_.size(), 0),
      events_(requests_.size()),
      prompt_done_(requests_.size(), 0),
      rng_(config.seed) {}

Scheduler::~Scheduler() { release_all().ignore(); }

StatusOr<std::unique_ptr<Scheduler>> Scheduler::create(LatentKvPool* pool, SchedulerConfig config,
                                                       std::vector<RequestSpec> requests) {
  MLA_CHECK_ARG(pool != nullptr, "scheduler: pool is null");
  MLA_RETURN_IF_ERROR(config.validate());
  const KvPoolConfig& pc = pool->config();
  MLA_CHECK_ARG(pc.max_requests >= config.pool_rows(),
                "scheduler: pool has {} request rows, the scheduler needs max_running_requests + "
                "max_prefix_entries = {}",
                pc.max_requests, config.pool_rows());
  const int max_draft = pool->batch_limits().max_draft_tokens;
  MLA_CHECK_ARG(config.speculative_tokens <= max_draft,
                "scheduler.speculative_tokens = {} exceeds max_draft_tokens = {}",
                config.speculative_tokens, max_draft);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    MLA_CHECK_ARG(requests[i].id == static_cast<int>(i), "request ids must be 0..n-1: [{}].id = {}",
                  i, requests[i].id);
    MLA_CHECK_ARG(i == 0 || requests[i - 1].arrival_step <= requests[i].arrival_step,
                  "requests must be sorted by arrival_step: [{}] = {} after [{}] = {}", i,
                  requests[i].arrival_step, i - 1, requests[i - 1].arrival_step);
    MLA_RETURN_IF_ERROR(
        validate_request(requests[i], pc.max_context_len, config.speculative_tokens));
    const int64_t peak = static_cast<int64_t>(requests[i].prompt_len) + requests[i].output_len - 1 +
                         config.speculative_tokens;
    const int64_t need = (peak + pc.page_size - 1) / pc.page_size;
    MLA_CHECK_ARG(need <= pc.num_pages,
                  "{} needs {} pages of {} tokens at its peak length {}, the pool has {} "
                  "(--pool-tokens)",
                  request_name(requests[i]), need, pc.page_size, peak, pc.num_pages);
  }
  return std::unique_ptr<Scheduler>(new Scheduler(pool, config, std::move(requests)));
}

int64_t Scheduler::pages(int64_t tokens) const {
  const int p = pool_->config().page_size;
  return (tokens + p - 1) / p;
}

int64_t Scheduler::step_growth_pages() const {
  const int n = config_.speculative_tokens > 0 ? config_.speculative_tokens : 1;
  int64_t total = 0;
  for (const Running& r : running_) {
    const int64_t end = r.prefilled < r.target ? r.target : static_cast<int64_t>(r.len) + n;
    total += std::max<int64_t>(0, pages(end) - pages(r.len));
  }
  return total;
}

Status Scheduler::preempt(std::size_t running_index) {
  const Running run = running_[running_index];
  MLA_RETURN_IF_ERROR(pool_->free_request(run.row));
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(running_index));
  waiting_.push_front(run.id);
  RequestEvents& e = events_[static_cast<std::size_t>(run.id)];
  if (e.preemptions++ == 0) ++stats_.preempted_requests;
  ++stats_.preemptions;
  stats_.preempted_tokens += run.len;
  return Status::Ok();
}

Status Scheduler::make_room() {
  while (pool_->free_pages() < step_growth_pages()) {
    bool evicted = false;
    MLA_RETURN_IF_ERROR(evict_one(-1, &evicted));
    if (evicted) continue;
    if (running_.size() <= 1) {
      // create() checked that every request fits the pool alone at its peak length.
      return internal_error("scheduler: request {} alone needs {} more pages, {} free",
                            running_.empty() ? -1 : running_[0].id, step_growth_pages(),
                            pool_->free_pages());
    }
    MLA_RETURN_IF_ERROR(preempt(running_.size() - 1));  // the most recently admitted
  }
  return Status::Ok();
}

int32_t Scheduler::aligned_prefix(const RequestSpec& r) const {
  if (r.prefix_group == 0) return 0;
  const int p = pool_->config().page_size;
  return r.prefix_len / p * p;
}

bool Scheduler::done() const {
  return next_arrival_ == requests_.size() && waiting_.empty() && running_.empty() &&
         draft_pending_.empty();
}

Status Scheduler::evict_one(int keep_group, bool* evicted) {
  *evicted = false;
  auto victim = prefix_cache_.end();
  for (auto it = prefix_cache_.begin(); it != prefix_cache_.end(); ++it) {
    if (it->first == keep_group) continue;
    if (victim == prefix_cache_.end() || it->second.last_use < victim->second.last_use) {
      victim = it;
    }
  }
  if (victim == prefix_cache_.end()) return Status::Ok();
  MLA_RETURN_IF_ERROR(pool_->free_request(victim->second.row));
  prefix_cache_.erase(victim);
  ++stats_.prefix_evictions;
  *evicted = true;
  return Status::Ok();
}

Status Scheduler::try_admit(const RequestSpec& r, bool* admitted) {
  *admitted = false;
  if (static_cast<int>(running_.size()) >= config_.max_running_requests) return Status::Ok();
  // What is known at admission: the prompt, plus the tokens generated before a preemption.
  const int32_t gen = generated_[static_cast<std::size_t>(r.id)];
  const int32_t target = r.prompt_len + gen;
  const int page_size = pool_->config().page_size;
  int keep_group = r.prefix_group > 0 ? r.prefix_group : -1;
  for (;;) {
    int32_t hit = 0;
    if (auto it = prefix_cache_.find(r.prefix_group);
        r.prefix_group > 0 && it != prefix_cache_.end()) {
      hit = std::min(it->second.len, aligned_prefix(r));
    }
    const int64_t need = pages(target) - hit / page_size;
    if (pool_->free_pages() - step_growth_pages() >= need) {
      MLA_ASSIGN_OR_RETURN(const int row, pool_->alloc_request());
      if (hit > 0) {
        PrefixEntry& e = prefix_cache_.at(r.prefix_group);
        MLA_RETURN_IF_ERROR(pool_->share_prefix(e.row, row, hit));
        e.last_use = clock_;
        ++stats_.prefix_hits;
        stats_.prefix_hit_tokens += hit;
      }
      running_.push_back(Running{r.id, row, hit, hit, target, gen > 0});
      RequestEvents& e = events_[static_cast<std::size_t>(r.id)];
      if (e.scheduled < 0) e.scheduled = step_index_;
      *admitted = true;
      return Status::Ok();
    }
    bool evicted = false;
    MLA_RETURN_IF_ERROR(evict_one(keep_group, &evicted));
    if (evicted) continue;
    if (!running_.empty()) return Status::Ok();  // wait for running requests to finish
    if (keep_group != -1 && !prefix_cache_.empty()) {
      keep_group = -1;  // nothing else holds pages: drop the request's own cached prefix too
      continue;
    }
    return make_status(StatusCode::kOutOfMemory,
                       "request {} needs {} pages and the idle pool has {} free", r.id, need,
                       pool_->free_pages());
  }
}

Status Scheduler::add_prefill_chunk(Running& run, int64_t* budget, Step* step) {
  const int32_t n = static_cast<int32_t>(std::min<int64_t>(run.target - run.prefilled, *budget));
  if (n <= 0) return Status::Ok();
  std::vector<int32_t> slots;
  MLA_RETURN_IF_ERROR(pool_->extend_request(run.row, run.len + n, &slots));
  ForwardBatch& b = step->batch;
  b.req_pool_indices.push_back(run.row);
  b.extend_prefix_lens.push_back(run.len);
  b.extend_seq_lens.push_back(n);
  b.seq_lens.push_back(run.len + n);
  b.out_cache_loc.insert(b.out_cache_loc.end(), slots.begin(), slots.end());
  step->request_ids.push_back(run.id);
  ++step->num_prefill;
  if (run.recompute) {
    ++step->num_recompute;
    stats_.recompute_tokens += n;
  }
  run.len += n;
  run.prefilled += n;
  if (run.prefilled < run.target) ++stats_.prefill_chunks;
  *budget -= n;
  return Status::Ok();
}

Status Scheduler::add_decode(Running& run, Step* step) {
  const int n = step->batch.mode == ForwardMode::kTargetVerify ? config_.speculative_tokens : 1;
  std::vector<int32_t> slots;
  MLA_RETURN_IF_ERROR(pool_->extend_request(run.row, run.len + n, &slots));
  ForwardBatch& b = step->batch;
  b.req_pool_indices.push_back(run.row);
  if (b.mode == ForwardMode::kTargetVerify) {
    b.seq_lens.push_back(run.len);  // excludes the drafts; run.len stays the committed length
  } else {
    b.seq_lens.push_back(run.len + 1);
    if (b.mode == ForwardMode::kMixed) {
      b.extend_prefix_lens.push_back(run.len);
      b.extend_seq_lens.push_back(1);
    }
    run.len += 1;
  }
  b.out_cache_loc.insert(b.out_cache_loc.end(), slots.begin(), slots.end());
  step->request_ids.push_back(run.id);
  return Status::Ok();
}

void Scheduler::record(const Step& step) {
  ++stats_.steps;
  ++stats_.batches[step.batch.mode];
  stats_.tokens[step.batch.mode] += step.batch.num_tokens();
  stats_.max_batch_size = std::max(stats_.max_batch_size, step.batch.batch_size);
  stats_.peak_used_pages =
      std::max(stats_.peak_used_pages, pool_->config().num_pages - pool_->free_pages());
}

StatusOr<Step> Scheduler::next_step() {
  MLA_CHECK_ARG(!done(), "scheduler: next_step() after every request finished");
  Step step;
  step.index = step_index_;
  ForwardBatch& b = step.batch;

  if (!draft_pending_.empty()) {  // the draft model catches up on the accepted tokens
    step.clock = clock_ - 1;
    b.mode = ForwardMode::kDraftExtend;
    for (int id : draft_pending_) {
      auto it = std::find_if(running_.begin(), running_.end(),
                             [id](const Running& r) { return r.id == id; });
      if (it == running_.end()) return internal_error("draft request {} is not running", id);
      const int32_t prefix = draft_prefix_.at(id);
      b.req_pool_indices.push_back(it->row);
      b.extend_prefix_lens.push_back(prefix);
      b.extend_seq_lens.push_back(it->len - prefix);
      b.seq_lens.push_back(it->len);
      for (int32_t t = prefix; t < it->len; ++t) b.out_cache_loc.push_back(pool_->slot(it->row, t));
      step.request_ids.push_back(id);
    }
    draft_pending_.clear();
    draft_prefix_.clear();
    b.batch_size = static_cast<int>(step.request_ids.size());
    finalize_batch(b);
    ++step_index_;
    record(step);
    return step;
  }

  if (running_.empty() && waiting_.empty() && next_arrival_ < requests_.size()) {
    clock_ = std::max(clock_, requests_[next_arrival_].arrival_step);  // idle until the next one
  }
  while (next_arrival_ < requests_.size() && requests_[next_arrival_].arrival_step <= clock_) {
    events_[static_cast<std::size_t>(next_arrival_)].arrived = step_index_;
    waiting_.push_back(requests_[next_arrival_++].id);
  }
  step.clock = clock_;
  MLA_RETURN_IF_ERROR(make_room());

  std::vector<std::size_t> decoders;
  for (std::size_t i = 0; i < running_.size(); ++i) {
    if (running_[i].prefilled == running_[i].target) decoders.push_back(i);
  }
  const bool speculative = config_.speculative_tokens > 0;
  const bool mix = config_.enable_mixed && !speculative && !decoders.empty();
  int64_t budget = config_.max_batch_tokens - (mix ? static_cast<int64_t>(decoders.size()) : 0);

  b.mode = ForwardMode::kExtend;
  const std::size_t already_running = running_.size();
  for (std::size_t i = 0; i < already_running && budget > 0; ++i) {
    if (running_[i].prefilled < running_[i].target) {
      MLA_RETURN_IF_ERROR(add_prefill_chunk(running_[i], &budget, &step));
    }
  }
  while (!waiting_.empty() && budget > 0) {
    bool admitted = false;
    MLA_RETURN_IF_ERROR(
        try_admit(requests_[static_cast<std::size_t>(waiting_.front())], &admitted));
    if (!admitted) break;
    waiting_.pop_front();
    MLA_RETURN_IF_ERROR(add_prefill_chunk(running_.back(), &budget, &step));
  }

  if (step.num_prefill > 0) {
    if (mix) {
      b.mode = ForwardMode::kMixed;
      for (std::size_t i : decoders) MLA_RETURN_IF_ERROR(add_decode(running_[i], &step));
    }
  } else if (!decoders.empty()) {
    b.mode = speculative ? ForwardMode::kTargetVerify : ForwardMode::kDecode;
    b.num_draft_tokens = speculative ? config_.speculative_tokens : 0;
    for (std::size_t i : decoders) MLA_RETURN_IF_ERROR(add_decode(running_[i], &step));
  } else {
    return internal_error("scheduler made no progress at step {} ({} waiting, {} running)", clock_,
                          waiting_.size(), running_.size());
  }
  b.batch_size = static_cast<int>(step.request_ids.size());
  finalize_batch(b);
  ++clock_;
  ++step_index_;
  record(step);
  return step;
}

Status Scheduler::maybe_cache_prefix(const Running& run) {
  const RequestSpec& r = requests_[static_cast<std::size_t>(run.id)];
  const int32_t aligned = aligned_prefix(r);
  if (aligned == 0 || run.prefilled < aligned || config_.max_prefix_entries == 0) {
    return Status::Ok();
  }
  if (auto it = prefix_cache_.find(r.prefix_group); it != prefix_cache_.end()) {
    it->second.last_use = clock_;
    return Status::Ok();
  }
  if (static_cast<int>(prefix_cache_.size()) >= config_.max_prefix_entries) {
    bool evicted = false;
    MLA_RETURN_IF_ERROR(evict_one(-1, &evicted));
  }
  MLA_ASSIGN_OR_RETURN(const int row, pool_->alloc_request());
  MLA_RETURN_IF_ERROR(pool_->share_prefix(run.row, row, aligned));
  prefix_cache_[r.prefix_group] = PrefixEntry{row, aligned, clock_};
  return Status::Ok();
}

Status Scheduler::finish(std::size_t running_index, int64_t step_index) {
  events_[static_cast<std::size_t>(running_[running_index].id)].finished = step_index;
  MLA_RETURN_IF_ERROR(pool_->free_request(running_[running_index].row));
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(running_index));
  ++stats_.finished;
  return Status::Ok();
}

Status Scheduler::complete_step(const Step& step) {
  MLA_CHECK_ARG(step.index == step_index_ - 1,
                "scheduler: complete_step({}) but the last step issued is {}", step.index,
                step_index_ - 1);
  const ForwardMode mode = step.batch.mode;
  if (mode == ForwardMode::kDraftExtend) return Status::Ok();
  for (std::size_t b = 0; b < step.request_ids.size(); ++b) {
    const int id = step.request_ids[b];
    auto it = std::find_if(running_.begin(), running_.end(),
                           [id](const Running& r) { return r.id == id; });
    if (it == running_.end())
      return internal_error("request {} of step {} is not running", id, step.index);
    const RequestSpec& r = requests_[static_cast<std::size_t>(id)];
    int32_t& gen = generated_[static_cast<std::size_t>(id)];
    const bool prefill = (mode == ForwardMode::kExtend) ||
                         (mode == ForwardMode::kMixed && static_cast<int>(b) < step.num_prefill);
    if (prefill) {
      MLA_RETURN_IF_ERROR(maybe_cache_prefix(*it));
      int32_t& done = prompt_done_[static_cast<std::size_t>(id)];
      const int32_t now = std::min(it->prefilled, r.prompt_len);
      if (now > done) {
        progress_tokens_ += now - done;
        done = now;
      }
      if (it->prefilled < it->target) continue;
      // The prefill's last position yields the next output token: the first one, or after a
      // re-prefill of prompt + generated tokens, the one the preemption interrupted.
      gen += 1;
      ++progress_tokens_;
      it->recompute = false;
      RequestEvents& e = events_[static_cast<std::size_t>(id)];
      if (e.first_token < 0) e.first_token = step.index;
    } else if (mode == ForwardMode::kTargetVerify) {
      const int n = config_.speculative_tokens;
      const int32_t accept =
          std::min<int32_t>(std::uniform_int_distribution<int32_t>(1, n)(rng_), r.output_len - gen);
      stats_.drafts_proposed += n;
      stats_.drafts_accepted += accept;
      draft_prefix_[id] = it->len;
      it->len += accept;
      MLA_RETURN_IF_ERROR(pool_->truncate_request(it->row, it->len));
      gen += accept;
      progress_tokens_ += accept;
      if (gen < r.output_len) draft_pending_.push_back(id);
    } else {
      gen += 1;
      ++progress_tokens_;
    }
    if (gen >= r.output_len) {
      MLA_RETURN_IF_ERROR(finish(static_cast<std::size_t>(it - running_.begin()), step.index));
    }
  }
  return Status::Ok();
}

Status Scheduler::release_all() {
  Status first;
  for (const Running& r : running_) {
    Status s = pool_->free_request(r.row);
    if (first.ok() && !s.ok()) first = s;
  }
  running_.clear();
  for (const auto& [group, e] : prefix_cache_) {
    Status s = pool_->free_request(e.row);
    if (first.ok() && !s.ok()) first = s;
  }
  prefix_cache_.clear();
  draft_pending_.clear();
  draft_prefix_.clear();
  return first;
}

}  // namespace mla::sim
