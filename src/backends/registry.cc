// The backend registry: the three families by name, so the CLI, benches and tests enumerate
// backends without knowing them.
#include "backends/chunked_mla/chunked_mla.h"
#include "backends/ondemand_mla/ondemand_mla.h"
#include "backends/paged_mla/paged_mla.h"
#include "mla/backend.h"

namespace mla {

std::string_view forward_method_name(ForwardMethod m) {
  switch (m) {
    case ForwardMethod::kAbsorbed:
      return "absorbed";
    case ForwardMethod::kMhaOneShot:
      return "mha_one_shot";
    case ForwardMethod::kMhaChunked:
      return "mha_chunked";
  }
  return "?";
}

namespace {

template <typename T>
StatusOr<std::unique_ptr<AttentionBackend>> upcast(StatusOr<std::unique_ptr<T>> b) {
  if (!b.ok()) return b.status();
  return std::unique_ptr<AttentionBackend>(std::move(b).value());
}

}  // namespace

StatusOr<const OpSet*> check_backend_config(const BackendOptions& options, int page_size,
                                            DType cache_dtype, std::string_view who) {
  // The checks' own messages, prefixed with `who` (the failed check's source text is kept).
  const auto named = [who](const Status& st) {
    return Status(st.code(), fmt::format("{}: {}", who, st.message()), st.failed_check());
  };
  for (const Status& st : {options.model.validate(), check_page_size(page_size, "page_size"),
                           check_cache_dtype(cache_dtype, "kv_cache_dtype")}) {
    if (!st.ok()) return named(st);
  }
  const Device device = options.device;
  const OpSet* ops = options.op_set.empty() ? OpRegistry::global().default_for(device.type)
                                            : OpRegistry::global().find(options.op_set);
  if (ops == nullptr) {
    return unsupported("{}: no op set '{}' for device {}{}", who,
                       options.op_set.empty() ? "<default>" : options.op_set, device.to_string(),
                       device.is_cuda() ? " (this build of mla has no CUDA ops)" : "");
  }
  if (const Status st = check_op_set_device(*ops, device); !st.ok()) return named(st);
  if (ops->absorbed != nullptr) {
    const Status st = ops->absorbed->supports(options.model.num_heads, page_size, cache_dtype);
    if (!st.ok()) return named(st);
  }
  return ops;
}

BackendRegistry& BackendRegistry::global() {
  static BackendRegistry* registry = [] {
    auto* r = new BackendRegistry();
    r->add(
        "paged_mla",
        "absorbed paged attention for every mode, MHA (ragged / one-shot / chunked prefix) "
        "for long prefills; shared not-zeroed workspace (FlashInfer-MLA role)",
        [](const BackendContext& ctx) { return upcast(backends::PagedMlaBackend::create(ctx)); });
    r->add(
        "chunked_mla",
        "own decode path, chunked-prefix MHA for every extend, zeroed shared workspace, "
        "fallback to paged_mla's absorbed prefill (TRT-LLM-MLA role)",
        [](const BackendContext& ctx) { return upcast(backends::ChunkedMlaBackend::create(ctx)); });
    r->add("ondemand_mla",
           "chunked_mla's methods with a split-KV workspace allocated on first use and grown "
           "on demand (Tokenspeed role)",
           [](const BackendContext& ctx) {
             return upcast(backends::OndemandMlaBackend::create(ctx));
           });
    return r;
  }();
  return *registry;
}

void BackendRegistry::add(std::string name, std::string description, BackendFactory factory) {
  entries_.push_back(Entry{std::move(name), std::move(description), std::move(factory)});
}

std::vector<std::string> BackendRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

std::string BackendRegistry::description(std::string_view name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return e.description;
  }
  return {};
}

StatusOr<std::unique_ptr<AttentionBackend>> BackendRegistry::create(
    std::string_view name, const BackendContext& ctx) const {
  for (const auto& e : entries_) {
    if (e.name == name) return e.factory(ctx);
  }
  std::string known;
  for (const auto& e : entries_) known += (known.empty() ? "" : ", ") + e.name;
  return invalid_argument("backend '{}' is not registered (known: {})", name, known);
}

StatusOr<ForwardMethod> family_forward_method(std::string_view name, const BackendOptions& options,
                                              const ForwardBatch& batch) {
  MLA_ASSIGN_OR_RETURN(const planning::ExtendRule rule, backends::family_extend_rule(name));
  return planning::choose_forward_method(rule, backends::method_options(options), batch);
}

Status plan_batch(AttentionBackend& backend, const ForwardBatch& batch) {
  MLA_RETURN_IF_ERROR(backend.init_forward_metadata(batch));
  if (backend.forward_method() == ForwardMethod::kMhaChunked) {
    MLA_RETURN_IF_ERROR(backend.init_mha_chunk_metadata(batch));
  }
  return Status::Ok();
}

}  // namespace mla
