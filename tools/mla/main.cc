// mla: MLA attention backends for LLM serving - command-line tool.
#include <cstdio>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"mla: MLA (multi-head latent attention) backends for LLM serving"};
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
  return runner ? runner() : 1;
}
