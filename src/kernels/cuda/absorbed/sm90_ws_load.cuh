// The loads of the absorbed sm90 kernel (sm90_ws.cuh): the producer's cursor over a CTA's key
// tiles, the page-table entries and slots of a tile (slots.cuh), the tile's copy into a stage
// (TMA boxes or cp.async gathers), the fp8 conversion in the stage, and the Producer role
// (warpgroup 1) that runs them two tiles ahead of the tensor work.
#pragma once

#include "kernels/cuda/absorbed/sm90_ws_traits.cuh"
#include "kernels/cuda/sm90/tma.cuh"

namespace mla::cuda::absorbed::wg::ws {

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

// The producer role (warpgroup 1): it loads tile g + 2 into stage g % 2 once both warpgroups are
// done with tile g there, and (fp8) converts tile g + 1 while its own P V of tile g runs. Its
// state: cur, the next tile to load, and nx, the one after it; the slots of cur (sl), resolved
// from page-table entries loaded two tiles earlier (el: of cur, en: of nx), so no thread waits on
// a table load; cv, the next tile to convert (fp8).
template <bool kFp8>
struct Producer {
  Cursor cur, nx, cv;
  int32_t sl[4] = {-1, -1, -1, -1};
  int32_t el[4] = {0, 0, 0, 0}, en[4] = {0, 0, 0, 0};
  SlotTable st;

  __device__ __forceinline__ Producer(const AbsorbedParams& p, const PlanHeader& h, int u_begin,
                                      int u_end)
      : cur{u_begin, u_end, 0, 0, 0, 0, 0}, nx(cur), cv(cur), st(make_slot_table(p, h.page_size)) {}

  // Tiles 0 and 1 of the CTA into stages 0 and 1; then tile 2 is the next to load and the entries
  // of tiles 2 (el) and 3 (en) are in flight; fp8: tile 0 converted.
  __device__ __forceinline__ void prologue(const AbsorbedParams& p, const Cta& c,
                                           const WorkUnit* units) {
    if (c.tma && c.tw == 0) prefetch_tensormap(p.kv_tmap);
    if (cur.valid()) {
      const WorkUnit u = units[cur.ui];
      cur.n = key_tiles(u);
      cur.pool_row = u.pool_row;
      cur.kv_begin = u.kv_begin;
      cur.kv_end = u.kv_end;
      cursor_seek(units, cur);
    }
    cv = cur;
    for (int i = 0; i < kStages && cur.valid(); ++i) {
      fetch_entries(st, cur, c.box_rows, c.tw, el);
      resolve_slots(st, cur, c.box_rows, c.tw, el, sl);
      issue_tile<kFp8>(p, cur, c.box_rows, c.tw, sl, c.kv(i), c.full(i));
      cursor_next(units, cur);
    }
    fetch_entries(st, cur, c.box_rows, c.tw, el);
    nx = cur;
    if (nx.valid()) cursor_next(units, nx);
    fetch_entries(st, nx, c.box_rows, c.tw, en);
    if constexpr (kFp8) convert_next(c, units, StageState{0});
  }

  // The slots of the next tile to load, from its entries (bf16: under the P V, so the stage-free
  // barrier is followed by the loads alone).
  __device__ __forceinline__ void resolve(const Cta& c) {
    if (cur.valid()) resolve_slots(st, cur, c.box_rows, c.tw, el, sl);
  }

  // fp8: the next tile to convert (the one in stage `at`, issued a tile ago) into bf16 in place.
  __device__ __forceinline__ void convert_next(const Cta& c, const WorkUnit* units, StageState at) {
    if (!cv.valid()) return;
    convert_fp8_tile(c.kv_ptr(at.stage()), cv, c.full(at.stage()), c.conv(at.stage()), at.phase(),
                     c.tw);
    ++cv.t;
    cursor_seek(units, cv);
  }

  // The next tile into stage `at` (free: both warpgroups are done with it), then the cursors and
  // entries move on by one tile. fp8 resolves its slots here: early, before the conversion, it was
  // 1.03-1.07x slower at pages 1-32 (H200, 2026-12-04).
  __device__ __forceinline__ void load_next(const AbsorbedParams& p, const Cta& c,
                                            const WorkUnit* units, StageState at) {
    if (!cur.valid()) return;
    if constexpr (kFp8) resolve_slots(st, cur, c.box_rows, c.tw, el, sl);
    issue_tile<kFp8>(p, cur, c.box_rows, c.tw, sl, c.kv(at.stage()), c.full(at.stage()));
    cur = nx;
#pragma unroll
    for (int j = 0; j < 4; ++j) el[j] = en[j];
    if (nx.valid()) cursor_next(units, nx);
    fetch_entries(st, nx, c.box_rows, c.tw, en);
  }
};

}  // namespace mla::cuda::absorbed::wg::ws
