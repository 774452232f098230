import os

import pytest
import torch

# vLLM picks its platform once, when vllm.platforms is first imported -- which SGLang's modules
# may do (they import vllm when it is installed) while pytest collects test_backend_sglang.py,
# before test_backend_vllm.py runs. Without a GPU that platform must be vLLM's CPU one.
if not torch.cuda.is_available():
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import mla  # noqa: E402


def _devices():
    devs = ["cpu"]
    if torch.cuda.is_available() and mla.has_cuda_ops():
        devs.append("cuda")
    return devs


DEVICES = _devices()


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


def pytest_report_header(config):
    return f"mla devices under test: {DEVICES}"
