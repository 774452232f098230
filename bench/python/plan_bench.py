"""Host time of planning a batch-256 decode from Python (a benchmark, not a test).

Measures, per call, the median wall time of
  op:    torch.ops.mla.absorbed_plan on host int32 tensors: the host planner writes into the op
         library's pinned staging ring (waiting on the buffer's event first), the upload is
         enqueued on the current stream and the buffer's event recorded after it (cuda); on the
         cpu the planner writes straight into the plan tensor
  plan:  mla.ops.AbsorbedPlan.plan from host tensors (the above + the Python wrapper)
Timing and rows through benchlib (host clock: time.perf_counter_ns around each call, the
median of 2000 after 200 warm-up calls); prints JSON lines (one per measurement) in the
bench/results/h200.jsonl row format, with benchlib.run_fields (date, commit, gpu, torch, python).
Usage: python plan_bench.py [--device cuda] [--heads 128] [--page-size 64] [--commit X]
"""
import argparse
import pathlib
import sys

import torch

from mla import ops

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ITERS, WARMUP = 2000, 200


def parse_args():
    """The batch-256 decode's arguments (shared with plan_sglang.py)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--commit", default="")
    return ap.parse_args()


def main():
    args = parse_args()
    dev = torch.device(args.device)
    bs = args.batch
    g = torch.Generator().manual_seed(0)
    rows = torch.randperm(bs, generator=g).to(torch.int32) + 1
    q_lens = torch.ones(bs, dtype=torch.int32)
    kv_lens = torch.randint(1, 4096, (bs,), generator=g, dtype=torch.int32)
    plan = ops.AbsorbedPlan(dev, args.heads, args.page_size, max_batch=bs, max_q_tokens=bs)
    handle = plan._staging.handle

    def op_call():
        torch.ops.mla.absorbed_plan(rows, q_lens, kv_lens, handle, plan.plan_tensor,
                                    args.heads, args.page_size, True, bs, bs, 1)

    def plan_call():
        plan.plan(rows, q_lens, kv_lens)

    rows_out = []
    for name, fn in (("absorbed_plan_op", op_call), ("AbsorbedPlan.plan", plan_call)):
        med, mn = benchlib.time_us(fn, ITERS, warmup=WARMUP)  # host time, not the GPU's
        if dev.type == "cuda":
            torch.cuda.synchronize()
        row = {"op": "python_plan", "what": name, "b": bs, "h_q": args.heads,
               "page_size": args.page_size, "s_q": 1, "device": str(dev), "us": med,
               "us_min": mn, "iters": ITERS, "target_us": 15}
        row.update(benchlib.run_fields(dev, args.commit))
        rows_out.append(row)
    benchlib.write_rows(rows_out)


if __name__ == "__main__":
    main()
