"""mla.Backend: the attention-backend interface of SGLang (method names and call forms) over the
mla ops, reading the engine's own pools in place.

Design (docs/design-decisions.md): the C++ backends own their latent pool (cache and
req_to_token), while an engine owns its pools as torch tensors. This class plans with the same
host planners (through the torch ops) and runs the same kernels on the engine's tensors: the
token-level req_to_token table and one [slots, 1, 576] latent buffer per layer.

Families, as in the C++ library:
  paged_mla     absorbed attention for decode, verify and draft-extend; for extends, ragged MHA
                when no request has a cached prefix, absorbed when the prefixes are short
                (sum below mha_prefix_threshold), chunked-prefix MHA otherwise. Workspaces are
                allocated at construction for the capacity.
  chunked_mla   like paged_mla, but extends with a prefix always take chunked-prefix MHA (the
                engine gathers and up-projects the prefix chunks; init_mha_chunk_metadata plans
                one non-causal MHA pass per chunk).
  ondemand_mla  like paged_mla, with every buffer allocated on first use and grown on demand.
All LSEs are natural log.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import torch

from . import ops as _ops

FAMILIES = ("paged_mla", "chunked_mla", "ondemand_mla")


def _mode_name(forward_mode) -> str:
    """SGLang ForwardMode (or our strings) -> one of decode/extend/mixed/target_verify/
    draft_extend/idle."""
    if isinstance(forward_mode, str):
        return forward_mode
    for name, pred in (("idle", "is_idle"), ("target_verify", "is_target_verify"),
                       ("draft_extend", "is_draft_extend"), ("mixed", "is_mixed"),
                       ("decode", "is_decode"), ("extend", "is_extend")):
        f = getattr(forward_mode, pred, None)
        if f is not None and f():
            return name
    raise ValueError(f"forward_mode {forward_mode!r}: not one of decode, extend, mixed, "
                     "target_verify, draft_extend, idle")


def _cpu_i32(x) -> torch.Tensor:
    return _ops._host_i32(x, "lengths")


class Backend:
    def __init__(self, name: str, *, num_heads: int, page_size: int, device, sm_scale: float,
                 kv_cache_dtype=torch.bfloat16, k_scale: float = 1.0, max_batch: int = 256,
                 max_q_len: int = 8, max_extend_tokens: int = 8192,
                 mha_prefix_threshold: int = 8192, disable_chunked_prefix_cache: bool = False):
        if name not in FAMILIES:
            raise ValueError(f"name = {name!r}: one of {', '.join(FAMILIES)}")
        self.name = name
        self.num_heads = int(num_heads)
        self.page_size = int(page_size)
        self.device = _ops._device(device)
        self.sm_scale = float(sm_scale)
        self.kv_cache_dtype = kv_cache_dtype
        self.k_scale = float(k_scale)
        self.max_batch = int(max_batch)
        self.max_q_len = int(max_q_len)
        self.max_extend_tokens = int(max_extend_tokens)
        self.mha_prefix_threshold = int(mha_prefix_threshold)
        self.disable_chunked_prefix_cache = bool(disable_chunked_prefix_cache)
        self.forward_method = "absorbed"
        self._absorbed: Dict[tuple, _ops.AbsorbedPlan] = {}
        self._mha: Optional[_ops.MhaPlan] = None
        self._chunk_plans: List[_ops.MhaPlan] = []
        self._graph_plan: Optional[_ops.AbsorbedPlan] = None
        self._plan: Optional[_ops.AbsorbedPlan] = None
        self._tokens = 0
        self.stats = {"init_forward_metadata_calls": 0, "absorbed_plans": 0, "mha_plans": 0,
                      "mha_chunk_plans": 0, "graph_replays": 0}
        if name != "ondemand_mla":
            self._absorbed_plan(self.max_batch, self.max_batch * self.max_q_len, self.max_q_len)

    # ---- planning helpers ----
    def _absorbed_plan(self, bs: int, tokens: int, q_len: int) -> _ops.AbsorbedPlan:
        """A plan holder whose capacity covers the batch (grown on demand, never shrunk)."""
        for p in self._absorbed.values():
            if p.max_batch >= bs and p.max_q_tokens >= tokens and p.max_q_len >= q_len:
                return p
        cap = (max(bs, 1), max(tokens, 1), max(q_len, 1))
        if self.name != "ondemand_mla":
            cap = (max(cap[0], self.max_batch), max(cap[1], self.max_batch * self.max_q_len),
                   max(cap[2], self.max_q_len))
        p = _ops.AbsorbedPlan(self.device, self.num_heads, self.page_size, max_batch=cap[0],
                              max_q_tokens=cap[1], max_q_len=cap[2])
        self._absorbed[cap] = p
        return p

    def _lengths(self, forward_batch, mode: str):
        seq = _cpu_i32(getattr(forward_batch, "seq_lens_cpu", None)
                       if getattr(forward_batch, "seq_lens_cpu", None) is not None
                       else forward_batch.seq_lens)
        bs = seq.numel()
        if mode in ("decode", "idle"):
            return seq, torch.ones(bs, dtype=torch.int32), seq, torch.zeros(bs, dtype=torch.int32)
        if mode == "target_verify":
            n = int(forward_batch.spec_info.draft_token_num)
            q = torch.full((bs,), n, dtype=torch.int32)
            return seq, q, seq + n, seq.clone()
        ext = _cpu_i32(forward_batch.extend_seq_lens_cpu)
        prefix = _cpu_i32(forward_batch.extend_prefix_lens_cpu)
        return seq, ext, seq, prefix

    def _choose(self, mode: str, prefix: torch.Tensor) -> str:
        if mode not in ("extend", "mixed"):
            return "absorbed"
        has_prefix = bool((prefix > 0).any()) if prefix.numel() else False
        if not has_prefix:
            return "mha"
        if self.disable_chunked_prefix_cache:
            return "absorbed"
        if self.name == "chunked_mla" or int(prefix.sum()) >= self.mha_prefix_threshold:
            return "mha_chunked"
        return "absorbed"

    # ---- SGLang AttentionBackend interface ----
    def init_forward_metadata(self, forward_batch) -> None:
        self.stats["init_forward_metadata_calls"] += 1
        mode = _mode_name(forward_batch.forward_mode)
        seq, q_lens, kv_lens, prefix = self._lengths(forward_batch, mode)
        self._tokens = int(q_lens.sum())
        self.forward_method = self._choose(mode, prefix)
        if mode == "idle" or self._tokens == 0:
            return
        if self.forward_method == "absorbed":
            p = self._absorbed_plan(q_lens.numel(), self._tokens, int(q_lens.max()))
            p.plan(_cpu_i32(forward_batch.req_pool_indices), q_lens, kv_lens)
            self._plan = p
            self.stats["absorbed_plans"] += 1
            return
        qo = torch.zeros(q_lens.numel() + 1, dtype=torch.int32)
        torch.cumsum(q_lens, 0, out=qo[1:])
        p = self._mha
        if (p is None or p.max_batch < q_lens.numel() or p.max_q_tokens < self._tokens):
            p = _ops.MhaPlan(self.device, self.num_heads, causal=True,
                             max_batch=max(q_lens.numel(), self.max_batch),
                             max_q_tokens=max(self._tokens, self.max_extend_tokens),
                             max_kv_tokens=max(self._tokens, self.max_extend_tokens))
            self._mha = p
        p.plan(qo, qo)
        self._qo_indptr = qo
        self.stats["mha_plans"] += 1

    def init_mha_chunk_metadata(self, forward_batch, disable_flashinfer_ragged: bool = False):
        """One non-causal MHA plan per prefix chunk, from the engine's chunk lengths
        (forward_batch.prefix_chunk_cu_seq_lens: per chunk, cumulative keys per request)."""
        chunks = getattr(forward_batch, "prefix_chunk_cu_seq_lens", None) or []
        self._chunk_plans = []
        for cu in chunks:
            kv = _cpu_i32(cu)
            p = _ops.MhaPlan(self.device, self.num_heads, causal=False,
                             max_batch=max(kv.numel() - 1, 1), max_q_tokens=max(self._tokens, 1),
                             max_kv_tokens=max(int(kv[-1]), 1))
            p.plan(self._qo_indptr, kv)
            self._chunk_plans.append(p)
            self.stats["mha_chunk_plans"] += 1

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        q_len = max(1, -(-int(max_num_tokens) // int(max_bs)))
        self._graph_plan = _ops.AbsorbedPlan(self.device, self.num_heads, self.page_size,
                                             max_batch=int(max_bs),
                                             max_q_tokens=int(max_num_tokens), max_q_len=q_len)

    def _graph_plan_for(self, bs, req_pool_indices, seq_lens_cpu, forward_mode, spec_info):
        if self._graph_plan is None:
            raise RuntimeError(f"{self.name}: init_cuda_graph_state was not called")
        mode = _mode_name(forward_mode)
        seq = _cpu_i32(seq_lens_cpu)[:bs]
        n = int(spec_info.draft_token_num) if mode == "target_verify" else 1
        q_lens = torch.full((bs,), n, dtype=torch.int32)
        kv = seq + n if mode == "target_verify" else seq
        rows = _cpu_i32(req_pool_indices)[:bs]
        self._graph_plan.plan(rows, q_lens, kv)
        self._plan = self._graph_plan
        self._tokens = bs * n
        self.forward_method = "absorbed"

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens,
                                                 encoder_lens, forward_mode, spec_info):
        self._graph_plan_for(bs, req_pool_indices, seq_lens, forward_mode, spec_info)

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens,
                                                seq_lens_sum, encoder_lens, forward_mode,
                                                spec_info, seq_lens_cpu=None):
        self._graph_plan_for(bs, req_pool_indices,
                             seq_lens_cpu if seq_lens_cpu is not None else seq_lens,
                             forward_mode, spec_info)
        self.stats["graph_replays"] += 1

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    # ---- per layer ----
    def _latent_cache(self, layer, forward_batch) -> torch.Tensor:
        buf = forward_batch.token_to_kv_pool.get_key_buffer(layer.layer_id)
        return buf.view(buf.shape[0], -1)

    def _save(self, layer, forward_batch, c_kv, k_pe):
        cache = self._latent_cache(layer, forward_batch)
        _ops.kv_write(c_kv.reshape(c_kv.shape[0], -1), k_pe.reshape(k_pe.shape[0], -1),
                      forward_batch.out_cache_loc.to(torch.int32), cache, self.k_scale)

    def _absorbed_forward(self, q, k, layer, forward_batch, save_kv_cache, q_rope, k_rope):
        T, H = self._tokens, self.num_heads
        if save_kv_cache and k is not None:
            self._save(layer, forward_batch, k, k_rope)
        if q_rope is not None:
            q = torch.cat([q.reshape(T, H, 512), q_rope.reshape(T, H, 64)], dim=-1)
        else:
            q = q.reshape(T, H, 576)
        o = torch.empty(T, H, 512, dtype=q.dtype, device=q.device)
        lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
        self._plan.run(q, self._latent_cache(layer, forward_batch),
                       forward_batch.req_to_token_pool.req_to_token, o, lse,
                       getattr(layer, "scaling", self.sm_scale), self.k_scale)
        return o.view(T, H * 512)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None,
                       k_rope=None, **kwargs):
        return self._absorbed_forward(q, k, layer, forward_batch, save_kv_cache, q_rope, k_rope)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None,
                       k_rope=None, **kwargs):
        if self.forward_method == "absorbed":
            return self._absorbed_forward(q, k, layer, forward_batch, save_kv_cache, q_rope,
                                          k_rope)
        # MHA forms: q [T, H, 192], k [N, H, 192], v [N, H, 128] (already up-projected).
        T, H = self._tokens, self.num_heads
        q = q.reshape(T, H, 192)
        k = k.reshape(k.shape[0], H, 192)
        v = v.reshape(v.shape[0], H, 128)
        o = torch.empty(T, H, 128, dtype=q.dtype, device=q.device)
        lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
        scale = getattr(layer, "scaling", self.sm_scale)
        if getattr(forward_batch, "attn_attend_prefix_cache", False):
            plan = self._chunk_plans[forward_batch.prefix_chunk_idx]
        else:
            plan = self._mha
        plan.run(q, k, v, o, lse, scale)
        if getattr(forward_batch, "mha_return_lse", False):
            return o, lse
        return o.view(T, H * 128)

    # ---- resources ----
    def memory_ledger(self) -> List[Dict[str, Any]]:
        """Every buffer this backend holds: name, owner, device, bytes, zeroed."""
        rows = []

        def add(name, t):
            if t is not None and t.numel():
                rows.append({"name": f"{self.name}.{name}", "owner": self.name,
                             "device": str(t.device), "bytes": t.numel() * t.element_size(),
                             "zeroed": False})

        for i, p in enumerate(self._absorbed.values()):
            add(f"absorbed_plan[{i}]", p.plan_tensor)
            add(f"absorbed_workspace[{i}]", p.workspace)
            for j, nbytes in enumerate(p._staging.host_bytes()):
                if nbytes:
                    rows.append({"name": f"{self.name}.absorbed_staging[{i}][{j}]",
                                 "owner": self.name, "device": "cpu (pinned)", "bytes": nbytes,
                                 "zeroed": False})
        if self._graph_plan is not None:
            add("graph.absorbed_plan", self._graph_plan.plan_tensor)
            add("graph.workspace", self._graph_plan.workspace)
        if self._mha is not None:
            add("mha_plan", self._mha._staging.plan)
            add("mha_workspace", self._mha.workspace)
        for i, p in enumerate(self._chunk_plans):
            add(f"mha_chunk_plan[{i}]", p._staging.plan)
            add(f"mha_chunk_workspace[{i}]", p.workspace)
        return rows
