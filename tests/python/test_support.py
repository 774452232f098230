"""mla.support (issue 33, parts 3 and 4): the MLA constants and page sizes come from the C++
library, a backend refuses at construction what its first decode would refuse (page size, head
count, cache dtype, the pool's layout), and a GPU mla has no kernels for is reported unsupported
by the C++ rule, tested with a faked compute capability on the cpu."""
import pytest
import torch

import mla
from mla import Backend, support
from mla.ops import AbsorbedPlan

from cases import LatentPool

SERVED = r"is not served \(mla serves page sizes 1, 16, 32, 64, 128 tokens\)"


def test_constants_and_page_sizes_are_the_libraries():
    assert (support.KV_LORA_RANK, support.QK_ROPE_DIM, support.QK_NOPE_DIM,
            support.V_HEAD_DIM) == (512, 64, 128, 128)
    assert support.LATENT_DIM == 576 and support.QK_HEAD_DIM == 192 and support.MAX_HEADS == 128
    assert mla.PAGE_SIZES == support.PAGE_SIZES == (1, 16, 32, 64, 128)
    assert support.CACHE_DTYPES == (torch.bfloat16, torch.float8_e4m3fn)
    assert mla.ops.LATENT_DIM == 576 and mla.ops.KV_LORA_RANK == 512
    assert tuple(torch.ops.mla.page_sizes()) == support.PAGE_SIZES


# ---- part 3: checks at construction ----
@pytest.mark.parametrize("family", ["paged_mla", "chunked_mla", "ondemand_mla"])
@pytest.mark.parametrize("page_size", [8, 256, 0, 1024])
def test_backend_refuses_an_unserved_page_size_when_built(family, page_size):
    with pytest.raises(ValueError, match=rf"{family}: page_size = {page_size} {SERVED}"):
        Backend(family, num_heads=16, page_size=page_size, device="cpu", sm_scale=0.1)


@pytest.mark.parametrize("family", ["paged_mla", "ondemand_mla"])
def test_backend_builds_at_every_served_page_size(family):
    for p in mla.PAGE_SIZES:
        pool = LatentPool(torch.zeros(4 * p, 1, 576, dtype=torch.bfloat16))
        assert Backend(family, num_heads=16, page_size=p, device="cpu", sm_scale=0.1,
                       token_to_kv_pool=pool).page_size == p


@pytest.mark.parametrize("heads", [0, 129])
def test_backend_refuses_an_unserved_head_count_when_built(heads):
    with pytest.raises(ValueError, match=rf"ondemand_mla: model\.num_heads = {heads} is not "
                                         r"supported \(1 to 128\)"):
        Backend("ondemand_mla", num_heads=heads, page_size=16, device="cpu", sm_scale=0.1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_backend_refuses_an_unserved_cache_dtype_when_built(dtype):
    with pytest.raises(ValueError, match=rf"kv_cache_dtype = {dtype} is not served \(mla stores "
                                         r"the latent cache in torch\.bfloat16 or "
                                         r"torch\.float8_e4m3fn\)"):
        Backend("ondemand_mla", num_heads=16, page_size=16, device="cpu", sm_scale=0.1,
                kv_cache_dtype=dtype)


@pytest.mark.parametrize("buf,match", [
    (torch.zeros(64, 1, 576, dtype=torch.float16),
     r"get_key_buffer\(0\): dtype torch\.float16, but paged_mla was built for kv_cache_dtype "
     r"torch\.bfloat16"),
    (torch.zeros(64, 1, 512, dtype=torch.bfloat16),
     r"get_key_buffer\(0\): shape \(64, 1, 512\), expected \[slots, 1, 576\]"),
    (torch.zeros(64, 576, dtype=torch.bfloat16),
     r"get_key_buffer\(0\): shape \(64, 576\), expected \[slots, 1, 576\]")])
def test_backend_refuses_a_pool_of_the_wrong_dtype_or_layout_when_built(buf, match):
    with pytest.raises(ValueError, match=match):
        Backend("paged_mla", num_heads=16, page_size=16, device="cpu", sm_scale=0.1,
                token_to_kv_pool=LatentPool(buf))


def test_backend_refuses_a_pool_of_another_page_size_when_built():
    pool = LatentPool(torch.zeros(64, 1, 576, dtype=torch.bfloat16))
    pool.page_size = 32
    with pytest.raises(ValueError, match=r"token_to_kv_pool\.page_size = 32, but chunked_mla is "
                                         r"built for page_size 16"):
        Backend("chunked_mla", num_heads=16, page_size=16, device="cpu", sm_scale=0.1,
                token_to_kv_pool=pool)


@pytest.mark.parametrize("page_size", [8, 256])
def test_absorbed_plan_refuses_an_unserved_page_size_when_built(page_size):
    # The plan holder of the FlashMLA / FlashInfer forms and of vLLM's builder.
    with pytest.raises(ValueError, match=rf"page_size = {page_size} {SERVED}"):
        AbsorbedPlan("cpu", 16, page_size, max_batch=1, max_q_tokens=1)


def test_check_backend_config_is_the_cpp_rule():
    support.check_backend_config("x", "cpu", 16, 64, torch.float8_e4m3fn)  # served: no error
    with pytest.raises(ValueError, match=rf"mla\.check_backend_config: InvalidArgument: x: "
                                         rf"page_size = 24 {SERVED}"):
        support.check_backend_config("x", "cpu", 16, 24, torch.bfloat16)


# ---- part 4: the GPU is checked ----
@pytest.mark.parametrize("major,minor", [(8, 0), (8, 9), (10, 0), (12, 0), (9, 1)])
def test_capability_rule_refuses_gpus_without_mla_kernels(major, minor):
    reason = support.capability_refusal(major, minor, "cuda:3")
    assert reason is not None
    assert "has device code for compute capability 9.0 only" in reason  # what it needs
    assert f"cuda:3 has compute capability {major}.{minor}" in reason  # what it found


def test_capability_rule_accepts_hopper():
    assert support.capability_refusal(9, 0) is None


def _fake(monkeypatch, major, minor):
    monkeypatch.setattr(support, "compute_capability", lambda device: (major, minor))


def test_unsupported_reason_with_a_faked_gpu(monkeypatch):
    assert mla.unsupported_reason("cpu") is None
    _fake(monkeypatch, 8, 0)  # an A100
    reason = mla.unsupported_reason("cuda:1")
    assert "compute capability 9.0 only" in reason and "cuda:1 has compute capability 8.0" in reason
    _fake(monkeypatch, 9, 0)  # an H100: supported when this build has the CUDA ops
    reason = mla.unsupported_reason("cuda:0")
    if mla.has_cuda_ops():
        assert reason is None
    else:
        assert "compute capability" not in reason and "no CUDA ops" in reason


@pytest.mark.parametrize("family", ["paged_mla", "ondemand_mla"])
def test_backend_refuses_a_faked_gpu_without_mla_kernels_when_built(monkeypatch, family):
    _fake(monkeypatch, 10, 0)  # a B200
    with pytest.raises(mla.UnsupportedDevice, match=rf"{family}: op set 'cuda' has device code "
                                                    r"for compute capability 9\.0 only, but "
                                                    r"cuda:0 has compute capability 10\.0"):
        Backend(family, num_heads=16, page_size=16, device="cuda:0", sm_scale=0.1)


@pytest.mark.skipif(not torch.cuda.is_available() or not mla.has_cuda_ops(),
                    reason="needs a GPU and the CUDA ops (the C++ seam under the torch ops)")
def test_the_cuda_ops_refuse_a_faked_gpu_before_any_launch():
    torch.ops.mla.set_fake_compute_capability(8, 0)
    try:
        assert tuple(torch.ops.mla.compute_capability(torch.device("cuda"))) == (8, 0)
        with pytest.raises(ValueError, match=r"compute capability 9\.0 only.*has compute "
                                             r"capability 8\.0"):
            AbsorbedPlan("cuda", 16, 64, max_batch=1, max_q_tokens=1)
        o = torch.zeros(2, 16, 512, dtype=torch.bfloat16, device="cuda")
        with pytest.raises(ValueError, match=r"compute capability 8\.0"):
            mla.ops.kv_write(o[:, 0], o[:, 0, :64], torch.zeros(2, dtype=torch.int32,
                                                                 device="cuda"),
                             torch.zeros(4, 576, dtype=torch.bfloat16, device="cuda"))
    finally:
        torch.ops.mla.set_fake_compute_capability(-1, 0)
    AbsorbedPlan("cuda", 16, 64, max_batch=1, max_q_tokens=1)  # the real H100/H200: served
