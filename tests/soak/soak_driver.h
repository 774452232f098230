// The soak's serving loop (issue 13 item 5): 10,000 requests of a long seeded workload through
// the loop that `mla run` drives (lib/sim: the workload generator, the scheduler with chunked
// prefill, mixed batches, prefix sharing and speculative verify/draft-extend; graph-state
// capture and replay of decode and verify on the target), on one device's pool, backend and
// layers, with sampled reference checks of the layer output. Run on the cpu by
// tests/soak/soak_test.cc and on cuda by tests/gpu/soak_gpu_test.cc; expect_soak_clean states
// what must hold at the end:
//   - every KV page is free again (zero leaked pages) and every request row can be allocated;
//   - once the pool, the backends and the layers are gone, the ledger is back at its baseline;
//   - the heap in use did not grow after warm-up (live heap bytes: the sanitizer allocator's
//     count under ASan, glibc's mallinfo2 otherwise), nor (when asked) anonymous resident memory
//     (RssAnon: what the process allocated, by malloc, mmap or the CUDA driver; file-backed
//     resident pages, such as the parts of libcublasLt's kernel images read when a new GEMM
//     shape first runs, are reported but not a leak). When resident memory grew, the mappings
//     that grew most are printed (/proc/self/smaps between a sample taken in the warm-up and
//     the last).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "mla/types.h"

// MLA_SOAK_ASAN: built with AddressSanitizer (gcc or clang).
#if defined(__SANITIZE_ADDRESS__)
#define MLA_SOAK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MLA_SOAK_ASAN 1
#endif
#endif

namespace mla::testing {

// Layers on one step in layer_every (the KV cache is written on every step); a reference check
// on one layer step in check_every; the reference of one check costs at most check_budget
// multiply-adds (rows, then heads sampled).
struct SoakConfig {
  int layer_every = 1;
  int check_every = 128;
  double check_budget = 2e8;
};

struct SoakResult {
  int64_t requests = 0, steps = 0, layer_steps = 0, checks = 0;
  double max_rel_err = 0;
  int64_t leaked_pages = -1;
  int free_rows = 0;
  std::vector<std::size_t> heap, rss, rss_file;  // sampled every kSampleEvery steps
  // /proc/self/smaps resident bytes per mapping name ("[anon]" for unnamed ones), taken at the
  // samples numbered by powers of two, at the last and at each new peak of anonymous resident
  // memory after the first 16 (the last such is peak_sample): where resident memory grew.
  std::map<std::size_t, std::map<std::string, std::size_t>> smaps;
  std::size_t peak_sample = 0;  // the sample of the most anonymous resident memory (in smaps)
  std::map<std::string, int64_t> batches;
  std::set<std::string> check_modes;  // batch modes a reference check ran on
  int64_t graph_replays = 0, prefix_hits = 0, drafts = 0;
};

struct LedgerState {
  std::size_t records = 0, bytes = 0;
  bool operator==(const LedgerState&) const = default;
};
LedgerState ledger_state();

// Runs the soak of `num_requests` requests on `device` (gtest assertions inside).
void soak(const std::string& backend_name, Device device, int num_requests,
          const SoakConfig& config, SoakResult* out);

// The end-of-run checks (gtest expectations), then one summary line on stdout. check_rss: also
// resident memory after warm-up.
void expect_soak_clean(const std::string& what, const SoakResult& r, int num_requests,
                       bool check_rss, double seconds);

}  // namespace mla::testing
