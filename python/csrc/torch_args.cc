#include "torch_args.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <string>

#ifdef MLA_TORCH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace mla::torch_ops {

void throw_if_error(const Status& s, std::string_view op) {
  if (s.ok()) return;
  const std::string msg = fmt::format("mla.{}: {}", op, s.to_string());
  if (s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kUnsupported) {
    TORCH_CHECK_VALUE(false, msg);
  }
  TORCH_CHECK(false, msg);
}

namespace {

bool to_dtype(at::ScalarType t, DType* out) {
  switch (t) {
    case at::kBFloat16:
      *out = DType::kBF16;
      return true;
    case at::kFloat:
      *out = DType::kF32;
      return true;
    case at::kFloat8_e4m3fn:
      *out = DType::kFP8E4M3;
      return true;
    case at::kInt:
      *out = DType::kI32;
      return true;
    case at::kByte:
      *out = DType::kU8;
      return true;
    default:
      return false;
  }
}

}  // namespace

TensorView to_view(const at::Tensor& t, std::string_view name, std::string_view op) {
  TensorView v;
  if (!t.defined()) return v;
  DType dt;
  TORCH_CHECK_VALUE(to_dtype(t.scalar_type(), &dt), "mla.", op, ": ", name, " has dtype ",
                    t.scalar_type(),
                    " (expected bfloat16, float32, float8_e4m3fn, int32 or uint8)");
  TORCH_CHECK_VALUE(t.dim() <= kMaxDims, "mla.", op, ": ", name, " has ", t.dim(),
                    " dimensions, at most ", kMaxDims, " are supported (shape ", t.sizes(), ")");
  v.data = t.data_ptr();
  v.dtype = dt;
  if (t.is_cuda()) {
    v.device = Device::cuda(t.device().index());
  } else {
    TORCH_CHECK_VALUE(t.is_cpu(), "mla.", op, ": ", name, " is on ", t.device(),
                      " (expected cpu or cuda)");
    v.device = Device::cpu();
  }
  v.ndim = static_cast<int>(t.dim());
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = t.size(d);
    v.stride[d] = t.stride(d);
  }
  return v;
}

const OpSet& op_set_for(const at::Device& device, std::string_view op) {
  const DeviceType type = device.is_cuda() ? DeviceType::kCuda : DeviceType::kCpu;
  TORCH_CHECK_VALUE(device.is_cuda() || device.is_cpu(), "mla.", op, ": device ", device,
                    " is neither cpu nor cuda");
  const OpSet* set = OpRegistry::global().default_for(type);
  TORCH_CHECK_VALUE(set != nullptr, "mla.", op, ": this build of mla has no ops for ", device,
                    " (built without CUDA?)");
  if (device.is_cuda()) throw_if_error(check_op_set_device(*set, library_device(device)), op);
  return *set;
}

Device library_device(const at::Device& device) {
  if (!device.is_cuda()) return Device::cpu();
#ifdef MLA_TORCH_CUDA
  return Device::cuda(device.has_index() ? device.index() : c10::cuda::current_device());
#else
  return Device::cuda(device.has_index() ? device.index() : 0);
#endif
}

ExecContext exec_context(const at::Device& device) {
  ExecContext ctx;
  if (device.is_cuda()) {
#ifdef MLA_TORCH_CUDA
    const int index = device.has_index() ? device.index() : c10::cuda::current_device();
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
    ctx.device = Device::cuda(index);
    ctx.stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index)).stream();
#else
    TORCH_CHECK_VALUE(false, "mla: this build has no CUDA ops (device ", device, ")");
#endif
  }
  return ctx;
}

void check_host_i32(const at::Tensor& t, std::string_view name, std::string_view op) {
  TORCH_CHECK_VALUE(t.defined(), "mla.", op, ": ", name, " is undefined");
  TORCH_CHECK_VALUE(t.is_cpu(), "mla.", op, ": ", name, " is on ", t.device(),
                    "; planning reads host data, pass a cpu tensor");
  TORCH_CHECK_VALUE(t.scalar_type() == at::kInt, "mla.", op, ": ", name, " has dtype ",
                    t.scalar_type(), ", expected int32");
  TORCH_CHECK_VALUE(t.dim() == 1 && t.is_contiguous(), "mla.", op, ": ", name,
                    " must be a contiguous 1-D tensor, got shape ", t.sizes(), " strides ",
                    t.strides());
}

void check_same_device(const at::Device& device,
                       std::initializer_list<std::pair<const at::Tensor*, const char*>> ts,
                       std::string_view op) {
  for (const auto& [t, name] : ts) {
    if (!t->defined()) continue;
    TORCH_CHECK_VALUE(t->device() == device, "mla.", op, ": ", name, " is on ", t->device(),
                      " but the op runs on ", device);
  }
}

}  // namespace mla::torch_ops
