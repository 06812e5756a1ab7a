"""Stage variants: one table and one plot comparing every drafter variant, from synthetic
metrics and bench rows whose numbers check by hand."""

from __future__ import annotations

import json

import pandas as pd
from bench_cases import row, write_rows


def test_the_variants_table_takes_each_variants_best_eval_row_and_names_its_changes(tmp_path):
    from specbuild.variants import write_variants

    metrics = {}
    for name, accs in {"base": [0.3, 0.5], "long": [0.6, 0.4]}.items():
        rows = [
            {
                "step": 10 * i,
                "epoch": i,
                "tokens": 100 * i,
                "acc": [a, a / 2],
                "acceptance_length": 1 + a + a * a / 2,
                "tokens_per_s": 50.0,
            }
            for i, a in enumerate(accs, 1)
        ]
        metrics[name] = tmp_path / f"{name}.jsonl"
        metrics[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    vocab = {"base": tmp_path / "shared.json", "long": tmp_path / "own.json"}
    vocab["base"].write_text(json.dumps({"coverage": 0.98}))
    vocab["long"].write_text(json.dumps({"coverage": 1.0}))
    table = write_variants(
        metrics=metrics,
        changes={"long": {"epochs": 12, "init": "target_last_layer"}},
        vocab=vocab,
        table=tmp_path / "variants.md",
        plot=tmp_path / "variants.png",
    )
    assert list(table["variant"]) == ["base", "long"]
    assert list(table["vocab coverage"]) == [0.98, 1.0]
    assert list(table["best step"]) == [20, 10]  # each variant's own best row
    assert table.loc[1, "changes"] == 'epochs=12, init="target_last_layer"'
    assert table.loc[0, "changes"] == "(the train recipe)"
    assert table.loc[1, "acc 1"] == 0.6 and table.loc[1, "acc 2"] == 0.3
    assert (tmp_path / "variants.csv").exists() and (tmp_path / "variants.html").exists()
    assert (tmp_path / "variants.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _variant_metrics(tmp_path, accs: dict[str, float]) -> dict:
    metrics = {}
    for name, a in accs.items():
        metrics[name] = write_rows(
            tmp_path / f"{name}.jsonl",
            [{"step": 5, "epoch": 1, "tokens": 500, "acc": [a, a / 2], "tokens_per_s": 80.0,
              "acceptance_length": 1 + a + a * a / 2}],
        )  # fmt: skip
    return metrics


def test_the_variants_table_puts_each_engines_measured_acceptance_beside_the_simulated(tmp_path):
    from specbuild.variants import variant_bars, write_variants

    metrics = _variant_metrics(tmp_path, {"base": 0.5, "long": 0.8, "warm": 0.4})
    served = [  # sglang counts verify steps but not positions; hf both
        row("mt_bench", "3-1-4", 40, 20, engine="sglang", drafter="base", prompt="1"),
        row("mt_bench", "3-1-4", 20, 5, engine="sglang", drafter="base", prompt="1", turn=2),
        row("mt_bench", "3-1-4", 60, 20, engine="sglang", drafter="long", prompt="1"),
        row("mt_bench", "3-1-4", 30, 10, engine="hf", drafter="base", accepted=[8, 2, 0]),
    ]
    files = [write_rows(tmp_path / f"rows{i}.jsonl", [r]) for i, r in enumerate(served)]
    table = write_variants(
        metrics=metrics,
        changes={"long": {"epochs": 12}, "warm": {"init": "target_last_layer"}},
        datasets={"base": ["gsm8k"], "long": ["gsm8k"], "warm": ["gsm8k", "chat_mt"]},
        rows=files,
        set_order=["mt_bench"],
        table=tmp_path / "variants.md",
        plot=tmp_path / "variants.png",
    ).set_index("variant")
    # Σcompletion/Σverify over both turns: (40 + 20) / (20 + 5)
    assert table.loc["base", "sglang mt_bench 3-1-4"] == 60 / 25
    assert table.loc["long", "sglang mt_bench 3-1-4"] == 3.0
    assert pd.isna(table.loc["warm", "sglang mt_bench 3-1-4"])  # not benched: blank
    assert table.loc["base", "hf mt_bench 3-1-4"] == 3.0
    assert table.loc["base", "hf mt_bench 3-1-4 pos1"] == 0.8
    assert "sglang mt_bench 3-1-4 pos1" not in table.columns  # sglang reports no positions
    # training's estimate at the benched chain (3 drafts): 1 + .5 + .125 + .03125
    assert table.loc["base", "simulated 3-1-4"] == 1 + 0.5 + 0.125 + 0.5 * 0.25 * 0.25
    assert table.loc["warm", "datasets"] == "gsm8k, chat_mt"
    md = (tmp_path / "variants.md").read_text()
    assert "| long | epochs=12 | gsm8k |" in md
    # the plot's bars: training's estimate without a request count, each measurement with its n
    bars = variant_bars(metrics, rows=files, set_order=["mt_bench"]).set_index(["variant", "bar"])
    assert pd.isna(bars.loc[("base", "simulated 3-1-4"), "requests"])
    assert bars.loc[("base", "sglang mt_bench 3-1-4"), "requests"] == 2
    assert bars.loc[("long", "sglang mt_bench 3-1-4"), "accept_length"] == 3.0
    assert (tmp_path / "variants.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
