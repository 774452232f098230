"""Python face of the native ops: plan holders (each plan one op call, uploaded through the op
library's pinned, double-buffered staging) and thin functional wrappers. Run paths allocate
nothing (the caller passes outputs); the convenience functions that return new tensors say so.

LSE convention of every op here: natural log, shape [tokens, heads], float32.
"""
from __future__ import annotations

import math
import weakref
from typing import List, Optional, Sequence, Tuple

import torch

from ._ops import ops
from .support import KV_LORA_RANK, LATENT_DIM, QK_HEAD_DIM  # noqa: F401  (from the library)


def _device(d) -> torch.device:
    d = torch.device(d)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def _host_i32(x, name: str) -> torch.Tensor:
    """A contiguous int32 cpu tensor of x (a list, numpy array or tensor on any device)."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.int32 and x.dim() == 1 and x.is_cpu and x.is_contiguous():
            return x  # the fast path planning takes every batch
        t = x.detach()
        if t.dtype != torch.int32:
            if t.dtype.is_floating_point or t.dtype == torch.bool:
                raise ValueError(f"{name}: dtype {t.dtype}, expected an integer tensor")
            t = t.to(torch.int32)
        return t.to("cpu").contiguous().reshape(-1)
    return torch.tensor(list(x), dtype=torch.int32)


def _host_lengths(x, name: str) -> torch.Tensor:
    """What the plan ops read as host lengths: a contiguous 1-D int32 or int64 cpu tensor is
    passed as it is (the op narrows int64 itself: SGLang's host mirrors are int64, and a
    conversion here would allocate per plan); anything else as _host_i32 converts it."""
    if (isinstance(x, torch.Tensor) and x.dtype in _LENGTH_DTYPES and x.dim() == 1 and x.is_cpu
            and x.is_contiguous()):
        return x
    return _host_i32(x, name)


_LENGTH_DTYPES = (torch.int32, torch.int64)


class _Staging:
    """The device plan buffer and the native pinned staging ring it is uploaded through.

    The ring (two pinned host buffers used in turn, a CUDA event recorded after each upload and
    waited on before its buffer is written again only if that upload has not finished, so a
    re-plan never overwrites bytes a copy may still read and a host one plan ahead never blocks) lives in the op library (mla::UploadStaging, as in the C++ backends): a plan is
    one op call, with no Python-side event or stream calls. Freed with this object.
    """

    def __init__(self, device: torch.device, plan_bytes: int):
        self.device = device
        self.plan = torch.empty(plan_bytes, dtype=torch.uint8, device=device)
        self.handle = ops.staging_new(device)
        weakref.finalize(self, ops.staging_free, self.handle)

    def host_bytes(self) -> List[int]:
        """Bytes of the two pinned buffers (0 until first used; none on the cpu)."""
        return list(ops.staging_bytes(self.handle))

    def blocking_waits(self) -> int:
        """Plans that blocked the host on an upload still in flight (the host more than one
        plan ahead of the GPU on this ring); 0 while it stays at most one step ahead."""
        return int(ops.staging_blocking_waits(self.handle))


class AbsorbedPlan:
    """Absorbed (MQA) paged attention over the latent cache: plan once per batch, run per layer.

    q [T, H, 576] bf16, kv_cache [slots, 576] bf16 or float8_e4m3fn, o [T, H, 512] bf16,
    lse [T, H] float32 natural log. The page table, read in place in either form (rows are the
    planned req_rows):
      req_to_token int32 [rows, cols]: SGLang's token-level table, slot of token i of row r is
        req_to_token[r, (i // P) * P] + i % P;
      block_table int32 [rows, max_blocks]: page ids (FlashMLA, vLLM), slot of token i of row r
        is block_table[r, i // P] * P + i % P; or int32 [num_pages] flat, where row r starts at
        element r (FlashInfer's kv_indices, planned with req_rows = kv_indptr[:-1]).
    Causal is bottom-right aligned. Buffers are sized for the capacity given here. A page size
    other than mla.PAGE_SIZES is refused here (ValueError naming it and the sizes served).
    own_workspace=False: the holder allocates no workspace (`workspace` is None until its user
    sets it to a uint8 tensor of at least `workspace_bytes`, as mla.Backend sets a window of its
    family's workspace).
    """

    def __init__(self, device, num_heads: int, page_size: int, *, causal: bool = True,
                 max_batch: int, max_q_tokens: int, max_q_len: int = 1,
                 own_workspace: bool = True):
        self.device = _device(device)
        self.num_heads = int(num_heads)
        self.page_size = int(page_size)
        # Refused now, not at the first plan (the library's page-size rule).
        ops.check_page_size(self.page_size, "page_size")
        self.causal = bool(causal)
        self.max_batch = int(max_batch)
        self.max_q_tokens = int(max_q_tokens)
        self.max_q_len = int(max_q_len)
        plan_bytes, ws_bytes = ops.absorbed_sizes(self.max_batch, self.max_q_tokens,
                                                  self.max_q_len, self.num_heads, self.device)
        self.plan_bytes = plan_bytes
        self.workspace_bytes = ws_bytes
        self._staging = _Staging(self.device, plan_bytes)
        self.workspace: Optional[torch.Tensor] = (
            torch.empty(ws_bytes, dtype=torch.uint8, device=self.device) if own_workspace
            else None)
        # What the last plan reads of its page table, written by the plan op and read by the
        # run op, which checks the table's shape against it (mla::check_table_extents; the cuda
        # op reads the lengths on the device, so the run op takes them from here).
        self._extents = torch.zeros(7, dtype=torch.int64)
        self.planned = False

    @property
    def plan_tensor(self) -> torch.Tensor:
        return self._staging.plan

    def blocking_waits(self) -> int:
        """Plans of this holder that blocked the host (see _Staging.blocking_waits)."""
        return self._staging.blocking_waits()

    def plan(self, req_rows, q_lens, kv_lens) -> "AbsorbedPlan":
        """Plans a batch from host lengths (lists or tensors; int32 and int64 cpu tensors are
        read in place by the op, device tensors are copied to the host, which waits for them)."""
        return self._plan_host(_host_lengths(req_rows, "req_rows"),
                               _host_lengths(q_lens, "q_lens"), _host_lengths(kv_lens, "kv_lens"))

    def _plan_host(self, rows: torch.Tensor, ql: torch.Tensor, kl: torch.Tensor):
        """plan() from lengths already as _host_lengths returns them (for callers that made
        them so, as mla.Backend: not checked twice per plan)."""
        ops.absorbed_plan(rows, ql, kl, self._staging.handle, self._staging.plan,
                          self.num_heads, self.page_size, self.causal, self.max_batch,
                          self.max_q_tokens, self.max_q_len, self._extents)
        self._rows, self._kv_lens = rows, kl  # for check_pages (references, no copy)
        self.planned = True
        return self

    @property
    def _max_row(self) -> int:  # the largest row a request with keys reads (-1: none)
        return int(self._extents[0])

    @property
    def _max_kv(self) -> int:
        return int(self._extents[1])

    @property
    def _flat_end(self) -> int:  # a flat page list's end: max of req_rows[b] + its pages
        return int(self._extents[2])

    def run(self, q, kv_cache, req_to_token, o, lse, sm_scale: float, k_scale: float = 1.0, *,
            block_table=None, check_pages: bool = False):
        """Writes o and lse (natural log) for the batch last planned; allocates nothing.
        Pass the page table as req_to_token, or as block_table with req_to_token=None.

        The table's shape is always checked against what the plan reads (its rows, its
        columns or its length: ValueError naming the table; nothing written).
        check_pages: first check every table entry the plan reads against the cache and raise
        ValueError (naming the table, request, key and slot; nothing written) when one points
        outside it. The cpu op always checks. On cuda this reads the table back: a device sync
        and a few small allocations per call, so it is off by default and not allowed under
        graph capture; unchecked, a slot outside the cache reads as zeros (never out of bounds).
        """
        if not self.planned:
            raise RuntimeError("AbsorbedPlan.run: plan() was not called")
        # The cuda op takes the head count from q, not from its device plan: checked here.
        if q.dim() != 3 or q.shape[1] != self.num_heads:
            raise ValueError(f"q: shape {tuple(q.shape)}, the plan is for "
                             f"[tokens, {self.num_heads}, {LATENT_DIM}]")
        if check_pages:
            check_page_table(req_to_token, block_table, self._rows, self._kv_lens,
                             self.page_size, kv_cache.shape[0])
        ops.absorbed_run(q, kv_cache, req_to_token, self._staging.plan, self.workspace, o, lse,
                         float(sm_scale), float(k_scale), block_table, self._extents)
        return o, lse


class MhaPlan:
    """Ragged MHA (head dims 192 for q/k, 128 for v): q rows qo_indptr[b].., k/v rows
    kv_indptr[b].. of request b. o [Tq, H, 128] bf16, lse [Tq, H] float32 natural log.
    own_workspace: as AbsorbedPlan's."""

    def __init__(self, device, num_heads: int, *, causal: bool = True, max_batch: int,
                 max_q_tokens: int, max_kv_tokens: int, max_q_len: Optional[int] = None,
                 own_workspace: bool = True):
        self.device = _device(device)
        self.num_heads = int(num_heads)
        self.causal = bool(causal)
        self.max_batch = int(max_batch)
        self.max_q_tokens = int(max_q_tokens)
        self.max_kv_tokens = int(max_kv_tokens)
        self.max_q_len = int(max_q_len if max_q_len is not None else max_q_tokens)
        plan_bytes, ws_bytes = ops.mha_sizes(self.max_batch, self.max_q_tokens,
                                             self.max_kv_tokens, self.max_q_len, self.num_heads,
                                             self.device)
        self.workspace_bytes = ws_bytes
        self._staging = _Staging(self.device, plan_bytes)
        self.workspace: Optional[torch.Tensor] = (
            torch.empty(ws_bytes, dtype=torch.uint8, device=self.device) if own_workspace
            else None)
        self.planned = False

    def plan(self, qo_indptr, kv_indptr) -> "MhaPlan":
        qo = _host_i32(qo_indptr, "qo_indptr")
        kv = _host_i32(kv_indptr, "kv_indptr")
        ops.mha_plan(qo, kv, self._staging.handle, self._staging.plan, self.num_heads,
                     self.causal, self.max_batch, self.max_q_tokens, self.max_kv_tokens,
                     self.max_q_len)
        self.planned = True
        return self

    def run(self, q, k, v, o, lse, sm_scale: float, *, merge: bool = False):
        """Writes (o, lse). With merge=True, (o, lse) already hold a state of the same rows
        over other keys (an earlier chunk of a prefix) and the result is merged into it, as
        merge_state_ would, but from the kernel's fp32 state and without a second output: a
        row that sees no key here keeps its state."""
        if not self.planned:
            raise RuntimeError("MhaPlan.run: plan() was not called")
        if q.dim() != 3 or q.shape[1] != self.num_heads:
            raise ValueError(f"q: shape {tuple(q.shape)}, the plan is for "
                             f"[tokens, {self.num_heads}, {QK_HEAD_DIM}]")
        ops.mha_run(q, k, v, self._staging.plan, self.workspace, o, lse, float(sm_scale),
                    bool(merge))
        return o, lse


def merge_state_(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor):
    """In place: (v_a, s_a) <- merge of (v_a, s_a) and (v_b, s_b). s are natural-log LSEs."""
    ops.merge_state_(v_a, s_a, v_b, s_b)
    return v_a, s_a


def merge_state_natural(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor,
                        s_b: torch.Tensor):
    """Merge of two attention states whose LSEs are natural log (what every mla op returns):
    v [T, H, D] bf16, s [T, H] float32. Returns new (v_merged, s_merged), s natural log."""
    v = v_a.clone()
    s = s_a.clone()
    ops.merge_state_(v, s, v_b, s_b)
    return v, s


_LN2 = math.log(2.0)


def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor):
    """flashinfer.merge_state: the same merge with FlashInfer's base-2 LSEs (s = log2 of the
    sum of exp of the logits, what FlashInfer's kernels and mla's BatchMLAPagedAttentionWrapper
    return by default). v [T, H, D] bf16, s [T, H] float32. Returns new (v_merged, s_merged),
    s base 2. For mla's natural-log LSEs use merge_state_natural."""
    v = v_a.clone()
    s = s_a * _LN2  # base 2 -> natural (a new tensor), merged by the one merge op
    ops.merge_state_(v, s, v_b, s_b * _LN2)
    return v, s.mul_(1.0 / _LN2)


def kv_write(c_kv: torch.Tensor, k_pe: torch.Tensor, out_cache_loc: torch.Tensor,
             kv_cache: torch.Tensor, k_scale: float = 1.0) -> None:
    """kv_cache[out_cache_loc[t]] = [c_kv[t] | k_pe[t]] (fp8 cache: value / k_scale)."""
    ops.kv_write(c_kv, k_pe, out_cache_loc, kv_cache, float(k_scale))


def up_project_workspace_bytes(max_tokens: int, num_heads: int, device) -> int:
    return ops.up_project_workspace_bytes(int(max_tokens), int(num_heads), _device(device))


def up_project(kv_cache, slots, kv_b_proj, k, v, workspace: Optional[torch.Tensor] = None,
               k_scale: float = 1.0):
    """Gathers latent rows by slot and up-projects them through kv_b_proj [H * 256, 512]:
    k [N, H, 192] = [c_kv @ W_UK^T | k_pe], v [N, H, 128] = c_kv @ W_UV^T. Pass a workspace of
    up_project_workspace_bytes(N, H) bytes to allocate nothing."""
    if workspace is None:
        nbytes = up_project_workspace_bytes(slots.numel(), k.shape[1], kv_cache.device)
        workspace = torch.empty(nbytes, dtype=torch.uint8, device=kv_cache.device)
    ops.up_project(kv_cache, slots, kv_b_proj, workspace, k, v, float(k_scale))
    return k, v


def check_page_table(req_to_token, block_table, req_rows, kv_lens, page_size: int,
                     num_slots: int) -> None:
    """Raises ValueError when an entry of the page table that a plan of (req_rows, kv_lens) reads
    points outside a cache of num_slots rows, or lies outside the table. Either form of
    AbsorbedPlan.run (req_to_token, or block_table [rows, max_blocks] / flat). Reads the table
    (a device sync for a cuda table); the indices are built on the host."""
    if (req_to_token is None) == (block_table is None):
        raise ValueError("page table: pass exactly one of req_to_token and block_table")
    name = "block_table" if block_table is not None else "req_to_token"
    table = block_table if block_table is not None else req_to_token
    P = int(page_size)
    rows = _host_i32(req_rows, "req_rows").long()
    kv = _host_i32(kv_lens, "kv_lens").long()
    pages = (kv + P - 1) // P
    n = int(pages.sum())
    if n == 0:
        return
    req = torch.repeat_interleave(torch.arange(kv.numel()), pages)
    page = torch.arange(n) - torch.repeat_interleave(torch.cumsum(pages, 0) - pages, pages)
    keys = torch.clamp(kv[req] - page * P, max=P)  # keys of the request in that page
    row = rows[req]
    flat = block_table is not None and table.dim() == 1
    # Positions first (on the host: an index outside the table must not reach the device).
    if flat:
        pos, extent = row + page, table.shape[0]
    else:
        col = page if block_table is not None else page * P
        pos, extent = col, table.shape[1]
        bad_row = (row < 0) | (row >= table.shape[0])
        if bool(bad_row.any()):
            i = int(bad_row.nonzero()[0, 0])
            raise ValueError(f"{name}: request {int(req[i])} has row {int(row[i])}, outside the "
                             f"table's {table.shape[0]} rows")
    bad_pos = (pos < 0) | (pos >= extent)
    if bool(bad_pos.any()):
        i = int(bad_pos.nonzero()[0, 0])
        raise ValueError(f"{name}: request {int(req[i])} (row {int(row[i])}) needs entry "
                         f"{int(pos[i])} for key {int(page[i]) * P}, past the table's {extent}")
    dev = table.device
    entries = (table[pos.to(dev)] if flat else table[row.to(dev), pos.to(dev)]).long()
    first = entries * P if block_table is not None else entries
    keys_d = keys.to(dev)
    bad = (first < 0) | (first + keys_d > int(num_slots))
    if bool(bad.any()):  # the one device sync
        i = int(bad.nonzero()[0, 0])
        what = (f"page id {int(entries[i])} (slot {int(first[i])})" if block_table is not None
                else f"slot {int(entries[i])}")
        raise ValueError(f"{name}: {what} for key "
                         f"{int(page[i]) * P} of request {int(req[i])} (row {int(row[i])}) is "
                         f"outside kv_cache slots [0, {int(num_slots)})")

