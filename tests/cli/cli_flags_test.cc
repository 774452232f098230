// Every flag of every `mla` subcommand, walked through hostile values: 0, -1, the maxima of
// int32 / int64 / uint64, a huge float, NaN and a non-number. The CLI binary is spawned (its path
// comes from CMake as MLA_CLI_PATH) and must never die on a signal or hang; when it rejects a
// value its error names the flag and quotes the value as the user wrote it. The flags are read
// from `mla <sub> --help`, so a flag added later is walked without editing this file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "spawn.h"

namespace {

using mla_cli_test::Outcome;
using mla_cli_test::run_cli;

struct Flag {
  std::string name;
  bool takes_value = false;
};

// Options of `mla <sub> --help`: "  --name TYPE..." takes a value, "  --name   text" does not.
std::vector<Flag> flags_of(const std::string& sub, const std::string& dir) {
  const Outcome help = run_cli({sub, "--help"}, dir, 30);
  EXPECT_EQ(help.code, 0) << help.err;
  std::vector<Flag> flags;
  const std::regex line(R"(^\s+(?:-\w,)?(--[a-z0-9-]+)(\s[A-Z]+)?)");
  std::istringstream in(help.out);
  std::string l;
  while (std::getline(in, l)) {
    std::smatch m;
    if (!std::regex_search(l, m, line)) continue;
    if (m[1] == "--help") continue;
    flags.push_back(Flag{m[1], m[2].matched});
  }
  return flags;
}

// Arguments that make a subcommand quick when a walked value happens to be valid.
std::vector<std::string> base_args(const std::string& sub) {
  if (sub == "run") {
    return {"--requests", "2", "--layers", "1", "--no-progress", "--max-context-len", "1024"};
  }
  if (sub == "check") return {"--device", "cpu"};
  return {};
}

const char* const kValues[] = {"0",
                               "-1",
                               "2147483647",
                               "9223372036854775807",
                               "18446744073709551615",
                               "99999999999999999999999",
                               "1e308",
                               "nan",
                               "abc"};

TEST(CliFlags, EveryFlagOfEverySubcommandFailsCleanlyOnHostileValues) {
  const std::string dir = ::testing::TempDir() + "mla_cli_flags_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  int walked = 0;
  for (const std::string sub : {"info", "check", "run", "plan", "bench"}) {
    const std::vector<Flag> flags = flags_of(sub, dir);
    ASSERT_FALSE(flags.empty()) << "no flags parsed from `mla " << sub << " --help`";
    for (const Flag& f : flags) {
      if (!f.takes_value) continue;
      // The base arguments without the walked flag (an option may be given once).
      std::vector<std::string> base = base_args(sub);
      for (std::size_t i = 0; i + 1 < base.size(); ++i) {
        if (base[i] == f.name) base.erase(base.begin() + i, base.begin() + i + 2);
      }
      for (const char* value : kValues) {
        std::vector<std::string> args{sub};
        args.insert(args.end(), base.begin(), base.end());
        args.push_back(f.name);
        args.push_back(value);
        const Outcome o = run_cli(args, dir, 120);
        std::string cmd = "mla";
        for (const std::string& a : args) cmd += " " + a;
        ++walked;
        ASSERT_FALSE(o.signaled) << cmd << " died on signal " << o.signal << "\n" << o.err;
        ASSERT_FALSE(o.timed_out) << cmd << " did not finish";
        if (o.code == 0) continue;  // a valid value: the command ran
        // `mla bench` times the GPU only; a build without CUDA refuses every value alike.
        if (sub == "bench" && o.err.find("this build has no CUDA") != std::string::npos) continue;
        EXPECT_NE(o.err.find(f.name), std::string::npos)
            << cmd << " failed without naming " << f.name << ":\n"
            << o.err;
        if (value[0] != '-') {
          EXPECT_NE(o.err.find(value), std::string::npos)
              << cmd << ": the error does not quote the value as written:\n"
              << o.err;
        }
        EXPECT_EQ(o.err.find("check failed"), std::string::npos) << cmd << ":\n" << o.err;
      }
    }
  }
  EXPECT_GT(walked, 100);
  std::filesystem::remove_all(dir);
}

TEST(CliFlags, NumericFlagsRejectNonNumbersAndOverflowAsWritten) {
  const std::string dir = ::testing::TempDir() + "mla_cli_numeric_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  const Case cases[] = {
      {{"run", "--page-size", "0"}, "--page-size"},
      {{"plan", "--page-size", "0"}, "--page-size"},
      {{"run", "--requests", "0"}, "--requests"},
      {{"run", "--check-steps", "0"}, "--check-steps"},
      {{"run", "--check-tolerance", "0"}, "--check-tolerance"},
      {{"run", "--check-tolerance", "nan"}, "--check-tolerance"},
      {{"run", "--check-tolerance", "-1e-3"}, "--check-tolerance"},
      {{"run", "--seed", "-1"}, "--seed"},
      {{"run", "--seed", "18446744073709551616"}, "\"18446744073709551616\""},
      {{"run", "--pool-tokens", "18446744073709551615"}, "\"18446744073709551615\""},
      {{"run", "--layers", "010"}, ""},  // decimal 10, not octal 8: accepted as 10 layers
      {{"run", "--device", "cuda:99999999999"}, "\"cuda:99999999999\""},
      {{"run", "--model", "deepseek-v3", "--requests", "1", "--max-batch-tokens", "1000000"},
       "--max-batch-tokens"},
      {{"plan", "--mode", "bogus"}, "--mode"},
      {{"bench", "--ops", "decode,bogus"}, "--ops"},
      {{"bench", "--pages", "1,3"}, "--pages"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    if (c.expect.empty()) {  // accepted: keep the run short
      for (const char* a : {"--requests", "1", "--no-progress"}) args.push_back(a);
    }
    const Outcome o = run_cli(args, dir, 120);
    std::string cmd = "mla";
    for (const std::string& a : args) cmd += " " + a;
    ASSERT_FALSE(o.signaled) << cmd << " died on signal " << o.signal;
    ASSERT_FALSE(o.timed_out) << cmd;
    if (c.expect.empty()) {
      EXPECT_EQ(o.code, 0) << cmd << "\n" << o.err;
      EXPECT_NE(o.out.find("(10 layers)"), std::string::npos) << cmd << "\n" << o.out;
      continue;
    }
    EXPECT_NE(o.code, 0) << cmd;
    EXPECT_NE(o.err.find(c.expect), std::string::npos) << cmd << "\n" << o.err;
  }
  std::filesystem::remove_all(dir);
}

// Inputs that would make a command run nothing (or check nothing) are errors naming the file or
// flag, with a non-zero exit.
TEST(CliFlags, NothingRunsWithoutSayingSo) {
  const std::string dir = ::testing::TempDir() + "mla_cli_nothing_" + std::to_string(getpid());
  std::filesystem::create_directories(dir + "/a_directory");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name, std::ios::binary) << text;
    return dir + "/" + name;
  };
  const std::string empty = write("empty.jsonl", "");
  const std::string comments = write("comments.jsonl", "# nothing\n\n   # here\n");
  const std::string nul =
      write("nul.jsonl", std::string("{\"prompt_len\": 4, \"output_len\": 2}\n"
                                     "{\"prompt_len\": 4,\0 \"output_len\": 2}\n",
                                     72));
  const std::string late = write("late.jsonl",
                                 "{\"arrival_step\": 9, \"prompt_len\": 4, "
                                 "\"output_len\": 2}\n"
                                 "{\"prompt_len\": 4000, \"output_len\": 200}\n");
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> expect;
  };
  std::vector<Case> cases = {
      {{"run", "--trace", dir + "/a_directory"}, {"--trace", "a_directory", "is a directory"}},
      {{"run", "--trace", empty}, {"--trace", "empty.jsonl", "no request", "empty"}},
      {{"run", "--trace", comments}, {"--trace", "comments.jsonl", "no request", "comments"}},
      {{"run", "--trace", nul}, {"--trace", "nul.jsonl", "trace line 2", "NUL byte"}},
      // The error names the line of the file, not the request's id after sorting by arrival.
      {{"run", "--trace", late, "--max-context-len", "1024"},
       {"late.jsonl", "trace line 2", "--max-context-len"}},
      {{"run", "--requests", "0"}, {"--requests"}},
      {{"check", "--device", "cpu", "--filter", "no-such-case-anywhere"},
       {"--filter", "no-such-case-anywhere", "nothing was checked"}},
  };
#ifndef MLA_WITH_CUDA
  cases.push_back(
      {{"check", "--device", "cuda"}, {"--device cuda", "no CUDA", "nothing was checked"}});
#endif
  for (const Case& c : cases) {
    const Outcome o = run_cli(c.args, dir, 120);
    std::string cmd = "mla";
    for (const std::string& a : c.args) cmd += " " + a;
    ASSERT_FALSE(o.signaled) << cmd;
    ASSERT_FALSE(o.timed_out) << cmd;
    EXPECT_NE(o.code, 0) << cmd << "\n" << o.out;
    for (const std::string& e : c.expect) {
      EXPECT_NE(o.err.find(e), std::string::npos) << cmd << ": no \"" << e << "\" in\n" << o.err;
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(CliFlags, VersionPrintsTheVersion) {
  const std::string dir = ::testing::TempDir();
  const Outcome o = run_cli({"--version"}, dir, 30);
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("mla 0."), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("commit "), std::string::npos) << o.out;
}

}  // namespace
