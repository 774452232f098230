"""CUDA graphs (H200 only): capture an absorbed run, re-plan different batches back to back
into the same plan buffer while the GPU is kept busy, replay after each, compare with the
float64 oracle."""
import pytest
import torch

import mla
from mla import ops

import oracle
from cases import LatentPool, PagedCase

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and mla.has_cuda_ops()),
                                reason="needs a CUDA device and the CUDA op set")


@pytest.mark.parametrize("page_size,heads,q_len", [(16, 16, 1), (64, 128, 1), (1, 32, 2),
                                                   (128, 64, 4)])
def test_graph_replay_after_back_to_back_replans(page_size, heads, q_len):
    dev = torch.device("cuda")
    max_bs = 6
    kv_all = [q_len + 3 + 37 * i for i in range(12)]
    case = PagedCase(page_size=page_size, kv_lens=kv_all, q_lens=[q_len] * len(kv_all),
                     heads=heads, layout="shuffled", seed=page_size + heads, spare_rows=3)
    case.to(dev)
    T = max_bs * q_len
    plan = ops.AbsorbedPlan(dev, heads, page_size, max_batch=max_bs, max_q_tokens=T,
                            max_q_len=q_len)
    q = (torch.randn(T, heads, 576, device=dev) * 0.5).to(torch.bfloat16)
    o = torch.zeros(T, heads, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.zeros(T, heads, dtype=torch.float32, device=dev)

    def batch(k):
        bs = 1 + k % max_bs
        idx = [(3 * k + 5 * i) % len(kv_all) for i in range(bs)]
        return idx

    first = batch(max_bs - 1)
    plan.plan(case.rows[first], [q_len] * len(first), [kv_all[i] for i in first])
    plan.run(q, case.cache, case.req_to_token, o, lse, case.sm_scale)  # warm-up
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        plan.run(q, case.cache, case.req_to_token, o, lse, case.sm_scale)

    outs, batches = [], []
    torch.cuda._sleep(200_000_000)  # the host runs ahead of the GPU from here
    for k in range(10):
        idx = batch(k)
        batches.append(idx)
        plan.plan(case.rows[idx], [q_len] * len(idx), [kv_all[i] for i in idx])
        g.replay()
        outs.append((o.clone(), lse.clone()))
    torch.cuda.synchronize()
    for idx, (o_k, lse_k) in zip(batches, outs):
        n = len(idx) * q_len
        slots = [case.slots(i) for i in idx]
        ref_o, ref_lse = oracle.absorbed(q[:n], case.cache, slots, [q_len] * len(idx),
                                         case.sm_scale, True)
        assert oracle.rel_err(o_k[:n], ref_o) < 1e-2
        assert oracle.lse_close(lse_k[:n], ref_lse) < 1e-2


def test_flashinfer_wrapper_fixed_capacity_on_cuda():
    dev = torch.device("cuda")
    h, P = 16, 32
    case = PagedCase(page_size=P, kv_lens=[40, 70, 9], q_lens=[1, 1, 1], heads=h,
                     layout="interleaved", seed=9).to(dev)
    w = mla.BatchMLAPagedAttentionWrapper(torch.empty(1, dtype=torch.uint8, device=dev),
                                          use_cuda_graph=True)
    kv_indptr = torch.tensor([0, 2, 5, 6], dtype=torch.int32)
    indices = torch.tensor([p for ps in case.pages for p in ps], dtype=torch.int32, device=dev)
    w.plan(torch.tensor([0, 1, 2, 3], dtype=torch.int32), kv_indptr, indices,
           torch.tensor([40, 70, 9], dtype=torch.int32), h, 512, 64, P, True, case.sm_scale,
           torch.bfloat16, torch.bfloat16)
    paged = case.cache.view(-1, P, 576)
    out = torch.empty(3, h, 512, dtype=torch.bfloat16, device=dev)
    w.run(case.q[..., :512], case.q[..., 512:], paged[..., :512], paged[..., 512:], out=out)
    ref_o, _ = oracle.absorbed(case.q, case.cache, [case.slots(b) for b in range(3)], [1, 1, 1],
                               case.sm_scale, True)
    assert oracle.rel_err(out, ref_o) < 1e-2


def test_backend_graph_replay_plans_and_replays_without_a_host_sync():
    """The engine-facing backend (what the SGLang adapter plans through): a decode graph
    captured once, then per step what the engine does between replays (copy the step's q into
    the static buffer, init_forward_metadata from SGLang's host mirrors, replay), under torch's
    sync debug mode "error" (a synchronizing torch call in planning or replay, such as .item(),
    a device-to-host copy or bool() of a CUDA tensor, raises) and counted by the plan's staging
    ring (plans that blocked the host on an upload still in flight).
    1. The engine's schedule: the host one step ahead of a GPU kept busy (each step followed by
       a ~10 ms GPU sleep; the host waits, by event queries, only for the step before): the GPU
       is busy at every plan and no plan blocks.
    2. Control: the host eight plans ahead of a 100 ms sleep: the two-buffer ring must block
       (the counter counts). Every step's output against the float64 oracle."""
    from types import SimpleNamespace
    from mla.backend import Backend

    dev = torch.device("cuda")
    H, P, bs = 16, 16, 4
    kv_all = [5 + 29 * i for i in range(10)]
    case = PagedCase(page_size=P, kv_lens=kv_all, q_lens=[1] * len(kv_all), heads=H,
                     layout="shuffled", seed=21).to(dev)
    be = Backend("paged_mla", num_heads=H, page_size=P, device=dev, sm_scale=case.sm_scale,
                 token_to_kv_pool=LatentPool(case.cache.view(-1, 1, 576)),
                 req_to_token_pool=SimpleNamespace(req_to_token=case.req_to_token))
    be.init_cuda_graph_state(bs, bs)
    layer = SimpleNamespace(layer_id=0, scaling=case.sm_scale, tp_q_head_num=H, head_dim=576,
                            v_head_dim=512)

    def step(idx):
        seq = torch.tensor([kv_all[i] for i in idx], dtype=torch.int32)
        rows = case.rows[idx]
        return SimpleNamespace(forward_mode="decode", seq_lens=seq.to(dev), seq_lens_cpu=seq,
                               req_pool_indices=rows.to(dev), req_pool_indices_cpu=rows)

    steps = [[(k + 3 * i) % len(kv_all) for i in range(bs)] for k in range(8)]
    batches = [step(idx) for idx in steps]
    qs = [case.q[idx].contiguous() for idx in steps]  # device tensors, made before the checks
    q_static = qs[0].clone()
    be.init_forward_metadata(batches[0])
    be.forward_decode(q_static, None, None, layer, batches[0], save_kv_cache=False)  # warm-up
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o_static = be.forward_decode(q_static, None, None, layer, batches[0],
                                     save_kv_cache=False)
    ring = be._graph_plan
    stream = torch.cuda.current_stream()

    def check(outs):
        for idx, q, o in zip(steps, qs, outs):
            ref, _ = oracle.absorbed(q, case.cache, [case.slots(i) for i in idx], [1] * bs,
                                     case.sm_scale, True)
            assert oracle.rel_err(o.view(bs, H, 512), ref) < 1e-2

    # 1. one step ahead
    plans, waits = be.stats["graph_plans"], ring.blocking_waits()
    outs, done, busy = [], [], 0
    torch.cuda.set_sync_debug_mode("error")
    try:
        for k, (fb, q) in enumerate(zip(batches, qs)):
            if k >= 1:
                while not done[k - 1].query():  # the step before has run (no sync: a query)
                    pass
                busy += not stream.query()  # ...and the GPU is still busy (its sleep)
            q_static.copy_(q)
            be.init_forward_metadata(fb)
            g.replay()
            outs.append(o_static.clone())
            done.append(torch.cuda.Event())
            done[-1].record()
            torch.cuda._sleep(20_000_000)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert be.stats["graph_plans"] - plans == len(steps)  # every step into the captured plan
    assert busy == len(steps) - 1  # the host really ran ahead of the GPU
    assert ring.blocking_waits() == waits
    check(outs)

    # 2. control: eight plans ahead of the GPU
    waits = ring.blocking_waits()
    outs = []
    torch.cuda._sleep(200_000_000)
    for fb, q in zip(batches, qs):
        q_static.copy_(q)
        be.init_forward_metadata(fb)
        g.replay()
        outs.append(o_static.clone())
    torch.cuda.synchronize()
    assert ring.blocking_waits() > waits
    check(outs)
