"""SGLang plugin: registers the attention backends mla_paged, mla_chunked and mla_ondemand.

Installed through the `sglang.srt.plugins` entry point (pyproject.toml), which SGLang calls at
start-up; `register()` adds the names to `--attention-backend`
(sglang.srt.server_args.add_attention_backend_choices) and registers a factory for each
(sglang.srt.layers.attention.attention_registry.register_attention_backend).

The adapter follows the AttentionBackend interface of SGLang 0.5.x as published (method names,
the capture/replay signatures with seq_lens_cpu, ForwardBatch fields seq_lens_cpu,
extend_seq_lens_cpu, extend_prefix_lens_cpu, out_cache_loc, req_to_token_pool.req_to_token,
token_to_kv_pool.get_key_buffer, mha_return_lse, attn_attend_prefix_cache, prefix_chunk_idx,
prefix_chunk_cu_seq_lens). Other versions are refused with a message naming the version.
It was tested against stubs with those names, not against an installed SGLang.
"""
from __future__ import annotations

from ..backend import Backend

BACKENDS = {"mla_paged": "paged_mla", "mla_chunked": "chunked_mla", "mla_ondemand": "ondemand_mla"}
SUPPORTED_PREFIX = "0.5."


class UnsupportedSGLangVersion(RuntimeError):
    pass


def check_version(version: str) -> None:
    if not str(version).startswith(SUPPORTED_PREFIX):
        raise UnsupportedSGLangVersion(
            f"mla.integrations.sglang: SGLang {version} is not supported; the adapter follows the "
            f"AttentionBackend interface of SGLang {SUPPORTED_PREFIX}x (install a matching SGLang "
            "or another attention backend)")


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
    check_version(getattr(sglang, "__version__", "unknown"))
    from sglang.srt.layers.attention.attention_registry import register_attention_backend
    from sglang.srt.server_args import add_attention_backend_choices

    add_attention_backend_choices(list(BACKENDS))
    for name, family in BACKENDS.items():
        register_attention_backend(name)(_factory(family))
