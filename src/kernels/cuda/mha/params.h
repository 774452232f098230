// Kernel parameters and device plan layout of the ragged MHA attention (q/k 192, v 128).
// Plain structs shared by the host planner, the launcher and the kernel.
#pragma once

#include <cstdint>

namespace mla::cuda::mha {

// One unit of the schedule: up to kBlockM query rows of one request (all heads run it).
// Query row i of the tile (absolute row q_start + i) sees keys kv_start .. kv_start +
// min(kv_len, diag + i + 1) - 1; non-causal tiles carry diag = kNoDiag.
struct MhaTile {
  int32_t q_start;   // first query row (absolute, into q / o / lse)
  int32_t q_rows;    // rows of this tile, 1 .. kBlockM
  int32_t kv_start;  // first key row of the request (absolute, into k / v)
  int32_t kv_len;    // keys of the request
  int32_t diag;      // causal: kv_len - q_len + (row offset of the tile in its request)
  int32_t pad[3];
};
static_assert(sizeof(MhaTile) == 32);

inline constexpr int32_t kNoDiag = 0x3fffffff;

// Device plan: header, then num_tiles tiles sorted by descending work.
struct MhaPlanHeader {
  int32_t num_tiles;
  int32_t num_heads;
  int32_t batch_size;
  // wgmma kernel: heads whose (tile, head) units run together (>= 1), so the CTAs running at the
  // same time stream the K/V of few heads through L2; smaller for longer key ranges.
  int32_t head_group;
  int32_t pad[4];
};
static_assert(sizeof(MhaPlanHeader) == 32);

struct MhaParams {
  const uint16_t* q;                    // bf16 [Tq, H, 192], last dim contiguous
  const uint16_t* k;                    // bf16 [Tk, H, 192], last dim contiguous
  const uint16_t* v;                    // bf16 [Tk, H, 128], last dim contiguous
  uint16_t* o;                          // bf16 [Tq, H, 128], last dim contiguous
  float* lse;                           // f32 [Tq, H] (natural log), may be null
  const void* plan;                     // device copy of MhaPlanHeader + MhaTile[num_tiles]
  int64_t q_row_stride, q_head_stride;  // elements
  int64_t k_row_stride, k_head_stride;
  int64_t v_row_stride, v_head_stride;
  int64_t o_row_stride, o_head_stride;
  int64_t lse_row_stride;  // elements between tokens; heads contiguous
  int num_heads;
  float scale_log2;  // sm_scale * log2(e)
  // MhaArgs::merge_into_output: o / lse hold a state of the same rows; the epilogue merges the
  // unit's fp32 state into it (lse is then not null).
  int merge_into_output;
  // TMA tensor maps (CUtensorMap) of q, k, v as 3-D tensors {dim, head, token}, boxes of 64
  // columns x 1 head x 128 tokens, 128-byte swizzle; read through the kernel parameter
  // (__grid_constant__). k / v are unused (not encoded) when no request has keys.
  alignas(64) unsigned char q_tmap[128];
  alignas(64) unsigned char k_tmap[128];
  alignas(64) unsigned char v_tmap[128];
};

}  // namespace mla::cuda::mha
