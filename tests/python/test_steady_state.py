"""Steady-state decode allocates nothing (issue 33 part 5): after warm-up, several decode steps
(init_forward_metadata, then every layer's forward) create no tensor with storage of its own,
through the engine-neutral mla.Backend and through the SGLang adapter inside the real SGLang
0.5.23 (RadixAttention.forward). Lengths arrive as SGLang keeps them (int64 host mirrors,
int64 out_cache_loc), and they change every step, as decode lengths do.

Counted: every aten op the dispatcher runs whose result has a storage none of its inputs has
(factories, out-of-place ops, copies to another dtype: torch.empty, cat, to, max, ...), and
every torch.tensor / as_tensor / from_numpy call (tensors built from Python data do not reach
the dispatcher as a factory). Views, in-place and out= ops share an input's storage and are not
counted. Each count names the op and the Python line that called it."""
from __future__ import annotations

import contextlib
import os
import sys
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import mla
import oracle
from cases import LatentPool, PagedCase
from mla.backend import Backend

_TORCH_DIR = os.path.dirname(torch.__file__)
_MLA_DIR = os.path.dirname(mla.__file__)
H, P = 16, 16
STEPS, WARMUP, LAYERS = 4, 2, 3


def _caller() -> tuple:
    """The Python frames (file:line) outside torch and this file that led to an op, innermost
    first."""
    frames, f = [], sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_TORCH_DIR) and name != __file__:
            frames.append(f"{os.path.relpath(name, os.path.dirname(_MLA_DIR))}:{f.f_lineno}")
        f = f.f_back
    return tuple(frames)


class _Allocations(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []  # (op, frames)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ins = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0]
               if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in ins:
                self.seen.append((str(func), _caller()))
        return out


@contextlib.contextmanager
def count_allocations(monkeypatch):
    """Yields the list of (op, frames) of every tensor created with new storage inside."""
    mode = _Allocations()
    for name in ("tensor", "as_tensor", "from_numpy"):
        real = getattr(torch, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            t = _real(*args, **kwargs)
            if not (_name == "as_tensor" and isinstance(args[0], torch.Tensor)
                    and t.untyped_storage()._cdata == args[0].untyped_storage()._cdata):
                mode.seen.append((f"torch.{_name}", _caller()))
            return t

        monkeypatch.setattr(torch, name, counted)
    with mode:
        yield mode.seen
    monkeypatch.undo()


def _case(bs=6, seed=5):
    kv_lens = [40 + 23 * b for b in range(bs)]  # the last step's lengths
    return PagedCase(page_size=P, kv_lens=kv_lens, q_lens=[1] * bs, heads=H, layout="shuffled",
                     seed=seed)


def _step_lengths(case, step):
    """Step s of STEPS + WARMUP: every request one token longer than the step before."""
    back = STEPS + WARMUP - 1 - step
    return [k - back for k in case.kv_lens]


def _decode_inputs(case, step, device):
    """(seq_lens, out_cache_loc, q, q_rope, c_kv, k_pe) of one step, made before counting."""
    seq = _step_lengths(case, step)
    loc = torch.stack([case.slots(b)[s - 1] for b, s in enumerate(seq)])
    g = torch.Generator().manual_seed(step)
    bs = len(seq)
    q = (torch.randn(bs, H, 576, generator=g) * 0.5).to(torch.bfloat16).to(device)
    rows = (torch.randn(bs, 576, generator=g) * 0.5).to(torch.bfloat16).to(device)
    return (torch.tensor(seq, dtype=torch.int64), loc.to(device), q[..., :512], q[..., 512:],
            rows[:, None, :512], rows[:, None, 512:])


def _steady_allocations(step, monkeypatch):
    """Runs step(s) for the WARMUP steps, then counts the allocations of the next STEPS:
    (what count_allocations saw, the last step's result)."""
    for s in range(WARMUP):
        step(s)
    last = None
    with count_allocations(monkeypatch) as seen:
        for s in range(WARMUP, WARMUP + STEPS):
            last = step(s)
    return seen, last


def _report(seen):
    return "\n".join(f"{op} from {' <- '.join(frames[:3])}" for op, frames in seen)


@pytest.mark.parametrize("family", ["paged_mla", "chunked_mla", "ondemand_mla"])
def test_backend_decode_steady_state_allocates_nothing(family, device, monkeypatch):
    case = _case().to(device)
    buf = case.cache.clone().view(-1, 1, 576)
    be = Backend(family, num_heads=H, page_size=P, device=device, sm_scale=case.sm_scale,
                 token_to_kv_pool=LatentPool(buf),
                 req_to_token_pool=SimpleNamespace(req_to_token=case.req_to_token))
    rows64 = case.rows.to(torch.int64)
    steps = [_decode_inputs(case, s, device) for s in range(WARMUP + STEPS)]
    layers = [SimpleNamespace(layer_id=i, scaling=case.sm_scale, tp_q_head_num=H, head_dim=576,
                              v_head_dim=512) for i in range(LAYERS)]
    batches = [SimpleNamespace(forward_mode="decode", seq_lens=seq.to(device), seq_lens_cpu=seq,
                               req_pool_indices=rows64.to(device), req_pool_indices_cpu=rows64,
                               out_cache_loc=loc)
               for seq, loc, *_ in steps]

    def step(s):
        fb = batches[s]
        be.init_forward_metadata(fb)
        _, _, q, q_rope, c_kv, k_pe = steps[s]
        for layer in layers:
            o = be.forward_decode(q, c_kv, None, layer, fb, q_rope=q_rope, k_rope=k_pe)
        return o

    seen, o = _steady_allocations(step, monkeypatch)
    assert not seen, f"{len(seen)} allocations in {STEPS} steady decode steps:\n{_report(seen)}"
    # The result is still right: the last step against the float64 oracle, over the rows the
    # steps wrote through kv_write.
    seq, loc, q, q_rope, c_kv, k_pe = steps[-1]
    cache = case.cache.clone()
    for s in range(WARMUP + STEPS):
        cache[steps[s][1]] = torch.cat([steps[s][4], steps[s][5]], -1)[:, 0]
    ref, _ = oracle.absorbed(torch.cat([q, q_rope], -1), cache,
                             [case.slots(b)[:int(n)] for b, n in enumerate(seq)],
                             [1] * len(seq), case.sm_scale, True)
    assert oracle.rel_err(o.view(len(seq), H, 512), ref) < 1e-2


def test_sglang_adapter_decode_steady_state_allocates_nothing(monkeypatch):
    """The SGLang adapter inside the real SGLang: init_forward_metadata_out_graph (what SGLang
    calls before each decode step) and RadixAttention.forward per layer. SGLang's own write door
    (MLATokenToKVPool.set_mla_kv_buffer, the engine's code) is left out of the count."""
    pytest.importorskip("sglang.srt.layers.attention.base_attn_backend",
                        reason="sglang 0.5.23 is not installed (scripts/setup-engines.sh)")
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.runtime_context import get_parallel
    import sglang_env as env

    case = _case(seed=9)
    with get_parallel().override(attn_tp_size=1, attn_dcp_size=1, attn_dcp_rank=0):
        be = env.backend("mla_paged", case, heads=H)
        rows64 = case.rows.to(torch.int64)
        steps = [_decode_inputs(case, s, "cpu") for s in range(WARMUP + STEPS)]
        layers = [env.attn_mqa(H, case.sm_scale, layer_id=0) for _ in range(LAYERS)]
        batches = [ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=len(seq),
                                input_ids=torch.zeros(len(seq), dtype=torch.int64),
                                req_pool_indices=rows64, seq_lens=seq, out_cache_loc=loc,
                                seq_lens_sum=int(seq.sum()), seq_lens_cpu=seq,
                                req_pool_indices_cpu=rows64)
                   for seq, loc, *_ in steps]

        def step(s):
            fb = batches[s]
            be.init_forward_metadata_out_graph(fb)
            _, _, q, q_rope, c_kv, k_pe = steps[s]
            with forward_context(ForwardContext(attn_backend=be)):
                for layer in layers:
                    o = layer.forward(q, c_kv, c_kv, fb, q_rope=q_rope, k_rope=k_pe)
            return o

        seen, _ = _steady_allocations(step, monkeypatch)
    ours = [(op, frames) for op, frames in seen
            if not any("mem_cache/memory_pool.py" in f for f in frames)]
    assert not ours, (f"{len(ours)} allocations in {STEPS} steady decode steps:\n"
                      f"{_report(ours)}")


def test_plan_reads_int64_host_lengths_in_place():
    """The plan op reads SGLang's int64 host mirrors itself (no conversion per plan in Python):
    the same plan bytes as from int32, the extents the run's table check uses, and an entry
    that does not fit int32 named."""
    from mla import ops
    rows, kv = [3, 1, 2], [70, 5, 129]
    a = ops.AbsorbedPlan("cpu", H, P, max_batch=4, max_q_tokens=4)
    b = ops.AbsorbedPlan("cpu", H, P, max_batch=4, max_q_tokens=4)
    a.plan_tensor.zero_()  # the bytes past what a plan uses are compared too
    b.plan_tensor.zero_()
    a.plan(torch.tensor(rows, dtype=torch.int32), torch.ones(3, dtype=torch.int32),
           torch.tensor(kv, dtype=torch.int32))
    b.plan(torch.tensor(rows), torch.ones(3, dtype=torch.int64), torch.tensor(kv))
    assert torch.equal(a.plan_tensor[:a.plan_bytes], b.plan_tensor[:b.plan_bytes])
    assert (b._max_row, b._max_kv, b._flat_end) == (3, 129, 2 + 9)  # row 2 + ceil(129 / 16)
    with pytest.raises(ValueError, match=r"kv_lens\[1\] = 4294967296 does not fit int32"):
        b.plan(torch.tensor(rows), torch.ones(3, dtype=torch.int64),
               torch.tensor([1, 2**32, 3]))
