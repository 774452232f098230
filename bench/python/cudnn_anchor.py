"""Same-run anchors for `mla bench`'s MHA rows: cuDNN's fused attention through PyTorch SDPA,
the way PERF.md's cuDNN numbers were measured, on the shapes `mla bench --ops prefill,extend`
times (issue 11 compares with cuDNN "in the same run"; lent H200s differ by up to 12 %).

Rows (JSON lines, appended to --out, the same fields as mla bench's rows where they exist):
- op "prefill_mha", backend "cudnn_sdpa": causal b1 4096, b4 2048, b1 16384 (--quick: the
  first), and the non-causal prefix chunk of 4096 queries on 16384 keys. 128 heads, head dims
  192 (q, k) and 128 (v), DeepSeek-V3's softmax scale; TFLOP/s count half the square when causal.
- op "extend", backend "torch_cudnn": 4096 new tokens on a 32768-token prefix, one layer, the
  PyTorch composition PERF.md timed: kv_b_proj up-projection of prefix and new latent rows (one
  cuBLAS GEMM), k = [k_nope | k_pe broadcast], causal attention of the new tokens, non-causal
  against the prefix, both with their LSE, and the LSE merge. "us" is the whole layer,
  "attention_us" the two attention calls alone.
cuDNN's LSE comes from aten's `_scaled_dot_product_cudnn_attention` (the op SDPA dispatches to);
where that private op fails, the public SDPA is timed without LSE and the row says "lse": false.

Timing as mla bench (benchlib.time_us): CUDA events around every run, 3 warm-up runs, the median
(and minimum) of --iters; inputs random normal / 4, never zeros. Rows carry benchlib.run_fields
(date, commit from $MLA_COMMIT, gpu, torch, python) and are written by benchlib.write_rows. On the cpu (--device cpu, --smoke) it runs tiny
shapes with the math backend: a check of this script, not a measurement.
"""
import argparse
import json
import pathlib
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import benchlib  # noqa: E402

HEADS = 128
D_QK, D_V, D_ROPE, D_LATENT = 192, 128, 64, 512
SM_SCALE = 0.135234  # DeepSeek-V3 (SYSTEM.md 1)


def _time(fn, iters, device):
    """Median and minimum microseconds of fn() over iters runs after 3 warm-up runs."""
    return benchlib.time_us(fn, iters, warmup=3,
                            cuda_device=device if device.type == "cuda" else None)


def _rand(*shape, device, gen):
    return (torch.randn(*shape, generator=gen, device=device) * 0.25).to(torch.bfloat16)


class Attention:
    """cuDNN attention of q [B, H, Sq, 192] against k [B, H, Sk, 192], v [B, H, Sk, 128]
    (causal: Sq == Sk), returning (o, lse) with lse the natural log [B, H, Sq] (None without the
    private op). On the cpu: plain float32 math with its LSE, to check this script."""

    def __init__(self, device):
        self.device = device
        self.lse = True
        self.note = ""
        self.names = ("cudnn_sdpa", "torch_cudnn") if device.type == "cuda" else \
            ("torch_cpu_math", "torch_cpu")

    def __call__(self, q, k, v, causal):
        if self.device.type == "cpu":
            s = (q.float() @ k.float().transpose(-1, -2)) * SM_SCALE
            if causal:
                s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
            lse = torch.logsumexp(s, dim=-1)
            return (torch.softmax(s, dim=-1) @ v.float()).to(torch.bfloat16), lse
        if self.lse:
            try:
                out = torch.ops.aten._scaled_dot_product_cudnn_attention(
                    q, k, v, None, True, 0.0, causal, False, scale=SM_SCALE)
                return out[0], out[1].reshape(q.shape[0], q.shape[1], q.shape[2])
            except (RuntimeError, TypeError, AttributeError) as e:  # fall back once, say why
                self.lse = False
                self.note = f"no lse: aten._scaled_dot_product_cudnn_attention failed: {e}"
                print(f"cudnn_anchor: {self.note}", file=sys.stderr)
        if self.device.type == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                      scale=SM_SCALE), None
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=SM_SCALE), None


def _common(device, args):
    row = benchlib.run_fields(device)
    row.update({"iters": args.iters, "anchor": True})
    if device.type == "cuda":
        row["cudnn"] = torch.backends.cudnn.version()
    return row


def bench_prefill(attn, device, gen, b, s_q, s_k, causal, args):
    q = _rand(b, s_q, HEADS, D_QK, device=device, gen=gen).transpose(1, 2)
    k = _rand(b, s_k, HEADS, D_QK, device=device, gen=gen).transpose(1, 2)
    v = _rand(b, s_k, HEADS, D_V, device=device, gen=gen).transpose(1, 2)
    us, us_min = _time(lambda: attn(q, k, v, causal), args.iters, device)
    pairs = b * s_q * s_k / (2 if causal else 1)
    flops = 2.0 * pairs * HEADS * (D_QK + D_V)
    return {"op": "prefill_mha", "backend": attn.names[0], "b": b, "s_q": s_q, "h_q": HEADS,
            "s_k": s_k, "page_size": 0, "varlen": False, "causal": causal, "us": us,
            "us_min": us_min, "tflops": flops / (us * 1e-6) / 1e12, "gbps": 0.0,
            "lse": attn.lse}


def merge(o_a, lse_a, o_b, lse_b):
    """SYSTEM.md 1's merge of two states (o [B, H, S, D], lse [B, H, S] natural log)."""
    m = torch.maximum(lse_a, lse_b)
    wa, wb = torch.exp(lse_a - m).unsqueeze(-1), torch.exp(lse_b - m).unsqueeze(-1)
    return ((wa * o_a.float() + wb * o_b.float()) / (wa + wb)).to(torch.bfloat16)


def up_project(c_kv, k_pe, w_kv_b):
    """k [1, H, N, 192] = [c_kv W_UK^T | k_pe broadcast], v [1, H, N, 128] = c_kv W_UV^T (one
    GEMM for both; w_kv_b [H * 256, 512], per head W_UK rows then W_UV rows)."""
    n = c_kv.shape[0]
    kv = (c_kv @ w_kv_b.t()).view(n, HEADS, D_QK - D_ROPE + D_V)
    k = torch.cat([kv[..., :D_QK - D_ROPE], k_pe[:, None, :].expand(n, HEADS, D_ROPE)], dim=-1)
    v = kv[..., D_QK - D_ROPE:]
    return k.unsqueeze(0).transpose(1, 2), v.unsqueeze(0).transpose(1, 2)


def extend_layer(attn, q, c_kv, k_pe, w_kv_b, prefix):
    """One layer's attention for the new tokens q [1, H, new, 192] over a prefix of `prefix`
    latent rows and their own (c_kv [prefix + new, 512], k_pe [prefix + new, 64]): causal among
    the new tokens, non-causal against the prefix, merged by their LSEs."""
    k, v = up_project(c_kv, k_pe, w_kv_b)
    o_new, lse_new = attn(q, k[:, :, prefix:], v[:, :, prefix:], True)
    o_pre, lse_pre = attn(q, k[:, :, :prefix], v[:, :, :prefix], False)
    if lse_new is None:  # no LSE: the attention is timed, the merge is not possible
        return o_new
    return merge(o_new, lse_new, o_pre, lse_pre)


def bench_extend(attn, device, gen, prefix, new, args):
    total = prefix + new
    c_kv = _rand(total, D_LATENT, device=device, gen=gen)
    k_pe = _rand(total, D_ROPE, device=device, gen=gen)
    w_kv_b = (torch.randn(HEADS * (D_QK - D_ROPE + D_V), D_LATENT, generator=gen, device=device)
              * 0.02).to(torch.bfloat16)
    q = _rand(1, new, HEADS, D_QK, device=device, gen=gen).transpose(1, 2)
    us, us_min = _time(lambda: extend_layer(attn, q, c_kv, k_pe, w_kv_b, prefix), args.iters,
                       device)
    # The two attention calls alone, on the k / v of one up-projection.
    k, v = up_project(c_kv, k_pe, w_kv_b)
    att_us, _ = _time(lambda: (attn(q, k[:, :, prefix:], v[:, :, prefix:], True),
                               attn(q, k[:, :, :prefix], v[:, :, :prefix], False)),
                      args.iters, device)
    pairs = new * new / 2 + new * prefix
    flops = 2.0 * pairs * HEADS * (D_QK + D_V)
    return {"op": "extend", "backend": attn.names[1], "b": 1, "s_q": new, "h_q": HEADS,
            "s_k": total, "page_size": 0, "varlen": False, "us": us, "us_min": us_min,
            "attention_us": att_us, "attention_tflops": flops / (att_us * 1e-6) / 1e12,
            "tflops": flops / (us * 1e-6) / 1e12, "gbps": 0.0, "lse": attn.lse}


def compare(path):
    """Lines 'mla / cuDNN' for the rows of one run's JSON lines file: each prefill_mha shape both
    timed (mla's backend "cuda" against "cudnn_sdpa") and the extend (each mla backend against
    the composition's whole layer and its attention calls alone). Speed ratios: > 1 is faster."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    lines = []
    key = lambda r: (r["b"], r["s_q"], r["s_k"], r.get("causal"))  # noqa: E731
    ours = {key(r): r for r in rows if r.get("op") == "prefill_mha" and r.get("backend") == "cuda"}
    for r in rows:
        if r.get("op") != "prefill_mha" or r.get("backend") != "cudnn_sdpa" or key(r) not in ours:
            continue
        m = ours[key(r)]
        lines.append(f"b{r['b']} s_q {r['s_q']} s_k {r['s_k']} "
                     f"{'causal' if r['causal'] else 'non-causal'}: mla {m['tflops']:.0f} / "
                     f"cuDNN {r['tflops']:.0f} TFLOP/s = {m['tflops'] / r['tflops']:.2f}")
    torch_ext = [r for r in rows if r.get("op") == "extend" and r.get("backend") == "torch_cudnn"]
    for r in torch_ext:
        for m in rows:
            if m.get("op") == "extend" and not m.get("anchor") and m["s_k"] == r["s_k"]:
                lines.append(f"extend {m['backend']}: {m['us'] / 1e3:.2f} ms / composition "
                             f"{r['us'] / 1e3:.2f} ms = {r['us'] / m['us']:.2f} (its attention "
                             f"calls alone {r['attention_us'] / 1e3:.2f} ms = "
                             f"{r['attention_us'] / m['us']:.2f})")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ops", default="prefill,extend")
    ap.add_argument("--quick", action="store_true", help="the first prefill shape, no extend")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (a check of the script)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default=None, help="JSON lines appended here (default: stdout)")
    ap.add_argument("--compare", default=None, metavar="FILE",
                    help="print mla / cuDNN lines for the rows in FILE, run nothing")
    args = ap.parse_args(argv)
    if args.compare:
        for line in compare(args.compare):
            print(line)
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("cudnn_anchor: no cuda device", file=sys.stderr)
        return 2
    ops = set(args.ops.split(","))
    gen = torch.Generator(device=device).manual_seed(20261205)
    attn = Attention(device)
    if args.smoke:
        prefill = [(1, 64, 64, True), (2, 32, 32, True), (1, 32, 96, False)]
        extend = [(96, 32)]
    else:
        prefill = [(1, 4096, 4096, True), (4, 2048, 2048, True), (1, 16384, 16384, True),
                   (1, 4096, 16384, False)]
        extend = [(32768, 4096)]
        if args.quick:
            prefill, extend = prefill[:1], []
    rows = []
    failures = 0
    jobs = ([lambda p=p: bench_prefill(attn, device, gen, *p, args) for p in prefill]
            if "prefill" in ops else [])
    jobs += [lambda e=e: bench_extend(attn, device, gen, *e, args) for e in extend] \
        if "extend" in ops else []
    for job in jobs:
        try:
            row = job()
        except RuntimeError as e:  # e.g. a shape cuDNN rejects: say so, time the rest
            print(f"cudnn_anchor: {e}", file=sys.stderr)
            failures += 1
            continue
        row.update(_common(device, args))
        if attn.note:
            row["note"] = attn.note
        rows.append(row)
        print(f"{row['op']:12s} {row['backend']:12s} b={row['b']} s_q={row['s_q']} "
              f"s_k={row['s_k']} {row['us']:.1f} us {row['tflops']:.1f} TFLOP/s", file=sys.stderr)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    benchlib.write_rows(rows, args.out)
    return 1 if failures or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
