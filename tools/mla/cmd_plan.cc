// Placeholder until the subcommand lands.
#include <cstdio>

#include "commands.h"

namespace mla::cli {
CLI::App* add_plan_command(CLI::App& app, CommandRunner* runner) {
  CLI::App* sub = app.add_subcommand("plan", "(not implemented yet)");
  sub->callback([runner] { *runner = [] { std::fputs("mla plan: not implemented yet\n", stderr); return 2; }; });
  return sub;
}
}  // namespace mla::cli
