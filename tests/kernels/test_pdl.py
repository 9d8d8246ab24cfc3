"""kernels/pdl.py: where programmatic dependent launch is used, and that the device is asked once."""

import pytest
import torch

from sglang_sm120.kernels import pdl


@pytest.fixture
def fake_gpus(monkeypatch):
    """Two fake CUDA devices (cc 8.0 at index 0, 12.0 at index 1, current device 1), interpreter off; returns the
    list of device indices whose capability was queried."""
    asked = []

    def capability(index=None):
        asked.append(index)
        return (8, 0) if index == 0 else (12, 0)

    monkeypatch.setattr(pdl, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    pdl.clear_cache()
    yield asked
    pdl.clear_cache()


def test_pdl_only_from_compute_capability_9(fake_gpus):
    assert pdl.pdl_supported(torch.device("cuda", 0)) is False  # cc 8.0: no griddepcontrol
    assert pdl.pdl_supported(torch.device("cuda", 1)) is True  # cc 12.0 (sm_120)
    assert pdl.pdl_supported(torch.device("cuda")) is True  # no index: the current device (1)


@pytest.mark.parametrize("calls", [1, 5])
def test_capability_asked_once_per_device(fake_gpus, calls):
    for _ in range(calls):
        pdl.pdl_supported(torch.device("cuda", 0))
        pdl.pdl_supported(torch.device("cuda", 1))
        pdl.pdl_supported(torch.device("cuda"))
    assert sorted(fake_gpus) == [0, 1]


def test_clear_cache_asks_again(fake_gpus):
    pdl.pdl_supported(torch.device("cuda", 1))
    pdl.clear_cache()
    pdl.pdl_supported(torch.device("cuda", 1))
    assert fake_gpus == [1, 1]


def test_no_pdl_on_cpu_or_under_the_interpreter(monkeypatch):
    assert pdl.pdl_supported(torch.device("cpu")) is False
    monkeypatch.setattr(pdl, "interpreter_enabled", lambda: True)
    assert pdl.pdl_supported(torch.device("cuda", 0)) is False  # no capability query: the interpreter has no GPU
