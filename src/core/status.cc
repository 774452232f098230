#include "mla/status.h"

namespace mla {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "Ok";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kUnsupported:
      return "Unsupported";
    case StatusCode::kOutOfMemory:
      return "OutOfMemory";
    case StatusCode::kOutOfWorkspace:
      return "OutOfWorkspace";
    case StatusCode::kCudaError:
      return "CudaError";
    case StatusCode::kInternal:
      return "Internal";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "Ok";
  return fmt::format("{}: {}", status_code_name(code_), message_);
}

}  // namespace mla
