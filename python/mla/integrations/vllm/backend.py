"""MLA_PAGED: mla's paged absorbed attention as a vLLM 0.34 MLA attention backend.

Built as vLLM builds its own FlashMLA backend (vllm/v1/attention/backends/mla/flashmla.py), on
the MLA base classes of vllm/model_executor/layers/attention/mla_attention.py:
- MlaPagedBackend(MLACommonBackend): bf16 models; KV cache dtypes auto/bfloat16/fp8/fp8_e4m3;
  kernel block sizes 1, 16, 32, 64, 128 (mla.PAGE_SIZES; vLLM picks one that divides its block
  size); head size 576 (kv_lora_rank 512 + qk_rope_head_dim 64); compute capability 9.0 only
  (supports_compute_capability asks the C++ library's rule, so vLLM picks another backend on
  any other GPU). vLLM lays the cache out as
  [num_blocks, block_size, 576] and writes it itself (concat_and_cache_mla in the MLA layer);
  mla reads it in place.
- MlaPagedMetadataBuilder(MLACommonMetadataBuilder): the base class splits the batch into
  decodes and prefills; for the decode part, _build_decode plans mla's AbsorbedPlan (one per
  builder, sized for max_num_seqs and the decode query-length threshold, so a full CUDA graph
  reads the current plan from the same device buffer) through the C++ engine planner (the
  request checks and lengths rule mla.Backend uses) from host lengths: query lengths from
  query_start_loc_cpu, and key lengths from vLLM's host seq_lens (seq_lens_cpu_upper_bound,
  exact unless speculative decoding runs with async scheduling; then, and only then, the device
  seq_lens are copied to the host, a sync). Query lengths may differ per request (VARLEN):
  the plan is ragged.
- MlaPagedImpl(MLACommonImpl): forward_mqa runs the decode (and short-query / spec-verify rows
  that vLLM routes to the decode path) through mla.ops.AbsorbedPlan.run over the block table;
  prefill and chunked context stay the base class's forward_mha (vLLM's MLA prefill backends).

Bad input is refused with ValueError naming the field: model shape (kv_lora_rank,
qk_rope_head_dim, num_heads), KV cache dtype or layout, block size, query shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import weakref

import torch
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonBackend,
    MLACommonDecodeMetadata,
    MLACommonImpl,
    MLACommonMetadata,
    MLACommonMetadataBuilder,
    QueryLenSupport,
)
from vllm.v1.attention.backend import AttentionCGSupport, AttentionType

from ... import _native, support
from ..._ops import ops as _mla_ops
from ...ops import AbsorbedPlan
from ...support import KV_LORA_RANK, LATENT_DIM
from . import BACKEND_NAME

ROPE_DIM = support.QK_ROPE_DIM
PAGE_SIZES = support.PAGE_SIZES  # the C++ library's list: 1, 16, 32, 64, 128
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3")
_FP8_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3")
# Decode query-length threshold: batches with query_len <= this go through forward_mqa (vLLM
# raises it to 1 + num_speculative_tokens when speculative decoding is on).
DECODE_QUERY_LEN = 8


def _check_mla_dims(kv_lora_rank, qk_rope_head_dim, where: str) -> None:
    if kv_lora_rank != KV_LORA_RANK:
        raise ValueError(f"{where}: kv_lora_rank = {kv_lora_rank}, MLA_PAGED serves "
                         f"kv_lora_rank {KV_LORA_RANK} only")
    if qk_rope_head_dim != ROPE_DIM:
        raise ValueError(f"{where}: qk_rope_head_dim = {qk_rope_head_dim}, MLA_PAGED serves "
                         f"qk_rope_head_dim {ROPE_DIM} only")


class MlaPagedBackend(MLACommonBackend):
    supported_dtypes: ClassVar[list] = [torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list] = list(KV_CACHE_DTYPES)

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list:
        return list(PAGE_SIZES)

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_builder_cls() -> type["MlaPagedMetadataBuilder"]:
        return MlaPagedMetadataBuilder

    @staticmethod
    def get_impl_cls() -> type["MlaPagedImpl"]:
        return MlaPagedImpl

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [LATENT_DIM]

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        """The C++ library's GPU rule (mla.support.capability_refusal): mla's kernels are built
        for sm_90a, so compute capability 9.0 only; vLLM then picks another backend elsewhere."""
        if capability is None:  # no GPU known: mla's CUDA kernels cannot be promised
            return False
        return support.capability_refusal(capability.major, capability.minor) is None

    @classmethod
    def supports_combination(cls, head_size, dtype, kv_cache_dtype, block_size, use_mla,
                             has_sink, use_sparse, use_mm_prefix, device_capability):
        if not _native.has_cuda_ops():
            return ("mla was built without its CUDA ops (mla.has_cuda_ops() is False): "
                    "reinstall mla with nvcc present")
        return None


@dataclass
class MlaPagedDecodeMetadata(MLACommonDecodeMetadata):
    plan: AbsorbedPlan


@dataclass
class MlaPagedMetadata(MLACommonMetadata[MlaPagedDecodeMetadata]):
    pass


class MlaPagedMetadataBuilder(MLACommonMetadataBuilder[MlaPagedMetadata]):
    # Decode batches of one query length are replayed from a captured graph: the plan buffer
    # and workspace are the builder's, at fixed addresses, and each build re-plans into them.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    query_len_support: ClassVar[QueryLenSupport] = QueryLenSupport.VARLEN
    reorder_batch_threshold: int = DECODE_QUERY_LEN

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device, MlaPagedMetadata)
        if self.dcp_world_size > 1:
            raise ValueError(f"decode_context_parallel_size = {self.dcp_world_size}: MLA_PAGED "
                             "does not support decode context parallelism")
        _check_mla_dims(self.mla_dims.kv_lora_rank, self.mla_dims.qk_rope_head_dim,
                        "MlaPagedMetadataBuilder")
        if self.page_size not in PAGE_SIZES:
            raise ValueError(f"block_size = {self.page_size}: MLA_PAGED serves kernel block "
                             f"sizes {list(PAGE_SIZES)}")
        # Everything else knowable now, by the C++ backends' own construction check: the GPU,
        # the head count, the cache dtype.
        support.check_device(device, BACKEND_NAME)
        cache_dtype = getattr(getattr(vllm_config, "cache_config", None), "cache_dtype", "auto")
        support.check_backend_config(
            "MlaPagedMetadataBuilder", device, self.num_heads, self.page_size,
            torch.float8_e4m3fn if cache_dtype in _FP8_KV_CACHE_DTYPES else torch.bfloat16)
        max_batch = int(vllm_config.scheduler_config.max_num_seqs)
        max_q_len = int(self.reorder_batch_threshold)
        self.plan = AbsorbedPlan(device, self.num_heads, self.page_size, causal=True,
                                 max_batch=max_batch, max_q_tokens=max_batch * max_q_len,
                                 max_q_len=max_q_len)
        # The C++ engine planner (mla::EnginePlanner, as mla.Backend's): the request checks, the
        # lengths and the plan, into this builder's one holder (never grown: a captured graph
        # reads it at a fixed address).
        self._engine = int(_mla_ops.engine_new("paged_mla", self.num_heads, self.page_size,
                                               max_batch, max_q_len, max_batch * max_q_len, 0,
                                               False, False, False)[0])
        weakref.finalize(self, _mla_ops.engine_free, self._engine)
        _mla_ops.engine_set_holder(self._engine, 0, self.plan._staging.handle,
                                   self.plan.plan_tensor, self.plan._extents, max_batch,
                                   max_batch * max_q_len, max_q_len, 0, 0)
        self._rows = torch.arange(max_batch, dtype=torch.int32)  # request i: block_table row i
        spec = vllm_config.speculative_config
        async_spec = spec is not None and bool(
            getattr(vllm_config.scheduler_config, "async_scheduling", False))
        # vLLM's host seq_lens are exact except for decode rows under async spec decode.
        self._host_seq_lens_exact = not async_spec
        self._common = None

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False):
        self._common = common_attn_metadata  # for _build_decode's host seq_lens
        try:
            return super().build(common_prefix_len, common_attn_metadata, fast_build)
        finally:
            self._common = None

    def _host_seq_lens(self, seq_lens_device: torch.Tensor, n: int) -> torch.Tensor:
        if seq_lens_device.is_cpu:
            return seq_lens_device[:n]
        upper = getattr(self._common, "seq_lens_cpu_upper_bound", None)
        if self._host_seq_lens_exact and upper is not None:
            return upper[:n]
        return seq_lens_device[:n].to("cpu")  # async spec decode: the one device sync

    def _build_decode(self, block_table_tensor, seq_lens_device, max_seq_len,
                      query_start_loc_cpu, query_start_loc_device, num_decode_tokens,
                      max_query_len, dcp_tot_seq_lens_device) -> MlaPagedDecodeMetadata:
        qsl = query_start_loc_cpu
        q_lens = qsl[1:] - qsl[:-1]
        n = q_lens.numel()
        kv_lens = self._host_seq_lens(seq_lens_device, n)
        if block_table_tensor.dim() != 2 or block_table_tensor.shape[0] < n:
            raise ValueError(f"block_table: expected [>= {n}, max_blocks] page ids, got "
                             f"{tuple(block_table_tensor.shape)}")
        # vLLM's decode rows have per-request query lengths and key lengths that include them:
        # the lengths rule of a draft-extend batch (q = extend, kv = seq), planned absorbed.
        rows = self._rows[:n] if n <= self._rows.numel() else torch.arange(n, dtype=torch.int32)
        r = _mla_ops.engine_plan(self._engine, "draft_extend", rows, kv_lens,
                                 q_lens.to(torch.int32), None, 0, 0)
        if r[0] != 1:  # not the eager holder: the batch is past the builder's capacity
            raise ValueError(f"decode batch of {n} requests, {r[4]} query tokens, query length "
                             f"up to {r[5]}: past MLA_PAGED's plan capacity "
                             f"(max_num_seqs {self.plan.max_batch}, {self.plan.max_q_tokens} "
                             f"tokens, query length {self.plan.max_q_len})")
        self.plan.planned = True
        return MlaPagedDecodeMetadata(block_table=block_table_tensor, seq_lens=seq_lens_device,
                                      dcp_tot_seq_lens=dcp_tot_seq_lens_device, plan=self.plan)


class MlaPagedImpl(MLACommonImpl[MlaPagedMetadata]):
    can_return_lse_for_decode: bool = True

    def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
                 kv_cache_dtype, logits_soft_cap, attn_type, kv_sharing_target_layer_name,
                 **mla_args) -> None:
        super().__init__(num_heads, head_size, scale, num_kv_heads, alibi_slopes,
                         sliding_window, kv_cache_dtype, logits_soft_cap, attn_type,
                         kv_sharing_target_layer_name, **mla_args)
        # mla reads an fp8 cache with a bf16 query: the layer must not quantize q to fp8
        # (MLACommonImpl turns that on; the layer then hands forward_mqa an fp8 tensor).
        self.supports_quant_query_input = False
        for name, value in (("alibi_slopes", alibi_slopes), ("sliding_window", sliding_window),
                            ("logits_soft_cap", logits_soft_cap)):
            if value:
                raise NotImplementedError(f"MlaPagedImpl: {name} = {value!r} is not supported")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"MlaPagedImpl: attn_type = {attn_type!r}, only decoder "
                                      "self-attention is supported")
        if head_size != LATENT_DIM:
            raise ValueError(f"MlaPagedImpl: head_size = {head_size}, expected {LATENT_DIM}")
        if num_kv_heads != 1:
            raise ValueError(f"MlaPagedImpl: num_kv_heads = {num_kv_heads}, MLA has one latent "
                             "KV head")
        _check_mla_dims(self.kv_lora_rank, self.qk_rope_head_dim, "MlaPagedImpl")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"MlaPagedImpl: kv_cache_dtype = {kv_cache_dtype!r}, expected one "
                             f"of {list(KV_CACHE_DTYPES)}")
        self._fp8 = kv_cache_dtype in _FP8_KV_CACHE_DTYPES

    def _check_cache(self, cache: torch.Tensor, plan: AbsorbedPlan) -> None:
        want = torch.float8_e4m3fn if self._fp8 else torch.bfloat16
        if cache.dtype != want:
            raise ValueError(f"kv_c_and_k_pe_cache: dtype {cache.dtype}, expected {want} for "
                             f"kv_cache_dtype {self.kv_cache_dtype!r}")
        if cache.dim() != 3 or cache.shape[2] != LATENT_DIM:
            raise ValueError(f"kv_c_and_k_pe_cache: shape {tuple(cache.shape)}, expected "
                             f"[num_blocks, block_size, {LATENT_DIM}]")
        if cache.shape[1] != plan.page_size:
            raise ValueError(f"kv_c_and_k_pe_cache: block_size {cache.shape[1]}, the metadata "
                             f"was built for block_size {plan.page_size}")
        if not cache.is_contiguous():
            raise ValueError("kv_c_and_k_pe_cache: not contiguous (mla reads the cache as "
                             f"[slots, {LATENT_DIM}] rows)")

    def _query(self, q) -> torch.Tensor:
        if isinstance(q, tuple):
            q_nope, q_pe = q
            if (q_nope.dim() != 3 or q_pe.dim() != 3 or q_nope.shape[-1] != KV_LORA_RANK
                    or q_pe.shape[-1] != ROPE_DIM or q_nope.shape[:2] != q_pe.shape[:2]):
                raise ValueError(f"q: expected (q_nope [T, H, {KV_LORA_RANK}], q_pe [T, H, "
                                 f"{ROPE_DIM}]), got {tuple(q_nope.shape)} and "
                                 f"{tuple(q_pe.shape)}")
            q = torch.cat((q_nope, q_pe), dim=-1)
        if q.dim() != 3 or q.shape[1] != self.num_heads or q.shape[2] != LATENT_DIM:
            raise ValueError(f"q: shape {tuple(q.shape)}, expected [tokens, {self.num_heads}, "
                             f"{LATENT_DIM}]")
        if q.dtype != torch.bfloat16:
            raise ValueError(f"q: dtype {q.dtype}, expected torch.bfloat16")
        return q

    def forward_mqa(self, q, kv_c_and_k_pe_cache: torch.Tensor, attn_metadata: MlaPagedMetadata,
                    layer) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        decode = attn_metadata.decode
        if not isinstance(decode, MlaPagedDecodeMetadata):
            raise ValueError("attn_metadata.decode: expected MlaPagedDecodeMetadata from "
                             f"MlaPagedMetadataBuilder, got {type(decode).__name__}")
        q = self._query(q)
        self._check_cache(kv_c_and_k_pe_cache, decode.plan)
        tokens = q.shape[0]
        o = q.new_empty(tokens, self.num_heads, KV_LORA_RANK)
        lse = torch.empty(tokens, self.num_heads, dtype=torch.float32, device=q.device)
        k_scale = float(layer._k_scale_float) if self._fp8 else 1.0
        decode.plan.run(q, kv_c_and_k_pe_cache.view(-1, LATENT_DIM), None, o, lse, self.scale,
                        k_scale, block_table=decode.block_table)
        return o, (lse if self.need_to_return_lse_for_decode else None)
