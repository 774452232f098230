// The seesaw decode kernel of the absorbed op (Hopper, sm_90a), bf16 cache: for tiles of 64
// rows whose requests have more than 64 rows (128 heads), where decode is bound by the tensor
// cores. The schedule is the one FlashMLA's write-up calls "seesaw" (its repository,
// docs/20250422-new-kernel-deep-dive.md); this is mla's own code over mla's plan, page tables and
// helpers.
//
// The output tile O [64 rows][512] is split by columns between the warpgroups (O_L = columns
// 0-255 in warpgroup 0's registers, O_R = 256-511 in warpgroup 1's), and the unit's key tiles are
// taken in pairs (A, B). Per pair:
//   wg0: S_A = Q K_A^T; softmax of A against the running maxima m -> m_A; O_L = O_L a_A + P_A V_AL
//   wg1: S_B = Q K_B^T (under wg0's softmax); softmax of B against m_A -> m_B;
//        O_R = O_R a_A a_B + P_B V_BR; then O_R += (P_A a_B) V_AR, P_A from shared memory
//   wg0: O_L = O_L a_B + P_B V_BL, P_B from shared memory
// so each warpgroup issues one S and two halves of P V per pair (the old kernel gave warpgroup 0
// all of S and half of P V: 3.2 times warpgroup 1's tensor work, with its softmax exposed), and
// each softmax runs while the other warpgroup's tensor work is queued. Row sums are kept per
// warpgroup (each P counted once, in the warpgroup that made it) and added at the unit's end.
//
// Loads: a tile's part L (blocks 0-3) is reloaded by wg0 once its P V over it is done, part R
// (blocks 4-8) by wg1 (seesaw_traits.cuh). S of A reads L then R, S of B reads R then L: each
// starts with the part that was issued first. Pages of 64 and more load a part as TMA boxes of
// 64 rows x 64 columns (one slot per tile), smaller pages as 16-byte cp.async gathers by the 128
// threads of the issuing warpgroup, 4 rows each; a unit with an odd tile count gets a B tile of
// zeros (a box outside the cache, or zero-filled gathers) that its masks make contribute nothing.
// Rows of a TMA tile past the unit's keys hold other data (maybe NaN): each warpgroup zeroes them
// in the V columns it reads before its P V.
//
// A wgmma pipeline must not cross a function call (ptxas C7510): everything is inlined into the
// kernel entry (sm90_kernel.cuh), and every wgmma wait is on a path the compiler sees as uniform.
#pragma once

#include "kernels/cuda/absorbed/seesaw_traits.cuh"
#include "kernels/cuda/sm90/pipeline.cuh"
#include "kernels/cuda/sm90/tma.cuh"

namespace mla::cuda::absorbed::seesaw {

using namespace mla::cuda::sm90;
using wg::key_tiles;
using wg::load_q;
using wg::rescale_o;
using wg::row_limit;
using wg::scale_mask_max;
using wg::write_o;

inline constexpr float kLn2 = 0.69314718055994530942f;

__device__ __forceinline__ Cta make_cta(const AbsorbedParams& p, const PlanHeader& h,
                                        unsigned char* smem) {
  Cta c;
  c.ss = reinterpret_cast<SharedStorage*>(smem);
  c.tid = threadIdx.x;
  // Broadcast from lane 0 so the compiler sees a warp-uniform role (a wgmma on a path it cannot
  // prove uniform is serialised: ptxas C7518).
  c.wgi = __shfl_sync(0xffffffffu, c.tid >> 7, 0);
  c.tw = c.tid & 127;
  c.lane = c.tid & 31;
  c.r_lo = 16 * (c.tw >> 5) + (c.lane >> 2);
  c.r_hi = c.r_lo + 8;
  c.base = smem_u32(c.ss);
  c.tma = p.kv_tmap_valid != 0 && h.tma_box_rows > 0;
  c.slots = make_slot_table(p, h.page_size);
  return c;
}

// ---- loads ----------------------------------------------------------------------------------

// Table entries of the key rows this thread loads of the tile at key0 (slots.cuh: loaded ahead,
// resolved at the load). TMA: thread 0 of the warpgroup, the tile's first key; cp.async: rows
// tw / 8 + 16 j.
__device__ __forceinline__ void fetch_entries(const Cta& c, const int32_t* row, int kv_end,
                                              int key0, int32_t (&ent)[4]) {
  if (c.tma) {
    if (c.tw == 0) ent[0] = load_entry(c.slots, row, kv_end, key0);
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
    ent[j] = load_entry(c.slots, row, kv_end, key0 + (c.tw >> 3) + 16 * j);
}

__device__ __forceinline__ void resolve_slots(const Cta& c, int kv_end, int key0,
                                              const int32_t (&ent)[4], int32_t (&sl)[4]) {
  if (c.tma) {
    if (c.tw == 0) sl[0] = resolve_slot(c.slots, ent[0], kv_end, key0);
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    sl[j] = resolve_slot(c.slots, ent[j], kv_end, key0 + (c.tw >> 3) + 16 * j);
  }
}

// Loads part kPart of the tile whose slots are sl into buffer kBuf, completing on
// full(kBuf, kPart). Called by all 128 threads of the issuing warpgroup.
template <int kBuf, int kPart>
__device__ __forceinline__ void issue_part(const AbsorbedParams& p, const Cta& c,
                                           const int32_t (&sl)[4]) {
  constexpr int kFirst = part_first_block(kPart), kRange = part_range_blocks(kBuf, kPart);
  constexpr bool kBlock8 = part_adds_block8(kBuf, kPart);
  const uint32_t dst = c.k(kBuf), full = c.full(kBuf, kPart);
  if (c.tma) {
    if (c.tw == 0) {
      // A tile past the unit's keys (-1) or a page outside the cache: a box wholly outside the
      // tensor map, which the copy engine fills with zeros.
      const int32_t row = sl[0] >= 0 ? sl[0] : kSlotOutside;
      mbar_arrive_expect_tx(full, static_cast<uint32_t>(part_blocks(kBuf, kPart) * kBlockBytes));
#pragma unroll
      for (int b = kFirst; b < kFirst + kRange; ++b) {
        tma_load_2d(dst + b * kBlockBytes, p.kv_tmap, 64 * b, row, full);
      }
      if constexpr (kBlock8) tma_load_2d(dst + 8 * kBlockBytes, p.kv_tmap, 64 * 8, row, full);
    }
    return;
  }
  const int chunk = c.tw & 7;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int r = (c.tw >> 3) + 16 * j;
    const bool valid = sl[j] >= 0;
    const uint16_t* src = valid ? p.kv_cache + static_cast<int64_t>(sl[j]) * kDimQk : p.kv_cache;
#pragma unroll
    for (int i = 0; i < kRange + (kBlock8 ? 1 : 0); ++i) {
      const int b = i < kRange ? kFirst + i : 8;
      cp_async_16(dst + b * kBlockBytes + sw128_offset(r, chunk),
                  src + (valid ? 64 * b + 8 * chunk : 0), valid);
    }
  }
  mbar_arrive_cp_async(full);
}

// TMA tiles only: zero the rows at or past `valid` (0 < valid < 64) of V blocks [b0, b0 + 4) of
// the tile at `tile`, by the 128 threads of warpgroup c.wgi, before their P V reads them.
__device__ __forceinline__ void zero_tail_rows(const Cta& c, unsigned char* tile, int valid,
                                               int b0) {
  constexpr int kChunksPerRow = kVBlocksPerHalf * 8;
  for (int i = c.tw; i < (kBlockN - valid) * kChunksPerRow; i += 128) {
    const int r = valid + i / kChunksPerRow, rem = i % kChunksPerRow;
    *reinterpret_cast<uint4*>(tile + (b0 + rem / 8) * kBlockBytes + r * 128 + (rem % 8) * 16) =
        make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async();  // generic stores -> the tensor cores
  bar_sync(kWarpgroupBarrier0 + c.wgi, 128);
}

// ---- tensor work ------------------------------------------------------------------------------

// k-steps [kFrom, kTo) of S = Q K^T (k-step kk: columns 16 kk .. +16 of the 576), Q and K from
// shared memory. kZeroFirst: the first step starts the accumulator. Committed as one group.
template <int kFrom, int kTo, bool kZeroFirst>
__device__ __forceinline__ void qk_steps(float (&s)[32], const Cta& c, uint32_t k_tile) {
  const uint64_t desc0 = desc_k_sw128(0);
  wgmma_fence();
#pragma unroll
  for (int kk = kFrom; kk < kTo; ++kk) {
    const uint32_t koff = (kk >> 2) * kBlockBytes + (kk & 3) * 32;
    wgmma_ss_bf16<64, 0>(s, desc0 + ((c.q() + koff) >> 4), desc0 + ((k_tile + koff) >> 4),
                         !(kZeroFirst && kk == kFrom));
  }
  wgmma_commit();
}

// O_half += P V_half over the 64 keys of k_tile, V columns of this warpgroup (blocks 4 wgi ..
// +4), P from registers (the A fragments of the accumulator rows). Committed as one group.
__device__ __forceinline__ void pv_from_registers(float (&o)[128], const Cta& c, uint32_t k_tile,
                                                  const uint32_t (&pa)[4][4]) {
  const uint64_t desc_mn = desc_mn_sw128(0, kBlockBytes);
  const uint32_t v = k_tile + c.wgi * kVBlocksPerHalf * kBlockBytes;
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kBlockN / 16; ++ks) {
    wgmma_rs_bf16<256, 1>(o, pa[ks], desc_mn + ((v + ks * 2048) >> 4), true);
  }
  wgmma_commit();
}

// The same with P from shared memory at p_s (bf16 [64][64], swizzled).
__device__ __forceinline__ void pv_from_shared(float (&o)[128], const Cta& c, uint32_t k_tile,
                                               uint32_t p_s) {
  const uint64_t desc_k = desc_k_sw128(0), desc_mn = desc_mn_sw128(0, kBlockBytes);
  const uint32_t v = k_tile + c.wgi * kVBlocksPerHalf * kBlockBytes;
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kBlockN / 16; ++ks) {
    wgmma_ss_bf16<256, 1>(o, desc_k + ((p_s + ks * 32) >> 4), desc_mn + ((v + ks * 2048) >> 4),
                          true);
  }
  wgmma_commit();
}

// ---- softmax pieces ------------------------------------------------------------------------

// P = exp2(S - m_use) in place (fp32, kept for a later rescale) and the rows' sums added to l.
__device__ __forceinline__ void exp_rows(float (&s)[32], const float (&m_use)[2], float (&l)[2]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float4 pr = softmax_probs(s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3], m_use, l);
    s[4 * j] = pr.x;
    s[4 * j + 1] = pr.y;
    s[4 * j + 2] = pr.z;
    s[4 * j + 3] = pr.w;
  }
}

// P (fp32, times f[row]) as bf16 A fragments of m64n256k16 (k-step ks = keys 16 ks .. +16): a[0] /
// a[1] rows lo / hi at keys 16 ks + 2 q, a[2] / a[3] the same at + 8 (q = lane % 4).
__device__ __forceinline__ void pack_p(const float (&s)[32], float f_lo, float f_hi,
                                       uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    pa[j >> 1][(j & 1) * 2 + 0] = pack_bf16(s[4 * j] * f_lo, s[4 * j + 1] * f_lo);
    pa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(s[4 * j + 2] * f_hi, s[4 * j + 3] * f_hi);
  }
}

// The A fragments in shared memory at p_s (bf16 [64 rows][64 keys], 128-byte swizzle), then the
// fence that makes them visible to the tensor cores.
__device__ __forceinline__ void store_p(const Cta& c, uint32_t p_s, const uint32_t (&pa)[4][4]) {
  unsigned char* base = reinterpret_cast<unsigned char*>(c.ss) + (p_s - c.base);
  const uint32_t byte = (c.lane & 3) * 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    *reinterpret_cast<uint32_t*>(base + sw128_offset(c.r_lo, j) + byte) = pa[j >> 1][(j & 1) * 2];
    *reinterpret_cast<uint32_t*>(base + sw128_offset(c.r_hi, j) + byte) =
        pa[j >> 1][(j & 1) * 2 + 1];
  }
  fence_proxy_async();
}

// Valid rows of the tile at key0 when it is a partial TMA tile (0 < valid < 64), else 0.
__device__ __forceinline__ int tail_rows(const Cta& c, int kv_end, int key0) {
  const int valid = kv_end - key0;
  return c.tma && valid > 0 && valid < kBlockN ? valid : 0;
}

// ---- one unit ----------------------------------------------------------------------------------

// The per-unit state of a thread's role: its output half, running maxima and row sums.
struct RowState {
  float o[128];
  float m[2];
  float l[2];
};

// Warpgroup 0 over the unit's pairs: S of tile A, its softmax, P_A V_AL, then P_B V_BL.
__device__ __forceinline__ void wg0_unit(const AbsorbedParams& p, const Cta& c, const WorkUnit& u,
                                         const int32_t* row, int n_pairs, const int (&lim)[2],
                                         PipelineState<1>& ph, RowState& st) {
  SharedStorage& ss = *c.ss;
  int32_t ent_a[4] = {0, 0, 0, 0}, ent_b[4] = {0, 0, 0, 0}, sl[4] = {-1, -1, -1, -1};
  for (int i = 0; i < n_pairs; ++i, ph.advance()) {
    const int key_a = u.kv_begin + 2 * i * kBlockN, key_b = key_a + kBlockN;
    const bool next = i + 1 < n_pairs;
    // S_A, part L first (issued one part ahead of R).
    float s[32];
    mbar_wait(c.full(kBufA, kPartL), ph.phase);
    qk_steps<0, 16, true>(s, c, c.k(kBufA));
    if (next) {
      fetch_entries(c, row, u.kv_end, key_a + 2 * kBlockN, ent_a);
      fetch_entries(c, row, u.kv_end, key_b + 2 * kBlockN, ent_b);
    }
    mbar_wait(c.full(kBufA, kPartR), ph.phase);
    qk_steps<16, 36, false>(s, c, c.k(kBufA));
    wgmma_wait<0>();
    fence_regs(s);

    // Softmax of A against the running maxima; publish them and the factor of O_L.
    float tmax[2], a_a[2], m_use[2];
    scale_mask_max<8>(s, key_a, c.lane, lim, p.scale_log2, tmax);
    softmax_rescale(st.m, st.l, tmax, a_a, m_use);
    exp_rows(s, m_use, st.l);
    rescale_o(st.o, a_a[0], a_a[1]);
    if ((c.lane & 3) == 0) {
      ss.max0[c.r_lo] = st.m[0];
      ss.max0[c.r_hi] = st.m[1];
      ss.scale0[c.r_lo] = a_a[0];
      ss.scale0[c.r_hi] = a_a[1];
    }
    mbar_arrive(c.handoff(kMax0Ready));

    // O_L += P_A V_AL; once done, part L of the next A.
    uint32_t pa[4][4];
    pack_p(s, 1.f, 1.f, pa);
    if (const int valid = tail_rows(c, u.kv_end, key_a); valid > 0) {
      zero_tail_rows(c, ss.k[kBufA], valid, 0);
    }
    pv_from_registers(st.o, c, c.k(kBufA), pa);
    wgmma_wait<0>();
    fence_regs(st.o);
    if (next) {
      resolve_slots(c, u.kv_end, key_a + 2 * kBlockN, ent_a, sl);
      issue_part<kBufA, kPartL>(p, c, sl);
    }

    // The maxima after B: P_A rescaled to them for wg1, O_L and the sums likewise.
    mbar_wait(c.handoff(kMax1Ready), ph.phase);
    float a_b[2];
    a_b[0] = ss.scale1[c.r_lo];
    a_b[1] = ss.scale1[c.r_hi];
    st.m[0] = ss.max1[c.r_lo];
    st.m[1] = ss.max1[c.r_hi];
    pack_p(s, a_b[0], a_b[1], pa);
    store_p(c, c.p(kBufA), pa);
    mbar_arrive(c.handoff(kP0Ready));
    rescale_o(st.o, a_b[0], a_b[1]);
    st.l[0] *= a_b[0];
    st.l[1] *= a_b[1];

    // O_L += P_B V_BL (P_B from wg1 through shared memory); once done, part L of the next B.
    // Waited here, not under the next pair's S: a wgmma group left in flight across the loop's
    // back edge makes ptxas serialise every wgmma of the kernel (C7514).
    mbar_wait(c.handoff(kP1Ready), ph.phase);
    if (const int valid = tail_rows(c, u.kv_end, key_b); valid > 0) {
      zero_tail_rows(c, ss.k[kBufB], valid, 0);
    }
    pv_from_shared(st.o, c, c.k(kBufB), c.p(kBufB));
    wgmma_wait<0>();
    fence_regs(st.o);
    if (next) {
      resolve_slots(c, u.kv_end, key_b + 2 * kBlockN, ent_b, sl);
      issue_part<kBufB, kPartL>(p, c, sl);
    }
  }
}

// Warpgroup 1 over the unit's pairs: S of tile B, its softmax after A's, P_B V_BR, P_A V_AR.
__device__ __forceinline__ void wg1_unit(const AbsorbedParams& p, const Cta& c, const WorkUnit& u,
                                         const int32_t* row, int n_pairs, const int (&lim)[2],
                                         PipelineState<1>& ph, RowState& st) {
  SharedStorage& ss = *c.ss;
  int32_t ent_a[4] = {0, 0, 0, 0}, ent_b[4] = {0, 0, 0, 0}, sl[4] = {-1, -1, -1, -1};
  for (int i = 0; i < n_pairs; ++i, ph.advance()) {
    const int key_a = u.kv_begin + 2 * i * kBlockN, key_b = key_a + kBlockN;
    const bool next = i + 1 < n_pairs;
    // S_B, part R first (issued by this warpgroup, ahead of part L).
    float s[32];
    mbar_wait(c.full(kBufB, kPartR), ph.phase);
    qk_steps<16, 32, true>(s, c, c.k(kBufB));
    mbar_wait(c.full(kBufB, kPartL), ph.phase);
    qk_steps<0, 16, false>(s, c, c.k(kBufB));
    qk_steps<32, 36, false>(s, c, c.k(kBufB));
    if (next) {
      fetch_entries(c, row, u.kv_end, key_a + 2 * kBlockN, ent_a);
      fetch_entries(c, row, u.kv_end, key_b + 2 * kBlockN, ent_b);
    }
    wgmma_wait<0>();  // also retires P_A V_AR of the last pair
    fence_regs(s);
    fence_regs(st.o);

    // Softmax of B against the maxima after A; O_R rescaled by both factors.
    mbar_wait(c.handoff(kMax0Ready), ph.phase);
    float a_a[2], a_b[2], m_use[2], tmax[2];
    a_a[0] = ss.scale0[c.r_lo];
    a_a[1] = ss.scale0[c.r_hi];
    st.m[0] = ss.max0[c.r_lo];
    st.m[1] = ss.max0[c.r_hi];
    st.l[0] *= a_a[0];
    st.l[1] *= a_a[1];
    scale_mask_max<8>(s, key_b, c.lane, lim, p.scale_log2, tmax);
    softmax_rescale(st.m, st.l, tmax, a_b, m_use);
    if ((c.lane & 3) == 0) {
      ss.max1[c.r_lo] = st.m[0];
      ss.max1[c.r_hi] = st.m[1];
      ss.scale1[c.r_lo] = a_b[0];
      ss.scale1[c.r_hi] = a_b[1];
    }
    mbar_arrive(c.handoff(kMax1Ready));
    exp_rows(s, m_use, st.l);
    rescale_o(st.o, a_a[0] * a_b[0], a_a[1] * a_b[1]);

    // P_B to shared memory for wg0, and O_R += P_B V_BR from registers.
    uint32_t pb[4][4];
    pack_p(s, 1.f, 1.f, pb);
    store_p(c, c.p(kBufB), pb);
    if (const int valid = tail_rows(c, u.kv_end, key_b); valid > 0) {
      zero_tail_rows(c, ss.k[kBufB], valid, kVBlocksPerHalf);
    }
    pv_from_registers(st.o, c, c.k(kBufB), pb);

    // O_R += P_A V_AR (P_A from wg0, already scaled to the maxima after B).
    mbar_wait(c.handoff(kP0Ready), ph.phase);
    if (const int valid = tail_rows(c, u.kv_end, key_a); valid > 0) {
      zero_tail_rows(c, ss.k[kBufA], valid, kVBlocksPerHalf);
    }
    pv_from_shared(st.o, c, c.k(kBufA), c.p(kBufA));
    mbar_arrive(c.handoff(kP1Ready));

    // Part R of the next pair's tiles, each once this warpgroup's P V over it is done (no
    // register fence on O_R here: P_A V_AR still accumulates into it, ptxas C7514).
    wgmma_wait<1>();
    if (next) {
      resolve_slots(c, u.kv_end, key_b + 2 * kBlockN, ent_b, sl);
      issue_part<kBufB, kPartR>(p, c, sl);
    }
    wgmma_wait<0>();
    fence_regs(st.o);
    if (next) {
      resolve_slots(c, u.kv_end, key_a + 2 * kBlockN, ent_a, sl);
      issue_part<kBufA, kPartR>(p, c, sl);
    }
  }
}

// The CTA's units in plan order. Per unit with keys: Q and the first pair's tiles loaded (each
// warpgroup its parts), Q's block 8 to registers, the pairs, then the row sums of both
// warpgroups added and o / lse (or a partial) written.
__device__ __forceinline__ void decode_seesaw(const AbsorbedParams& p, unsigned char* smem) {
  const PlanHeader h = *reinterpret_cast<const PlanHeader*>(p.plan);
  const Cta c = make_cta(p, h, smem);
  SharedStorage& ss = *c.ss;
  const int32_t* cta_begin = reinterpret_cast<const int32_t*>(p.plan + h.cta_begin_offset);
  const WorkUnit* units = reinterpret_cast<const WorkUnit*>(p.plan + h.units_offset);
  const int u_begin = cta_begin[blockIdx.x], u_end = cta_begin[blockIdx.x + 1];

  if (c.tid == 0) {
    for (int b = 0; b < 2; ++b)
      for (int part = 0; part < 2; ++part) mbar_init(c.full(b, part), c.tma ? 1 : 128);
    for (int i = 0; i < kNumHandoffs; ++i) mbar_init(c.handoff(static_cast<Handoff>(i)), 128);
    fence_mbarrier_init();
  }
  if (c.tma && c.tid == 0) prefetch_tensormap(p.kv_tmap);
  __syncthreads();

  PipelineState<1> ph;  // every barrier completes once per pair
  for (int ui = u_begin; ui < u_end; ++ui) {
    const WorkUnit u = units[ui];
    const int n_tiles = key_tiles(u), n_pairs = (n_tiles + 1) / 2;
    RowState st;
#pragma unroll
    for (int i = 0; i < 128; ++i) st.o[i] = 0.f;
    st.m[0] = st.m[1] = -INFINITY;
    st.l[0] = st.l[1] = 0.f;
    const int lim[2] = {row_limit(u, h, c.r_lo), row_limit(u, h, c.r_hi)};
    const int32_t* row = slot_row(c.slots, u.pool_row);
    __syncthreads();  // the last unit's reads of every buffer are done
    if (n_pairs > 0) {
      load_q<kThreads>(p, u, c.q(), c.tid);
      cp_async_commit();
      int32_t ent[4] = {0, 0, 0, 0}, sl[4] = {-1, -1, -1, -1};
      for (int b = 0; b < 2; ++b) {
        const int key0 = u.kv_begin + b * kBlockN;
        fetch_entries(c, row, u.kv_end, key0, ent);
        resolve_slots(c, u.kv_end, key0, ent, sl);
        if (c.wgi == 0) {
          if (b == 0) issue_part<kBufA, kPartL>(p, c, sl);
          if (b == 1) issue_part<kBufB, kPartL>(p, c, sl);
        } else {
          if (b == 0) issue_part<kBufA, kPartR>(p, c, sl);
          if (b == 1) issue_part<kBufB, kPartR>(p, c, sl);
        }
      }
      cp_async_wait<0>();
      fence_proxy_async();
      __syncthreads();  // Q has landed
      if (c.wgi == 0) {
        wg0_unit(p, c, u, row, n_pairs, lim, ph, st);
      } else {
        wg1_unit(p, c, u, row, n_pairs, lim, ph, st);
      }
    }

    // Row sums of both halves (each P was counted by the warpgroup that made it).
    float inv[2] = {0.f, 0.f}, lse[2] = {-INFINITY, -INFINITY};
    if (n_pairs > 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 1);
        st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 2);
      }
      if ((c.lane & 3) == 0) {
        ss.row_sum[c.wgi][c.r_lo] = st.l[0];
        ss.row_sum[c.wgi][c.r_hi] = st.l[1];
      }
      __syncthreads();
      const int rows[2] = {c.r_lo, c.r_hi};
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float l = ss.row_sum[0][rows[i]] + ss.row_sum[1][rows[i]];
        inv[i] = l > 0.f ? p.o_scale / l : 0.f;
        lse[i] = l > 0.f ? (st.m[i] + log2f(l)) * kLn2 : -INFINITY;
      }
    }
    write_o(p, u, st.o, inv, lse, c.r_lo, c.wgi * 256 + 2 * (c.lane & 3),
            c.wgi == 0 && (c.lane & 3) == 0);
  }
}

}  // namespace mla::cuda::absorbed::seesaw
