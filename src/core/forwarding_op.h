// Op wrappers that forward an interface's host-side members (sizes, supports, plans: no device is
// touched) to a wrapped op, so a wrapper writes only what it changes: the registry's
// device-checked run() (op_registry.cc), and the tests' counting and fault ops.
#pragma once

#include <memory>
#include <utility>

#include "mla/ops.h"

namespace mla {

// Forwarding<Op>: every member of Op but run(), forwarded to op_. The primary template serves the
// interfaces with run() alone.
template <typename Op>
class Forwarding : public Op {
 protected:
  explicit Forwarding(std::shared_ptr<const Op> op) : op_(std::move(op)) {}
  std::shared_ptr<const Op> op_;
};

template <>
class Forwarding<AbsorbedAttentionOp> : public AbsorbedAttentionOp {
 public:
  Status supports(int num_heads, int page_size, DType cache_dtype) const override {
    return op_->supports(num_heads, page_size, cache_dtype);
  }
  std::size_t plan_bytes(const AttnCapacity& cap) const override { return op_->plan_bytes(cap); }
  std::size_t workspace_bytes(const AttnCapacity& cap) const override {
    return op_->workspace_bytes(cap);
  }
  StatusOr<std::size_t> plan(const AbsorbedProblem& problem, const AttnCapacity& cap,
                             std::span<std::byte> host_plan) const override {
    return op_->plan(problem, cap, host_plan);
  }

 protected:
  explicit Forwarding(std::shared_ptr<const AbsorbedAttentionOp> op) : op_(std::move(op)) {}
  std::shared_ptr<const AbsorbedAttentionOp> op_;
};

template <>
class Forwarding<MhaAttentionOp> : public MhaAttentionOp {
 public:
  Status supports(int num_heads) const override { return op_->supports(num_heads); }
  std::size_t plan_bytes(const AttnCapacity& cap) const override { return op_->plan_bytes(cap); }
  std::size_t workspace_bytes(const AttnCapacity& cap) const override {
    return op_->workspace_bytes(cap);
  }
  StatusOr<std::size_t> plan(const MhaProblem& problem, const AttnCapacity& cap,
                             std::span<std::byte> host_plan) const override {
    return op_->plan(problem, cap, host_plan);
  }

 protected:
  explicit Forwarding(std::shared_ptr<const MhaAttentionOp> op) : op_(std::move(op)) {}
  std::shared_ptr<const MhaAttentionOp> op_;
};

template <>
class Forwarding<UpProjectOp> : public UpProjectOp {
 public:
  std::size_t workspace_bytes(int64_t max_tokens, int num_heads) const override {
    return op_->workspace_bytes(max_tokens, num_heads);
  }

 protected:
  explicit Forwarding(std::shared_ptr<const UpProjectOp> op) : op_(std::move(op)) {}
  std::shared_ptr<const UpProjectOp> op_;
};

}  // namespace mla
