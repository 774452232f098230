// Device helpers shared by every CUDA kernel of the library (with tma.cuh: mbarriers, named
// barriers, TMA; wgmma.cuh: the wgmma wrappers and shared-memory descriptors). Kernel bodies
// call these and carry no inline PTX of their own.
//   cp.async: 16-byte copies global -> shared with zero fill, groups, waits;
//   conversions: two floats -> bf16x2, eight fp8 e4m3 -> bf16 x 2^-120 (exact), exp2 (ftz).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace mla::cuda::sm90 {

// 16 bytes from global `src` to shared `dst`; !valid: zero-fill the 16 bytes (src unread).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Two floats -> bf16x2 (round to nearest even), lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// bf16x2 (lo in the low half) -> two floats, exact.
__device__ __forceinline__ float2 unpack_bf16(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

// Eight e4m3 values (a uint2, low byte first) -> eight bf16 (a uint4) holding each value times
// 2^-120 (kFp8Bf16Exp2), exact for every finite e4m3 code. The e4m3 bits (sign, 4 exponent, 3
// mantissa bits, bias 7) placed in a bf16 (sign, 8, 7, bias 127) with the exponent at bits 10..7
// and the mantissa at bits 6..4 read as the value times 2^(7 - 127); an e4m3 subnormal lands on
// a bf16 subnormal with the same factor. Per two values: one byte permute that sign-extends
// each byte to 16 bits, then a shift and a mask (the sign stays at bit 15, bits 14..11 cleared):
// three integer instructions, no multiply (the caller folds 2^120 into its fp32 scales). The two
// NaN codes 0x7f / 0xff read as +-480 * 2^-120.
inline constexpr int kFp8Bf16Exp2 = -120;
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(d) : "r"(a), "r"(sel));
  return d;
}
__device__ __forceinline__ uint4 fp8x8_to_bf16x8_scaled(uint2 raw) {
  // Selector nibbles 8 + i replicate the sign of byte i: 0x9180 -> [sign b1, b1, sign b0, b0].
  uint4 v;
  v.x = (prmt(raw.x, 0x9180u) << 4) & 0x87f087f0u;
  v.y = (prmt(raw.x, 0xb3a2u) << 4) & 0x87f087f0u;
  v.z = (prmt(raw.y, 0x9180u) << 4) & 0x87f087f0u;
  v.w = (prmt(raw.y, 0xb3a2u) << 4) & 0x87f087f0u;
  return v;
}

// Two bf16 (a bf16x2) times 2^120, exact for every finite bf16 whose product is finite (the
// probabilities P of an fp8 tile: in [0, 1]).
__device__ __forceinline__ uint32_t bf16x2_times_2p120(uint32_t two) {
  __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&two);
  v = __hmul2(v, __nv_bfloat162(__float2bfloat16_rn(0x1p120f), __float2bfloat16_rn(0x1p120f)));
  return *reinterpret_cast<uint32_t*>(&v);
}

// 2^x, flushing denormal results to zero (one MUFU.EX2).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Warp-specialised register budgets: the executing warpgroup's per-thread register count is
// lowered (dec) or raised (inc, waits until the registers are free) to kRegs (a multiple of 8 in
// 24 .. 256). Every warp of the warpgroup executes it.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Brings the cache line of global address `p` into L1 (a hint).
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p));
}

}  // namespace mla::cuda::sm90
