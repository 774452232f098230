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
#pragma once

#include "kernels/cuda/absorbed/sm90_common.cuh"
#include "kernels/cuda/sm90/tma.cuh"

namespace mla::cuda::absorbed::wg {

namespace ws {
inline constexpr int kQOff = 0;
inline constexpr int kKvOff = kTileBytes;
inline constexpr int kPOff = kKvOff + 2 * kTileBytes;  // bf16 [64 rows][64 keys], swizzled
inline constexpr int kAlphaOff = kPOff + kBlockBytes;  // float [64]: rescale factors of tile t
inline constexpr int kInvOff = kAlphaOff + 64 * 4;     // float [2][64]: 1 / row sum per unit
// mbarriers full[2], p_ready, sums_ready, sums_free, conv[2] (fp8: tile converted), p_free
inline constexpr int kBarOff = kInvOff + 2 * 64 * 4;
inline constexpr int kSmemBytes = kBarOff + 8 * 8 + 1024;  // + alignment slack
static_assert(kSmemBytes <= kSmemLimit, "exceeds the 227 KiB shared memory of one Hopper SM");

enum Barrier : int { kStageFree = 3 /* + stage */, kWg0 = 5, kWg1 = 6 };

// The producer's position: the next key tile of this CTA to load (tiles of its units in order,
// units without keys skipped).
struct Cursor {
  int ui, end;  // unit, one past the CTA's last unit
  int t, n;     // tile inside the unit, tiles of the unit
  int pool_row, kv_begin, kv_end;
  __device__ bool valid() const { return ui < end; }
};

__device__ __forceinline__ void cursor_seek(const WorkUnit* units, Cursor& c) {
  while (c.ui < c.end && c.t >= c.n) {
    if (++c.ui == c.end) break;
    const WorkUnit u = units[c.ui];
    c.t = 0;
    c.n = key_tiles(u);
    c.pool_row = u.pool_row;
    c.kv_begin = u.kv_begin;
    c.kv_end = u.kv_end;
  }
}

__device__ __forceinline__ void cursor_next(const WorkUnit* units, Cursor& c) {
  ++c.t;
  cursor_seek(units, c);
}

// The page-table entries (slots.cuh: load_entry) of the cursor's tile that this thread loads:
// TMA (box_rows > 0), thread tw < 64 / box_rows: of the first key of box tw; cp.async: of rows
// tw / 8 + 16 j (j < 4). Nothing here waits for the loads: resolve_slots uses them two tiles later.
__device__ __forceinline__ void fetch_entries(const SlotTable& st, const Cursor& c, int box_rows,
                                              int tw, int32_t (&ent)[4]) {
  if (!c.valid()) return;
  const int key0 = c.kv_begin + c.t * kBlockN;
  const int32_t* row = slot_row(st, c.pool_row);
  if (box_rows > 0) {
    if (tw * box_rows < kBlockN) ent[0] = load_entry(st, row, c.kv_end, key0 + box_rows * tw);
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) ent[j] = load_entry(st, row, c.kv_end, key0 + (tw >> 3) + 16 * j);
}

// The slots of those rows (-1 past kv_end, kSlotOutside outside the cache) from their entries.
__device__ __forceinline__ void resolve_slots(const SlotTable& st, const Cursor& c, int box_rows,
                                              int tw, const int32_t (&ent)[4], int32_t (&sl)[4]) {
  const int key0 = c.kv_begin + c.t * kBlockN;
  if (box_rows > 0) {
    if (tw * box_rows < kBlockN) sl[0] = resolve_slot(st, ent[0], c.kv_end, key0 + box_rows * tw);
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    sl[j] = resolve_slot(st, ent[j], c.kv_end, key0 + (tw >> 3) + 16 * j);
  }
}

// fp8: where the raw rows of a tile land inside its stage: the 64 bytes of column block b of
// key row r at b * kBlockBytes + kFp8RawOff + 64 r (the upper half of bf16 block b, which the
// conversion overwrites only after every thread has read that block).
inline constexpr int kFp8RawOff = kBlockBytes / 2;

// Loads the cursor's tile into the stage at k_tile, completing on the mbarrier `full`.
// bf16: the swizzled wgmma layout; fp8: raw rows as above (convert_fp8_tile makes them bf16).
template <bool kFp8>
__device__ __forceinline__ void issue_tile(const AbsorbedParams& p, const Cursor& c, int box_rows,
                                           int tw, const int32_t (&sl)[4], uint32_t k_tile,
                                           uint32_t full) {
  const int key0 = c.kv_begin + c.t * kBlockN;
  constexpr int kRowBytesPerBlock = kFp8 ? 64 : 128;  // bytes of one key row in a column block
  if (box_rows > 0) {
    const int boxes = min(kBlockN / box_rows, (c.kv_end - key0 + box_rows - 1) / box_rows);
    const int box_bytes = box_rows * kRowBytesPerBlock;
    if (tw == 0) mbar_arrive_expect_tx(full, static_cast<uint32_t>(boxes * kBlocks * box_bytes));
    if (tw < boxes) {
      // A box whose slot lies outside the cache reads as zeros (and still counts its bytes).
      const uint32_t dst = k_tile + (kFp8 ? kFp8RawOff : 0) + tw * box_bytes;
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        tma_load_2d(dst + b * kBlockBytes, p.kv_tmap, 64 * b, sl[0], full);
      }
    }
    return;
  }
  const int chunk = tw & 7;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int r = (tw >> 3) + 16 * j;
    const bool valid = sl[j] >= 0;
    if constexpr (kFp8) {
      // 36 chunks of 16 bytes per row, chunks chunk + 8 i of this thread.
      const unsigned char* src =
          valid ? p.kv_cache_fp8 + static_cast<int64_t>(sl[j]) * kDimQk : p.kv_cache_fp8;
#pragma unroll
      for (int i = 0; i < 5; ++i) {
        const int k = chunk + 8 * i;
        if (k < kDimQk / 16) {
          cp_async_16(k_tile + (k >> 2) * kBlockBytes + kFp8RawOff + r * 64 + (k & 3) * 16,
                      src + (valid ? 16 * k : 0), valid);
        }
      }
    } else {
      const uint16_t* src = valid ? p.kv_cache + static_cast<int64_t>(sl[j]) * kDimQk : p.kv_cache;
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        cp_async_16(k_tile + b * kBlockBytes + sw128_offset(r, chunk),
                    src + (valid ? 64 * b + 8 * chunk : 0), valid);
      }
    }
  }
  mbar_arrive_cp_async(full);
}

// fp8: once the raw tile of cursor c has landed in `stage` (mbarrier full, phase parity), the
// 128 threads of warpgroup 1 (tw) convert it to the bf16 wgmma layout in place, block by block
// (each block's raw bytes are read into registers before a warpgroup barrier, then written as
// bf16), rows at or past kv_end as zeros; then fence for the tensor cores and arrive on `conv`.
// The bf16 values are the cache's times 2^-120 (fp8x8_to_bf16x8_scaled: three integer
// instructions per two values); the logits get 2^120 back through p.scale_log2 and P V through
// P, which warpgroup 0 stores times 2^120 (so O and the row sums are those of a bf16 cache).
__device__ __forceinline__ void convert_fp8_tile(unsigned char* stage, const Cursor& c,
                                                 uint32_t full, uint32_t conv, uint32_t parity,
                                                 int tw) {
  mbar_wait(full, parity);
  const int valid_rows = c.kv_end - (c.kv_begin + c.t * kBlockN);
  const int row = tw >> 1, half = tw & 1;  // 32 bytes of one row of a block per thread
  // Rows past kv_end convert zero bytes (fp8 0 is bf16 0): a mask on the raw words instead of
  // a branch around each conversion.
  const uint32_t keep = row < valid_rows ? 0xffffffffu : 0u;
  const unsigned char* raw = stage + kFp8RawOff + row * 64 + half * 32;
  const auto masked = [keep](uint4 v) {
    return make_uint4(v.x & keep, v.y & keep, v.z & keep, v.w & keep);
  };
  uint4 cur0 = masked(*reinterpret_cast<const uint4*>(raw));
  uint4 cur1 = masked(*reinterpret_cast<const uint4*>(raw + 16));
#pragma unroll
  for (int b = 0; b < kBlocks; ++b) {
    bar_sync(kWg1, 128);  // every thread has read block b's raw bytes
    uint4 nxt0 = make_uint4(0, 0, 0, 0), nxt1 = make_uint4(0, 0, 0, 0);
    if (b + 1 < kBlocks) {
      nxt0 = masked(*reinterpret_cast<const uint4*>(raw + (b + 1) * kBlockBytes));
      nxt1 = masked(*reinterpret_cast<const uint4*>(raw + (b + 1) * kBlockBytes + 16));
    }
    unsigned char* dst = stage + b * kBlockBytes;
    const int c0 = 4 * half;
    *reinterpret_cast<uint4*>(dst + sw128_offset(row, c0 + 0)) =
        fp8x8_to_bf16x8_scaled(make_uint2(cur0.x, cur0.y));
    *reinterpret_cast<uint4*>(dst + sw128_offset(row, c0 + 1)) =
        fp8x8_to_bf16x8_scaled(make_uint2(cur0.z, cur0.w));
    *reinterpret_cast<uint4*>(dst + sw128_offset(row, c0 + 2)) =
        fp8x8_to_bf16x8_scaled(make_uint2(cur1.x, cur1.y));
    *reinterpret_cast<uint4*>(dst + sw128_offset(row, c0 + 3)) =
        fp8x8_to_bf16x8_scaled(make_uint2(cur1.z, cur1.w));
    cur0 = nxt0;
    cur1 = nxt1;
  }
  fence_proxy_async();  // the bf16 stores -> the tensor cores of both warpgroups
  mbar_arrive(conv);
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
  // Broadcast from lane 0 so the compiler sees a warp-uniform role: a wgmma in a path it
  // cannot prove uniform is serialised (ptxas C7518).
  const int wgi = __shfl_sync(0xffffffffu, tid >> 7, 0), tw = tid & 127;
  const int w = tw >> 5, lane = tid & 31;
  const int r_lo = 16 * w + (lane >> 2), r_hi = r_lo + 8;  // this thread's rows
  const uint32_t base = smem_u32(smem);
  const uint32_t q_s = base + kQOff, kv_s = base + kKvOff, p_s = base + kPOff;
  const uint32_t full0 = base + kBarOff;  // full[s] at full0 + 8 s
  const uint32_t p_ready = full0 + 16, sums_ready = full0 + 24, sums_free = full0 + 32;
  const uint32_t conv0 = full0 + 40;  // fp8: conv[s] at conv0 + 8 s
  const uint32_t p_free = full0 + 56;
  float* alpha_s = reinterpret_cast<float*>(smem + kAlphaOff);
  float* inv_s = reinterpret_cast<float*>(smem + kInvOff);
  const uint64_t desc_k0 = desc_k_sw128(0), desc_mn0 = desc_mn_sw128(0, kBlockBytes);
  const int box_rows = p.kv_tmap_valid != 0 ? h.tma_box_rows : 0;  // 0: cp.async
  const bool tma = box_rows > 0;

  const int32_t* cta_begin = reinterpret_cast<const int32_t*>(p.plan + h.cta_begin_offset);
  const WorkUnit* units = reinterpret_cast<const WorkUnit*>(p.plan + h.units_offset);
  const int u_begin = cta_begin[blockIdx.x], u_end = cta_begin[blockIdx.x + 1];

  if (tid == 0) {
    mbar_init(full0, tma ? 1 : 128);
    mbar_init(full0 + 8, tma ? 1 : 128);
    mbar_init(p_ready, 128);
    mbar_init(sums_ready, 128);
    mbar_init(sums_free, 128);
    mbar_init(p_free, 128);
    if constexpr (kFp8) {
      mbar_init(conv0, 128);
      mbar_init(conv0 + 8, 128);
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  // Producer prologue: tiles 0 and 1 of the CTA; then tile 2 (cur) is the next to load and the
  // page-table entries of tiles 2 (el) and 3 (en, cursor nx) are in flight. In the loop, loading
  // tile g + 2 resolves its slots from entries loaded two tiles earlier (no wait on a table
  // load) and issues the entry loads of tile g + 4.
  Cursor cur{u_begin, u_end, 0, 0, 0, 0, 0};
  Cursor cv = cur;                                     // fp8, warpgroup 1: the next tile to convert
  Cursor nx = cur;                                     // the tile after cur
  int32_t sl[4] = {-1, -1, -1, -1};                    // slots of the tile being loaded
  int32_t el[4] = {0, 0, 0, 0}, en[4] = {0, 0, 0, 0};  // table entries of cur and nx
  const SlotTable st = make_slot_table(p, h.page_size);
  if (wgi == 1) {
    if (tma && tw == 0) prefetch_tensormap(p.kv_tmap);
    if (cur.valid()) {
      const WorkUnit u = units[cur.ui];
      cur.n = key_tiles(u);
      cur.pool_row = u.pool_row;
      cur.kv_begin = u.kv_begin;
      cur.kv_end = u.kv_end;
      cursor_seek(units, cur);
    }
    cv = cur;
    for (int i = 0; i < 2 && cur.valid(); ++i) {
      fetch_entries(st, cur, box_rows, tw, el);
      resolve_slots(st, cur, box_rows, tw, el, sl);
      issue_tile<kFp8>(p, cur, box_rows, tw, sl, kv_s + i * kTileBytes, full0 + 8 * i);
      cursor_next(units, cur);
    }
    fetch_entries(st, cur, box_rows, tw, el);
    nx = cur;
    if (nx.valid()) cursor_next(units, nx);
    fetch_entries(st, nx, box_rows, tw, en);
    if constexpr (kFp8) {  // tile 0 of the CTA
      if (cv.valid()) {
        convert_fp8_tile(smem + kKvOff, cv, full0, conv0, 0, tw);
        ++cv.t;
        cursor_seek(units, cv);
      }
    }
  }

  int g = 0;       // tiles of this CTA consumed so far (both warpgroups count alike)
  int xc = 0;      // row-sum exchanges so far (units with keys)
  int q_for = -1;  // warpgroup 0: unit whose Q is loaded or in flight
  const float ln2 = 0.69314718055994530942f;

  for (int ui = u_begin; ui < u_end; ++ui) {
    const WorkUnit u = units[ui];
    const int n_tiles = key_tiles(u);
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const int lim[2] = {row_limit(u, h, r_lo), row_limit(u, h, r_hi)};
    if (wgi == 0 && n_tiles > 0) {
      if (q_for != ui) {
        load_q<128>(p, u, q_s, tw);
        cp_async_commit();
      }
      cp_async_wait<0>();
      fence_proxy_async();
      bar_sync(kWg0, 128);
    }

    for (int t = 0; t < n_tiles; ++t, ++g) {
      const int s = g & 1;
      const uint32_t parity = (g >> 1) & 1;
      const uint32_t k_tile = kv_s + s * kTileBytes, full = full0 + 8 * s;
      const int key0 = u.kv_begin + t * kBlockN;
      if (wgi == 0) {
        // The next unit (its Q is fetched once this tile's S is done): read before the wait.
        WorkUnit nu{};
        if (t == n_tiles - 1 && ui + 1 < u_end) nu = units[ui + 1];
        // P V of tile g - 1 done -> its stage is free (tile g + 1 is issued into it) before this
        // warpgroup waits for tile g to land, so consecutive loads never chain on each other.
        // Unconditional (a no-op at a unit's first tile): ptxas serialises every wgmma of a
        // kernel that waits for them on a path it cannot prove uniform (C7518).
        wgmma_wait<0>();
        fence_regs(o);
        if (t > 0) bar_arrive(kStageFree + (s ^ 1), 256);
        mbar_wait(kFp8 ? conv0 + 8 * s : full, parity);
        if (!kFp8 && tma && u.kv_end - key0 < kBlockN) {
          // Rows past kv_end hold other slots' rows (or stale data): zero them so 0 * NaN
          // cannot reach O.
          const int valid = u.kv_end - key0;
          for (int c = tw; c < (kBlockN - valid) * 72; c += 128) {
            const int r = valid + c / 72, ch = c % 72;
            *reinterpret_cast<uint4*>(smem + kKvOff + s * kTileBytes + (ch >> 3) * kBlockBytes +
                                      r * 128 + (ch & 7) * 16) = make_uint4(0, 0, 0, 0);
          }
          fence_proxy_async();
          bar_sync(kWg0, 128);
        }
        fence_proxy_async();  // cp.async rows (generic proxy) -> wgmma

        // compute_qk: S[64 rows x 64 keys] over 576 dims.
        float sc[32];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kDimQk / 16; ++kk) {
          const uint32_t koff = (kk >> 2) * kBlockBytes + (kk & 3) * 32;
          wgmma_ss_bf16<64, 0>(sc, desc_k0 + ((q_s + koff) >> 4), desc_k0 + ((k_tile + koff) >> 4),
                               kk > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(sc);
        if (t == n_tiles - 1 && nu.kv_end > nu.kv_begin) {  // Q is free: fetch the next unit's
          load_q<128>(p, nu, q_s, tw);
          cp_async_commit();
          q_for = ui + 1;
        }

        // online_softmax: scale, mask, row maxima over the quad (it holds the row's 64 keys).
        float tmax[2];
        scale_mask_max<8>(sc, key0, lane, lim, p.scale_log2, tmax);
        float alpha[2], m_use[2];
        softmax_rescale(m, l, tmax, alpha, m_use);
        // P as the A fragments of m64n256k16 (k-step ks = keys 16 ks .. +16): a[0] / a[1] rows
        // lo / hi at keys 16 ks + 2 q, a[2] / a[3] the same at + 8 (q = lane % 4).
        uint32_t pa[4][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float4 pr =
              softmax_probs(sc[4 * j + 0], sc[4 * j + 1], sc[4 * j + 2], sc[4 * j + 3], m_use, l);
          pa[j >> 1][(j & 1) * 2 + 0] = pack_bf16(pr.x, pr.y);
          pa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(pr.z, pr.w);
        }
        if constexpr (kFp8) {  // P times 2^120 against the tile's values times 2^-120
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) pa[j][i] = bf16x2_times_2p120(pa[j][i]);
        }
        if (g > 0) mbar_wait(p_free, (g - 1) & 1);  // warpgroup 1 is done with P / factors of g - 1
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t byte = (lane & 3) * 4;
          *reinterpret_cast<uint32_t*>(smem + kPOff + sw128_offset(r_lo, j) + byte) =
              pa[j >> 1][(j & 1) * 2 + 0];
          *reinterpret_cast<uint32_t*>(smem + kPOff + sw128_offset(r_hi, j) + byte) =
              pa[j >> 1][(j & 1) * 2 + 1];
        }
        if ((lane & 3) == 0) {
          alpha_s[r_lo] = alpha[0];
          alpha_s[r_hi] = alpha[1];
        }
        fence_proxy_async();  // P stores -> visible to warpgroup 1's wgmma
        mbar_arrive(p_ready);

        // compute_pv: O[:, 0:256] += P . V[:, 0:256], P from registers.
        rescale_o(o, alpha[0], alpha[1]);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < kBlockN / 16; ++ks) {
          wgmma_rs_bf16<256, 1>(o, pa[ks], desc_mn0 + ((k_tile + ks * 2048) >> 4), true);
        }
        wgmma_commit();
      } else {
        mbar_wait(p_ready, g & 1);
        mbar_wait(kFp8 ? conv0 + 8 * s : full, parity);
        fence_proxy_async();
        rescale_o(o, alpha_s[r_lo], alpha_s[r_hi]);
        // compute_pv: O[:, 256:512] += P . V[:, 256:512], P from shared memory.
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < kBlockN / 16; ++ks) {
          wgmma_ss_bf16<256, 1>(o, desc_k0 + ((p_s + ks * 32) >> 4),
                                desc_mn0 + ((k_tile + 4 * kBlockBytes + ks * 2048) >> 4), true);
        }
        wgmma_commit();
        // bf16: the slots of tile g + 2 from its entries (loaded two tiles ago) while the P V
        // runs, so the stage-free barrier is followed by the loads alone (pages 1-32: 0.90-0.94x
        // the time of resolving after it). fp8 resolves after the barrier: early, before the
        // conversion, it was 1.03-1.07x slower at pages 1-32 (H200, 2026-12-04).
        if (!kFp8 && cur.valid()) resolve_slots(st, cur, box_rows, tw, el, sl);
        if constexpr (kFp8) {  // tile g + 1 (issued one tile ago) into bf16 in its stage
          if (cv.valid()) {
            const int s1 = (g + 1) & 1;
            convert_fp8_tile(smem + kKvOff + s1 * kTileBytes, cv, full0 + 8 * s1, conv0 + 8 * s1,
                             ((g + 1) >> 1) & 1, tw);
            ++cv.t;
            cursor_seek(units, cv);
          }
        }
        wgmma_wait<0>();
        fence_regs(o);
        mbar_arrive(p_free);            // P and the factors of tile g are read
        bar_sync(kStageFree + s, 256);  // warpgroup 0 is done with stage s: load tile g + 2
        if (cur.valid()) {
          if constexpr (kFp8) resolve_slots(st, cur, box_rows, tw, el, sl);
          issue_tile<kFp8>(p, cur, box_rows, tw, sl, k_tile, full);
          cur = nx;
#pragma unroll
          for (int j = 0; j < 4; ++j) el[j] = en[j];
          if (nx.valid()) cursor_next(units, nx);
          fetch_entries(st, nx, box_rows, tw, en);
        }
      }
    }

    if (wgi == 0 && n_tiles > 0) {  // the unit's last P V: done -> its stage is free
      wgmma_wait<0>();
      fence_regs(o);
      bar_arrive(kStageFree + ((g - 1) & 1), 256);
    }

    // write_o: row sums (warpgroup 0 holds them) published through shared memory.
    float inv[2] = {0.f, 0.f}, lse[2] = {-INFINITY, -INFINITY};
    if (n_tiles > 0) {
      float* x = inv_s + (xc & 1) * 64;
      if (wgi == 0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
          l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
          inv[i] = l[i] > 0.f ? p.o_scale / l[i] : 0.f;  // o_scale: k_scale (fp8) or 1
          lse[i] = l[i] > 0.f ? (m[i] + log2f(l[i])) * ln2 : -INFINITY;
        }
        if (xc > 0) mbar_wait(sums_free, (xc - 1) & 1);  // the previous unit's sums were read
        if ((lane & 3) == 0) {
          x[r_lo] = inv[0];
          x[r_hi] = inv[1];
        }
        mbar_arrive(sums_ready);
      } else {
        mbar_wait(sums_ready, xc & 1);
        inv[0] = x[r_lo];
        inv[1] = x[r_hi];
        mbar_arrive(sums_free);
      }
      ++xc;
    }
    write_o(p, u, o, inv, lse, r_lo, wgi * 256 + 2 * (lane & 3), wgi == 0 && (lane & 3) == 0);
  }
  if (wgi == 0) cp_async_wait<0>();
}

}  // namespace mla::cuda::absorbed::wg
