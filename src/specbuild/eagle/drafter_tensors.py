"""The tensors of an EAGLE-3 drafter's model.safetensors, by name and shape: the one
definition that stage export writes and checks (specbuild.export.expected_tensors), the
PyTorch engine loads strictly, and the parse-time check of a folder built elsewhere reads from
its header (specbuild.eagle.drafter_fit), so a renamed tensor (`fcx.weight` for `fc.weight`)
is a config fault naming the key, the folder and the names, not six tracebacks in a bench job.

Contract: `DrafterShape.from_config` reads the sizes from a drafter's config.json, defaulting
what a Llama config implies the way SGLang reads it (other exporters, SpecForge's, leave those
out); `tensor_shapes` is {name: shape} of the file that shape needs, `tensor_names` its names
alone (what a config.json without every size still decides); IGNORED names a tensor a folder
may carry that no loader uses; `silent_losses` says, per missing tensor, what SGLang would do
instead of refusing the folder.

Two attentions. `LlamaForCausalLMEagle3` (SGLang's llama_eagle3.py): q/k/v/o projections of
a Llama layer. `Eagle3DeepseekV2ForCausalLM` (MLA_ARCHITECTURE, kimi_k25_eagle3.py): the same
layer with DeepSeek's multi-latent attention (MLA_KEYS give its sizes), its two down
projections reading the 2H input:

    q_a_proj [q_lora, 2H] -> q_a_layernorm -> q_b_proj [heads*(nope+rope), q_lora]
    kv_a_proj_with_mqa [kv_lora+rope, 2H] -> kv_a_layernorm (first kv_lora) -> kv_b_proj
        [heads*(nope+v), kv_lora]; its last rope columns: the one RoPE key all heads share
    o_proj [H, heads*v]
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from specbuild.eagle.layers import AUX_LAYERS

__all__ = [
    "IGNORED",
    "MLA_ARCHITECTURE",
    "MLA_KEYS",
    "DrafterShape",
    "is_mla",
    "silent_losses",
    "tensor_names",
    "tensor_shapes",
]

# SGLang gives every EAGLE-3 drafter the target's embedding (set_embed): one that a folder
# carries (SpecForge's exports do) is never used, there nor by the PyTorch engine
IGNORED = ("embed_tokens.weight",)
# SGLang switches an EAGLE-3 draft to multi-latent attention by this architecture name alone
MLA_ARCHITECTURE = "Eagle3DeepseekV2ForCausalLM"
# MLA's sizes, as DeepSeek-V3 and Kimi-K2.5 configs (and SGLang's MLA draft) name them
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# SGLang loads these two as one fused projection, and drops either without its partner
MLA_PAIR = ("midlayer.self_attn.q_a_proj.weight", "midlayer.self_attn.kv_a_proj_with_mqa.weight")


def is_mla(config: Mapping[str, Any]) -> bool:
    """Whether a drafter's config.json makes SGLang build multi-latent attention."""
    archs = config.get("architectures")
    return isinstance(archs, list) and MLA_ARCHITECTURE in archs


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
    # multi-latent attention's sizes (MLA_KEYS); None: Llama attention (q/k/v/o)
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    @classmethod
    def from_config(cls, hf: Mapping[str, Any]) -> DrafterShape:
        """From a drafter's config.json; KeyError names a size it lacks, ValueError or
        TypeError one that is no number."""
        heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        mla = {k: int(hf[k]) for k in MLA_KEYS} if is_mla(hf) else {}
        # an MLA draft has no head_dim of its own: its query/key heads are nope+rope wide
        head_dim = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"] if mla else None
        return cls(
            hidden_size=hidden,
            intermediate_size=int(hf["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(head_dim or hf.get("head_dim") or hidden // heads),
            vocab_size=int(hf["vocab_size"]),
            draft_vocab_size=int(hf.get("draft_vocab_size") or hf["vocab_size"]),
            target_hidden_size=int(hf.get("target_hidden_size", hidden)),
            fc_norm=bool(hf.get("fc_norm", False)),
            **mla,
        )


def tensor_shapes(shape: DrafterShape) -> dict[str, list[int]]:
    """{name: shape} of every tensor a drafter of `shape` holds (d2t and t2d included)."""
    h, i, th = shape.hidden_size, shape.intermediate_size, shape.target_hidden_size
    want = {
        "fc.weight": [h, AUX_LAYERS * th],
        "midlayer.hidden_norm.weight": [h],
        "midlayer.input_layernorm.weight": [h],
        **{f"midlayer.self_attn.{k}": v for k, v in _attention_shapes(shape).items()},
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


def _attention_shapes(shape: DrafterShape) -> dict[str, list[int]]:
    h, nh = shape.hidden_size, shape.num_attention_heads
    if not shape.mla:
        q, kv = nh * shape.head_dim, shape.num_key_value_heads * shape.head_dim
        return {
            "q_proj.weight": [q, 2 * h],
            "k_proj.weight": [kv, 2 * h],
            "v_proj.weight": [kv, 2 * h],
            "o_proj.weight": [h, q],
        }
    ql, kvl, rope = shape.q_lora_rank, shape.kv_lora_rank, shape.qk_rope_head_dim
    qk = shape.qk_nope_head_dim + rope
    return {
        "q_a_proj.weight": [ql, 2 * h],
        "q_a_layernorm.weight": [ql],
        "q_b_proj.weight": [nh * qk, ql],
        "kv_a_proj_with_mqa.weight": [kvl + rope, 2 * h],
        "kv_a_layernorm.weight": [kvl],
        "kv_b_proj.weight": [nh * (shape.qk_nope_head_dim + shape.v_head_dim), kvl],
        "o_proj.weight": [h, nh * shape.v_head_dim],
    }


def tensor_names(*, fc_norm: bool = False, mla: bool = False) -> list[str]:
    """The names `tensor_shapes` gives a drafter with or without `fc_norm`, with Llama or
    multi-latent attention: they depend on nothing else."""
    dims = dict.fromkeys(MLA_KEYS, 1) if mla else {}
    return list(tensor_shapes(DrafterShape(1, 1, 1, 1, 1, 1, 1, 1, fc_norm=fc_norm, **dims)))


def silent_losses(config: Mapping[str, Any], names: Collection[str]) -> dict[str, str]:
    """{tensor a folder lacks: what SGLang 0.5.17 does instead of refusing it} for the losses it
    takes without a word: a draft head it leaves random, an MLA down projection it drops."""
    out = {}
    tied = bool(config.get("tie_word_embeddings", False))
    if "lm_head.weight" not in names and config.get("draft_vocab_size") and not tied:
        out["lm_head.weight"] = (
            "config.json declares draft_vocab_size, so SGLang serves a random head (it loads "
            "the target's only when draft_vocab_size is absent)"
        )
    if is_mla(config):
        for have, lack in (MLA_PAIR, MLA_PAIR[::-1]):
            if have in names and lack not in names:
                out[lack] = (
                    f"SGLang fuses it with {have!r} into one projection and drops the lone "
                    "one without a word, serving that attention untrained"
                )
    return out
