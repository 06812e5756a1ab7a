"""The `hf` generation backend: transformers `generate` over the materialized target folder."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import torch

from specbuild.backends.base import Generation, GenerationRequest, SamplingParams
from specbuild.eagle.target_info import load_tokenizer
from specbuild.infra.devices import cpu_bf16_supported, resolve_device
from specbuild.target import load_target_model

__all__ = ["HFBackend", "compute_dtype", "split_reasoning"]

log = logging.getLogger("specbuild")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def compute_dtype(dtype: str, device: str) -> str:
    """The dtype the target runs in: bfloat16 on a CPU only where it is native (AVX512-BF16 or
    AMX: 1.45x float32 decoding there, BENCHMARKS.md); float32, with a warning, on other CPUs,
    where emulated bf16 would be slower than float32 (as `train.precision` does)."""
    if dtype == "bfloat16" and device == "cpu" and not cpu_bf16_supported():
        log.warning("bfloat16 asked for, but this CPU has no native bf16: decoding in float32")
        return "float32"
    return dtype


def split_reasoning(text: str) -> tuple[str, str | None]:
    """Split `<think>...</think>` reasoning (reasoning models) from the visible answer."""
    head, sep, tail = text.partition(THINK_CLOSE)
    if not sep:
        return text, None
    return tail.lstrip("\n"), head.replace(THINK_OPEN, "", 1).strip("\n") or None


class HFBackend:
    """Batched generation with left padding; greedy when temperature is 0.

    Sampling draws from torch's global generator, seeded per batch by the batch's first
    request seed (when given): the same requests in the same batches give the same text.
    """

    name = "hf"

    def __init__(
        self,
        target_dir: str | os.PathLike,
        *,
        dtype: str = "float32",
        device: str = "auto",
        batch_size: int = 16,
    ) -> None:
        self.model_path = str(target_dir)
        self.model = self.model_path
        self.device = resolve_device(device)
        self.batch_size = batch_size
        self.tok = load_tokenizer(target_dir)
        self.tok.padding_side = "left"
        self.dtype = compute_dtype(dtype, self.device)
        self.lm = load_target_model(target_dir, dtype=self.dtype, device=self.device)
        eos = self.lm.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.stop_ids = {i for i in [*eos, self.tok.eos_token_id] if i is not None}
        self.pad_id = (
            self.tok.pad_token_id if self.tok.pad_token_id is not None else min(self.stop_ids)
        )

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        if isinstance(request.prompt, list):
            return list(request.prompt)
        if request.prompt is not None:  # already rendered: special tokens are in the text
            return self.tok(request.prompt, add_special_tokens=False)["input_ids"]
        return self.tok.apply_chat_template(
            request.messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )

    @torch.no_grad()
    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingParams
    ) -> list[Generation]:
        prompts = [self._prompt_ids(r) for r in requests]
        # Similar lengths in one batch waste less compute on padding; results keep input order.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: dict[int, Generation] = {}
        for b in range(0, len(order), self.batch_size):
            idx = order[b : b + self.batch_size]
            seed = requests[idx[0]].seed
            if sampling.temperature > 0 and seed is not None:
                torch.manual_seed(seed)  # one generator per batch: seeds are per batch here
            width = max(len(prompts[i]) for i in idx)
            ids = torch.full((len(idx), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, i in enumerate(idx):
                ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
                mask[row, width - len(prompts[i]) :] = 1
            out = self.lm.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                max_new_tokens=sampling.max_new_tokens,
                do_sample=sampling.temperature > 0,
                temperature=sampling.temperature if sampling.temperature > 0 else None,
                top_p=sampling.top_p if sampling.temperature > 0 else None,
                top_k=None,
                pad_token_id=self.pad_id,
                eos_token_id=sorted(self.stop_ids),
            )
            for row, i in enumerate(idx):
                new = out[row, width:].tolist()
                stop = next((k for k, t in enumerate(new) if t in self.stop_ids), None)
                finish = "stop" if stop is not None else "length"
                new = new[:stop] if stop is not None else new
                content, reasoning = split_reasoning(self.tok.decode(new, skip_special_tokens=True))
                results[i] = Generation(
                    id=requests[i].id,
                    content=content,
                    reasoning=reasoning,
                    finish_reason=finish,
                    prompt_tokens=len(prompts[i]),
                    # the end-of-turn token is generated too: it counts, as in OpenAI usage
                    completion_tokens=len(new) + (finish == "stop"),
                )
        return [results[i] for i in range(len(requests))]

    def close(self) -> None:
        self.lm = None
