import pytest
import torch

import mla


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
