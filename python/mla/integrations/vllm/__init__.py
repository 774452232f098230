"""vLLM plugin: registers the attention backend MLA_PAGED (mla's paged absorbed decode).

vLLM (0.34) runs every function of the `vllm.general_plugins` entry-point group once per process
(vllm.plugins.load_general_plugins, called from EngineArgs before the command line is parsed);
mla's entry point (pyproject.toml) is `register` below. It calls vLLM's own
`vllm.v1.attention.backends.registry.register_backend("MLA_PAGED", <class path>)`, which adds a
member to AttentionBackendEnum, so `--attention-backend MLA_PAGED` (any case) selects mla and
vLLM's platform checks (`validate_configuration`) run on it as on its own backends.

Use: `pip install mla` beside vllm, then `vllm serve <model> --attention-backend MLA_PAGED`
(Python: `LLM(model, attention_backend="MLA_PAGED")`). vLLM loads every installed
general plugin unless VLLM_PLUGINS is set; if it is, it must name `mla` (VLLM_PLUGINS=mla,...).

This module imports no vLLM at import time (and `import mla` never imports this module): the
backend classes live in `mla.integrations.vllm.backend`, which subclasses vLLM's MLA base classes
and is imported by vLLM only when the backend is selected.
"""
from __future__ import annotations

import importlib.util

from .. import first_missing

BACKEND_NAME = "MLA_PAGED"
BACKEND_CLASS = "mla.integrations.vllm.backend.MlaPagedBackend"

# What the adapter uses of vLLM, checked by name (not by version number) before registering.
_REQUIRED = (
    ("vllm.v1.attention.backends.registry", "register_backend"),
    ("vllm.v1.attention.backends.registry", "AttentionBackendEnum"),
)
_BASE_MODULE = "vllm.model_executor.layers.attention.mla_attention"


class UnsupportedVLLMVersion(RuntimeError):
    pass


def check_interface() -> None:
    """Raises UnsupportedVLLMVersion naming the first missing piece of vLLM's interface."""
    try:
        import vllm
    except ImportError as e:
        raise UnsupportedVLLMVersion(f"mla.integrations.vllm: vllm is not importable ({e})") from e
    version = getattr(vllm, "__version__", "unknown")

    def refuse(what: str):
        raise UnsupportedVLLMVersion(
            f"mla.integrations.vllm: vLLM {version} is not supported: {what} (the adapter needs "
            "vLLM 0.34's attention-backend registry and the MLA base classes in "
            f"{_BASE_MODULE}; install vllm 0.34 or use another attention backend)")

    missing = first_missing(_REQUIRED)
    if missing is not None:
        refuse(f"{missing} is missing")
    if importlib.util.find_spec(_BASE_MODULE) is None:
        refuse(f"module {_BASE_MODULE} is missing")


def register() -> None:
    """The `vllm.general_plugins` entry point. Idempotent: vLLM may call it in every process,
    and a second call in one process changes nothing."""
    check_interface()
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if BACKEND_NAME not in AttentionBackendEnum.__members__:
        register_backend(BACKEND_NAME, BACKEND_CLASS)
        return
    path = AttentionBackendEnum.__members__[BACKEND_NAME].get_path()
    if path != BACKEND_CLASS:
        raise RuntimeError(f"mla.integrations.vllm: AttentionBackendEnum.{BACKEND_NAME} is "
                           f"already registered to {path}, not {BACKEND_CLASS}")
