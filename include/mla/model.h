// Model dimensions of an MLA layer (DeepSeek-V2/V3 style) and named presets.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "mla/status.h"

namespace mla {

// DeepSeek-V3: 192^-0.5 * mscale^2 with YaRN mscale = 0.1 * ln(40) + 1 (mscale_all_dim 1.0).
inline constexpr float kDeepSeekV3SoftmaxScale = 0.135234f;
// DeepSeek-V2-Lite: 192^-0.5 * (0.1 * 0.707 * ln(40) + 1)^2.
inline constexpr float kDeepSeekV2LiteSoftmaxScale = 0.114722f;

// The MLA dims mla supports (DeepSeek-V2/V3; ModelDims::validate accepts only these): where a
// ModelDims is not at hand, code takes them from here, never as literals.
inline constexpr int kKvLoraRank = 512;                      // c_kv width
inline constexpr int kQkRopeDim = 64;                        // k_pe / q_pe width
inline constexpr int kQkNopeDim = 128;                       // q_nope / k_nope width per head
inline constexpr int kVHeadDim = 128;                        // v / o width per head
inline constexpr int kLatentDim = kKvLoraRank + kQkRopeDim;  // 576: one cached latent row
inline constexpr int kQkHeadDim = kQkNopeDim + kQkRopeDim;   // 192: MHA q / k per head
inline constexpr int kMaxHeads = 128;  // query heads per rank: any of 1..128 (DeepSeek-V3: 128)
inline constexpr int kKvBProjRowsPerHead = kQkNopeDim + kVHeadDim;  // 256: W_UK[h] and W_UV[h]

struct ModelDims {
  std::string name = "deepseek-v3";
  int num_heads = 128;             // query heads on this rank
  int kv_lora_rank = kKvLoraRank;  // c_kv width
  int qk_rope_dim = kQkRopeDim;    // k_pe / q_pe width
  int qk_nope_dim = kQkNopeDim;    // q_nope / k_nope width per head
  int v_head_dim = kVHeadDim;
  int num_layers = 61;
  float sm_scale = kDeepSeekV3SoftmaxScale;  // same scale for both forms

  int latent_dim() const { return kv_lora_rank + qk_rope_dim; }  // 576
  int head_dim_qk() const { return qk_nope_dim + qk_rope_dim; }  // 192
  Status validate() const;
};

// Presets: "deepseek-v3" (128 heads), "deepseek-v3-tp2" (64), "deepseek-v3-tp4" (32),
// "deepseek-v3-tp8" (16), "deepseek-v3-tp16" (8), "deepseek-v2-lite" (16 heads, 27 layers).
StatusOr<ModelDims> model_preset(std::string_view name);
std::vector<std::string> model_preset_names();

// Head counts per rank the ops support.
bool is_supported_head_count(int num_heads);  // 1 .. kMaxHeads

}  // namespace mla
