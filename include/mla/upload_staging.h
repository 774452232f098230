// Pinned host staging for plan uploads (SYSTEM.md 5: every byte in the ledger), used by the
// backends and by the Python package's plan ops.
// Host planning writes into reused vectors; upload() copies the bytes into page-locked staging
// memory and enqueues the copy to the device on the caller's stream (or a planner writes straight
// into stage()'s staging bytes and upload_staged() enqueues them), so the copy is ordered with
// the layers' kernels on that stream (a pageable copy on the legacy default stream is not
// ordered against a non-blocking stream). Two buffers are used in turn, one per planning call:
// close() records an event after a call's last upload, and the first upload of a later call
// into that buffer waits for the event, so a re-plan never overwrites staging bytes a copy may
// still be reading. Planning must not run inside a stream capture (the copies would be captured).
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "mla/memory.h"
#include "mla/status.h"

namespace mla {

class UploadStaging {
 public:
  UploadStaging(std::string name, std::string owner, Device device)
      : name_(std::move(name)), owner_(std::move(owner)), device_(device) {}
  ~UploadStaging();
  UploadStaging(const UploadStaging&) = delete;
  UploadStaging& operator=(const UploadStaging&) = delete;

  // Copies `bytes` from host `src` to device `dst`, ordered on `stream`. On the cpu: memcpy.
  Status upload(void* dst, const void* src, std::size_t bytes, void* stream);
  // `bytes` of pinned staging for a planner to write in place (a device, not the cpu); then
  // upload_staged() enqueues the copy of the bytes used. Both are part of the open call.
  StatusOr<std::byte*> stage(std::size_t bytes, void* stream);
  Status upload_staged(void* dst, const std::byte* staged, std::size_t bytes, void* stream);
  // Ends a planning call: records the event of the buffer filled since the last close().
  Status close(void* stream);

  std::size_t capacity(int i) const { return slots_[i].bytes; }
  // Times reusing a buffer blocked the host (its last upload had not finished: the host was
  // more than one plan ahead of the GPU); 0 in an engine that plans one step ahead.
  uint64_t blocking_waits() const { return blocking_waits_; }
  uint64_t grows() const { return grows_; }  // (re)allocations

 private:
  struct Slot {
    std::byte* data = nullptr;
    std::size_t bytes = 0;
    void* event = nullptr;
    bool pending = false;  // event recorded after uploads that may still run
    uint64_t ledger_id = 0;
  };
  Status open(std::size_t first_bytes, void* stream);
  Status grow(Slot& s, std::size_t bytes);
  void release(Slot& s);

  std::string name_, owner_;
  Device device_;
  DeviceRuntime* rt_ = nullptr;
  std::array<Slot, 2> slots_{};
  int current_ = 1;  // slot being filled when open_
  bool open_ = false;
  std::size_t cursor_ = 0;
  uint64_t blocking_waits_ = 0, grows_ = 0;
};

}  // namespace mla
