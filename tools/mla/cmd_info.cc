// `mla info`: build flags, devices, op sets, backends, model presets and, with --device, the
// device memory each backend allocates outside the KV pool (the issue-4 memory report: DeepSeek-V3
// 128 heads, graph state for batch 256 and q_len 2, read from the MemoryLedger).
#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "mla/backend.h"
#include "mla/kv_pool.h"
#include "mla/memory.h"
#include "mla/model.h"
#include "mla/ops.h"
#include "mla/workspace.h"

namespace mla::cli {
namespace {

using nlohmann::json;

struct InfoOptions {
  std::string device;  // "" = no memory report
  bool json_out = false;
};

constexpr int kReportBatch = 256;
constexpr int kReportQLen = 2;
constexpr std::size_t kReportBudgetBytes = 64u << 20;  // issue 4: <= 64 MiB per backend

json build_json() {
  json j;
  j["version"] = kVersion;
#ifdef NDEBUG
  j["build_type"] = "release";
#else
  j["build_type"] = "debug";
#endif
#ifdef MLA_WITH_CUDA
  j["MLA_WITH_CUDA"] = true;
#else
  j["MLA_WITH_CUDA"] = false;
#endif
  j["compiler"] = compiler_string();
  j["cxx_standard"] = static_cast<long>(__cplusplus);
  return j;
}

json devices_json() {
  json out = json::array();
  for (DeviceType t : {DeviceType::kCpu, DeviceType::kCuda}) {
    DeviceRuntime* rt = device_runtime(t);
    const std::string type = t == DeviceType::kCpu ? "cpu" : "cuda";
    if (rt == nullptr || rt->device_count() == 0) {
      out.push_back({{"type", type},
                     {"available", false},
                     {"reason", t == DeviceType::kCuda && !built_with_cuda()
                                    ? "not built with CUDA (MLA_CUDA=OFF)"
                                    : "no device found"}});
      continue;
    }
    for (int i = 0; i < rt->device_count(); ++i) {
      out.push_back({{"type", type},
                     {"index", i},
                     {"available", true},
                     {"description", rt->describe(i)},
                     {"multiprocessors", rt->multiprocessor_count(i)}});
    }
  }
  return out;
}

// The memory report for one backend; error text in "error" when it cannot be built.
json backend_memory(const std::string& name, Device device) {
  json j{{"backend", name}};
  auto model = model_preset("deepseek-v3");
  KvPoolConfig pc;
  pc.num_layers = 1;
  pc.page_size = 64;
  pc.num_pages = 64;
  pc.max_requests = kReportBatch;
  pc.max_context_len = 4096;
  pc.latent_dim = model->latent_dim();
  pc.device = device;
  auto pool = LatentKvPool::create(pc);
  if (!pool.ok()) {
    j["error"] = pool.status().to_string();
    return j;
  }
  BackendContext ctx;
  ctx.pool = pool->get();
  ctx.options.model = *model;
  ctx.options.device = device;
  ctx.options.max_batch = kReportBatch;
  ctx.options.max_q_len = kReportQLen;
  // Each backend is measured from an empty workspace registry, so a process-global workspace
  // created by an earlier backend is not missed.
  WorkspaceRegistry::global().release_all_for_testing();
  const auto before = MemoryLedger::global().snapshot();
  auto backend = BackendRegistry::global().create(name, ctx);
  if (!backend.ok()) {
    j["error"] = backend.status().to_string();
    return j;
  }
  if (Status s = (*backend)->init_cuda_graph_state(kReportBatch, kReportBatch * kReportQLen);
      !s.ok()) {
    j["error"] = s.to_string();
    return j;
  }
  j["allocations"] = ledger_json(new_allocations(before), /*skip_kv_pool=*/true);
  std::size_t total = 0;
  for (const auto& a : j["allocations"]) total += a["bytes"].get<std::size_t>();
  j["total_bytes"] = total;
  j["within_budget"] = total <= kReportBudgetBytes;
  // The worst case once extends run: the up-projected chunk buffer ("<backend>.mha_chunk_kv",
  // planned per batch) is at most BackendOptions::mha_chunk_kv_budget_bytes by construction,
  // slot list included. Not in it: the new tokens' up-projected rows of an MHA extend
  // ("<backend>.mha_new_kv", H * 640 bytes per new token plus the up-projection's scratch), which
  // grow with the batch's new tokens like the layers' activations.
  const std::size_t chunk_budget = ctx.options.mha_chunk_kv_budget_bytes;
  j["mha_chunk_kv_budget_bytes"] = chunk_budget;
  j["worst_case_bytes"] = total + chunk_budget;
  j["worst_case_within"] = total + chunk_budget <= kReportBudgetBytes + chunk_budget;
  return j;
}

int run_info(const InfoOptions& o) {
  json j;
  j["build"] = build_json();
  j["devices"] = devices_json();
  j["op_sets"] = json::array();
  for (const OpSet* s : OpRegistry::global().list()) {
    j["op_sets"].push_back({{"name", s->name},
                            {"device", s->device == DeviceType::kCpu ? "cpu" : "cuda"},
                            {"ops", op_set_members(*s)}});
  }
  j["backends"] = json::array();
  for (const std::string& n : BackendRegistry::global().names()) {
    j["backends"].push_back(
        {{"name", n}, {"description", BackendRegistry::global().description(n)}});
  }
  j["models"] = json::array();
  for (const std::string& n : model_preset_names()) {
    auto m = model_preset(n);
    j["models"].push_back({{"name", n},
                           {"num_heads", m->num_heads},
                           {"num_layers", m->num_layers},
                           {"sm_scale", m->sm_scale}});
  }
  int rc = 0;
  if (!o.device.empty()) {
    auto dev = parse_device(o.device);
    if (!dev.ok()) return fail(dev.status());
    json report{{"device", dev->to_string()}, {"model", "deepseek-v3"},
                {"num_heads", 128},           {"graph_max_bs", kReportBatch},
                {"q_len", kReportQLen},       {"budget_bytes", kReportBudgetBytes},
                {"backends", json::array()}};
    if (!device_available(*dev)) {
      report["skipped"] = fmt::format("device {} is not available", dev->to_string());
    } else {
      for (const std::string& n : BackendRegistry::global().names()) {
        json b = backend_memory(n, *dev);
        if (b.contains("error")) rc = 1;
        report["backends"].push_back(std::move(b));
      }
    }
    j["memory"] = std::move(report);
  }
  if (o.json_out) {
    std::printf("%s\n", j.dump(2).c_str());
    return rc;
  }

  const json& b = j["build"];
  fmt::print("mla {} ({}, {}, CUDA {})\n", b["version"].get<std::string>(),
             b["build_type"].get<std::string>(), b["compiler"].get<std::string>(),
             b["MLA_WITH_CUDA"].get<bool>() ? "on" : "off");
  fmt::print("\ndevices:\n");
  for (const auto& d : j["devices"]) {
    if (d["available"].get<bool>()) {
      fmt::print("  {}:{}  {}\n", d["type"].get<std::string>(), d["index"].get<int>(),
                 d["description"].get<std::string>());
    } else {
      fmt::print("  {}    not available: {}\n", d["type"].get<std::string>(),
                 d["reason"].get<std::string>());
    }
  }
  fmt::print("\nop sets:\n");
  for (const auto& s : j["op_sets"]) {
    std::string ops;
    for (const auto& op : s["ops"]) ops += (ops.empty() ? "" : " ") + op.get<std::string>();
    fmt::print("  {:<10} {:<5} {}\n", s["name"].get<std::string>(), s["device"].get<std::string>(),
               ops.empty() ? "(no ops registered)" : ops);
  }
  fmt::print("\nbackends:\n");
  if (j["backends"].empty()) fmt::print("  (none registered)\n");
  for (const auto& e : j["backends"]) {
    fmt::print("  {:<13} {}\n", e["name"].get<std::string>(), e["description"].get<std::string>());
  }
  fmt::print("\nmodel presets:\n");
  for (const auto& m : j["models"]) {
    fmt::print("  {:<17} {:>3} heads, {} layers, sm_scale {}\n", m["name"].get<std::string>(),
               m["num_heads"].get<int>(), m["num_layers"].get<int>(), m["sm_scale"].get<float>());
  }
  if (j.contains("memory")) {
    const json& m = j["memory"];
    fmt::print(
        "\ndevice memory outside the KV pool on {} (deepseek-v3, 128 heads, graph state "
        "for batch {}, q_len {}; budget {}):\n",
        m["device"].get<std::string>(), kReportBatch, kReportQLen, human_bytes(kReportBudgetBytes));
    if (m.contains("skipped")) fmt::print("  skipped: {}\n", m["skipped"].get<std::string>());
    for (const auto& be : m["backends"]) {
      const std::string name = be["backend"].get<std::string>();
      if (be.contains("error")) {
        fmt::print("  {}: error: {}\n", name, be["error"].get<std::string>());
        continue;
      }
      fmt::print("  {}: {} in {} allocations{}\n", name,
                 human_bytes(be["total_bytes"].get<std::size_t>()), be["allocations"].size(),
                 be["within_budget"].get<bool>() ? "" : "  OVER BUDGET");
      fmt::print("    worst case with extends: {} (+ mha_chunk_kv at most {}){}\n",
                 human_bytes(be["worst_case_bytes"].get<std::size_t>()),
                 human_bytes(be["mha_chunk_kv_budget_bytes"].get<std::size_t>()),
                 be["worst_case_within"].get<bool>() ? "" : "  OVER 64 MiB + chunk budget");
      print_ledger_table(be["allocations"], "    ");
    }
  }
  return rc;
}

}  // namespace

CLI::App* add_info_command(CLI::App& app, CommandRunner* runner) {
  auto opts = std::make_shared<InfoOptions>();
  CLI::App* sub = app.add_subcommand(
      "info",
      "Build flags, devices, op sets, backends, model presets; with --device, the "
      "memory each backend allocates outside the KV pool");
  sub->add_option("--device", opts->device,
                  "Report per-backend device memory for DeepSeek-V3 (128 heads), graph state for "
                  "batch 256, q_len 2 on this device (cpu, cuda, cuda:N)")
      ->check(device_name());
  sub->add_flag("--json", opts->json_out, "Print one JSON object");
  sub->callback([runner, opts] { *runner = [opts] { return run_info(*opts); }; });
  return sub;
}

}  // namespace mla::cli
