"""Stage `variants`: one table and one plot comparing every drafter variant of the build.

Every variant (`train.variants`, plus `base`, the recipe of `train` itself) trains on the same
hidden-state shards and draft vocabulary; only training keys differ, so this is the cheap
search a build system makes possible: the shards are the expensive part and are shared.

    results/train/<variant>/metrics.jsonl (each variant's eval rows)
      -> results/tables/variants.{csv,md,html}: per variant the keys it changes, the best
         eval row's simulated acceptance length and per-position accuracies, its step,
         epoch and trained tokens, and the run's training tokens/s at that row
      -> results/plots/variants.png: simulated acceptance length by variant

The simulated acceptance length is training's own estimate (1 + sum over k of the product of
per-position accuracies up to k, on its eval samples); the benchmarks measure the served one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on cluster nodes

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from specbuild.io import atomic_path  # noqa: E402
from specbuild.report.tables import write_table  # noqa: E402

__all__ = ["BASE", "variant_table", "plot_variants", "write_variants"]

BASE = "base"  # the recipe of `train` itself (config_check.train_variants)


def _best_row(path: str | os.PathLike) -> dict:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{path}: no eval rows; did training evaluate at all?")
    return max(rows, key=lambda r: r["acceptance_length"])


def _changes(changes: Mapping) -> str:
    if not changes:
        return "(the train recipe)"
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in changes.items())


def variant_table(
    metrics: Mapping[str, str | os.PathLike], changes: Mapping[str, Mapping]
) -> pd.DataFrame:
    """One row per variant, in `metrics` order (base first), from its best eval row."""
    rows = []
    for name, path in metrics.items():
        best = _best_row(path)
        row = {
            "variant": name,
            "changes": _changes(changes.get(name, {})),
            "simulated acceptance length": best["acceptance_length"],
        }
        row |= {f"acc {k}": acc for k, acc in enumerate(best["acc"], 1)}
        row |= {
            "best step": best["step"],
            "epoch": best["epoch"],
            "trained tokens": best["tokens"],
            "training tokens_per_s": best.get("tokens_per_s"),
        }
        rows.append(row)
    return pd.DataFrame(rows)


def plot_variants(table: pd.DataFrame, path: str | os.PathLike) -> None:
    """Simulated acceptance length per variant, best on top, with the 1.0 of no drafter."""
    df = table.sort_values("simulated acceptance length")
    fig, ax = plt.subplots(figsize=(6.4, 0.5 * len(df) + 1.2))
    bars = ax.barh(df["variant"], df["simulated acceptance length"], color="#4c72b0")
    ax.bar_label(bars, fmt="%.3f", padding=3)
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)  # 1.0: nothing accepted
    ax.set_xlim(0, max(1.1, df["simulated acceptance length"].max() * 1.15))
    ax.set_xlabel("simulated acceptance length (tokens per verify step)")
    ax.set_title("Drafter variants, same shards and vocabulary")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def write_variants(
    *,
    metrics: Mapping[str, str | os.PathLike],
    changes: Mapping[str, Mapping],
    table: str | os.PathLike,
    plot: str | os.PathLike,
) -> pd.DataFrame:
    """The table (`table` is its .md; .csv and .html beside it) and the plot."""
    df = variant_table(metrics, changes)
    write_table(df, Path(table).with_suffix(""))
    plot_variants(df, plot)
    return df
