"""Host time of planning a batch-256 decode through the SGLang adapter (a benchmark, not a test).

Per call, median and min wall time (time.perf_counter_ns; the calls below alternate in ten
blocks of 200, benchlib.interleaved_us) of
  op:       torch.ops.mla.absorbed_plan on host int32 tensors (the planner alone)
  plan:     mla.ops.AbsorbedPlan.plan (the op + the Python plan holder)
  adapter:  MLAPagedAttnBackend.init_forward_metadata_out_graph(forward_batch) on a real SGLang
            0.5.23 ForwardBatch (DECODE, with the host mirrors seq_lens_cpu and
            req_pool_indices_cpu SGLang fills), i.e. what SGLang calls before each decode step
            and each graph replay: mode, lengths, the forward-method rule, the plan; once with
            int32 host mirrors and once with int64 ones, the dtype SGLang 0.5.23's ScheduleBatch
            keeps seq_lens_cpu and req_pool_indices_cpu in (what a server passes).
DeepSeek-V3 shape per rank: 128 heads, page size 64, batch 256, q_len 1, kv_len uniform in
[1, 4096). Needs sglang 0.5.23 importable (scripts/setup-engines.sh). Prints JSON lines.
Usage: python plan_sglang.py [--device cpu|cuda] [--commit X]
"""
import sys
from types import SimpleNamespace

import torch

from mla import ops
from mla.integrations import sglang as plugin
import benchlib  # noqa: E402  (this folder is on sys.path when the script runs)
from plan_bench import ITERS, WARMUP, parse_args  # the same loop and arguments


def main():
    args = parse_args()
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool, ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.runtime_context import get_parallel

    dev, bs, H, P = torch.device(args.device), args.batch, args.heads, args.page_size
    g = torch.Generator().manual_seed(0)
    rows = torch.randperm(bs, generator=g).to(torch.int32) + 1
    q_lens = torch.ones(bs, dtype=torch.int32)
    kv_lens = torch.randint(1, 4096, (bs,), generator=g, dtype=torch.int32)
    # Planning reads neither the cache nor the table: a small pool and an empty table suffice.
    pool = MLATokenToKVPool(4 * P, P, torch.bfloat16, 512, 64, 1, str(dev), False)
    rpool = ReqToTokenPool(bs + 1, 4096, str(dev), False)
    cfg = SimpleNamespace(num_attention_heads=H, kv_lora_rank=512, qk_rope_head_dim=64,
                          qk_nope_head_dim=128, v_head_dim=128)
    runner = SimpleNamespace(model_config=cfg, tp_size=1, page_size=P, device=str(dev),
                             kv_cache_dtype=torch.bfloat16, token_to_kv_pool=pool,
                             req_to_token_pool=rpool, kv_index_translator=None,
                             server_args=SimpleNamespace(max_running_requests=bs))
    with get_parallel().override(attn_tp_size=1, attn_dcp_size=1, attn_dcp_rank=0):
        be = plugin.BACKEND_CLASSES["mla_paged"](runner)
    r64 = rows.to(torch.int64)

    def batch(host_dtype):
        return ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=bs,
                            input_ids=torch.zeros(bs, dtype=torch.int64, device=dev),
                            req_pool_indices=r64.to(dev), seq_lens=kv_lens.to(dev),
                            out_cache_loc=torch.zeros(bs, dtype=torch.int64, device=dev),
                            seq_lens_sum=int(kv_lens.sum()),
                            seq_lens_cpu=kv_lens.to(host_dtype),
                            req_pool_indices_cpu=rows.to(host_dtype))

    fb, fb64 = batch(torch.int32), batch(torch.int64)
    plan = ops.AbsorbedPlan(dev, H, P, max_batch=bs, max_q_tokens=bs)

    def op_call():
        torch.ops.mla.absorbed_plan(rows, q_lens, kv_lens, plan._staging.handle,
                                    plan.plan_tensor, H, P, True, bs, bs, 1)

    calls = (("absorbed_plan_op", op_call),
             ("AbsorbedPlan.plan", lambda: plan.plan(rows, q_lens, kv_lens)),
             ("sglang_adapter.init_forward_metadata_out_graph",
              lambda: be.init_forward_metadata_out_graph(fb)),
             ("sglang_adapter.init_forward_metadata_out_graph[int64 mirrors]",
              lambda: be.init_forward_metadata_out_graph(fb64)))
    # Host time, not the GPU's; the calls alternate in blocks (benchlib.interleaved_us), so that
    # the op and the adapter share a shared cpu's quiet and busy spells and their ratio holds.
    times = benchlib.interleaved_us(dict(calls), ITERS, warmup=WARMUP)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    rows_out = []
    for name, _ in calls:
        med, mn = times[name]
        row = {"op": "python_plan", "what": name, "b": bs, "h_q": H, "page_size": P, "s_q": 1,
               "device": str(dev), "us": med, "us_min": mn, "iters": ITERS}
        row.update(benchlib.run_fields(dev, args.commit))
        rows_out.append(row)
    benchlib.write_rows(rows_out)

if __name__ == "__main__":
    main()
