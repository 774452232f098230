"""Real SGLang 0.5.23 objects for the adapter tests: a model runner with a real
MLATokenToKVPool and ReqToTokenPool filled from a PagedCase, real ForwardBatch objects and
RadixAttention layers shaped as DeepSeek builds them (attn_mqa: 576 / 512 with one KV head;
attn_mha: 192 / 128 with H KV heads). The pools and the batch's device tensors live on `device`
(cpu by default, or cuda); the case itself and the batch's host mirrors stay on the cpu."""
from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import PretrainedConfig

from sglang.srt.configs.model_config import AttentionArch
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

from mla.integrations import sglang as plugin

DEEPSEEK = dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)


def model_config(heads, **over):
    # attention_arch, hf_config / hf_text_config, linear_attn_registry_result: what SGLang's
    # backend construction (build_attention_backends, attn_backend_wrapper) and draft factory
    # inspect (a DeepSeek config is none of the hybrid / wrapped model classes).
    hf = PretrainedConfig()
    return SimpleNamespace(num_attention_heads=heads, attention_arch=AttentionArch.MLA,
                           hf_config=hf, hf_text_config=hf, linear_attn_registry_result=None,
                           context_len=4096, **{**DEEPSEEK, **over})


def runner(case, *, heads, kv_cache_dtype=torch.bfloat16, pool_dtype=None, rope_dim=64,
           disable_chunked_prefix_cache=False, tp_size=1, draft_attention_backend=None,
           device="cpu", **cfg_over):
    P = case.page_size
    device = str(device)
    pool = MLATokenToKVPool(case.num_slots, P, pool_dtype or kv_cache_dtype, 512, rope_dim, 1,
                            device, False)
    if rope_dim == 64 and (pool_dtype or kv_cache_dtype) == case.cache.dtype:
        # The pool stores fp8 as uint8 (its store_dtype): the bytes, not a numeric conversion.
        buf = pool.kv_buffer[0]
        buf[:case.num_slots] = case.cache.view(-1, 1, 576).view(buf.dtype)
    rows, cols = case.req_to_token.shape
    rpool = ReqToTokenPool(rows, cols, device, False)
    rpool.req_to_token[:rows] = case.req_to_token
    return SimpleNamespace(
        model_config=model_config(heads * tp_size, **cfg_over), tp_size=tp_size, page_size=P,
        device=device, kv_cache_dtype=kv_cache_dtype, token_to_kv_pool=pool, use_mla_backend=True,
        is_draft_worker=draft_attention_backend is not None,
        draft_attention_backend=draft_attention_backend,
        req_to_token_pool=rpool,
        kv_index_translator=KVIndexTranslator(
            req_to_token=rpool.req_to_token, token_to_kv_pool_allocator=None,
            token_to_kv_pool=pool, page_size=P, device=device),
        server_args=SimpleNamespace(max_running_requests=8,
                                    disable_chunked_prefix_cache=disable_chunked_prefix_cache))


def backend(name, case, **kw):
    return plugin.BACKEND_CLASSES[name](runner(case, **kw))


def new_slots(case, q_lens):
    """Slots of each request's last q_len tokens (the batch's new tokens), request-major."""
    return torch.cat([case.slots(b)[-q:] for b, q in enumerate(q_lens)]).to(torch.int64)


def batch(case, mode, q_lens, *, prefix=None, spec_info=None, kv_lens=None, device="cpu"):
    """A real ForwardBatch. decode / target_verify / draft_extend / extend: the kv lengths are
    case.kv_lens, or kv_lens (for target_verify seq_lens excludes the draft tokens, as
    SGLang's). Its tensors are on `device`, the host mirrors (*_cpu) on the cpu, as SGLang's."""
    kv = torch.tensor(case.kv_lens if kv_lens is None else kv_lens, dtype=torch.int32)
    q = torch.tensor(q_lens, dtype=torch.int32)
    fm = getattr(ForwardMode, mode.upper()) if mode != "draft_extend" else ForwardMode.DRAFT_EXTEND_V2
    seq = kv - q if mode == "target_verify" else kv
    rows = case.rows.to(torch.int64)
    T = int(q.sum())
    extra = {}
    if mode in ("extend", "draft_extend", "mixed"):
        pre = torch.tensor(prefix if prefix is not None else (kv - q).tolist(), dtype=torch.int32)
        extra = dict(extend_seq_lens=q.to(device), extend_prefix_lens=pre.to(device),
                     extend_seq_lens_cpu=q.tolist(), extend_prefix_lens_cpu=pre.tolist(),
                     extend_num_tokens=T)
    return ForwardBatch(forward_mode=fm, batch_size=len(q_lens),
                        input_ids=torch.zeros(T, dtype=torch.int64, device=device),
                        req_pool_indices=rows.to(device), seq_lens=seq.to(device),
                        out_cache_loc=new_slots(case, q_lens).to(device),
                        seq_lens_sum=int(seq.sum()), seq_lens_cpu=seq, req_pool_indices_cpu=rows,
                        spec_info=spec_info, **extra)


def attn_mqa(heads, scaling, layer_id=0):
    return RadixAttention(heads, 576, scaling, num_kv_heads=1, layer_id=layer_id, v_head_dim=512)


def attn_mha(heads, scaling, layer_id=0):
    return RadixAttention(heads, 192, scaling, num_kv_heads=heads, layer_id=layer_id,
                          v_head_dim=128)
