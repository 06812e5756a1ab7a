"""The tensors of an EAGLE-3 drafter's model.safetensors, by name and shape: the one
definition that stage export writes and checks (specbuild.export.expected_tensors), the
PyTorch engine loads strictly, and the parse-time check of a folder built elsewhere reads from
its header (specbuild.eagle.drafter_fit), so a renamed tensor (`fcx.weight` for `fc.weight`)
is a config fault naming the key, the folder and the names, not six tracebacks in a bench job.

Contract: `DrafterShape.from_config` reads the sizes from a drafter's config.json, defaulting
what a Llama config implies the way SGLang reads it (other exporters, SpecForge's, leave those
out); `tensor_shapes` is {name: shape} of the file that shape needs, `tensor_names` its names
alone (what a config.json without every size still decides); IGNORED names a tensor a folder
may carry that no loader uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specbuild.eagle.layers import AUX_LAYERS

__all__ = ["IGNORED", "DrafterShape", "tensor_names", "tensor_shapes"]

# SGLang gives every EAGLE-3 drafter the target's embedding (set_embed): one that a folder
# carries (SpecForge's exports do) is never used, there nor by the PyTorch engine
IGNORED = ("embed_tokens.weight",)


@dataclass(frozen=True)
class DrafterShape:
    """The sizes that decide an EAGLE-3 drafter's tensors."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    fc_norm: bool = False

    @classmethod
    def from_config(cls, hf: Mapping[str, Any]) -> DrafterShape:
        """From a drafter's config.json; KeyError names a size it lacks, ValueError or
        TypeError one that is no number."""
        heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        return cls(
            hidden_size=hidden,
            intermediate_size=int(hf["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or hidden // heads),
            vocab_size=int(hf["vocab_size"]),
            draft_vocab_size=int(hf.get("draft_vocab_size") or hf["vocab_size"]),
            target_hidden_size=int(hf.get("target_hidden_size", hidden)),
            fc_norm=bool(hf.get("fc_norm", False)),
        )


def tensor_shapes(shape: DrafterShape) -> dict[str, list[int]]:
    """{name: shape} of every tensor a drafter of `shape` holds (d2t and t2d included)."""
    h, i, th = shape.hidden_size, shape.intermediate_size, shape.target_hidden_size
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_key_value_heads * shape.head_dim
    want = {
        "fc.weight": [h, AUX_LAYERS * th],
        "midlayer.hidden_norm.weight": [h],
        "midlayer.input_layernorm.weight": [h],
        "midlayer.self_attn.q_proj.weight": [q, 2 * h],
        "midlayer.self_attn.k_proj.weight": [kv, 2 * h],
        "midlayer.self_attn.v_proj.weight": [kv, 2 * h],
        "midlayer.self_attn.o_proj.weight": [h, q],
        "midlayer.post_attention_layernorm.weight": [h],
        "midlayer.mlp.gate_proj.weight": [i, h],
        "midlayer.mlp.up_proj.weight": [i, h],
        "midlayer.mlp.down_proj.weight": [h, i],
        "norm.weight": [h],
        "lm_head.weight": [shape.draft_vocab_size, h],
        "d2t": [shape.draft_vocab_size],
        "t2d": [shape.vocab_size],
    }
    if shape.fc_norm:
        want |= {f"fc_norm.{j}.weight": [th] for j in range(AUX_LAYERS)}
    return want


def tensor_names(*, fc_norm: bool = False) -> list[str]:
    """The names `tensor_shapes` gives a drafter with or without `fc_norm`: they depend on
    nothing else."""
    return list(tensor_shapes(DrafterShape(1, 1, 1, 1, 1, 1, 1, 1, fc_norm=fc_norm)))
