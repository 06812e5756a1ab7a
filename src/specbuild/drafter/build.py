"""The drafter a run starts from, the objective it trains under, and its optimizer.

`build_drafter` makes the model from the target folder: the target's embedding (frozen), its
lm_head rows of the draft vocabulary and its final norm, the rest seeded random (`train.seed`).
A fresh run then starts from `train.init_from` (`warm_start`: a drafter folder) or the target's
last decoder layer (`train.init`, `target_init.py`), never both (`TrainConfig.check`).
`train.draft_attention` resolves here against the target's config.json (`auto`: MLA for a
DeepSeek-V3 or Kimi-K2.5 target, Llama's attention elsewhere).
`train.attention`, `train.loss` and `train.precision` resolve here against the device
(`to_device` moves the drafter and its teacher there).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from torch import nn

from specbuild.drafter import fused_attention
from specbuild.drafter.block import BLOCK_FAMILIES, BlockDrafter
from specbuild.drafter.block_build import build_block_drafter, init_block_from_target
from specbuild.drafter.block_objective import BlockObjective
from specbuild.drafter.config import DrafterConfig, TrainConfig, draft_attention
from specbuild.drafter.model import Eagle3Drafter
from specbuild.drafter.objective import LossForm, TTTObjective
from specbuild.drafter.target_init import init_from_target_layer
from specbuild.drafter.teacher import Teacher, read_target_weights, read_vocab
from specbuild.infra.devices import cpu_bf16_supported
from specbuild.infra.io import read_json
from specbuild.infra.onednn_linear import use_onednn_training_linears

__all__ = [
    "attention_kind",
    "build_drafter",
    "build_objective",
    "build_optimizer",
    "init_weights",
    "loss_kind",
    "to_device",
    "use_autocast",
    "warm_start",
]

log = logging.getLogger("specbuild")


def build_drafter(
    cfg: TrainConfig, target_dir: Path, vocab: str, vocab_size: int
) -> tuple[Eagle3Drafter | BlockDrafter, Teacher]:
    """The seeded drafter of `cfg.family` for the target in `target_dir` and its teacher."""
    if cfg.family in BLOCK_FAMILIES:
        return build_block_drafter(cfg, target_dir, vocab, vocab_size)
    d2t, t2d = read_vocab(vocab, vocab_size=vocab_size)
    weights = read_target_weights(
        target_dir, ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
    )
    target = read_json(target_dir / "config.json")
    attention = draft_attention(cfg.draft_attention, target)
    log.info("draft attention: %s (train.draft_attention %s)", attention, cfg.draft_attention)
    mcfg = DrafterConfig.from_target(
        target,
        draft_vocab_size=d2t.shape[0],
        fc_norm=cfg.fc_norm,
        norm_output=cfg.norm_output,
        attention=attention,
    )
    torch.manual_seed(cfg.seed)
    model = Eagle3Drafter(mcfg)
    teacher = Teacher(weights["lm_head.weight"], d2t, t2d)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(weights["model.embed_tokens.weight"])
        # Start from the target's head and final norm: norm(h) then learns to look like `last`.
        model.lm_head.weight.copy_(teacher.draft)
        model.norm.weight.copy_(weights["model.norm.weight"])
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
    return model, teacher


def warm_start(model: Eagle3Drafter, folder: str | os.PathLike) -> str:
    """Load the drafter in `folder` into `model` (every shape checked first) and say what
    happened to the draft vocabulary: lm_head rows are draft-vocabulary rows, so they are
    reused as they are only when both maps agree; otherwise each of our draft tokens takes the
    folder's row for the same target token where it has one, and keeps the target's head row
    (`build_drafter`'s start) where it has none."""
    embed = model.embed_tokens.weight.detach()
    theirs = Eagle3Drafter.from_pretrained(
        folder, embed_tokens_weight=embed, dtype=torch.float32, device=embed.device
    )
    ours, src = model.state_dict(), theirs.state_dict()
    vocab_keys = {"lm_head.weight", "d2t", "t2d"}
    faults = [
        f"{k}: {tuple(src[k].shape)} there, {tuple(v.shape)} here"
        for k, v in ours.items()
        if k not in vocab_keys and k in src and src[k].shape != v.shape
    ]
    # another attention (Llama's there, MLA here, or the reverse), or fc_norm on one side only
    faults += [f"{k}: here, not there" for k in sorted(ours.keys() - src.keys())]
    faults += [f"{k}: there, not here" for k in sorted(src.keys() - ours.keys())]
    if faults:
        raise ValueError(
            f"train.init_from {folder}: not a drafter of this target's shape:\n  "
            + "\n  ".join(faults)
        )
    with torch.no_grad():
        for k, v in ours.items():
            if k not in vocab_keys and k != "embed_tokens.weight":
                v.copy_(src[k])
        if torch.equal(theirs.d2t, model.d2t) and torch.equal(theirs.t2d, model.t2d):
            model.lm_head.weight.copy_(src["lm_head.weight"])
            return "draft vocabulary map reused (identical to this build's)"
        targets = (torch.arange(len(theirs.d2t)) + theirs.d2t).tolist()
        row_of = {t: i for i, t in enumerate(targets)}
        ours_targets = (torch.arange(len(model.d2t)) + model.d2t).tolist()
        pairs = [(j, row_of[t]) for j, t in enumerate(ours_targets) if t in row_of]
        if pairs:
            dst, rows = zip(*pairs, strict=True)
            model.lm_head.weight[list(dst)] = src["lm_head.weight"][list(rows)]
    return (
        f"draft vocabulary map rebuilt: {len(pairs)} of {len(ours_targets)} draft tokens carried "
        f"over from {folder}, the rest start from the target's head"
    )


def init_weights(model: Eagle3Drafter, cfg: TrainConfig, target_dir: Path) -> None:
    """A fresh run's start: `train.init_from`, `train.init`, or the built drafter as it is."""
    if cfg.init_from:
        log.info("warm start from %s: %s", cfg.init_from, warm_start(model, cfg.init_from))
    elif cfg.init == "target_last_layer":
        if isinstance(model, BlockDrafter):
            copied = init_block_from_target(model, target_dir)
        else:
            copied = init_from_target_layer(model, target_dir)
        log.info("init from the target's last decoder layer:\n  %s", "\n  ".join(copied))


def attention_kind(cfg: TrainConfig, device: torch.device) -> str:
    """train.attention resolved: `auto` is the fused kernel on CUDA, the reference elsewhere."""
    if cfg.attention != "auto":
        return cfg.attention
    return "flex" if device.type == "cuda" and fused_attention.available() else "reference"


def use_autocast(cfg: TrainConfig, device: torch.device) -> bool:
    """bf16 autocast: on CUDA unless float32 is asked for; on CPU when bfloat16 is asked for
    and the CPU has native bf16 (elsewhere oneDNN emulates it, slower than float32)."""
    if device.type == "cuda":
        return cfg.precision != "float32"
    if cfg.precision != "bfloat16":
        return False
    if cpu_bf16_supported():
        return True
    log.warning(
        "train.precision bfloat16: this CPU has no native bf16 (AVX512-BF16 or AMX), "
        "training in float32"
    )
    return False


def to_device(
    model: Eagle3Drafter, teacher: Teacher, cfg: TrainConfig, device: torch.device
) -> bool:
    """Move both to `device`; whether the steps run under bf16 autocast."""
    amp = use_autocast(cfg, device)
    teacher.to(device, torch.bfloat16 if amp else torch.float32)
    model.to(device)
    if device.type == "cpu" and not amp:  # MKL's generic path on AMD: 1.15x a step (BENCHMARKS)
        use_onednn_training_linears(model)
    return amp


def loss_kind(cfg: TrainConfig, device: torch.device) -> str:
    """train.loss resolved: `auto` is the fused loss on CUDA (on CPU the matmuls bound it: no
    gain measured), the reference elsewhere."""
    if cfg.loss != "auto":
        return cfg.loss
    return "fused" if device.type == "cuda" else "reference"


def build_objective(
    cfg: TrainConfig,
    model: nn.Module,
    teacher: Teacher,
    *,
    amp: bool,
    attention: str,
    loss: str = "reference",
) -> TTTObjective | BlockObjective:
    """The loss of `cfg`'s family (training and `evaluate_drafter` alike): training-time test
    for EAGLE-3, blocks drawn at random anchors for DFlash and DSpark."""
    if isinstance(model, BlockDrafter):
        return BlockObjective(
            model, teacher, anchors=cfg.block_anchors, decay=cfg.loss_decay, amp=amp, seed=cfg.seed
        )
    return TTTObjective(
        model,
        teacher,
        steps=cfg.ttt_steps,
        decay=cfg.loss_decay,
        form=LossForm(cfg.teacher_temperature, cfg.acceptance_weight),
        amp=amp,
        attention=attention,
        fused_loss=loss == "fused",
    )


def build_optimizer(
    params: list[nn.Parameter], cfg: TrainConfig, device: torch.device
) -> torch.optim.AdamW:
    """AdamW over the trainable `params` with `cfg`'s hyper-parameters."""
    return torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        weight_decay=cfg.weight_decay,
        # one kernel for all parameters instead of a few per tensor list; same update rule,
        # same state keys (the checkpoint format does not change); CPU keeps the default
        fused=True if device.type == "cuda" else None,
    )
