// The op layer's glue between torch tensors and the library's views: dtype and device mapping,
// Status -> exception (kInvalidArgument / kUnsupported raise ValueError, the rest RuntimeError),
// the op set of a device and the execution context (torch's current CUDA stream).
#pragma once

#include <ATen/core/Tensor.h>

#include <string_view>

#include "mla/ops.h"
#include "mla/status.h"
#include "mla/tensor.h"

namespace mla::torch_ops {

// Raises when `s` is not OK: ValueError for argument errors, RuntimeError otherwise. The
// message is the library's (it names the argument and its values), prefixed with `op`.
void throw_if_error(const Status& s, std::string_view op);

// A view of `t` named `name` (for errors). Any rank up to 4, any strides; undefined -> empty view.
TensorView to_view(const at::Tensor& t, std::string_view name, std::string_view op);

// The default op set of the tensor's device: raises ValueError when that device type is not
// built in, or when the set has no code for the device's GPU (check_op_set_device: what it
// needs and what it found), so nothing is planned for or launched on such a GPU.
const OpSet& op_set_for(const at::Device& device, std::string_view op);

// The library's Device of a torch device (cuda without an index: the current device).
Device library_device(const at::Device& device);

// Device index guard + torch's current stream of `device` (nullptr stream on cpu).
ExecContext exec_context(const at::Device& device);

// Checks that `t` is a CPU int32 contiguous 1-D tensor; names the argument and what it got.
void check_host_i32(const at::Tensor& t, std::string_view name, std::string_view op);
// Checks that every tensor in `ts` is on `device`.
void check_same_device(const at::Device& device,
                       std::initializer_list<std::pair<const at::Tensor*, const char*>> ts,
                       std::string_view op);

}  // namespace mla::torch_ops
