"""What mla serves, read from the C++ library (the one source; nothing here is a copy):

  KV_LORA_RANK, QK_ROPE_DIM, QK_NOPE_DIM, V_HEAD_DIM   512, 64, 128, 128 (DeepSeek-V2/V3 MLA)
  LATENT_DIM, QK_HEAD_DIM                              576 (one cached latent row), 192
  MAX_HEADS                                            query heads per rank: 1 .. 128
  PAGE_SIZES                                           the page sizes served: (1, 16, 32, 64, 128)
  CACHE_DTYPES                                         torch.bfloat16, torch.float8_e4m3fn

and the checks the backends and the engine adapters make when they are built:

  check_backend_config(who, device, num_heads, page_size, kv_cache_dtype)
      ValueError naming the field, its value and what is served (torch.ops.mla.check_backend_config
      over mla::check_backend_config, the C++ backends' own construction check).
  unsupported_reason(device) -> str | None
      Why mla cannot run on `device` (None: it can). On a GPU the rule is the C++ library's
      (torch.ops.mla.cuda_capability_refusal): the CUDA kernels are built for sm_90a, so only
      compute capability 9.0 (H100, H200, GH200) runs them.
  capability_refusal(major, minor, device="the GPU") -> str | None
      The same rule for a given compute capability (what vLLM asks).
  compute_capability(device) -> (major, minor)
      The capability query unsupported_reason uses: the library's own (the CUDA runtime's).
      Tests monkeypatch this function to fake a GPU.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _native
from ._ops import ops

(KV_LORA_RANK, QK_ROPE_DIM, QK_NOPE_DIM, V_HEAD_DIM, LATENT_DIM, QK_HEAD_DIM,
 MAX_HEADS) = (int(v) for v in ops.model_dims())
PAGE_SIZES: Tuple[int, ...] = tuple(int(p) for p in ops.page_sizes())
CACHE_DTYPES: Tuple[torch.dtype, ...] = tuple(getattr(torch, n) for n in ops.cache_dtypes())


class UnsupportedDevice(RuntimeError):
    """mla has no code for this device (a GPU of another compute capability, or a build without
    CUDA ops): the engine should use another attention backend on it."""


def _cuda_name(device: torch.device) -> str:
    return f"cuda:{device.index if device.index is not None else 0}"


def compute_capability(device) -> Tuple[int, int]:
    """(major, minor) of a cuda device, by the library's query (RuntimeError or ValueError when
    it cannot tell, e.g. in a build without CUDA ops)."""
    major, minor = ops.compute_capability(torch.device(device))
    return int(major), int(minor)


def capability_refusal(major: int, minor: int, device: str = "the GPU") -> Optional[str]:
    """Why mla's CUDA op set cannot run on a GPU of compute capability major.minor (what it is
    built for, what was found), or None when it can: the C++ rule."""
    return ops.cuda_capability_refusal(int(major), int(minor), str(device)) or None


def unsupported_reason(device) -> Optional[str]:
    """Why mla cannot run on `device`, or None when it can (cpu: always)."""
    d = torch.device(device)
    if d.type == "cpu":
        return None
    if d.type != "cuda":
        return f"device {d}: mla runs on cpu and cuda devices only"
    name = _cuda_name(d)
    try:
        major, minor = compute_capability(d)
    except (RuntimeError, ValueError) as e:
        return f"{name}: its compute capability is unknown ({e})"
    reason = capability_refusal(major, minor, name)
    if reason is not None:
        return reason
    if not _native.has_cuda_ops():
        return (f"{name}: this build of mla has no CUDA ops (mla.has_cuda_ops() is False); "
                "reinstall mla with nvcc present")
    return None


def check_device(device, who: str = "mla") -> None:
    """Raises UnsupportedDevice (with unsupported_reason) when mla cannot run on `device`."""
    reason = unsupported_reason(device)
    if reason is not None:
        raise UnsupportedDevice(f"{who}: {reason}")


def check_backend_config(who: str, device, num_heads: int, page_size: int,
                         kv_cache_dtype) -> None:
    """The construction check of a backend over an engine's pools (the C++ backends' own):
    ValueError naming the field (num_heads, page_size, kv_cache_dtype), its value and what is
    served; on a GPU mla has no code for, the op set's refusal."""
    ops.check_backend_config(str(who), torch.device(device), int(num_heads), int(page_size),
                             str(kv_cache_dtype))
