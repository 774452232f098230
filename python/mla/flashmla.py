"""FlashMLA-shaped entry points: get_mla_metadata and flash_mla_with_kvcache.

FlashMLA's current call (its HEAD, 2026-04, and the copy vendored in vLLM 0.34) works as is:

    meta, _ = mla.get_mla_metadata()          # no arguments; (metadata, None)
    out, lse = mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, meta,
                                          causal=True)

and so does the older three-argument form (`get_mla_metadata(cache_seqlens, s_q * h_q, 1)`,
whose num_splits is passed back and not read). Layouts and conventions are FlashMLA's:
  q (b, s_q, h_q, 576) bf16, any h_q in 1..128 (cuda; any h_q >= 1 on the cpu);
  k_cache (num_blocks, page_size, 1, 576) bf16, page_size in mla.PAGE_SIZES (1, 16, 32, 64, 128);
  block_table (b, max_blocks) int32 page ids; entries past a request's pages are never read
  (FlashMLA's tests fill them with 2147480000); cache_seqlens (b,) int32 keys per request.
  out (b, s_q, h_q, 512) in q's dtype; lse (b, h_q, s_q) float32, natural log.
  softmax_scale defaults to q.shape[-1] ** -0.5 (576 ** -0.5).
  causal: FlashMLA's mask tril(diagonal = s_k - s_q), for any cache_seqlens against s_q.
  A query row that sees no key (cache_seqlens 0, or causal with s_k < s_q) gives out 0 and
  lse +inf, as FlashMLA (mla's own ops say -inf there; only this entry point says +inf).

The metadata: the first call plans on the host (a copy of cache_seqlens to the host, which waits
for a device tensor; the three-argument form copies it there instead) and records the call's
shapes; later calls of the same shapes (the other layers) reuse the plan, as FlashMLA allows
"only when the tensor shapes and the values of cache_seqlens remain the same". A call of other
shapes raises ValueError naming the field; a cpu cache_seqlens whose values changed raises too
(a cuda one is not compared: that would be a sync per layer).

fp8: FlashMLA documents one fp8 layout, the 656-byte "FP8 with scale" token of its sparse decode
(its dense decode takes none). mla does not read that layout: is_fp8_kvcache=True with such a
cache raises. mla's own fp8 form is documented here as an extra: a float8_e4m3fn k_cache of
the same (num_blocks, page_size, 1, 576) shape with one per-tensor scale, k_scale=
(is_fp8_kvcache may then be True or left False).

Not supported (ValueError naming the argument): the sparse arguments indices, attn_sink,
extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length (upstream's dense path
refuses them too), enable_batch_invariant=True, q in float16.
"""
from __future__ import annotations

import dataclasses
import math
import weakref
from typing import Dict, List, Optional, Tuple

import torch

from .ops import LATENT_DIM, KV_LORA_RANK, AbsorbedPlan, _host_i32

# FlashMLA's fp8 token of its sparse decode: 512 fp8 + 4 float32 scales + 64 bf16.
_FLASHMLA_FP8_TOKEN_BYTES = 656


@dataclasses.dataclass
class FlashMLASchedMeta:
    """What get_mla_metadata returns: empty until the first flash_mla_with_kvcache call, which
    records its shapes (config) and plans. `cache_seqlens` is set by the three-argument form
    (its host copy, so the first call need not copy it) or by the first call."""

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        device: str

    have_initialized: bool = False
    config: Optional[Config] = None
    cache_seqlens: Optional[torch.Tensor] = None  # int32 cpu copy
    num_heads_per_head_k: Optional[int] = None  # the three-argument form's s_q * h_q
    plan: Optional[AbsorbedPlan] = None
    # config as one tuple (_call_key of a call), compared first by every later call.
    _key: Optional[tuple] = dataclasses.field(default=None, repr=False, compare=False)
    # Whether a query row may see no key (then its lse is -inf from the op, +inf here): some
    # cache_seqlens is 0, or causal with one below s_q (the mask of the module docstring).
    _keyless_rows: bool = dataclasses.field(default=True, repr=False, compare=False)


MlaMetadata = FlashMLASchedMeta  # the name earlier mla versions used


def get_mla_metadata(cache_seqlens: Optional[torch.Tensor] = None,
                     num_heads_per_head_k: Optional[int] = None,
                     num_heads_k: Optional[int] = None,
                     *args, **kwargs) -> Tuple[FlashMLASchedMeta, Optional[torch.Tensor]]:
    """FlashMLA's get_mla_metadata. With no arguments: (FlashMLASchedMeta(), None), planned on
    the first flash_mla_with_kvcache call. With FlashMLA's older arguments (cache_seqlens,
    num_heads_per_head_k = s_q * h_q, num_heads_k = 1): (metadata, num_splits), where the
    metadata holds a host copy of cache_seqlens and num_splits is an int32 (b + 1,) tensor that
    flash_mla_with_kvcache accepts and does not read."""
    if cache_seqlens is None:
        return FlashMLASchedMeta(), None
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dim() != 1:
        raise ValueError("cache_seqlens: expected a 1-D int32 tensor (b,), got "
                         f"{getattr(cache_seqlens, 'shape', type(cache_seqlens))}")
    if num_heads_k is not None and num_heads_k != 1:
        raise ValueError(f"num_heads_k = {num_heads_k}: MLA has one latent KV head (1)")
    meta = FlashMLASchedMeta()
    meta.cache_seqlens = _host_i32(cache_seqlens, "cache_seqlens").clone()
    meta.num_heads_per_head_k = None if num_heads_per_head_k is None else int(num_heads_per_head_k)
    num_splits = torch.zeros(cache_seqlens.numel() + 1, dtype=torch.int32,
                             device=cache_seqlens.device)
    return meta, num_splits


def _refuse_unsupported(**given) -> None:
    for name, value in given.items():
        if value is not None:
            raise ValueError(f"{name}: FlashMLA's sparse decode arguments are not supported by "
                             "mla (dense MLA only); pass None")


def _check_inputs(q, k_cache, block_table, cache_seqlens, head_dim_v, is_fp8_kvcache):
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[-1] != LATENT_DIM:
        raise ValueError(f"q: expected (b, s_q, h_q, {LATENT_DIM}), got "
                         f"{tuple(getattr(q, 'shape', ()))}")
    if q.dtype != torch.bfloat16:
        raise ValueError(f"q: dtype {q.dtype}, mla supports torch.bfloat16")
    if head_dim_v != KV_LORA_RANK:
        raise ValueError(f"head_dim_v = {head_dim_v}, expected {KV_LORA_RANK}")
    if not isinstance(k_cache, torch.Tensor):
        raise ValueError(f"k_cache: expected a tensor, got {type(k_cache).__name__}")
    if is_fp8_kvcache and k_cache.shape[-1] != LATENT_DIM and (
            k_cache.shape[-1] % _FLASHMLA_FP8_TOKEN_BYTES == 0):
        raise ValueError(
            f"k_cache: shape {tuple(k_cache.shape)} with is_fp8_kvcache=True is FlashMLA's "
            f"{_FLASHMLA_FP8_TOKEN_BYTES}-byte 'FP8 with scale' token, which mla does not read; "
            "pass a float8_e4m3fn (num_blocks, page_size, 1, 576) cache and k_scale=")
    if k_cache.dim() != 4 or k_cache.shape[3] != LATENT_DIM:
        raise ValueError("k_cache: expected (num_blocks, page_size, 1, "
                         f"{LATENT_DIM}), got {tuple(k_cache.shape)}")
    if k_cache.shape[2] != 1:
        raise ValueError(f"k_cache: num_heads_k = {k_cache.shape[2]}, MLA has one latent KV "
                         "head (1)")
    if k_cache.dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        raise ValueError(f"k_cache: dtype {k_cache.dtype}, expected torch.bfloat16 or "
                         "torch.float8_e4m3fn")
    if is_fp8_kvcache and k_cache.dtype != torch.float8_e4m3fn:
        raise ValueError(f"is_fp8_kvcache=True, but k_cache has dtype {k_cache.dtype}")
    b = q.shape[0]
    for name, t, dims in (("block_table", block_table, 2), ("cache_seqlens", cache_seqlens, 1)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected an int32 tensor, got {type(t).__name__} (dense "
                             "MLA needs block_table and cache_seqlens)")
        if t.dtype != torch.int32:
            raise ValueError(f"{name}: dtype {t.dtype}, expected torch.int32")
        if t.dim() != dims or t.shape[0] != b:
            raise ValueError(f"{name}: shape {tuple(t.shape)}, expected batch {b} first "
                             f"({dims}-D)")


def _call_key(q, k_cache, causal, is_fp8_kvcache) -> tuple:
    """What a metadata's config records of a call, as one cheap tuple."""
    return (q.shape, k_cache.shape[1], k_cache.shape[2], bool(causal), bool(is_fp8_kvcache),
            q.device)


def _config_of(q, k_cache, causal, is_fp8_kvcache) -> FlashMLASchedMeta.Config:
    b, s_q, h_q, _ = q.shape
    return FlashMLASchedMeta.Config(b, s_q, h_q, k_cache.shape[1], k_cache.shape[2],
                                    bool(causal), bool(is_fp8_kvcache), str(q.device))


# Plan holders of this call form, reused across metadata objects: FlashMLA's callers make a new
# get_mla_metadata() object every step, and a holder (plan tensor, workspace, staging ring) per
# object would be built and freed every step. A holder is free again once the metadata object
# that planned into it is gone (its weak reference is dead); the first call of a new object takes
# a free holder of its kind (device, heads, page size, causal) whose capacity holds the batch,
# else replaces a free one too small (with at least twice its batch), else adds one.
_HOLDERS: Dict[tuple, List[list]] = {}  # kind -> [[AbsorbedPlan, weakref to its metadata]]
_ROWS: Dict[int, torch.Tensor] = {}  # 0: req_rows 0, 1, 2, ... (block_table rows), reused
_Q_LENS: Dict[int, torch.Tensor] = {}  # s_q -> q_lens all s_q, reused


def _holder(meta, device, h_q: int, page: int, causal: bool, b: int, s_q: int) -> AbsorbedPlan:
    entries = _HOLDERS.setdefault((str(device), h_q, page, causal), [])
    small = None
    for entry in entries:
        if entry[1]() is not None:
            continue  # its metadata is still alive: it may still run
        plan = entry[0]
        if plan.max_batch >= b and plan.max_q_tokens >= b * s_q and plan.max_q_len >= s_q:
            entry[1] = weakref.ref(meta)
            return plan
        small = entry
    grow = small[0].max_batch * 2 if small is not None else 1
    batch = max(b, grow, 1)
    plan = AbsorbedPlan(device, h_q, page, causal=causal, max_batch=batch,
                        max_q_tokens=max(batch * s_q, 1), max_q_len=max(s_q, 1))
    if small is not None:
        small[0], small[1] = plan, weakref.ref(meta)
    else:
        entries.append([plan, weakref.ref(meta)])
    return plan


def _fill(cache: Dict[int, torch.Tensor], key: int, n: int, make) -> torch.Tensor:
    """The first n entries of a cached int32 host tensor, rebuilt larger when needed."""
    t = cache.get(key)
    if t is None or t.numel() < n:
        t = cache[key] = make(max(n, 2 * (t.numel() if t is not None else 0)))
    return t[:n]


def _plan_for(meta: FlashMLASchedMeta, q, k_cache, cache_seqlens, causal,
              is_fp8_kvcache) -> AbsorbedPlan:
    """The metadata's plan: made on its first use, else checked against this call (the
    config as one tuple first; field by field, to name the field, only when it differs)."""
    key = _call_key(q, k_cache, causal, is_fp8_kvcache)
    if meta.have_initialized and key == meta._key:
        if cache_seqlens.is_cpu and not torch.equal(cache_seqlens, meta.cache_seqlens):
            raise ValueError("cache_seqlens: its values differ from those the metadata was "
                             "planned with; call mla.get_mla_metadata() again")
        return meta.plan
    config = _config_of(q, k_cache, causal, is_fp8_kvcache)
    if meta.have_initialized:
        for field in dataclasses.fields(config):
            was, now = getattr(meta.config, field.name), getattr(config, field.name)
            if was != now:
                raise ValueError(
                    f"tile_scheduler_metadata: planned for {field.name} = {was}, this call has "
                    f"{field.name} = {now}; reuse a metadata only across calls of the same "
                    "shapes (call mla.get_mla_metadata() again for others)")
        if cache_seqlens.is_cpu and not torch.equal(cache_seqlens, meta.cache_seqlens):
            raise ValueError("cache_seqlens: its values differ from those the metadata was "
                             "planned with; call mla.get_mla_metadata() again")
        return meta.plan
    b, s_q, h_q = config.b, config.s_q, config.h_q
    if meta.num_heads_per_head_k is not None and meta.num_heads_per_head_k != s_q * h_q:
        raise ValueError(f"tile_scheduler_metadata: planned for num_heads_per_head_k = "
                         f"{meta.num_heads_per_head_k}, q has s_q * h_q = {s_q * h_q}")
    if meta.cache_seqlens is None:
        meta.cache_seqlens = _host_i32(cache_seqlens, "cache_seqlens").clone()
    elif meta.cache_seqlens.numel() != b:
        raise ValueError(f"tile_scheduler_metadata: planned for batch "
                         f"{meta.cache_seqlens.numel()}, q has batch {b}")
    elif cache_seqlens.is_cpu and not torch.equal(cache_seqlens, meta.cache_seqlens):
        raise ValueError("cache_seqlens: its values differ from those get_mla_metadata was "
                         "given")
    plan = _holder(meta, q.device, h_q, config.page_block_size, config.causal, b, s_q)
    rows = _fill(_ROWS, 0, b, lambda n: torch.arange(n, dtype=torch.int32))
    q_lens = _fill(_Q_LENS, s_q, b, lambda n: torch.full((n,), s_q, dtype=torch.int32))
    plan.plan(rows, q_lens, meta.cache_seqlens)
    meta.plan, meta.config, meta.have_initialized = plan, config, True
    meta._key = key
    shortest = int(meta.cache_seqlens.min()) if b else 0
    meta._keyless_rows = shortest == 0 or (config.causal and shortest < s_q)
    return plan


def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor,
                           block_table: Optional[torch.Tensor],
                           cache_seqlens: Optional[torch.Tensor], head_dim_v: int,
                           tile_scheduler_metadata: FlashMLASchedMeta,
                           num_splits: Optional[torch.Tensor] = None,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           is_fp8_kvcache: bool = False, indices: Optional[torch.Tensor] = None,
                           attn_sink: Optional[torch.Tensor] = None,
                           extra_k_cache: Optional[torch.Tensor] = None,
                           extra_indices_in_kvcache: Optional[torch.Tensor] = None,
                           topk_length: Optional[torch.Tensor] = None,
                           extra_topk_length: Optional[torch.Tensor] = None,
                           out: Optional[torch.Tensor] = None,
                           enable_batch_invariant: bool = False, *,
                           k_scale: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's dense decode call (see the module docstring for the conventions). Returns
    (out (b, s_q, h_q, 512), lse (b, h_q, s_q) float32 natural log, +inf for rows without
    keys). out= (vLLM's copy of the interface) is written in place and returned. k_scale
    (mla's extra, keyword only) dequantises a float8_e4m3fn cache: value = stored * k_scale."""
    _refuse_unsupported(indices=indices, attn_sink=attn_sink, extra_k_cache=extra_k_cache,
                        extra_indices_in_kvcache=extra_indices_in_kvcache,
                        topk_length=topk_length, extra_topk_length=extra_topk_length)
    if not isinstance(is_fp8_kvcache, bool):  # a k_scale passed where mla's older form had it
        raise ValueError(f"is_fp8_kvcache = {is_fp8_kvcache!r}: expected a bool (mla's per-tensor "
                         "fp8 scale is the keyword argument k_scale=)")
    if enable_batch_invariant:
        raise ValueError("enable_batch_invariant=True: not supported by mla's FlashMLA entry "
                         "point (mla.Backend has a batch_invariant option)")
    if not isinstance(tile_scheduler_metadata, FlashMLASchedMeta):
        raise ValueError("tile_scheduler_metadata: pass what mla.get_mla_metadata returned, got "
                         f"{type(tile_scheduler_metadata).__name__}")
    if num_splits is not None and not isinstance(num_splits, torch.Tensor):
        raise ValueError(f"num_splits: None (or the older form's tensor), got {num_splits!r}")
    _check_inputs(q, k_cache, block_table, cache_seqlens, head_dim_v, is_fp8_kvcache)
    b, s_q, h, d = q.shape
    if out is not None and (not isinstance(out, torch.Tensor) or out.dtype != q.dtype
                            or tuple(out.shape) != (b, s_q, h, KV_LORA_RANK)
                            or out.device != q.device):
        raise ValueError(f"out: expected a {q.dtype} tensor ({b}, {s_q}, {h}, {KV_LORA_RANK}) "
                         f"on {q.device}, got {getattr(out, 'dtype', type(out))} "
                         f"{tuple(getattr(out, 'shape', ()))}")
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    plan = _plan_for(tile_scheduler_metadata, q, k_cache, cache_seqlens, causal, is_fp8_kvcache)
    if out is None:
        out = torch.empty(b, s_q, h, KV_LORA_RANK, dtype=q.dtype, device=q.device)
    try:
        o_rows = out.view(b * s_q, h, KV_LORA_RANK)
    except RuntimeError as e:
        raise ValueError(f"out: strides {out.stride()} cannot be viewed as "
                         f"({b * s_q}, {h}, {KV_LORA_RANK}) rows") from e
    lse = torch.empty(b * s_q, h, dtype=torch.float32, device=q.device)
    plan.run(q.reshape(b * s_q, h, LATENT_DIM), k_cache.view(-1, LATENT_DIM), None, o_rows, lse,
             scale, k_scale, block_table=block_table)
    # FlashMLA's convention for a row without keys (mla's ops: -inf), in place, only when the
    # metadata's lengths allow such a row; NaN and +inf stay. Then FlashMLA's layout
    # (b, h_q, s_q): the same bytes for s_q = 1, a copy otherwise.
    if tile_scheduler_metadata._keyless_rows:
        lse.nan_to_num_(nan=math.nan, posinf=math.inf, neginf=math.inf)
    if s_q == 1:
        return out, lse.view(b, h, 1)
    return out, lse.view(b, s_q, h).transpose(1, 2).contiguous()
