"""bench/python/cudnn_anchor.py, the same-run cuDNN anchor of `mla bench`'s MHA rows: its
composition of the chunked extend is the single-pass attention, its rows carry what the bench
rows carry, and on cuda its cuDNN call (the private aten op, for the LSE) agrees with plain math."""
import importlib.util
import json
import math
import pathlib

import pytest
import torch

_PATH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "python" / "cudnn_anchor.py"
_spec = importlib.util.spec_from_file_location("cudnn_anchor", _PATH)
anchor = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(anchor)


def _single_pass(q, k, v, prefix):
    """float64 attention of q [1, H, new, 192] over all prefix + new keys, causal bottom-right."""
    new, total = q.shape[2], k.shape[2]
    s = (q.double() @ k.double().transpose(-1, -2)) * anchor.SM_SCALE
    j = torch.arange(new)[:, None]
    key = torch.arange(total)[None, :]
    s = s.masked_fill(key > prefix + j, float("-inf"))
    return torch.softmax(s, dim=-1) @ v.double()


def test_extend_composition_equals_one_pass():
    gen = torch.Generator().manual_seed(3)
    prefix, new = 40, 24
    c_kv = anchor._rand(prefix + new, anchor.D_LATENT, device=torch.device("cpu"), gen=gen)
    k_pe = anchor._rand(prefix + new, anchor.D_ROPE, device=torch.device("cpu"), gen=gen)
    w = (torch.randn(anchor.HEADS * 256, anchor.D_LATENT, generator=gen) * 0.05).to(torch.bfloat16)
    q = anchor._rand(1, new, anchor.HEADS, anchor.D_QK, device=torch.device("cpu"),
                     gen=gen).transpose(1, 2)
    o = anchor.extend_layer(anchor.Attention(torch.device("cpu")), q, c_kv, k_pe, w, prefix)
    k, v = anchor.up_project(c_kv, k_pe, w)
    ref = _single_pass(q, k, v, prefix)
    rel = (o.double() - ref).norm() / ref.norm()
    assert rel < 1e-2, rel


def test_smoke_rows(tmp_path):
    out = tmp_path / "rows.jsonl"
    assert anchor.main(["--device", "cpu", "--smoke", "--iters", "1", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["op"] for r in rows] == ["prefill_mha"] * 3 + ["extend"]
    for r in rows:
        assert r["anchor"] is True and r["h_q"] == 128
        assert r["us"] > 0 and math.isfinite(r["tflops"]) and r["tflops"] > 0
    assert [r["causal"] for r in rows[:3]] == [True, True, False]
    assert rows[3]["attention_us"] > 0 and rows[3]["lse"] is True


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a cuda device (cuDNN)")
def test_cudnn_attention_matches_math():
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(5)
    cuda_attn, cpu_attn = anchor.Attention(dev), anchor.Attention(torch.device("cpu"))
    for s_q, s_k, causal in [(256, 256, True), (128, 384, False)]:
        q = anchor._rand(2, s_q, anchor.HEADS, anchor.D_QK, device=dev, gen=gen).transpose(1, 2)
        k = anchor._rand(2, s_k, anchor.HEADS, anchor.D_QK, device=dev, gen=gen).transpose(1, 2)
        v = anchor._rand(2, s_k, anchor.HEADS, anchor.D_V, device=dev, gen=gen).transpose(1, 2)
        o, lse = cuda_attn(q, k, v, causal)
        ref_o, ref_lse = cpu_attn(q.cpu(), k.cpu(), v.cpu(), causal)
        assert cuda_attn.lse, cuda_attn.note
        rel = (o.cpu().float() - ref_o.float()).norm() / ref_o.float().norm()
        assert rel < 1e-2, rel
        assert (lse.cpu() - ref_lse).abs().max() < 1e-2


def test_compare_pairs_rows_of_one_shape(tmp_path):
    path = tmp_path / "run.jsonl"
    rows = [
        {"op": "prefill_mha", "backend": "cuda", "b": 1, "s_q": 4096, "s_k": 4096, "causal": True,
         "tflops": 600.0},
        {"op": "prefill_mha", "backend": "cudnn_sdpa", "b": 1, "s_q": 4096, "s_k": 4096,
         "causal": True, "tflops": 500.0, "anchor": True},
        {"op": "prefill_mha", "backend": "cudnn_sdpa", "b": 4, "s_q": 2048, "s_k": 2048,
         "causal": True, "tflops": 500.0, "anchor": True},  # no mla row: no line
        {"op": "extend", "backend": "chunked_mla", "b": 1, "s_q": 4096, "s_k": 36864,
         "us": 20000.0},
        {"op": "extend", "backend": "torch_cudnn", "b": 1, "s_q": 4096, "s_k": 36864,
         "us": 25000.0, "attention_us": 19000.0, "anchor": True},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = anchor.compare(str(path))
    assert lines == [
        "b1 s_q 4096 s_k 4096 causal: mla 600 / cuDNN 500 TFLOP/s = 1.20",
        "extend chunked_mla: 20.00 ms / composition 25.00 ms = 1.25 (its attention calls alone "
        "19.00 ms = 0.95)",
    ]
