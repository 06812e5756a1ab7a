"""Report plots (matplotlib, seaborn's theme), drawn from the report tables so both agree.

acceptance.png  acceptance length per set and chain, one panel per engine: 95% bootstrap
                intervals where a bar has enough requests, its request count on top, and a
                reference line at 1.0 (no draft ever accepted)
positions.png   share of verify steps accepting each draft position (whole-number positions)
speedup.png     tokens/s over the same engine's baseline on the set (reference line at 1.0)
sweep.png       output tokens/s and ITL p50 against concurrent streams, per engine and chain
tuning.png      single-stream and peak tokens/s per tuning point, its status in the label
train.png       training loss, per-step accuracy and simulated acceptance length by step
variants.png    acceptance length per drafter variant: training's estimate and each engine's
                measurement (its request count on top), reference line at 1.0

Every panel (or the sweep's and tuning's title) names the engine and the device its rows name,
the one actually used. Sets keep their configured order; chains the baseline first, then
the others by size, each chain one colour in every panel under one legend beside the panels;
with several drafters benched, each drafter at each chain ("3-1-4 long") is one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on cluster nodes

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import MaxNLocator, ScalarFormatter  # noqa: E402

from specbuild.eagle.chain import BASELINE  # noqa: E402
from specbuild.infra.io import atomic_path  # noqa: E402

__all__ = [
    "plot_acceptance",
    "plot_positions",
    "plot_speedup",
    "plot_sweep",
    "plot_tuning",
    "plot_train",
    "plot_variants",
]

PANEL = (6.5, 4.2)  # inches per engine panel


def _save(fig, path: str | os.PathLike) -> None:
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def _panels(n: int, *, sharey: bool = True):
    sns.set_theme(style="whitegrid")
    fig, axes = plt.subplots(1, max(n, 1), figsize=(PANEL[0] * max(n, 1), PANEL[1]), sharey=sharey)
    return fig, list(axes) if n > 1 else [axes]


def _title(table: pd.DataFrame, engine: str) -> str:
    devices = sorted(set(table.loc[table["engine"] == engine, "device"].dropna()))
    return f"{engine} on {', '.join(devices)}" if devices else engine


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_xticks([])


def _colors(chains: pd.Series) -> dict[str, Any]:
    """One colour per chain, the same in every panel (chains in table order)."""
    names = list(dict.fromkeys(chains))
    return dict(zip(names, sns.color_palette(n_colors=len(names)), strict=True))


def _legend(axes, title: str) -> None:
    """One legend for all panels, right of the last one: never over a bar or its count."""
    seen = {}
    for ax in axes:
        seen |= dict(zip(*reversed(ax.get_legend_handles_labels()), strict=True))
        if ax.get_legend():
            ax.get_legend().remove()
    if seen:
        axes[-1].legend(seen.values(), seen.keys(), title=title, fontsize=8,
                        loc="upper left", bbox_to_anchor=(1.01, 1.0))  # fmt: skip


def _bars(
    ax,
    table: pd.DataFrame,
    value: str,
    colors: dict,
    *,
    lo: str | None = None,
    hi: str | None = None,
):
    """Grouped bars: sets on x (table order), one bar per chain; request counts on top."""
    sets = list(dict.fromkeys(table["set"]))
    chains = list(dict.fromkeys(table["chain"]))
    width = 0.8 / len(chains)
    for i, chain in enumerate(chains):
        part = table[table["chain"] == chain].set_index("set")
        xs = [s + (i - (len(chains) - 1) / 2) * width for s in range(len(sets))]
        ys = [_num(part[value].get(s)) for s in sets]
        ax.bar(xs, [0 if math.isnan(y) else y for y in ys], width, color=colors[chain], label=chain)
        if lo and hi:
            for x, y, s in zip(xs, ys, sets, strict=True):
                low, high = _num(part[lo].get(s)), _num(part[hi].get(s))
                if not math.isnan(low):
                    ax.errorbar(x, y, [[y - low], [high - y]], color="black", capsize=3, lw=1)
        for x, y, s in zip(xs, ys, sets, strict=True):
            n = _num(part["requests"].get(s))
            if not math.isnan(y) and not math.isnan(n):  # no count: training's estimate
                top = max(y, _num(part[hi].get(s)) if hi else y)
                ax.annotate(
                    f"n={int(n)}",
                    (x, 0 if math.isnan(top) else top),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    xytext=(0, 4),
                    textcoords="offset points",
                )
    ax.set_xticks(range(len(sets)), sets)
    ax.grid(axis="x", visible=False)


def _headroom(axes, *columns: pd.Series) -> None:
    """y from 0 to 1.15 x the highest value (at least 1.0): room for the request counts."""
    values = [_num(v) for col in columns for v in col]
    top = max([v for v in values if not math.isnan(v)] + [1.0])
    for ax in axes:
        ax.set_ylim(0, 1.15 * top)


def _by_drafter(table: pd.DataFrame) -> pd.DataFrame:
    """`chain` labelled with its drafter ("3-1-4 long") where several drafters were benched,
    so each (drafter, chain) is its own bar, line and colour; as is with one drafter."""
    drafted = table["chain"] != BASELINE
    if table.loc[drafted, "drafter"].nunique() <= 1:
        return table
    label = table["chain"].where(~drafted, table["chain"] + " " + table["drafter"])
    return table.assign(chain=label)


def _num(v: Any) -> float:
    return float("nan") if v is None or pd.isna(v) else float(v)


def plot_acceptance(bench: pd.DataFrame, path: str | os.PathLike) -> None:
    bench = _by_drafter(bench)
    spec = bench[(bench["chain"] != BASELINE) & bench["accept_length"].notna()]
    engines = list(dict.fromkeys(spec["engine"]))
    fig, axes = _panels(len(engines))
    colors = _colors(spec["chain"])
    for ax, engine in zip(axes, engines, strict=False):
        part = spec[spec["engine"] == engine]
        _bars(ax, part, "accept_length", colors, lo="accept_length_lo", hi="accept_length_hi")
        ax.set_title(_title(bench, engine), fontsize=10)
    if not engines:
        _empty(axes[0], "no engine reported verify steps of a drafted chain")
    _headroom(axes, spec["accept_length"], spec["accept_length_hi"])
    for ax in axes:
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set(xlabel="benchmark set")
    _legend(axes, "chain")
    axes[0].set_ylabel("Σ tokens / Σ verify steps")
    fig.suptitle("Acceptance length (95% interval where n ≥ 5)")
    _save(fig, path)


def plot_positions(positions: pd.DataFrame, bench: pd.DataFrame, path: str | os.PathLike) -> None:
    positions, bench = _by_drafter(positions), _by_drafter(bench)
    engines = list(dict.fromkeys(positions["engine"]))
    fig, axes = _panels(len(engines))
    colors = _colors(positions["chain"])
    # each set with its request count, as in the bar plots
    n = {(r.engine, r.set): r.requests for r in bench[bench["chain"] != BASELINE].itertuples()}
    for ax, engine in zip(axes, engines, strict=False):
        part = positions[positions["engine"] == engine].copy()
        part["set"] = [f"{s} (n={n[engine, s]})" for s in part["set"]]
        sns.lineplot(
            data=part,
            x="position",
            y="rate",
            hue="chain",
            style="set",
            markers=True,
            palette=colors,
            hue_order=list(dict.fromkeys(part["chain"])),
            style_order=list(dict.fromkeys(part["set"])),
            ax=ax,
        )
        ax.set_title(_title(bench, engine), fontsize=10)
    if not engines:
        _empty(axes[0], "no engine reports acceptance per draft position (the hf engine does)")
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(xlabel="draft position", ylim=(-0.02, 1.02))
    _legend(axes, "")
    axes[0].set_ylabel("accepted share of verify steps")
    fig.suptitle("Acceptance per draft position")
    _save(fig, path)


def plot_speedup(bench: pd.DataFrame, path: str | os.PathLike) -> None:
    bench = _by_drafter(bench)
    spec = bench[(bench["chain"] != BASELINE) & bench["speedup"].notna()]
    engines = list(dict.fromkeys(spec["engine"]))
    fig, axes = _panels(len(engines))
    colors = _colors(spec["chain"])
    for ax, engine in zip(axes, engines, strict=False):
        _bars(ax, spec[spec["engine"] == engine], "speedup", colors)
        ax.set_title(_title(bench, engine), fontsize=10)
    if not engines:
        _empty(axes[0], "no drafted chain with a baseline on the same engine")
    _headroom(axes, spec["speedup"])
    for ax in axes:
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set(xlabel="benchmark set")
    _legend(axes, "chain")
    axes[0].set_ylabel("speedup (tokens/s vs the baseline)")
    fig.suptitle("Speedup over the same engine without a drafter")
    _save(fig, path)


def plot_sweep(sweep: pd.DataFrame, path: str | os.PathLike) -> None:
    sweep = _by_drafter(sweep)
    data = sweep.assign(
        line=sweep["engine"] + " " + sweep["chain"], itl_ms=sweep["itl_s_p50"] * 1e3
    )
    fig, axes = _panels(2, sharey=False)
    for ax, value, label in (
        (axes[0], "output_tokens_per_s", "output tokens/s"),
        (axes[1], "itl_ms", "ITL p50 (ms)"),
    ):
        sns.lineplot(data=data, x="concurrency", y=value, hue="line", marker="o", ax=ax)
        ax.set_xscale("log", base=2)
        levels = sorted(set(data["concurrency"]))
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set(xlabel="concurrent streams", ylabel=label, ylim=(0, None))
        ax.legend(title="engine, chain", fontsize=8)
    n = int(data["requests"].min())
    devices = ", ".join(f"{_title(data, e)}" for e in dict.fromkeys(data["engine"]))
    fig.suptitle(f"Concurrency sweep, {devices} ({n}+ requests per level)")
    _save(fig, path)


def plot_tuning(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> None:
    metrics = {
        "single_stream_tokens_per_s": "single stream",
        "peak_output_tokens_per_s": "peak output (at concurrency c)",
    }
    labels = [r["point"] if r["status"] == "ok" else f"{r['point']} ({r['status']})" for r in rows]
    sns.set_theme(style="whitegrid")
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.5 * len(rows) + 2), squeeze=False)
    for ax, (metric, title) in zip(axes[0], metrics.items(), strict=True):
        bars = ax.barh(labels, [r[metric] or 0.0 for r in rows], color="#4c72b0")
        if metric.startswith("peak"):
            counts = [f"c={r['peak_concurrency']}" if r[metric] else "" for r in rows]
            ax.bar_label(bars, counts, fontsize=8, padding=3)
        ax.invert_yaxis()
        ax.set(title=title, xlabel="tokens/s")
    devices = sorted({r["device"] for r in rows if r.get("device")})
    fig.suptitle("Server tuning points" + (f" on {', '.join(devices)}" if devices else ""))
    _save(fig, path)


def plot_train(evals: pd.DataFrame, loss: pd.DataFrame, path: str | os.PathLike) -> None:
    """`evals`: step, eval_loss, acc_<k>..., acceptance_length; `loss`: step, loss (may be
    empty: no TensorBoard events)."""
    fig, axes = _panels(3, sharey=False)
    if len(loss):
        axes[0].plot(loss["step"], loss["loss"], lw=1, label="train (progress lines)")
    axes[0].plot(evals["step"], evals["eval_loss"], "o-", label="eval")
    # log scale: the first steps' loss is several times the rest and would flatten the curve
    axes[0].set(title="loss (log scale)", xlabel="optimizer step", ylabel="loss", yscale="log")
    # plain numbers on the log axis (matplotlib's default writes 6x10^1 beside 2x10^1)
    axes[0].yaxis.set_major_formatter(ScalarFormatter())
    axes[0].yaxis.set_minor_formatter(ScalarFormatter())
    axes[0].legend(fontsize=8)
    for col in [c for c in evals.columns if c.startswith("acc_")]:
        axes[1].plot(evals["step"], evals[col], "o-", label=f"step {col[4:]}")
    axes[1].set(title="accuracy per TTT step (eval)", xlabel="optimizer step", ylim=(0, 1))
    axes[1].legend(fontsize=8)
    axes[2].plot(evals["step"], evals["acceptance_length"], "o-")
    axes[2].axhline(1.0, color="black", lw=0.8, ls="--")
    axes[2].set(title="simulated acceptance length (eval)", xlabel="optimizer step", ylim=(0, None))
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _save(fig, path)


def plot_variants(bars: pd.DataFrame, path: str | os.PathLike) -> None:
    """`bars` (`variants.variant_bars`): variant, bar, accept_length, requests. Variants on x
    in config order (base first), one colour per bar label."""
    table = bars.rename(columns={"variant": "set", "bar": "chain"})
    fig, axes = _panels(1)
    fig.set_size_inches(max(PANEL[0], 0.45 * len(table) + 2), PANEL[1])  # ~0.45 in a bar
    _bars(axes[0], table, "accept_length", _colors(table["chain"]))
    _headroom(axes, table["accept_length"])
    axes[0].axhline(1.0, color="black", lw=0.8, ls="--")  # 1.0: no draft token accepted
    axes[0].set(xlabel="variant", ylabel="Σ tokens / Σ verify steps")
    _legend(axes, "")
    fig.suptitle("Drafter variants: simulated and measured acceptance length")
    _save(fig, path)
