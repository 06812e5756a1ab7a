"""Paths more than one rule spells: the target folder, a drafter folder's files, bench rows."""

from __future__ import annotations

from collections.abc import Mapping

from specbuild.infra.formats import DRAFTER_FILES

__all__ = [
    "HIDDEN_SHARD",
    "bench_row_file",
    "drafter_folder_files",
    "target_dir",
    "target_file",
    "variant_drafter_folder",
]

# one hidden-state shard per tokenized shard; never temp(): the expensive part of the build
HIDDEN_SHARD = "results/hidden/{dataset}/{shard}.safetensors"


def target_dir(config: Mapping) -> str:
    """The materialized target folder (stage target)."""
    return f"results/target/{config['target']['name']}"


def target_file(config: Mapping, name: str) -> str:
    """A file of the materialized target folder."""
    return f"{target_dir(config)}/{name}"


def variant_drafter_folder(variant: str) -> str:
    """The folder `export` writes a variant's drafter to (what SGLang loads)."""
    return f"results/drafter/{variant}"


def drafter_folder_files(folder: str) -> list[str]:
    """The files of an exported drafter folder (specbuild.infra.formats.DRAFTER_FILES)."""
    return [f"{folder}/{name}" for name in DRAFTER_FILES]


def bench_row_file(engine: str, drafter: str, chain: str) -> str:
    return f"results/bench/{engine}/{drafter}/{chain}.jsonl"
