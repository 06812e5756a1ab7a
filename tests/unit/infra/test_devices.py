import pytest
import torch

from specbuild.infra.devices import cpu_bf16_supported, resolve_device, wants_cuda


def test_auto_is_cuda_exactly_when_torch_sees_a_gpu():
    has = torch.cuda.is_available()
    assert resolve_device("auto") == ("cuda" if has else "cpu")
    assert wants_cuda("auto") is has
    assert resolve_device("cpu") == "cpu" and not wants_cuda("cpu")
    assert wants_cuda("cuda") and wants_cuda("cuda:1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for CUDA where there is none")
def test_cuda_without_a_gpu_is_an_error_not_a_fallback():
    with pytest.raises(RuntimeError, match="torch sees no CUDA GPU"):
        resolve_device("cuda")


def test_cpu_bf16_is_native_only_with_onednn_and_a_bf16_unit(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    assert cpu_bf16_supported()
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert not cpu_bf16_supported()
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert not cpu_bf16_supported()
