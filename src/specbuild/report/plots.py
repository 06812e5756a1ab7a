"""Bench plots (seaborn), drawn from the tables in `specbuild.report.tables` so both agree.

acceptance_length.png  mean acceptance length by set and chain, Student-t 95% intervals
acceptance_by_position.png  share of verify steps accepting each draft position
speedup.png            tokens/s against the same set's no-drafter baseline
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on cluster nodes

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from specbuild.bench.specdec import BASELINE  # noqa: E402
from specbuild.io import atomic_path  # noqa: E402
from specbuild.report.tables import build_positions, build_summary, mean_ci, read_rows  # noqa: E402

__all__ = ["PLOTS", "plot_acceptance", "plot_positions", "plot_speedup", "write_plots"]

PLOTS = ("acceptance_length", "acceptance_by_position", "speedup")


def _interval(values) -> tuple[float, float]:
    """seaborn errorbar callable: the same Student-t 95% interval as the tables."""
    _, lo, hi = mean_ci(values)
    return lo, hi


def _save(fig, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def _chain_order(configs) -> list[str]:
    return sorted({c for c in configs if c != BASELINE}, key=lambda c: int(c.split("-")[0]))


def plot_acceptance(rows: pd.DataFrame, path: str | os.PathLike) -> None:
    spec = rows[(rows["config"] != BASELINE) & rows["accept_length"].notna()]
    fig, ax = plt.subplots(figsize=(7, 4))
    if len(spec):
        sns.barplot(
            data=spec,
            x="set",
            y="accept_length",
            hue="config",
            hue_order=_chain_order(spec["config"]),
            errorbar=_interval,
            capsize=0.1,
            ax=ax,
        )
    ax.set(xlabel="benchmark set", ylabel="acceptance length (tokens / verify step)")
    ax.set_ylim(bottom=0)  # a wide t interval on few requests must not suggest negatives
    ax.set_title("Acceptance length (95% interval over requests)")
    _save(fig, path)


def plot_positions(summary: pd.DataFrame, path: str | os.PathLike) -> None:
    long = build_positions(summary)
    fig, ax = plt.subplots(figsize=(7, 4))
    if len(long):
        sns.lineplot(
            data=long,
            x="position",
            y="rate",
            hue="config",
            hue_order=_chain_order(long["config"]),
            style="set",
            markers=True,
            ax=ax,
        )
    ax.set(xlabel="draft position", ylabel="accepted share of verify steps", ylim=(-0.02, 1.02))
    ax.set_title("Acceptance per draft position")
    _save(fig, path)


def plot_speedup(summary: pd.DataFrame, path: str | os.PathLike) -> None:
    spec = summary[(summary["config"] != BASELINE) & summary["speedup"].notna()]
    fig, ax = plt.subplots(figsize=(7, 4))
    if len(spec):
        sns.barplot(
            data=spec,
            x="set",
            y="speedup",
            hue="config",
            hue_order=_chain_order(spec["config"]),
            ax=ax,
        )
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set(xlabel="benchmark set", ylabel="speedup (tokens/s vs baseline)")
    ax.set_title("Speedup over greedy decoding without a drafter")
    _save(fig, path)


def write_plots(*, rows: list[str | os.PathLike], out_dir: str | os.PathLike) -> None:
    """Draw every plot in PLOTS as out_dir/<name>.png from the bench row files."""
    sns.set_theme(style="whitegrid")
    df = read_rows(rows)
    summary = build_summary(df)
    out = Path(out_dir)
    plot_acceptance(df, out / "acceptance_length.png")
    plot_positions(summary, out / "acceptance_by_position.png")
    plot_speedup(summary, out / "speedup.png")
