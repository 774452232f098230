"""SGLang plugin: the attention backends mla_paged, mla_chunked and mla_ondemand for SGLang 0.5.23.

`register()` is the `sglang.srt.plugins` entry point (pyproject.toml); SGLang's plugin loader
(sglang.srt.plugins.load_plugins) calls it in every process before parsing arguments. It
  - adds the three names to --attention-backend / --prefill-attention-backend /
    --decode-attention-backend (sglang.srt.server_args.add_attention_backend_choices) and
    registers a factory for each (attention_registry.register_attention_backend);
  - tells DeepSeek's model code about them, as SGLang does for flashinfer / trtllm_mla: the names
    join FORWARD_ABSORB_CORE_ATTENTION_BACKENDS (the split call q_nope/q_rope, k/k_rope) and
    AttentionBackendRegistry gets a handler that asks mla's plan of the batch which forward
    method the layer takes (MHA, chunked-prefix MHA or absorbed MLA), so model and backend agree;
  - adds the names to CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS
    (add_chunked_prefix_cache_attention_backend), which ModelRunner's load-time gate
    (model_runner_components/misc_utils.maybe_disable_chunked_prefix_cache) reads: without
    them the gate turns disable_chunked_prefix_cache on for any model served by an mla name;
  - lets SGLang's DraftBackendFactory (speculative/draft_utils.py: EAGLE / DeepSeek MTP) build
    mla's backends for the draft worker: its per-method name maps are local dicts handed to
    DraftBackendFactory._create_backend, so register() wraps that method to add mla's names
    (the draft decode gets MLAMultiStepDraftBackend, one backend per draft step; the draft
    extend gets the family's backend). Every other name goes to SGLang's own code unchanged.

The backend classes subclass SGLang's own AttentionBackend (inheriting `forward`, which dispatches
idle / decode / extend, and every default flag) and mla.Backend (planning and running through
mla's torch ops). The pools come from the model runner (SGLang 0.5.23 reads them off the backend:
forward_context.get_token_to_kv_pool()); new latent rows are written through the pool's own
set_mla_kv_buffer with KVWriteLoc.for_batch(forward_batch). Planning happens in
init_forward_metadata_out_graph (host work, before capture and before each replay);
init_forward_metadata_in_graph records nothing. Heads per rank: num_attention_heads divided by
SGLang's attention TP size (DP attention included), checked against each layer's tp_q_head_num.
disable_chunked_prefix_cache is SGLang's resolved value (get_schedule(), after the load-time
gate), the one DeepSeek's model code reads, not the raw server argument.

On a GPU mla has no kernels for (anything but compute capability 9.0: the C++ rule,
mla.support.unsupported_reason), building a backend raises mla.UnsupportedDevice naming the GPU's
capability, what mla needs and the built-in backends to use instead; SGLang selects backends by
name only, so this is how it is told. Page size, head count, cache dtype and the pool's layout are
checked when the backend is built (mla.Backend), not at the first decode.

Importing this module does not need sglang; `register()` and the classes do (BACKEND_CLASSES is
empty without it). `import mla` never imports this module.
"""
from __future__ import annotations

import functools
import inspect
from typing import Optional

from .. import support
from ..backend import Backend
from . import first_missing

BACKENDS = {"mla_paged": "paged_mla", "mla_chunked": "chunked_mla", "mla_ondemand": "ondemand_mla"}
# DeepSeek-V2/V3 MLA shapes mla serves (ModelConfig field -> value), from the C++ library.
MODEL_SHAPE = {"kv_lora_rank": support.KV_LORA_RANK, "qk_rope_head_dim": support.QK_ROPE_DIM,
               "qk_nope_head_dim": support.QK_NOPE_DIM, "v_head_dim": support.V_HEAD_DIM}
# Built-in SGLang backends named when mla refuses a GPU (SGLang then runs with one of them).
_OTHER_BACKENDS = "flashinfer, triton or flashmla"

try:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend as _SGLangBase
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc as _KVWriteLoc
    _IMPORT_ERROR = None
except ImportError as e:  # sglang (or one of its import-time dependencies) is missing
    _SGLangBase = _KVWriteLoc = None
    _IMPORT_ERROR = e


class UnsupportedSGLangVersion(RuntimeError):
    pass


def _version() -> str:
    try:
        import sglang
        return getattr(sglang, "__version__", "unknown")
    except ImportError:
        return "not installed"


def check_interface() -> None:
    """Raises UnsupportedSGLangVersion naming the first piece of SGLang 0.5.23's interface that
    the installed SGLang lacks."""
    def refuse(what: str):
        raise UnsupportedSGLangVersion(
            f"mla.integrations.sglang: SGLang {_version()} is not supported: {what} (the adapter "
            "is written for SGLang 0.5.23's AttentionBackend, registry and DeepSeek hooks)")

    if _IMPORT_ERROR is not None:
        refuse(f"sglang.srt.layers.attention.base_attn_backend does not import ({_IMPORT_ERROR})")
    needed = (("sglang.srt.layers.attention.attention_registry", "register_attention_backend"),
              ("sglang.srt.server_args", "add_attention_backend_choices"),
              ("sglang.srt.server_args", "ATTENTION_BACKEND_CHOICES"),
              ("sglang.srt.models.deepseek_common.utils", "FORWARD_ABSORB_CORE_ATTENTION_BACKENDS"),
              ("sglang.srt.models.deepseek_common.attention_backend_handler",
               "AttentionBackendRegistry"),
              ("sglang.srt.server_args", "CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS"),
              ("sglang.srt.server_args", "add_chunked_prefix_cache_attention_backend"),
              ("sglang.srt.speculative.draft_utils", "DraftBackendFactory"),
              ("sglang.srt.runtime_context", "get_schedule"))
    missing = first_missing(needed)
    if missing is not None:
        refuse(f"{missing} is missing")
    from sglang.srt.runtime_context import get_context
    if not callable(getattr(get_context(), "is_config_namespace_published", None)):
        refuse("sglang.srt.runtime_context.RuntimeContext.is_config_namespace_published is "
               "missing (mla reads the resolved disable_chunked_prefix_cache)")
    hooks = {"init_forward_metadata_out_graph": ["forward_batch", "in_capture"],
             "init_forward_metadata_in_graph": ["forward_batch"],
             "forward": ["q", "k", "v", "layer", "forward_batch", "save_kv_cache"],
             "forward_decode": ["q", "k", "v", "layer", "forward_batch", "save_kv_cache"],
             "forward_extend": ["q", "k", "v", "layer", "forward_batch", "save_kv_cache"]}
    for name, args in hooks.items():
        fn = getattr(_SGLangBase, name, None)
        if fn is None:
            refuse(f"AttentionBackend.{name} is missing")
        params = [p for p in inspect.signature(fn).parameters if p != "self"]
        if params[:len(args)] != args:
            refuse(f"AttentionBackend.{name} takes {params}, not {args}")
    if not callable(getattr(_KVWriteLoc, "for_batch", None)):
        refuse("sglang.srt.mem_cache.memory_pool.KVWriteLoc.for_batch is missing")
    from sglang.srt.speculative.draft_utils import DraftBackendFactory
    create = getattr(DraftBackendFactory, "_create_backend", None)
    create = getattr(create, "__wrapped__", create)  # register() wraps it
    args = ["backend_name", "backend_map", "error_template", "stamps_children"]
    params = [p for p in inspect.signature(create).parameters if p != "self"] if create else None
    if params != args:
        refuse(f"DraftBackendFactory._create_backend takes {params}, not {args} (mla adds its "
               "names to the draft worker's backend maps there)")


def _attn_tp_size(runner) -> int:
    """SGLang's attention TP size (tp_size / (dp_size * cp_size) under DP attention)."""
    try:
        from sglang.srt.runtime_context import get_parallel
        return int(get_parallel().attn_tp_size)
    except (ImportError, RuntimeError, AttributeError):
        return int(getattr(runner, "tp_size", 1) or 1)


def _threshold() -> int:
    try:
        from sglang.srt.environ import envs
        return int(envs.SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD.get())
    except (ImportError, AttributeError):
        return 8192


def _disable_chunked_prefix_cache(runner) -> bool:
    """SGLang's resolved disable_chunked_prefix_cache (get_schedule(): the server argument after
    ModelRunner's load-time gate maybe_disable_chunked_prefix_cache), the value DeepSeek's model
    code reads; the runner's raw server argument only where no config is published (a runner
    built outside an SGLang process)."""
    try:
        from sglang.srt.runtime_context import get_context, get_schedule
        if get_context().is_config_namespace_published("schedule"):
            return bool(get_schedule().disable_chunked_prefix_cache)
    except ImportError:
        pass
    args = getattr(runner, "server_args", None)
    return bool(getattr(args, "disable_chunked_prefix_cache", False))


def unsupported_reason(runner) -> str | None:
    """Why mla cannot serve this ModelRunner's device (a GPU mla has no kernels for: the C++
    rule, mla.support), or None."""
    return support.unsupported_reason(getattr(runner, "device", "cuda"))


def backend_options(runner, family: str) -> dict:
    """mla.Backend's constructor arguments from an SGLang ModelRunner; ValueError naming the
    field for a model or a KV cache mla does not serve. mla.Backend then checks them all when it
    is built (page size, head count, cache dtype, the pool's layout), by the C++ rules."""
    cfg = runner.model_config
    for field, want in MODEL_SHAPE.items():
        got = getattr(cfg, field, None)
        if got != want:
            raise ValueError(f"model_config.{field} = {got!r}: {family} serves DeepSeek MLA "
                             f"models ({', '.join(f'{k} {v}' for k, v in MODEL_SHAPE.items())})")
    tp = _attn_tp_size(runner)
    total = int(cfg.num_attention_heads)
    if tp < 1 or total % tp:
        raise ValueError(f"model_config.num_attention_heads = {total} does not split over the "
                         f"attention TP size {tp}")
    kv_dtype = getattr(runner, "kv_cache_dtype", None)
    if kv_dtype not in support.CACHE_DTYPES:
        raise ValueError(f"model_runner.kv_cache_dtype = {kv_dtype}: {family} stores the latent "
                         f"cache in {' or '.join(map(str, support.CACHE_DTYPES))} "
                         "(--kv-cache-dtype auto with a bf16 model, or fp8_e4m3)")
    args = getattr(runner, "server_args", None)
    return dict(num_heads=total // tp, page_size=int(getattr(runner, "page_size", 1) or 1),
                device=getattr(runner, "device", "cuda"), sm_scale=0.0,
                kv_cache_dtype=kv_dtype,
                max_batch=int(getattr(args, "max_running_requests", None) or 256),
                mha_prefix_threshold=_threshold(),
                disable_chunked_prefix_cache=_disable_chunked_prefix_cache(runner))


if _SGLangBase is not None:
    class MLAAttnBackend(Backend, _SGLangBase):
        """One mla family as an SGLang AttentionBackend (subclasses set `family`)."""
        family = "paged_mla"
        sglang_name = "mla_paged"

        def __init__(self, model_runner, skip_prefill: bool = False,
                     draft_step: Optional[int] = None, **_):
            # On a GPU mla has no kernels for, SGLang is told so before anything is built, with
            # the built-in backends to use instead (SGLang picks a backend by name only).
            reason = unsupported_reason(model_runner)
            if reason is not None:
                raise support.UnsupportedDevice(
                    f"--attention-backend {self.sglang_name} is unsupported here: {reason}. "
                    f"Choose another attention backend for this GPU ({_OTHER_BACKENDS})")
            Backend.__init__(self, self.family, **backend_options(model_runner, self.family),
                             token_to_kv_pool=model_runner.token_to_kv_pool,
                             req_to_token_pool=model_runner.req_to_token_pool)
            # Step i of an EAGLE draft decode (MLAMultiStepDraftBackend), else None.
            self.draft_step = draft_step
            self.data_type = self.kv_cache_dtype
            # SGLang's chunked-prefix code reads the translator off the backend. mla reads
            # req_to_token in place, so it serves pools whose ids need no translation.
            self.kv_index_translator = getattr(model_runner, "kv_index_translator", None)
            if getattr(self.kv_index_translator, "is_translating", False):
                raise ValueError(
                    "model_runner.kv_index_translator.is_translating = True: "
                    f"{self.family} reads req_to_token in place and does not serve a unified "
                    "(virtual-id) KV pool")

        # Graph hooks of SGLang 0.5.23: host planning out of the graph, nothing recorded in it.
        def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
            Backend.init_forward_metadata(self, forward_batch)

        def init_forward_metadata_in_graph(self, forward_batch):
            return None

        def _write_loc(self, forward_batch):
            return _KVWriteLoc.for_batch(forward_batch)

        def _draft_tokens(self, forward_batch, mode):
            spec = getattr(forward_batch, "spec_info", None)
            if mode == "target_verify" and int(getattr(spec, "topk", 1) or 1) > 1:
                raise ValueError(f"forward_batch.spec_info.topk = {spec.topk}: {self.name} "
                                 "verifies chains of draft tokens (causal), not trees (topk 1)")
            return Backend._draft_tokens(self, forward_batch, mode)

        def _kv_extra(self, forward_batch, mode):
            if self.draft_step is None or mode == "idle":
                return 0
            if mode != "decode":
                raise ValueError(f"forward_batch.forward_mode = {forward_batch.forward_mode!r}: "
                                 f"draft step {self.draft_step} of {self.name} plans the draft "
                                 "worker's decode batches only")
            # SGLang's draft decode batch keeps seq_lens at the committed length; step i's
            # token sees the i + 1 draft tokens written past it (prepare_for_draft writes
            # them at req_to_token[row, seq_len:seq_len + steps]).
            return self.draft_step + 1

        def update_verify_buffers_to_fill_after_draft(self, spec_info, cuda_graph_bs):
            return None  # chain verify: no tree mask or positions to refill

        def support_triton(self):
            return self.device.type == "cuda"

    class MLAPagedAttnBackend(MLAAttnBackend):
        family = "paged_mla"
        sglang_name = "mla_paged"

    class MLAChunkedAttnBackend(MLAAttnBackend):
        family = "chunked_mla"
        sglang_name = "mla_chunked"

    class MLAOndemandAttnBackend(MLAAttnBackend):
        family = "ondemand_mla"
        sglang_name = "mla_ondemand"

    BACKEND_CLASSES = {"mla_paged": MLAPagedAttnBackend, "mla_chunked": MLAChunkedAttnBackend,
                       "mla_ondemand": MLAOndemandAttnBackend}
else:
    BACKEND_CLASSES = {}


class MLAMultiStepDraftBackend:
    """The EAGLE / MTP draft worker's decode for one mla name, in the form SGLang's draft worker
    drives (as FlashMLAMultiStepDraftBackend): attn_backends[i] serves draft step i (the worker
    runs step i inside forward_context(attn_backend=attn_backends[i])); the container plans
    every step. Chains only (speculative_eagle_topk 1), as mla's target-verify."""
    needs_cpu_seq_lens = True  # mla plans on the host from seq_lens_cpu

    def __init__(self, model_runner, topk: int, speculative_num_steps: int, name: str):
        if name not in BACKEND_CLASSES:
            raise ValueError(f"name = {name!r}: one of {', '.join(BACKENDS)} (with sglang "
                             "installed)")
        if int(topk) != 1:
            raise ValueError(f"speculative_eagle_topk = {topk}: {name} drafts and verifies "
                             "chains of draft tokens (topk 1), not trees")
        self.name = name
        self.topk = int(topk)
        self.speculative_num_steps = int(speculative_num_steps)
        self.attn_backends = [BACKEND_CLASSES[name](model_runner, draft_step=i)
                              for i in range(self.speculative_num_steps - 1)]
        self.attn_backend_list = self.attn_backends
        self.kv_index_translator = getattr(model_runner, "kv_index_translator", None)

    def init_forward_metadata(self, forward_batch):
        for backend in self.attn_backends:
            backend.init_forward_metadata(forward_batch)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        for backend in self.attn_backends:
            backend.init_cuda_graph_state(max_bs, max_num_tokens)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        for backend in self.attn_backends:
            backend.init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)

    def init_forward_metadata_in_graph(self, forward_batch):
        for backend in self.attn_backends:
            backend.init_forward_metadata_in_graph(forward_batch)


def _draft_entry(factory, name: str, multi_step: bool):
    """A DraftBackendFactory map entry: (stamp, backend) for the draft runner."""
    runner = factory.draft_model_runner
    if multi_step:
        return name, MLAMultiStepDraftBackend(runner, factory.topk,
                                              factory.speculative_num_steps, name)
    return name, BACKEND_CLASSES[name](runner)


def _install_draft_backends() -> None:
    """Wraps DraftBackendFactory._create_backend (idempotent) so that its backend maps know
    mla's names. SGLang 0.5.23 passes stamps_children=True from create_decode_backend, whose
    entries are multi-step containers, and False from create_draft_extend_backend."""
    from sglang.srt.speculative.draft_utils import DraftBackendFactory
    original = DraftBackendFactory._create_backend
    if getattr(original, "_mla_names", None) is not None:
        return

    @functools.wraps(original)
    def _create_backend(self, backend_name, backend_map, error_template,
                        stamps_children=False):
        backend_map = dict(backend_map)
        for name in BACKENDS:
            backend_map.setdefault(name, functools.partial(_draft_entry, self, name,
                                                           bool(stamps_children)))
        return original(self, backend_name, backend_map, error_template, stamps_children)

    _create_backend._mla_names = tuple(BACKENDS)
    DraftBackendFactory._create_backend = _create_backend


def deepseek_forward_method(attn, forward_batch):
    """DeepSeek's per-backend handler for mla's names: the layer's forward method follows mla's
    plan of the batch (Backend.forward_method, set by init_forward_metadata)."""
    from sglang.srt.models.deepseek_common.attention_backend_handler import (
        AttnForwardMethod, _dispatch_mla_subtype, is_in_breakable_cuda_graph,
        is_in_tc_piecewise_cuda_graph)
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_mha import (
        resolve_attn_backend)
    if is_in_tc_piecewise_cuda_graph() or is_in_breakable_cuda_graph():
        return AttnForwardMethod.MLA
    method = getattr(resolve_attn_backend(forward_batch), "forward_method", "absorbed")
    if method == "mha":
        return AttnForwardMethod.MHA
    if method == "mha_chunked":
        return AttnForwardMethod.MHA_CHUNKED_KV
    return _dispatch_mla_subtype(attn, forward_batch)


def _factory(name: str):
    def create(runner):
        return BACKEND_CLASSES[name](runner)

    create.__name__ = f"create_{BACKENDS[name]}_backend"
    return create


def register() -> None:
    """The `sglang.srt.plugins` entry point (idempotent)."""
    check_interface()
    from sglang.srt.layers.attention.attention_registry import register_attention_backend
    from sglang.srt.models.deepseek_common.attention_backend_handler import (
        AttentionBackendRegistry)
    from sglang.srt.models.deepseek_common.utils import FORWARD_ABSORB_CORE_ATTENTION_BACKENDS
    from sglang.srt.server_args import (ATTENTION_BACKEND_CHOICES,
                                        CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS,
                                        add_attention_backend_choices,
                                        add_chunked_prefix_cache_attention_backend)

    add_attention_backend_choices([n for n in BACKENDS if n not in ATTENTION_BACKEND_CHOICES])
    for name in BACKENDS:
        register_attention_backend(name)(_factory(name))
        AttentionBackendRegistry.register(name, deepseek_forward_method)
        if name not in FORWARD_ABSORB_CORE_ATTENTION_BACKENDS:
            FORWARD_ABSORB_CORE_ATTENTION_BACKENDS.append(name)
        if name not in CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS:
            add_chunked_prefix_cache_attention_backend(name)
    _install_draft_backends()
