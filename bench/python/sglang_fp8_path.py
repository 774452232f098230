"""What an fp8 latent cache costs per layer call on SGLang's flashinfer MLA path, beside mla's fp8
decode straight from the same cache (issue 32 item 3; a benchmark, not a test).

SGLang 0.5.23's flashinfer MLA backend reads an fp8 pool by converting the layer's WHOLE pool to
bf16 on every call (`get_key_buffer(layer_id).to(q.dtype)` in flashinfer_mla_backend.py), then
runs a bf16 decode on the copy. Per shape (b, s_q, h_q, s_k), one pool of `pool_tokens` fp8 rows
(default: twice the batch's keys; the engine sizes its pool to the GPU's free memory, so pass
--pool-tokens for that), timed with CUDA events on cuda (host wall time on the cpu):
  sglang_flashinfer_fp8_path: pool.to(bf16) of the whole pool, then a bf16 decode on the copy
                              (mla's bf16 decode stands in for flashinfer's)
  pool_to_bf16:               the conversion alone
  mla_fp8_decode:             mla's fp8 decode on the fp8 pool itself (no copy)
  mla_bf16_decode:            mla's bf16 decode on a bf16 pool (the bf16 cache a user would
                              otherwise keep)
All decodes go through mla.flash_mla_with_kvcache (block table, page --page-size). Prints JSON
lines (benchlib.write_rows). Usage: python sglang_fp8_path.py [--device cpu|cuda] [--quick]
[--pool-tokens N] [--page-size 64] [--iters 20] [--commit X]
"""
import argparse
import pathlib
import sys

import torch

import mla

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import benchlib  # noqa: E402

SHAPES = ((128, 1, 16, 8192), (128, 1, 128, 8192), (64, 1, 16, 16384))  # (b, s_q, h_q, s_k)
QUICK = ((2, 1, 16, 256),)  # the cpu smoke run (tests/python/test_benchlib.py)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--pool-tokens", type=int, default=0)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    dev, P = torch.device(args.device), args.page_size
    cuda = dev if dev.type == "cuda" else None
    k_scale, scale = 0.02, 576 ** -0.5
    rows = []
    for b, s_q, h, s_k in (QUICK if args.quick else SHAPES):
        g = torch.Generator().manual_seed(b * 7 + h + s_k)
        blocks = -(-s_k // P)
        pool_tokens = max(args.pool_tokens, 2 * b * blocks * P)
        num_pages = -(-pool_tokens // P)
        # The batch's pages, spread over the pool (shuffled), page 0 never used.
        pages = (torch.randperm(num_pages - 1, generator=g)[:b * blocks] + 1).to(torch.int32)
        block_table = pages.view(b, blocks).to(dev)
        seqlens = torch.full((b,), s_k, dtype=torch.int32, device=dev)
        q = (torch.randn(b, s_q, h, 576, generator=g) * 0.5).to(torch.bfloat16).to(dev)
        pool = torch.empty(num_pages, P, 1, 576, dtype=torch.float8_e4m3fn, device=dev)
        for i in range(0, num_pages, 256):  # filled in pieces (a large pool on the host)
            n = min(256, num_pages - i)
            pool[i:i + n] = (torch.randn(n, P, 1, 576, generator=g) * 0.5 / k_scale).clamp(
                -448, 448).to(torch.float8_e4m3fn).to(dev)
        pool_bf16 = pool.to(torch.bfloat16)
        meta_fp8, _ = mla.get_mla_metadata()
        meta_bf16, _ = mla.get_mla_metadata()

        def mla_fp8():
            mla.flash_mla_with_kvcache(q, pool, block_table, seqlens, 512, meta_fp8,
                                       softmax_scale=scale, causal=True, k_scale=k_scale)

        def mla_bf16():
            mla.flash_mla_with_kvcache(q, pool_bf16, block_table, seqlens, 512, meta_bf16,
                                       softmax_scale=scale, causal=True)

        def to_bf16():
            return pool.to(torch.bfloat16)

        def flashinfer_path():
            copy = pool.to(torch.bfloat16)
            mla.flash_mla_with_kvcache(q, copy, block_table, seqlens, 512, meta_bf16,
                                       softmax_scale=scale, causal=True)

        for name, fn in (("sglang_flashinfer_fp8_path", flashinfer_path),
                         ("pool_to_bf16", to_bf16), ("mla_fp8_decode", mla_fp8),
                         ("mla_bf16_decode", mla_bf16)):
            med, mn = benchlib.time_us(fn, args.iters, warmup=3, cuda_device=cuda)
            row = {"op": "sglang_fp8_path", "what": name, "b": b, "s_q": s_q, "h_q": h,
                   "s_k": s_k, "page_size": P, "pool_tokens": num_pages * P,
                   "device": str(dev), "us": med, "us_min": mn, "iters": args.iters}
            row.update(benchlib.run_fields(dev, args.commit))
            rows.append(row)
        del pool, pool_bf16
    benchlib.write_rows(rows)


if __name__ == "__main__":
    main()
