"""The family workspaces of mla.Backend: its plan holders' op scratch comes from the workspace of
its family, as the C++ backends' ops do (the families' workspace table, docs/architecture.md).
What each family has, its size and the bytes the ops never touch are C++'s answer
(torch.ops.mla.engine_workspace over mla::family_workspace, the rule PagedMlaBackend and
ChunkedMlaBackend acquire their workspaces by); what each holder needs is the op's
(torch.ops.mla.absorbed_sizes / mha_sizes, the holder's workspace_bytes):

  paged_mla     "paged_mla.workspace": one per device, process-global, created by the first
                paged_mla backend (or chunked_mla fallback) on that device, not zeroed, shared
                by every paged_mla backend; MLA_PAGED_WORKSPACE_BYTES (40 MiB by default).
  chunked_mla   "chunked_mla.workspace": one per device, process-global, zeroed at creation,
                shared among chunked_mla backends; its first bytes (the counters) are never
                handed to an op. A batch that falls back runs in "paged_mla.workspace", held
                from construction iff the options make a fallback possible.
  ondemand_mla  "ondemand_mla.workspace": its own, allocated when its first holder is built
                (its first batch), grown only when a holder needs more than it has, to what
                that holder needs.

Each holder runs in the window [reserved, reserved + workspace_bytes) of its family's workspace.
Holders of one backend (and the backends sharing a workspace) may share those bytes because
their ops never overlap: a backend runs one layer call at a time on the caller's current stream,
each op's scratch is dead when the op returns (CPU) or when the next op on that stream starts
(CUDA: stream order), and an engine drives its backends from one thread on one stream. Backends
on several threads take the workspace's lock while an op runs, as the C++ backends take
SharedWorkspace::lock_for_use (the cpu ops carve per-worker scratch from it); on CUDA the lock
orders the issue of the work, not its execution, so backends on different streams must order
those streams themselves (docs/reliability.md).
"""
from __future__ import annotations

import threading
from typing import Dict, Optional, Tuple

import torch

SHARED, SHARED_ZEROED, ON_DEMAND = 0, 1, 2  # mla::WorkspacePolicy
_ENV = {"paged_mla.workspace": "MLA_PAGED_WORKSPACE_BYTES",
        "chunked_mla.workspace": "MLA_CHUNKED_WORKSPACE_BYTES"}


class Workspace:
    """One workspace buffer (uint8) that plan holders take windows of."""

    def __init__(self, name: str, owner: str, device: torch.device, policy: int, nbytes: int,
                 reserved: int = 0):
        self.name, self.owner, self.device = name, owner, device
        self.policy, self.reserved = int(policy), int(reserved)
        self.grow_count = 0  # allocations made so far
        self.lock = threading.Lock()  # held while an op runs in it (one user at a time)
        self.buffer: Optional[torch.Tensor] = None
        if self.policy != ON_DEMAND:
            self._allocate(int(nbytes))

    @property
    def zeroed(self) -> bool:
        return self.policy == SHARED_ZEROED

    @property
    def nbytes(self) -> int:
        return 0 if self.buffer is None else self.buffer.numel()

    def _allocate(self, nbytes: int) -> None:
        make = torch.zeros if self.zeroed else torch.empty
        self.buffer = make(nbytes, dtype=torch.uint8, device=self.device)
        self.grow_count += 1

    def window(self, nbytes: int) -> torch.Tensor:
        """The op scratch of a holder that needs nbytes: a view of the buffer past the reserved
        bytes. An on-demand workspace is allocated or grown to fit first (its earlier windows
        then point at the old buffer: take them again); a shared one that is too small is a
        RuntimeError naming it, both sizes and the variable that sizes it (kOutOfWorkspace)."""
        need = self.reserved + int(nbytes)
        if need > self.nbytes:
            if self.policy != ON_DEMAND:
                env = _ENV.get(self.name, "")
                raise RuntimeError(
                    f"workspace '{self.name}' has {self.nbytes} bytes, but a plan holder of "
                    f"{self.owner} needs {need} ({need - self.nbytes} more)"
                    + (f"; set {env}" if env else ""))
            self._allocate(need)
        return self.buffer[self.reserved:need]


# The process-global shared workspaces, one per (name, device), as mla::WorkspaceRegistry: made
# by their first user, then handed to every later one. Held until release_all_for_testing.
_registry: Dict[Tuple[str, str], Workspace] = {}


def acquire_shared(name: str, requester: str, device: torch.device, policy: int,
                   nbytes: int, reserved: int = 0) -> Workspace:
    """The shared workspace `name` on `device`, created now (owner "shared:<requester>") if no
    backend made it yet. Another policy than its own is a ValueError (a zeroed workspace is never
    handed to a user that scribbles on it); more bytes than it has are asked for by the holders
    (Workspace.window), as in C++."""
    key = (name, str(device))
    ws = _registry.get(key)
    if ws is None:
        ws = _registry[key] = Workspace(name, f"shared:{requester}", device, policy, nbytes,
                                        reserved)
    elif ws.policy != policy:
        raise ValueError(f"workspace '{name}' on {device}: asked for policy {policy}, it has "
                         f"{ws.policy}")
    return ws


def shared_workspaces() -> Dict[Tuple[str, str], Workspace]:
    """The shared workspaces made so far, by (name, device)."""
    return dict(_registry)


def release_all_for_testing() -> None:
    """Drops the registry's references (a workspace lives on while a backend holds it), so a
    test starts from none (mla::WorkspaceRegistry::release_all_for_testing)."""
    _registry.clear()


def family_workspaces(family: str, engine: int, device: torch.device):
    """(the workspace of the family's ops, the fallback's or None) for a backend of `family`
    whose engine planner handle is `engine` (the C++ answer: policy, size, counters, fallback)."""
    from ._ops import ops
    policy, nbytes, reserved, fallback_bytes = (int(v) for v in ops.engine_workspace(engine))
    if policy == ON_DEMAND:
        return Workspace(f"{family}.workspace", family, device, ON_DEMAND, 0), None
    own = acquire_shared(f"{family}.workspace", family, device, policy, nbytes, reserved)
    fallback = None
    if fallback_bytes:
        fallback = acquire_shared("paged_mla.workspace", f"{family}.fallback", device, SHARED,
                                  fallback_bytes)
    return own, fallback
