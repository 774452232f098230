"""Loads the native op library (libmla_torch.so) into torch.

The library is plain C++ over torch's C++ API (TORCH_LIBRARY): it includes no Python header and
links no libpython, so it is loaded with ``torch.ops.load_library`` and serves every CPython
version that runs the torch it was built against (torch 2.11.0).
"""
from __future__ import annotations

import os

import torch

_LIB_NAME = "libmla_torch.so"
_loaded = False


def library_path() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), _LIB_NAME)


def load() -> None:
    global _loaded
    if _loaded:
        return
    path = library_path()
    if not os.path.exists(path):
        raise ImportError(
            f"mla: the native library {path} is missing; install the package with "
            "`pip install .` at the repository root"
        )
    torch.ops.load_library(path)
    _loaded = True


def has_cuda_ops() -> bool:
    """Whether this build registered the CUDA op set (built with nvcc)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("mla::absorbed_run", "CUDA")
