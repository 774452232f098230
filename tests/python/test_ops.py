"""Every torch op of mla against the float64 oracle, on cpu (and cuda when present)."""
import itertools
import math

import pytest
import torch

import mla
from mla import ops

import oracle
from cases import LAYOUTS, PagedCase

PAGE_SIZES = (1, 16, 32, 64, 128)
CACHE_DTYPES = (torch.bfloat16, torch.float8_e4m3fn)


def _absorbed_cases():
    # page size x cache dtype x layout, with heads and q_len varied across the grid.
    heads = itertools.cycle((16, 32, 64, 128))
    qlens = itertools.cycle((1, 2, 5, 8))
    for P, dt, layout in itertools.product(PAGE_SIZES, CACHE_DTYPES, LAYOUTS):
        yield pytest.param(P, dt, layout, next(heads), next(qlens),
                           id=f"P{P}-{str(dt).split('.')[-1]}-{layout}")


@pytest.mark.parametrize("page_size,cache_dtype,layout,heads,q_len", list(_absorbed_cases()))
def test_absorbed_matches_oracle(device, page_size, cache_dtype, layout, heads, q_len):
    kv_lens = [q_len + 7, q_len, 3 * page_size + q_len + 1, q_len + 40][: 2 if heads >= 64 else 4]
    q_lens = [q_len] * len(kv_lens)
    case = PagedCase(page_size=page_size, kv_lens=kv_lens, q_lens=q_lens, heads=heads,
                     layout=layout, cache_dtype=cache_dtype, seed=page_size * 7 + heads + q_len)
    case.to(device)
    T = sum(q_lens)
    plan = ops.AbsorbedPlan(device, heads, page_size, max_batch=len(kv_lens) + 1,
                            max_q_tokens=T + 3, max_q_len=8)
    plan.plan(case.rows, q_lens, kv_lens)
    o = torch.full((T, heads, 512), float("nan"), dtype=torch.bfloat16, device=device)
    lse = torch.full((T, heads), float("nan"), dtype=torch.float32, device=device)
    plan.run(case.q, case.cache, case.req_to_token, o, lse, case.sm_scale, case.k_scale)
    ref_o, ref_lse = oracle.absorbed(case.q, case.cache, [case.slots(b) for b in range(len(kv_lens))],
                                     q_lens, case.sm_scale, True, case.k_scale)
    assert oracle.rel_err(o, ref_o) < 1e-2
    assert oracle.lse_close(lse, ref_lse) < 1e-2


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_absorbed_block_table_forms_read_in_place(device, page_size, layout):
    """The block table [batch, max_blocks] and FlashInfer's flat page list (rows = offsets) give
    the bits of the token-level run, and match the oracle gathering by block table."""
    heads = 128 if page_size >= 64 else 16
    q_lens = [1, 3, 2]
    kv_lens = [5, 2 * page_size + 3, page_size + 2]
    case = PagedCase(page_size=page_size, kv_lens=kv_lens, q_lens=q_lens, heads=heads,
                     layout=layout, cache_dtype=torch.bfloat16, seed=page_size + 97).to(device)
    T, bs = sum(q_lens), len(kv_lens)
    plan = ops.AbsorbedPlan(device, heads, page_size, max_batch=bs, max_q_tokens=T, max_q_len=4)

    def run(rows, **table):
        plan.plan(rows, q_lens, kv_lens)
        o = torch.full((T, heads, 512), float("nan"), dtype=torch.bfloat16, device=device)
        lse = torch.full((T, heads), float("nan"), dtype=torch.float32, device=device)
        plan.run(case.q, case.cache, table.pop("req_to_token", None), o, lse, case.sm_scale,
                 **table)
        return o, lse

    o_tok, lse_tok = run(case.rows, req_to_token=case.req_to_token)
    o_blk, lse_blk = run(torch.arange(bs, dtype=torch.int32), block_table=case.block_table)
    flat = [7] + [p for ps in case.pages for p in ps]  # a leading entry no request uses
    offsets = [1 + sum(len(ps) for ps in case.pages[:b]) for b in range(bs)]
    kv_indices = torch.tensor(flat, dtype=torch.int32, device=device)
    o_flat, lse_flat = run(offsets, block_table=kv_indices)
    for o, lse in ((o_blk, lse_blk), (o_flat, lse_flat)):
        assert torch.equal(o.view(torch.int16), o_tok.view(torch.int16))
        assert torch.equal(lse.view(torch.int32), lse_tok.view(torch.int32))
    slots = [oracle.slots_from_block_table(case.block_table.cpu(), b, kv_lens[b], page_size)
             for b in range(bs)]
    ref_o, ref_lse = oracle.absorbed(case.q, case.cache, slots, q_lens, case.sm_scale, True)
    assert oracle.rel_err(o_blk, ref_o) < 1e-2
    assert oracle.lse_close(lse_blk, ref_lse) < 1e-2


def test_absorbed_page_table_arguments(device):
    case = PagedCase(page_size=16, kv_lens=[20, 9], q_lens=[1, 1], heads=16,
                     layout="shuffled", seed=4).to(device)
    plan = ops.AbsorbedPlan(device, 16, 16, max_batch=2, max_q_tokens=2)
    plan.plan([0, 1], [1, 1], [20, 9])
    o = torch.zeros(2, 16, 512, dtype=torch.bfloat16, device=device)
    lse = torch.zeros(2, 16, dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match="exactly one of req_to_token"):
        plan.run(case.q, case.cache, case.req_to_token, o, lse, case.sm_scale,
                 block_table=case.block_table)
    with pytest.raises(ValueError, match="exactly one of req_to_token"):
        plan.run(case.q, case.cache, None, o, lse, case.sm_scale)
    with pytest.raises(ValueError, match=r"block_table: expected i32"):
        plan.run(case.q, case.cache, None, o, lse, case.sm_scale,
                 block_table=case.block_table.float())
    with pytest.raises(ValueError, match=r"block_table: column stride 2"):
        wide = torch.zeros(2, 4, dtype=torch.int32, device=device)
        plan.run(case.q, case.cache, None, o, lse, case.sm_scale, block_table=wide[:, ::2])
    assert float(o.float().abs().max()) == 0.0


def test_absorbed_table_shape_is_checked_before_the_run(device):
    """A page table smaller than what the plan reads (rows, columns, a flat list's length) is
    a ValueError naming it, raised on the host before the op runs; o is left as it was."""
    P = 16
    case = PagedCase(page_size=P, kv_lens=[40, 9], q_lens=[1, 1], heads=16,
                     layout="shuffled", seed=6).to(device)
    plan = ops.AbsorbedPlan(device, 16, P, max_batch=2, max_q_tokens=2)
    o = torch.zeros(2, 16, 512, dtype=torch.bfloat16, device=device)
    lse = torch.zeros(2, 16, dtype=torch.float32, device=device)
    rows = case.rows.tolist()
    plan.plan(rows, [1, 1], [40, 9])
    with pytest.raises(ValueError, match=r"req_to_token: \d+ columns, but request 0 reads 33 for its 40 keys"):
        plan.run(case.q, case.cache, case.req_to_token[:, :32], o, lse, case.sm_scale)
    with pytest.raises(ValueError, match=r"req_to_token: 1 rows, but request \d reads row"):
        plan.run(case.q, case.cache, case.req_to_token[:1], o, lse, case.sm_scale)  # rows >= 1
    plan.plan([0, 1], [1, 1], [40, 9])
    with pytest.raises(ValueError, match=r"block_table: 2 columns, but request 0 reads 3"):
        plan.run(case.q, case.cache, None, o, lse, case.sm_scale,
                 block_table=case.block_table[:, :2].contiguous())
    flat = torch.tensor([p for ps in case.pages for p in ps], dtype=torch.int32, device=device)
    plan.plan([0, len(case.pages[0])], [1, 1], [40, 9])
    with pytest.raises(ValueError, match=r"block_table: a flat page list of 3 entries"):
        plan.run(case.q, case.cache, None, o, lse, case.sm_scale, block_table=flat[:3])
    assert float(o.float().abs().max()) == 0.0
    plan.run(case.q, case.cache, None, o, lse, case.sm_scale, block_table=flat)  # the full list
    assert float(o.float().abs().max()) > 0.0


@pytest.mark.parametrize("causal", [True, False])
def test_absorbed_kv_len_zero_and_replan(device, causal):
    heads, P = 16, 16
    case = PagedCase(page_size=P, kv_lens=[0 if not causal else 1, 33, 5], q_lens=[1, 1, 1],
                     heads=heads, layout="shuffled", seed=3).to(device)
    plan = ops.AbsorbedPlan(device, heads, P, causal=causal, max_batch=4, max_q_tokens=4)
    o = torch.empty(3, heads, 512, dtype=torch.bfloat16, device=device)
    lse = torch.empty(3, heads, dtype=torch.float32, device=device)
    for kv_lens in ([case.kv_lens[0], 33, 5], [case.kv_lens[0], 20, 1]):
        plan.plan(case.rows, [1, 1, 1], kv_lens)
        plan.run(case.q, case.cache, case.req_to_token, o, lse, case.sm_scale)
        slots = [case.slots(b)[: kv_lens[b]] for b in range(3)]
        ref_o, ref_lse = oracle.absorbed(case.q, case.cache, slots, [1, 1, 1], case.sm_scale, causal)
        assert oracle.rel_err(o, ref_o) < 1e-2
        assert oracle.lse_close(lse, ref_lse) < 1e-2


@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("causal", [True, False])
def test_mha_matches_oracle(device, heads, causal):
    g = torch.Generator().manual_seed(heads + causal)
    q_lens = [3, 1, 8, 0] if not causal else [3, 1, 8, 2]
    kv_lens = [q + e for q, e in zip(q_lens, [5, 0, 17, 2])]
    qo = [0] + list(itertools.accumulate(q_lens))
    kvp = [0] + list(itertools.accumulate(kv_lens))
    q = (torch.randn(qo[-1], heads, 192, generator=g) * 0.5).to(torch.bfloat16).to(device)
    k = (torch.randn(kvp[-1], heads, 192, generator=g) * 0.5).to(torch.bfloat16).to(device)
    v = (torch.randn(kvp[-1], heads, 128, generator=g) * 0.5).to(torch.bfloat16).to(device)
    plan = ops.MhaPlan(device, heads, causal=causal, max_batch=4, max_q_tokens=qo[-1],
                       max_kv_tokens=kvp[-1])
    plan.plan(qo, kvp)
    o = torch.empty(qo[-1], heads, 128, dtype=torch.bfloat16, device=device)
    lse = torch.empty(qo[-1], heads, dtype=torch.float32, device=device)
    sm = 1 / math.sqrt(192)
    plan.run(q, k, v, o, lse, sm)
    ref_o, ref_lse = oracle.mha(q, k, v, qo, kvp, sm, causal)
    assert oracle.rel_err(o, ref_o) < 1e-2
    assert oracle.lse_close(lse, ref_lse) < 1e-2


def test_mha_merge_over_split_keys_equals_one_pass(device):
    """Non-causal attention over keys split in two (the second part empty for one request),
    the second pass merged into the first's (o, lse): the single pass over all keys."""
    g = torch.Generator().manual_seed(29)
    heads, q_lens, first, second = 32, [4, 130, 1], [10, 70, 0], [6, 0, 200]
    qo = [0] + list(itertools.accumulate(q_lens))
    kv_all = [a + b for a, b in zip(first, second)]

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * 0.5).to(torch.bfloat16).to(device)

    q = rand(qo[-1], heads, 192)
    k = [rand(n, heads, 192) for n in kv_all]
    v = [rand(n, heads, 128) for n in kv_all]

    def part(lens, lo):
        kvp = [0] + list(itertools.accumulate(lens))
        pk = torch.cat([k[b][lo[b]:lo[b] + lens[b]] for b in range(3)])
        pv = torch.cat([v[b][lo[b]:lo[b] + lens[b]] for b in range(3)])
        plan = ops.MhaPlan(device, heads, causal=False, max_batch=3, max_q_tokens=qo[-1],
                           max_kv_tokens=max(kvp[-1], 1))
        return plan.plan(qo, kvp), pk, pv, kvp

    sm = 1 / math.sqrt(192)
    o = torch.full((qo[-1], heads, 128), float("nan"), dtype=torch.bfloat16, device=device)
    lse = torch.full((qo[-1], heads), float("nan"), dtype=torch.float32, device=device)
    plan, pk, pv, _ = part(first, [0, 0, 0])
    plan.run(q, pk, pv, o, lse, sm)
    plan, pk, pv, _ = part(second, first)
    plan.run(q, pk, pv, o, lse, sm, merge=True)
    kvp = [0] + list(itertools.accumulate(kv_all))
    ref_o, ref_lse = oracle.mha(q, torch.cat(k), torch.cat(v), qo, kvp, sm, False)
    assert oracle.rel_err(o, ref_o) < 1e-2
    assert oracle.lse_close(lse, ref_lse) < 1e-2


def test_merge_state_matches_oracle(device):
    g = torch.Generator().manual_seed(5)
    T, H, D = 7, 16, 512
    va = torch.randn(T, H, D, generator=g).to(torch.bfloat16).to(device)
    vb = torch.randn(T, H, D, generator=g).to(torch.bfloat16).to(device)
    sa = (torch.randn(T, H, generator=g) * 3).to(device)
    sb = (torch.randn(T, H, generator=g) * 3).to(device)
    sa[0, 0] = float("-inf")
    sa[1, 1] = float("-inf")
    sb[1, 1] = float("-inf")
    v, s = mla.merge_state_natural(va, sa, vb, sb)
    ref_v, ref_s = oracle.merge(va, sa, vb, sb)
    assert oracle.rel_err(v, ref_v) < 1e-2
    assert oracle.lse_close(s, ref_s) < 1e-4
    assert float(v[1, 1].abs().max()) == 0.0
    # Inputs untouched by the functional form.
    assert float(sa[0, 0]) == float("-inf")
    # mla.merge_state is flashinfer.merge_state: base-2 LSEs in and out. The same states in base
    # 2 merge to the same v and the base-2 form of the natural-log merged LSE.
    sa2, sb2 = sa / math.log(2), sb / math.log(2)
    v2, s2 = mla.merge_state(va, sa2, vb, sb2)
    assert oracle.rel_err(v2, ref_v) < 1e-2
    assert oracle.lse_close(s2, ref_s / math.log(2)) < 1e-4
    assert float(sa2[0, 0]) == float("-inf")
    # Read as natural log, base-2 LSEs weigh the states otherwise: the two merges differ.
    wrong_v, _ = mla.merge_state_natural(va, sa2, vb, sb2)
    assert oracle.rel_err(wrong_v, ref_v) > 1e-2


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
def test_kv_write_matches_oracle(device, cache_dtype):
    g = torch.Generator().manual_seed(11)
    T, slots_n = 9, 64
    c_kv_full = torch.randn(T, 600, generator=g).to(torch.bfloat16)  # strided rows
    c_kv = c_kv_full[:, :512]
    k_pe = torch.randn(T, 64, generator=g).to(torch.bfloat16)
    loc = torch.randperm(slots_n, generator=g)[:T].to(torch.int32)
    cache = torch.zeros(slots_n, 576, dtype=cache_dtype)
    k_scale = 0.05 if cache_dtype == torch.float8_e4m3fn else 1.0
    c_kv_d, k_pe_d, loc_d, cache_d = (x.to(device) for x in (c_kv, k_pe, loc, cache))
    ops.kv_write(c_kv_d, k_pe_d, loc_d, cache_d, k_scale)
    ref = torch.zeros(slots_n, 576, dtype=torch.float64)
    ref[loc.long()] = torch.cat([c_kv, k_pe], -1).double()
    got = oracle.dequant(cache_d.cpu(), k_scale)
    assert oracle.rel_err(got, ref) < (6e-2 if cache_dtype == torch.float8_e4m3fn else 1e-6)
    untouched = torch.ones(slots_n, dtype=torch.bool)
    untouched[loc.long()] = False
    assert float(got[untouched].abs().max()) == 0.0


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
def test_up_project_matches_oracle(device, cache_dtype):
    g = torch.Generator().manual_seed(13)
    H, N, slots_n = 16, 11, 40
    vals = torch.randn(slots_n, 576, generator=g) * 0.5
    k_scale = 0.01 if cache_dtype == torch.float8_e4m3fn else 1.0
    cache = (vals / k_scale).to(cache_dtype) if cache_dtype != torch.bfloat16 else vals.to(torch.bfloat16)
    w = (torch.randn(H * 256, 512, generator=g) * 0.05).to(torch.bfloat16)
    slots = torch.randint(0, slots_n, (N,), generator=g, dtype=torch.int32)
    k = torch.empty(N, H, 192, dtype=torch.bfloat16, device=device)
    v = torch.empty(N, H, 128, dtype=torch.bfloat16, device=device)
    ops.up_project(cache.to(device), slots.to(device), w.to(device), k, v, k_scale=k_scale)
    lat = oracle.dequant(cache, k_scale)[slots.long()]
    w64 = w.double().view(H, 256, 512)
    ref_k = torch.cat([torch.einsum("nd,hkd->nhk", lat[:, :512], w64[:, :128]),
                       lat[:, None, 512:].expand(N, H, 64)], -1)
    ref_v = torch.einsum("nd,hkd->nhk", lat[:, :512], w64[:, 128:])
    assert oracle.rel_err(k, ref_k) < 1e-2
    assert oracle.rel_err(v, ref_v) < 1e-2
