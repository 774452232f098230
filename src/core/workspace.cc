#include "mla/workspace.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

namespace mla {

std::string_view workspace_policy_name(WorkspacePolicy p) {
  switch (p) {
    case WorkspacePolicy::kSharedLazy:
      return "shared";
    case WorkspacePolicy::kSharedZeroed:
      return "shared-zeroed";
    case WorkspacePolicy::kOnDemand:
      return "on-demand";
  }
  return "?";
}

StatusOr<std::size_t> resolve_workspace_bytes(std::size_t option_bytes, const char* env_var,
                                              std::size_t default_bytes) {
  if (option_bytes != 0) return option_bytes;
  const char* env = env_var ? std::getenv(env_var) : nullptr;
  if (env == nullptr || *env == '\0') return default_bytes;
  const std::string_view text(env);
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  std::string_view suffix(end, static_cast<std::size_t>(text.data() + text.size() - end));
  uint64_t unit = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB")
    unit = 1ull << 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB")
    unit = 1ull << 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB")
    unit = 1ull << 30;
  else if (!suffix.empty())
    unit = 0;
  if (ec != std::errc() || unit == 0 || value == 0) {
    return invalid_argument("{} = '{}' is not a positive byte count (e.g. 33554432 or 32M)",
                            env_var, text);
  }
  return static_cast<std::size_t>(value * unit);
}

// ---------------------------------------------------------------------------------------------
WorkspaceRegistry& WorkspaceRegistry::global() {
  static WorkspaceRegistry* registry = new WorkspaceRegistry();
  return *registry;
}

StatusOr<std::shared_ptr<SharedWorkspace>> WorkspaceRegistry::acquire(const WorkspaceSpec& spec,
                                                                      std::string_view requester) {
  MLA_CHECK_ARG(spec.policy != WorkspacePolicy::kOnDemand,
                "workspace '{}': policy on-demand is per owner (GrowableBuffer), not shared",
                spec.name);
  MLA_CHECK_ARG(spec.bytes > 0, "workspace '{}': bytes = {} must be positive", spec.name,
                spec.bytes);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& e : entries_) {
    if (e->name() != spec.name || e->device() != spec.device) continue;
    MLA_CHECK_ARG(e->policy() == spec.policy,
                  "workspace '{}' on {} is {}, but {} asked for it as {} (a zeroed workspace is "
                  "never shared with a user that writes into it)",
                  spec.name, spec.device.to_string(), workspace_policy_name(e->policy()), requester,
                  workspace_policy_name(spec.policy));
    if (e->bytes() < spec.bytes) {
      return make_status(StatusCode::kOutOfWorkspace,
                         "workspace '{}' on {} was created with {} bytes, but {} needs {} bytes "
                         "({} more); set {} to at least {} before the first backend is created",
                         spec.name, spec.device.to_string(), e->bytes(), requester, spec.bytes,
                         spec.bytes - e->bytes(), spec.env_var, spec.bytes);
    }
    return e;
  }
  MLA_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                       DeviceBuffer::allocate(spec.device, spec.bytes, spec.name,
                                              fmt::format("shared:{}", requester),
                                              spec.policy == WorkspacePolicy::kSharedZeroed));
  entries_.push_back(std::make_shared<SharedWorkspace>(spec, std::move(buffer)));
  return entries_.back();
}

std::vector<WorkspaceRegistry::Entry> WorkspaceRegistry::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Entry> out;
  for (const auto& e : entries_) {
    out.push_back(Entry{e->name(), e->device(), e->bytes(), e->policy(), e.use_count() - 1});
  }
  return out;
}

bool WorkspaceRegistry::contains(std::string_view name, Device device) const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::any_of(entries_.begin(), entries_.end(),
                     [&](const auto& e) { return e->name() == name && e->device() == device; });
}

void WorkspaceRegistry::release_all_for_testing() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
}

// ---------------------------------------------------------------------------------------------
Status GrowableBuffer::reserve(std::size_t bytes) {
  if (bytes <= buffer_.bytes() && (bytes == 0 || buffer_.data() != nullptr)) return Status::Ok();
  buffer_.reset();  // free first so the peak is the new size, not old + new
  MLA_ASSIGN_OR_RETURN(buffer_, DeviceBuffer::allocate(device_, align_workspace(bytes), name_,
                                                       owner_, /*zeroed=*/false));
  ++grow_count_;
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
void* WorkspaceCarver::carve(std::string_view what, std::size_t bytes) {
  const std::size_t begin = align_workspace(offset_);
  if (bytes == 0) return nullptr;
  offset_ = begin + bytes;
  if (measuring_) return nullptr;
  if (offset_ > capacity_ || base_ == nullptr) {
    if (first_failed_.empty()) first_failed_ = std::string(what);
    return nullptr;
  }
  return base_ + begin;
}

Status WorkspaceCarver::status() const {
  if (measuring_ || first_failed_.empty()) return Status::Ok();
  const std::string hint =
      env_var_.empty() ? std::string() : fmt::format("; set {} to at least {}", env_var_, offset_);
  return make_status(StatusCode::kOutOfWorkspace,
                     "workspace '{}' has {} bytes, but carve '{}' needs {} bytes in total ({} "
                     "more){}",
                     buffer_name_, capacity_, first_failed_, offset_, offset_ - capacity_, hint);
}

}  // namespace mla
