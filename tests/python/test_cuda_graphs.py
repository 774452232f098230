"""CUDA graphs (H200 only): capture an absorbed run, re-plan different batches back to back
into the same plan buffer while the GPU is kept busy, replay after each, compare with the
float64 oracle."""
import pytest
import torch

import mla
from mla import ops

import oracle
from cases import PagedCase

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
