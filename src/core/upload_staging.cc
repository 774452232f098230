#include "mla/upload_staging.h"

#include <algorithm>
#include <cstring>

namespace mla {
namespace {
constexpr std::size_t kAlign = 64;
constexpr std::size_t kMinBytes = 64 * 1024;
std::size_t round_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
}  // namespace

UploadStaging::~UploadStaging() {
  for (Slot& s : slots_) {
    if (s.pending && rt_ != nullptr) rt_->wait_event(s.event).ignore();
    release(s);
    if (s.event != nullptr && rt_ != nullptr) rt_->destroy_event(s.event);
  }
}

void UploadStaging::release(Slot& s) {
  if (s.data != nullptr && rt_ != nullptr) rt_->free_host(s.data);
  if (s.ledger_id != 0) MemoryLedger::global().remove(s.ledger_id);
  s.data = nullptr;
  s.bytes = 0;
  s.ledger_id = 0;
}

Status UploadStaging::grow(Slot& s, std::size_t bytes) {
  release(s);
  const std::size_t want = std::max({bytes, kMinBytes, 2 * s.bytes});
  MLA_ASSIGN_OR_RETURN(void* p, rt_->malloc_host(want));
  s.data = static_cast<std::byte*>(p);
  s.bytes = want;
  const int index = static_cast<int>(&s - slots_.data());
  s.ledger_id = MemoryLedger::global().add(AllocationRecord{
      0, name_ + "[" + std::to_string(index) + "]", owner_, Device::cpu(), want, false});
  ++grows_;
  return Status::Ok();
}

// Switches to the other buffer and waits until the uploads that last read it have finished.
Status UploadStaging::open(std::size_t first_bytes, void* stream) {
  (void)stream;
  current_ ^= 1;
  Slot& s = slots_[current_];
  if (s.event == nullptr) {
    MLA_ASSIGN_OR_RETURN(s.event, rt_->create_event());
  }
  if (s.pending) {
    // The buffer's last upload may still be reading it: block only when it has not finished
    // (the host ran more than one plan ahead of the GPU), and count those.
    MLA_ASSIGN_OR_RETURN(const bool done, rt_->event_done(s.event));
    if (!done) {
      MLA_RETURN_IF_ERROR(rt_->wait_event(s.event));
      ++blocking_waits_;
    }
    s.pending = false;
  }
  if (s.bytes < first_bytes) MLA_RETURN_IF_ERROR(grow(s, round_up(first_bytes)));
  cursor_ = 0;
  open_ = true;
  return Status::Ok();
}

Status UploadStaging::upload(void* dst, const void* src, std::size_t bytes, void* stream) {
  if (bytes == 0) return Status::Ok();
  if (rt_ == nullptr) {
    rt_ = device_runtime(device_.type);
    if (rt_ == nullptr) return unsupported("{}: no runtime for {}", name_, device_.to_string());
  }
  if (device_.is_cpu()) return rt_->copy_to_device(dst, src, bytes, stream);
  MLA_ASSIGN_OR_RETURN(std::byte * staged, stage(bytes, stream));
  std::memcpy(staged, src, bytes);
  return upload_staged(dst, staged, bytes, stream);
}

StatusOr<std::byte*> UploadStaging::stage(std::size_t bytes, void* stream) {
  if (rt_ == nullptr) {
    rt_ = device_runtime(device_.type);
    if (rt_ == nullptr) return unsupported("{}: no runtime for {}", name_, device_.to_string());
  }
  if (device_.is_cpu()) return unsupported("{}: no staging on the cpu", name_);
  if (!open_) MLA_RETURN_IF_ERROR(open(bytes, stream));
  Slot* s = &slots_[current_];
  if (cursor_ + bytes > s->bytes) {
    // This call's earlier uploads from this buffer may be in flight: let them finish, then
    // reuse (or grow) it from the start. Happens while sizes grow, not in steady state.
    MLA_RETURN_IF_ERROR(rt_->synchronize(stream));
    if (bytes > s->bytes) MLA_RETURN_IF_ERROR(grow(*s, round_up(bytes)));
    cursor_ = 0;
  }
  std::byte* staged = s->data + cursor_;
  cursor_ = round_up(cursor_ + bytes);
  return staged;
}

Status UploadStaging::upload_staged(void* dst, const std::byte* staged, std::size_t bytes,
                                    void* stream) {
  if (bytes == 0) return Status::Ok();
  return rt_->copy_to_device(dst, staged, bytes, stream);
}

Status UploadStaging::close(void* stream) {
  if (!open_) return Status::Ok();
  open_ = false;
  Slot& s = slots_[current_];
  MLA_RETURN_IF_ERROR(rt_->record_event(s.event, stream));
  s.pending = true;
  return Status::Ok();
}

}  // namespace mla
