# One decode shape, 12 calls, for ncu (scripts/gpu-ncu.sh); run from the anchors folder that
# ../shared/anchors/assemble.sh lays out:
#   cd .anchors && python3 ../bench/anchors/one_shape.py flashmla|fa3 [b s_q h s_k page]
import sys, os, torch

# build_flashmla / build_fa3: in the folder assemble.sh laid out, the working directory.
sys.path.insert(0, os.getcwd())
impl = sys.argv[1]
b, s_q, h, s_k, P = (
    int(x) for x in (sys.argv[2:7] if len(sys.argv) > 6 else (128, 1, 128, 8192, 64))
)
dev = "cuda"
scale = 0.135234
g = torch.Generator().manual_seed(1)
lens = torch.full((b,), s_k, dtype=torch.int32)
maxp = (s_k + P - 1) // P
npages = b * maxp + 4
bt = torch.randperm(npages, generator=g)[: b * maxp].view(b, maxp).to(torch.int32).to(dev)
sl = lens.to(dev)
buf = torch.randn(npages, P, 1, 576, device=dev, dtype=torch.bfloat16) / 4
q = torch.randn(b, s_q, h, 576, device=dev, dtype=torch.bfloat16) / 4
if impl == "flashmla":
    import build_flashmla

    fm = build_flashmla.mod
    out = fm.dense_decode_fwd(q, buf, 512, sl, bt, scale, s_q > 1, None, None)
    meta, nsp = out[2], out[3]
    f = lambda: fm.dense_decode_fwd(q, buf, 512, sl, bt, scale, s_q > 1, meta, nsp)
else:
    import build_fa3

    fa3 = build_fa3.fa3
    kc, vc = buf[..., 512:], buf[..., :512]
    meta = fa3.get_scheduler_metadata(
        b, s_q, s_k, h, 1, 64, sl, torch.bfloat16, headdim_v=512, page_size=P, causal=True
    )
    f = lambda: fa3.flash_attn_with_kvcache(
        q[..., 512:],
        kc,
        vc,
        cache_seqlens=sl,
        page_table=bt,
        qv=q[..., :512],
        softmax_scale=scale,
        causal=True,
        scheduler_metadata=meta,
        return_softmax_lse=True,
    )
for _ in range(12):
    f()
torch.cuda.synchronize()
print("done", impl, b, s_q, h, s_k, P)
