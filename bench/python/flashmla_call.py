"""Host cost of one call of mla's FlashMLA form (a benchmark, not a test).

Per call, median and min wall time (time.perf_counter_ns, benchlib.time_us) of
  absorbed_run_op:   torch.ops.mla.absorbed_run on a plan made beforehand, into preallocated
                     out and lse (the op alone: its checks and the kernel)
  flash_mla_with_kvcache:  mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens,
                     512, meta, causal=True) with a metadata object already planned (what every
                     layer after the first pays; it allocates out and lse, as FlashMLA does)
  first_call:        mla.get_mla_metadata() and its first flash_mla_with_kvcache call (what the
                     first layer of each step pays: the plan)
  wrapper_only:      flash_mla_with_kvcache with the run op replaced by a no-op: the Python
                     wrapper's own host cost per layer (checks, outputs, the lse fix-up), which
                     on a GPU adds to the op's launch, not to a cpu kernel's time
for small problems (b, s_q, h_q) with a few keys per request, so that the host's work, not the
kernel's, sets the time. On the cpu the kernel runs on the host too: the op row is the floor.
Prints JSON lines (benchlib.write_rows). Usage: python flashmla_call.py [--device cpu|cuda]
[--keys 64] [--commit X]
"""
import argparse
import pathlib
import sys

import torch

import mla

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ITERS, WARMUP = 2000, 200
SHAPES = ((1, 1, 16), (4, 4, 16))  # (b, s_q, h_q), the small problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--keys", type=int, default=64)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    dev, P, keys = torch.device(args.device), args.page_size, args.keys
    g = torch.Generator().manual_seed(0)
    rows = []
    for b, s_q, h in SHAPES:
        blocks = -(-keys // P)
        q = (torch.randn(b, s_q, h, 576, generator=g) * 0.5).to(torch.bfloat16).to(dev)
        k_cache = (torch.randn(b * blocks + 1, P, 1, 576, generator=g) * 0.5).to(
            torch.bfloat16).to(dev)
        block_table = (torch.arange(b * blocks, dtype=torch.int32) + 1).view(b, blocks).to(dev)
        seqlens = torch.full((b,), keys, dtype=torch.int32, device=dev)
        meta, _ = mla.get_mla_metadata()
        mla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, 512, meta, causal=True)
        plan = meta.plan
        o = torch.empty(b * s_q, h, 512, dtype=torch.bfloat16, device=dev)
        lse = torch.empty(b * s_q, h, dtype=torch.float32, device=dev)
        q_rows, cache_rows = q.view(b * s_q, h, 576), k_cache.view(-1, 576)
        scale = 576 ** -0.5

        def op_call():
            torch.ops.mla.absorbed_run(q_rows, cache_rows, None, plan.plan_tensor, plan.workspace,
                                       o, lse, scale, 1.0, block_table)

        def layer_call():
            mla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, 512, meta, causal=True)

        def first_call():
            m, _ = mla.get_mla_metadata()
            mla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, 512, m, causal=True)

        real_ops = mla.ops.ops

        class _NoRun:  # the op library with absorbed_run a no-op (wrapper_only)
            def __getattr__(self, name):
                return (lambda *a: None) if name == "absorbed_run" else getattr(real_ops, name)

        def wrapper_only():
            mla.ops.ops = _NoRun()
            try:
                layer_call()
            finally:
                mla.ops.ops = real_ops

        for name, fn in (("absorbed_run_op", op_call), ("flash_mla_with_kvcache", layer_call),
                         ("first_call", first_call), ("wrapper_only", wrapper_only)):
            med, mn = benchlib.time_us(fn, ITERS, warmup=WARMUP)  # host time
            if dev.type == "cuda":
                torch.cuda.synchronize()
            row = {"op": "flashmla_call", "what": name, "b": b, "s_q": s_q, "h_q": h,
                   "keys": keys, "page_size": P, "device": str(dev), "us": med, "us_min": mn,
                   "iters": ITERS}
            row.update(benchlib.run_fields(dev, args.commit))
            rows.append(row)
    benchlib.write_rows(rows)


if __name__ == "__main__":
    main()
