"""SGLang plugin: the attention backends mla_paged, mla_chunked and mla_ondemand for SGLang 0.5.23.

`register()` is the `sglang.srt.plugins` entry point (pyproject.toml); SGLang's plugin loader
(sglang.srt.plugins.load_plugins) calls it in every process before parsing arguments. It
  - adds the three names to --attention-backend / --prefill-attention-backend /
    --decode-attention-backend (sglang.srt.server_args.add_attention_backend_choices) and
    registers a factory for each (attention_registry.register_attention_backend);
  - tells DeepSeek's model code about them, as SGLang does for flashinfer / trtllm_mla: the names
    join FORWARD_ABSORB_CORE_ATTENTION_BACKENDS (the split call q_nope/q_rope, k/k_rope) and
    AttentionBackendRegistry gets a handler that asks mla's plan of the batch which forward
    method the layer takes (MHA, chunked-prefix MHA or absorbed MLA), so model and backend agree.

The backend classes subclass SGLang's own AttentionBackend (inheriting `forward`, which dispatches
idle / decode / extend, and every default flag) and mla.Backend (planning and running through
mla's torch ops). The pools come from the model runner (SGLang 0.5.23 reads them off the backend:
forward_context.get_token_to_kv_pool()); new latent rows are written through the pool's own
set_mla_kv_buffer with KVWriteLoc.for_batch(forward_batch). Planning happens in
init_forward_metadata_out_graph (host work, before capture and before each replay);
init_forward_metadata_in_graph records nothing. Heads per rank: num_attention_heads divided by
SGLang's attention TP size (DP attention included), checked against each layer's tp_q_head_num.

On a GPU mla has no kernels for (anything but compute capability 9.0: the C++ rule,
mla.support.unsupported_reason), building a backend raises mla.UnsupportedDevice naming the GPU's
capability, what mla needs and the built-in backends to use instead; SGLang selects backends by
name only, so this is how it is told. Page size, head count, cache dtype and the pool's layout are
checked when the backend is built (mla.Backend), not at the first decode.

Importing this module does not need sglang; `register()` and the classes do (BACKEND_CLASSES is
empty without it). `import mla` never imports this module.
"""
from __future__ import annotations

import inspect

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
               "AttentionBackendRegistry"))
    missing = first_missing(needed)
    if missing is not None:
        refuse(f"{missing} is missing")
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
                disable_chunked_prefix_cache=bool(
                    getattr(args, "disable_chunked_prefix_cache", False)))


if _SGLangBase is not None:
    class MLAAttnBackend(Backend, _SGLangBase):
        """One mla family as an SGLang AttentionBackend (subclasses set `family`)."""
        family = "paged_mla"
        sglang_name = "mla_paged"

        def __init__(self, model_runner, skip_prefill: bool = False, **_):
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

        def _lengths(self, forward_batch, mode):
            spec = getattr(forward_batch, "spec_info", None)
            if mode == "target_verify" and int(getattr(spec, "topk", 1) or 1) > 1:
                raise ValueError(f"forward_batch.spec_info.topk = {spec.topk}: {self.name} "
                                 "verifies chains of draft tokens (causal), not trees (topk 1)")
            return Backend._lengths(self, forward_batch, mode)

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
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

    add_attention_backend_choices([n for n in BACKENDS if n not in ATTENTION_BACKEND_CHOICES])
    for name in BACKENDS:
        register_attention_backend(name)(_factory(name))
        AttentionBackendRegistry.register(name, deepseek_forward_method)
        if name not in FORWARD_ABSORB_CORE_ATTENTION_BACKENDS:
            FORWARD_ABSORB_CORE_ATTENTION_BACKENDS.append(name)
