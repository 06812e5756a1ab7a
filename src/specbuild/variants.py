"""Stage `variants`: one table and one plot comparing every drafter variant of the build.

Every variant (`train.variants`, plus `base`, the recipe of `train` itself) trains on hidden
states of the same shards with the same draft vocabulary; only training keys (and, through
`train.datasets`, which shards, with a vocabulary counted on those) differ, so this is the
cheap search a build system makes possible: the shards are the expensive part and are shared.

    results/train/<variant>/metrics.jsonl (each variant's eval rows)
    results/bench/<engine>/<variant>/<chain>.jsonl (each benched variant's rows, hf and sglang)
    results/vocab/[<variant>/]vocab_stats.json (the coverage of each variant's vocabulary)
      -> results/tables/variants.{csv,md,html}: per variant the keys it changes, the datasets
         it trained on, the share of their target tokens its draft vocabulary holds
         (`vocab coverage`), the best eval row's simulated acceptance length (at its ttt_steps and
         at each benched chain) and per-position accuracies, its step, epoch and trained
         tokens, the run's training tokens/s at that row; then per engine, set and chain the
         measured acceptance length (Σcompletion/Σverify over the set's requests, both turns:
         `bench.metrics`), its request count ("... n") and, where the engine reports it (hf),
         acceptance per draft position
      -> results/plots/variants.png: simulated and measured acceptance length by variant
         (`report.plots.plot_variants`, the report's plot style)

The simulated acceptance length is training's own estimate (1 + sum over k of the product of
per-position accuracies up to k, on its eval samples); the bench measures the served one.
A variant left out of bench.variants has empty measured columns.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from specbuild.eagle.chain import BASELINE, Chain
from specbuild.infra.io import read_json, read_jsonl
from specbuild.report.plots import plot_variants
from specbuild.report.tables import build_bench, read_rows, simulated_accept_length, write_table

__all__ = ["SIMULATED", "variant_table", "variant_bars", "write_variants"]

SIMULATED = "simulated acceptance length"  # training's estimate at the variant's ttt_steps
REQUESTS = " n"  # suffix of a measured column's request count
# the share of a variant's loss-masked training tokens that have a draft id
VOCAB_COVERAGE = "vocab coverage"


def _best_row(path: str | os.PathLike) -> dict:
    rows = list(read_jsonl(path))
    if not rows:
        raise ValueError(f"{path}: no eval rows; did training evaluate at all?")
    return max(rows, key=lambda r: r["acceptance_length"])


def _changes(changes: Mapping) -> str:
    if not changes:
        return "(the train recipe)"
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in changes.items())


def _simulated(chain: str) -> str:
    return f"simulated {chain}"


def _label(engine: str, set_name: str, chain: str) -> str:
    return f"{engine} {set_name} {chain}"


def _measured(rows: Sequence[str | os.PathLike], set_order: Sequence[str]) -> pd.DataFrame:
    """The bench table (`report.tables.build_bench`) of the variants' drafted rows that count
    verify steps."""
    if not rows:
        return pd.DataFrame(columns=["engine", "set", "chain", "drafter", "accept_length"])
    bench = build_bench(read_rows(rows), set_order)
    return bench[(bench["chain"] != BASELINE) & bench["accept_length"].notna()]


def variant_table(
    metrics: Mapping[str, str | os.PathLike],
    changes: Mapping[str, Mapping],
    *,
    datasets: Mapping[str, Sequence[str]] | None = None,
    vocab: Mapping[str, str | os.PathLike] | None = None,
    rows: Sequence[str | os.PathLike] = (),
    set_order: Sequence[str] = (),
) -> pd.DataFrame:
    """One row per variant, in `metrics` order (base first): training's best eval row and the
    acceptance each engine measured on each set at each chain (`rows`, the bench row files of
    the benched variants); with `vocab` (each variant's vocab_stats.json), the share of its
    training tokens its draft vocabulary holds."""
    measured = _measured(rows, set_order)
    chains = list(dict.fromkeys(measured["chain"]))
    keys = zip(measured["engine"], measured["set"], measured["chain"], strict=True)
    groups = list(dict.fromkeys(keys))
    # per-position columns only where the engine reported positions (hf; sglang does not)
    reported = [c for c in measured.columns if c.startswith("accept_pos")]
    by_key = measured.set_index(["engine", "set", "chain"]).sort_index()
    positions = {key: [c for c in reported if by_key.loc[[key], c].notna().any()] for key in groups}
    table = []
    for name, path in metrics.items():
        best = _best_row(path)
        row = {"variant": name, "changes": _changes(changes.get(name, {}))}
        if datasets is not None:
            row["datasets"] = ", ".join(datasets[name])
        if vocab is not None:
            row[VOCAB_COVERAGE] = read_json(vocab[name])["coverage"]
        row[SIMULATED] = best["acceptance_length"]
        row |= {_simulated(c): simulated_accept_length(best, Chain.parse(c).steps) for c in chains}
        row |= {f"acc {k}": acc for k, acc in enumerate(best["acc"], 1)}
        row |= {
            "best step": best["step"],
            "epoch": best["epoch"],
            "trained tokens": best["tokens"],
            "training tokens_per_s": best.get("tokens_per_s"),
        }
        mine = measured[measured["drafter"] == name].set_index(["engine", "set", "chain"])
        for key in groups:
            label = _label(*key)
            found = mine.loc[key] if key in mine.index else None
            row[label] = None if found is None else found["accept_length"]
            row[label + REQUESTS] = None if found is None else found["requests"]
            for col in positions[key]:
                rate = None if found is None else found[col]
                row[f"{label} pos{col.removeprefix('accept_pos')}"] = rate
        table.append(row)
    return pd.DataFrame(table)


def variant_bars(
    metrics: Mapping[str, str | os.PathLike],
    *,
    rows: Sequence[str | os.PathLike] = (),
    set_order: Sequence[str] = (),
) -> pd.DataFrame:
    """What the plot draws, one row a bar: `variant`, `bar` (training's estimate at each benched
    chain, or at its ttt_steps when nothing was benched; then each engine, set and chain
    measured), `accept_length` and `requests` (none for training's estimate). Built from the
    same eval rows and bench rows as `variant_table`, labelled as its columns are."""
    measured = _measured(rows, set_order)
    measured = measured[measured["drafter"].isin(list(metrics))]
    chains = list(dict.fromkeys(measured["chain"]))
    bars = []
    for name, path in metrics.items():
        best = _best_row(path)
        estimates = {
            _simulated(c): simulated_accept_length(best, Chain.parse(c).steps) for c in chains
        }
        for label, value in (estimates or {SIMULATED: best["acceptance_length"]}).items():
            bars.append({"variant": name, "bar": label, "accept_length": value, "requests": None})
    bars += [
        {
            "variant": r["drafter"],
            "bar": _label(r["engine"], r["set"], r["chain"]),
            "accept_length": r["accept_length"],
            "requests": r["requests"],
        }
        for r in measured.to_dict("records")
    ]
    return pd.DataFrame(bars, columns=["variant", "bar", "accept_length", "requests"])


def write_variants(
    *,
    metrics: Mapping[str, str | os.PathLike],
    changes: Mapping[str, Mapping],
    table: str | os.PathLike,
    plot: str | os.PathLike,
    datasets: Mapping[str, Sequence[str]] | None = None,
    vocab: Mapping[str, str | os.PathLike] | None = None,
    rows: Sequence[str | os.PathLike] = (),
    set_order: Sequence[str] = (),
) -> pd.DataFrame:
    """The table (`table` is its .md; .csv and .html beside it) and the plot."""
    df = variant_table(
        metrics, changes, datasets=datasets, vocab=vocab, rows=rows, set_order=set_order
    )
    write_table(df, Path(table).with_suffix(""))
    plot_variants(variant_bars(metrics, rows=rows, set_order=set_order), plot)
    return df
