// Hopper (sm_90) asynchronous-copy primitives: shared-memory mbarriers (init, arrive with an
// expected transaction count, parity wait, cp.async-driven arrive), named barriers, and the
// bulk tensor copy (TMA) of a 2-D box from a tensor map into shared memory. Reusable by every
// sm90 kernel.
//
// Discipline:
//  - A barrier is initialised by one thread, followed by fence_mbarrier_init() and a block
//    barrier before any other thread or the copy engine uses it.
//  - Phase k of a barrier completes when its pending arrivals reach zero and the transaction
//    count is back to zero; a consumer of the k-th use waits with parity k & 1.
//  - TMA writes are visible to the threads that observed the phase completion (and to their
//    wgmma); shared memory written by cp.async or ordinary stores still needs
//    fence.proxy.async before the tensor cores read it.
//  - Named barrier ids 1..15 (0 is __syncthreads); a producer bar_arrive()s, a consumer
//    bar_sync()s, both with the same thread count (producers + consumers).
#pragma once

#include <cstdint>

namespace mla::cuda::sm90 {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also adds `bytes` to the transaction count the phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// One arrival (release: this thread's earlier writes are visible to a thread whose wait sees
// the phase complete).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Arrives on `bar` once every cp.async this thread issued so far has landed (the arrival is
// counted in the barrier's initial count: .noinc).
__device__ __forceinline__ void mbar_arrive_cp_async(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Non-blocking: true when the phase of the given parity has completed.
__device__ __forceinline__ bool mbar_test(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// TMA: the box at element coordinates (c0, c1) of the 2-D tensor map `tmap` (a generic address
// of a __grid_constant__ kernel parameter) into shared memory at `dst`; completes `bar`'s
// transaction count by the box's bytes. Coordinates outside the tensor read as zeros.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, int32_t c0, int32_t c1,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// TMA: the box at element coordinates (c0, c1, c2) of the 3-D tensor map `tmap` (e.g. a
// [tokens, heads, dim] tensor as dim, head, token) into shared memory at `dst`; completes `bar`'s
// transaction count by the box's bytes. Coordinates outside the tensor read as zeros.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* tmap, int32_t c0, int32_t c1,
                                            int32_t c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// TMA prefetch: the box at (c0, c1, c2) of the 3-D tensor map `tmap` into L2 (a hint: no
// shared memory, no barrier; coordinates outside the tensor are ignored).
__device__ __forceinline__ void tma_prefetch_3d(const void* tmap, int32_t c0, int32_t c1,
                                                int32_t c2) {
  asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];\n" ::"l"(
                   reinterpret_cast<uint64_t>(tmap)),
               "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}

__device__ __forceinline__ void prefetch_tensormap(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}

}  // namespace mla::cuda::sm90
