"""FlashInfer-shaped entry point: BatchMLAPagedAttentionWrapper (plan / run).

Same argument names, layouts and results as flashinfer.mla.BatchMLAPagedAttentionWrapper, any
page size (1, 16, 32, 64, 128): q_nope [T, H, 512], q_pe [T, H, 64], ckv_cache
[num_pages, page_size, 512], kpe_cache [num_pages, page_size, 64], out [T, H, 512].
The returned LSE is base 2 by default, as FlashInfer's; return_lse_base_on_e=True gives the
natural log (what every other mla op returns).

ckv_cache and kpe_cache must be two views of one 576-wide buffer (as SGLang passes them): the
cache is read in place. q_nope / q_pe are read in place when they are views of one 576-wide
buffer, else they are concatenated (a copy of T x H x 576 bf16 per run). The page list
(kv_indptr, kv_indices) is read in place: kv_indices is the op's flat block table and the
host kv_indptr[:-1] are the planned rows, so request b's pages start at kv_indices[kv_indptr[b]]
(kv_indices is copied only when it is not int32 on the wrapper's device). With
use_cuda_graph=True every plan copies kv_indices into one persistent buffer (the constructor's
kv_indices, as FlashInfer takes it, else one allocated by the first plan), so a captured run
reads the pages of the latest plan.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .ops import LATENT_DIM, KV_LORA_RANK, AbsorbedPlan, _device, _host_i32

_LOG2E = 1.0 / math.log(2.0)


def _fused_576(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str):
    """The [rows.., 576] view a and b are the two halves of, or None."""
    if a.dtype != b.dtype or a.device != b.device or a.shape[:-1] != b.shape[:-1]:
        return None
    if a.shape[-1] != KV_LORA_RANK or b.shape[-1] != LATENT_DIM - KV_LORA_RANK:
        return None
    if a.stride()[:-1] != b.stride()[:-1] or a.stride(-1) != 1 or b.stride(-1) != 1:
        return None
    if b.data_ptr() != a.data_ptr() + KV_LORA_RANK * a.element_size():
        return None
    return a.as_strided(tuple(a.shape[:-1]) + (LATENT_DIM,), a.stride())


class BatchMLAPagedAttentionWrapper:
    def __init__(self, float_workspace_buffer: torch.Tensor, use_cuda_graph: bool = False,
                 qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None,
                 backend: str = "auto"):
        self.device = _device(float_workspace_buffer.device)
        self.use_cuda_graph = bool(use_cuda_graph)
        self._plan: Optional[AbsorbedPlan] = None
        self._kv_indices: Optional[torch.Tensor] = None
        self._tokens = 0
        # use_cuda_graph: a captured run keeps reading the page list it was captured with, so
        # every plan copies its kv_indices into one persistent buffer (FlashInfer's
        # kv_indices argument here, else allocated by the first plan at its size).
        self._graph_kv_indices: Optional[torch.Tensor] = None
        if self.use_cuda_graph and kv_indices is not None:
            if (not isinstance(kv_indices, torch.Tensor) or kv_indices.dtype != torch.int32
                    or kv_indices.dim() != 1 or not kv_indices.is_contiguous()
                    or _device(kv_indices.device) != self.device):
                raise ValueError("kv_indices: the use_cuda_graph buffer must be a contiguous "
                                 f"1-D int32 tensor on {self.device}")
            self._graph_kv_indices = kv_indices

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads: int,
             head_dim_ckv: int, head_dim_kpe: int, page_size: int, causal: bool,
             sm_scale: float, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
             use_profiler: bool = False) -> None:
        if head_dim_ckv != KV_LORA_RANK or head_dim_kpe != LATENT_DIM - KV_LORA_RANK:
            raise ValueError(f"head_dim_ckv = {head_dim_ckv}, head_dim_kpe = {head_dim_kpe}: "
                             f"expected {KV_LORA_RANK} and {LATENT_DIM - KV_LORA_RANK}")
        if q_data_type != torch.bfloat16:
            raise ValueError(f"q_data_type = {q_data_type}: only torch.bfloat16 is supported")
        if kv_data_type not in (torch.bfloat16, torch.float8_e4m3fn):
            raise ValueError(f"kv_data_type = {kv_data_type}: bfloat16 or float8_e4m3fn")
        qo = _host_i32(qo_indptr, "qo_indptr")
        kvp = _host_i32(kv_indptr, "kv_indptr")
        kv_len = _host_i32(kv_len_arr, "kv_len_arr")
        bs = kv_len.numel()
        if qo.numel() != bs + 1 or kvp.numel() != bs + 1:
            raise ValueError(f"qo_indptr has {qo.numel()} entries, kv_indptr {kvp.numel()}, "
                             f"kv_len_arr {bs}: expected batch_size + 1, batch_size + 1, batch_size")
        P = int(page_size)
        q_lens = qo[1:] - qo[:-1]
        pages = kvp[1:] - kvp[:-1]
        need = (kv_len + P - 1) // P
        bad = (pages < need).nonzero()
        if bad.numel():
            r = int(bad[0, 0])
            raise ValueError(f"kv_indptr: request {r} has {int(pages[r])} pages, kv_len_arr[{r}] = "
                             f"{int(kv_len[r])} needs {int(need[r])} of page_size {P}")
        if isinstance(kv_indices, torch.Tensor):
            indices = kv_indices.to(self.device, torch.int32).reshape(-1)
        else:
            indices = torch.tensor(list(kv_indices), dtype=torch.int32, device=self.device)
        if bs and int(kvp[-1]) > indices.numel():
            raise ValueError(f"kv_indices: {indices.numel()} page ids, kv_indptr[-1] = "
                             f"{int(kvp[-1])}")
        # Page j of request b is kv_indices[kv_indptr[b] + j]: the flat list is the op's block
        # table and kv_indptr[b] the row of request b (read in place, kept alive until run).
        if self.use_cuda_graph:
            indices = self._into_graph_buffer(indices)
        self._kv_indices = indices
        total_q = int(qo[-1])
        max_q = max(int(q_lens.max()) if bs else 1, 1)
        p = self._plan
        fits = (p is not None and p.num_heads == num_heads and p.page_size == P
                and p.causal == bool(causal) and p.max_batch >= bs and p.max_q_tokens >= total_q
                and p.max_q_len >= max_q)
        if not fits:
            if self.use_cuda_graph and p is not None:
                raise ValueError("use_cuda_graph: this plan exceeds the capacity of the first "
                                 f"plan (batch {p.max_batch}, {p.max_q_tokens} tokens, q_len "
                                 f"{p.max_q_len}); create a wrapper for the larger batch")
            p = AbsorbedPlan(self.device, num_heads, P, causal=causal, max_batch=max(bs, 1),
                             max_q_tokens=max(total_q, 1), max_q_len=max_q)
            self._plan = p
        p.plan(kvp[:-1], q_lens, kv_len)
        self._sm_scale = float(sm_scale)
        self._tokens = total_q
        self._num_heads = int(num_heads)
        self._kv_dtype = kv_data_type

    def _into_graph_buffer(self, indices: torch.Tensor) -> torch.Tensor:
        """The persistent page-list buffer holding `indices` (copied on the current stream,
        so a replay on it reads them)."""
        buf = self._graph_kv_indices
        if buf is None:
            buf = torch.empty(max(indices.numel(), 1), dtype=torch.int32, device=self.device)
            self._graph_kv_indices = buf
        if indices.numel() > buf.numel():
            raise ValueError(f"kv_indices: {indices.numel()} page ids exceed the use_cuda_graph "
                             f"buffer of {buf.numel()}")
        if indices.data_ptr() != buf.data_ptr():
            buf[: indices.numel()].copy_(indices)
        return buf

    def run(self, q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_cache: torch.Tensor,
            kpe_cache: torch.Tensor, out: Optional[torch.Tensor] = None,
            lse: Optional[torch.Tensor] = None, return_lse: bool = False,
            profiler_buffer=None, kv_len=None, page_table=None,
            return_lse_base_on_e: bool = False, k_scale: float = 1.0):
        if self._plan is None:
            raise RuntimeError("BatchMLAPagedAttentionWrapper.run: plan() was not called")
        T, H = self._tokens, self._num_heads
        cache = _fused_576(ckv_cache, kpe_cache, "ckv_cache", "kpe_cache")
        if cache is None:
            raise ValueError(
                "ckv_cache / kpe_cache must be two views of one 576-wide buffer "
                f"(ckv {tuple(ckv_cache.shape)} strides {ckv_cache.stride()}, kpe "
                f"{tuple(kpe_cache.shape)} strides {kpe_cache.stride()})")
        if cache.dim() == 3:
            if cache.stride(0) != cache.shape[1] * cache.stride(1):
                raise ValueError(f"ckv_cache: pages are not contiguous (strides {ckv_cache.stride()})")
            cache = cache.as_strided((cache.shape[0] * cache.shape[1], LATENT_DIM),
                                     (cache.stride(1), 1))
        q = _fused_576(q_nope, q_pe, "q_nope", "q_pe")
        if q is None:
            q = torch.cat([q_nope, q_pe], dim=-1)
        if out is None:
            out = torch.empty(T, H, KV_LORA_RANK, dtype=q_nope.dtype, device=q_nope.device)
        if lse is None:
            lse = torch.empty(T, H, dtype=torch.float32, device=q_nope.device)
        self._plan.run(q, cache, None, out, lse, self._sm_scale, k_scale,
                       block_table=self._kv_indices)
        if not return_lse:
            return out
        if not return_lse_base_on_e:
            lse.mul_(_LOG2E)
        return out, lse
