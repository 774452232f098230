"""One strategy (issue 33): mla.Backend plans every batch through the C++ engine planner
(torch.ops.mla.engine_plan over mla::EnginePlanner), so its per-mode lengths, forward method and
fallback are the C++ backends' own. Checked here against the C++ chooser the backends apply
(torch.ops.mla.forward_method) and against SYSTEM.md's rules written out, for many random batches
of every mode and every option the rule reads; the chunk planner against SGLang's chunk lengths
and SYSTEM.md's vectors; malformed lengths refused naming the field."""
import random
from types import SimpleNamespace

import pytest
import torch

from mla.backend import Backend

FAMILIES = ("paged_mla", "chunked_mla", "ondemand_mla")
MODES = ("decode", "target_verify", "extend", "mixed", "draft_extend")


def i32(v):
    return torch.tensor(v, dtype=torch.int32)


def random_batch(rng, mode):
    bs = rng.randint(1, 6)
    prefix = [0] * bs if rng.random() < 0.3 else [rng.randint(0, 50) for _ in range(bs)]
    ext = [rng.randint(1, 9) for _ in range(bs)]
    if mode in ("decode", "target_verify"):
        seq = [p + 1 for p in prefix]
    else:
        seq = [p + e for p, e in zip(prefix, ext)]
    n = rng.randint(1, 4)
    # SGLang keeps its host mirrors in int64: half the batches come that way.
    t = (lambda v: torch.tensor(v)) if rng.random() < 0.5 else i32
    fb = SimpleNamespace(forward_mode=mode, seq_lens_cpu=t(seq),
                         req_pool_indices_cpu=t(rng.sample(range(1, 64), bs)),
                         extend_prefix_lens_cpu=i32(prefix), extend_seq_lens_cpu=i32(ext),
                         spec_info=SimpleNamespace(draft_token_num=n))
    return fb, seq, prefix, ext, n


def expected_lengths(mode, seq, ext, n):
    """SYSTEM.md 3: decode q 1, kv seq; verify q n, kv seq + n; the extend modes q ext, kv seq."""
    if mode == "decode":
        return [1] * len(seq), list(seq)
    if mode == "target_verify":
        return [n] * len(seq), [s + n for s in seq]
    return list(ext), list(seq)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("disable", [False, True])
def test_python_plans_as_the_cpp_rule_for_random_batches(family, disable):
    rng = random.Random(1000 + FAMILIES.index(family) * 2 + disable)
    be = Backend(family, num_heads=16, page_size=16, device="cpu", sm_scale=0.1,
                 max_batch=4, mha_prefix_threshold=60, disable_chunked_prefix_cache=disable)
    seen = set()
    for _ in range(150):
        mode = rng.choice(MODES)
        fb, seq, prefix, ext, n = random_batch(rng, mode)
        be.init_forward_metadata(fb)
        q_want, kv_want = expected_lengths(mode, seq, ext, n)
        got = be.planned_lengths()
        assert got["q_lens"].tolist() == q_want and got["kv_lens"].tolist() == kv_want, mode
        plain = mode in ("extend", "mixed")
        has_prefix = plain and any(prefix)
        # The C++ backends' chooser (family_forward_method), with no one-shot form.
        cpp = torch.ops.mla.forward_method(family, mode, i32(prefix if plain else [0] * len(seq)),
                                           sum(seq), 60, 0, disable, False, False)
        want = "absorbed" if cpp == "absorbed" else ("mha_chunked" if has_prefix else "mha")
        assert be.forward_method == want, (family, mode, prefix, disable)
        # SYSTEM.md 5: the chunked families fall back for plain extends with a prefix when the
        # chunked prefix cache is off; nothing else falls back.
        assert be.fell_back == (family != "paged_mla" and plain and disable and has_prefix)
        if be.forward_method == "absorbed":
            assert be._plan.planned and be._plan.max_batch >= len(seq)
        seen.add((be.forward_method, be.fell_back))
    assert ("absorbed", False) in seen and any(m != "absorbed" for m, _ in seen)


def test_a_batch_past_the_capacity_grows_the_eager_holder_never_shrinks():
    be = Backend("paged_mla", num_heads=16, page_size=16, device="cpu", sm_scale=0.1,
                 max_batch=2, max_q_len=2)
    first = be._eager
    assert (first.max_batch, first.max_q_tokens, first.max_q_len) == (2, 4, 2)
    fb = SimpleNamespace(forward_mode="decode", seq_lens_cpu=i32([3, 4, 5]),
                         req_pool_indices_cpu=i32([1, 2, 3]))
    be.init_forward_metadata(fb)
    grown = be._eager
    assert grown is not first and be._plan is grown
    assert (grown.max_batch, grown.max_q_tokens, grown.max_q_len) == (3, 4, 2)
    fb.seq_lens_cpu, fb.req_pool_indices_cpu = i32([3]), i32([1])
    be.init_forward_metadata(fb)
    assert be._eager is grown  # a smaller batch keeps the holder
    ondemand = Backend("ondemand_mla", num_heads=16, page_size=16, device="cpu", sm_scale=0.1)
    assert ondemand._eager is None  # allocated on first use
    ondemand.init_forward_metadata(fb)
    assert (ondemand._eager.max_batch, ondemand._eager.max_q_tokens) == (1, 1)


def test_malformed_lengths_are_refused_naming_the_field():
    be = Backend("chunked_mla", num_heads=16, page_size=16, device="cpu", sm_scale=0.1)
    fb = SimpleNamespace(forward_mode="extend", seq_lens_cpu=i32([10, 4]),
                         req_pool_indices_cpu=i32([1, 2]), extend_prefix_lens_cpu=i32([6, 0]),
                         extend_seq_lens_cpu=i32([3, 4]))
    with pytest.raises(ValueError, match=r"extend_prefix_lens\[0\] = 6 \+ extend_seq_lens\[0\] "
                                         r"= 3 must equal seq_lens\[0\] = 10"):
        be.init_forward_metadata(fb)
    fb.extend_seq_lens_cpu = i32([3])
    with pytest.raises(ValueError, match="extend_seq_lens has 1 entries, seq_lens 2"):
        be.init_forward_metadata(fb)


def test_chunk_plan_is_the_specs_vectors():
    cp = torch.ops.mla.chunk_plan
    assert cp(i32([64, 64, 64]), 48).tolist() == [[16] * 3] * 4
    assert cp(i32([16, 32, 48, 64]), 64).tolist() == [[16, 16, 16, 16], [0, 16, 16, 16],
                                                       [0, 0, 16, 16], [0, 0, 0, 16]]
    assert cp(torch.tensor([1, 64]), 31).tolist() == [[1, 15], [0, 15], [0, 15], [0, 15],
                                                      [0, 4]]
    assert cp(i32([0, 0]), 8).shape == (0, 2)
    with pytest.raises(ValueError, match="capacity"):
        cp(i32([4, 4, 4]), 2)


def test_chunk_plan_agrees_with_sglangs_prefix_chunks_for_random_batches():
    """SGLang's ForwardBatch.get_prefix_chunk_seq_lens (what DeepSeek gathers the prefix by) and
    mla's chunk planner give the same chunks for SGLang's chunk length (capacity // bs) and
    count (ceil(max prefix / length)), for many random batches."""
    fbi = pytest.importorskip("sglang.srt.model_executor.forward_batch_info")
    rng = random.Random(7)
    for _ in range(200):
        bs = rng.randint(1, 8)
        prefix = [rng.randint(0, 300) for _ in range(bs)]
        if not any(prefix):
            continue
        capacity = rng.randint(bs, 1024)
        chunk_len = capacity // bs
        chunks = (max(prefix) + chunk_len - 1) // chunk_len
        _, lens = fbi.ForwardBatch.get_prefix_chunk_seq_lens(
            SimpleNamespace(batch_size=bs), torch.tensor(prefix), chunks, chunk_len)
        assert torch.ops.mla.chunk_plan(i32(prefix), capacity).tolist() == lens.tolist(), \
            (prefix, capacity)


def test_an_mha_batch_is_planned_into_the_mha_holder_the_planner_sizes():
    """The MHA holder is built when the first MHA batch comes, for max_batch requests and
    max_extend_tokens new tokens at least, grown when a batch needs more, kept otherwise; the
    ragged pass is planned into it by the same engine_plan call."""
    be = Backend("chunked_mla", num_heads=16, page_size=16, device="cpu", sm_scale=0.1,
                 max_batch=2, max_extend_tokens=16)
    assert be._mha is None

    def extend(ext, prefix):
        be.init_forward_metadata(SimpleNamespace(
            forward_mode="extend", seq_lens_cpu=i32([p + e for p, e in zip(prefix, ext)]),
            req_pool_indices_cpu=i32(list(range(1, len(ext) + 1))),
            extend_prefix_lens_cpu=i32(prefix), extend_seq_lens_cpu=i32(ext)))

    extend([5, 3], [0, 0])
    first = be._mha
    assert be.forward_method == "mha" and first.planned
    assert (first.max_batch, first.max_q_tokens, first.max_kv_tokens) == (2, 16, 16)
    extend([9, 9, 9], [4, 0, 0])
    grown = be._mha
    assert be.forward_method == "mha_chunked" and grown is not first
    assert (grown.max_batch, grown.max_q_tokens) == (3, 27)
    extend([1], [0])
    assert be._mha is grown and be.stats["mha_plans"] == 3


def test_prefix_chunks_must_cover_the_prefix_and_reuse_their_holders():
    """The engine's prefix chunks are checked to cover every request's cached prefix exactly,
    and each chunk's MHA pass is planned into a holder kept across batches (grown when a chunk
    needs more, never one per chunk per batch)."""
    be = Backend("chunked_mla", num_heads=16, page_size=16, device="cpu", sm_scale=0.1)

    def batch(prefix, ext, chunk_lens):
        fb = SimpleNamespace(forward_mode="extend",
                             seq_lens_cpu=i32([p + e for p, e in zip(prefix, ext)]),
                             req_pool_indices_cpu=i32(list(range(1, len(ext) + 1))),
                             extend_prefix_lens_cpu=i32(prefix), extend_seq_lens_cpu=i32(ext),
                             prefix_chunk_seq_lens_cpu=torch.tensor(chunk_lens))
        be.init_forward_metadata(fb)
        assert be.forward_method == "mha_chunked"
        be.init_mha_chunk_metadata(fb)

    batch([40, 12], [4, 2], torch.ops.mla.chunk_plan(i32([40, 12]), 32).tolist())
    first = list(be._chunk_plans)
    assert len(first) == 3 and all(p.planned for p in first)
    batch([30, 10], [4, 2], torch.ops.mla.chunk_plan(i32([30, 10]), 32).tolist())
    assert be._chunk_plans == first[:2] and be._chunk_plans[0] is first[0]  # reused
    assert be.stats["mha_chunk_plans"] == 5
    with pytest.raises(ValueError, match="prefix chunks cover 39 keys of request 0, whose "
                                         "cached prefix has 40"):
        batch([40, 12], [4, 2], [[16, 12], [16, 0], [7, 0]])
    with pytest.raises(ValueError, match="prefix chunks: 2 entries for 1 chunks of 2 requests"):
        batch([40, 12], [4, 2], [[40]])
