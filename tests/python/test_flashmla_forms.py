"""FlashMLA's current call forms (get_mla_metadata() without arguments, flash_mla_with_kvcache
with num_splits=None) against a float64 reference, after FlashMLA's dense decoding test for
h_kv = 1: batch 1/2/6/64, s_q 1/2/4, s_k 20/140/4096, h_q 1/3/8/9/16/32/63/64/126/128, varlen,
causal, zero-length rows, a block table padded with 2147480000 past each request's pages whose
unused pages hold NaN, and FlashMLA's tolerances and anomaly rule (+inf / -inf / NaN must sit at
the same places). A chosen set of cases covers every value of every axis (not the cross
product), so the file runs in seconds on two cores. The cuda variants skip without a GPU."""
from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch

import mla

_PAD_PAGE = 2147480000  # FlashMLA's filler for block-table entries past a request's pages


def _devices():
    cuda_ok = torch.cuda.is_available() and mla.has_cuda_ops()
    return ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
        not cuda_ok, reason="needs a CUDA GPU and mla's CUDA ops"))]


@dataclasses.dataclass
class Case:
    b: int
    s_q: int
    s_k: int
    varlen: bool
    causal: bool
    h_q: int
    zero_rows: bool = False
    page: int = 64
    seed: int = 0

    def __str__(self):
        return (f"b{self.b}-sq{self.s_q}-sk{self.s_k}-h{self.h_q}-P{self.page}"
                f"{'-varlen' if self.varlen else ''}{'-causal' if self.causal else ''}"
                f"{'-zero' if self.zero_rows else ''}")


# Every value of every axis appears; heavy combinations (64 requests of 4096 keys, 128 heads at
# 4096 keys with a large batch) are left to the GPU check's sizes.
CASES = [
    Case(1, 1, 20, False, False, 1),
    Case(1, 2, 4096, True, True, 3),
    Case(2, 4, 140, True, True, 8),
    Case(2, 1, 4096, False, False, 9),
    Case(6, 2, 20, False, True, 16, page=16),
    Case(6, 4, 140, True, False, 32),
    Case(2, 2, 4096, True, True, 63),
    Case(64, 1, 140, True, True, 64, page=1),
    Case(6, 4, 20, True, True, 126, page=128),
    Case(1, 4, 4096, False, True, 128),
    Case(64, 2, 20, True, False, 16, page=32),
    # FlashMLA's corner cases: some requests without keys.
    Case(64, 2, 140, True, False, 9, zero_rows=True, seed=1),
    Case(64, 2, 140, True, True, 63, zero_rows=True, seed=2),
    Case(6, 4, 140, True, True, 126, zero_rows=True, seed=3),
    Case(2, 1, 4096, True, True, 1, zero_rows=True, seed=4),
]


def make_inputs(c: Case, device):
    """cache_seqlens, q, block_table, k_cache as FlashMLA's test lays them out: a shuffled block
    table padded to 256 keys, NaN in every slot no request uses, the padding entries set to
    2147480000."""
    rnd = random.Random(c.seed)
    g = torch.Generator().manual_seed(c.seed)
    lens = [c.s_k] * c.b
    if c.varlen:
        lens = [max(int(rnd.normalvariate(c.s_k, c.s_k / 2)), c.s_q) for _ in range(c.b)]
    if c.zero_rows:
        zero = torch.randn(c.b, generator=g) > 0
        zero[0] = True  # at least one
        lens = [0 if z else n for n, z in zip(lens, zero.tolist())]
    pad = -(-max(max(lens), 1) // 256) * 256
    blocks = c.b * pad // c.page
    block_table = torch.randperm(blocks, generator=g).to(torch.int32).view(c.b, -1)
    q = (torch.randn(c.b, c.s_q, c.h_q, 576, generator=g) / 10).clamp(-1, 1).to(torch.bfloat16)
    k = (torch.randn(blocks, c.page, 1, 576, generator=g) / 10).clamp(-1, 1)
    for i, n in enumerate(lens):
        used = -(-n // c.page)
        k[block_table[i, used:].long()] = float("nan")
        if n % c.page:
            k[block_table[i, used - 1].long(), n % c.page:] = float("nan")
        block_table[i, used:] = _PAD_PAGE
    seqlens = torch.tensor(lens, dtype=torch.int32)
    return (seqlens.to(device), q.to(device), block_table.to(device),
            k.to(torch.bfloat16).to(device))


def reference(seqlens, q, block_table, k_cache, causal, scale=None):
    """float64: each request's keys gathered by its block table (only its pages), the mask
    tril(diagonal = s_k - s_q) when causal, rows without keys out 0 / lse +inf (FlashMLA's)."""
    b, s_q, h, d = q.shape
    page = k_cache.shape[1]
    scale = d ** -0.5 if scale is None else scale
    out = torch.zeros(b, s_q, h, 512, dtype=torch.float64)
    lse = torch.empty(b, h, s_q, dtype=torch.float64)
    rows = k_cache.detach().cpu().reshape(-1, 576)
    q64 = q.detach().cpu().to(torch.float64)
    for i in range(b):
        n = int(seqlens[i])
        key = torch.arange(n)
        slots = block_table[i].cpu().long()[key // page] * page + key % page
        kv = rows.index_select(0, slots).to(torch.float64)
        # [h, s_q, n] logits (matmul, not einsum: several times faster in float64 here)
        logits = (q64[i].transpose(0, 1) @ kv.t()) * scale
        if causal:
            visible = torch.ones(s_q, n, dtype=torch.bool).tril(diagonal=n - s_q)
            logits = logits.masked_fill(~visible, -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)  # [h, s_q]
        p = torch.nan_to_num(torch.exp(logits - row_lse[..., None]), nan=0.0)
        o = (p @ kv[:, :512]).transpose(0, 1)  # [s_q, h, 512]
        lonely = torch.isneginf(row_lse)
        out[i] = o.masked_fill(lonely.t()[..., None], 0.0)
        lse[i] = row_lse.masked_fill(lonely, math.inf)
    return out, lse


def flashmla_allclose(name, ans, ref, abs_tol, rel_tol, cos_diff_tol=None):
    """FlashMLA's acceptance rule (after its kernelkit check): each anomaly (+inf, -inf, NaN) at
    the same places in both, then every other element within abs_tol or rel_tol, and the
    cosine difference of the whole tensors within cos_diff_tol."""
    ans = ans.detach().cpu().to(torch.float64).clone()
    ref = ref.detach().cpu().to(torch.float64).clone()
    assert ans.shape == ref.shape, f"{name}: shape {tuple(ans.shape)} vs {tuple(ref.shape)}"
    for what, test in (("+inf", torch.isposinf), ("-inf", torch.isneginf), ("nan", torch.isnan)):
        ma, mr = test(ans), test(ref)
        assert torch.equal(ma, mr), (f"{name}: {int(ma.sum())} {what} in the answer, "
                                     f"{int(mr.sum())} in the reference")
        ans[ma] = 0.0
        ref[mr] = 0.0
    err = (ans - ref).abs()
    rel = err / (ref.abs() + 1e-6)
    ok = (err < abs_tol) | (rel < rel_tol)
    assert bool(ok.all()), (f"{name}: {int((~ok).sum())} of {ok.numel()} elements off; max abs "
                            f"err {float(err.max()):.3g}, max rel err {float(rel[~ok].max()):.3g}")
    if cos_diff_tol is not None and float((ref * ref).sum()) >= 1e-12:
        cos_diff = 1 - 2 * float((ans * ref).sum()) / float((ans * ans + ref * ref).sum())
        assert abs(cos_diff) <= cos_diff_tol, f"{name}: cosine diff {cos_diff:.3g}"


def check_flashmla(out, lse, ref_out, ref_lse, q):
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    # FlashMLA's tolerances: out in q's dtype against the reference rounded to it.
    flashmla_allclose("out", out, ref_out.to(q.dtype), 8e-4, 2.01 / 128, 5e-6)
    flashmla_allclose("lse", lse, ref_lse, 1e-6, 8.01 / 65536)


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("case", CASES, ids=str)
def test_dense_decoding_like_flashmla(device, case):
    seqlens, q, block_table, k_cache = make_inputs(case, device)
    meta, num_splits = mla.get_mla_metadata()
    assert isinstance(meta, mla.FlashMLASchedMeta) and num_splits is None
    out, lse = mla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, 512, meta,
                                          num_splits, causal=case.causal)
    assert out.shape == (case.b, case.s_q, case.h_q, 512)
    assert lse.shape == (case.b, case.h_q, case.s_q) and lse.is_contiguous()
    ref_out, ref_lse = reference(seqlens, q, block_table, k_cache, case.causal)
    check_flashmla(out, lse, ref_out, ref_lse, q)
    if case.zero_rows:
        empty = (seqlens == 0).cpu()
        assert bool(torch.isposinf(lse.cpu()[empty]).all())
        assert float(out.cpu()[empty].abs().max()) == 0.0
    # The metadata serves the next layer: same results, into a caller's out (vLLM's form).
    out2 = torch.full_like(out, float("nan"))
    again, lse2 = mla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, 512, meta,
                                             causal=case.causal, out=out2)
    assert again is out2
    assert torch.equal(out2, out) and torch.equal(lse2, lse)


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("s_q", [2, 4])
def test_causal_with_fewer_keys_than_queries(device, s_q):
    """cache_seqlens below s_q (0 included): the mask tril(diagonal = s_k - s_q) leaves the first
    s_q - s_k queries without a key: out 0 and lse +inf there, the others exact."""
    lens = [0, 1, s_q - 1, s_q, s_q + 3]
    c = Case(len(lens), s_q, 8, False, True, 9, page=16, seed=7)
    _, q, block_table, k_cache = make_inputs(c, device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    for i, n in enumerate(lens):  # each request's own pages, NaN past its keys
        flat = k_cache.view(-1, 16, 576)
        page = int(block_table[i, 0])
        flat[page, n:] = float("nan")
        block_table[i, 1:] = _PAD_PAGE
        if n == 0:
            block_table[i, 0] = _PAD_PAGE
    meta, _ = mla.get_mla_metadata()
    out, lse = mla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, 512, meta, None,
                                          causal=True)
    ref_out, ref_lse = reference(seqlens, q, block_table, k_cache, True)
    check_flashmla(out, lse, ref_out, ref_lse, q)
    lonely = torch.isposinf(ref_lse)
    assert int(lonely.sum()) == 9 * sum(max(s_q - n, 0) for n in lens)
    assert bool(torch.isposinf(lse.cpu()[lonely]).all())


def test_older_three_argument_form_and_scale():
    """FlashMLA's older get_mla_metadata(cache_seqlens, s_q * h_q, 1) with its num_splits passed
    back, and an explicit softmax_scale; the default scale is q.shape[-1] ** -0.5."""
    c = Case(3, 2, 140, True, True, 8, page=16, seed=9)
    seqlens, q, block_table, k_cache = make_inputs(c, "cpu")
    meta, num_splits = mla.get_mla_metadata(seqlens, c.s_q * c.h_q, 1)
    assert num_splits.dtype == torch.int32 and num_splits.shape == (c.b + 1,)
    out, lse = mla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, 512, meta,
                                          num_splits, softmax_scale=0.1, causal=True)
    check_flashmla(out, lse, *reference(seqlens, q, block_table, k_cache, True, 0.1), q)
    meta2, _ = mla.get_mla_metadata()
    default, default_lse = mla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, 512,
                                                      meta2, causal=True)
    check_flashmla(default, default_lse,
                   *reference(seqlens, q, block_table, k_cache, True, 576 ** -0.5), q)
    with pytest.raises(ValueError, match="num_heads_per_head_k = 16, q has s_q \\* h_q = 8"):
        m, ns = mla.get_mla_metadata(seqlens, 16, 1)
        mla.flash_mla_with_kvcache(q[:, :1], k_cache, block_table, seqlens, 512, m, ns)
    with pytest.raises(ValueError, match="cache_seqlens: its values differ from those "
                       "get_mla_metadata was given"):
        m, ns = mla.get_mla_metadata(seqlens, c.s_q * c.h_q, 1)
        mla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens - 1, 512, m, ns)


def test_fp8_cache_with_per_tensor_scale():
    """mla's fp8 extra: a float8_e4m3fn cache of the same shape with k_scale=, with the flag
    is_fp8_kvcache=True (or False); FlashMLA's 656-byte token layout is refused by name."""
    c = Case(2, 1, 140, False, False, 16, seed=5)
    seqlens, q, block_table, k_cache = make_inputs(c, "cpu")
    k_scale = 0.01
    fp8 = (k_cache.float() / k_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    meta, _ = mla.get_mla_metadata()
    out, lse = mla.flash_mla_with_kvcache(q, fp8, block_table, seqlens, 512, meta,
                                          is_fp8_kvcache=True, k_scale=k_scale)
    deq = (fp8.float() * k_scale).to(torch.float64)
    ref_out, ref_lse = reference(seqlens, q, block_table, deq, False)
    flashmla_allclose("out", out, ref_out.to(torch.bfloat16), 8e-4, 2.01 / 128)
    flashmla_allclose("lse", lse, ref_lse, 1e-5, 8.01 / 65536)
    packed = torch.zeros(k_cache.shape[0], 1, 64 * 656, dtype=torch.uint8)
    with pytest.raises(ValueError, match="656-byte"):
        mla.flash_mla_with_kvcache(q, packed, block_table, seqlens, 512,
                                   mla.get_mla_metadata()[0], is_fp8_kvcache=True)
    with pytest.raises(ValueError, match="is_fp8_kvcache=True, but k_cache has dtype"):
        mla.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, 512,
                                   mla.get_mla_metadata()[0], is_fp8_kvcache=True)


def test_bad_inputs_name_the_argument():
    c = Case(2, 1, 140, False, False, 8, seed=6)
    seqlens, q, block_table, k_cache = make_inputs(c, "cpu")

    def call(**kw):
        args = dict(q=q, k_cache=k_cache, block_table=block_table, cache_seqlens=seqlens,
                    head_dim_v=512, tile_scheduler_metadata=mla.get_mla_metadata()[0])
        args.update(kw)
        return mla.flash_mla_with_kvcache(**args)

    bad = [
        (dict(q=q.to(torch.float16)), r"q: dtype torch.float16"),
        (dict(q=q[..., :512]), r"q: expected \(b, s_q, h_q, 576\)"),
        (dict(head_dim_v=576), r"head_dim_v = 576"),
        (dict(k_cache=k_cache.expand(-1, -1, 2, -1)), r"k_cache: num_heads_k = 2"),
        (dict(k_cache=k_cache.float()), r"k_cache: dtype torch.float32"),
        (dict(block_table=block_table.long()), r"block_table: dtype torch.int64"),
        (dict(cache_seqlens=seqlens[:1]), r"cache_seqlens: shape \(1,\)"),
        (dict(cache_seqlens=None), r"cache_seqlens: expected an int32 tensor"),
        (dict(tile_scheduler_metadata=object()), r"tile_scheduler_metadata: pass what"),
        (dict(indices=torch.zeros(2, 1, 64, dtype=torch.int32)), r"indices: FlashMLA's sparse"),
        (dict(attn_sink=torch.zeros(8)), r"attn_sink: FlashMLA's sparse"),
        (dict(topk_length=torch.zeros(2, dtype=torch.int32)), r"topk_length"),
        (dict(enable_batch_invariant=True), r"enable_batch_invariant=True"),
        (dict(is_fp8_kvcache=0.02), r"is_fp8_kvcache = 0.02: expected a bool"),
        (dict(out=torch.empty(2, 1, 8, 512)), r"out: expected a torch.bfloat16 tensor"),
    ]
    for kw, msg in bad:
        with pytest.raises(ValueError, match=msg):
            call(**kw)
    with pytest.raises(ValueError, match=r"get_mla_metadata|num_heads_k = 2"):
        mla.get_mla_metadata(seqlens, 8, 2)
    # A metadata reused with other shapes: refused, naming the field and both values.
    meta, _ = mla.get_mla_metadata()
    call(tile_scheduler_metadata=meta)
    for kw, msg in [(dict(q=q[:, :, :4]), "h_q = 8, this call has h_q = 4"),
                    (dict(causal=True), "causal = False, this call has causal = True"),
                    (dict(q=q[:1], block_table=block_table[:1], cache_seqlens=seqlens[:1]),
                     "b = 2, this call has b = 1"),
                    (dict(k_cache=k_cache.view(-1, 32, 1, 576)),
                     "page_block_size = 64, this call has page_block_size = 32"),
                    (dict(cache_seqlens=seqlens - 1), "cache_seqlens: its values differ")]:
        with pytest.raises(ValueError, match=msg):
            call(tile_scheduler_metadata=meta, **kw)
