"""mla's SGLang backends inside the REAL SGLang 0.5.23 (scripts/setup-engines.sh installs it):
its plugin loader and argument parser, AttentionBackend, RadixAttention.forward inside its
forward_context, ForwardBatch, MLATokenToKVPool / ReqToTokenPool and DeepSeek's backend lists,
against the float64 oracle. The tests that take the `device` fixture (conftest.py) run on CPU
tensors and, where a CUDA device and mla's CUDA ops are present, on CUDA tensors too: decode,
target-verify and draft-extend through RadixAttention, extends with a prefix (absorbed and
chunked-prefix MHA), and the CUDA-graph hooks (on CUDA: a real capture and replay). On the GPU
machine scripts/gpu-check.sh runs the CUDA ones (GPU_ENGINE_WHEELS, scripts/gpu-engine-wheels.sh):
there SGLang's own code takes its CUDA paths (Triton / JIT pool writes), so the cpu ones are for
machines without a GPU."""
import argparse

import pytest
import torch

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend",
                    reason="sglang 0.5.23 is not installed (scripts/setup-engines.sh installs it)")

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context  # noqa: E402
from sglang.srt.models.deepseek_common.attention_backend_handler import (  # noqa: E402
    AttentionBackendRegistry, AttnForwardMethod)
from sglang.srt.models.deepseek_common.utils import (  # noqa: E402
    FORWARD_ABSORB_CORE_ATTENTION_BACKENDS)
from sglang.srt.runtime_context import get_parallel  # noqa: E402

from mla.integrations import sglang as plugin  # noqa: E402

import oracle  # noqa: E402
import sglang_env as env  # noqa: E402
from cases import PagedCase  # noqa: E402

NAMES = {"paged_mla": "mla_paged", "chunked_mla": "mla_chunked", "ondemand_mla": "mla_ondemand"}
H, P = 16, 16


@pytest.fixture(autouse=True)
def single_rank():
    # What SGLang publishes at start-up for one rank (the pool's write door reads the DCP width).
    with get_parallel().override(attn_tp_size=1, attn_dcp_size=1, attn_dcp_rank=0):
        yield


def handler_method(backend, fb):
    with forward_context(ForwardContext(attn_backend=backend)):
        return plugin.deepseek_forward_method(None, fb)


def run(backend, layer, fb, *args, **kwargs):
    with forward_context(ForwardContext(attn_backend=backend)):
        return layer.forward(*args, fb, **kwargs)


def test_parser_accepts_mla_names_after_the_real_plugin_loader():
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs
    load_plugins()  # finds mla through the installed package's sglang.srt.plugins entry point
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    for name in NAMES.values():
        args = parser.parse_args(["--model-path", "m", "--attention-backend", name,
                                  "--decode-attention-backend", name])
        assert args.attention_backend == name and args.decode_attention_backend == name
        assert name in ATTENTION_BACKENDS and name in FORWARD_ABSORB_CORE_ATTENTION_BACKENDS
        assert AttentionBackendRegistry.get_handler(name) is plugin.deepseek_forward_method
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-path", "m", "--attention-backend", "mla_fast"])
    plugin.register()  # idempotent: no name twice
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES
    assert ATTENTION_BACKEND_CHOICES.count("mla_paged") == 1
    assert FORWARD_ABSORB_CORE_ATTENTION_BACKENDS.count("mla_paged") == 1


def test_factory_builds_the_real_subclass():
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    plugin.register()
    case = PagedCase(page_size=P, kv_lens=[5], q_lens=[1], heads=H, layout="shuffled", seed=1)
    r = env.runner(case, heads=16, tp_size=8)  # 128 heads over 8 attention-TP ranks
    with get_parallel().override(attn_tp_size=8):
        be = ATTENTION_BACKENDS["mla_chunked"](r)
    assert isinstance(be, AttentionBackend) and be.name == "chunked_mla" and be.num_heads == 16
    assert be.token_to_kv_pool is r.token_to_kv_pool
    assert be.req_to_token_pool is r.req_to_token_pool
    assert type(be).forward is AttentionBackend.forward  # SGLang's own dispatch


def _absorbed_case(mode, q_len, seed):
    kv_lens = [q_len + 20, q_len + 3, q_len + 40]
    return PagedCase(page_size=P, kv_lens=kv_lens, q_lens=[q_len] * 3, heads=H,
                     layout="interleaved", seed=seed)


@pytest.mark.parametrize("family", list(NAMES))
@pytest.mark.parametrize("mode,q_len", [("decode", 1), ("target_verify", 3),
                                        ("draft_extend", 2)])
@pytest.mark.parametrize("split", [True, False])
def test_absorbed_modes_through_radix_attention(family, mode, q_len, split, device):
    case = _absorbed_case(mode, q_len, 7 + q_len)
    be = env.backend(NAMES[family], case, heads=H, device=device)
    slots = env.new_slots(case, [q_len] * 3)
    new_rows = case.cache[slots].clone()
    pool = be.token_to_kv_pool
    pool.kv_buffer[0][slots.to(device)] = 0  # the new rows arrive through save_kv_cache
    spec = type("Spec", (), {"draft_token_num": q_len, "topk": 1})()
    fb = env.batch(case, mode, [q_len] * 3, spec_info=spec, device=device)
    be.init_forward_metadata(fb)
    assert be.forward_method == "absorbed"
    layer = env.attn_mqa(H, case.sm_scale)
    T = 3 * q_len
    q, rows = case.q.to(device), new_rows.to(device)
    c_kv, k_pe = rows[:, None, :512], rows[:, None, 512:]
    if split:  # DeepSeek's form for FORWARD_ABSORB_CORE_ATTENTION_BACKENDS
        o = run(be, layer, fb, q[..., :512], c_kv, c_kv, q_rope=q[..., 512:], k_rope=k_pe)
    else:  # the concatenated form DeepSeek sends other backends
        o = run(be, layer, fb, q, rows[:, None, :], c_kv)
    assert o.shape == (T, H * 512) and o.device == q.device
    ref_o, _ = oracle.absorbed(case.q, case.cache, [case.slots(b) for b in range(3)],
                               [q_len] * 3, case.sm_scale, True)
    assert oracle.rel_err(o.view(T, H, 512), ref_o) < 1e-2
    assert torch.equal(pool.kv_buffer[0][slots.to(device)].view(-1, 576).cpu(), new_rows)


def _copies_the_pool(func, args, pool_storage) -> bool:
    """Whether an op reads the pool's storage into other memory: anything but a view of it, a
    write into it (SGLang's door) or mla's absorbed op taking it as the cache."""
    if func.name() == "mla::absorbed_run" or func.is_view:
        return False
    schema = func._schema.arguments
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == pool_storage:
            info = schema[i].alias_info if i < len(schema) else None
            if info is None or not info.is_write:
                return True
    return False


@pytest.mark.parametrize("family", list(NAMES))
@pytest.mark.parametrize("mode,q_len", [("decode", 1), ("target_verify", 3)])
def test_fp8_pool_is_decoded_in_place(family, mode, q_len, device):
    """--kv-cache-dtype fp8_e4m3 (issue 32): SGLang's pool keeps the latent rows as fp8 bytes
    (a uint8 buffer) and mla decodes straight from it: its absorbed op gets the pool's own
    buffer as float8_e4m3fn, and no op of the layer call copies the pool (SGLang's flashinfer
    MLA path converts the layer's whole pool to bf16 on every call). The new rows go in through
    the pool's door as a plain cast and are read back with k_scale 1, against the float64
    oracle of the fp8 cache."""
    from torch.utils._python_dispatch import TorchDispatchMode
    fp8 = torch.float8_e4m3fn
    case = PagedCase(page_size=P, kv_lens=[q_len + 20, q_len + 3, q_len + 40],
                     q_lens=[q_len] * 3, heads=H, layout="interleaved", cache_dtype=fp8,
                     seed=21 + q_len)
    be = env.backend(NAMES[family], case, heads=H, kv_cache_dtype=fp8, device=device)
    buf = be.token_to_kv_pool.kv_buffer[0]
    assert buf.dtype == torch.uint8  # SGLang's store dtype for fp8
    slots = env.new_slots(case, [q_len] * 3)
    buf[slots.to(device)] = 0  # the new rows arrive through save_kv_cache
    spec = type("Spec", (), {"draft_token_num": q_len, "topk": 1})()
    fb = env.batch(case, mode, [q_len] * 3, spec_info=spec, device=device)
    be.init_forward_metadata(fb)
    layer = env.attn_mqa(H, case.sm_scale)
    q = case.q.to(device)
    rows = case.cache[slots].to(torch.bfloat16).to(device)  # exact: fp8 values are bf16's

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append((func, args))
            return func(*args, **(kwargs or {}))

    calls = Calls()
    with calls:
        o = run(be, layer, fb, q[..., :512], rows[:, None, :512], rows[:, None, :512],
                q_rope=q[..., 512:], k_rope=rows[:, None, 512:])
    storage = buf.untyped_storage().data_ptr()
    runs = [args for func, args in calls.seen if func.name() == "mla::absorbed_run"]
    assert len(runs) == 1
    assert runs[0][1].dtype == fp8 and runs[0][1].untyped_storage().data_ptr() == storage
    copies = [func.name() for func, args in calls.seen if _copies_the_pool(func, args, storage)]
    assert copies == []
    written = buf[slots.to(device)].view(-1, 576).cpu()
    assert torch.equal(written, case.cache[slots].view(torch.uint8))  # the door's plain cast
    T = 3 * q_len
    ref_o, _ = oracle.absorbed(case.q, case.cache, [case.slots(b) for b in range(3)],
                               [q_len] * 3, case.sm_scale, True, k_scale=1.0)
    assert oracle.rel_err(o.view(T, H, 512), ref_o) < 6e-2


def test_refuses_a_k_scale_the_pool_write_door_would_not_apply():
    # SGLang's set_mla_kv_buffer stores a plain cast: rows written through it read back right
    # only with k_scale 1, so another k_scale is refused when the backend is built.
    import mla
    case = PagedCase(page_size=P, kv_lens=[5], q_lens=[1], heads=H, layout="shuffled",
                     cache_dtype=torch.float8_e4m3fn, seed=3)
    r = env.runner(case, heads=H, kv_cache_dtype=torch.float8_e4m3fn)
    kw = dict(num_heads=H, page_size=P, device="cpu", sm_scale=0.1,
              kv_cache_dtype=torch.float8_e4m3fn, token_to_kv_pool=r.token_to_kv_pool,
              req_to_token_pool=r.req_to_token_pool)
    with pytest.raises(ValueError, match=r"k_scale = 0\.5: token_to_kv_pool writes new rows "
                                         r"through its own set_mla_kv_buffer"):
        mla.Backend("paged_mla", k_scale=0.5, **kw)
    mla.Backend("paged_mla", k_scale=1.0, **kw)  # the pool's own convention


def test_idle_batch(device):
    case = _absorbed_case("decode", 1, 3)
    be = env.backend("mla_paged", case, heads=H, device=device)
    e = torch.empty(0, dtype=torch.int64)
    d = e.to(device)
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    fb = ForwardBatch(forward_mode=ForwardMode.IDLE, batch_size=0, input_ids=d,
                      req_pool_indices=d, seq_lens=d.int(), out_cache_loc=d, seq_lens_sum=0,
                      seq_lens_cpu=e.int(), req_pool_indices_cpu=e)
    be.init_forward_metadata(fb)
    q = torch.empty(0, H, 576, dtype=torch.bfloat16, device=device)
    o = run(be, env.attn_mqa(H, 0.1), fb, q,
            torch.empty(0, 1, 576, dtype=torch.bfloat16, device=device),
            torch.empty(0, 1, 512, dtype=torch.bfloat16, device=device))
    assert o.shape == (0, H * 512)


def test_extend_with_prefix_absorbed_paged(device):
    """paged_mla: short prefixes (sum below the threshold) are served absorbed, causal."""
    q_lens = [4, 2]
    case = PagedCase(page_size=P, kv_lens=[30, 14], q_lens=q_lens, heads=H, layout="shuffled",
                     seed=5)
    be = env.backend("mla_paged", case, heads=H, device=device)
    fb = env.batch(case, "extend", q_lens, device=device)
    be.init_forward_metadata(fb)
    assert be.forward_method == "absorbed"
    assert handler_method(be, fb) == AttnForwardMethod.MLA
    layer = env.attn_mqa(H, case.sm_scale)
    new_rows = case.cache[env.new_slots(case, q_lens)].to(device)
    o = run(be, layer, fb, case.q.to(device), new_rows[:, None, :], new_rows[:, None, :512])
    ref_o, _ = oracle.absorbed(case.q, case.cache, [case.slots(b) for b in range(2)], q_lens,
                               case.sm_scale, True)
    assert oracle.rel_err(o.view(6, H, 512), ref_o) < 1e-2


@pytest.mark.parametrize("family", ["chunked_mla", "ondemand_mla"])
def test_extend_with_prefix_chunked(family, monkeypatch, device):
    """DeepSeek's MHA_CHUNKED_KV flow as forward_mha.py runs it: a causal MHA over the new tokens
    returning LSE, then SGLang's own prepare_chunked_prefix_cache_info (several chunks: capacity
    32 over 2 requests), init_mha_chunk_metadata with its 2-D tensors, one non-causal pass per
    chunk, merged; against one causal attention over prefix + new tokens. Only SGLang's
    prepare_chunked_kv_indices (the slots DeepSeek gathers the prefix from: a Triton kernel, no
    CPU path; the backend does not read them) is skipped."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    monkeypatch.setenv("SGLANG_MAX_KV_CHUNK_CAPACITY", "32")
    monkeypatch.setattr(ForwardBatch, "prepare_chunked_kv_indices", lambda *a, **k: None)
    q_lens, prefix = [4, 2], [37, 12]
    kv_lens = [q + p for q, p in zip(q_lens, prefix)]
    case = PagedCase(page_size=P, kv_lens=kv_lens, q_lens=q_lens, heads=H, layout="shuffled",
                     seed=2)
    be = env.backend(NAMES[family], case, heads=H, device=device)
    fb = env.batch(case, "extend", q_lens, device=device)
    be.init_forward_metadata(fb)
    assert be.forward_method == "mha_chunked"
    assert handler_method(be, fb) == AttnForwardMethod.MHA_CHUNKED_KV
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * 0.5).to(torch.bfloat16).to(device)

    q, k, v = rnd(6, H, 192), rnd(6, H, 192), rnd(6, H, 128)
    pk, pv = [rnd(p, H, 192) for p in prefix], [rnd(p, H, 128) for p in prefix]
    layer = env.attn_mha(H, 0.1)
    with forward_context(ForwardContext(attn_backend=be)):
        fb.mha_return_lse = True
        fb.set_attn_attend_prefix_cache(False)
        o, lse = layer.forward(q, k, v, fb, save_kv_cache=False)
        fb.prepare_chunked_prefix_cache_info(device)
        assert fb.num_prefix_chunks == 3 and fb.prefix_chunk_cu_seq_lens.dim() == 2
        # SGLang's chunks are mla's chunk planner's (capacity 32 over the prefixes).
        assert fb.prefix_chunk_seq_lens_cpu.tolist() == torch.ops.mla.chunk_plan(
            torch.tensor(prefix), 32).tolist()
        be.init_mha_chunk_metadata(fb)
        fb.set_attn_attend_prefix_cache(True)
        o, lse = o.view(6, H, 128), lse
        for i in range(fb.num_prefix_chunks):
            fb.set_prefix_chunk_idx(i)
            s, n = fb.prefix_chunk_starts_cpu[i].tolist(), fb.prefix_chunk_seq_lens_cpu[i].tolist()
            ck = torch.cat([pk[b][s[b]:s[b] + n[b]] for b in range(2)])
            cv = torch.cat([pv[b][s[b]:s[b] + n[b]] for b in range(2)])
            co, cl = layer.forward(q, ck, cv, fb, save_kv_cache=False)
            m_o, m_l = oracle.merge(o, lse, co.view(6, H, 128), cl)
            o, lse = m_o.to(torch.bfloat16), m_l.to(torch.float32)
    new = [slice(sum(q_lens[:b]), sum(q_lens[:b + 1])) for b in range(2)]
    full_k = torch.cat([torch.cat([pk[b], k[new[b]]]) for b in range(2)])
    full_v = torch.cat([torch.cat([pv[b], v[new[b]]]) for b in range(2)])
    ref_o, ref_lse = oracle.mha(q, full_k, full_v, [0, 4, 6], [0, kv_lens[0], sum(kv_lens)],
                                0.1, True)
    assert oracle.rel_err(o, ref_o) < 1e-2 and oracle.lse_close(lse, ref_lse) < 2e-2


@pytest.mark.parametrize("family,prefix,method", [
    ("paged_mla", [0, 0], "mha"), ("chunked_mla", [0, 0], "mha"),
    ("paged_mla", [9000, 10], "mha_chunked"), ("chunked_mla", [9, 1], "mha_chunked"),
    ("ondemand_mla", [9, 1], "mha_chunked")])
def test_forward_method_rule(family, prefix, method):
    """The C++ rule (src/planning/forward_method.cc): paged_mla by threshold (8192), chunked_mla
    and ondemand_mla chunked whenever a prefix exists; DeepSeek's handler follows the plan."""
    q_lens = [2, 1]
    case = PagedCase(page_size=P, kv_lens=[q + p for q, p in zip(q_lens, prefix)],
                     q_lens=q_lens, heads=H, layout="shuffled", seed=9)
    be = env.backend(NAMES[family], case, heads=H)
    fb = env.batch(case, "extend", q_lens, prefix=prefix)
    be.init_forward_metadata(fb)
    assert be.forward_method == method
    want = {"mha": AttnForwardMethod.MHA, "mha_chunked": AttnForwardMethod.MHA_CHUNKED_KV}
    assert handler_method(be, fb) == want[method]
    off = env.backend(NAMES[family], case, heads=H, disable_chunked_prefix_cache=True)
    off.init_forward_metadata(fb)
    assert off.forward_method == ("mha" if not any(prefix) else "absorbed")


def test_cuda_graph_hooks_replan_into_the_captured_plan(device):
    """SGLang 0.5.23's graph runner calls: init_cuda_graph_state, init_forward_metadata_out_graph
    (in_capture=True) and _in_graph at capture, a warm-up run, then before each replay
    init_forward_metadata_out_graph of the new batch into the same plan. On CUDA the layer's
    forward (split q / k_rope form, writing the new latent rows through the pool) is captured
    in a torch.cuda.CUDAGraph and replayed over another batch of the same size (new lengths,
    pages, q and write locations copied into the captured tensors); on the cpu the same calls
    run eagerly."""
    case = _absorbed_case("decode", 1, 4)
    be = env.backend("mla_paged", case, heads=H, device=device)
    be.init_cuda_graph_state(4, 4)
    assert be.get_cuda_graph_seq_len_fill_value() == 1
    fb = env.batch(case, "decode", [1] * 3, device=device)
    be.init_forward_metadata_out_graph(fb, in_capture=True)
    be.init_forward_metadata_in_graph(fb)
    captured = be._plan
    assert captured is be._graph_plan
    layer = env.attn_mqa(H, case.sm_scale)
    # The captured inputs: q (split call: q_nope and q_rope views), the new rows, their slots.
    q = case.q.to(device).clone()
    rows = case.cache[env.new_slots(case, [1] * 3)].to(device)

    def forward():
        return run(be, layer, fb, q[..., :512], rows[:, None, :512], rows[:, None, :512],
                   q_rope=q[..., 512:], k_rope=rows[:, None, 512:])

    graph = None
    if device.type == "cuda":
        forward()  # warm-up (SGLang's runner too): first launches load their kernels
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o = forward()
    # Replay: other lengths, planned into the same buffers.
    case2 = PagedCase(page_size=P, kv_lens=[9, 30, 17], q_lens=[1] * 3, heads=H,
                      layout="reversed", seed=11)
    slots2 = env.new_slots(case2, [1] * 3)
    be.token_to_kv_pool.kv_buffer[0][:case2.num_slots] = case2.cache.view(-1, 1, 576)
    be.token_to_kv_pool.kv_buffer[0][slots2.to(device)] = 0  # written by the replayed forward
    r, c = case2.req_to_token.shape
    be.req_to_token_pool.req_to_token[:r, :c] = case2.req_to_token
    fb2 = env.batch(case2, "decode", [1] * 3, device=device)
    be.init_forward_metadata_out_graph(fb2)
    assert be._plan is captured and be.stats["graph_plans"] == 2
    q.copy_(case2.q)
    rows.copy_(case2.cache[slots2])
    if graph is not None:
        fb.out_cache_loc.copy_(fb2.out_cache_loc)  # the runner's static buffers
        graph.replay()
        torch.cuda.synchronize()
    else:
        fb = fb2
        o = forward()
    ref_o, _ = oracle.absorbed(case2.q, case2.cache, [case2.slots(b) for b in range(3)],
                               [1] * 3, case2.sm_scale, True)
    assert oracle.rel_err(o.view(3, H, 512), ref_o) < 1e-2
    assert torch.equal(be.token_to_kv_pool.kv_buffer[0][slots2.to(device)].view(-1, 576).cpu(),
                       case2.cache[slots2])


# ---- bad input: a clear error naming the field ----
@pytest.mark.parametrize("field,value", [("kv_lora_rank", 256), ("qk_rope_head_dim", 32),
                                         ("v_head_dim", 64)])
def test_refuses_an_unsupported_model_shape(field, value):
    case = _absorbed_case("decode", 1, 1)
    with pytest.raises(ValueError, match=rf"model_config\.{field} = {value}"):
        env.backend("mla_paged", case, heads=H, **{field: value})


def test_refuses_a_kv_cache_dtype_it_does_not_store():
    case = _absorbed_case("decode", 1, 1)
    with pytest.raises(ValueError, match=r"model_runner\.kv_cache_dtype = torch\.float16"):
        env.backend("mla_paged", case, heads=H, kv_cache_dtype=torch.float16)


@pytest.mark.parametrize("pool_dtype,rope_dim,match", [
    (torch.float16, 64, r"get_key_buffer\(0\): dtype torch\.float16"),
    (torch.bfloat16, 0, r"get_key_buffer\(0\): shape \(\d+, 1, 512\), expected \[slots, 1, 576\]")])
def test_refuses_a_kv_pool_of_the_wrong_dtype_or_layout(pool_dtype, rope_dim, match):
    # Refused when the backend is built (issue 33), not at the first decode: a server never
    # starts with a pool its decode would refuse.
    case = _absorbed_case("decode", 1, 1)
    with pytest.raises(ValueError, match=match):
        env.backend("mla_paged", case, heads=H, pool_dtype=pool_dtype, rope_dim=rope_dim)


@pytest.mark.parametrize("name", list(NAMES.values()))
@pytest.mark.parametrize("page_size", [8, 256])
def test_refuses_an_unserved_page_size_when_built(name, page_size):
    # SGLang accepts --page-size 8 or 256; mla refuses it when the backend is built (naming the
    # sizes it serves), not after serving prefills with it.
    case = _absorbed_case("decode", 1, 1)
    r = env.runner(case, heads=H)
    r.page_size = page_size
    with pytest.raises(ValueError, match=rf"page_size = {page_size} is not served \(mla serves "
                                         r"page sizes 1, 16, 32, 64, 128 tokens\)"):
        plugin._factory(name)(r)


@pytest.mark.parametrize("capability", [(8, 0), (10, 0)])
def test_reports_a_gpu_without_mla_kernels_unsupported(monkeypatch, capability):
    # An A100 or a B200 (faked: the capability query is monkeypatched): the factory SGLang calls
    # refuses with what mla needs and what it found, and the backends to use instead.
    from mla import UnsupportedDevice, support
    monkeypatch.setattr(support, "compute_capability", lambda device: capability)
    case = _absorbed_case("decode", 1, 1)
    r = env.runner(case, heads=H)
    r.device = "cuda"
    assert plugin.unsupported_reason(r) is not None
    for name in NAMES.values():
        with pytest.raises(UnsupportedDevice,
                           match=rf"--attention-backend {name} is unsupported here: op set "
                                 r"'cuda' has device code for compute capability 9\.0 only, but "
                                 rf"cuda:0 has compute capability {capability[0]}\.0.*Choose "
                                 r"another attention backend"):
            plugin._factory(name)(r)
    r.device = "cpu"
    assert plugin.unsupported_reason(r) is None
    assert isinstance(plugin._factory("mla_paged")(r), AttentionBackend)


@pytest.mark.parametrize("mode", ["DLLM_EXTEND", "SPLIT_PREFILL", "PREBUILT"])
def test_refuses_a_batch_mode_it_does_not_serve(mode):
    case = _absorbed_case("decode", 1, 1)
    be = env.backend("mla_chunked", case, heads=H)
    fb = env.batch(case, "decode", [1] * 3)
    fb.forward_mode = getattr(ForwardMode, mode)
    with pytest.raises(ValueError, match=r"forward_batch\.forward_mode = .*chunked_mla does "
                                         r"not serve"):
        be.init_forward_metadata(fb)


def test_refuses_tree_verify_and_a_head_count_it_was_not_planned_for():
    case = _absorbed_case("target_verify", 2, 1)
    be = env.backend("mla_paged", case, heads=H)
    spec = type("Spec", (), {"draft_token_num": 2, "topk": 4})()
    with pytest.raises(ValueError, match=r"forward_batch\.spec_info\.topk = 4"):
        be.init_forward_metadata(env.batch(case, "target_verify", [2] * 3, spec_info=spec))
    fb = env.batch(case, "decode", [2] * 3)
    fb.forward_mode = ForwardMode.DECODE
    be.init_forward_metadata(env.batch(_absorbed_case("decode", 1, 1), "decode", [1] * 3))
    with pytest.raises(ValueError, match=r"layer\.tp_q_head_num = 8"):
        run(be, env.attn_mqa(8, 0.1), fb, case.q[:3, :8], None, None, save_kv_cache=False)


def test_refuses_sglang_without_the_hooks_it_needs(monkeypatch):
    def out_graph(self, batch):  # a changed signature
        return None

    monkeypatch.setattr(AttentionBackend, "init_forward_metadata_out_graph", out_graph)
    with pytest.raises(plugin.UnsupportedSGLangVersion,
                       match=r"AttentionBackend\.init_forward_metadata_out_graph takes \['batch'\]"):
        plugin.register()
