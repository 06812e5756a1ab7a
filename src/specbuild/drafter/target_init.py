"""`train.init: target_last_layer`: start the drafter's decoder layer from the target's last one.

The drafter's one decoder layer (`midlayer`) is a Llama layer of the target's shapes except that
its attention reads 2H inputs, [input_layernorm(embedding) | hidden_norm(hidden)]. Copied from
the target's layer L-1 (weights read from the target folder with safetensors, never pickle):

    drafter midlayer.*                         target model.layers.{L-1}.*
    input_layernorm.weight            [H]      input_layernorm.weight             [H]
    self_attn.{q,k,v}_proj.weight[:, :H]       self_attn.{q,k,v}_proj.weight      [out, H]
        (the columns that read the embedding half)
    self_attn.o_proj.weight           [H, nh*hd]   self_attn.o_proj.weight
    post_attention_layernorm.weight   [H]      post_attention_layernorm.weight
    mlp.{gate,up,down}_proj.weight             mlp.{gate,up,down}_proj.weight

An MLA drafter (`DrafterConfig.mla`) copies the target's multi-latent attention instead of
q/k/v: the columns of q_a_proj and kv_a_proj_with_mqa that read the embedding half, and whole
q_a_layernorm, q_b_proj, kv_a_layernorm, kv_b_proj and o_proj (MLA_LAYER_WEIGHTS).

Left as initialized: `hidden_norm` (ones: the target has no norm for a second input), the q/k/v
columns H:2H that read the hidden half (normal, std 0.02), `fc` (no counterpart), and `norm`,
`lm_head` (the target's final norm and head, as with every init). Attention biases of a target
that has them (Qwen2) are not copied: the drafter's projections have none (SGLang's Llama drafter
neither). A target whose last layer lacks one of these weights, or holds one of another shape,
is refused, naming every such weight: copying part of a layer silently would hide it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from specbuild.drafter.model import Eagle3Drafter
from specbuild.drafter.teacher import read_target_weights
from specbuild.eagle.text_model import text_config
from specbuild.infra.io import read_json

__all__ = [
    "EMBEDDING_HALF",
    "LAYER_WEIGHTS",
    "MLA_EMBEDDING_HALF",
    "MLA_LAYER_WEIGHTS",
    "copy_target_weights",
    "init_from_target_layer",
]

# drafter midlayer parameter -> the target layer's weight it starts from
LAYER_WEIGHTS = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attn.q_proj.weight": "self_attn.q_proj.weight",
    "self_attn.k_proj.weight": "self_attn.k_proj.weight",
    "self_attn.v_proj.weight": "self_attn.v_proj.weight",
    "self_attn.o_proj.weight": "self_attn.o_proj.weight",
    "post_attention_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}
# the ones that read [embedding half | hidden half]: only the first H columns are copied
EMBEDDING_HALF = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}
# an MLA drafter's: the same but its attention, the target's own MLA weights under its names
MLA_LAYER_WEIGHTS = {k: v for k, v in LAYER_WEIGHTS.items() if k not in EMBEDDING_HALF} | {
    f"self_attn.{n}.weight": f"self_attn.{n}.weight"
    for n in (
        "q_a_proj",
        "q_a_layernorm",
        "q_b_proj",
        "kv_a_proj_with_mqa",
        "kv_a_layernorm",
        "kv_b_proj",
    )
}
MLA_EMBEDDING_HALF = {"self_attn.q_a_proj.weight", "self_attn.kv_a_proj_with_mqa.weight"}


def init_from_target_layer(model: Eagle3Drafter, target_dir: str | os.PathLike) -> list[str]:
    """Copy the target's last decoder layer into `model.midlayer` (see the module docstring);
    returns one line per copied tensor (`drafter <- target [shape]`) for the log."""
    target_dir = Path(target_dir)
    cfg = read_json(target_dir / "config.json")
    last = int(text_config(cfg)["num_hidden_layers"]) - 1
    prefix = f"model.layers.{last}."
    mla = model.config.mla
    layer_weights = MLA_LAYER_WEIGHTS if mla else LAYER_WEIGHTS
    embedding_half = MLA_EMBEDDING_HALF if mla else EMBEDDING_HALF
    H = model.config.hidden_size
    params = dict(model.midlayer.named_parameters())
    copies = {}
    for ours, theirs in layer_weights.items():
        if ours in embedding_half:  # the columns that read the embedding half
            copies[f"midlayer.{ours}[:, :H]"] = (params[ours][:, :H], prefix + theirs)
        else:
            copies[f"midlayer.{ours}"] = (params[ours], prefix + theirs)
    return copy_target_weights(target_dir, copies)


def copy_target_weights(
    target_dir: str | os.PathLike, copies: dict[str, tuple[torch.Tensor, str]]
) -> list[str]:
    """`train.init target_last_layer`'s copy, for every drafter family: {log label:
    (destination, a parameter or a view of one; the target weight's name)}. Every shape is
    checked before anything is copied, and a target lacking a weight, or holding one of
    another shape, is refused naming every such weight: copying part of a layer silently
    would hide it. Returns one line per copied tensor (`drafter <- target [shape]`)."""
    try:
        weights = read_target_weights(target_dir, [name for _, name in copies.values()])
    except KeyError as err:
        raise ValueError(
            f"train.init target_last_layer: {err.args[0]}; use train.init random for this target"
        ) from None
    faults = [
        f"{name}: {tuple(weights[name].shape)}, the drafter needs {tuple(dst.shape)}"
        for dst, name in copies.values()
        if weights[name].shape != dst.shape
    ]
    if faults:
        raise ValueError(
            f"train.init target_last_layer: {target_dir} does not fit this drafter:\n  "
            + "\n  ".join(faults)
        )
    with torch.no_grad():
        for dst, name in copies.values():
            dst.copy_(weights[name])
    return [f"{label} <- {name} {list(weights[name].shape)}" for label, (_, name) in copies.items()]
