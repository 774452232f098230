"""FlashMLA-shaped entry points: get_mla_metadata and flash_mla_with_kvcache.

Same argument names, layouts and results as FlashMLA, any page size (1, 16, 32, 64, 128):
  q (b, s_q, h, 576) bf16, k_cache (num_blocks, page_size, 1, 576) bf16 or float8_e4m3fn,
  block_table (b, max_blocks) int32 page ids, cache_seqlens (b,) int32 keys per request
  (the s_q new tokens included). Results: out (b, s_q, h, 512) bf16 and lse (b, h, s_q)
  float32, natural log (as FlashMLA).

Differences, by design: our plan is built on the host, so get_mla_metadata copies
cache_seqlens to the host (it waits for a device tensor) and returns a metadata object that
holds the plans; num_splits is returned for argument compatibility and not read. The block
table and the latent cache are read in place (no copy). A page id past the cache raises on cpu
tensors; on cuda tensors it is not checked (that would need a device sync per call) and its keys
read as zeros.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch

from .ops import LATENT_DIM, KV_LORA_RANK, AbsorbedPlan


class MlaMetadata:
    """What get_mla_metadata returns as tile_scheduler_metadata: the host copy of
    cache_seqlens and one plan per (s_q, heads, causal, device), made on first use."""

    def __init__(self, cache_seqlens_host: torch.Tensor):
        self.cache_seqlens = cache_seqlens_host
        self.plans: Dict[tuple, AbsorbedPlan] = {}

    def plan_for(self, device, s_q: int, num_heads: int, page_size: int, causal: bool):
        key = (str(device), s_q, num_heads, page_size, causal)
        plan = self.plans.get(key)
        if plan is None:
            b = self.cache_seqlens.numel()
            plan = AbsorbedPlan(device, num_heads, page_size, causal=causal, max_batch=b,
                                max_q_tokens=b * s_q, max_q_len=s_q)
            rows = torch.arange(b, dtype=torch.int32)
            plan.plan(rows, torch.full((b,), s_q, dtype=torch.int32), self.cache_seqlens)
            self.plans[key] = plan
        return plan


def get_mla_metadata(cache_seqlens: torch.Tensor, num_heads_per_head_k: int, num_heads_k: int,
                     *args, **kwargs) -> Tuple[MlaMetadata, torch.Tensor]:
    """Returns (tile_scheduler_metadata, num_splits) for flash_mla_with_kvcache."""
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dim() != 1:
        raise ValueError("cache_seqlens: expected a 1-D int32 tensor (b,), got "
                         f"{getattr(cache_seqlens, 'shape', type(cache_seqlens))}")
    if num_heads_k != 1:
        raise ValueError(f"num_heads_k = {num_heads_k}: MLA has one latent KV head")
    host = cache_seqlens.detach().to("cpu", torch.int32).contiguous()
    num_splits = torch.zeros(host.numel() + 1, dtype=torch.int32, device=cache_seqlens.device)
    return MlaMetadata(host), num_splits


def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                           cache_seqlens: torch.Tensor, head_dim_v: int,
                           tile_scheduler_metadata: MlaMetadata, num_splits: torch.Tensor,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           k_scale: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's decode call. k_scale (ours) dequantises a float8_e4m3fn cache."""
    if q.dim() != 4 or q.shape[-1] != LATENT_DIM:
        raise ValueError(f"q: expected (b, s_q, h, {LATENT_DIM}), got {tuple(q.shape)}")
    if head_dim_v != KV_LORA_RANK:
        raise ValueError(f"head_dim_v = {head_dim_v}, expected {KV_LORA_RANK}")
    if k_cache.dim() != 4 or k_cache.shape[2] != 1 or k_cache.shape[3] != LATENT_DIM:
        raise ValueError("k_cache: expected (num_blocks, page_size, 1, "
                         f"{LATENT_DIM}), got {tuple(k_cache.shape)}")
    if not isinstance(tile_scheduler_metadata, MlaMetadata):
        raise ValueError("tile_scheduler_metadata: pass what mla.get_mla_metadata returned, got "
                         f"{type(tile_scheduler_metadata).__name__}")
    b, s_q, h, _ = q.shape
    if block_table.dim() != 2 or block_table.shape[0] != b:
        raise ValueError(f"block_table: expected ({b}, max_blocks) for q's batch {b}, got "
                         f"{tuple(block_table.shape)}")
    if tile_scheduler_metadata.cache_seqlens.numel() != b:
        raise ValueError(f"tile_scheduler_metadata: planned for batch "
                         f"{tile_scheduler_metadata.cache_seqlens.numel()}, q has batch {b}")
    page_size = k_cache.shape[1]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(LATENT_DIM)
    plan = tile_scheduler_metadata.plan_for(q.device, s_q, h, page_size, causal)
    out = torch.empty(b, s_q, h, KV_LORA_RANK, dtype=q.dtype, device=q.device)
    lse = torch.empty(b * s_q, h, dtype=torch.float32, device=q.device)
    plan.run(q.reshape(b * s_q, h, LATENT_DIM), k_cache.view(-1, LATENT_DIM), None,
             out.view(b * s_q, h, KV_LORA_RANK), lse, scale, k_scale, block_table=block_table)
    return out, lse.view(b, s_q, h).transpose(1, 2).contiguous()
