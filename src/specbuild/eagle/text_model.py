"""Where a target folder keeps its text model: the config and the tensor names of the LM.

A plain causal LM (Llama, DeepSeek-V3) keeps its config at the top of config.json and its
tensors as `model.*` and `lm_head.weight`. A multimodal wrapper keeps the LM's config in
`text_config` and its tensors under a prefix of its own: Kimi-K2.5 (`KimiK25ForConditional
Generation`) writes `language_model.model.embed_tokens.weight` and `language_model.lm_head.weight`;
transformers' own wrappers (Llava and kin) write `model.language_model.embed_tokens.weight` and a
top-level `lm_head.weight`. Every stage that reads the target's shapes or tensors asks this
module, with the plain names (`model.embed_tokens.weight`, `lm_head.weight`, `model.layers.3.*`):
the failure guarded is a stage that reads the wrapper's config (no hidden size) or finds no
embedding under the plain name, each in its own way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import safe_open

from specbuild.infra.io import read_json

__all__ = ["TextModel", "find_text_model", "text_config", "weight_map"]

EMBED = "embed_tokens.weight"
HEAD = "lm_head.weight"
DECODER = "model."  # the plain prefix of the decoder stack (embedding, layers, final norm)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's part of a config.json: `text_config` of a wrapper, else the whole."""
    return config.get("text_config") or config


def weight_map(folder: str | os.PathLike) -> dict[str, str]:
    """{tensor name: safetensors file name} of a folder: its index, else each file's own keys."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return dict(read_json(index)["weight_map"])
    out: dict[str, str] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            out |= dict.fromkeys(f.keys(), path.name)
    return out


@dataclass(frozen=True)
class TextModel:
    """The text model of a target folder: its config and where its tensors are named."""

    config: dict[str, Any]  # the LM's own config (a wrapper's `text_config`)
    decoder_prefix: str  # what replaces `model.`: "model.", "language_model.model.", ...
    head: str | None  # the lm_head tensor's name; None when tied to the embedding
    wrapped: bool  # config.json is a wrapper's (text_config), not the LM's own

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def num_hidden_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    def tensor_name(self, plain: str) -> str:
        """The folder's name of a plain LM tensor name; a tied head reads the embedding."""
        if plain == HEAD:
            return self.head or self.decoder_prefix + EMBED
        if plain.startswith(DECODER):
            return self.decoder_prefix + plain.removeprefix(DECODER)
        raise ValueError(f"{plain!r}: not a text-model tensor name (model.* or {HEAD})")

    def plain_name(self, name: str) -> str | None:
        """The plain name of one of the folder's tensors; None for a tensor outside the LM."""
        if self.head is not None and name == self.head:
            return HEAD
        if name.startswith(self.decoder_prefix):
            return DECODER + name.removeprefix(self.decoder_prefix)
        return None


def find_text_model(folder: str | os.PathLike) -> TextModel:
    """The text model of an HF folder, from config.json and its safetensors weight map.

    The decoder prefix is the one under which `embed_tokens.weight` lives (with its final norm
    beside it when a wrapper has several embeddings); the head is `lm_head.weight` beside
    the decoder (Kimi), at the top (Llava), or absent (tied).
    """
    folder = Path(folder)
    config = read_json(folder / "config.json")
    names = weight_map(folder)
    if not names:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights")
    prefixes = sorted(n.removesuffix(EMBED) for n in names if n.endswith(EMBED))
    if len(prefixes) > 1:
        prefixes = [p for p in prefixes if p + "norm.weight" in names] or prefixes
    if len(prefixes) != 1:
        found = prefixes or "none"
        raise ValueError(
            f"{folder}: cannot tell the text model's tensors: {EMBED} under prefixes {found}"
        )
    (decoder,) = prefixes
    # `language_model.model.` sits beside `language_model.lm_head`; `model.language_model.`
    # (whose name also ends in "model.") beside a top-level head
    outer = decoder.removesuffix(DECODER) if decoder.endswith("." + DECODER) else ""
    head = next((n for n in (outer + HEAD, HEAD) if n in names), None)
    return TextModel(
        config=text_config(config),
        decoder_prefix=decoder,
        head=head,
        wrapped="text_config" in config,
    )
