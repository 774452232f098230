// The `mla` CLI: one file per subcommand. Each add_*_command() registers its subcommand on the
// app and returns a function that runs it after parsing (returning the process exit code).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace mla::cli {

using CommandRunner = std::function<int()>;

CLI::App* add_info_command(CLI::App& app, CommandRunner* runner);
CLI::App* add_check_command(CLI::App& app, CommandRunner* runner);
CLI::App* add_run_command(CLI::App& app, CommandRunner* runner);
CLI::App* add_plan_command(CLI::App& app, CommandRunner* runner);
CLI::App* add_bench_command(CLI::App& app, CommandRunner* runner);

}  // namespace mla::cli
