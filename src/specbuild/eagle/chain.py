"""The `chain` of a bench job: a drafting shape, or the `baseline` without a drafter.

A chain is written "steps-topk-draft_tokens", SGLang's --speculative-num-steps,
--speculative-eagle-topk and --speculative-num-draft-tokens ("3-1-4"). This is the one parser:
config checks, rule wildcards, servers, tables and plots all read a chain through `Chain`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BASELINE",
    "BLOCK_ALGORITHMS",
    "CHAIN_PATTERN",
    "NGRAM_DRAFTER",
    "NO_DRAFTER",
    "Chain",
    "block_chain",
    "chain_order",
    "simulated_acceptance_length",
]

BASELINE = "baseline"  # the `chain` of rows decoded without a drafter
NO_DRAFTER = "none"  # the baseline's `drafter` (its rows and its folder)
# SGLang's n-gram speculation (bench.ngram): drafts looked up in the text so far, no trained
# drafter and no folder; the floor a user gets without training
NGRAM_DRAFTER = "ngram"
# A `chain` as a regex (rule wildcards): the baseline or any chain-shaped name.
CHAIN_PATTERN = rf"{BASELINE}|[0-9]+-[0-9]+-[0-9]+"


@dataclass(frozen=True)
class Chain:
    """EAGLE-3 drafting shape. With topk 1 the draft is a chain: `steps` drafter forwards
    propose `steps` tokens and verify scores them after the last committed token, so
    draft_tokens = steps + 1; topk > 1 drafts a tree (SGLang only)."""

    steps: int
    topk: int
    draft_tokens: int

    @classmethod
    def parse(cls, name: str) -> Chain:
        """'3-1-4' -> Chain(3, 1, 4); raises naming every fault and the expected form."""
        parts = str(name).split("-")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"chain {name!r}: expected 'steps-topk-draft_tokens', e.g. '3-1-4'")
        chain = cls(*(int(p) for p in parts))
        sizes = (("steps", chain.steps), ("topk", chain.topk))
        faults = [f"{n} must be >= 1" for n, v in sizes if v < 1]
        if chain.topk == 1 and chain.draft_tokens != chain.steps + 1:
            faults.append(f"with topk 1, draft tokens must be steps + 1 = {chain.steps + 1}")
        if faults:
            raise ValueError(f"chain {name!r}: " + "; ".join(faults))
        return chain

    @property
    def name(self) -> str:
        return f"{self.steps}-{self.topk}-{self.draft_tokens}"

    @property
    def is_chain(self) -> bool:
        """One draft per step (topk 1): what the PyTorch engine runs."""
        return self.topk == 1

    def server_args(
        self, drafter_dir: str, *, draft_attention_backend: str | None = None
    ) -> dict[str, Any]:
        """SGLang's flags serving `drafter_dir` with this chain; the draft's attention backend
        when one is named (config `sglang.draft_attention_backend`), else SGLang's choice.

        A block drafter's folder (DFlash, DSpark: its config.json says) is served by its own
        algorithm, one forward per block: DFLASH verifies a block of draft_tokens, DSPARK
        proposes gamma = steps drafts; both forbid steps and topk flags of their own."""
        algorithm = BLOCK_ALGORITHMS.get(_architecture(drafter_dir))
        if algorithm == "DFLASH":
            args: dict[str, Any] = {"speculative_dflash_block_size": self.draft_tokens}
        elif algorithm == "DSPARK":
            args = {"speculative_dspark_block_size": self.steps}
        else:
            algorithm, args = (
                "EAGLE3",
                {
                    "speculative_num_steps": self.steps,
                    "speculative_eagle_topk": self.topk,
                    "speculative_num_draft_tokens": self.draft_tokens,
                },
            )
        args = {
            "speculative_algorithm": algorithm,
            "speculative_draft_model_path": str(drafter_dir),
            **args,
        }
        if draft_attention_backend:
            args["speculative_draft_attention_backend"] = draft_attention_backend
        return args

    def ngram_args(self) -> dict[str, Any]:
        """SGLang's flags for n-gram speculation at this chain: draft_tokens verified, topk
        as the lookup's breadth (SGLang sets its steps from the two)."""
        return {
            "speculative_algorithm": "NGRAM",
            "speculative_num_draft_tokens": self.draft_tokens,
            "speculative_ngram_max_bfs_breadth": self.topk,
            "speculative_ngram_min_bfs_breadth": 1,
        }


# a block drafter's architecture (specbuild.block_export) -> SGLang's --speculative-algorithm
BLOCK_ALGORITHMS = {"DFlashDraftModel": "DFLASH", "DSparkDraftModel": "DSPARK"}


def _architecture(drafter_dir: str) -> str:
    """The architecture a drafter folder's config.json names ("" where there is none yet)."""
    path = Path(drafter_dir) / "config.json"
    if not path.is_file():
        return ""
    archs = json.loads(path.read_text()).get("architectures") or [""]
    return str(archs[0])


def block_chain(drafts: int) -> str:
    """The one chain a block drafter of `drafts` tokens is benched and served at."""
    return f"{drafts}-1-{drafts + 1}"


def chain_order(chains) -> list[str]:
    """Chains in display order: the baseline first, then by steps, topk, draft tokens."""
    names = set(chains)
    chains = sorted(
        (Chain.parse(c) for c in names - {BASELINE}),
        key=lambda c: (c.steps, c.topk, c.draft_tokens),
    )
    return ([BASELINE] if BASELINE in names else []) + [c.name for c in chains]


def simulated_acceptance_length(acc: Sequence[float]) -> float:
    """Tokens per verify step of a chain whose draft k is accepted at rate acc_k once every
    draft before it was: 1 + sum_k prod_{i<=k} acc_i, the bonus token included. Training's
    estimate of what the bench measures (Σcompletion/Σverify, `bench.metrics`)."""
    total, run = 1.0, 1.0
    for a in acc:
        run *= a
        total += run
    return total
