"""Independent float64 oracle of the MLA ops, in plain PyTorch: gather by table, dense softmax,
natural-log LSE. It never calls into mla (neither the C++ reference nor the ops)."""
from __future__ import annotations

import math

import torch


def dequant(cache: torch.Tensor, k_scale: float = 1.0) -> torch.Tensor:
    c = cache.to(torch.float64)
    if cache.dtype == torch.float8_e4m3fn:
        c = c * k_scale
    return c


def slots_from_token_table(req_to_token, row, kv_len, page_size):
    """Slot of token i of pool row `row`: SGLang's token-level table read at the page start."""
    i = torch.arange(kv_len)
    if page_size == 1:
        return req_to_token[row, i].long()
    return req_to_token[row, (i // page_size) * page_size].long() + i % page_size


def slots_from_block_table(block_table, b, kv_len, page_size):
    i = torch.arange(kv_len)
    return block_table[b, i // page_size].long() * page_size + i % page_size


def attend(q, k, v, sm_scale, causal):
    """q [tq, H, d], k [tk, d] or [tk, H, d], v likewise -> o [tq, H, dv], lse [tq, H]."""
    tq, H, _ = q.shape
    tk = k.shape[0]
    if k.dim() == 2:
        logits = torch.einsum("qhd,kd->qhk", q, k) * sm_scale
    else:
        logits = torch.einsum("qhd,khd->qhk", q, k) * sm_scale
    if causal:
        j = torch.arange(tq)[:, None]
        key = torch.arange(tk)[None, :]
        visible = key <= (tk - tq + j)
        logits = logits.masked_fill(~visible[:, None, :], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - lse[..., None])
    p = torch.nan_to_num(p, nan=0.0)
    if v.dim() == 2:
        o = torch.einsum("qhk,kd->qhd", p, v)
    else:
        o = torch.einsum("qhk,khd->qhd", p, v)
    o = torch.where(torch.isfinite(lse)[..., None], o, torch.zeros_like(o))
    return o, lse


def absorbed(q, cache, slots_per_request, q_lens, sm_scale, causal=True, k_scale=1.0):
    """q [T, H, 576]; slots_per_request: list of LongTensors (keys of each request)."""
    q64 = q.to(torch.float64).cpu()
    c64 = dequant(cache.cpu(), k_scale)
    T, H, _ = q.shape
    o = torch.zeros(T, H, 512, dtype=torch.float64)
    lse = torch.full((T, H), float("-inf"), dtype=torch.float64)
    start = 0
    for slots, ql in zip(slots_per_request, q_lens):
        kv = c64[slots]
        ob, lb = attend(q64[start:start + ql], kv, kv[:, :512], sm_scale, causal)
        o[start:start + ql] = ob
        lse[start:start + ql] = lb
        start += ql
    return o, lse


def mha(q, k, v, qo_indptr, kv_indptr, sm_scale, causal):
    q64, k64, v64 = (x.to(torch.float64).cpu() for x in (q, k, v))
    T, H, _ = q.shape
    o = torch.zeros(T, H, v.shape[-1], dtype=torch.float64)
    lse = torch.full((T, H), float("-inf"), dtype=torch.float64)
    for b in range(len(qo_indptr) - 1):
        q0, q1 = qo_indptr[b], qo_indptr[b + 1]
        k0, k1 = kv_indptr[b], kv_indptr[b + 1]
        if q1 == q0:
            continue
        ob, lb = attend(q64[q0:q1], k64[k0:k1], v64[k0:k1], sm_scale, causal)
        o[q0:q1] = ob
        lse[q0:q1] = lb
    return o, lse


def merge(oa, la, ob, lb):
    oa, la, ob, lb = (x.to(torch.float64).cpu() for x in (oa, la, ob, lb))
    m = torch.maximum(la, lb)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    wa = torch.exp(la - m_safe)
    wb = torch.exp(lb - m_safe)
    s = wa + wb
    o = (wa[..., None] * oa + wb[..., None] * ob) / torch.where(s > 0, s, torch.ones_like(s))[..., None]
    lse = m_safe + torch.log(s)
    o = torch.where((s > 0)[..., None], o, torch.zeros_like(o))
    return o, lse


def rel_err(a, ref):
    a = a.to(torch.float64).cpu()
    ref = ref.to(torch.float64).cpu()
    return float(torch.linalg.vector_norm(a - ref) / max(float(torch.linalg.vector_norm(ref)), 1e-30))


def lse_close(a, ref, atol=2e-2):
    a = a.to(torch.float64).cpu()
    ref = ref.to(torch.float64).cpu()
    both_inf = torch.isinf(a) & torch.isinf(ref)
    diff = torch.where(both_inf, torch.zeros_like(a), (a - ref).abs())
    return float(diff.max()) if diff.numel() else 0.0
