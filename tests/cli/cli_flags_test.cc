// Every flag of every `mla` subcommand, walked through hostile values: 0, -1, the maxima of
// int32 / int64 / uint64, a huge float, NaN and a non-number. The CLI binary is spawned (its path
// comes from CMake as MLA_CLI_PATH) and must never die on a signal or hang; when it rejects a
// value its error names the flag and quotes the value as the user wrote it. The flags are read
// from `mla <sub> --help`, so a flag added later is walked without editing this file.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef MLA_CLI_PATH
#error "MLA_CLI_PATH must name the mla binary"
#endif

namespace {

struct Outcome {
  bool signaled = false;
  int signal = 0;
  bool timed_out = false;
  int code = -1;
  std::string out, err;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs the CLI with `args` in `dir`, stdout and stderr captured, killed after `timeout_s`.
Outcome run_cli(const std::vector<std::string>& args, const std::string& dir, int timeout_s) {
  const std::string out_path = dir + "/stdout.txt", err_path = dir + "/stderr.txt";
  const pid_t pid = fork();
  if (pid == 0) {
    if (chdir(dir.c_str()) != 0) _exit(127);
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0) _exit(127);
    dup2(out, 1);
    dup2(err, 2);
    std::vector<char*> argv;
    std::string exe = MLA_CLI_PATH;
    argv.push_back(exe.data());
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  Outcome o;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      o.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!o.timed_out && WIFSIGNALED(status)) {
    o.signaled = true;
    o.signal = WTERMSIG(status);
  } else if (!o.timed_out) {
    o.code = WEXITSTATUS(status);
  }
  o.out = read_file(out_path);
  o.err = read_file(err_path);
  return o;
}

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
            << cmd << " failed without naming " << f.name << ":\n" << o.err;
        if (value[0] != '-') {
          EXPECT_NE(o.err.find(value), std::string::npos)
              << cmd << ": the error does not quote the value as written:\n" << o.err;
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
  const std::string nul = write("nul.jsonl", std::string("{\"prompt_len\": 4, \"output_len\": 2}\n"
                                                         "{\"prompt_len\": 4,\0 \"output_len\": 2}\n",
                                                         72));
  const std::string late = write("late.jsonl", "{\"arrival_step\": 9, \"prompt_len\": 4, "
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
  cases.push_back({{"check", "--device", "cuda"}, {"--device cuda", "no CUDA", "nothing was checked"}});
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
