"""The SGLang 0.5.23 paths a real server takes with mla's names, through SGLang's own code (not
RadixAttention.forward alone): ModelRunner's load-time chunked-prefix gate
(model_runner_components/misc_utils.maybe_disable_chunked_prefix_cache) with the config SGLang
publishes, ModelRunner's backend construction (attention_backend_setup.build_attention_backends),
and the EAGLE / DeepSeek MTP draft worker's DraftBackendFactory (speculative/draft_utils.py),
whose backends then run a draft decode and a draft extend against the float64 oracle (on CPU
tensors, and on CUDA tensors too where a CUDA device and mla's CUDA ops are present: the tests
that take the `device` fixture)."""
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend",
                    reason="sglang 0.5.23 is not installed (scripts/setup-engines.sh installs it)")

from sglang.srt.model_executor.forward_context import ForwardContext, forward_context  # noqa: E402
from sglang.srt.model_executor.model_runner_components import misc_utils  # noqa: E402
from sglang.srt.models.deepseek_common.attention_backend_handler import (  # noqa: E402
    AttnForwardMethod)
from sglang.srt.runtime_context import get_context, get_parallel, get_schedule  # noqa: E402
from sglang.srt.speculative.draft_utils import DraftBackendFactory  # noqa: E402

from mla.integrations import sglang as plugin  # noqa: E402

import oracle  # noqa: E402
import sglang_env as env  # noqa: E402
from cases import PagedCase  # noqa: E402

NAMES = ["mla_paged", "mla_chunked", "mla_ondemand"]
H, P = 16, 16


@pytest.fixture(autouse=True)
def registered():
    plugin.register()
    with get_parallel().override(attn_tp_size=1, attn_dcp_size=1, attn_dcp_rank=0):
        yield


def published(**server_args):
    """The config SGLang publishes for a server started with these arguments (restored after)."""
    return get_context().override_server_args(**server_args)


def prefix_case():
    q_lens, prefix = [4, 2], [37, 12]
    return PagedCase(page_size=P, kv_lens=[q + p for q, p in zip(q_lens, prefix)],
                     q_lens=q_lens, heads=H, layout="shuffled", seed=2), q_lens, prefix


def model_runner_backend(runner):
    """The backend ModelRunner builds after its gates: the real
    attention_backend_setup.build_attention_backends, with the runner's resolved backend
    names stamped first as ModelRunner does."""
    from sglang.srt.model_executor.model_runner_components import attention_backend_setup
    names = attention_backend_setup.resolve_attention_backend_strs(model_runner=runner)
    runner.prefill_attention_backend_str, runner.decode_attention_backend_str = (
        names.prefill, names.decode)
    built = attention_backend_setup.build_attention_backends(model_runner=runner)
    assert built.attn_backend.prefill_attention_backend_str == names.prefill
    return built.attn_backend


def handler_method(backend, fb):
    with forward_context(ForwardContext(attn_backend=backend)):
        return plugin.deepseek_forward_method(None, fb)


# ---- ModelRunner's load-time chunked-prefix gate ----
@pytest.mark.parametrize("name", NAMES)
def test_chunked_prefix_gate_keeps_chunked_prefix_for_mla_names(name):
    """The real gate, as ModelRunner.__init__ calls it for the target model, leaves chunked
    prefix on for mla's names; the backend ModelRunner then builds (build_attention_backends)
    and DeepSeek's handler agree (chunked-prefix MHA for a batch with long prefixes)."""
    case, q_lens, prefix = prefix_case()
    with published(attention_backend=name):
        assert name in misc_utils.CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS
        misc_utils.maybe_disable_chunked_prefix_cache(use_mla_backend=True,
                                                      is_draft_worker=False)
        assert get_schedule().disable_chunked_prefix_cache is False
        be = model_runner_backend(env.runner(case, heads=H))
        assert isinstance(be, plugin.BACKEND_CLASSES[name])
        assert be.disable_chunked_prefix_cache is False
        # Prefixes past paged_mla's threshold (8192), with the seq_lens they imply (planning
        # reads no cache or table, so the case's short pool serves).
        long_prefix = [9000, 10]
        fb = env.batch(case, "extend", q_lens, prefix=long_prefix,
                       kv_lens=[p + q for p, q in zip(long_prefix, q_lens)])
        be.init_forward_metadata(fb)
        assert be.forward_method == "mha_chunked"
        assert handler_method(be, fb) == AttnForwardMethod.MHA_CHUNKED_KV


@pytest.mark.parametrize("gate_list_has_mla", [True, False])
def test_backend_follows_the_gate_not_the_raw_server_argument(gate_list_has_mla, monkeypatch):
    """Where the gate turns chunked prefix off (here: mla's names taken out of the list it
    reads; in SGLang also a non-MLA model or --disable-chunked-prefix-cache), the model runs
    without it while the raw server argument still says on: mla's backend reads the resolved
    value, so it plans the prefix batch absorbed and DeepSeek's handler takes MLA."""
    if not gate_list_has_mla:
        monkeypatch.setattr(misc_utils, "CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS",
                            [n for n in misc_utils.CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS
                             if n not in NAMES])
    case, q_lens, prefix = prefix_case()
    with published(attention_backend="mla_chunked"):
        misc_utils.maybe_disable_chunked_prefix_cache(use_mla_backend=True,
                                                      is_draft_worker=False)
        off = not gate_list_has_mla
        assert get_schedule().disable_chunked_prefix_cache is off
        runner = env.runner(case, heads=H)
        assert runner.server_args.disable_chunked_prefix_cache is False  # the raw argument
        be = model_runner_backend(runner)
        assert be.disable_chunked_prefix_cache is off
        fb = env.batch(case, "extend", q_lens, prefix=prefix)
        be.init_forward_metadata(fb)
        assert be.forward_method == ("absorbed" if off else "mha_chunked")
        want = AttnForwardMethod.MLA if off else AttnForwardMethod.MHA_CHUNKED_KV
        assert handler_method(be, fb) == want


def test_user_disable_chunked_prefix_cache_reaches_the_backend():
    case, q_lens, prefix = prefix_case()
    with published(attention_backend="mla_ondemand", disable_chunked_prefix_cache=True):
        misc_utils.maybe_disable_chunked_prefix_cache(use_mla_backend=True,
                                                      is_draft_worker=False)
        assert get_schedule().disable_chunked_prefix_cache is True
        be = model_runner_backend(env.runner(case, heads=H))
        fb = env.batch(case, "extend", q_lens, prefix=prefix)
        be.init_forward_metadata(fb)
        assert be.disable_chunked_prefix_cache is True and be.forward_method == "absorbed"


def test_register_is_idempotent_and_refuses_a_changed_draft_factory(monkeypatch):
    from sglang.srt.server_args import CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS
    for _ in range(3):
        plugin.register()
    for name in NAMES:
        assert CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS.count(name) == 1
    wrapped = DraftBackendFactory._create_backend
    assert wrapped._mla_names == tuple(NAMES)
    assert not hasattr(wrapped.__wrapped__, "_mla_names")  # wrapped once

    def changed(self, backend_name, backend_map):
        return None

    monkeypatch.setattr(DraftBackendFactory, "_create_backend", changed)
    with pytest.raises(plugin.UnsupportedSGLangVersion,
                       match=r"DraftBackendFactory\._create_backend takes "
                             r"\['backend_name', 'backend_map'\]"):
        plugin.register()


# ---- EAGLE / DeepSeek MTP: SGLang's DraftBackendFactory ----
STEPS = 3  # speculative_num_steps: the draft worker runs STEPS - 1 decode forwards


def draft_case(seed):
    committed = [20, 3, 40]
    # Room for the draft tokens past each request's committed length.
    return committed, PagedCase(page_size=P, kv_lens=[c + STEPS for c in committed],
                                q_lens=[1] * 3, heads=H, layout="interleaved", seed=seed)


def factory_backends(runner, **server_args):
    with published(**server_args):
        factory = DraftBackendFactory(runner, topk=1, speculative_num_steps=STEPS)
        return factory.create_decode_backend(), factory.create_draft_extend_backend()


@pytest.mark.parametrize("name", NAMES)
def test_draft_factory_builds_mla_backends_and_a_draft_decode_matches(name, device):
    """--attention-backend <mla name> with EAGLE: the real factory returns mla's multi-step
    draft backend (one backend per step, stamped with the name DeepSeek dispatches on) and
    mla's draft-extend backend. Then the draft worker's decode as eagle_worker_v2.draft_forward
    runs it: one init_forward_metadata on the container, step i inside
    forward_context(attn_backend=attn_backends[i]) with out_cache_loc = the slot after the
    committed tokens + i, writing its new latent row and attending to committed + i + 1 keys."""
    committed, case = draft_case(7)
    runner = env.runner(case, heads=H, device=device)
    dec, ext = factory_backends(runner, attention_backend=name)
    assert isinstance(dec, plugin.MLAMultiStepDraftBackend)
    assert len(dec.attn_backends) == STEPS - 1 and dec.needs_cpu_seq_lens
    for b in dec.attn_backends:
        assert isinstance(b, plugin.BACKEND_CLASSES[name])
        assert b.decode_attention_backend_str == name == b.prefill_attention_backend_str
    assert isinstance(ext, plugin.BACKEND_CLASSES[name]) and ext.draft_step is None
    assert ext.decode_attention_backend_str == name

    pool = runner.token_to_kv_pool
    draft_slots = [torch.stack([case.slots(b)[committed[b] + i] for b in range(3)]).long()
                   for i in range(STEPS - 1)]
    rows = [case.cache[s].clone() for s in draft_slots]
    for s in draft_slots:
        pool.kv_buffer[0][s.to(device)] = 0  # each draft row arrives through its step's save
    fb = env.batch(case, "decode", [1] * 3, kv_lens=committed, device=device)
    dec.init_forward_metadata(fb)
    layer = env.attn_mqa(H, case.sm_scale)
    g = torch.Generator().manual_seed(3)
    for i in range(STEPS - 1):
        q = (torch.randn(3, H, 576, generator=g) * 0.5).to(torch.bfloat16)
        fb.out_cache_loc = draft_slots[i].to(device)
        qd, rd = q.to(device), rows[i].to(device)
        with forward_context(ForwardContext(attn_backend=dec.attn_backends[i])):
            o = layer.forward(qd[..., :512], rd[:, None, :512], rd[:, None, :512], fb,
                              q_rope=qd[..., 512:], k_rope=rd[:, None, 512:])
        assert torch.equal(pool.kv_buffer[0][draft_slots[i].to(device)].view(-1, 576).cpu(),
                           rows[i])
        keys = [case.slots(b)[:committed[b] + i + 1] for b in range(3)]
        ref_o, _ = oracle.absorbed(q, case.cache, keys, [1] * 3, case.sm_scale, True)
        assert oracle.rel_err(o.view(3, H, 512), ref_o) < 1e-2, f"draft step {i}"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("attention_mode", ["prefill", "decode"])
def test_draft_extend_from_the_factory_matches(name, attention_mode, device):
    """The draft extend after verify (DRAFT_EXTEND_V2: seq_lens past the num_draft_tokens new
    rows, each request's window causal over its prefix), through the backend the factory
    gives for either --speculative-attention-mode."""
    committed, case = draft_case(11)
    n = STEPS  # num_draft_tokens of a chain: steps + 1 minus the bonus token
    dec, ext = factory_backends(env.runner(case, heads=H, device=device), attention_backend=name,
                                speculative_attention_mode=attention_mode)
    fb = env.batch(case, "draft_extend", [n] * 3, device=device)
    ext.init_forward_metadata(fb)
    assert ext.forward_method == "absorbed"
    new = env.new_slots(case, [n] * 3)
    q = (torch.randn(3 * n, H, 576, generator=torch.Generator().manual_seed(5)) * 0.5).to(
        torch.bfloat16)
    rows = case.cache[new].to(device)
    with forward_context(ForwardContext(attn_backend=ext)):
        o = env.attn_mqa(H, case.sm_scale).forward(q.to(device), rows[:, None, :],
                                                   rows[:, None, :512], fb)
    ref_o, _ = oracle.absorbed(q, case.cache, [case.slots(b) for b in range(3)], [n] * 3,
                               case.sm_scale, True)
    assert oracle.rel_err(o.view(3 * n, H, 512), ref_o) < 1e-2


def test_draft_attention_backend_override_and_builtin_names():
    """--speculative-draft-attention-backend mla_paged under another target backend gives mla's
    draft backends; a name neither SGLang nor mla knows still fails with SGLang's own error."""
    committed, case = draft_case(1)
    dec, ext = factory_backends(env.runner(case, heads=H, draft_attention_backend="mla_paged"),
                                attention_backend="flashinfer")
    assert isinstance(dec, plugin.MLAMultiStepDraftBackend) and dec.name == "mla_paged"
    assert isinstance(ext, plugin.BACKEND_CLASSES["mla_paged"])
    with pytest.raises(ValueError,
                       match="EAGLE is not supported in (decode )?attention backend mla_fast"):
        factory_backends(env.runner(case, heads=H, draft_attention_backend="mla_fast"),
                         attention_backend="flashinfer")


def test_draft_decode_refuses_trees_and_other_batch_modes():
    committed, case = draft_case(2)
    runner = env.runner(case, heads=H)
    with published(attention_backend="mla_chunked"):
        factory = DraftBackendFactory(runner, topk=4, speculative_num_steps=STEPS)
        with pytest.raises(ValueError, match=r"speculative_eagle_topk = 4: mla_chunked"):
            factory.create_decode_backend()
    dec, _ = factory_backends(runner, attention_backend="mla_chunked")
    with pytest.raises(ValueError, match=r"forward_batch\.forward_mode = .*draft step 0 of "
                                         r"chunked_mla plans the draft worker's decode"):
        dec.init_forward_metadata(env.batch(case, "extend", [1] * 3))


def test_draft_decode_graph_hooks_plan_each_step_into_its_graph_plan():
    """EAGLEDraftCudaGraphRunner's calls: init_cuda_graph_state, then out-of-graph planning at
    capture and before each replay; every step re-plans into its own captured plan, with its
    own key count."""
    committed, case = draft_case(4)
    dec, _ = factory_backends(env.runner(case, heads=H), attention_backend="mla_paged")
    dec.init_cuda_graph_state(4, 4)
    fb = env.batch(case, "decode", [1] * 3, kv_lens=committed)
    dec.init_forward_metadata_out_graph(fb, in_capture=True)
    dec.init_forward_metadata_in_graph(fb)
    for i, b in enumerate(dec.attn_backends):
        assert b._plan is b._graph_plan
        assert b.planned_lengths()["kv_lens"].tolist() == [c + i + 1 for c in committed]


# ---- DeepSeek's own attention module (DeepseekV2AttentionMLA) over mla's backends ----
HIDDEN = 256
YARN = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}


def deepseek_attention():
    """One DeepseekV2AttentionMLA layer shaped as DeepSeek-V2-Lite's (no q LoRA, kv_lora_rank
    512, rope 64, nope 128, v 128; H heads, a small hidden size), random bf16 weights."""
    from sglang.srt.models.deepseek_v2 import DeepseekV2AttentionMLA
    m = DeepseekV2AttentionMLA(
        config=SimpleNamespace(rms_norm_eps=1e-6), hidden_size=HIDDEN, num_heads=H,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=None,
        kv_lora_rank=512, rope_theta=10000, rope_scaling=dict(YARN),
        max_position_embeddings=4096, quant_config=None, reduce_results=False, layer_id=0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    m = m.to(torch.bfloat16)
    # What SGLang's DeepSeek weight loader derives from kv_b_proj after loading
    # (deepseek_weight_loader.py, post_load_weights): the absorbed w_kc, w_vc.
    w_kc, w_vc = m.kv_b_proj.weight.unflatten(0, (-1, 256)).split([128, 128], dim=1)
    m.w_kc = w_kc.transpose(1, 2).contiguous().transpose(1, 2)
    m.w_vc = w_vc.contiguous().transpose(1, 2)
    return m


class _ChunkKvIndices:
    """A CPU stand-in for SGLang's Triton kernel create_chunked_prefix_cache_kv_indices (no CPU
    path): each request's prefix-chunk slots from req_to_token."""
    def __getitem__(self, grid):
        def run(req_to_token, rows, starts, lens, cu, out, _width):
            for b in range(grid[0]):
                s, n, o = int(starts[b]), int(lens[b]), int(cu[b])
                out[o:o + n] = req_to_token[int(rows[b]), s:s + n]
        return run


def _merge_state_cpu(o_a, lse_a, o_b, lse_b, out=None, out_lse=None):
    """A CPU stand-in for sglang.srt.layers.attention.merge_state (sgl_kernel / Triton)."""
    o, lse = oracle.merge(o_a, lse_a, o_b, lse_b)
    out.copy_(o)
    out_lse.copy_(lse)
    return out, out_lse


def run_module(name, case, mode, q_lens, prefix=None, server_args=None):
    """The layer's forward(positions, hidden_states, forward_batch) as DeepseekV2DecoderLayer
    calls it, inside SGLang's forward context with the backend ModelRunner builds for `name`
    (or for server_args), on a fresh copy of the case's KV pool; returns (output, the pool's
    rows afterwards)."""
    from sglang.srt.utils import BumpAllocator
    runner = env.runner(case, heads=H)
    fb = env.batch(case, mode, q_lens, prefix=prefix)
    seq = fb.seq_lens.long()
    if mode == "decode":
        positions = seq - 1
    else:
        positions = torch.cat([torch.arange(s - q, s) for s, q in zip(seq.tolist(), q_lens)])
    hidden = (torch.randn(len(positions), HIDDEN, generator=torch.Generator().manual_seed(1))
              ).to(torch.bfloat16)
    server_args = server_args or {"attention_backend": name}
    with published(device="cpu", **server_args), torch.inference_mode():
        be = model_runner_backend(runner)
        be.init_forward_metadata(fb)
        with forward_context(ForwardContext(attn_backend=be)):
            out = deepseek_attention()(positions, hidden, fb,
                                       BumpAllocator(256, torch.float32, "cpu"))
    return out, runner.token_to_kv_pool.kv_buffer[0][:case.num_slots].clone()


@pytest.fixture
def module_env(monkeypatch):
    from sglang.srt.layers.attention import merge_state
    from sglang.srt.model_executor import forward_batch_deepseek_mha_mixin as mixin
    from sglang.srt.models.deepseek_common.attention_backend_handler import (
        AttentionBackendRegistry)
    monkeypatch.setenv("SGLANG_MAX_KV_CHUNK_CAPACITY", "32")  # several prefix chunks
    monkeypatch.setattr(mixin, "create_chunked_prefix_cache_kv_indices", _ChunkKvIndices())
    monkeypatch.setattr(merge_state, "merge_state", _merge_state_cpu)
    # The reference: SGLang's own torch_native backend (SDPA over the same pool), which the
    # model drives absorbed (q_nope absorbed into the latent, the 576-wide cat form).
    monkeypatch.setitem(AttentionBackendRegistry._handlers, "torch_native",
                        lambda attn, fb: AttnForwardMethod.MLA)
    with get_parallel().override(attn_tp_rank=0, tp_group=SimpleNamespace(world_size=1)):
        yield


METHODS = {"absorbed": AttnForwardMethod.MLA, "mha": AttnForwardMethod.MHA,
           "mha_chunked": AttnForwardMethod.MHA_CHUNKED_KV}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode,q_lens,prefix,paged_method", [
    ("decode", [1, 1, 1], None, "absorbed"),
    ("extend", [5, 3, 2], [0, 0, 0], "mha"),  # no cached prefix: ragged MHA
    ("extend", [4, 2, 3], [17, 1, 30], "absorbed"),  # short prefixes: paged_mla absorbed
    ("draft_extend", [3, 3, 3], None, "absorbed")])  # MTP's draft extend after verify
def test_deepseek_attention_module_matches_sglang_torch_native(module_env, monkeypatch, name,
                                                               mode, q_lens, prefix,
                                                               paged_method):
    """DeepseekV2AttentionMLA.forward (its dispatch through mla's DeepSeek handler, q/k
    projections, RoPE, latent write, then absorbed MLA, ragged MHA or chunked-prefix MHA with
    kv_b_proj up-projection and merge_state, o_proj) over an mla backend, against the same
    layer, weights and batch over SGLang's torch_native backend: same output, same new rows in
    the KV pool. chunked_mla / ondemand_mla take chunked-prefix MHA for the prefix batch; the
    draft extend (DRAFT_EXTEND_V2) is absorbed."""
    from sglang.srt.models.deepseek_common.attention_backend_handler import (
        AttentionBackendRegistry)
    kv = [q + (p if prefix is not None else 20 + 7 * b) for b, (q, p) in
          enumerate(zip(q_lens, prefix or [0] * 3))]
    case = PagedCase(page_size=P, kv_lens=kv, q_lens=q_lens, heads=H, layout="shuffled",
                     seed=13)
    want = paged_method
    if name != "mla_paged" and prefix is not None and any(prefix):
        want = "mha_chunked"
    taken = []

    def handler(attn, fb):
        taken.append(plugin.deepseek_forward_method(attn, fb))
        return taken[-1]

    monkeypatch.setitem(AttentionBackendRegistry._handlers, name, handler)
    out, rows = run_module(name, case, mode, q_lens, prefix)
    assert taken == [METHODS[want]]
    ref, ref_rows = run_module("torch_native", case, mode, q_lens, prefix)
    assert oracle.rel_err(out, ref) < 1e-2
    assert torch.equal(rows, ref_rows)


@pytest.mark.parametrize("name", NAMES)
def test_deepseek_attention_module_draft_decode_from_the_factory(module_env, name):
    """DeepSeek MTP's draft decode: the same attention layer driven step by step as
    eagle_worker_v2.draft_forward drives the draft model (one batch at the committed lengths,
    step i inside forward_context(attn_backend=attn_backends[i]) of the backend the real
    DraftBackendFactory built, out_cache_loc the step's draft slot); against torch_native on a
    decode batch of committed + i + 1 keys. Same outputs, same draft rows in the pool."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.utils import BumpAllocator
    committed, case = draft_case(17)
    runner, ref_runner = env.runner(case, heads=H), env.runner(case, heads=H)
    dec, _ = factory_backends(runner, attention_backend=name)
    ref_be = ATTENTION_BACKENDS["torch_native"](ref_runner)
    # The stamp ModelRunner puts on the backend it builds (build_attention_backends).
    ref_be.prefill_attention_backend_str = ref_be.decode_attention_backend_str = "torch_native"
    fb = env.batch(case, "decode", [1] * 3, kv_lens=committed)
    dec.init_forward_metadata(fb)
    g = torch.Generator().manual_seed(2)
    with published(attention_backend=name, device="cpu"), torch.inference_mode():
        attn = deepseek_attention()
        for i in range(STEPS - 1):
            slots = torch.stack([case.slots(b)[committed[b] + i] for b in range(3)]).long()
            positions = torch.tensor(committed) + i
            hidden = torch.randn(3, HIDDEN, generator=g).to(torch.bfloat16)
            fb.out_cache_loc = slots
            with forward_context(ForwardContext(attn_backend=dec.attn_backends[i])):
                out = attn(positions, hidden, fb, BumpAllocator(256, torch.float32, "cpu"))
            ref_fb = env.batch(case, "decode", [1] * 3, kv_lens=[c + i + 1 for c in committed])
            ref_fb.out_cache_loc = slots
            ref_be.init_forward_metadata(ref_fb)
            with forward_context(ForwardContext(attn_backend=ref_be)):
                ref = attn(positions, hidden, ref_fb, BumpAllocator(256, torch.float32, "cpu"))
            assert oracle.rel_err(out, ref) < 1e-2, f"draft step {i}"
            assert torch.equal(runner.token_to_kv_pool.kv_buffer[0],
                               ref_runner.token_to_kv_pool.kv_buffer[0])


def test_split_prefill_and_decode_names(module_env, monkeypatch):
    """--prefill-attention-backend mla_chunked --decode-attention-backend mla_paged: the gate
    reads the prefill half, ModelRunner builds SGLang's HybridAttnBackend over the two, and the
    DeepSeek layer takes chunked-prefix MHA through mla_chunked for a prefix extend and absorbed
    MLA through mla_paged for a decode, matching torch_native."""
    from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend
    from sglang.srt.models.deepseek_common.attention_backend_handler import (
        AttentionBackendRegistry)
    split = {"prefill_attention_backend": "mla_chunked", "decode_attention_backend": "mla_paged"}
    case, q_lens, prefix = prefix_case()
    with published(**split):
        misc_utils.maybe_disable_chunked_prefix_cache(use_mla_backend=True,
                                                      is_draft_worker=False)
        assert get_schedule().disable_chunked_prefix_cache is False
        be = model_runner_backend(env.runner(case, heads=H))
        assert isinstance(be, HybridAttnBackend)
        assert isinstance(be.prefill_backend, plugin.BACKEND_CLASSES["mla_chunked"])
        assert isinstance(be.decode_backend, plugin.BACKEND_CLASSES["mla_paged"])
    taken = []
    for name in ("mla_chunked", "mla_paged"):
        def handler(attn, fb, name=name):
            taken.append((name, plugin.deepseek_forward_method(attn, fb)))
            return taken[-1][1]

        monkeypatch.setitem(AttentionBackendRegistry._handlers, name, handler)
    decode = PagedCase(page_size=P, kv_lens=[9, 30, 17], q_lens=[1] * 3, heads=H,
                       layout="interleaved", seed=4)
    for c, mode, ql, pre in ((case, "extend", q_lens, prefix), (decode, "decode", [1] * 3, None)):
        out, rows = run_module(None, c, mode, ql, pre, server_args=split)
        ref, ref_rows = run_module("torch_native", c, mode, ql, pre)
        assert oracle.rel_err(out, ref) < 1e-2
        assert torch.equal(rows, ref_rows)
    assert taken == [("mla_chunked", AttnForwardMethod.MHA_CHUNKED_KV),
                     ("mla_paged", AttnForwardMethod.MLA)]
