// Placeholder until the subcommand lands.
#include <cstdio>

#include "commands.h"

namespace mla::cli {
CLI::App* add_info_command(CLI::App& app, CommandRunner* runner) {
  CLI::App* sub = app.add_subcommand("info", "(not implemented yet)");
  sub->callback([runner] { *runner = [] { std::fputs("mla info: not implemented yet\n", stderr); return 2; }; });
  return sub;
}
}  // namespace mla::cli
