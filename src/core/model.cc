#include "mla/model.h"

namespace mla {

Status ModelDims::validate() const {
  MLA_CHECK_ARG(is_supported_head_count(num_heads),
                "model.num_heads = {} is not supported (1 to {})", num_heads, kMaxHeads);
  MLA_CHECK_ARG(kv_lora_rank == kKvLoraRank, "model.kv_lora_rank = {} (only {} is supported)",
                kv_lora_rank, kKvLoraRank);
  MLA_CHECK_ARG(qk_rope_dim == kQkRopeDim, "model.qk_rope_dim = {} (only {} is supported)",
                qk_rope_dim, kQkRopeDim);
  MLA_CHECK_ARG(qk_nope_dim == kQkNopeDim, "model.qk_nope_dim = {} (only {} is supported)",
                qk_nope_dim, kQkNopeDim);
  MLA_CHECK_ARG(v_head_dim == kVHeadDim, "model.v_head_dim = {} (only {} is supported)", v_head_dim,
                kVHeadDim);
  MLA_CHECK_ARG(num_layers >= 1, "model.num_layers = {} must be >= 1", num_layers);
  MLA_CHECK_ARG(sm_scale > 0.f, "model.sm_scale = {} must be > 0", sm_scale);
  return Status::Ok();
}

bool is_supported_head_count(int h) { return h >= 1 && h <= kMaxHeads; }

std::vector<std::string> model_preset_names() {
  return {"deepseek-v3",     "deepseek-v3-tp2",  "deepseek-v3-tp4",
          "deepseek-v3-tp8", "deepseek-v3-tp16", "deepseek-v2-lite"};
}

StatusOr<ModelDims> model_preset(std::string_view name) {
  ModelDims m;
  m.name = std::string(name);
  if (name == "deepseek-v3") return m;
  if (name == "deepseek-v3-tp2") {
    m.num_heads = 64;
    return m;
  }
  if (name == "deepseek-v3-tp4") {
    m.num_heads = 32;
    return m;
  }
  if (name == "deepseek-v3-tp8") {
    m.num_heads = 16;
    return m;
  }
  if (name == "deepseek-v3-tp16") {
    m.num_heads = 8;
    return m;
  }
  if (name == "deepseek-v2-lite") {
    m.num_heads = 16;
    m.num_layers = 27;
    m.sm_scale = kDeepSeekV2LiteSoftmaxScale;
    return m;
  }
  std::string known;
  for (const auto& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  return invalid_argument("model preset '{}' is unknown (known: {})", name, known);
}

}  // namespace mla
