// The per-layer side of BackendBase: kv write, absorbed attention and the MHA paths. Reads only
// the batch's plan (plan_, batch_plan.h); allocates nothing and never syncs (so it can be
// graph-captured).
#include "backends/backend_base.h"

namespace mla::backends {
namespace {

TensorView view(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape) {
  return TensorView(data, dtype, device, shape);
}

}  // namespace

TensorView BackendBase::out_cache_loc() const {
  return view(const_cast<int32_t*>(plan_.out_cache_loc), DType::kI32, options_.device,
              {plan_.num_tokens});
}

Status BackendBase::save_kv_cache(int layer, const TensorView& c_kv, const TensorView& k_pe,
                                  const ExecContext& ctx) {
  const KvWriteOp* op = ops_->kv_write.get();
  if (op == nullptr) return unsupported("{}: op set '{}' has no kv_write op", name_, ops_->name);
  const KvPoolConfig& pc = pool_->config();
  MLA_CHECK_ARG(layer >= 0 && layer < pc.num_layers, "{}: layer = {} is outside 0..{}", name_,
                layer, pc.num_layers - 1);
  const Device dev = options_.device;
  MLA_RETURN_IF_ERROR(
      expect_tensor(c_kv, "c_kv", DType::kBF16, {plan_.num_tokens, kKvLoraRank}, dev, false));
  MLA_RETURN_IF_ERROR(
      expect_tensor(k_pe, "k_pe", DType::kBF16, {plan_.num_tokens, kQkRopeDim}, dev, false));
  if (plan_.num_tokens == 0) return Status::Ok();
  KvWriteArgs args;
  args.c_kv = c_kv;
  args.k_pe = k_pe;
  args.out_cache_loc = out_cache_loc();
  args.kv_cache = pool_->layer_cache(layer);
  // The per-layer scale is only meaningful for an fp8 cache (SYSTEM.md 7).
  args.k_scale = pc.dtype == DType::kFP8E4M3 ? pool_->k_scale(layer) : 1.0f;
  return op->run(args, ctx);
}

StatusOr<TensorView> BackendBase::lse_view(const AttentionOutputs& out, int64_t tokens) const {
  const int64_t H = options_.model.num_heads;
  if (out.lse.data != nullptr) {
    MLA_RETURN_IF_ERROR(expect_tensor(out.lse, "lse", DType::kF32, {tokens, H}, options_.device));
    return out.lse;
  }
  return view(plan_.lse, DType::kF32, options_.device, {tokens, H});
}

Status BackendBase::forward_decode(const AttentionInputs& in, const AttentionOutputs& out,
                                   const ExecContext& ctx) {
  MLA_CHECK_ARG(plan_.method == ForwardMethod::kAbsorbed,
                "{}: forward_decode needs an absorbed plan, the batch was planned for {}", name_,
                forward_method_name(plan_.method));
  const auto lock = lock_op_workspace();  // the shared workspace: one user at a time
  return run_absorbed(in, out, ctx);
}

Status BackendBase::forward_extend(const AttentionInputs& in, const AttentionOutputs& out,
                                   const ExecContext& ctx) {
  const auto lock = lock_op_workspace();
  if (plan_.method == ForwardMethod::kAbsorbed) return run_absorbed(in, out, ctx);
  return run_mha(in, out, ctx);
}

Status BackendBase::run_absorbed(const AttentionInputs& in, const AttentionOutputs& out,
                                 const ExecContext& ctx) {
  const int64_t T = plan_.num_tokens;
  const int64_t H = options_.model.num_heads;
  const Device dev = options_.device;
  MLA_RETURN_IF_ERROR(
      expect_tensor(in.q_absorbed, "q_absorbed", DType::kBF16, {T, H, kLatentDim}, dev));
  MLA_RETURN_IF_ERROR(
      expect_tensor(out.o_latent, "o_latent", DType::kBF16, {T, H, kKvLoraRank}, dev));
  MLA_ASSIGN_OR_RETURN(TensorView lse, lse_view(out, T));
  if (in.save_kv_cache) MLA_RETURN_IF_ERROR(save_kv_cache(in.layer, in.c_kv, in.k_pe, ctx));
  if (T == 0) return Status::Ok();
  const KvPoolConfig& pc = pool_->config();
  MLA_CHECK_ARG(in.layer >= 0 && in.layer < pc.num_layers, "{}: layer = {} is outside 0..{}", name_,
                in.layer, pc.num_layers - 1);
  AbsorbedArgs args;
  args.q = in.q_absorbed;
  args.kv_cache = pool_->layer_cache(in.layer);
  args.k_scale = pc.dtype == DType::kFP8E4M3 ? pool_->k_scale(in.layer) : 1.0f;
  args.req_to_token = pool_->req_to_token();
  args.o = out.o_latent;
  args.lse = lse;
  args.sm_scale = options_.model.sm_scale;
  args.plan = plan_.absorbed_plan;
  args.workspace = plan_.op.op;
  args.workspace_bytes = plan_.op.op_bytes;
  return ops_->absorbed->run(args, ctx);
}

Status BackendBase::run_up_project(const AttentionInputs& in, const KvRows& rows,
                                   const int32_t* slots, int64_t n, const ExecContext& ctx) {
  const UpProjectOp* op = ops_->up_project.get();
  if (op == nullptr) return unsupported("{}: op set '{}' has no up_project op", name_, ops_->name);
  const int64_t H = options_.model.num_heads;
  const Device dev = options_.device;
  MLA_RETURN_IF_ERROR(expect_tensor(in.kv_b_proj, "kv_b_proj", DType::kBF16,
                                    {H * kKvBProjRowsPerHead, kKvLoraRank}, dev));
  const KvPoolConfig& pc = pool_->config();
  UpProjectArgs args;
  args.kv_cache = pool_->layer_cache(in.layer);
  args.k_scale = pc.dtype == DType::kFP8E4M3 ? pool_->k_scale(in.layer) : 1.0f;
  args.slots = view(const_cast<int32_t*>(slots), DType::kI32, dev, {n});
  args.kv_b_proj = in.kv_b_proj;
  args.k = view(rows.k, DType::kBF16, dev, {n, H, kQkHeadDim});
  args.v = view(rows.v, DType::kBF16, dev, {n, H, kVHeadDim});
  args.workspace = rows.up_ws;
  args.workspace_bytes = rows.up_ws_bytes;
  return op->run(args, ctx);
}

// MHA forms. The backend up-projects every latent row a pass reads: the new tokens' rows just
// written (unless the caller brings their k, v), or with the one-shot gather prefix and new
// tokens together. Chunked: causal among the new tokens into (o, lse), then for every prefix
// chunk: gather + up-project its rows, non-causal attention of all new tokens against it, merged
// into (o, lse) by the attention op itself (MhaArgs::merge_into_output; a request with no rows
// in the chunk keeps its state).
Status BackendBase::run_mha(const AttentionInputs& in, const AttentionOutputs& out,
                            const ExecContext& ctx) {
  const MhaAttentionOp* op = ops_->mha.get();
  if (op == nullptr) return unsupported("{}: op set '{}' has no mha op", name_, ops_->name);
  const int64_t T = plan_.num_tokens;
  const int64_t H = options_.model.num_heads;
  const Device dev = options_.device;
  const bool chunked = plan_.method == ForwardMethod::kMhaChunked && plan_.has_prefix;
  const bool gather = plan_.method == ForwardMethod::kMhaOneShot && plan_.has_prefix;
  // k, v of the new tokens: the caller's, or up-projected here from the rows written at the
  // plan's out_cache_loc (in.kv_b_proj).
  const bool up_project_new = !gather && in.k.data == nullptr && in.v.data == nullptr;
  if (chunked) {
    MLA_CHECK_ARG(plan_.chunks_planned(),
                  "{}: the prefix chunks of this batch were not planned; call "
                  "init_mha_chunk_metadata after init_forward_metadata",
                  name_);
  }
  MLA_RETURN_IF_ERROR(expect_tensor(in.q, "q", DType::kBF16, {T, H, kQkHeadDim}, dev));
  MLA_RETURN_IF_ERROR(expect_tensor(out.o, "o", DType::kBF16, {T, H, kVHeadDim}, dev));
  if (!gather && !up_project_new) {
    MLA_RETURN_IF_ERROR(expect_tensor(in.k, "k", DType::kBF16, {T, H, kQkHeadDim}, dev));
    MLA_RETURN_IF_ERROR(expect_tensor(in.v, "v", DType::kBF16, {T, H, kVHeadDim}, dev));
  }
  if (gather || chunked || up_project_new) {  // checked before anything is written
    if (ops_->up_project == nullptr) {
      return unsupported("{}: op set '{}' has no up_project op", name_, ops_->name);
    }
    MLA_RETURN_IF_ERROR(expect_tensor(in.kv_b_proj, "kv_b_proj", DType::kBF16,
                                      {H * kKvBProjRowsPerHead, kKvLoraRank}, dev));
  }
  MLA_ASSIGN_OR_RETURN(TensorView lse, lse_view(out, T));
  if (in.save_kv_cache) MLA_RETURN_IF_ERROR(save_kv_cache(in.layer, in.c_kv, in.k_pe, ctx));
  if (T == 0) return Status::Ok();

  MhaArgs args;
  args.q = in.q;
  args.o = out.o;
  args.lse = lse;
  args.sm_scale = options_.model.sm_scale;
  args.plan = plan_.mha_plan;
  args.workspace = plan_.op.op;
  args.workspace_bytes = plan_.op.op_bytes;
  if (gather) {
    MLA_RETURN_IF_ERROR(run_up_project(in, plan_.chunk, plan_.chunk.slots, plan_.kv_tokens, ctx));
    args.k = view(plan_.chunk.k, DType::kBF16, dev, {plan_.kv_tokens, H, kQkHeadDim});
    args.v = view(plan_.chunk.v, DType::kBF16, dev, {plan_.kv_tokens, H, kVHeadDim});
  } else if (up_project_new) {
    MLA_RETURN_IF_ERROR(run_up_project(in, plan_.new_kv, plan_.out_cache_loc, T, ctx));
    args.k = view(plan_.new_kv.k, DType::kBF16, dev, {T, H, kQkHeadDim});
    args.v = view(plan_.new_kv.v, DType::kBF16, dev, {T, H, kVHeadDim});
  } else {
    args.k = in.k;
    args.v = in.v;
  }
  MLA_RETURN_IF_ERROR(op->run(args, ctx));
  if (!chunked) return Status::Ok();

  for (int c = 0; c < plan_.chunks.num_chunks; ++c) {
    const int64_t n = plan_.chunks.num_tokens[c];
    MLA_RETURN_IF_ERROR(
        run_up_project(in, plan_.chunk, plan_.chunk.slots + plan_.chunks.kv_offsets[c], n, ctx));
    MhaArgs chunk = args;
    chunk.k = view(plan_.chunk.k, DType::kBF16, dev, {n, H, kQkHeadDim});
    chunk.v = view(plan_.chunk.v, DType::kBF16, dev, {n, H, kVHeadDim});
    chunk.merge_into_output = true;
    chunk.plan = plan_.chunk_plans + plan_.chunk_plan_offsets[c];
    MLA_RETURN_IF_ERROR(op->run(chunk, ctx));
  }
  return Status::Ok();
}

}  // namespace mla::backends
