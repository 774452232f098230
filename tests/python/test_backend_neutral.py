"""mla.Backend without any engine installed: pools given to the constructor (a pool with only
get_key_buffer: new rows go through mla's kv_write op), decode against the float64 oracle on
every device; the family name and kv_cache_dtype checks."""
from types import SimpleNamespace

import pytest
import torch

from mla.backend import Backend

import oracle
from cases import LatentPool, PagedCase


def test_decode_with_engine_pools_and_kv_write(device):
    H, P = 16, 16
    case = PagedCase(page_size=P, kv_lens=[9, 30, 17], q_lens=[1] * 3, heads=H,
                     layout="shuffled", seed=3).to(device)
    new = torch.stack([case.slots(b)[-1] for b in range(3)]).to(device)
    rows = case.cache[new].clone()
    buf = case.cache.clone().view(-1, 1, 576)
    buf[new] = 0
    be = Backend("ondemand_mla", num_heads=H, page_size=P, device=device, sm_scale=0.0,
                 token_to_kv_pool=LatentPool(buf),
                 req_to_token_pool=SimpleNamespace(req_to_token=case.req_to_token))
    seq = torch.tensor([9, 30, 17], dtype=torch.int32)
    fb = SimpleNamespace(forward_mode="decode", seq_lens=seq.to(device), seq_lens_cpu=seq,
                         req_pool_indices=case.rows.to(device), req_pool_indices_cpu=case.rows,
                         out_cache_loc=new.to(torch.int32))
    be.init_forward_metadata(fb)
    layer = SimpleNamespace(layer_id=0, scaling=case.sm_scale, tp_q_head_num=H, head_dim=576,
                            v_head_dim=512)
    o = be.forward_decode(case.q, rows[:, None, :], None, layer, fb)
    ref, _ = oracle.absorbed(case.q, case.cache, [case.slots(b) for b in range(3)], [1] * 3,
                             case.sm_scale, True)
    assert oracle.rel_err(o.view(3, H, 512), ref) < 1e-2
    assert torch.equal(buf[new].view(-1, 576), rows)


def test_bad_family_name_and_kv_cache_dtype():
    with pytest.raises(ValueError, match="name = 'mla_fast'"):
        Backend("mla_fast", num_heads=16, page_size=16, device="cpu", sm_scale=0.1)
    with pytest.raises(ValueError, match=r"kv_cache_dtype = torch\.float16"):
        Backend("paged_mla", num_heads=16, page_size=16, device="cpu", sm_scale=0.1,
                kv_cache_dtype=torch.float16)


def test_import_mla_does_not_import_an_engine():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import sys, mla; print('sglang' in sys.modules)"],
                         capture_output=True, text=True, check=True).stdout.split()[-1]
    assert out == "False"


def test_native_library_refuses_another_torch_minor_version():
    from mla import _native
    _native.check_torch_version("2.11.0+cu130", "2.11.3")  # same ABI: accepted
    _native.check_torch_version(None, "2.14.1")  # not recorded (an in-tree build): accepted
    with pytest.raises(ImportError, match=r"built against torch 2\.11\.0, but torch 2\.14\.1 "
                                          r"is running"):
        _native.check_torch_version("2.11.0", "2.14.1")


def test_forward_method_is_the_cpp_rule_and_names_bad_input():
    """torch.ops.mla.forward_method is the C++ backends' chooser (family_forward_method): the
    one-shot form where the capacity holds the batch, the threshold, the fallback; mla.Backend
    asks it for every mode but decode (absorbed, the rule's first line)."""
    fm = torch.ops.mla.forward_method
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    # paged_mla: MHA without a prefix (one-shot when the batch fits the capacity), absorbed
    # below the threshold, chunked above it unless the chunked prefix cache is off.
    assert fm("paged_mla", "extend", i32([0, 0]), 30, 8192, 4096, False, False, False) \
        == "mha_one_shot"
    assert fm("paged_mla", "extend", i32([0, 0]), 30, 8192, 0, False, False, False) \
        == "mha_chunked"
    assert fm("paged_mla", "mixed", i32([10, 0]), 30, 8192, 0, False, False, False) == "absorbed"
    assert fm("paged_mla", "extend", i32([9000, 0]), 9030, 8192, 0, False, False, False) \
        == "mha_chunked"
    assert fm("paged_mla", "extend", i32([9000, 0]), 9030, 8192, 0, True, False, False) \
        == "absorbed"
    # chunked_mla / ondemand_mla: chunked unless the fallback rule holds.
    for fam in ("chunked_mla", "ondemand_mla"):
        assert fm(fam, "extend", i32([3]), 9, 8192, 0, False, False, False) == "mha_chunked"
        assert fm(fam, "extend", i32([3]), 9, 8192, 0, True, False, False) == "absorbed"
        assert fm(fam, "extend", i32([0]), 9, 8192, 0, True, False, False) == "mha_chunked"
        assert fm(fam, "extend", i32([0]), 9, 8192, 0, False, True, False) == "absorbed"
        assert fm(fam, "extend", i32([0]), 9, 8192, 0, False, False, True) == "absorbed"
    for mode in ("decode", "target_verify", "draft_extend", "idle"):
        for fam in ("paged_mla", "chunked_mla", "ondemand_mla"):
            assert fm(fam, mode, i32([4]), 9, 0, 0, False, False, False) == "absorbed"
    # mla.Backend plans through the C++ engine planner (the same rule): its two MHA forms are
    # "mha" without a prefix and "mha_chunked" with one.
    be = Backend("paged_mla", num_heads=16, page_size=16, device="cpu", sm_scale=0.1,
                 mha_prefix_threshold=32)
    seq = [40, 5]

    def method(mode, prefix=(0, 0)):
        be.init_forward_metadata(SimpleNamespace(
            forward_mode=mode, seq_lens_cpu=i32(seq), req_pool_indices_cpu=i32([1, 2]),
            extend_prefix_lens_cpu=i32(list(prefix)),
            extend_seq_lens_cpu=i32([s - p for s, p in zip(seq, prefix)]),
            spec_info=SimpleNamespace(draft_token_num=2)))
        return be.forward_method

    assert method("decode") == "absorbed"
    assert method("target_verify") == "absorbed"
    assert method("extend", (0, 0)) == "mha"
    assert method("extend", (30, 0)) == "absorbed"
    assert method("extend", (35, 0)) == "mha_chunked"
    with pytest.raises(ValueError, match="backend 'flashinfer' has no forward-method rule"):
        fm("flashinfer", "extend", i32([0]), 9, 0, 0, False, False, False)
    with pytest.raises(ValueError, match="mode = 'prefill_v2'"):
        fm("paged_mla", "prefill_v2", i32([0]), 9, 0, 0, False, False, False)
    with pytest.raises(ValueError, match="prefix_lens"):
        fm("paged_mla", "extend", torch.zeros(2, dtype=torch.int64), 9, 0, 0, False, False, False)
