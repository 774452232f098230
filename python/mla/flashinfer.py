"""FlashInfer-shaped entry point: BatchMLAPagedAttentionWrapper (plan / run) and MLAPlanMetadata.

The call forms of FlashInfer 0.7.4's flashinfer.mla.BatchMLAPagedAttentionWrapper, the page
sizes mla.PAGE_SIZES (1, 16, 32, 64, 128), any head count (1..128 on cuda):
  plan(metadata=MLAPlanMetadata.csr(qo_indptr, kv_indptr, kv_indices, kv_len_arr)
                | MLAPlanMetadata.dense(cum_seq_lens_q, block_tables, seq_lens, max_q_len)
                | MLAPlanMetadata.dual(...),
       num_heads=, head_dim_ckv=512, head_dim_kpe=64, page_size=, causal=, sm_scale=,
       q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16 | torch.float8_e4m3fn,
       lse_mode="none" | "base2" | "basee", query_layout=, kv_cache_layout=, ...);
  the deprecated flat forms plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, ...)
  and plan(cum_seq_lens_q=, block_tables=, seq_lens=, ...);
  run(query=q [T, H, 576] or (q_nope [T, H, 512], q_pe [T, H, 64]),
      kv_cache=cache [pages, page_size, 576] or (ckv [.., 512], kpe [.., 64]), out=, lse=,
      return_lse=, return_lse_base_on_e=, ckv_scale=, kpe_scale=);
  the deprecated run(q_nope, q_pe, ckv_cache, kpe_cache, out, lse, return_lse, ...).
An (mla or flashinfer) object with MLAPlanMetadata's fields is accepted as metadata.

LSE: base 2 by default, as FlashInfer's; natural log with lse_mode="basee" (or, for the legacy
flat CSR plan, return_lse_base_on_e=True at run). A plan with lse_mode="none" returns no LSE
(return_lse=True then raises), except the legacy flat CSR plan, which decides at run time as
FlashInfer 0.7.4 still allows. Rows that see no key: out 0, lse -inf.

The cache must be read in place: a packed tensor, or ckv / kpe two views of one 576-wide buffer
(as SGLang passes them). q_nope / q_pe that are not views of one buffer are concatenated (a copy
of T x H x 576 bf16 per run). The page list is read in place (copied only when it is not int32
on the wrapper's device). With use_cuda_graph=True every plan copies its page list into one
persistent buffer (the constructor's kv_indices, else one allocated by the first plan), so a
captured run reads the pages of the latest plan.

fp8: kv_data_type=torch.float8_e4m3fn with one per-tensor scale: ckv_scale= (FlashInfer's name;
kpe_scale, when given, must equal it) or k_scale= (mla's name). Not supported (ValueError naming
the argument): ckv_scale_arr, o_scale / output_scale (fp8 output), skip_softmax, use_sinks /
sinks, use_profiler / profiler_buffer, bmm1_scale / bmm2_scale, and run-time kv_len / page_table
(plan them instead).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

from .ops import LATENT_DIM, KV_LORA_RANK, AbsorbedPlan, _device, _host_i32

_LOG2E = 1.0 / math.log(2.0)
_KPE_DIM = LATENT_DIM - KV_LORA_RANK
_LSE_MODES = ("none", "base2", "basee")
_LAYOUTS = ("packed", "split")


@dataclasses.dataclass(frozen=True)
class MLAPlanMetadata:
    """FlashInfer's canonical plan metadata: CSR (qo_indptr [bs + 1], kv_indptr [bs + 1] into the
    flat page list kv_indices, kv_len_arr [bs]) and/or dense (cum_seq_lens_q [bs + 1],
    block_tables [bs, max_blocks], seq_lens [bs], max_q_len)."""

    qo_indptr: Optional[torch.Tensor] = None
    kv_indptr: Optional[torch.Tensor] = None
    kv_indices: Optional[torch.Tensor] = None
    kv_len_arr: Optional[torch.Tensor] = None
    cum_seq_lens_q: Optional[torch.Tensor] = None
    block_tables: Optional[torch.Tensor] = None
    seq_lens: Optional[torch.Tensor] = None
    max_q_len: Optional[int] = None

    @classmethod
    def csr(cls, qo_indptr, kv_indptr, kv_indices, kv_len_arr) -> "MLAPlanMetadata":
        return cls(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                   kv_len_arr=kv_len_arr)

    @classmethod
    def dense(cls, cum_seq_lens_q, block_tables, seq_lens,
              max_q_len: Optional[int] = None) -> "MLAPlanMetadata":
        return cls(cum_seq_lens_q=cum_seq_lens_q, block_tables=block_tables, seq_lens=seq_lens,
                   max_q_len=max_q_len)

    @classmethod
    def dual(cls, qo_indptr, kv_indptr, kv_indices, kv_len_arr, cum_seq_lens_q, block_tables,
             seq_lens, max_q_len: Optional[int] = None) -> "MLAPlanMetadata":
        return cls(qo_indptr, kv_indptr, kv_indices, kv_len_arr, cum_seq_lens_q, block_tables,
                   seq_lens, max_q_len)


_CSR_FIELDS = ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr")
_DENSE_FIELDS = ("cum_seq_lens_q", "block_tables", "seq_lens")


def _fused_576(a: torch.Tensor, b: torch.Tensor):
    """The [rows.., 576] view a and b are the two halves of, or None."""
    if a.dtype != b.dtype or a.device != b.device or a.shape[:-1] != b.shape[:-1]:
        return None
    if a.shape[-1] != KV_LORA_RANK or b.shape[-1] != _KPE_DIM:
        return None
    if a.stride()[:-1] != b.stride()[:-1] or a.stride(-1) != 1 or b.stride(-1) != 1:
        return None
    if b.data_ptr() != a.data_ptr() + KV_LORA_RANK * a.element_size():
        return None
    return a.as_strided(tuple(a.shape[:-1]) + (LATENT_DIM,), a.stride())


def _packed(value, name: str, *, copy_ok: bool) -> torch.Tensor:
    """The 576-wide tensor of a packed tensor or a (512-wide, 64-wide) pair."""
    if isinstance(value, torch.Tensor):
        if value.shape[-1] != LATENT_DIM:
            raise ValueError(f"{name}: a packed tensor's last dim must be {LATENT_DIM}, got "
                             f"{tuple(value.shape)}")
        return value
    if not (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(t, torch.Tensor) for t in value)):
        raise ValueError(f"{name}: expected a packed tensor or a pair of tensors, got "
                         f"{type(value).__name__}")
    a, b = value
    fused = _fused_576(a, b)
    if fused is not None:
        return fused
    if not copy_ok:
        raise ValueError(f"{name}: the two halves must be views of one {LATENT_DIM}-wide buffer "
                         f"(got {tuple(a.shape)} strides {a.stride()}, {tuple(b.shape)} strides "
                         f"{b.stride()})")
    if a.shape[-1] != KV_LORA_RANK or b.shape[-1] != _KPE_DIM or a.shape[:-1] != b.shape[:-1]:
        raise ValueError(f"{name}: expected halves [.., {KV_LORA_RANK}] and [.., {_KPE_DIM}], got "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    return torch.cat([a, b], dim=-1)


def _refuse(**given) -> None:
    """ValueError naming the first argument set to something mla does not do."""
    for name, (value, default) in given.items():
        if value is not default and value != default:
            raise ValueError(f"{name} = {value!r}: not supported by mla's "
                             f"BatchMLAPagedAttentionWrapper (only {default!r})")


class BatchMLAPagedAttentionWrapper:
    def __init__(self, float_workspace_buffer: torch.Tensor, use_cuda_graph: bool = False,
                 qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None,
                 backend: str = "auto"):
        self.device = _device(float_workspace_buffer.device)
        self.use_cuda_graph = bool(use_cuda_graph)
        self._plan: Optional[AbsorbedPlan] = None
        self._table: Optional[torch.Tensor] = None
        self._tokens = 0
        # use_cuda_graph: a captured run keeps reading the page list it was captured with, so
        # every plan copies its page list into one persistent buffer (FlashInfer's kv_indices
        # argument here, else allocated by the first plan at its size).
        self._graph_table: Optional[torch.Tensor] = None
        if self.use_cuda_graph and kv_indices is not None:
            if (not isinstance(kv_indices, torch.Tensor) or kv_indices.dtype != torch.int32
                    or kv_indices.dim() != 1 or not kv_indices.is_contiguous()
                    or _device(kv_indices.device) != self.device):
                raise ValueError("kv_indices: the use_cuda_graph buffer must be a contiguous "
                                 f"1-D int32 tensor on {self.device}")
            self._graph_table = kv_indices

    # ---- plan ----
    def plan(self, qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None,
             num_heads: Optional[int] = None, head_dim_ckv: Optional[int] = None,
             head_dim_kpe: Optional[int] = None, page_size: Optional[int] = None,
             causal: Optional[bool] = None, sm_scale: Optional[float] = None,
             q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
             use_profiler: bool = False, *, metadata=None, cum_seq_lens_q=None,
             block_tables=None, seq_lens=None, max_q_len: Optional[int] = None,
             query_layout: Optional[str] = None, kv_cache_layout: Optional[str] = None,
             lse_mode: str = "none", output_dtype=None, output_scale: str = "none",
             scale_mode: str = "default", skip_softmax: bool = False, enable_pdl=None,
             use_sinks: bool = False) -> None:
        flat = dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                    kv_len_arr=kv_len_arr, cum_seq_lens_q=cum_seq_lens_q,
                    block_tables=block_tables, seq_lens=seq_lens, max_q_len=max_q_len)
        if metadata is not None:
            given = [k for k, v in flat.items() if v is not None]
            if given:
                raise ValueError(f"plan: pass metadata= or the flat fields, not both (got "
                                 f"metadata and {', '.join(given)})")
            if not all(hasattr(metadata, f) for f in _CSR_FIELDS + _DENSE_FIELDS):
                raise ValueError("metadata: expected an MLAPlanMetadata, got "
                                 f"{type(metadata).__name__}")
            md = {f: getattr(metadata, f) for f in flat}
            legacy_csr = False
        else:
            md = flat
            legacy_csr = any(md[f] is not None for f in _CSR_FIELDS)
            if legacy_csr and any(md[f] is not None for f in _DENSE_FIELDS):
                raise ValueError("plan: the flat CSR fields and the dense fields cannot be mixed")
        missing = [n for n, v in (("num_heads", num_heads), ("head_dim_ckv", head_dim_ckv),
                                  ("head_dim_kpe", head_dim_kpe), ("page_size", page_size),
                                  ("causal", causal), ("sm_scale", sm_scale)) if v is None]
        if missing:
            raise ValueError(f"plan: missing {', '.join(missing)}")
        if head_dim_ckv != KV_LORA_RANK or head_dim_kpe != _KPE_DIM:
            raise ValueError(f"head_dim_ckv = {head_dim_ckv}, head_dim_kpe = {head_dim_kpe}: "
                             f"expected {KV_LORA_RANK} and {_KPE_DIM}")
        if q_data_type != torch.bfloat16:
            raise ValueError(f"q_data_type = {q_data_type}: only torch.bfloat16 is supported")
        if kv_data_type not in (torch.bfloat16, torch.float8_e4m3fn):
            raise ValueError(f"kv_data_type = {kv_data_type}: bfloat16 or float8_e4m3fn")
        if lse_mode not in _LSE_MODES:
            raise ValueError(f"lse_mode = {lse_mode!r}: one of {_LSE_MODES}")
        for name, layout in (("query_layout", query_layout), ("kv_cache_layout", kv_cache_layout)):
            if layout is not None and layout not in _LAYOUTS:
                raise ValueError(f"{name} = {layout!r}: one of {_LAYOUTS}")
        if output_dtype is not None and output_dtype != q_data_type:
            raise ValueError(f"output_dtype = {output_dtype}: only q_data_type ({q_data_type})")
        if scale_mode not in ("default", "kv-per-tensor"):
            raise ValueError(f"scale_mode = {scale_mode!r}: 'default' or 'kv-per-tensor'")
        _refuse(use_profiler=(use_profiler, False), output_scale=(output_scale, "none"),
                skip_softmax=(skip_softmax, False), use_sinks=(use_sinks, False))

        P = int(page_size)
        if md["qo_indptr"] is not None or md["cum_seq_lens_q"] is None:
            rows, q_lens, kv_lens, table = self._csr(md, P)
            if md["cum_seq_lens_q"] is not None:  # dual: the dense half must say the same
                self._check_dual(md, q_lens, kv_lens)
        else:
            rows, q_lens, kv_lens, table = self._dense(md)
        if self.use_cuda_graph:
            table = self._into_graph_buffer(table)
        bs = kv_lens.numel()
        total_q = int(q_lens.sum())
        max_q = max(int(q_lens.max()) if bs else 1, 1)
        if md["max_q_len"] is not None and int(md["max_q_len"]) < max_q:
            raise ValueError(f"max_q_len = {md['max_q_len']}, but a request has {max_q} queries")
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
        p.plan(rows, q_lens, kv_lens)
        self._table = table
        self._sm_scale = float(sm_scale)
        self._tokens = total_q
        self._num_heads = int(num_heads)
        self._kv_dtype = kv_data_type
        self._lse_mode = lse_mode
        self._legacy_csr = legacy_csr

    def _csr(self, md, P):
        """(rows, q_lens, kv_lens, flat page list): page j of request b is
        kv_indices[kv_indptr[b] + j], so the flat list is the op's block table and kv_indptr[b]
        the row of request b (read in place, kept alive until run)."""
        missing = [f for f in _CSR_FIELDS if md[f] is None]
        if missing:
            raise ValueError(f"plan: the CSR metadata lacks {', '.join(missing)}")
        qo = _host_i32(md["qo_indptr"], "qo_indptr")
        kvp = _host_i32(md["kv_indptr"], "kv_indptr")
        kv_len = _host_i32(md["kv_len_arr"], "kv_len_arr")
        bs = kv_len.numel()
        if qo.numel() != bs + 1 or kvp.numel() != bs + 1:
            raise ValueError(f"qo_indptr has {qo.numel()} entries, kv_indptr {kvp.numel()}, "
                             f"kv_len_arr {bs}: expected batch_size + 1, batch_size + 1, batch_size")
        pages = kvp[1:] - kvp[:-1]
        need = (kv_len + P - 1) // P
        bad = (pages < need).nonzero()
        if bad.numel():
            r = int(bad[0, 0])
            raise ValueError(f"kv_indptr: request {r} has {int(pages[r])} pages, kv_len_arr[{r}] = "
                             f"{int(kv_len[r])} needs {int(need[r])} of page_size {P}")
        indices = md["kv_indices"]
        if isinstance(indices, torch.Tensor):
            indices = indices.to(self.device, torch.int32).reshape(-1)
        else:
            indices = torch.tensor(list(indices), dtype=torch.int32, device=self.device)
        if bs and int(kvp[-1]) > indices.numel():
            raise ValueError(f"kv_indices: {indices.numel()} page ids, kv_indptr[-1] = "
                             f"{int(kvp[-1])}")
        return kvp[:-1], qo[1:] - qo[:-1], kv_len, indices

    def _dense(self, md):
        """(rows, q_lens, kv_lens, block table [bs, max_blocks]) of the dense metadata."""
        missing = [f for f in _DENSE_FIELDS if md[f] is None]
        if missing:
            raise ValueError(f"plan: the dense metadata lacks {', '.join(missing)}")
        cum_q = _host_i32(md["cum_seq_lens_q"], "cum_seq_lens_q")
        kv_len = _host_i32(md["seq_lens"], "seq_lens")
        bs = kv_len.numel()
        if cum_q.numel() != bs + 1:
            raise ValueError(f"cum_seq_lens_q has {cum_q.numel()} entries, seq_lens {bs}: "
                             "expected batch_size + 1 and batch_size")
        bt = md["block_tables"]
        if not isinstance(bt, torch.Tensor) or bt.dim() != 2 or bt.shape[0] != bs:
            raise ValueError(f"block_tables: expected [{bs}, max_blocks], got "
                             f"{tuple(getattr(bt, 'shape', ()))}")
        if bt.dtype != torch.int32 or _device(bt.device) != self.device:
            bt = bt.to(self.device, torch.int32)
        return torch.arange(bs, dtype=torch.int32), cum_q[1:] - cum_q[:-1], kv_len, bt

    @staticmethod
    def _check_dual(md, q_lens, kv_lens):
        cum_q = _host_i32(md["cum_seq_lens_q"], "cum_seq_lens_q")
        seq = _host_i32(md["seq_lens"], "seq_lens")
        if (cum_q.numel() != q_lens.numel() + 1 or not torch.equal(cum_q[1:] - cum_q[:-1], q_lens)
                or not torch.equal(seq, kv_lens)):
            raise ValueError("metadata: the dense half (cum_seq_lens_q, seq_lens) describes "
                             "other requests than the CSR half (qo_indptr, kv_len_arr)")

    def _into_graph_buffer(self, table: torch.Tensor) -> torch.Tensor:
        """The persistent page-table buffer holding `table` (copied on the current stream,
        so a replay on it reads them): a flat page list, or the top-left corner of a block
        table buffer of the first plan's shape."""
        buf = self._graph_table
        if buf is None:
            buf = torch.empty(tuple(max(n, 1) for n in table.shape), dtype=torch.int32,
                              device=self.device)
            self._graph_table = buf
        if buf.dim() != table.dim() or any(n > m for n, m in zip(table.shape, buf.shape)):
            what = "page ids" if table.dim() == 1 else "block table entries"
            raise ValueError(f"kv_indices: {tuple(table.shape)} {what} exceed the use_cuda_graph "
                             f"buffer of {tuple(buf.shape)}")
        view = buf[: table.shape[0]] if table.dim() == 1 else buf[: table.shape[0], : table.shape[1]]
        if table.data_ptr() != buf.data_ptr():
            view.copy_(table)
        return view

    # ---- run ----
    def run(self, q_nope: Optional[torch.Tensor] = None, q_pe: Optional[torch.Tensor] = None,
            ckv_cache: Optional[torch.Tensor] = None, kpe_cache: Optional[torch.Tensor] = None,
            out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
            return_lse: bool = False, profiler_buffer=None, kv_len=None, page_table=None,
            return_lse_base_on_e: bool = False, o_scale=None, *, query=None, kv_cache=None,
            ckv_scale: Optional[float] = None, ckv_scale_arr=None,
            kpe_scale: Optional[float] = None, sinks=None,
            skip_softmax_threshold_scale_factor=None, bmm1_scale=None, bmm2_scale=None,
            k_scale: Optional[float] = None):
        if self._plan is None:
            raise RuntimeError("BatchMLAPagedAttentionWrapper.run: plan() was not called")
        for name, value in (("profiler_buffer", profiler_buffer), ("o_scale", o_scale),
                            ("ckv_scale_arr", ckv_scale_arr), ("sinks", sinks),
                            ("skip_softmax_threshold_scale_factor",
                             skip_softmax_threshold_scale_factor),
                            ("bmm1_scale", bmm1_scale), ("bmm2_scale", bmm2_scale),
                            ("kv_len", kv_len), ("page_table", page_table)):
            if value is not None:
                raise ValueError(f"{name}: not supported by mla's BatchMLAPagedAttentionWrapper "
                                 "(pass None; lengths and pages come from plan(); mla's cache "
                                 "scale is ckv_scale= or k_scale=)")
        query = self._one_of(query, q_nope, q_pe, "query", "q_nope", "q_pe")
        kv_cache = self._one_of(kv_cache, ckv_cache, kpe_cache, "kv_cache", "ckv_cache",
                                "kpe_cache")
        scale = self._cache_scale(ckv_scale, kpe_scale, k_scale)
        base = self._lse_base(return_lse, lse, return_lse_base_on_e)
        cache = _packed(kv_cache, "kv_cache", copy_ok=False)
        if cache.dim() == 3:
            if cache.stride(0) != cache.shape[1] * cache.stride(1):
                raise ValueError(f"kv_cache: pages are not contiguous (strides {cache.stride()})")
            cache = cache.as_strided((cache.shape[0] * cache.shape[1], LATENT_DIM),
                                     (cache.stride(1), 1))
        q = _packed(query, "query", copy_ok=True)
        T, H = self._tokens, self._num_heads
        if out is None:
            out = torch.empty(T, H, KV_LORA_RANK, dtype=q.dtype, device=q.device)
        want_lse = base is not None
        if lse is None and want_lse:
            lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
        lse_out = lse if lse is not None else torch.empty(T, H, dtype=torch.float32,
                                                          device=q.device)
        self._plan.run(q, cache, None, out, lse_out, self._sm_scale, scale,
                       block_table=self._table)
        if base == "2":
            lse.mul_(_LOG2E)
        return (out, lse) if return_lse else out

    @staticmethod
    def _one_of(value, a, b, name, name_a, name_b):
        if value is not None:
            if a is not None or b is not None:
                raise ValueError(f"run: pass {name}= or {name_a}/{name_b}, not both")
            return value
        if a is None or b is None:
            raise ValueError(f"run: {name}= (or both {name_a} and {name_b}) is required")
        return (a, b)

    def _cache_scale(self, ckv_scale, kpe_scale, k_scale) -> float:
        if ckv_scale is not None and k_scale is not None and float(ckv_scale) != float(k_scale):
            raise ValueError(f"ckv_scale = {ckv_scale} and k_scale = {k_scale}: pass one")
        scale = ckv_scale if ckv_scale is not None else k_scale
        if kpe_scale is not None and (scale is None or float(kpe_scale) != float(scale)):
            raise ValueError(f"kpe_scale = {kpe_scale}: mla's fp8 cache has one per-tensor scale "
                             f"for all {LATENT_DIM} columns; kpe_scale must equal ckv_scale "
                             f"({scale})")
        return 1.0 if scale is None else float(scale)

    def _lse_base(self, return_lse, lse, base_on_e) -> Optional[str]:
        """'2', 'e' or None (no LSE wanted) under the plan's lse_mode."""
        if not return_lse and lse is None:
            return None
        mode = self._lse_mode
        if mode == "none":
            if not self._legacy_csr:
                raise ValueError("return_lse / lse: the plan's lse_mode is 'none'; plan with "
                                 "lse_mode='base2' or 'basee'")
            return "e" if base_on_e else "2"  # the legacy flat CSR plan decides at run time
        if mode == "base2" and base_on_e:
            raise ValueError("return_lse_base_on_e=True: the plan's lse_mode is 'base2'; plan "
                             "with lse_mode='basee' for a natural-log LSE")
        return "e" if mode == "basee" else "2"


__all__ = ["BatchMLAPagedAttentionWrapper", "MLAPlanMetadata"]
