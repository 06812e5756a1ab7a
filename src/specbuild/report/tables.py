"""Bench tables: per-request rows (schema in `specbuild.bench.specdec`) to set x config x drafter.

Every number is computed here once and read by the plots, so the tables and the figures agree:

  accept_length        mean over requests of tokens per verify step, with a Student-t 95%
                       interval (accept_length_lo / _hi); requests without a verify step
                       (EOS straight from prefill) carry no acceptance length and are left out
  accept_pos{k}        share of verify steps that accepted draft position k (1-based); chain
                       drafting makes it non-increasing in k
  tokens_per_s         sum of completion tokens / sum of wall time over the group's requests
  speedup              tokens_per_s / the baseline's tokens_per_s on the same set and backend

Rows from any backend ("hf", "sglang") share these tables; an unknown set is just a new row.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from specbuild.bench.specdec import BASELINE, check_rows
from specbuild.io import atomic_open, read_jsonl

__all__ = [
    "GROUP_KEYS",
    "TABLES",
    "t_quantile_975",
    "mean_ci",
    "read_rows",
    "build_summary",
    "build_positions",
    "simulated_accept_length",
    "build_train_vs_bench",
    "best_train_row",
    "to_markdown",
    "write_tables",
]

GROUP_KEYS = ["set", "config", "drafter", "backend"]
# File stems written by write_tables (each as .csv, .md and .html), in report order.
TABLES = ("bench", "positions", "train_vs_bench")
# Two-sided 95% Student-t quantiles for 1..30 degrees of freedom; beyond 30 a Cornish-Fisher
# expansion around the normal quantile is exact to 1e-4, without a scipy dependency.
_T975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
_Z975 = 1.959964


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def mean_ci(values: Iterable[float]) -> tuple[float, float, float]:
    """(mean, low, high) of a Student-t 95% interval; one value gives a zero-width interval."""
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not xs:
        return (math.nan, math.nan, math.nan)
    n = len(xs)
    mean = sum(xs) / n
    if n == 1:
        return (mean, mean, mean)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile_975(n - 1) * sd / math.sqrt(n)
    return (mean, mean - half, mean + half)


def read_rows(paths: Sequence[str | os.PathLike]) -> pd.DataFrame:
    """All bench rows of the given JSONL files, checked against the row schema."""
    rows: list[dict] = []
    for path in paths:
        found = list(read_jsonl(path))
        check_rows(found, source=str(path))
        rows += found
    if not rows:
        raise ValueError(f"no bench rows in {[str(p) for p in paths]}")
    return pd.DataFrame(rows)


def _position_rates(group: pd.DataFrame) -> list[float]:
    """Per draft position: accepted count / verify steps, summed over the group's requests."""
    steps = int(group["verify_steps"].sum())
    lists = [list(v) for v in group["accepted_per_position"] if len(v)]
    if not lists or steps == 0:
        return []
    width = max(len(v) for v in lists)
    totals = [sum(v[k] for v in lists if k < len(v)) for k in range(width)]
    return [t / steps for t in totals]


def build_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (set, config, drafter, backend), with speedup against that set's baseline."""
    out = []
    for key, g in rows.groupby(GROUP_KEYS, sort=True):
        mean, lo, hi = mean_ci(g["accept_length"].dropna())
        wall = float(g["wall_s"].sum())
        tokens = int(g["completion_tokens"].sum())
        rec = dict(zip(GROUP_KEYS, key, strict=True))
        rec |= {
            "requests": len(g),
            "completion_tokens": tokens,
            "verify_steps": int(g["verify_steps"].sum()),
            "accept_length": mean,
            "accept_length_lo": lo,
            "accept_length_hi": hi,
            "tokens_per_s": tokens / wall if wall > 0 else math.nan,
        }
        for k, rate in enumerate(_position_rates(g), 1):
            rec[f"accept_pos{k}"] = rate
        out.append(rec)
    summary = pd.DataFrame(out)
    base = summary[summary["config"] == BASELINE].set_index(["set", "backend"])["tokens_per_s"]
    summary["speedup"] = [
        r.tokens_per_s / base[(r.set, r.backend)] if (r.set, r.backend) in base.index else math.nan
        for r in summary.itertuples()
    ]
    pos_cols = sorted(
        (c for c in summary.columns if c.startswith("accept_pos")), key=lambda c: int(c[10:])
    )
    lead = GROUP_KEYS + ["requests", "completion_tokens", "verify_steps"]
    lead += ["accept_length", "accept_length_lo", "accept_length_hi"]
    return summary[lead + pos_cols + ["tokens_per_s", "speedup"]]


def build_positions(summary: pd.DataFrame) -> pd.DataFrame:
    """Long form of the per-position acceptance: set, config, drafter, backend, position, rate."""
    cols = [c for c in summary.columns if c.startswith("accept_pos")]
    long = summary.melt(id_vars=GROUP_KEYS, value_vars=cols, var_name="position", value_name="rate")
    long = long.dropna(subset=["rate"])
    long["position"] = long["position"].str.removeprefix("accept_pos").astype(int)
    return long.sort_values(GROUP_KEYS + ["position"]).reset_index(drop=True)


def best_train_row(metrics_path: str | os.PathLike) -> dict:
    """The eval row of the exported (best) checkpoint: the highest simulated acceptance length."""
    rows = [r for r in read_jsonl(metrics_path) if "acceptance_length" in r]
    if not rows:
        raise ValueError(f"{metrics_path}: no eval row with 'acceptance_length'")
    return max(rows, key=lambda r: r["acceptance_length"])


def simulated_accept_length(train_row: dict, steps: int) -> float:
    """Training's simulated acceptance length for a chain of `steps` drafts.

    With per-position accuracies acc_i it is 1 + sum_k prod_{i<=k} acc_i over the first
    `steps` positions; positions beyond those trained reuse the last accuracy (an estimate).
    """
    acc = [float(a) for a in train_row.get("acc") or []]
    if not acc:
        return float(train_row["acceptance_length"])
    acc = acc[:steps] + [acc[-1]] * max(0, steps - len(acc))
    total, run = 1.0, 1.0
    for a in acc:
        run *= a
        total += run
    return total


def build_train_vs_bench(summary: pd.DataFrame, train_row: dict | None) -> pd.DataFrame:
    """Measured acceptance length per (set, chain) beside training's simulated one."""
    spec = summary[summary["config"] != BASELINE]
    cols = GROUP_KEYS + ["accept_length", "accept_length_lo", "accept_length_hi"]
    out = spec[cols].copy().reset_index(drop=True)
    steps = [int(c.split("-")[0]) for c in out["config"]]
    out["simulated_accept_length"] = [
        simulated_accept_length(train_row, s) if train_row else math.nan for s in steps
    ]
    out["train_step"] = train_row.get("step") if train_row else None
    return out


def _cell(value, floatfmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return format(value, floatfmt)
    return str(value).replace("|", "\\|")


def to_markdown(df: pd.DataFrame, floatfmt: str = ".3f") -> str:
    """A GitHub-flavoured Markdown table (numbers right-aligned), without extra dependencies."""
    header = "| " + " | ".join(map(str, df.columns)) + " |"
    align = (
        "|"
        + "|".join("---:" if pd.api.types.is_numeric_dtype(df[c]) else ":---" for c in df.columns)
        + "|"
    )
    body = [
        "| " + " | ".join(_cell(v, floatfmt) for v in row) + " |"
        for row in df.itertuples(index=False)
    ]
    return "\n".join([header, align, *body]) + "\n"


def _write(df: pd.DataFrame, stem: Path) -> None:
    with atomic_open(stem.with_suffix(".csv")) as fh:
        df.to_csv(fh, index=False, float_format="%.6g")
    with atomic_open(stem.with_suffix(".md")) as fh:
        fh.write(to_markdown(df))
    with atomic_open(stem.with_suffix(".html")) as fh:
        fh.write(df.to_html(index=False, float_format=lambda x: f"{x:.3f}", na_rep=""))


def write_tables(
    *,
    rows: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    train_metrics: str | os.PathLike | None = None,
) -> dict[str, pd.DataFrame]:
    """Write bench, positions and train_vs_bench tables as .csv, .md and .html under out_dir."""
    summary = build_summary(read_rows(rows))
    train_row = best_train_row(train_metrics) if train_metrics else None
    tables = {
        "bench": summary,
        "positions": build_positions(summary),
        "train_vs_bench": build_train_vs_bench(summary, train_row),
    }
    for name, df in tables.items():
        _write(df, Path(out_dir) / name)
    return tables
