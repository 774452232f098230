// Spawning the `mla` binary from a test: exit status, signal, timeout, captured output.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef MLA_CLI_PATH
#error "MLA_CLI_PATH must name the mla binary"
#endif

namespace mla_cli_test {

struct Outcome {
  bool signaled = false;
  int signal = 0;
  bool timed_out = false;
  int code = -1;
  std::string out, err;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs the CLI with `args` in `dir`, stdout and stderr captured, killed after `timeout_s`.
inline Outcome run_cli(const std::vector<std::string>& args, const std::string& dir,
                       int timeout_s) {
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

}  // namespace mla_cli_test
