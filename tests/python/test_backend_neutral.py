"""mla.Backend without any engine installed: pools given to the constructor (a pool with only
get_key_buffer: new rows go through mla's kv_write op), decode against the float64 oracle on
every device; the family name and kv_cache_dtype checks."""
from types import SimpleNamespace

import pytest
import torch

from mla.backend import Backend

import oracle
from cases import PagedCase


class LatentPool:
    def __init__(self, buffer):
        self.buffer = buffer  # [slots, 1, 576]

    def get_key_buffer(self, layer_id):
        return self.buffer


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
