"""mla.Backend through SGLang's call order, against stubs that copy SGLang 0.5.x's ForwardBatch,
token-pool and KV-pool field names; and the plugin's registration through the stub sglang."""
import importlib
import itertools
import math
import os
import sys
from types import SimpleNamespace

import pytest
import torch

import mla
from mla.backend import Backend

import oracle
from cases import PagedCase

STUB = os.path.join(os.path.dirname(__file__), "sglang_stub")


class ForwardMode:
    def __init__(self, name):
        self.name = name

    def is_decode(self):
        return self.name == "decode"

    def is_extend(self):
        return self.name in ("extend", "mixed", "target_verify", "draft_extend")

    def is_mixed(self):
        return self.name == "mixed"

    def is_target_verify(self):
        return self.name == "target_verify"

    def is_draft_extend(self):
        return self.name == "draft_extend"

    def is_idle(self):
        return self.name == "idle"


class ReqToTokenPool:
    def __init__(self, req_to_token):
        self.req_to_token = req_to_token


class MLATokenToKVPool:
    def __init__(self, kv_buffer):
        self.kv_buffer = kv_buffer  # per layer [slots, 1, 576]

    def get_key_buffer(self, layer_id):
        return self.kv_buffer[layer_id]


def _batch(case, mode, q_lens, kv_lens, prefix, out_cache_loc, device, **extra):
    bs = len(kv_lens)
    seq = torch.tensor(kv_lens if mode != "target_verify" else [k - q for k, q in zip(kv_lens, q_lens)],
                       dtype=torch.int32)
    fb = SimpleNamespace(
        forward_mode=ForwardMode(mode), batch_size=bs,
        req_pool_indices=case.rows.to(device), seq_lens=seq.to(device), seq_lens_cpu=seq,
        out_cache_loc=out_cache_loc.to(device),
        extend_seq_lens_cpu=list(q_lens), extend_prefix_lens_cpu=list(prefix),
        req_to_token_pool=ReqToTokenPool(case.req_to_token),
        token_to_kv_pool=MLATokenToKVPool([case.cache.view(-1, 1, 576)]),
        spec_info=SimpleNamespace(draft_token_num=q_lens[0]), mha_return_lse=False,
        attn_attend_prefix_cache=False, prefix_chunk_idx=0, prefix_chunk_cu_seq_lens=None)
    for k, v in extra.items():
        setattr(fb, k, v)
    return fb


@pytest.mark.parametrize("family", ["paged_mla", "chunked_mla", "ondemand_mla"])
@pytest.mark.parametrize("mode,q_len", [("decode", 1), ("target_verify", 3)])
@pytest.mark.parametrize("split_q", [True, False])
def test_backend_absorbed_modes(device, family, mode, q_len, split_q):
    H, P = 16, 16
    kv_lens = [q_len + 20, q_len + 3, q_len + 40]
    case = PagedCase(page_size=P, kv_lens=kv_lens, q_lens=[q_len] * 3, heads=H,
                     layout="interleaved", seed=7 + q_len).to(device)
    # The new tokens' latent rows arrive through save_kv_cache (they are in the oracle's cache).
    new_slots = torch.cat([case.slots(b)[-q_len:] for b in range(3)]).to(torch.int32)
    new_rows = case.cache[new_slots.long().to(device)].clone()
    case.cache[new_slots.long().to(device)] = 0
    be = Backend(family, num_heads=H, page_size=P, device=device, sm_scale=case.sm_scale,
                 max_batch=4, max_q_len=4)
    fb = _batch(case, mode, [q_len] * 3, kv_lens, [k - q_len for k in kv_lens], new_slots, device)
    be.init_forward_metadata(fb)
    layer = SimpleNamespace(layer_id=0, scaling=case.sm_scale, tp_q_head_num=H)
    c_kv, k_pe = new_rows[:, :512].reshape(-1, 1, 512), new_rows[:, 512:].reshape(-1, 1, 64)
    T = 3 * q_len
    if split_q:
        q, q_rope = case.q[..., :512].reshape(T, H * 512), case.q[..., 512:].reshape(T, H * 64)
    else:
        q, q_rope = case.q.reshape(T, H * 576), None
    fwd = be.forward_decode if mode == "decode" else be.forward_extend
    o = fwd(q, c_kv, None, layer, fb, save_kv_cache=True, q_rope=q_rope, k_rope=k_pe)
    assert o.shape == (T, H * 512)
    ref_o, _ = oracle.absorbed(case.q, case.cache, [case.slots(b) for b in range(3)],
                               [q_len] * 3, case.sm_scale, True)
    assert oracle.rel_err(o.view(T, H, 512), ref_o) < 1e-2
    assert torch.equal(case.cache[new_slots.long().to(device)], new_rows)
    ledger = be.memory_ledger()
    assert ledger and all(set(r) == {"name", "owner", "device", "bytes", "zeroed"} for r in ledger)


def test_backend_extend_mha_paths(device):
    H, P = 16, 16
    q_lens, prefix = [4, 2], [0, 0]
    kv_lens = [q + p for q, p in zip(q_lens, prefix)]
    case = PagedCase(page_size=P, kv_lens=kv_lens, q_lens=q_lens, heads=H, layout="shuffled",
                     seed=2).to(device)
    be = Backend("chunked_mla", num_heads=H, page_size=P, device=device, sm_scale=0.1,
                 max_batch=4)
    fb = _batch(case, "extend", q_lens, kv_lens, prefix, torch.zeros(6, dtype=torch.int32), device,
                mha_return_lse=True)
    be.init_forward_metadata(fb)
    assert be.forward_method == "mha"
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(6, H, 192, generator=g) * 0.5).to(torch.bfloat16).to(device)
    k = (torch.randn(6, H, 192, generator=g) * 0.5).to(torch.bfloat16).to(device)
    v = (torch.randn(6, H, 128, generator=g) * 0.5).to(torch.bfloat16).to(device)
    layer = SimpleNamespace(layer_id=0, scaling=0.1, tp_q_head_num=H)
    o, lse = be.forward_extend(q, k, v, layer, fb, save_kv_cache=False)
    ref_o, ref_lse = oracle.mha(q, k, v, [0, 4, 6], [0, 4, 6], 0.1, True)
    assert oracle.rel_err(o, ref_o) < 1e-2 and oracle.lse_close(lse, ref_lse) < 1e-2

    # With a prefix: chunked_mla plans the engine's prefix chunks (non-causal) and the causal
    # pass over the new tokens.
    prefix = [30, 12]
    kv_lens = [q + p for q, p in zip(q_lens, prefix)]
    fb = _batch(case, "extend", q_lens, kv_lens, prefix, torch.zeros(6, dtype=torch.int32), device,
                mha_return_lse=True,
                prefix_chunk_cu_seq_lens=[torch.tensor([0, 20, 32], dtype=torch.int32),
                                          torch.tensor([0, 10, 10], dtype=torch.int32)])
    be.init_forward_metadata(fb)
    assert be.forward_method == "mha_chunked"
    be.init_mha_chunk_metadata(fb)
    ck = (torch.randn(32, H, 192, generator=g) * 0.5).to(torch.bfloat16).to(device)
    cv = (torch.randn(32, H, 128, generator=g) * 0.5).to(torch.bfloat16).to(device)
    fb.attn_attend_prefix_cache, fb.prefix_chunk_idx = True, 0
    o, lse = be.forward_extend(q, ck, cv, layer, fb, save_kv_cache=False)
    ref_o, ref_lse = oracle.mha(q, ck, cv, [0, 4, 6], [0, 20, 32], 0.1, False)
    assert oracle.rel_err(o, ref_o) < 1e-2 and oracle.lse_close(lse, ref_lse) < 1e-2
    # paged_mla takes the absorbed path for short prefixes.
    pb = Backend("paged_mla", num_heads=H, page_size=P, device=device, sm_scale=0.1, max_batch=4)
    pb.init_forward_metadata(fb)
    assert pb.forward_method == "absorbed"


def test_backend_cuda_graph_methods(device):
    H, P = 16, 16
    case = PagedCase(page_size=P, kv_lens=[9, 30, 17, 5], q_lens=[1] * 4, heads=H,
                     layout="reversed", seed=4).to(device)
    be = Backend("paged_mla", num_heads=H, page_size=P, device=device, sm_scale=case.sm_scale,
                 max_batch=4)
    be.init_cuda_graph_state(4, 4)
    assert be.get_cuda_graph_seq_len_fill_value() == 1
    seq = torch.tensor([9, 30, 17, 5], dtype=torch.int32)
    be.init_forward_metadata_capture_cuda_graph(4, 4, case.rows, seq, None,
                                                ForwardMode("decode"), None)
    be.init_forward_metadata_replay_cuda_graph(4, case.rows, seq, int(seq.sum()), None,
                                               ForwardMode("decode"), None, seq)
    fb = _batch(case, "decode", [1] * 4, [9, 30, 17, 5], [8, 29, 16, 4],
                torch.zeros(4, dtype=torch.int32), device)
    layer = SimpleNamespace(layer_id=0, scaling=case.sm_scale, tp_q_head_num=H)
    o = be.forward_decode(case.q.reshape(4, -1), None, None, layer, fb, save_kv_cache=False)
    ref_o, _ = oracle.absorbed(case.q, case.cache, [case.slots(b) for b in range(4)], [1] * 4,
                               case.sm_scale, True)
    assert oracle.rel_err(o.view(4, H, 512), ref_o) < 1e-2
    assert be.stats["graph_replays"] == 1


def test_bad_family_name():
    with pytest.raises(ValueError, match="name = 'mla_fast'"):
        Backend("mla_fast", num_heads=16, page_size=16, device="cpu", sm_scale=0.1)


@pytest.fixture
def stub_sglang(monkeypatch):
    monkeypatch.syspath_prepend(STUB)
    for m in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, m)
    import sglang
    return sglang


def test_plugin_registers_three_backends(stub_sglang):
    from mla.integrations import sglang as plugin
    plugin.register()
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES
    for name in ("mla_paged", "mla_chunked", "mla_ondemand"):
        assert name in ATTENTION_BACKEND_CHOICES and name in ATTENTION_BACKENDS
    runner = SimpleNamespace(model_config=SimpleNamespace(num_attention_heads=128, scaling=0.1),
                             tp_size=8, page_size=64, device="cpu", kv_cache_dtype=torch.bfloat16,
                             server_args=SimpleNamespace(max_running_requests=8))
    be = ATTENTION_BACKENDS["mla_chunked"](runner)
    assert be.name == "chunked_mla" and be.num_heads == 16 and be.page_size == 64


def test_plugin_refuses_sglang_without_the_registry(stub_sglang, monkeypatch):
    from mla.integrations import sglang as plugin
    import sglang.srt.server_args as server_args
    monkeypatch.setattr(stub_sglang, "__version__", "0.4.9")
    monkeypatch.delattr(server_args, "add_attention_backend_choices")
    with pytest.raises(plugin.UnsupportedSGLangVersion,
                       match=r"SGLang 0\.4\.9 is not supported: "
                             r"sglang\.srt\.server_args\.add_attention_backend_choices is missing"):
        plugin.register()


def test_plugin_refuses_a_changed_replay_signature(stub_sglang, monkeypatch):
    from mla.integrations import sglang as plugin
    import sglang.srt.layers.attention.base_attn_backend as base

    def replay(self, bs, req_pool_indices, seq_lens, forward_mode, spec_info):
        raise NotImplementedError()

    monkeypatch.setattr(base.AttentionBackend, "init_forward_metadata_replay_cuda_graph", replay)
    with pytest.raises(plugin.UnsupportedSGLangVersion, match=r"replay_cuda_graph takes"):
        plugin.register()
