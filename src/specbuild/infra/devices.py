"""Which torch device a stage runs on: the one reading of `device: auto | cpu | cuda[:N]`."""

from __future__ import annotations

__all__ = ["cpu_bf16_supported", "resolve_device", "wants_cuda"]


def wants_cuda(device: str) -> bool:
    """Whether `device` means a CUDA GPU here: asked for by name, or `auto` with one visible."""
    import torch  # here: the Snakefile imports the modules that import this one

    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def resolve_device(device: str) -> str:
    """`auto` means CUDA when present; asking for CUDA without one is an error, not a fallback."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} asked for, but torch sees no CUDA GPU")
    return device


def cpu_bf16_supported() -> bool:
    """True where oneDNN runs bf16 matmuls natively on this CPU (AVX512-BF16 or AMX): ~1.8x a
    float32 training step on the CPU default's machine; elsewhere bf16 would be emulated."""
    import torch

    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return torch.backends.mkldnn.is_available() and any(
        getattr(cpu, name, lambda: False)() for name in checks
    )
