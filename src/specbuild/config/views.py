"""Views of a checked config that the rules and checks share: the variants and what each
trains on, the drafters the bench runs, the flags of every SGLang server.

Contract: each function reads a config whose defaults are filled (`check_config`) and returns
plain builtins, so its result can be a rule's params. Each view is defined here once; the
rules, the checks and the stages read it from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "BASE_VARIANT",
    "BLOCK_KEYS",
    "TRAIN_CADENCE",
    "TRAIN_NEUTRAL",
    "bench_drafter_names",
    "sglang_server_args",
    "train_datasets",
    "train_variants",
]

BASE_VARIANT = "base"  # the variant that is the recipe of `train` itself, always built
# How often training logs and checkpoints: no weight, metric or export depends on these, so
# they are neither params of a train job (a change reruns nothing) nor part of its resume key
# (a run resumes from a checkpoint written at another save_interval). Resources carry them.
TRAIN_CADENCE = ("log_interval", "save_interval")
# Training keys added after builds existed, at the value that trains exactly as before: a job's
# params leave them out there, so a build made before the key existed stays up to date.
TRAIN_NEUTRAL = {
    "acceptance_weight": 0.0,
    "family": "eagle3",
    "norm_output": False,
    # auto is gqa for every target without MLA's sizes, as before; a DeepSeek-V3 or Kimi-K2.5
    # drafter trained before it keeps its Llama attention until retrained (--forcerun train)
    "draft_attention": "auto",
}
# Keys only a block family (dflash, dspark) reads: an EAGLE-3 variant's params leave them out,
# so they neither rerun it nor appear in its job.
BLOCK_KEYS = ("block_drafts", "block_layers", "block_anchors", "markov_rank", "mask_token_id")


def train_variants(config: Mapping) -> dict[str, dict]:
    """{variant: its full train config}: `base` is train as given, every other variant the same
    with its own keys changed (`train.variants`)."""
    train = {k: v for k, v in config["train"].items() if k != "variants"}
    variants = {BASE_VARIANT: train}
    for name, changes in (config["train"].get("variants") or {}).items():
        variants[name] = {**train, **changes}
    return variants


def train_datasets(config: Mapping, train: Mapping) -> list[str]:
    """Datasets a train recipe (`train` or a variant's merged keys) trains on: its `datasets`,
    else every dataset but the held-out eval_set, in config order."""
    if train.get("datasets"):
        return list(train["datasets"])
    return [d for d in config["datasets"] if d != config["train"].get("eval_set")]


def bench_drafter_names(config: Mapping) -> list[str]:
    """Every drafter the hf and sglang engines bench: our variants in `bench.variants` (null:
    all, `base` first) and then each of `bench.drafters`."""
    bench = config["bench"]
    ours = list(train_variants(config)) if bench.get("variants") is None else bench["variants"]
    return list(ours) + list(bench.get("drafters") or {})


def sglang_server_args(config: Mapping) -> dict[str, Any]:
    """sglang.server_args plus `trust_remote_code` from target.trust_remote_code, the flag's
    one source (sglang.server_args may not set it: a config fault)."""
    args = dict(config["sglang"]["server_args"])
    if config["target"].get("trust_remote_code"):
        args["trust_remote_code"] = True
    return args
