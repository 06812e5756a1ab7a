"""A block drafter's start (DFlash, DSpark): shapes from the target, its embedding and lm_head
frozen inside, its final norm as `norm`, and a mask token the target's vocabulary holds.

The mask token: SGLang 0.5.17 adds `<|MASK|>` to the tokenizer when a draft names none, and
with a full vocabulary (SmolLM2: 49152 ids, 49152 rows) the id it gets is out of range and the
server refuses to start; DSpark has no fallback at all. So every block drafter pins one id
that exists: the tokenizer's own mask token where it has one, else its last special token that
is not a BOS, EOS or pad token (`train.mask_token_id` overrides). Its embedding only marks
"to be drafted": trained and served with the same id, any unused id works.

`train.init: target_last_layer` starts draft layer i from the target's layer L - n + i (n
draft layers): the projections, MLP and norms have the target's shapes; the per-head q_norm and
k_norm the target lacks start at ones.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from specbuild.drafter.block import BlockConfig, BlockDrafter
from specbuild.drafter.config import TrainConfig
from specbuild.drafter.target_init import LAYER_WEIGHTS, copy_target_weights
from specbuild.drafter.teacher import Teacher, read_target_weights, read_vocab
from specbuild.eagle.layers import AUX_LAYERS
from specbuild.eagle.target_info import load_tokenizer
from specbuild.eagle.text_model import text_config
from specbuild.infra.io import read_json

__all__ = ["build_block_drafter", "init_block_from_target", "mask_token"]

log = logging.getLogger("specbuild")


def mask_token(
    target_dir: str | os.PathLike, vocab_size: int, token_id: int | None = None
) -> tuple[str, int]:
    """(token text, id) of the mask token to pin, read from the target's tokenizer: `token_id`
    as given (`train.mask_token_id`), else the tokenizer's mask token, else its last special
    token that is no BOS, EOS, pad or unknown token. A target without tokenizer files (a
    synthetic one) takes a given id with no text: SGLang then uses the id as it is."""
    try:
        tok = load_tokenizer(target_dir)
    except (OSError, ValueError):
        if token_id is None:
            raise ValueError(
                f"{target_dir}: no tokenizer to pick a block drafter's mask token from; "
                "set train.mask_token_id"
            ) from None
        return "", token_id
    if token_id is not None:
        return str(tok.convert_ids_to_tokens(token_id)), token_id
    special = {t.content: i for i, t in tok.added_tokens_decoder.items() if t.special}
    if tok.mask_token in special and special[tok.mask_token] < vocab_size:
        return tok.mask_token, special[tok.mask_token]
    taken = {tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token}
    free = sorted((i, t) for t, i in special.items() if i < vocab_size and t not in taken)
    if not free:
        raise ValueError(
            f"{target_dir}: the tokenizer has no special token a block drafter can use as its "
            "mask (SGLang would add one past the vocabulary); set train.mask_token_id"
        )
    i, t = free[-1]
    return t, i


def build_block_drafter(
    cfg: TrainConfig, target_dir: Path, vocab: str, vocab_size: int
) -> tuple[BlockDrafter, Teacher]:
    """The seeded block drafter of `cfg.family` for the target in `target_dir`, and its teacher
    (the target's full-vocabulary head; the draft vocabulary only fills the Teacher's map)."""
    d2t, t2d = read_vocab(vocab, vocab_size=vocab_size)
    weights = read_target_weights(
        target_dir, ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
    )
    token, token_id = mask_token(target_dir, vocab_size, cfg.mask_token_id)
    bcfg = BlockConfig.from_target(
        read_json(target_dir / "config.json"),
        family=cfg.family,
        drafts=cfg.block_drafts,
        num_layers=cfg.block_layers,
        mask_token_id=token_id,
        mask_token=token,
        markov_rank=cfg.markov_rank if cfg.family == "dspark" else 0,
        num_context_features=AUX_LAYERS,
    )
    torch.manual_seed(cfg.seed)
    model = BlockDrafter(bcfg)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(weights["model.embed_tokens.weight"])
        model.lm_head.weight.copy_(weights["lm_head.weight"])
        model.norm.weight.copy_(weights["model.norm.weight"])
    log.info("%s drafter: mask token %r (id %d)", cfg.family, token, token_id)
    return model, Teacher(weights["lm_head.weight"], d2t, t2d)


def init_block_from_target(model: BlockDrafter, target_dir: str | os.PathLike) -> list[str]:
    """Copy the target's last n decoder layers into the n draft layers; lines for the log."""
    target_dir = Path(target_dir)
    depth = int(text_config(read_json(target_dir / "config.json"))["num_hidden_layers"])
    n = len(model.layers)
    if n > depth:
        raise ValueError(
            f"train.init target_last_layer: {n} draft layers, the target has {depth}; "
            "lower train.block_layers or use train.init random"
        )
    copies = {}
    for i, layer in enumerate(model.layers):
        params = dict(layer.named_parameters())
        for ours, theirs in LAYER_WEIGHTS.items():
            copies[f"layers.{i}.{ours}"] = (params[ours], f"model.layers.{depth - n + i}.{theirs}")
    return copy_target_weights(target_dir, copies)
