"""A stand-in for SGLang's CUDA kernel package sgl_kernel (sglang-kernel 0.4.10, pinned by SGLang
0.5.23), for the SGLang adapter tests on the GPU machine only (scripts/gpu-check.sh puts this
folder on PYTHONPATH when GPU_ENGINE_WHEELS is set; nothing else imports it).

Why: with a CUDA device, SGLang 0.5.23's modules import sgl_kernel at import time
(`from sgl_kernel import int8_scaled_mm`, ...), and its wheel is far larger than what one call to
the GPU machine can carry. The adapter tests reach none of those kernels: mla's backends run
their own ops, and the KV pool writes through SGLang's Triton / JIT kernels. So here every name
imports (any attribute, any submodule), and using one raises, naming it: a test that reached an
sgl_kernel kernel would fail loudly, never compute with a stand-in."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+mla-stub"
IS_STUB = True


class StubKernelCalled(RuntimeError):
    pass


class _Stub(type):
    """The placeholders' type: any attribute of a placeholder is another placeholder (module
    level code reads constants such as scalar_types.uint4b8)."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{cls.__module__}.{cls.__qualname__}.{name}")
        setattr(cls, name, value)
        return value


def _placeholder(qualname: str):
    def refuse(*args, **kwargs):
        raise StubKernelCalled(f"{qualname} was called, but sgl_kernel is mla's import stub "
                               "(tests/python/gpu_stubs): this test path needs the real "
                               "sglang-kernel")

    # A class, so that code that subclasses or annotates with it imports too; creating or
    # calling it raises.
    module, _, name = qualname.partition(".")
    return _Stub(name, (), {"__new__": refuse, "__module__": module, "__qualname__": name,
                            "__init_subclass__": classmethod(lambda cls, **kw: None)})


def _module_getattr(module_name: str):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{module_name}.{name}")
        setattr(sys.modules[module_name], name, value)
        return value

    return __getattr__


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any sgl_kernel.<sub>.<module> imports as an empty package with placeholder attributes."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        module.__getattr__ = _module_getattr(module.__name__)


sys.meta_path.append(_Finder())
__getattr__ = _module_getattr(__name__)
