// Absorbed paged MLA attention, version 3 (Hopper, sm_90a): every tile as 64 wgmma rows (a
// plan's 16 / 32-row tiles run with the rows past num_rows zero, so 16 or 32 heads with q_len up
// to 4 read each key once per request), with the two warpgroups in different roles, so one
// warpgroup's softmax runs under the other's tensor work and the key loads are issued by the
// warpgroup with the lighter load.
//
// Per 64-key tile t (stage s = t % 2 of a double-buffered key ring):
//   warpgroup 0 (threads 0-127): S = Q K^T for all 64 keys (m64n64k16 SS x 36), online softmax
//     (row maxima inside a quad of threads, no exchange), P (bf16) to shared memory with the
//     rows' rescale factors, then O[:, 0:256] += P V[:, 0:256] with P from registers
//     (m64n256k16 RS x 4), waited for before it waits for tile t + 1, so stage s is freed (and
//     tile t + 2 issued) without waiting for tile t + 1 to land.
//   warpgroup 1 (threads 128-255): O[:, 256:512] += P V[:, 256:512] (m64n256k16 SS x 4, P from
//     shared memory), then, once both warpgroups are done with stage s, loads tile t + 2 into it:
//     when the plan header's tma_box_rows is 64 (pages of 64 and more) by TMA (9 boxes of 64 key
//     rows x 64 columns per tile; bf16: the 128-byte swizzle applied by the copy engine, a
//     tile's rows past kv_end zeroed by warpgroup 0 after the copy), smaller pages by 16-byte
//     cp.async of all 128 threads (zero fill past kv_end); both complete on the stage's
//     mbarrier. The page-table entries of a tile are loaded two tiles before its load and
//     resolved into slots when it is issued (slots.cuh), so no thread waits on a table load.
//   fp8 cache: the raw rows land in the upper half of each column block of the stage, and
//     warpgroup 1 converts tile t + 1 to bf16 in place (rows past kv_end as zeros) while its
//     P V of tile t runs on the tensor cores (between the wgmma commit and its wait),
//     completing on the mbarrier conv[s] that warpgroup 0 waits on.
// Q is loaded by warpgroup 0 alone (only it reads Q); the next unit's Q is issued as soon as the
// last S of a unit is done. The loads run over the CTA's tiles across unit boundaries.
//
// Synchronisation: the mbarriers p_ready (warpgroup 0's 128 threads arrive once P and the
// rescale factors of tile t are written, warpgroup 1 waits on phase t % 2) and p_free (warpgroup
// 1's 128 threads arrive once they have read P / factors of tile t, warpgroup 0 waits on phase
// t % 2 before it writes those of tile t + 1: p_free of t + 1 needs p_ready of t + 1, so neither
// runs two phases ahead of its waiter); named barriers (256 = both warpgroups; warpgroup 0
// arrives, 1 waits): kStageFree + s (warpgroup 0 is done with stage s), kWg0 / kWg1 (one
// warpgroup only). Each is used once per tile in a fixed direction, so no barrier can collect
// two arrivals of one side before the other side's wait. The row sums of a unit go through the
// mbarriers sums_ready (0 -> 1) and sums_free (1 -> 0: read; 0 waits for it before the next
// unit's sums, so neither barrier can run two phases ahead of its waiter). compute-sanitizer
// racecheck models the mbarrier hand-offs, not a bar.arrive / bar.sync pair (it reported the
// factors of tile t + 1 written over those of t while P free was a named barrier), hence every
// hand-off of data written with generic stores goes through an mbarrier.
//
// Named parts: sm90_ws_traits.cuh (the stage ring's PipelineState, SharedStorage, the named
// barriers, the Cta view), sm90_ws_load.cuh (cursor, slots, tile loads, fp8 conversion, the
// Producer role); here the roles of the tensor work (s_softmax and pv_from_registers: warpgroup
// 0; pv_from_shared: warpgroup 1), the epilogue, and the loop that runs them.
#pragma once

#include "kernels/cuda/absorbed/sm90_ws_load.cuh"

namespace mla::cuda::absorbed::wg {

namespace ws {

static_assert(kStages == 2, "tile g - 1's stage is the one tile g + 1 loads into");

// Warpgroup 0's online softmax over one unit: its two rows' running maxima and sums (base 2) and
// the keys each may see.
struct RowState {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};
  int lim[2];
};

// Warpgroup 0 at a unit's start: its Q in shared memory (loaded here unless the previous unit's
// last tile fetched it, q_for) and visible to the tensor cores.
__device__ __forceinline__ void open_unit(const AbsorbedParams& p, const Cta& c, const WorkUnit& u,
                                          int ui, int q_for) {
  if (q_for != ui) {
    load_q<128>(p, u, c.q(), c.tw);
    cp_async_commit();
  }
  cp_async_wait<0>();
  fence_proxy_async();
  bar_sync(kWg0, 128);
}

// S + softmax role (warpgroup 0), tile t of unit ui in stage ring.stage(). First the P V of the
// tile before is waited for and its stage freed (tile g + 1 is issued into it), before this
// warpgroup waits for tile g to land, so consecutive loads never chain on each other; the wait
// is unconditional (a no-op at a unit's first tile): ptxas serialises every wgmma of a kernel that
// waits for them on a path it cannot prove uniform (C7518). Then S = Q K^T, the next unit's Q
// fetched once this unit's last S is done, the online softmax, and P with the rows' rescale
// factors handed to warpgroup 1 (p_ready). Returns P as the A fragments of m64n256k16 (pa: k-step
// ks = keys 16 ks .. +16; a[0] / a[1] rows lo / hi at keys 16 ks + 2 q, a[2] / a[3] the same at
// + 8, q = lane % 4) and the factors (alpha).
template <bool kFp8>
__device__ __forceinline__ void s_softmax(const AbsorbedParams& p, const Cta& c,
                                          const WorkUnit* units, const WorkUnit& u, int ui,
                                          int u_end, int t, int n_tiles, StageState ring,
                                          float (&o)[128], RowState& rs, int& q_for,
                                          uint32_t (&pa)[4][4], float (&alpha)[2]) {
  const int s = ring.stage();
  const int key0 = u.kv_begin + t * kBlockN;
  const uint32_t k_tile = c.kv(s);
  // The next unit (its Q is fetched once this tile's S is done): read before the wait.
  WorkUnit nu{};
  if (t == n_tiles - 1 && ui + 1 < u_end) nu = units[ui + 1];
  wgmma_wait<0>();
  fence_regs(o);
  if (t > 0) bar_arrive(kStageFree + (s ^ 1), 256);
  mbar_wait(kFp8 ? c.conv(s) : c.full(s), ring.phase());
  if (!kFp8 && c.tma && u.kv_end - key0 < kBlockN) {
    // Rows past kv_end hold other slots' rows (or stale data): zero them so 0 * NaN cannot
    // reach O.
    const int valid = u.kv_end - key0;
    for (int e = c.tw; e < (kBlockN - valid) * 72; e += 128) {
      const int r = valid + e / 72, ch = e % 72;
      *reinterpret_cast<uint4*>(c.kv_ptr(s) + (ch >> 3) * kBlockBytes + r * 128 + (ch & 7) * 16) =
          make_uint4(0, 0, 0, 0);
    }
    fence_proxy_async();
    bar_sync(kWg0, 128);
  }
  fence_proxy_async();  // cp.async rows (generic proxy) -> wgmma

  // S [64 rows x 64 keys] over 576 dims.
  const uint64_t desc_k0 = desc_k_sw128(0);
  float sc[32];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kDimQk / 16; ++kk) {
    const uint32_t koff = (kk >> 2) * kBlockBytes + (kk & 3) * 32;
    wgmma_ss_bf16<64, 0>(sc, desc_k0 + ((c.q() + koff) >> 4), desc_k0 + ((k_tile + koff) >> 4),
                         kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(sc);
  if (t == n_tiles - 1 && nu.kv_end > nu.kv_begin) {  // Q is free: fetch the next unit's
    load_q<128>(p, nu, c.q(), c.tw);
    cp_async_commit();
    q_for = ui + 1;
  }

  // Online softmax: scale, mask, row maxima over the quad (it holds the row's 64 keys).
  float tmax[2];
  scale_mask_max<8>(sc, key0, c.lane, rs.lim, p.scale_log2, tmax);
  float m_use[2];
  softmax_rescale(rs.m, rs.l, tmax, alpha, m_use);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float4 pr =
        softmax_probs(sc[4 * j + 0], sc[4 * j + 1], sc[4 * j + 2], sc[4 * j + 3], m_use, rs.l);
    pa[j >> 1][(j & 1) * 2 + 0] = pack_bf16(pr.x, pr.y);
    pa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(pr.z, pr.w);
  }
  if constexpr (kFp8) {  // P times 2^120 against the tile's values times 2^-120
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) pa[j][i] = bf16x2_times_2p120(pa[j][i]);
  }

  // Hand P and the factors to warpgroup 1, once it has read those of tile g - 1.
  if (ring.count > 0) mbar_wait(c.p_free(), Handoff{ring.count - 1}.phase());
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t byte = (c.lane & 3) * 4;
    *reinterpret_cast<uint32_t*>(c.smem + offsetof(SharedStorage, p) + sw128_offset(c.r_lo, j) +
                                 byte) = pa[j >> 1][(j & 1) * 2 + 0];
    *reinterpret_cast<uint32_t*>(c.smem + offsetof(SharedStorage, p) + sw128_offset(c.r_hi, j) +
                                 byte) = pa[j >> 1][(j & 1) * 2 + 1];
  }
  if ((c.lane & 3) == 0) {
    c.ss().alpha[c.r_lo] = alpha[0];
    c.ss().alpha[c.r_hi] = alpha[1];
  }
  fence_proxy_async();  // P stores -> visible to warpgroup 1's wgmma
  mbar_arrive(c.p_ready());
}

// P V role, warpgroup 0: O[:, 0:256] = O alpha + P V[:, 0:256] over the tile in k_tile, P from
// registers (m64n256k16 RS x 4). Committed, not waited for (s_softmax of the next tile waits).
__device__ __forceinline__ void pv_from_registers(float (&o)[128], const uint32_t (&pa)[4][4],
                                                  const float (&alpha)[2], uint32_t k_tile) {
  const uint64_t desc_mn0 = desc_mn_sw128(0, kBlockBytes);
  rescale_o(o, alpha[0], alpha[1]);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kBlockN / 16; ++ks) {
    wgmma_rs_bf16<256, 1>(o, pa[ks], desc_mn0 + ((k_tile + ks * 2048) >> 4), true);
  }
  wgmma_commit();
}

// P V role, warpgroup 1: once P of tile g is handed over (p_ready) and the tile is there, O[:,
// 256:512] = O alpha + P V[:, 256:512], P from shared memory (m64n256k16 SS x 4). Committed, not
// waited for: the producer's work of this tile runs under it.
template <bool kFp8>
__device__ __forceinline__ void pv_from_shared(float (&o)[128], const Cta& c, StageState ring) {
  const int s = ring.stage();
  const uint64_t desc_k0 = desc_k_sw128(0), desc_mn0 = desc_mn_sw128(0, kBlockBytes);
  mbar_wait(c.p_ready(), Handoff{ring.count}.phase());
  mbar_wait(kFp8 ? c.conv(s) : c.full(s), ring.phase());
  fence_proxy_async();
  rescale_o(o, c.ss().alpha[c.r_lo], c.ss().alpha[c.r_hi]);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kBlockN / 16; ++ks) {
    wgmma_ss_bf16<256, 1>(o, desc_k0 + ((c.p() + ks * 32) >> 4),
                          desc_mn0 + ((c.kv(s) + 4 * kBlockBytes + ks * 2048) >> 4), true);
  }
  wgmma_commit();
}

// Epilogue of a unit: the row sums (warpgroup 0 holds them) handed to warpgroup 1 through
// shared memory (sums_ready, then sums_free before the next unit's; two buffers alternate), and
// each warpgroup's half of O (and warpgroup 0's LSE) written.
__device__ __forceinline__ void epilogue(const AbsorbedParams& p, const Cta& c, const WorkUnit& u,
                                         int n_tiles, const float (&o)[128], RowState& rs,
                                         Handoff& sums) {
  const float ln2 = 0.69314718055994530942f;
  float inv[2] = {0.f, 0.f}, lse[2] = {-INFINITY, -INFINITY};
  if (n_tiles > 0) {
    float* x = c.ss().inv[sums.count & 1];
    if (c.wgi == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        rs.l[i] += __shfl_xor_sync(0xffffffffu, rs.l[i], 1);
        rs.l[i] += __shfl_xor_sync(0xffffffffu, rs.l[i], 2);
        inv[i] = rs.l[i] > 0.f ? p.o_scale / rs.l[i] : 0.f;  // o_scale: k_scale (fp8) or 1
        lse[i] = rs.l[i] > 0.f ? (rs.m[i] + log2f(rs.l[i])) * ln2 : -INFINITY;
      }
      // The previous unit's sums were read.
      if (sums.count > 0) mbar_wait(c.sums_free(), Handoff{sums.count - 1}.phase());
      if ((c.lane & 3) == 0) {
        x[c.r_lo] = inv[0];
        x[c.r_hi] = inv[1];
      }
      mbar_arrive(c.sums_ready());
    } else {
      mbar_wait(c.sums_ready(), sums.phase());
      inv[0] = x[c.r_lo];
      inv[1] = x[c.r_hi];
      mbar_arrive(c.sums_free());
    }
    sums.advance();
  }
  write_o(p, u, o, inv, lse, c.r_lo, c.wgi * 256 + 2 * (c.lane & 3),
          c.wgi == 0 && (c.lane & 3) == 0);
}

}  // namespace ws

// Inlined into its own kernel (absorbed_attention_sm90_kernel): a wgmma pipeline must not
// cross a function call (ptxas C7510 serialises every wgmma then), and sharing a kernel with the
// mma.sync variants spilled. kFp8: an fp8 e4m3 cache (p.kv_cache_fp8), each tile converted to
// bf16 in its stage by warpgroup 1 (convert_fp8_tile) one tile ahead of its use, under that
// warpgroup's P V of the current tile; warpgroup 0 waits on conv[s] instead of full[s].
// k_scale is in p.scale_log2 (logits, with the conversion's 2^120) and p.o_scale (output).
template <bool kFp8>
__device__ __forceinline__ void tile64_ws(const AbsorbedParams& p, unsigned char* smem) {
  using namespace ws;
  const PlanHeader h = *reinterpret_cast<const PlanHeader*>(p.plan);
  const int tid = threadIdx.x;
  Cta c;
  c.smem = smem;
  c.base = smem_u32(smem);
  // Broadcast from lane 0 so the compiler sees a warp-uniform role: a wgmma in a path it
  // cannot prove uniform is serialised (ptxas C7518).
  c.wgi = __shfl_sync(0xffffffffu, tid >> 7, 0);
  c.tw = tid & 127;
  c.lane = tid & 31;
  c.r_lo = 16 * (c.tw >> 5) + (c.lane >> 2);  // this thread's rows
  c.r_hi = c.r_lo + 8;
  c.box_rows = p.kv_tmap_valid != 0 ? h.tma_box_rows : 0;
  c.tma = c.box_rows > 0;

  const int32_t* cta_begin = reinterpret_cast<const int32_t*>(p.plan + h.cta_begin_offset);
  const WorkUnit* units = reinterpret_cast<const WorkUnit*>(p.plan + h.units_offset);
  const int u_begin = cta_begin[blockIdx.x], u_end = cta_begin[blockIdx.x + 1];

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(c.full(s), c.tma ? 1 : 128);
    mbar_init(c.p_ready(), 128);
    mbar_init(c.sums_ready(), 128);
    mbar_init(c.sums_free(), 128);
    mbar_init(c.p_free(), 128);
    if constexpr (kFp8) {
      for (int s = 0; s < kStages; ++s) mbar_init(c.conv(s), 128);
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  Producer<kFp8> producer(p, h, u_begin, u_end);
  if (c.wgi == 1) producer.prologue(p, c, units);

  StageState ring;  // tiles of this CTA consumed so far (both warpgroups count alike)
  Handoff sums;     // row-sum hand-offs so far (units with keys)
  int q_for = -1;   // warpgroup 0: unit whose Q is loaded or in flight

  for (int ui = u_begin; ui < u_end; ++ui) {
    const WorkUnit u = units[ui];
    const int n_tiles = key_tiles(u);
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    RowState rs;
    rs.lim[0] = row_limit(u, h, c.r_lo);
    rs.lim[1] = row_limit(u, h, c.r_hi);
    if (c.wgi == 0 && n_tiles > 0) open_unit(p, c, u, ui, q_for);

    for (int t = 0; t < n_tiles; ++t, ring.advance()) {
      if (c.wgi == 0) {
        uint32_t pa[4][4];
        float alpha[2];
        s_softmax<kFp8>(p, c, units, u, ui, u_end, t, n_tiles, ring, o, rs, q_for, pa, alpha);
        pv_from_registers(o, pa, alpha, c.kv(ring.stage()));
      } else {
        pv_from_shared<kFp8>(o, c, ring);
        if constexpr (kFp8) {
          producer.convert_next(c, units, ring.ahead(1));  // tile g + 1, under the P V
        } else {
          producer.resolve(c);  // pages 1-32: 0.90-0.94x the time of resolving after the barrier
        }
        wgmma_wait<0>();
        fence_regs(o);
        mbar_arrive(c.p_free());                   // P and the factors of tile g are read
        bar_sync(kStageFree + ring.stage(), 256);  // warpgroup 0 is done with the stage
        producer.load_next(p, c, units, ring);     // tile g + 2 into it
      }
    }

    if (c.wgi == 0 && n_tiles > 0) {  // the unit's last P V: done -> its stage is free
      wgmma_wait<0>();
      fence_regs(o);
      bar_arrive(kStageFree + ((ring.count - 1) & 1), 256);
    }
    epilogue(p, c, u, n_tiles, o, rs, sums);
  }
  if (c.wgi == 0) cp_async_wait<0>();
}

}  // namespace mla::cuda::absorbed::wg
