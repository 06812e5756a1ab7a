"""The dtype names a config may give (`target.save_dtype`, the models' `dtype`, `export.dtype`)
as torch dtypes: one map for every stage that loads, casts or sizes weights."""

from __future__ import annotations

import torch

__all__ = ["DTYPES", "HEADER_DTYPES", "torch_dtype"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# each as a safetensors header names it (what an exported folder's check compares)
HEADER_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(DTYPES)}") from None
