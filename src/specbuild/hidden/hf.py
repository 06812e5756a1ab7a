"""The `hf` feature backend: transformers forward passes over the materialized target folder.

Right padding with an attention mask: under causal attention a real token never sees the pads
after it, and positions start at 0 for every sample, so each sample's states equal its unbatched
forward pass (tested). Only the base model runs (no lm_head: the vocab projection is the
largest matmul of a small model and extraction does not need logits), and transformers is asked
for just the three aux hidden states, so a batch holds 3 extra [B, T, H] tensors, not L + 1.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor

from specbuild.eagle.layers import architecture_of, eagle_layer_ids
from specbuild.engines.model import Features
from specbuild.infra.devices import resolve_device
from specbuild.infra.io import read_json
from specbuild.target import load_target_model

__all__ = ["HFFeatureBackend"]


class HFFeatureBackend:
    """FeatureBackend over a transformers causal LM (any model whose base returns hidden_states)."""

    name = "hf"

    def __init__(
        self,
        model: torch.nn.Module,
        layer_ids: list[int],
        *,
        pad_id: int = 0,
        architecture: str | None = None,
    ) -> None:
        self.base = model.base_model  # the decoder stack without lm_head
        self.layer_ids = list(layer_ids)
        # what a served drafter's eagle_config needs for SGLang to capture these layers; the
        # class SGLang builds is the folder's (a wrapper's, not its text model's)
        arch = architecture or architecture_of(model.config.to_dict())
        self.eagle_layer_ids = eagle_layer_ids(
            arch, self.layer_ids, int(model.config.num_hidden_layers)
        )
        # HF hidden_states[0] is the embedding output, so layer-output id i is index i + 1
        self.indices = [i + 1 for i in self.layer_ids]
        self.pad_id = pad_id  # any valid id: padded positions are masked and never returned
        self.device = next(model.parameters()).device
        self.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")

    @classmethod
    def from_folder(
        cls, folder: str | os.PathLike, *, layer_ids: list[int], dtype: str, device: str
    ) -> HFFeatureBackend:
        model = load_target_model(folder, dtype=dtype, device=resolve_device(device))
        arch = architecture_of(read_json(Path(folder) / "config.json"))
        return cls(model, layer_ids, architecture=arch)

    @torch.no_grad()  # not inference_mode: callers may use the returned tensors with autograd
    def forward(self, batch: list[list[int]]) -> tuple[Tensor, Tensor, list[int]]:
        """(aux [B, T, 3H], last [B, T, H], lengths) for a right-padded batch."""
        lengths = [len(s) for s in batch]
        width = max(lengths)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for b, sample in enumerate(batch):
            ids[b, : lengths[b]] = torch.tensor(sample, dtype=torch.long)
            mask[b, : lengths[b]] = 1
        out = self.base(
            input_ids=ids.to(self.device),
            # no mask without padding: lets attention take its plain causal path
            attention_mask=mask.to(self.device) if min(lengths) < width else None,
            output_hidden_states=self.indices,
            use_cache=False,
        )
        aux = torch.cat([out.hidden_states[i] for i in self.indices], dim=-1)  # shape: [B, T, 3H]
        return aux, out.last_hidden_state, lengths  # last shape: [B, T, H]

    def extract(self, batch: list[list[int]]) -> Features:
        aux, last, lengths = self.forward(batch)
        if min(lengths) == aux.shape[1]:  # no padding: packing is a free reshape
            return Features(aux.flatten(0, 1), last.flatten(0, 1), tuple(lengths))
        keep = torch.zeros(aux.shape[:2], dtype=torch.bool)  # shape: [B, T]
        for b, n in enumerate(lengths):
            keep[b, :n] = True
        keep = keep.to(aux.device)
        return Features(aux[keep], last[keep], tuple(lengths))  # shapes: [sum(n), 3H], [sum(n), H]
