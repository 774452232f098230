"""Fake (meta) implementations of the native ops, for torch.compile and opcheck.

Every native op writes into tensors the caller passes and returns nothing, so each fake only
checks nothing and returns None: the outputs' shapes are the caller's.
"""
from __future__ import annotations

import torch

from . import _native

_native.load()

_MUTATING_OPS = (
    "absorbed_plan",
    "absorbed_run",
    "mha_plan",
    "mha_run",
    "merge_state_",
    "kv_write",
    "up_project",
)


def _register_fakes() -> None:
    def _fake(*args, **kwargs):
        return None

    for name in _MUTATING_OPS:
        torch.library.register_fake(f"mla::{name}")(_fake)


_register_fakes()

ops = torch.ops.mla
