// mla: MLA attention backends for LLM serving - command-line tool.
#include <cstdio>
#include <exception>
#include <new>

#include "cli_util.h"
#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"mla: MLA (multi-head latent attention) backends for LLM serving"};
  app.set_version_flag("--version", mla::cli::version_string(), "Print the version and exit");
  app.require_subcommand(1);
  mla::cli::CommandRunner runner;
  mla::cli::add_info_command(app, &runner);
  mla::cli::add_check_command(app, &runner);
  mla::cli::add_run_command(app, &runner);
  mla::cli::add_plan_command(app, &runner);
  mla::cli::add_bench_command(app, &runner);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // The library reports errors as Status; what still throws is host memory running out (a
  // std::vector sized from a flag) - reported, never a crash.
  try {
    return runner ? runner() : 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "mla: out of host memory (a flag asks for more than this machine has; "
                 "lower --max-batch-tokens, --pool-tokens or --max-context-len)\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mla: internal error: %s\n", e.what());
  }
  return 1;
}
