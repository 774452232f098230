"""opcheck on every op, torch.compile(fullgraph=True) of a layer calling them, and bad inputs
that must raise an exception naming the argument and its values and write nothing."""
import time

import pytest
import torch

import mla
from mla import ops

from cases import PagedCase

_OPCHECK_TESTS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


def _absorbed_setup(device, heads=16, P=16, q_len=1):
    case = PagedCase(page_size=P, kv_lens=[q_len + 5, q_len + 30], q_lens=[q_len, q_len],
                     heads=heads, layout="shuffled", seed=1).to(device)
    plan = ops.AbsorbedPlan(device, heads, P, max_batch=2, max_q_tokens=2 * q_len,
                            max_q_len=q_len)
    plan.plan(case.rows, [q_len, q_len], case.kv_lens)
    T = 2 * q_len
    o = torch.zeros(T, heads, 512, dtype=torch.bfloat16, device=device)
    lse = torch.zeros(T, heads, dtype=torch.float32, device=device)
    return case, plan, o, lse


def test_opcheck_absorbed(device):
    case, plan, o, lse = _absorbed_setup(device)
    torch.library.opcheck(torch.ops.mla.absorbed_run.default,
                          (case.q, case.cache, case.req_to_token, plan.plan_tensor, plan.workspace,
                           o, lse, case.sm_scale, 1.0), test_utils=_OPCHECK_TESTS)
    torch.library.opcheck(torch.ops.mla.absorbed_plan.default,
                          (case.rows, torch.tensor([1, 1], dtype=torch.int32),
                           torch.tensor(case.kv_lens, dtype=torch.int32), plan._staging.handle,
                           plan.plan_tensor, 16, 16, True, 2, 2, 1), test_utils=("test_schema",))


def test_opcheck_mha(device):
    H = 16
    q = torch.randn(5, H, 192).to(torch.bfloat16).to(device)
    k = torch.randn(9, H, 192).to(torch.bfloat16).to(device)
    v = torch.randn(9, H, 128).to(torch.bfloat16).to(device)
    plan = ops.MhaPlan(device, H, max_batch=2, max_q_tokens=5, max_kv_tokens=9)
    plan.plan([0, 2, 5], [0, 4, 9])
    o = torch.zeros(5, H, 128, dtype=torch.bfloat16, device=device)
    lse = torch.zeros(5, H, device=device)
    torch.library.opcheck(torch.ops.mla.mha_run.default,
                          (q, k, v, plan._staging.plan, plan.workspace, o, lse, 0.1),
                          test_utils=_OPCHECK_TESTS)


def test_opcheck_merge_kv_write_up_project(device):
    T, H = 4, 16
    va = torch.randn(T, H, 512).to(torch.bfloat16).to(device)
    vb = torch.randn(T, H, 512).to(torch.bfloat16).to(device)
    sa, sb = torch.randn(T, H, device=device), torch.randn(T, H, device=device)
    torch.library.opcheck(torch.ops.mla.merge_state_.default, (va, sa, vb, sb),
                          test_utils=_OPCHECK_TESTS)
    cache = torch.zeros(32, 576, dtype=torch.bfloat16, device=device)
    c_kv = torch.randn(T, 512).to(torch.bfloat16).to(device)
    k_pe = torch.randn(T, 64).to(torch.bfloat16).to(device)
    loc = torch.tensor([3, 9, 1, 30], dtype=torch.int32, device=device)
    torch.library.opcheck(torch.ops.mla.kv_write.default, (c_kv, k_pe, loc, cache, 1.0),
                          test_utils=_OPCHECK_TESTS)
    w = (torch.randn(H * 256, 512) * 0.05).to(torch.bfloat16).to(device)
    k = torch.empty(T, H, 192, dtype=torch.bfloat16, device=device)
    v = torch.empty(T, H, 128, dtype=torch.bfloat16, device=device)
    ws = torch.empty(ops.up_project_workspace_bytes(T, H, device), dtype=torch.uint8, device=device)
    torch.library.opcheck(torch.ops.mla.up_project.default, (cache, loc, w, ws, k, v, 1.0),
                          test_utils=_OPCHECK_TESTS)


def test_torch_compile_fullgraph_layer(device):
    """A decode layer body: kv write, absorbed attention, merge with a second state."""
    case, plan, o, lse = _absorbed_setup(device)
    c_kv = torch.randn(2, 512).to(torch.bfloat16).to(device)
    k_pe = torch.randn(2, 64).to(torch.bfloat16).to(device)
    loc = torch.tensor([case.slots(0)[-1], case.slots(1)[-1]], dtype=torch.int32, device=device)
    o_b = torch.randn(2, 16, 512).to(torch.bfloat16).to(device)
    lse_b = torch.randn(2, 16, device=device)

    def layer(q, cache, r2t, plan_t, ws, c_kv, k_pe, loc, o, lse, o_b, lse_b):
        torch.ops.mla.kv_write(c_kv, k_pe, loc, cache, 1.0)
        torch.ops.mla.absorbed_run(q * 1.0, cache, r2t, plan_t, ws, o, lse, 0.1, 1.0)
        torch.ops.mla.merge_state_(o, lse, o_b, lse_b)
        return o.float().sum(), lse

    args = (case.q, case.cache.clone(), case.req_to_token, plan.plan_tensor, plan.workspace,
            c_kv, k_pe, loc)
    o_e, lse_e = o.clone(), lse.clone()
    eager = layer(*args, o_e, lse_e, o_b, lse_b)
    args = (case.q, case.cache.clone(), case.req_to_token, plan.plan_tensor, plan.workspace,
            c_kv, k_pe, loc)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    o_c, lse_c = o.clone(), lse.clone()
    got = compiled(*args, o_c, lse_c, o_b, lse_b)
    assert torch.equal(o_c, o_e) and torch.equal(lse_c, lse_e)
    assert torch.equal(got[0], eager[0])


def _inductor_unavailable():
    """Why inductor cannot compile on this cpu, or None (it needs a C++ compiler)."""
    import shutil
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "inductor's cpu backend needs a C++ compiler (g++ / clang++) on PATH"
    return None


@pytest.mark.skipif(_inductor_unavailable() is not None, reason=str(_inductor_unavailable()))
def test_torch_compile_inductor_layer(device):
    """torch.compile(fullgraph=True) with the default inductor backend: a decode layer calling
    the ops (kv write, absorbed attention over a block table, merge) between pointwise ops that
    inductor generates code for. The ops' outputs equal eager to the bit; the compiled
    reduction matches to rounding. Inductor's own cache (/tmp/torchinductor_$USER) makes repeat
    runs fast; a cold compile took minutes on this cpu (docs/design-decisions.md)."""
    torch._dynamo.reset()
    case, plan, o, lse = _absorbed_setup(device)
    plan.plan([0, 1], [1, 1], case.kv_lens)  # the block table's rows
    c_kv = torch.randn(2, 512).to(torch.bfloat16).to(device)
    k_pe = torch.randn(2, 64).to(torch.bfloat16).to(device)
    loc = torch.tensor([case.slots(0)[-1], case.slots(1)[-1]], dtype=torch.int32, device=device)
    o_b = torch.randn(2, 16, 512).to(torch.bfloat16).to(device)
    lse_b = torch.randn(2, 16, device=device)

    def layer(q_nope, q_pe, cache, blocks, plan_t, ws, c_kv, k_pe, loc, o, lse, o_b, lse_b):
        q = torch.cat([q_nope * 2.0, q_pe], dim=-1)  # exact in bf16
        torch.ops.mla.kv_write(c_kv, k_pe, loc, cache, 1.0)
        torch.ops.mla.absorbed_run(q, cache, None, plan_t, ws, o, lse, 0.1, 1.0, blocks)
        torch.ops.mla.merge_state_(o, lse, o_b, lse_b)
        return (o.float() * 0.5).sum(dim=-1), lse + 1.0

    def args():
        return (case.q[..., :512], case.q[..., 512:], case.cache.clone(), case.block_table,
                plan.plan_tensor, plan.workspace, c_kv, k_pe, loc, o.clone(), lse.clone(), o_b,
                lse_b)

    a_e = args()
    eager = layer(*a_e)
    compiled = torch.compile(layer, fullgraph=True, backend="inductor")
    a_c = args()
    t0 = time.perf_counter()
    got = compiled(*a_c)
    first_call_s = time.perf_counter() - t0
    assert torch.equal(a_c[9], a_e[9]) and torch.equal(a_c[10], a_e[10])  # o, lse: bitwise
    assert torch.equal(a_c[2], a_e[2])  # the cache after kv_write
    torch.testing.assert_close(got[0], eager[0], rtol=1e-5, atol=1e-3)
    assert torch.equal(got[1], eager[1])
    # A second call reuses the compiled graph (no recompile) and writes the same.
    a_c2 = args()
    compiled(*a_c2)
    assert torch.equal(a_c2[9], a_e[9])
    print(f"inductor compile + first call: {first_call_s:.1f} s")


# ---- bad input: each raises, names the argument and its values, and writes nothing ----

def _bad_cases(device):
    case, plan, o, lse = _absorbed_setup(device)
    good = dict(q=case.q, kv_cache=case.cache, req_to_token=case.req_to_token,
                plan=plan.plan_tensor, workspace=plan.workspace, o=o, lse=lse)
    q_strided = torch.zeros(2, 16, 1152, dtype=torch.bfloat16, device=device)[..., ::2]
    bad_r2t = case.req_to_token.clone()
    bad_r2t[case.rows[1], 16] = 10_000_000  # a page id far beyond the cache
    cases = [
        ("wrong dtype", dict(q=case.q.float()), (ValueError,), ["q", "f32"]),
        ("wrong shape", dict(q=case.q[..., :575]), (ValueError,), ["q", "575"]),
        ("unsupported stride", dict(q=q_strided), (ValueError,), ["q"]),
        ("wrong heads", dict(o=torch.zeros(2, 8, 512, dtype=torch.bfloat16, device=device)),
         (ValueError,), ["o", "8"]),
        ("out-of-range page", dict(req_to_token=bad_r2t), (ValueError, RuntimeError),
         ["slot 10000000", "kv_cache"]),
    ]
    if torch.cuda.is_available() and mla.has_cuda_ops():
        other = "cpu" if device.type == "cuda" else "cuda"
        cases.append(("wrong device", dict(lse=torch.zeros(2, 16, device=other)), (ValueError,),
                      ["lse", "is on"]))
    return case, plan, good, cases


def test_bad_inputs_raise_and_write_nothing(device):
    case, plan, good, cases = _bad_cases(device)
    for name, override, excs, words in cases:
        if name == "out-of-range page" and device.type == "cuda":
            continue  # the raw cuda op checks no device table (a sync): test_page_checks_*
        args = dict(good, **override)
        o_before, lse_before = args["o"].clone(), args["lse"].clone()
        with pytest.raises(excs) as info:
            torch.ops.mla.absorbed_run(args["q"], args["kv_cache"], args["req_to_token"],
                                       args["plan"], args["workspace"], args["o"], args["lse"],
                                       case.sm_scale, 1.0)
        msg = str(info.value)
        for w in words:
            assert w in msg, f"{name}: '{w}' not in: {msg}"
        assert torch.equal(args["o"], o_before), name
        assert torch.equal(args["lse"], lse_before), name


def _page_check_case(device, form):
    """A planned batch, its page table in `form`, one entry pointing past the cache."""
    P = 16
    case = PagedCase(page_size=P, kv_lens=[20, 40], q_lens=[1, 1], heads=16, layout="shuffled",
                     seed=8).to(device)
    plan = ops.AbsorbedPlan(device, 16, P, max_batch=2, max_q_tokens=2)
    pages_total = case.cache.shape[0] // P
    if form == "req_to_token":
        plan.plan(case.rows, [1, 1], case.kv_lens)
        table = case.req_to_token.clone()
        table[case.rows[1], 2 * P] = case.cache.shape[0] - 3  # a page whose tail is past the end
        kwargs = dict(req_to_token=table)
        words = ["req_to_token", f"slot {case.cache.shape[0] - 3}", "key 32 of request 1"]
    elif form == "block_table":
        plan.plan([0, 1], [1, 1], case.kv_lens)
        table = case.block_table.clone()
        table[1, 2] = pages_total + 1000
        kwargs = dict(block_table=table)
        words = ["block_table", f"page id {pages_total + 1000}", "key 32 of request 1"]
    else:  # flat page list, rows = offsets
        flat = [p for ps in case.pages for p in ps]
        flat[0] = -2
        plan.plan([0, len(case.pages[0])], [1, 1], case.kv_lens)
        kwargs = dict(block_table=torch.tensor(flat, dtype=torch.int32, device=device))
        words = ["block_table", "page id -2", "key 0 of request 0"]
    o = torch.full((2, 16, 512), 7.0, dtype=torch.bfloat16, device=device)
    lse = torch.full((2, 16), 7.0, dtype=torch.float32, device=device)
    return case, plan, kwargs, words, o, lse


def _expect_page_error(case, plan, kwargs, words, o, lse, check):
    o0, lse0 = o.clone(), lse.clone()
    with pytest.raises((ValueError, RuntimeError)) as info:
        plan.run(case.q, case.cache, kwargs.get("req_to_token"), o, lse, case.sm_scale,
                 block_table=kwargs.get("block_table"), check_pages=check)
    for w in words:
        assert w in str(info.value), f"'{w}' not in: {info.value}"
    assert "kv_cache" in str(info.value)
    assert torch.equal(o, o0) and torch.equal(lse, lse0), "a rejected call wrote its outputs"


@pytest.mark.parametrize("form", ["req_to_token", "block_table", "flat"])
def test_page_checks_name_the_table_and_write_nothing(device, form):
    """check_pages=True (any device): the entry past the cache is named, nothing written."""
    _expect_page_error(*_page_check_case(device, form), check=True)


@pytest.mark.skipif(not (torch.cuda.is_available() and mla.has_cuda_ops()),
                    reason="needs a CUDA device and the cuda op set")
@pytest.mark.parametrize("form", ["req_to_token", "block_table", "flat"])
def test_page_checks_on_cuda_tensors(form):
    """On cuda tensors: checked (one sync) it raises and writes nothing; unchecked the kernel
    never reads outside the cache (its keys read as zeros) and the context stays usable."""
    case, plan, kwargs, words, o, lse = _page_check_case(torch.device("cuda"), form)
    _expect_page_error(case, plan, kwargs, words, o, lse, check=True)
    plan.run(case.q, case.cache, kwargs.get("req_to_token"), o, lse, case.sm_scale,
             block_table=kwargs.get("block_table"))
    torch.cuda.synchronize()
    assert bool(torch.isfinite(lse).all())


def test_plan_staging_handles(device):
    """Plans upload through the op library's staging ring, named by a handle: a handle that is
    not live raises (naming it) and writes nothing; the ring's pinned bytes are reported."""
    plan = ops.AbsorbedPlan(device, 16, 16, max_batch=2, max_q_tokens=2)
    before = plan.plan_tensor.clone()
    args = (torch.tensor([1, 2], dtype=torch.int32), torch.tensor([1, 1], dtype=torch.int32),
            torch.tensor([5, 6], dtype=torch.int32))
    with pytest.raises(ValueError, match="staging = 987654321 is not a live staging handle"):
        torch.ops.mla.absorbed_plan(*args, 987654321, plan.plan_tensor, 16, 16, True, 2, 2, 1)
    assert torch.equal(plan.plan_tensor, before)
    for _ in range(3):  # back-to-back re-plans turn the ring
        torch.ops.mla.absorbed_plan(*args, plan._staging.handle, plan.plan_tensor, 16, 16, True,
                                    2, 2, 1)
    sizes = plan._staging.host_bytes()
    assert len(sizes) == 2
    if device.type == "cuda":
        assert all(n >= plan.plan_bytes for n in sizes), sizes  # both buffers used
    else:
        assert sizes == [0, 0]  # the cpu plans straight into the plan tensor
    h = torch.ops.mla.staging_new(device)
    torch.ops.mla.staging_free(h)
    with pytest.raises(ValueError, match=f"staging = {h} is not a live staging handle"):
        torch.ops.mla.staging_free(h)
    if device.type == "cuda":
        cpu_plan = ops.AbsorbedPlan("cpu", 16, 16, max_batch=2, max_q_tokens=2)
        with pytest.raises(ValueError, match="is for cpu, the plan is on cuda"):
            torch.ops.mla.absorbed_plan(*args, cpu_plan._staging.handle, plan.plan_tensor, 16,
                                        16, True, 2, 2, 1)


def test_plan_bad_inputs(device):
    plan = ops.AbsorbedPlan(device, 16, 16, max_batch=2, max_q_tokens=2)
    plan.plan([1, 2], [1, 1], [5, 0])  # causal kv_len < q_len plans (no key: o 0, lse -inf)
    before = plan.plan_tensor.clone()
    with pytest.raises(ValueError, match=r"req_rows has 2 entries, q_lens 1"):
        plan.plan([1, 2], [1], [5, 6])  # mismatched batch
    with pytest.raises(ValueError, match=r"batch size 3 exceeds capacity (max_batch = )?2"):
        plan.plan([1, 2, 3], [1, 1, 1], [5, 6, 7])
    with pytest.raises(ValueError, match="page_size"):
        ops.AbsorbedPlan(device, 16, 24, max_batch=2, max_q_tokens=2).plan([1], [1], [3])
    assert torch.equal(plan.plan_tensor, before)


@pytest.mark.parametrize("rows, q_lens, kv_lens, message", [
    ([1, 2], [1], [5, 0], r"req_rows has 2 entries, q_lens 1, kv_lens 2 \(one per request\)"),
    ([1, 2, 3], [1, 1, 1], [5, 6, 7], r"batch size 3 exceeds capacity max_batch = 2"),
    ([1, 2], [1, -1], [5, 0], r"q_lens\[1\] = -1 is negative"),
    ([1, 2], [1, 1], [-3, 0], r"kv_lens\[0\] = -3 is negative"),
    ([1, -2], [1, 1], [5, 0], r"req_rows\[1\] = -2 is negative"),
    ([1, 2], [2, 0], [5, 0], r"q_lens\[0\] = 2 exceeds capacity max_q_len = 1"),
])
def test_plan_request_checks_are_the_librarys(device, rows, q_lens, kv_lens, message):
    """The plan's request checks are the C++ rule (mla::check_absorbed_problem), reached through
    the plan op for every op set: ValueError naming the field and the value, and nothing
    written to the plan."""
    plan = ops.AbsorbedPlan(device, 16, 16, max_batch=2, max_q_tokens=2)
    plan.plan([1, 2], [1, 1], [5, 0])
    before = plan.plan_tensor.clone()
    with pytest.raises(ValueError, match=message):
        plan.plan(rows, q_lens, kv_lens)
    assert torch.equal(plan.plan_tensor, before)


def test_plan_capacity_checks_are_the_librarys(device):
    plan = ops.AbsorbedPlan(device, 16, 16, max_batch=2, max_q_tokens=1, max_q_len=4)
    before = plan.plan_tensor.clone()
    with pytest.raises(ValueError, match=r"sum\(q_lens\) = 2 exceeds capacity max_q_tokens = 1"):
        plan.plan([1, 2], [1, 1], [5, 0])
    assert torch.equal(plan.plan_tensor, before)


def test_merge_and_kv_write_bad_inputs(device):
    va = torch.zeros(3, 16, 512, dtype=torch.bfloat16, device=device)
    sa = torch.zeros(3, 16, device=device)
    with pytest.raises(ValueError, match="lse_b"):
        torch.ops.mla.merge_state_(va, sa, va.clone(), torch.zeros(4, 16, device=device))
    assert float(sa.abs().max()) == 0.0
    cache = torch.zeros(8, 576, dtype=torch.bfloat16, device=device)
    c_kv = torch.ones(2, 512, dtype=torch.bfloat16, device=device)
    k_pe = torch.ones(2, 64, dtype=torch.bfloat16, device=device)
    with pytest.raises((ValueError, RuntimeError), match="out_cache_loc"):
        torch.ops.mla.kv_write(c_kv, k_pe, torch.tensor([1, 2], dtype=torch.int64, device=device),
                               cache, 1.0)
    assert float(cache.float().abs().max()) == 0.0
