"""SGLang plugin: registers the attention backends mla_paged, mla_chunked and mla_ondemand.

Installed through the `sglang.srt.plugins` entry point (pyproject.toml), which SGLang calls at
start-up; `register()` adds the names to `--attention-backend`
(sglang.srt.server_args.add_attention_backend_choices) and registers a factory for each
(sglang.srt.layers.attention.attention_registry.register_attention_backend).

The adapter follows SGLang's AttentionBackend interface (method names, the capture/replay
signatures with seq_lens_cpu, ForwardBatch fields seq_lens_cpu, extend_seq_lens_cpu,
extend_prefix_lens_cpu, out_cache_loc, req_to_token_pool.req_to_token,
token_to_kv_pool.get_key_buffer, mha_return_lse, attn_attend_prefix_cache, prefix_chunk_idx,
prefix_chunk_cu_seq_lens). SGLang calls this plugin only from its plugin loader (the
`sglang.srt.plugins` entry-point group, SGLang pull request 21388, merged 2026-03-25), so the
plugin checks the interface it needs by name rather than by version number: the two registration
functions, and the replay signature of sglang.srt.layers.attention.base_attn_backend.
AttentionBackend when that module exists. A missing name is refused with a message naming it and
the installed version. It was tested against stubs with those names, not against an installed
SGLang.
"""
from __future__ import annotations

from ..backend import Backend

BACKENDS = {"mla_paged": "paged_mla", "mla_chunked": "chunked_mla", "mla_ondemand": "ondemand_mla"}
REPLAY_ARGS = ("bs", "req_pool_indices", "seq_lens", "seq_lens_sum", "encoder_lens",
               "forward_mode", "spec_info")


class UnsupportedSGLangVersion(RuntimeError):
    pass


def check_interface(sglang_module) -> None:
    """Raises UnsupportedSGLangVersion naming the first missing piece of the interface."""
    import importlib
    import inspect
    version = getattr(sglang_module, "__version__", "unknown")

    def refuse(what: str):
        raise UnsupportedSGLangVersion(
            f"mla.integrations.sglang: SGLang {version} is not supported: {what} (the adapter "
            "needs SGLang's attention-backend registry and plugin loader; install a newer SGLang "
            "or use another attention backend)")

    for module, name in (("sglang.srt.layers.attention.attention_registry",
                          "register_attention_backend"),
                         ("sglang.srt.server_args", "add_attention_backend_choices")):
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            found = None
        if not callable(found):
            refuse(f"{module}.{name} is missing")
    try:
        base = importlib.import_module("sglang.srt.layers.attention.base_attn_backend")
    except ImportError:
        return  # older layouts keep the base class elsewhere; the registry names suffice
    replay = getattr(getattr(base, "AttentionBackend", None),
                     "init_forward_metadata_replay_cuda_graph", None)
    if replay is None:
        refuse("AttentionBackend.init_forward_metadata_replay_cuda_graph is missing")
    params = list(inspect.signature(replay).parameters)[1:]
    if tuple(params[:len(REPLAY_ARGS)]) != REPLAY_ARGS:
        refuse(f"AttentionBackend.init_forward_metadata_replay_cuda_graph takes {params}, "
               f"not {list(REPLAY_ARGS)} + [seq_lens_cpu]")


def _factory(family: str):
    def create(runner):
        cfg = runner.model_config
        tp = int(getattr(runner, "tp_size", 1) or 1)
        heads = int(getattr(cfg, "num_attention_heads")) // tp
        args = getattr(runner, "server_args", None)
        max_bs = int(getattr(args, "max_running_requests", None) or 256)
        kv_dtype = getattr(runner, "kv_cache_dtype", None)
        import torch
        if kv_dtype not in (torch.bfloat16, torch.float8_e4m3fn):
            kv_dtype = torch.bfloat16
        return Backend(family, num_heads=heads, page_size=int(getattr(runner, "page_size", 1)),
                       device=getattr(runner, "device", "cuda"),
                       sm_scale=float(getattr(cfg, "scaling", 0.0) or 0.0),
                       kv_cache_dtype=kv_dtype, max_batch=max_bs,
                       disable_chunked_prefix_cache=bool(
                           getattr(args, "disable_chunked_prefix_cache", False)))

    create.__name__ = f"create_{family}_backend"
    return create


def register() -> None:
    """The `sglang.srt.plugins` entry point."""
    import sglang
    check_interface(sglang)
    from sglang.srt.layers.attention.attention_registry import register_attention_backend
    from sglang.srt.server_args import add_attention_backend_choices

    add_attention_backend_choices(list(BACKENDS))
    for name, family in BACKENDS.items():
        register_attention_backend(name)(_factory(family))
