"""FlashMLA- and FlashInfer-shaped entry points against the float64 oracle."""
import itertools
import math

import pytest
import torch

import mla

import oracle
from cases import LAYOUTS, PagedCase


@pytest.mark.parametrize("page_size", [1, 16, 64, 128])
@pytest.mark.parametrize("s_q,causal", [(1, False), (2, True), (4, True)])
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_flash_mla_with_kvcache(device, page_size, s_q, causal, cache_dtype):
    b, h = 3, 16
    kv_lens = [s_q + 9, s_q + 2 * page_size, s_q]
    case = PagedCase(page_size=page_size, kv_lens=kv_lens, q_lens=[s_q] * b, heads=h,
                     layout=LAYOUTS[page_size % 3], cache_dtype=cache_dtype, seed=s_q + page_size)
    case.to(device)
    q = case.q.view(b, s_q, h, 576)
    k_cache = case.cache.view(-1, page_size, 1, 576)
    seqlens = torch.tensor(kv_lens, dtype=torch.int32, device=device)
    meta, num_splits = mla.get_mla_metadata(seqlens, s_q * h, 1)
    out, lse = mla.flash_mla_with_kvcache(q, k_cache, case.block_table, seqlens, 512, meta,
                                          num_splits, softmax_scale=case.sm_scale, causal=causal,
                                          k_scale=case.k_scale)
    assert out.shape == (b, s_q, h, 512) and lse.shape == (b, h, s_q)
    slots = [oracle.slots_from_block_table(case.block_table.cpu(), i, kv_lens[i], page_size)
             for i in range(b)]
    ref_o, ref_lse = oracle.absorbed(case.q, case.cache, slots, [s_q] * b, case.sm_scale, causal,
                                     case.k_scale)
    assert oracle.rel_err(out.view(b * s_q, h, 512), ref_o) < 1e-2
    assert oracle.lse_close(lse.transpose(1, 2).reshape(b * s_q, h), ref_lse) < 1e-2
    # A second layer reuses the metadata's plan.
    out2, _ = mla.flash_mla_with_kvcache(q, k_cache, case.block_table, seqlens, 512, meta,
                                         num_splits, softmax_scale=case.sm_scale, causal=causal,
                                         k_scale=case.k_scale)
    assert torch.equal(out, out2)
    assert meta.have_initialized and meta.plan is not None


def test_flash_mla_out_of_range_block(device):
    case = PagedCase(page_size=16, kv_lens=[20], q_lens=[1], heads=16, layout="shuffled")
    case.to(device)
    bt = case.block_table.clone()
    bt[0, 0] = case.cache.shape[0] // 16 + 5
    seqlens = torch.tensor([20], dtype=torch.int32, device=device)
    meta, ns = mla.get_mla_metadata(seqlens, 16, 1)
    if device.type == "cpu":
        with pytest.raises(ValueError, match="block_table"):
            mla.flash_mla_with_kvcache(case.q.view(1, 1, 16, 576), case.cache.view(-1, 16, 1, 576),
                                       bt, seqlens, 512, meta, ns)


@pytest.mark.parametrize("page_size", [1, 32, 64])
@pytest.mark.parametrize("fused_q", [True, False])
@pytest.mark.parametrize("base_e", [False, True])
def test_batch_mla_paged_attention_wrapper(device, page_size, fused_q, base_e):
    h = 32
    q_lens = [1, 4, 2]
    kv_lens = [7, 4 + page_size, 50]
    case = PagedCase(page_size=page_size, kv_lens=kv_lens, q_lens=q_lens, heads=h,
                     layout="interleaved", seed=page_size + 2 * fused_q)
    case.to(device)
    qo_indptr = torch.tensor([0] + list(itertools.accumulate(q_lens)), dtype=torch.int32)
    kv_indptr = torch.tensor([0] + list(itertools.accumulate(len(p) for p in case.pages)),
                             dtype=torch.int32)
    kv_indices = torch.tensor([p for ps in case.pages for p in ps], dtype=torch.int32, device=device)
    ws = torch.empty(1 << 20, dtype=torch.uint8, device=device)
    w = mla.BatchMLAPagedAttentionWrapper(ws)
    w.plan(qo_indptr.to(device), kv_indptr.to(device), kv_indices,
           torch.tensor(kv_lens, dtype=torch.int32, device=device), h, 512, 64, page_size, True,
           case.sm_scale, torch.bfloat16, torch.bfloat16)
    paged = case.cache.view(-1, page_size, 576)
    ckv, kpe = paged[..., :512], paged[..., 512:]
    if fused_q:
        q_nope, q_pe = case.q[..., :512], case.q[..., 512:]
    else:
        q_nope, q_pe = case.q[..., :512].contiguous(), case.q[..., 512:].contiguous()
    out, lse = w.run(q_nope, q_pe, ckv, kpe, return_lse=True, return_lse_base_on_e=base_e)
    slots = [case.slots(b) for b in range(3)]
    ref_o, ref_lse = oracle.absorbed(case.q, case.cache, slots, q_lens, case.sm_scale, True)
    assert oracle.rel_err(out, ref_o) < 1e-2
    expect_lse = ref_lse if base_e else ref_lse / math.log(2)
    assert oracle.lse_close(lse, expect_lse) < 1e-2
    only_out = w.run(q_nope, q_pe, ckv, kpe)
    assert torch.equal(only_out, out)


def test_wrapper_graph_mode_reads_one_persistent_page_list(device):
    """use_cuda_graph=True: each plan copies its kv_indices into the constructor's buffer and
    runs read that buffer (a captured graph keeps the address it was captured with), so a plan
    given a new kv_indices tensor is still what a replay reads."""
    h, P = 16, 16
    buf = torch.full((16,), -1, dtype=torch.int32, device=device)
    w = mla.BatchMLAPagedAttentionWrapper(torch.empty(16, dtype=torch.uint8, device=device),
                                          use_cuda_graph=True, kv_indices=buf)
    kv_lens = [40, 20, 9]
    for seed in (11, 12):  # same lengths, other pages and cache contents
        case = PagedCase(page_size=P, kv_lens=kv_lens, q_lens=[1, 1, 1], heads=h,
                         layout="shuffled", seed=seed).to(device)
        kv_indptr = torch.tensor([0] + list(itertools.accumulate(len(p) for p in case.pages)),
                                 dtype=torch.int32)
        fresh = torch.tensor([p for ps in case.pages for p in ps], dtype=torch.int32,
                             device=device)
        w.plan(torch.tensor([0, 1, 2, 3], dtype=torch.int32), kv_indptr, fresh,
               torch.tensor(kv_lens, dtype=torch.int32), h, 512, 64, P, True, case.sm_scale,
               torch.bfloat16, torch.bfloat16)
        assert w._table.data_ptr() == buf.data_ptr()
        assert torch.equal(buf[: fresh.numel()], fresh)
        paged = case.cache.view(-1, P, 576)
        out = w.run(case.q[..., :512], case.q[..., 512:], paged[..., :512], paged[..., 512:])
        ref_o, _ = oracle.absorbed(case.q, case.cache, [case.slots(b) for b in range(3)],
                                   [1, 1, 1], case.sm_scale, True)
        assert oracle.rel_err(out, ref_o) < 1e-2
    with pytest.raises(ValueError,
                       match=r"\(17,\) page ids exceed the use_cuda_graph buffer of \(16,\)"):
        w.plan(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 17], dtype=torch.int32),
               torch.zeros(17, dtype=torch.int32, device=device),
               torch.tensor([17 * P], dtype=torch.int32), h, 512, 64, P, True, 0.1,
               torch.bfloat16, torch.bfloat16)


def test_wrapper_rejects_separate_cache_buffers(device):
    case = PagedCase(page_size=16, kv_lens=[5], q_lens=[1], heads=16, layout="shuffled").to(device)
    w = mla.BatchMLAPagedAttentionWrapper(torch.empty(16, dtype=torch.uint8, device=device))
    w.plan(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32),
           torch.tensor(case.pages[0], dtype=torch.int32), torch.tensor([5], dtype=torch.int32),
           16, 512, 64, 16, True, case.sm_scale, torch.bfloat16, torch.bfloat16)
    paged = case.cache.view(-1, 16, 576)
    with pytest.raises(ValueError, match="kv_cache: the two halves must be views of one 576"):
        w.run(case.q[..., :512], case.q[..., 512:], paged[..., :512].contiguous(),
              paged[..., 512:].contiguous())
