// `mla check`: runs the conformance cases (lib/conformance/conformance.h) for every registered op
// set of a device against the double-precision reference and prints a pass/fail/skip table.
// Exit code 1 on any failure; a device that is not present is reported as skipped.
#include <fmt/format.h>

#include <array>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "conformance/conformance.h"
#include "mla/ops.h"

namespace mla::cli {
namespace {

using nlohmann::json;

struct CheckOptions {
  std::string device;  // "" = every device type
  bool full = false;
  std::string filter;
  bool json_out = false;
  bool verbose = false;
};

int run_check(const CheckOptions& o) {
  std::vector<Device> devices;
  if (o.device.empty()) {
    devices = all_devices();
  } else {
    auto d = parse_device(o.device);
    if (!d.ok()) return fail(d.status());
    // A device asked for by name is checked or the command fails: it never passes unchecked.
    if (!device_available(*d)) {
      return fail(make_status(StatusCode::kUnsupported, "--device {}: {}; nothing was checked",
                              d->to_string(),
                              d->is_cuda() && !built_with_cuda()
                                  ? "this build has no CUDA (configure with -DMLA_CUDA=ON)"
                                  : "the device is not present"));
    }
    devices.push_back(*d);
  }
  const auto scope = o.full ? testing::ConformanceScope::kFull : testing::ConformanceScope::kQuick;
  std::vector<testing::ConformanceCase> cases;
  for (auto& c : testing::conformance_cases(scope)) {
    if (o.filter.empty() || c.name.find(o.filter) != std::string::npos) cases.push_back(c);
  }
  if (cases.empty()) {
    return fail(invalid_argument(
        "--filter \"{}\" matches none of the {} {} cases; nothing was "
        "checked",
        o.filter, testing::conformance_cases(scope).size(), o.full ? "full" : "quick"));
  }

  json out{{"scope", o.full ? "full" : "quick"},
           {"filter", o.filter},
           {"seed", testing::base_seed()},
           {"devices", json::array()}};
  int64_t failed_total = 0, run_total = 0;
  for (const Device& dev : devices) {
    json dj{{"device", dev.to_string()}, {"op_sets", json::array()}};
    if (!device_available(dev)) {
      dj["skipped"] = dev.is_cuda() && !built_with_cuda()
                          ? "not built with CUDA (MLA_CUDA=OFF)"
                          : fmt::format("device {} is not present", dev.to_string());
      if (!o.json_out) {
        fmt::print("{}: skipped ({})\n", dev.to_string(), dj["skipped"].get<std::string>());
      }
      out["devices"].push_back(std::move(dj));
      continue;
    }
    for (const OpSet* set : OpRegistry::global().list()) {
      if (set->device != dev.type) continue;
      json sj{{"op_set", set->name}, {"cases", json::array()}};
      // op kind -> pass, fail, skip
      std::map<std::string, std::array<int64_t, 3>> per_op;
      int64_t pass = 0, fail_n = 0, skip = 0;
      for (const auto& c : cases) {
        const testing::CaseResult r = testing::run_conformance_case(*set, c, dev);
        const std::string op(testing::op_kind_name(c.op));
        auto& counts = per_op[op];
        const char* verdict = r.skipped ? "skip" : r.passed ? "pass" : "fail";
        if (r.skipped) {
          ++skip;
          ++counts[2];
        } else if (r.passed) {
          ++pass;
          ++counts[0];
        } else {
          ++fail_n;
          ++counts[1];
        }
        json cj{{"name", r.name},
                {"result", verdict},
                {"max_rel_err", r.max_rel_err},
                {"max_abs_err", r.max_abs_err},
                {"lse_max_abs_err", r.lse_max_abs_err}};
        if (r.skipped) cj["reason"] = r.skip_reason;
        if (!r.passed && !r.skipped) cj["message"] = r.message;
        sj["cases"].push_back(std::move(cj));
        if (!o.json_out && (o.verbose || (!r.passed && !r.skipped))) {
          fmt::print("  {}\n", testing::describe_result(r));
        }
      }
      sj["passed"] = pass;
      sj["failed"] = fail_n;
      sj["skipped"] = skip;
      failed_total += fail_n;
      run_total += pass + fail_n;
      if (!o.json_out) {
        fmt::print("{} / op set '{}': {} cases, {} passed, {} failed, {} skipped\n",
                   dev.to_string(), set->name, cases.size(), pass, fail_n, skip);
        fmt::print("  {:<12} {:>6} {:>6} {:>6}\n", "op", "pass", "fail", "skip");
        for (const auto& [op, n] : per_op) {
          fmt::print("  {:<12} {:>6} {:>6} {:>6}\n", op, n[0], n[1], n[2]);
        }
      }
      dj["op_sets"].push_back(std::move(sj));
    }
    if (dj["op_sets"].empty()) dj["skipped"] = "no op set registered for this device";
    out["devices"].push_back(std::move(dj));
  }
  out["failed"] = failed_total;
  out["run"] = run_total;
  if (o.json_out) {
    std::printf("%s\n", out.dump(2).c_str());
  } else if (run_total > 0) {
    fmt::print("{}\n", failed_total == 0 ? "OK" : fmt::format("FAILED: {} case(s)", failed_total));
  }
  if (run_total == 0) {
    return fail(make_status(StatusCode::kUnsupported,
                            "no case ran (every case was skipped on every device); nothing was "
                            "checked"));
  }
  return failed_total == 0 ? 0 : 1;
}

}  // namespace

CLI::App* add_check_command(CLI::App& app, CommandRunner* runner) {
  auto opts = std::make_shared<CheckOptions>();
  CLI::App* sub = app.add_subcommand(
      "check", "Run the conformance cases of every op set against the double-precision reference");
  sub->add_option("--device", opts->device,
                  "Only this device (cpu, cuda, cuda:N); default: every device")
      ->check(device_name());
  sub->add_flag("--full", opts->full,
                "Every mode x page size x head count x edge case (about a minute per device)");
  sub->add_option("--filter", opts->filter, "Only cases whose name contains this substring");
  sub->add_flag("--json", opts->json_out, "Print one JSON object");
  sub->add_flag("-v,--verbose", opts->verbose, "Print every case, not only failures");
  sub->callback([runner, opts] { *runner = [opts] { return run_check(*opts); }; });
  return sub;
}

}  // namespace mla::cli
