"""The `sglang` feature backend: hidden states from SGLang's own model runner, in this process
(specbuild.engines.runner: why the serving engine, how layers are captured, tensor parallel).

This adapter only turns the runner's prefills into a batch's `Features`: it refuses input
SGLang would turn into garbage or a CUDA assert, splits a batch into the runs the runner's
pools hold, and checks that every token came back.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from specbuild.engines.model import Features
from specbuild.engines.runner import PrefillRunner, SGLangRunner, plan_chunks

__all__ = ["SGLangFeatureBackend"]


class SGLangFeatureBackend:
    """FeatureBackend over a PrefillRunner (SGLang's model runner, or a fake in CPU tests)."""

    name = "sglang"

    def __init__(self, runner: PrefillRunner) -> None:
        self.runner = runner
        self.device = runner.device
        self.dtype = runner.dtype
        self.eagle_layer_ids = list(runner.eagle_layer_ids)

    @classmethod
    def from_folder(
        cls,
        folder: str | os.PathLike,
        *,
        layer_ids: list[int],
        dtype: str,
        device: str,
        **options: Any,
    ) -> SGLangFeatureBackend:
        """The hidden stage's constructor; `dtype`/`device` belong to hf (SGLang computes in
        the folder's dtype or `server_args.dtype`, on the job's GPUs). `options` are
        SGLangRunner's keyword arguments."""
        return cls(SGLangRunner(folder, layer_ids=layer_ids, **options))

    def check_batch(self, batch: list[list[int]]) -> None:
        """Refuse what SGLang would turn into garbage or a CUDA assert, naming the sample."""
        vocab = self.runner.vocab_size
        for j, sample in enumerate(batch):
            if not sample:
                raise ValueError(f"sample {j} of the batch is empty: nothing to extract")
            low, high = min(sample), max(sample)
            if low < 0 or high >= vocab:
                raise ValueError(
                    f"sample {j} of the batch has token id {low if low < 0 else high} outside "
                    f"the target's vocabulary [0, {vocab}): tokenized with another tokenizer?"
                )

    def extract(self, batch: list[list[int]]) -> Features:
        self.check_batch(batch)
        lengths = [len(s) for s in batch]
        chunks = plan_chunks(
            lengths, max_tokens=self.runner.max_tokens, max_requests=self.runner.max_requests
        )
        lasts, auxes = [], []
        for chunk in chunks:
            part = [batch[j] for j in chunk]
            last, aux = self.runner.prefill(part, capture=True)
            rows = sum(lengths[j] for j in chunk)
            if aux is None or last.shape[0] != rows or aux.shape[0] != rows:
                raise RuntimeError(
                    f"SGLang returned {last.shape[0]} final and "
                    f"{None if aux is None else aux.shape[0]} aux rows for {rows} tokens "
                    f"({len(part)} samples): a prefix cache or chunked prefill dropped rows?"
                )
            lasts.append(last)
            auxes.append(aux)
        if len(chunks) == 1:
            return Features(auxes[0], lasts[0], tuple(lengths))
        return Features(torch.cat(auxes), torch.cat(lasts), tuple(lengths))

    def close(self) -> None:
        self.runner.close()
