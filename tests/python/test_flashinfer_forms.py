"""FlashInfer 0.7.4's current BatchMLAPagedAttentionWrapper forms (plan(metadata=...,
lse_mode=...), the deprecated dense plan keywords, run(query=..., kv_cache=...)) against the
float64 oracle, their LSE contract, and the arguments mla refuses by name."""
import itertools
import math
import types

import pytest
import torch

import mla

import oracle
from cases import PagedCase


def _csr(case, device):
    qo = torch.tensor([0] + list(itertools.accumulate(case.q_lens)), dtype=torch.int32)
    kvp = torch.tensor([0] + list(itertools.accumulate(len(p) for p in case.pages)),
                       dtype=torch.int32)
    idx = torch.tensor([p for ps in case.pages for p in ps], dtype=torch.int32, device=device)
    return qo, kvp, idx, torch.tensor(case.kv_lens, dtype=torch.int32)


def _setup(device, heads, page_size=16, q_lens=(1, 3, 2), kv_lens=(9, 40, 2), seed=3,
           cache_dtype=torch.bfloat16):
    case = PagedCase(page_size=page_size, kv_lens=list(kv_lens), q_lens=list(q_lens),
                     heads=heads, layout="shuffled", seed=seed, cache_dtype=cache_dtype)
    case.to(device)
    w = mla.BatchMLAPagedAttentionWrapper(torch.empty(16, dtype=torch.uint8, device=device))
    return case, w


def _common(case, **kw):
    args = dict(num_heads=case.heads, head_dim_ckv=512, head_dim_kpe=64,
                page_size=case.page_size, causal=True, sm_scale=case.sm_scale,
                q_data_type=torch.bfloat16, kv_data_type=case.cache.dtype)
    args.update(kw)
    return args


def _reference(case):
    slots = [case.slots(b) for b in range(len(case.kv_lens))]
    return oracle.absorbed(case.q, case.cache, slots, case.q_lens, case.sm_scale, True,
                           case.k_scale)


@pytest.mark.parametrize("heads", [1, 8, 9, 32])
@pytest.mark.parametrize("lse_mode", ["base2", "basee"])
@pytest.mark.parametrize("form", ["packed", "split"])
def test_metadata_plan_and_structural_run(device, heads, lse_mode, form):
    case, w = _setup(device, heads, seed=heads)
    qo, kvp, idx, kv_len = _csr(case, device)
    w.plan(metadata=mla.MLAPlanMetadata.csr(qo, kvp, idx, kv_len), lse_mode=lse_mode,
           **_common(case))
    paged = case.cache.view(-1, case.page_size, 576)
    if form == "packed":
        query, kv_cache = case.q, paged
    else:  # split pairs: q halves in two buffers (copied), cache halves views of one buffer
        query = (case.q[..., :512].contiguous(), case.q[..., 512:].contiguous())
        kv_cache = (paged[..., :512], paged[..., 512:])
    out, lse = w.run(query=query, kv_cache=kv_cache, return_lse=True)
    ref_o, ref_lse = _reference(case)
    assert oracle.rel_err(out, ref_o) < 1e-2
    expect = ref_lse if lse_mode == "basee" else ref_lse / math.log(2)
    assert oracle.lse_close(lse, expect) < 1e-2
    assert torch.equal(w.run(query=query, kv_cache=kv_cache), out)  # out only


def test_dense_and_dual_metadata_give_the_csr_bits(device):
    case, w = _setup(device, 16, q_lens=(2, 1, 4), kv_lens=(33, 1, 70), seed=5)
    qo, kvp, idx, kv_len = _csr(case, device)
    paged = case.cache.view(-1, case.page_size, 576)
    results = []
    for how in ("csr", "dense", "flat_dense", "dual", "duck"):
        if how == "csr":
            w.plan(metadata=mla.MLAPlanMetadata.csr(qo, kvp, idx, kv_len), lse_mode="basee",
                   **_common(case))
        elif how == "dense":
            w.plan(metadata=mla.MLAPlanMetadata.dense(qo, case.block_table, kv_len, 4),
                   lse_mode="basee", **_common(case))
        elif how == "flat_dense":  # FlashInfer's deprecated dense keywords
            w.plan(cum_seq_lens_q=qo, block_tables=case.block_table, seq_lens=kv_len,
                   lse_mode="basee", **_common(case))
        elif how == "dual":
            w.plan(metadata=mla.MLAPlanMetadata.dual(qo, kvp, idx, kv_len, qo, case.block_table,
                                                     kv_len), lse_mode="basee", **_common(case))
        else:  # any object with MLAPlanMetadata's fields (flashinfer's own, say)
            md = types.SimpleNamespace(qo_indptr=None, kv_indptr=None, kv_indices=None,
                                       kv_len_arr=None, cum_seq_lens_q=qo,
                                       block_tables=case.block_table, seq_lens=kv_len,
                                       max_q_len=None)
            w.plan(metadata=md, lse_mode="basee", **_common(case))
        results.append(w.run(query=case.q, kv_cache=paged, return_lse=True))
    ref_o, ref_lse = _reference(case)
    assert oracle.rel_err(results[0][0], ref_o) < 1e-2
    assert oracle.lse_close(results[0][1], ref_lse) < 1e-2
    for out, lse in results[1:]:
        assert torch.equal(out.view(torch.int16), results[0][0].view(torch.int16))
        assert torch.equal(lse.view(torch.int32), results[0][1].view(torch.int32))
    with pytest.raises(ValueError, match="the dense half .* describes other requests"):
        w.plan(metadata=mla.MLAPlanMetadata.dual(qo, kvp, idx, kv_len, qo, case.block_table,
                                                 kv_len + 1), **_common(case))
    with pytest.raises(ValueError, match="max_q_len = 3, but a request has 4 queries"):
        w.plan(metadata=mla.MLAPlanMetadata.dense(qo, case.block_table, kv_len, 3),
               **_common(case))


def test_lse_contract(device):
    case, w = _setup(device, 8)
    qo, kvp, idx, kv_len = _csr(case, device)
    paged = case.cache.view(-1, case.page_size, 576)
    ref_o, ref_lse = _reference(case)
    # Canonical plan without an LSE: none returned, asking for one raises.
    w.plan(metadata=mla.MLAPlanMetadata.csr(qo, kvp, idx, kv_len), **_common(case))
    out = w.run(query=case.q, kv_cache=paged)
    assert oracle.rel_err(out, ref_o) < 1e-2
    with pytest.raises(ValueError, match="lse_mode is 'none'"):
        w.run(query=case.q, kv_cache=paged, return_lse=True)
    # base2 plan: asking for natural log at run time contradicts it.
    w.plan(metadata=mla.MLAPlanMetadata.csr(qo, kvp, idx, kv_len), lse_mode="base2",
           **_common(case))
    with pytest.raises(ValueError, match="return_lse_base_on_e=True: the plan's lse_mode"):
        w.run(query=case.q, kv_cache=paged, return_lse=True, return_lse_base_on_e=True)
    # Caller buffers are written and returned by identity (base 2 in lse).
    o_buf = torch.empty_like(out)
    l_buf = torch.empty(out.shape[:2], dtype=torch.float32, device=device)
    o2, l2 = w.run(query=case.q, kv_cache=paged, out=o_buf, lse=l_buf, return_lse=True)
    assert o2 is o_buf and l2 is l_buf
    assert oracle.lse_close(l_buf, ref_lse / math.log(2)) < 1e-2
    # The legacy flat CSR plan keeps deciding at run time (FlashInfer 0.7.4 still allows it).
    w.plan(qo, kvp, idx, kv_len, 8, 512, 64, case.page_size, True, case.sm_scale,
           torch.bfloat16, torch.bfloat16)
    _, lse_e = w.run(case.q[..., :512], case.q[..., 512:], paged[..., :512], paged[..., 512:],
                     return_lse=True, return_lse_base_on_e=True)
    assert oracle.lse_close(lse_e, ref_lse) < 1e-2


def test_causal_with_fewer_keys_than_queries(device):
    """Bottom-right causal with kv_len < q_len: the first q_len - kv_len queries see no key
    (out 0, lse -inf as FlashInfer's kernels give)."""
    case, w = _setup(device, 9, q_lens=(4, 3), kv_lens=(2, 0), seed=8)
    qo, kvp, idx, kv_len = _csr(case, device)
    w.plan(metadata=mla.MLAPlanMetadata.csr(qo, kvp, idx, kv_len), lse_mode="basee",
           **_common(case))
    out, lse = w.run(query=case.q, kv_cache=case.cache.view(-1, case.page_size, 576),
                     return_lse=True)
    ref_o, ref_lse = _reference(case)
    assert oracle.rel_err(out, ref_o) < 1e-2
    assert oracle.lse_close(lse, ref_lse) < 1e-2
    lonely = torch.isneginf(ref_lse)
    assert int(lonely.sum()) == 9 * (2 + 3)
    assert bool(torch.isneginf(lse.cpu()[lonely]).all())
    assert float(out.cpu()[lonely].abs().max()) == 0.0


def test_fp8_cache_scales(device):
    case, w = _setup(device, 16, cache_dtype=torch.float8_e4m3fn, seed=11)
    qo, kvp, idx, kv_len = _csr(case, device)
    w.plan(metadata=mla.MLAPlanMetadata.csr(qo, kvp, idx, kv_len), lse_mode="basee",
           scale_mode="kv-per-tensor", **_common(case))
    paged = case.cache.view(-1, case.page_size, 576)
    ref_o, ref_lse = _reference(case)
    for kw in (dict(ckv_scale=case.k_scale), dict(ckv_scale=case.k_scale, kpe_scale=case.k_scale),
               dict(k_scale=case.k_scale)):
        out, lse = w.run(query=case.q, kv_cache=paged, return_lse=True, **kw)
        assert oracle.rel_err(out, ref_o) < 2e-2
        assert oracle.lse_close(lse, ref_lse) < 2e-2
    with pytest.raises(ValueError, match="kpe_scale = 0.5: mla's fp8 cache has one per-tensor"):
        w.run(query=case.q, kv_cache=paged, ckv_scale=case.k_scale, kpe_scale=0.5)


def test_refused_arguments_are_named(device):
    case, w = _setup(device, 16)
    qo, kvp, idx, kv_len = _csr(case, device)
    md = mla.MLAPlanMetadata.csr(qo, kvp, idx, kv_len)
    for kw, msg in [(dict(use_sinks=True), "use_sinks = True"),
                    (dict(skip_softmax=True), "skip_softmax = True"),
                    (dict(output_scale="per-tensor"), "output_scale = 'per-tensor'"),
                    (dict(output_dtype=torch.float8_e4m3fn), "output_dtype ="),
                    (dict(lse_mode="base10"), "lse_mode = 'base10'"),
                    (dict(query_layout="ragged"), "query_layout = 'ragged'"),
                    (dict(head_dim_ckv=576), "head_dim_ckv = 576"),
                    (dict(q_data_type=torch.float16), "q_data_type = torch.float16")]:
        with pytest.raises(ValueError, match=msg):
            w.plan(metadata=md, **_common(case, **kw))
    with pytest.raises(ValueError, match="pass metadata= or the flat fields, not both"):
        w.plan(qo, metadata=md, **_common(case))
    with pytest.raises(ValueError, match="the dense metadata lacks block_tables"):
        w.plan(metadata=mla.MLAPlanMetadata(cum_seq_lens_q=qo, seq_lens=kv_len), **_common(case))
    w.plan(metadata=md, **_common(case))
    paged = case.cache.view(-1, case.page_size, 576)
    for kw, msg in [(dict(o_scale=1.0), "o_scale"), (dict(sinks=torch.zeros(16)), "sinks"),
                    (dict(ckv_scale_arr=torch.ones(3)), "ckv_scale_arr"),
                    (dict(kv_len=kv_len), "kv_len"), (dict(page_table=idx), "page_table"),
                    (dict(bmm1_scale=1.0), "bmm1_scale")]:
        with pytest.raises(ValueError, match=msg):
            w.run(query=case.q, kv_cache=paged, **kw)
    with pytest.raises(ValueError, match="pass query= or q_nope/q_pe, not both"):
        w.run(case.q[..., :512], case.q[..., 512:], query=case.q, kv_cache=paged)
    with pytest.raises(ValueError, match="kv_cache= \\(or both ckv_cache and kpe_cache\\)"):
        w.run(query=case.q)
    with pytest.raises(ValueError, match="query: a packed tensor's last dim must be 576"):
        w.run(query=case.q[..., :512], kv_cache=paged)
