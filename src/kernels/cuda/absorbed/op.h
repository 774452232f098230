// The CUDA AbsorbedAttentionOp (factory; the class lives in op.cc).
#pragma once

#include <memory>

#include "mla/ops.h"

namespace mla::cuda {

std::shared_ptr<const AbsorbedAttentionOp> make_cuda_absorbed_op();

}  // namespace mla::cuda
