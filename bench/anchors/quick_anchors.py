# The anchors (FlashMLA, FA3) on mla bench --quick's decode shapes (not varlen) and seven more
# 128-head ones: FlashMLA p64, FA3 p64 and p1, ROUNDS rounds; rows to stdout with gpu / date.
# Run from the anchors folder of ../shared/anchors/assemble.sh:
#   cd .anchors && python3 ../bench/anchors/quick_anchors.py [rounds]
import json, sys, os, torch, datetime

# build_flashmla / build_fa3: in the folder assemble.sh laid out, the working directory.
sys.path.insert(0, os.getcwd())
import build_flashmla, build_fa3

fm, fa3 = build_flashmla.mod, build_fa3.fa3
dev = "cuda"
scale = 0.135234
gpu = torch.cuda.get_device_name(0)
date = datetime.date.today().isoformat()


def timeit(fn, n=20, sets=3):
    for i in range(3):
        fn(i % sets)
    ev = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(n)
    ]
    for i, (a, b) in enumerate(ev):
        a.record()
        fn(i % sets)
        b.record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(b) for a, b in ev)
    return 1e3 * t[n // 2], 1e3 * t[0]


shapes = [
    (128, 1, 128, 8192),
    (128, 1, 16, 8192),
    (128, 1, 32, 8192),
    (128, 1, 8, 8192),
    (128, 2, 64, 4096),
]
extra = [
    (128, 1, 128, 4096),
    (128, 1, 128, 16384),
    (128, 2, 128, 8192),
    (64, 1, 128, 4096),
    (32, 1, 128, 32768),
    (256, 1, 128, 2048),
    (128, 1, 64, 8192),
]
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
for rnd in range(rounds):
    for b, s_q, h, s_k in shapes + extra:
        for P in (64, 1):
            g = torch.Generator().manual_seed(b * 7 + s_k + h + s_q)
            lens = torch.full((b,), s_k, dtype=torch.int32)
            maxp = (s_k + P - 1) // P
            npages = b * maxp + 4
            bt = (
                torch.randperm(npages, generator=g)[: b * maxp]
                .view(b, maxp)
                .to(torch.int32)
                .to(dev)
            )
            sl = lens.to(dev)
            buf = torch.randn(npages, P, 1, 576, device=dev, dtype=torch.bfloat16) / 4
            qs = [
                torch.randn(b, s_q, h, 576, device=dev, dtype=torch.bfloat16) / 4 for _ in range(3)
            ]
            impls = []
            if P == 64:
                out = fm.dense_decode_fwd(qs[0], buf, 512, sl, bt, scale, s_q > 1, None, None)
                meta_fm, nsp = out[2], out[3]
                impls.append(
                    (
                        "flashmla",
                        lambda i: fm.dense_decode_fwd(
                            qs[i], buf, 512, sl, bt, scale, s_q > 1, meta_fm, nsp
                        ),
                    )
                )
            kc, vc = buf[..., 512:], buf[..., :512]
            meta = fa3.get_scheduler_metadata(
                b, s_q, s_k, h, 1, 64, sl, torch.bfloat16, headdim_v=512, page_size=P, causal=True
            )
            impls.append(
                (
                    "fa3",
                    lambda i: fa3.flash_attn_with_kvcache(
                        qs[i][..., 512:],
                        kc,
                        vc,
                        cache_seqlens=sl,
                        page_table=bt,
                        qv=qs[i][..., :512],
                        softmax_scale=scale,
                        causal=True,
                        scheduler_metadata=meta,
                        return_softmax_lse=True,
                    ),
                )
            )
            for name, f in impls:
                us, us_min = timeit(f)
                print(
                    json.dumps(
                        dict(
                            impl=name,
                            op="decode",
                            b=b,
                            s_q=s_q,
                            h_q=h,
                            s_k=s_k,
                            page_size=P,
                            varlen=False,
                            us=us,
                            us_min=us_min,
                            round=rnd + 1,
                            gpu=gpu,
                            date=date,
                        )
                    ),
                    flush=True,
                )
            del buf, kc, vc, qs
            torch.cuda.empty_cache()
