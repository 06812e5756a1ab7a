"""Write a random-weight Llama HF folder with SmolLM2's tokenizer, for tests that need a
target they may rewrite or shape (SmolLM2's own 9 heads do not split over 2 GPUs)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def write_random_llama(
    folder: Path, tokenizer_dir: Path, *, dtype: torch.dtype = torch.float32, **config: int
) -> Path:
    """`folder` as save_pretrained writes it (seed 0), plus the tokenizer and chat template
    files of `tokenizer_dir`; `config` sets LlamaConfig's fields (SmolLM2's vocabulary)."""
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=49152, **config)).to(dtype).save_pretrained(folder)
    for f in [*tokenizer_dir.glob("tokenizer*"), *tokenizer_dir.glob("*template*")]:
        shutil.copy(f, folder / f.name)
    return folder
