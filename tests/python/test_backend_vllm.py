"""mla's vLLM backend (MLA_PAGED) against the real vLLM 0.34 classes, on CPU tensors.

Needs vllm installed beside mla (scripts/setup-engines-vllm.sh installs it with --no-deps and
the few packages its imports need); without it every test here is skipped, with the reason.
What runs for real: vLLM's plugin loader (the `vllm.general_plugins` entry point of the
installed mla package), its backend registry and config parser, its platform checks
(validate_configuration), MLACommonMetadataBuilder.build (batch split into decodes and
prefills, then our _build_decode) and MLACommonImpl's constructor; our forward_mqa is compared
with the float64 oracle. Two stand-ins, for what needs a downloaded model or a GPU: the model
config (head count, dtype, head size) and the attention layer object the builder reads its MLA
dimensions and prefill backend from (the prefill backend itself is vLLM's real CPU SDPA one).
vLLM's CPU platform refuses any config without triton-cpu, so that one platform hook is patched
while the config is created.
"""
import os
import types

import pytest
import torch

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # before vllm.platforms is first imported
try:
    import vllm  # noqa: F401
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
except Exception as e:  # noqa: BLE001 (any import failure means: no usable vllm here)
    pytest.skip(f"vllm is not importable ({type(e).__name__}: {e}); run "
                "scripts/setup-engines-vllm.sh to install it", allow_module_level=True)

import mla
import mla.integrations.vllm as mla_vllm
import oracle
from cases import PagedCase

HEADS = 16
SCALE = 0.1


@pytest.fixture(scope="module")
def backend():
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    return AttentionBackendEnum.MLA_PAGED.get_class()


def test_entry_point_is_installed():
    from importlib.metadata import entry_points
    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("mla") == "mla.integrations.vllm:register"


def test_plugin_loader_registers_the_name(backend):
    from vllm.config.attention import AttentionConfig
    from mla.integrations.vllm.backend import MlaPagedBackend
    assert backend is MlaPagedBackend
    assert backend.get_name() == "MLA_PAGED" and backend.is_mla()
    # The parser's path for --attention-backend: a string, any case, to the enum member.
    assert AttentionConfig(backend="mla_paged").backend is AttentionBackendEnum.MLA_PAGED
    mla_vllm.register()  # idempotent: vLLM calls plugins once per process, maybe many
    assert AttentionBackendEnum["MLA_PAGED"].get_path() == mla_vllm.BACKEND_CLASS


def test_command_line_selects_mla(backend):
    """`--attention-backend MLA_PAGED` through vLLM's own parser and EngineArgs, to the config
    vLLM builds (create_engine_config needs a model, so the last step is AttentionConfig's own
    parsing of what EngineArgs passes it)."""
    from vllm.config.attention import AttentionConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(["--attention-backend", "MLA_PAGED"]))
    assert (AttentionConfig(backend=args.attention_backend).backend
            is AttentionBackendEnum.MLA_PAGED)
    with pytest.raises(Exception, match="MLA_NOPE"):
        AttentionConfig(backend="MLA_NOPE")


def test_import_mla_does_not_import_vllm():
    import subprocess
    import sys
    code = "import sys, mla, mla.integrations.vllm; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_validate_configuration(backend):
    from vllm.platforms.interface import DeviceCapability
    base = dict(head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=64,
                use_mla=True, has_sink=False, use_sparse=False, use_mm_prefix=False,
                use_per_head_quant_scales=False, device_capability=DeviceCapability(9, 0),
                attn_type="decoder")

    def reasons(**kw):
        return backend.validate_configuration(**{**base, **kw})

    cuda_reason = [] if mla.has_cuda_ops() else [backend.supports_combination(
        576, torch.bfloat16, "auto", 64, True, False, False, False, DeviceCapability(9, 0))]
    assert reasons() == cuda_reason
    if not mla.has_cuda_ops():
        assert "has_cuda_ops() is False" in cuda_reason[0]
    assert "head_size not supported" in reasons(head_size=512)
    assert "dtype not supported" in reasons(dtype=torch.float16)
    assert "kv_cache_dtype not supported" in reasons(kv_cache_dtype="fp8_ds_mla")
    assert "compute capability not supported" in reasons(device_capability=DeviceCapability(7, 5))
    assert "sparse not supported" in reasons(use_sparse=True)
    assert reasons(kv_cache_dtype="fp8_e4m3") == cuda_reason
    for size in (1, 16, 32, 64, 128):
        assert backend.supports_block_size(size)


def test_reports_gpus_without_mla_kernels_unsupported(backend):
    # vLLM asks supports_compute_capability when it selects a backend (validate_configuration):
    # mla's kernels are sm_90a, so only 9.0 is supported, by the C++ rule (mla.support); on an
    # A100, an L40S, a B200 or an RTX 50xx vLLM is told "compute capability not supported" and
    # picks another backend.
    from vllm.platforms.interface import DeviceCapability
    assert backend.supports_compute_capability(DeviceCapability(9, 0))
    assert not backend.supports_compute_capability(None)
    for major, minor in ((8, 0), (8, 9), (10, 0), (12, 0)):
        cap = DeviceCapability(major, minor)
        assert not backend.supports_compute_capability(cap)
        reasons = backend.validate_configuration(
            head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=64,
            use_mla=True, has_sink=False, use_sparse=False, use_mm_prefix=False,
            use_per_head_quant_scales=False, device_capability=cap, attn_type="decoder")
        assert "compute capability not supported" in reasons


def _vllm_config(monkeypatch, max_num_seqs=8):
    from vllm.config import DeviceConfig, VllmConfig
    from vllm.platforms import current_platform
    monkeypatch.setattr(type(current_platform), "check_and_update_config",
                        classmethod(lambda cls, cfg: None))
    cfg = VllmConfig(device_config=DeviceConfig(device="cpu"))
    cfg.scheduler_config.max_num_seqs = max_num_seqs

    class ModelConfig:  # what the builder reads of a model config (no model download)
        dtype = torch.bfloat16
        max_model_len = 4096

        def get_num_attention_heads(self, parallel_config):
            return HEADS

        def get_head_size(self):
            return 576

    object.__setattr__(cfg, "model_config", ModelConfig())
    return cfg


def _builder(backend, monkeypatch, page_size, kv_lora_rank=512):
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.mla.prefill.cpu_sdpa import CPUSDPAMLAPrefillBackend
    from vllm.v1.kv_cache_interface import MLAAttentionSpec
    cfg = _vllm_config(monkeypatch)
    prefill = CPUSDPAMLAPrefillBackend(num_heads=HEADS, scale=SCALE, kv_lora_rank=kv_lora_rank,
                                       qk_nope_head_dim=128, qk_rope_head_dim=64,
                                       v_head_dim=128, vllm_config=cfg)
    layer = types.SimpleNamespace(q_lora_rank=None, kv_lora_rank=kv_lora_rank,
                                  qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                                  prefill_backend=prefill)
    cfg.compilation_config.static_forward_context["model.layers.0.attn"] = layer
    spec = MLAAttentionSpec(block_size=page_size, num_kv_heads=1, head_size=576,
                            dtype=torch.bfloat16)
    with set_current_vllm_config(cfg):
        return backend.get_builder_cls()(spec, ["model.layers.0.attn"], cfg,
                                         torch.device("cpu")), cfg


def _impl(backend, cfg, kv_cache_dtype="auto", **over):
    from vllm.config import set_current_vllm_config
    args = dict(num_heads=HEADS, head_size=576, scale=SCALE, num_kv_heads=1, alibi_slopes=None,
                sliding_window=None, kv_cache_dtype=kv_cache_dtype, logits_soft_cap=None,
                attn_type="decoder", kv_sharing_target_layer_name=None, q_lora_rank=None,
                kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, qk_head_dim=192,
                v_head_dim=128, kv_b_proj=None)
    args.update(over)
    with set_current_vllm_config(cfg):
        return backend.get_impl_cls()(**args)


def _common_metadata(case, q_lens, extra_block_cols=3):
    from vllm.v1.attention.backend import CommonAttentionMetadata
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    seq = torch.tensor(case.kv_lens, dtype=torch.int32)
    # vLLM's block table is wider than any request needs; the tail is page 0.
    bt = torch.cat([case.block_table,
                    torch.zeros(len(q_lens), extra_block_cols, dtype=torch.int32)], dim=1)
    tokens = int(qsl[-1])
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq,
        num_reqs=len(q_lens), num_actual_tokens=tokens, max_query_len=max(q_lens),
        max_seq_len=max(case.kv_lens), block_table_tensor=bt,
        slot_mapping=torch.zeros(tokens, dtype=torch.int64), seq_lens_cpu_upper_bound=seq)


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("q_lens", [[1, 1, 1, 1], [2, 2, 2], [1, 4, 2]])  # decode, verify, mixed
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_decode_matches_oracle(backend, monkeypatch, page_size, q_lens, cache_dtype):
    kv_lens = [q + k for q, k in zip(q_lens, [37, 3 * page_size, 5, 70])]
    case = PagedCase(page_size=page_size, kv_lens=kv_lens, q_lens=q_lens, heads=HEADS,
                     layout="shuffled", cache_dtype=cache_dtype, seed=page_size + len(q_lens))
    builder, cfg = _builder(backend, monkeypatch, page_size)
    fp8 = cache_dtype == torch.float8_e4m3fn
    impl = _impl(backend, cfg, "fp8" if fp8 else "auto")
    assert impl.supports_quant_query_input is False  # q stays bf16 with an fp8 cache
    md = builder.build(0, _common_metadata(case, q_lens))
    assert (md.num_decodes, md.num_prefills, md.num_decode_tokens) == (len(q_lens), 0,
                                                                       sum(q_lens))
    layer = types.SimpleNamespace(_k_scale_float=case.k_scale)
    cache = case.cache.view(-1, page_size, 576)  # vLLM's [num_blocks, block_size, 576]
    o, lse = impl.forward_mqa(case.q, cache, md, layer)
    assert o.shape == (sum(q_lens), HEADS, 512) and o.dtype == torch.bfloat16
    assert lse is None  # vLLM asks for the LSE only under decode context parallelism
    slots = [oracle.slots_from_block_table(case.block_table, b, kv_lens[b], page_size)
             for b in range(len(q_lens))]
    ref_o, _ = oracle.absorbed(case.q, case.cache, slots, q_lens, SCALE, True, case.k_scale)
    assert oracle.rel_err(o, ref_o) < 1e-2
    # The (q_nope, q_pe) form vLLM passes when it does not fuse the query.
    o2, _ = impl.forward_mqa((case.q[..., :512], case.q[..., 512:]), cache, md, layer)
    assert torch.equal(o, o2)


def test_prefill_rows_go_to_the_base_class(backend, monkeypatch):
    """A request with more query tokens than the decode threshold is a prefill: the base
    class builds its (chunked-context) metadata, and mla plans only the decode rows."""
    q_lens = [1, 1, 20]
    case = PagedCase(page_size=16, kv_lens=[30, 9, 50], q_lens=q_lens, heads=HEADS,
                     layout="shuffled", seed=5)
    builder, cfg = _builder(backend, monkeypatch, 16)
    md = builder.build(0, _common_metadata(case, q_lens))
    assert (md.num_decodes, md.num_prefills, md.num_decode_tokens) == (2, 1, 2)
    assert md.prefill is not None and md.prefill.chunked_context is not None  # prefix of 30
    impl = _impl(backend, cfg)
    o, _ = impl.forward_mqa(case.q[:2], case.cache.view(-1, 16, 576), md,
                            types.SimpleNamespace(_k_scale_float=1.0))
    slots = [oracle.slots_from_block_table(case.block_table, b, case.kv_lens[b], 16)
             for b in range(2)]
    ref_o, _ = oracle.absorbed(case.q[:2], case.cache, slots, [1, 1], SCALE, True)
    assert oracle.rel_err(o, ref_o) < 1e-2


def test_mixed_batch_decode_through_mla_prefill_through_vllm(backend, monkeypatch):
    """One batch, one decode row and one prefill without a cached prefix: the decode row runs
    mla's forward_mqa, the prefill the base class's forward_mha (vLLM's own MHA prefill, here
    its CPU SDPA backend), both from the metadata our builder built. kv_b_proj is a plain
    matrix [H * 256, 512] (vLLM's ColumnParallelLinear needs a tensor-parallel group)."""
    q_lens, kv_lens = [1, 12], [19, 12]
    case = PagedCase(page_size=16, kv_lens=kv_lens, q_lens=q_lens, heads=HEADS,
                     layout="shuffled", seed=13)
    builder, cfg = _builder(backend, monkeypatch, 16)
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(HEADS * 256, 512, generator=g) * 0.05).to(torch.bfloat16)
    impl = _impl(backend, cfg, kv_b_proj=lambda x: (x @ w.t(), None))
    md = builder.build(0, _common_metadata(case, q_lens))
    assert (md.num_decodes, md.num_prefills) == (1, 1) and md.prefill.chunked_context is None
    cache = case.cache.view(-1, 16, 576)
    o_dec, _ = impl.forward_mqa(case.q[:1], cache, md, types.SimpleNamespace(_k_scale_float=1.0))
    slots = oracle.slots_from_block_table(case.block_table, 0, kv_lens[0], 16)
    ref_dec, _ = oracle.absorbed(case.q[:1], case.cache, [slots], [1], SCALE, True)
    assert oracle.rel_err(o_dec, ref_dec) < 1e-2
    # The prefill's latent rows (what vLLM writes into the cache for these tokens) and query.
    rows = case.cache[oracle.slots_from_block_table(case.block_table, 1, 12, 16)]
    kv_c, k_pe = rows[:, :512], rows[:, 512:].unsqueeze(1)
    q = (torch.randn(12, HEADS, 192, generator=g) * 0.5).to(torch.bfloat16)
    out = torch.empty(12, HEADS * 128, dtype=torch.bfloat16)
    impl.forward_mha(q, kv_c, k_pe, cache, md, torch.ones(()), output=out)
    up = (kv_c.double() @ w.double().t()).view(12, HEADS, 256)
    k = torch.cat([up[..., :128], k_pe.double().expand(12, HEADS, 64)], dim=-1)
    ref, _ = oracle.mha(q, k, up[..., 128:], [0, 12], [0, 12], SCALE, True)
    assert oracle.rel_err(out.view(12, HEADS, 128), ref) < 2e-2


def test_bad_input_names_the_field(backend, monkeypatch):
    case = PagedCase(page_size=16, kv_lens=[20, 33], q_lens=[1, 1], heads=HEADS,
                     layout="shuffled", seed=9)
    builder, cfg = _builder(backend, monkeypatch, 16)
    impl = _impl(backend, cfg)
    md = builder.build(0, _common_metadata(case, [1, 1]))
    layer = types.SimpleNamespace(_k_scale_float=1.0)
    cache = case.cache.view(-1, 16, 576)
    with pytest.raises(ValueError, match=r"kv_c_and_k_pe_cache: dtype torch.float16"):
        impl.forward_mqa(case.q, cache.to(torch.float16), md, layer)
    with pytest.raises(ValueError, match=r"kv_c_and_k_pe_cache: shape \(.*, 16, 1, 576\)"):
        impl.forward_mqa(case.q, cache.unsqueeze(-2), md, layer)  # FlashMLA's 4-D view
    with pytest.raises(ValueError, match=r"kv_c_and_k_pe_cache: block_size 32"):
        impl.forward_mqa(case.q, case.cache.view(-1, 32, 576), md, layer)
    with pytest.raises(ValueError, match=r"q: shape \(2, 8, 576\)"):
        impl.forward_mqa(case.q[:, :8], cache, md, layer)
    with pytest.raises(ValueError, match=r"q: dtype torch.float32"):
        impl.forward_mqa(case.q.float(), cache, md, layer)
    with pytest.raises(ValueError, match=r"kv_c_and_k_pe_cache: dtype torch.bfloat16, "
                                         r"expected torch.float8_e4m3fn"):
        _impl(backend, cfg, "fp8").forward_mqa(case.q, cache, md, layer)
    with pytest.raises(ValueError, match="head_size = 512"):
        _impl(backend, cfg, head_size=512)
    with pytest.raises(ValueError, match="kv_lora_rank = 256"):
        _impl(backend, cfg, kv_lora_rank=256)
    with pytest.raises(ValueError, match="qk_rope_head_dim = 32"):
        _impl(backend, cfg, qk_rope_head_dim=32)
    with pytest.raises(ValueError, match="kv_cache_dtype = 'fp8_ds_mla'"):
        _impl(backend, cfg, "fp8_ds_mla")
    with pytest.raises(NotImplementedError, match="sliding_window = 128"):
        _impl(backend, cfg, sliding_window=128)
    with pytest.raises(ValueError, match="block_size = 48"):
        _builder(backend, monkeypatch, 48)
    with pytest.raises(ValueError, match="kv_lora_rank = 256"):
        _builder(backend, monkeypatch, 16, kv_lora_rank=256)


def test_decode_planning_goes_through_the_engine_planner(backend, monkeypatch):
    """The builder plans its decode rows through the C++ engine planner (mla.Backend's): a
    batch past its one plan holder's capacity and a request with more query tokens than keys
    are refused naming what is wrong, before anything is planned."""
    builder, _ = _builder(backend, monkeypatch, 16)

    def build(q_lens, kv_lens):
        qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
        seq = torch.tensor(kv_lens, dtype=torch.int32)
        return builder._build_decode(torch.zeros(len(q_lens), 4, dtype=torch.int32), seq,
                                     max(kv_lens), qsl, qsl, int(qsl[-1]), max(q_lens), None)

    md = build([1, 2], [9, 30])
    assert md.plan is builder.plan and builder.plan.planned
    with pytest.raises(ValueError, match=r"decode batch of 9 requests.*past MLA_PAGED's plan "
                                         r"capacity \(max_num_seqs 8"):
        build([1] * 9, [5] * 9)
    with pytest.raises(ValueError, match=r"extend_seq_lens\[1\] = 3 must be in \[0, "
                                         r"seq_lens\[1\] = 2\]"):
        build([1, 3], [9, 2])
