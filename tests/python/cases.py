"""Random paged-cache cases: page layouts (shuffled, interleaved, reversed), token-level
req_to_token tables and block tables of the same pages."""
from __future__ import annotations

import math

import torch

LAYOUTS = ("shuffled", "interleaved", "reversed")


def fp8_cache(values: torch.Tensor) -> torch.Tensor:
    return values.clamp(-448, 448).to(torch.float8_e4m3fn)


class PagedCase:
    def __init__(self, *, page_size, kv_lens, q_lens, heads, layout, cache_dtype=torch.bfloat16,
                 seed=0, device="cpu", spare_rows=2):
        g = torch.Generator().manual_seed(seed)
        P = page_size
        self.page_size = P
        self.kv_lens = list(kv_lens)
        self.q_lens = list(q_lens)
        self.heads = heads
        bs = len(kv_lens)
        pages_needed = [max(1, math.ceil(k / P)) for k in kv_lens]
        num_pages = sum(pages_needed) + 3  # + dummy page 0 and spares
        ids = list(range(1, num_pages))
        if layout == "shuffled":
            ids = [ids[i] for i in torch.randperm(len(ids), generator=g).tolist()]
        elif layout == "reversed":
            ids = ids[::-1]
        pages = [[] for _ in range(bs)]
        if layout == "interleaved":
            it = iter(ids)
            remaining = list(pages_needed)
            while any(remaining):
                for b in range(bs):
                    if remaining[b]:
                        pages[b].append(next(it))
                        remaining[b] -= 1
        else:
            it = iter(ids)
            for b in range(bs):
                pages[b] = [next(it) for _ in range(pages_needed[b])]
        self.pages = pages
        self.num_slots = num_pages * P
        max_blocks = max(pages_needed)
        # Pool rows: request b lives in row rows[b] (rows shuffled, row 0 unused).
        n_rows = bs + spare_rows
        self.rows = (torch.randperm(n_rows - 1, generator=g)[:bs] + 1).to(torch.int32)
        max_ctx = max_blocks * P
        self.req_to_token = torch.zeros(n_rows, max_ctx, dtype=torch.int32)
        self.block_table = torch.zeros(bs, max_blocks, dtype=torch.int32)
        for b in range(bs):
            for j, p in enumerate(pages[b]):
                self.block_table[b, j] = p
                self.req_to_token[self.rows[b], j * P:(j + 1) * P] = torch.arange(
                    p * P, (p + 1) * P, dtype=torch.int32)
        vals = torch.randn(self.num_slots, 576, generator=g) * 0.5
        if cache_dtype == torch.float8_e4m3fn:
            self.k_scale = 0.02
            self.cache = fp8_cache(vals / self.k_scale)
        else:
            self.k_scale = 1.0
            self.cache = vals.to(torch.bfloat16)
        T = sum(q_lens)
        self.q = (torch.randn(T, heads, 576, generator=g) * 0.5).to(torch.bfloat16)
        self.sm_scale = 1.0 / math.sqrt(192)
        self.device = torch.device(device)

    def to(self, device):
        device = torch.device(device)
        for name in ("req_to_token", "block_table", "cache", "q"):
            setattr(self, name, getattr(self, name).to(device))
        self.device = device
        return self

    def slots(self, b):
        kv = self.kv_lens[b]
        i = torch.arange(kv)
        pages = torch.tensor(self.pages[b], dtype=torch.long)
        return pages[i // self.page_size] * self.page_size + i % self.page_size


class LatentPool:
    """An engine KV pool with only get_key_buffer (new rows go through mla's kv_write op)."""

    def __init__(self, buffer):
        self.buffer = buffer  # [slots, 1, 576]

    def get_key_buffer(self, layer_id):
        return self.buffer
