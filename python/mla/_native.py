"""Loads the native op library (libmla_torch.so) into torch.

The library is plain C++ over torch's C++ API (TORCH_LIBRARY): it includes no Python header and
links no libpython, so it is loaded with ``torch.ops.load_library`` and serves every CPython
version that runs the torch it was built against. That torch version is recorded at build time
(torch_build_version.txt, written by CMake's configure step) and checked before loading: a library
built for another torch minor version (another C++ ABI) is refused with an ImportError naming both
versions, instead of failing on an undefined symbol.
"""
from __future__ import annotations

import os

import torch

_LIB_NAME = "libmla_torch.so"
_BUILD_VERSION_NAME = "torch_build_version.txt"
_loaded = False


def library_path() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), _LIB_NAME)


def _minor(version: str) -> tuple:
    parts = version.split("+")[0].split(".")
    return tuple(int(p) for p in parts[:2] if p.isdigit())


def built_for_torch() -> str | None:
    """The torch version the native library was built against (None when not recorded)."""
    path = os.path.join(os.path.dirname(library_path()), _BUILD_VERSION_NAME)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read().strip() or None


def check_torch_version(built: str | None, running: str) -> None:
    if built is not None and _minor(built) != _minor(running):
        raise ImportError(
            f"mla: the native library {library_path()} was built against torch {built}, but "
            f"torch {running} is running; its C++ ABI differs. Reinstall mla with this torch "
            "(`pip install --no-build-isolation .` at the repository root, or a wheel built for "
            f"torch {running.split('+')[0]})")


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
    check_torch_version(built_for_torch(), torch.__version__)
    torch.ops.load_library(path)
    _loaded = True


def has_cuda_ops() -> bool:
    """Whether this build registered the CUDA op set (built with nvcc)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("mla::absorbed_run", "CUDA")
