"""A block drafter's folder (DFlash, DSpark) in exactly the form SGLang 0.5.17 loads.

    config.json        DFlashDraftModel | DSparkDraftModel: the target's shapes and RoPE,
                       num_hidden_layers = draft layers, block_size, and under dflash_config
                       target_layer_ids, block_size, num_target_layers, mask_token(_id);
                       DSpark also markov_rank, markov_head_type and mask_token_id at the
                       top level
    model.safetensors  layers.{i}.* (q/k/v/o, q_norm, k_norm, MLP, two norms), fc,
                       hidden_norm, norm (+ markov_head.markov_w1/w2 for DSpark); no
                       embedding or lm_head (SGLang uses the target's)

What SGLang does not say, and this module checks instead (`block_faults`):
- DFLASH drops any weight name it does not know and shape-checks only fc.weight: every name,
  shape and dtype is compared with what the config implies;
- DSpark's Markov head reads markov_rank and markov_head_type only at the top level of
  config.json (under dspark_config alone they pass validation, then build a rank-0 head);
- a target layer id equal to the target's last layer is never captured, and the server fails
  on the first request, not at load: ids must lie below L - 1;
- a mask token id outside the target's vocabulary makes the server refuse to start; DSpark
  requires one and has no tokenizer fallback.
`block_size` is DFlash's block (drafts + 1) and DSpark's gamma (drafts): SGLang verifies
drafts + 1 tokens either way.
"""

from __future__ import annotations

from specbuild.drafter.block import BlockConfig
from specbuild.drafter.config import DrafterConfig
from specbuild.eagle.chain import BLOCK_ALGORITHMS
from specbuild.infra.dtypes import HEADER_DTYPES

__all__ = [
    "BLOCK_ARCHITECTURES",
    "TARGET_KEYS",
    "block_faults",
    "block_hf_config",
    "block_tensors",
    "config_from_export",
    "family_of",
    "llama_config",
]

# family -> the architecture SGLang serves it as, from the one map of those names
BLOCK_ARCHITECTURES = {algorithm.lower(): arch for arch, algorithm in BLOCK_ALGORITHMS.items()}
# Target config keys every exported drafter copies verbatim when present (special tokens SGLang
# may read; the RoPE the drafter trained with), EAGLE-3's and the block families' alike
TARGET_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "rope_parameters")


def llama_config(cfg: DrafterConfig | BlockConfig, *, dtype: str, target: dict) -> dict:
    """The keys every exported drafter's config.json holds, EAGLE-3's and the block families'
    alike: the target's TARGET_KEYS as they are, then what transformers parses as a Llama
    config (SGLang's architecture name picks the model; an MLA draft's own keys ride along,
    LlamaConfig keeps them): shapes, RoPE, no biases, an untied head (tied, SGLang would use
    the embedding as lm_head), the dtype."""
    out = {k: target[k] for k in TARGET_KEYS if k in target}
    return out | {
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": cfg.rope_theta,  # SGLang reads the legacy keys
        "rope_scaling": cfg.rope_scaling,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
    }


def family_of(hf: dict) -> str | None:
    """The block family of a drafter config.json, None for any other architecture."""
    archs = hf.get("architectures") or [None]
    return {v: k for k, v in BLOCK_ARCHITECTURES.items()}.get(archs[0])


def block_hf_config(
    cfg: BlockConfig, *, layer_ids: list[int], target_layers: int, dtype: str, extra: dict
) -> dict:
    """The config.json of a block drafter; `extra` holds the target keys copied as they are."""
    dflash = {
        "target_layer_ids": [int(i) for i in layer_ids],  # +1 in SGLang, as for Llama's EAGLE-3
        "block_size": cfg.block_len,  # DFlash's rows (drafts + 1), DSpark's gamma (drafts)
        "num_target_layers": target_layers,
        "mask_token_id": cfg.mask_token_id,
    }
    if cfg.mask_token:
        dflash["mask_token"] = cfg.mask_token
    out = llama_config(cfg, dtype=dtype, target=extra)
    out |= {
        "architectures": [BLOCK_ARCHITECTURES[cfg.family]],
        "num_hidden_layers": cfg.num_layers,
        "block_size": cfg.block_len,
        "num_target_layers": target_layers,
        "dflash_config": dflash,
    }
    if cfg.family == "dspark":  # read at the top level only (see the module docstring)
        out |= {
            "markov_rank": cfg.markov_rank,
            "markov_head_type": "vanilla",
            "mask_token_id": cfg.mask_token_id,
        }
    return out


def block_tensors(cfg: BlockConfig, dtype: str) -> dict[str, tuple[list[int], str]]:
    """{name: (shape, safetensors dtype)} of a correct model.safetensors."""
    h, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv, f = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd, HEADER_DTYPES[dtype]
    want = {
        "fc.weight": ([h, cfg.num_context_features * h], f),
        "hidden_norm.weight": ([h], f),
        "norm.weight": ([h], f),
    }
    for n in range(cfg.num_layers):
        p = f"layers.{n}."
        want |= {
            p + "self_attn.q_proj.weight": ([q, h], f),
            p + "self_attn.k_proj.weight": ([kv, h], f),
            p + "self_attn.v_proj.weight": ([kv, h], f),
            p + "self_attn.o_proj.weight": ([h, q], f),
            p + "self_attn.q_norm.weight": ([hd], f),
            p + "self_attn.k_norm.weight": ([hd], f),
            p + "mlp.gate_proj.weight": ([i, h], f),
            p + "mlp.up_proj.weight": ([i, h], f),
            p + "mlp.down_proj.weight": ([h, i], f),
            p + "input_layernorm.weight": ([h], f),
            p + "post_attention_layernorm.weight": ([h], f),
        }
    if cfg.markov_rank:
        want |= {
            "markov_head.markov_w1.weight": ([cfg.vocab_size, cfg.markov_rank], f),
            "markov_head.markov_w2.weight": ([cfg.vocab_size, cfg.markov_rank], f),
        }
    return want


def config_from_export(hf: dict) -> BlockConfig:
    """The BlockConfig a block drafter's config.json describes (KeyError on a missing key)."""
    family = family_of(hf)
    dflash = hf.get("dflash_config") or {}
    size = int(dflash.get("block_size", hf["block_size"]))
    heads = int(hf["num_attention_heads"])
    from specbuild.drafter.config import rope_from_hf

    return BlockConfig(
        family=family or "",
        drafts=size - 1 if family == "dflash" else size,
        num_layers=int(hf["num_hidden_layers"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_attention_heads=heads,
        num_key_value_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
        vocab_size=int(hf["vocab_size"]),
        mask_token_id=int(dflash.get("mask_token_id", hf.get("mask_token_id", -1))),
        mask_token=str(dflash.get("mask_token", "")),
        num_context_features=len(dflash["target_layer_ids"]),
        markov_rank=int(hf.get("markov_rank", 0)) if family == "dspark" else 0,
        rms_norm_eps=float(hf["rms_norm_eps"]),
        max_position_embeddings=int(hf["max_position_embeddings"]),
        hidden_act=str(hf.get("hidden_act", "silu")),
        **rope_from_hf({k: v for k, v in hf.items() if k != "rope_parameters"}),
    )


def block_faults(hf: dict) -> list[str]:
    """Every reason SGLang would load this block drafter's config.json wrongly or not at all."""
    family = family_of(hf)
    faults = []
    dflash = hf.get("dflash_config")
    if not isinstance(dflash, dict):
        return ["config.json: dflash_config missing (SGLang reads the layer ids and mask there)"]
    ids = dflash.get("target_layer_ids")
    layers = hf.get("num_target_layers", dflash.get("num_target_layers"))
    if not (isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids)):
        faults.append(f"config.json: dflash_config.target_layer_ids is {ids!r}, expected ids")
    elif isinstance(layers, int) and not all(0 <= i < layers - 1 for i in ids):
        faults.append(
            f"config.json: dflash_config.target_layer_ids {ids}: SGLang never captures the "
            f"output of the last layer ({layers - 1}) and fails on the first request"
        )
    mask = dflash.get("mask_token_id")
    vocab = hf.get("vocab_size")
    if not (isinstance(mask, int) and isinstance(vocab, int) and 0 <= mask < vocab):
        faults.append(
            f"config.json: dflash_config.mask_token_id is {mask!r}, expected an id below the "
            f"vocabulary ({vocab}); SGLang would add a token past it and refuse to start"
        )
    if dflash.get("block_size") != hf.get("block_size"):
        faults.append("config.json: block_size differs from dflash_config.block_size")
    if family == "dspark":
        for key in ("markov_rank", "markov_head_type", "mask_token_id"):
            if key not in hf:
                faults.append(
                    f"config.json: {key} missing at the top level (SGLang's DSpark head reads "
                    "it there only)"
                )
        if hf.get("markov_head_type", "vanilla") != "vanilla":
            faults.append("config.json: markov_head_type must be 'vanilla' (what we train)")
        if hf.get("mask_token_id", mask) != mask:
            faults.append("config.json: mask_token_id differs from dflash_config.mask_token_id")
    if hf.get("hidden_act", "silu") != "silu":
        faults.append("config.json: hidden_act must be silu (SGLang's block drafts)")
    return faults
