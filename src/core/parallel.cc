#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace mla {
namespace {

// One parallel_for call. Chunks are claimed through `next`; `remaining` counts unfinished ones.
// Worker ids are handed out per job from `next_worker` (the caller takes 0).
struct Job {
  const std::function<void(int64_t, int64_t, int)>* fn = nullptr;
  int64_t begin = 0, end = 0, grain = 1;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> remaining{0};
  std::atomic<int> next_worker{1};
  std::mutex mu;
  std::condition_variable done;
};

// Worker id of the chunk this thread is executing, -1 outside parallel work.
thread_local int t_worker = -1;

class ThreadPool {
 public:
  explicit ThreadPool(int threads) : threads_(threads) {
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  // Never destroyed (see global()); workers block on the queue until the process exits.
  int threads() const { return threads_; }

  void run(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(job);
    }
    cv_.notify_all();
    execute(*job, 0);
    std::unique_lock<std::mutex> lock(job->mu);
    job->done.wait(lock, [&] { return job->remaining.load() == 0; });
    lock.unlock();
    std::lock_guard<std::mutex> qlock(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it != queue_.end()) queue_.erase(it);
  }

 private:
  // Claims and runs chunks of `job` until none are left.
  static void execute(Job& job, int worker) {
    t_worker = worker;
    for (;;) {
      const int64_t b = job.begin + job.next.fetch_add(1) * job.grain;
      if (b >= job.end) break;
      const int64_t e = std::min(job.end, b + job.grain);
      (*job.fn)(b, e, worker);
      if (job.remaining.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lock(job.mu);
        job.done.notify_all();
      }
    }
    t_worker = -1;
  }

  void worker_loop() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        job = queue_.front();
        // Fully claimed jobs leave the queue so idle workers do not spin on them.
        if (job->begin + job->next.load() * job->grain >= job->end) {
          queue_.pop_front();
          continue;
        }
      }
      const int worker = job->next_worker.fetch_add(1);
      if (worker >= threads_) {  // more claimants than ids: leave the rest to the others
        std::this_thread::yield();
        continue;
      }
      execute(*job, worker);
    }
  }

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
};

int configured_threads() {
  if (const char* s = std::getenv("MLA_NUM_THREADS"); s != nullptr && *s != '\0') {
    const int n = std::atoi(s);
    if (n >= 1) return std::min(n, 1024);
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

ThreadPool& pool() {
  static ThreadPool* p = new ThreadPool(configured_threads());  // intentionally never destroyed
  return *p;
}

}  // namespace

int parallel_num_threads() { return pool().threads(); }

void parallel_for_chunks(int64_t begin, int64_t end, int64_t grain,
                         const std::function<void(int64_t, int64_t, int)>& fn) {
  if (end <= begin) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = (end - begin + grain - 1) / grain;
  if (t_worker >= 0) {  // nested inside a chunk: run inline with the enclosing worker's id
    for (int64_t b = begin; b < end; b += grain) fn(b, std::min(end, b + grain), t_worker);
    return;
  }
  if (chunks == 1 || pool().threads() == 1) {
    t_worker = 0;
    for (int64_t b = begin; b < end; b += grain) fn(b, std::min(end, b + grain), 0);
    t_worker = -1;
    return;
  }
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->begin = begin;
  job->end = end;
  job->grain = grain;
  job->remaining = chunks;
  pool().run(job);
}

void parallel_for(int64_t begin, int64_t end, const std::function<void(int64_t)>& fn) {
  parallel_for_chunks(begin, end, 1, [&fn](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) fn(i);
  });
}

}  // namespace mla
