"""Report tables: each as .csv (full precision), .md and .html (4 significant digits), and the
bench tables built from the per-request rows (schema: `specbuild.bench.rows`).

Every number comes from `specbuild.bench.metrics`, group by group, and the plots draw these
tables, so tables and figures agree:

  bench           one line per engine, set, chain and drafter: acceptance length with its
                  interval, acceptance per draft position, tokens/s, speedup over the same
                  engine's baseline on the set, decode ms per target step and the break-even
                  acceptance length (a verify cycle's cost in baseline steps)
  positions       the per-position acceptance in long form
  latency         TTFT and ITL mean, p50, p90, p99 per engine, set, chain and drafter
  sweep           per engine, chain, drafter and concurrency: output tokens/s, acceptance,
                  latencies
  train_vs_bench  the base recipe's measured acceptance length beside training's simulated one
                  (every variant's: specbuild.variants)

Lines are ordered by engine and set as configured, chain (the baseline first, then by size),
then drafter as benched (bench.variants, then bench.drafters).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from specbuild.bench.metrics import (
    acceptance_length,
    break_even,
    output_throughput,
    paired_ratio_interval,
    speedup,
    summarize,
)
from specbuild.bench.rows import check_rows
from specbuild.eagle.chain import BASELINE, Chain, chain_order, simulated_acceptance_length
from specbuild.infra.io import atomic_open, read_jsonl

__all__ = [
    "GROUP_KEYS",
    "read_rows",
    "build_bench",
    "build_positions",
    "build_latency",
    "build_sweep",
    "best_train_row",
    "simulated_accept_length",
    "build_train_vs_bench",
    "build_peers",
    "format_number",
    "format_cell",
    "to_markdown",
    "write_table",
    "output_folders",
    "check_written",
]

GROUP_KEYS = ["engine", "set", "chain", "drafter"]
LATENCY_COLUMNS = [f"{m}_{s}" for m in ("ttft_s", "itl_s") for s in ("mean", "p50", "p90", "p99")]


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


def _ordered(df: pd.DataFrame, set_order: Sequence[str] | None = None) -> pd.DataFrame:
    """Engines in order of appearance, sets in `set_order`, chains baseline first, drafters
    in order of appearance (the row files' order)."""
    keys = {
        "engine": list(dict.fromkeys(df["engine"])),
        "set": list(set_order or dict.fromkeys(df["set"])),
        "chain": chain_order(df["chain"]),
        "drafter": list(dict.fromkeys(df["drafter"])),
    }
    order = [k for k in keys if k in df.columns]
    cat = df.assign(**{k: pd.Categorical(df[k], keys[k], ordered=True) for k in order})
    out = cat.sort_values(order, kind="stable")
    return out.assign(**{k: out[k].astype(str) for k in order}).reset_index(drop=True)


def _groups(rows: pd.DataFrame, keys: list[str]):
    for key, g in rows.groupby(keys, sort=False):
        yield dict(zip(keys, key, strict=True)), g.to_dict("records")


def build_bench(rows: pd.DataFrame, set_order: Sequence[str] | None = None) -> pd.DataFrame:
    """Phase-bench rows per engine, set, chain and drafter, with the speedup over that
    engine's baseline on the set (none without one)."""
    out = []
    for key, group in _groups(rows[rows["phase"] == "bench"], GROUP_KEYS):
        out.append(key | {"device": group[0]["device"]} | summarize(group))
    table = pd.DataFrame(out)
    base = table[table["chain"] == BASELINE].set_index(["engine", "set"])
    table["speedup"] = [
        speedup(r.tokens_per_s, base["tokens_per_s"].get((r.engine, r.set)))
        for r in table.itertuples()
    ]
    table["break_even"] = [
        break_even(r.step_ms, base["step_ms"].get((r.engine, r.set))) for r in table.itertuples()
    ]
    pos = sorted((c for c in table if c.startswith("accept_pos")), key=lambda c: int(c[10:]))
    lead = GROUP_KEYS + ["device", "requests", "completion_tokens", "verify_steps"]
    lead += ["accept_length", "accept_length_lo", "accept_length_hi"]
    tail = ["tokens_per_s", "speedup", "step_ms", "break_even"]
    return _ordered(table[lead + pos + tail], set_order)


def build_positions(bench: pd.DataFrame) -> pd.DataFrame:
    """Long form of the per-position acceptance: engine, set, chain, drafter, position, rate."""
    cols = [c for c in bench.columns if c.startswith("accept_pos")]
    long = bench.melt(id_vars=GROUP_KEYS, value_vars=cols, var_name="position", value_name="rate")
    long = long.dropna(subset=["rate"])
    long["position"] = long["position"].str.removeprefix("accept_pos").astype(int)
    order = {k: i for i, k in enumerate(zip(*(bench[k] for k in GROUP_KEYS), strict=True))}
    long["_order"] = [order[k] for k in zip(*(long[c] for c in GROUP_KEYS), strict=True)]
    return long.sort_values(["_order", "position"]).drop(columns="_order").reset_index(drop=True)


def build_latency(rows: pd.DataFrame, set_order: Sequence[str] | None = None) -> pd.DataFrame:
    """TTFT and ITL statistics of the phase-bench requests per engine, set, chain and
    drafter."""
    out = [
        key | {"requests": len(group)} | {k: summarize(group)[k] for k in LATENCY_COLUMNS}
        for key, group in _groups(rows[rows["phase"] == "bench"], GROUP_KEYS)
    ]
    return _ordered(pd.DataFrame(out), set_order)


def build_sweep(rows: pd.DataFrame) -> pd.DataFrame:
    """Per engine, chain, drafter and concurrency level: output throughput and the requests'
    numbers."""
    keys = ["engine", "chain", "drafter", "concurrency"]
    out = []
    for key, group in _groups(rows[rows["phase"] == "sweep"], keys):
        s = summarize(group)
        out.append(
            key
            | {"device": group[0]["device"]}
            | {k: s[k] for k in ("requests", "completion_tokens")}
            | {"output_tokens_per_s": output_throughput(group), "accept_length": s["accept_length"]}
            | {k: s[k] for k in LATENCY_COLUMNS}
        )
    return pd.DataFrame(out)  # rows come per engine, chain (baseline first) and level


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
    return simulated_acceptance_length(acc[:steps] + [acc[-1]] * max(0, steps - len(acc)))


def build_train_vs_bench(
    bench: pd.DataFrame, train_row: dict, drafter: str | None = None
) -> pd.DataFrame:
    """Measured acceptance length per engine, set and chain beside training's simulated one,
    of the rows of `drafter` (the drafter `train_row` trained; None: every drafter's)."""
    spec = bench[(bench["chain"] != BASELINE) & bench["accept_length"].notna()]
    if drafter is not None:
        spec = spec[spec["drafter"] == drafter]
    cols = GROUP_KEYS + ["requests", "accept_length", "accept_length_lo", "accept_length_hi"]
    out = spec[cols].copy().reset_index(drop=True)
    out["simulated_accept_length"] = [
        simulated_accept_length(train_row, Chain.parse(c).steps) for c in out["chain"]
    ]
    out["train_step"] = train_row.get("step")
    return out


PAIR_KEYS = ["prompt_id", "turn"]  # one request of a set, whichever drafter served it


def _accept_length(rows: pd.DataFrame, chain: str) -> float | None:
    return acceptance_length(rows["completion_tokens"].sum(), rows["verify_steps"].sum(), chain)


def build_peers(
    rows: pd.DataFrame, peers: Sequence[str], set_order: Sequence[str] | None = None
) -> pd.DataFrame:
    """Each of our drafters against each drafter built elsewhere (`peers`, bench.drafters'
    names), per engine, set and chain, on the requests both served: acceptance of each and
    ours / theirs with a paired 95% interval (requests resampled together, so a prompt easy
    for both cancels). Ours wins a set where the interval's low bound is at or above 1."""
    spec = rows[(rows["phase"] == "bench") & (rows["chain"] != BASELINE)]
    out = []
    for key, group in spec.groupby(["engine", "set", "chain"], sort=False):
        chain = key[2]
        by_drafter = {d: g.set_index(PAIR_KEYS) for d, g in group.groupby("drafter", sort=False)}
        ours = [d for d in by_drafter if d not in peers]
        for peer in (p for p in peers if p in by_drafter):
            theirs = by_drafter[peer]
            for drafter in ours:
                mine = by_drafter[drafter]
                both = mine.index.intersection(theirs.index)
                a, b = theirs.loc[both], mine.loc[both]
                served = (a["verify_steps"] > 0) & (b["verify_steps"] > 0)
                a, b = a[served], b[served]
                if not len(a):
                    continue
                ratio, lo, hi = paired_ratio_interval(
                    a["completion_tokens"], a["verify_steps"],
                    b["completion_tokens"], b["verify_steps"],
                )  # fmt: skip
                out.append(
                    dict(zip(["engine", "set", "chain"], key, strict=True))
                    | {"drafter": drafter, "peer": peer, "requests": len(a)}
                    | {"accept_length": _accept_length(b, chain)}
                    | {"peer_accept_length": _accept_length(a, chain)}
                    | {"ours_over_peer": ratio, "ratio_lo": lo, "ratio_hi": hi}
                )
    if not out:
        return pd.DataFrame(columns=[*GROUP_KEYS, "peer", "requests", "ours_over_peer"])
    return _ordered(pd.DataFrame(out), set_order)


def format_number(x: float) -> str:
    """4 significant digits; no exponent below 10^9 (1.806e+04 tokens reads badly)."""
    return format(x, ".4g") if abs(x) < 1e4 or abs(x) >= 1e9 else format(x, ".0f")


def format_cell(value) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return format_number(value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def _whole(df: pd.DataFrame) -> pd.DataFrame:
    """Float columns of whole numbers only (counts beside missing values) as integers."""
    out = df.copy()
    for c in out.columns:
        col = out[c]
        if pd.api.types.is_float_dtype(col) and col.notna().any() and (col.dropna() % 1 == 0).all():
            out[c] = col.astype("Int64")
    return out


def to_markdown(df: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (numbers right-aligned), without extra dependencies."""
    header = "| " + " | ".join(map(str, df.columns)) + " |"
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in df.columns]
    align = "|" + "|".join("---:" if n else ":---" for n in numeric) + "|"
    body = [
        "| " + " | ".join(format_cell(v) for v in row) + " |" for row in df.itertuples(index=False)
    ]
    return "\n".join([header, align, *body]) + "\n"


def write_table(df: pd.DataFrame, stem: str | os.PathLike) -> None:
    """`df` as <stem>.csv, .md and .html, each written atomically."""
    stem, df = Path(stem), _whole(df)
    with atomic_open(stem.with_suffix(".csv")) as fh:
        df.to_csv(fh, index=False, float_format="%.6g")
    with atomic_open(stem.with_suffix(".md")) as fh:
        fh.write(to_markdown(df))
    with atomic_open(stem.with_suffix(".html")) as fh:
        fh.write(df.to_html(index=False, float_format=format_number, na_rep=""))


def output_folders(outputs: Sequence[str | os.PathLike]) -> tuple[Path, Path | None]:
    """The folders of a report rule's declared tables (.html) and plots (.png, if any)."""
    folders = {Path(p).suffix: Path(p).parent for p in outputs}
    return folders[".html"], folders.get(".png")


def check_written(outputs: Sequence[str | os.PathLike]) -> None:
    """Raise naming every declared output that was not written (the rule and the data disagree:
    say, a sweep declared for a served engine whose rows hold no sweep)."""
    missing = [str(p) for p in outputs if not Path(p).exists()]
    if missing:
        raise RuntimeError(f"report outputs not written (no data for them): {missing}")
