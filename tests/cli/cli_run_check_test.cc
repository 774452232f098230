// `mla run --check` on the batches that matter, each from a trace built here: the skewed 32-entry
// extend whose chunk plan has 31 empty rows, page boundaries, 300 concurrent decodes and long
// prefixes (20480 and more: label slow). Each run must pass the check, and the report must show
// that the batch in question was checked (per request and row, KV slots against the model).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "spawn.h"

namespace {

using nlohmann::json;

class RunCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "mla_run_check_" + std::to_string(getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string trace(const std::vector<std::string>& lines) {
    const std::string path = dir_ + "/trace.jsonl";
    std::ofstream out(path);
    for (const std::string& l : lines) out << l << "\n";
    return path;
  }

  // Runs `mla run --check --json` with `args`; returns the JSON report's "check" object.
  json run_check(std::vector<std::string> args, bool expect_pass = true) {
    args.insert(args.begin(), "run");
    for (const char* a : {"--check", "--json", "--layers", "1"}) args.push_back(a);
    const mla_cli_test::Outcome o = mla_cli_test::run_cli(args, dir_, 600);
    EXPECT_FALSE(o.signaled || o.timed_out);
    EXPECT_EQ(o.code, expect_pass ? 0 : 1) << o.err;
    json j = json::parse(o.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << o.out << o.err;
    if (j.is_discarded() || !j.contains("check")) return json::object();
    last_ = j;
    const json& c = j["check"];
    EXPECT_EQ(c["passed"].get<bool>(), expect_pass) << c.dump(1);
    EXPECT_EQ(c["kinds_checked"], c["kinds_present"]);
    EXPECT_EQ(c["kv_mismatches"].get<int64_t>(), 0);
    EXPECT_GT(c["kv_slots_checked"].get<int64_t>(), 0);
    return c;
  }

  static std::string line(int arrival, int prompt, int output, int group = 0, int prefix = 0) {
    json l{{"arrival_step", arrival}, {"prompt_len", prompt}, {"output_len", output}};
    if (group) {
      l["prefix_group"] = group;
      l["prefix_len"] = prefix;
    }
    return l.dump();
  }

  std::string dir_;
  json last_;  // the whole report of the last run_check
};

// One request prefilled in chunks of 1024; at its third chunk (prefix 2048) 31 short requests
// join the same EXTEND: a batch of 32 entries where 31 have no prefix (31 empty chunk rows).
TEST_F(RunCheck, SkewedExtendWith31EmptyChunkRows) {
  std::vector<std::string> lines{line(0, 1024 + 1024 + 700, 3)};
  for (int i = 0; i < 31; ++i) lines.push_back(line(2, 8, 3));
  for (const char* backend : {"chunked_mla", "paged_mla"}) {
    const json c = run_check({"--trace", trace(lines), "--backend", backend, "--max-running", "32",
                              "--max-batch-tokens", "1024"});
    bool seen = false;
    for (const json& s : c["checks"]) {
      if (s["batch_size"] == 32 && s["max_prefix"] == 2048) {
        seen = true;
        EXPECT_EQ(s["requests_checked"], 32) << s.dump();
        EXPECT_EQ(s["kv_slots_checked"], 2748 + 31 * 8) << s.dump();
      }
    }
    EXPECT_TRUE(seen) << backend << ": the skewed batch was not checked\n" << c.dump(1);
  }
}

// Prompts and prefixes on both sides of page boundaries (page size 16), over every backend.
TEST_F(RunCheck, PageBoundaries) {
  std::vector<std::string> lines;
  int arrival = 0;
  for (int prompt : {15, 16, 17, 31, 32, 33}) lines.push_back(line(arrival++, prompt, 17));
  for (int prefix : {15, 16, 17, 32}) {
    lines.push_back(line(arrival++, prefix + 1, 16, prefix, prefix));
    lines.push_back(line(arrival + 8, prefix + 16, 2, prefix, prefix));  // a cache hit
  }
  std::sort(lines.begin(), lines.end());  // arrival order is the file's business: any order
  for (const char* backend : {"paged_mla", "chunked_mla", "ondemand_mla"}) {
    const json c = run_check({"--trace", trace(lines), "--backend", backend, "--page-size", "16"});
    EXPECT_GT(c["steps_checked"].get<int64_t>(), 3) << backend;
  }
}

// 300 requests decoding together, plain and through the graph-replay metadata path.
TEST_F(RunCheck, ThreeHundredConcurrentDecodes) {
  std::vector<std::string> lines;
  for (int i = 0; i < 300; ++i) lines.push_back(line(0, 8 + i % 24, 4));
  for (bool graph : {false, true}) {
    std::vector<std::string> args{"--trace",   trace(lines),         "--max-running",
                                  "300",       "--max-batch-tokens", "8192",
                                  "--backend", "chunked_mla"};
    if (graph) args.push_back("--cuda-graph");
    const json c = run_check(args);
    bool seen = false;
    for (const json& s : c["checks"]) {
      if (s["mode"] == "decode" && s["batch_size"] == 300) {
        seen = true;
        EXPECT_EQ(s["requests_checked"], 300) << s.dump();
      }
    }
    EXPECT_TRUE(seen) << "no 300-request decode was checked\n" << c.dump(1);
  }
}

// Eight requests whose prompts fit the pool together but whose outputs do not: the scheduler
// preempts (admission does not know output lengths), the victims re-prefill prompt + generated
// tokens, and --check checks a re-prefill and a later decode of a preempted request. The
// serving metrics cover every request.
TEST_F(RunCheck, PreemptedRequestsAreChecked) {
  std::vector<std::string> lines;
  for (int i = 0; i < 8; ++i) lines.push_back(line(0, 100, 60));
  const json c = run_check({"--trace", trace(lines), "--page-size", "16", "--pool-tokens", "1024",
                            "--max-batch-tokens", "1024"});
  EXPECT_GE(c["recompute_steps_checked"].get<int64_t>(), 1) << c.dump(1);
  EXPECT_GE(c["preempted_decode_steps_checked"].get<int64_t>(), 1) << c.dump(1);
  const json& m = last_["serving"];
  EXPECT_GT(m["kv_pool"]["preemptions"].get<int64_t>(), 0) << m.dump(1);
  EXPECT_EQ(m["kv_pool"]["capacity_tokens"], 1024);
  EXPECT_LE(m["kv_pool"]["peak_utilisation"].get<double>(), 1.0);
  EXPECT_EQ(m["throughput"]["output_tokens"], 8 * 60);
  EXPECT_GT(m["throughput"]["recompute_tokens"].get<int64_t>(), 0);
  EXPECT_EQ(last_["scheduler"]["finished"], 8);
  for (const char* k : {"queue", "ttft", "tpot", "e2e"}) {
    const json& p = m["latency_seconds"][k];
    EXPECT_EQ(p["count"], 8) << k;
    EXPECT_LE(p["p50"].get<double>(), p["p90"].get<double>()) << k;
    EXPECT_LE(p["p90"].get<double>(), p["p99"].get<double>()) << k;
    EXPECT_GE(p["p50"].get<double>(), 0.0) << k;
  }
  EXPECT_GE(m["latency_seconds"]["e2e"]["p50"].get<double>(),
            m["latency_seconds"]["ttft"]["p50"].get<double>());
  EXPECT_GT(m["latency_seconds"]["tpot"]["p50"].get<double>(), 0.0);
  // The timeline is the per-mode seconds back to back.
  double modes = 0.0;
  for (const auto& [mode, sec] : last_["seconds"].items()) modes += sec.get<double>();
  EXPECT_NEAR(m["seconds"].get<double>(), modes, 1e-6 * std::max(1.0, modes));
  EXPECT_TRUE(m["planning_us_by_mode"].contains("decode")) << m.dump(1);
  const json& rep = last_["reproduce"];
  for (const char* k : {"version", "commit", "seed", "limits", "flags"}) {
    EXPECT_TRUE(rep.contains(k)) << k;
  }
}

// The check can fail: a tolerance no bf16 output meets.
TEST_F(RunCheck, ImpossibleToleranceFails) {
  const json c = run_check({"--requests", "3", "--check-tolerance", "1e-9"}, false);
  EXPECT_GT(c["max_rel_err"].get<double>(), 1e-9);
}

// Every extend with a prefix is checked, the largest included, in a prefix cache hit of 20480
// tokens and a chunked continuation past it; references sampled by rows, never skipped.
TEST_F(RunCheck, Prefix20480AndMore) {
  const std::vector<std::string> lines{line(0, 20480 + 64, 2, 1, 20480),
                                       line(40, 20480 + 3000, 2, 1, 20480)};
  for (const char* backend : {"chunked_mla", "paged_mla"}) {
    const json c = run_check({"--trace", trace(lines), "--backend", backend, "--max-context-len",
                              "32768", "--max-batch-tokens", "2048", "--max-running", "2"});
    int32_t largest = 0;
    for (const json& s : c["checks"]) largest = std::max(largest, s["max_prefix"].get<int32_t>());
    EXPECT_GE(largest, 20480 + 2048) << backend << "\n" << c.dump(1);
  }
}

}  // namespace
