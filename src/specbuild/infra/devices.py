"""Which torch device a stage runs on: the one reading of `device: auto | cpu | cuda[:N]`."""

from __future__ import annotations

__all__ = ["resolve_device", "wants_cuda"]


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
