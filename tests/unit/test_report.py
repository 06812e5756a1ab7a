"""Report stage: tables and plots from bench rows, on synthetic rows whose numbers check by hand."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from specbuild.bench.specdec import ROW_KEYS
from specbuild.report.plots import PLOTS, write_plots
from specbuild.report.tables import (
    TABLES,
    best_train_row,
    build_positions,
    build_summary,
    build_train_vs_bench,
    mean_ci,
    read_rows,
    simulated_accept_length,
    t_quantile_975,
    to_markdown,
    write_tables,
)


def row(set_, config, accept, accepted, tokens=33, wall=2.0, prompt="0"):
    steps = 0 if accept is None else round((tokens - 1) / accept)
    return {
        "set": set_,
        "prompt_id": prompt,
        "turn": 1,
        "config": config,
        "drafter": "none" if config == "baseline" else "d1",
        "backend": "hf",
        "completion_tokens": tokens,
        "verify_steps": steps,
        "accept_length": accept,
        "accepted_per_position": accepted,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
    }


def synthetic_rows() -> list[dict]:
    # gsm8k: baseline 33+33 tokens in 4 s = 16.5 tok/s; chain 3-1-4 the same in 2 s = 33 tok/s
    return [
        row("gsm8k", "baseline", 1.0, [], wall=2.0, prompt="a"),
        row("gsm8k", "baseline", 1.0, [], wall=2.0, prompt="b"),
        row("gsm8k", "3-1-4", 2.0, [10, 5, 1], wall=1.0, prompt="a"),  # 16 verify steps
        row("gsm8k", "3-1-4", 4.0, [8, 8, 8], wall=1.0, prompt="b"),  # 8 verify steps
        row("my_prompts", "baseline", 1.0, [], wall=4.0),
        row("my_prompts", "3-1-4", 1.0, [0, 0, 0], wall=4.0),
    ]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_t_interval_matches_the_hand_computed_one():
    mean, lo, hi = mean_ci([1.0, 2.0, 3.0])  # sd 1, n 3: half width t(2) / sqrt(3)
    assert mean == 2.0
    assert hi - mean == pytest.approx(4.3027 / math.sqrt(3))
    assert lo == pytest.approx(2 * mean - hi)
    assert mean_ci([5.0]) == (5.0, 5.0, 5.0)


def test_t_quantile_beyond_the_table_is_close_to_the_exact_value():
    assert t_quantile_975(30) == 2.0423
    assert t_quantile_975(60) == pytest.approx(2.0003, abs=2e-4)
    assert t_quantile_975(120) == pytest.approx(1.9799, abs=2e-4)


def test_summary_has_speedup_against_the_same_sets_baseline():
    s = build_summary(pd.DataFrame(synthetic_rows())).set_index(["set", "config"])
    assert s.loc[("gsm8k", "3-1-4"), "tokens_per_s"] == 33.0
    assert s.loc[("gsm8k", "baseline"), "tokens_per_s"] == 16.5
    assert s.loc[("gsm8k", "3-1-4"), "speedup"] == 2.0
    assert s.loc[("gsm8k", "baseline"), "speedup"] == 1.0
    assert s.loc[("my_prompts", "3-1-4"), "speedup"] == 1.0
    assert s.loc[("gsm8k", "3-1-4"), "accept_length"] == 3.0


def test_position_acceptance_pools_verify_steps_over_requests():
    s = build_summary(pd.DataFrame(synthetic_rows())).set_index(["set", "config"])
    chain = s.loc[("gsm8k", "3-1-4")]
    assert chain["verify_steps"] == 24
    assert [chain["accept_pos1"], chain["accept_pos2"], chain["accept_pos3"]] == [
        18 / 24,
        13 / 24,
        9 / 24,
    ]
    assert math.isnan(s.loc[("gsm8k", "baseline"), "accept_pos1"])
    long = build_positions(build_summary(pd.DataFrame(synthetic_rows())))
    assert list(long[long["set"] == "gsm8k"]["position"]) == [1, 2, 3]


def test_request_without_verify_step_is_left_out_of_the_mean_acceptance():
    rows = synthetic_rows() + [row("gsm8k", "3-1-4", None, [0, 0, 0], tokens=1, prompt="c")]
    s = build_summary(pd.DataFrame(rows)).set_index(["set", "config"])
    assert s.loc[("gsm8k", "3-1-4"), "accept_length"] == 3.0
    assert s.loc[("gsm8k", "3-1-4"), "requests"] == 3


def test_simulated_acceptance_follows_the_chain_length():
    train = {"step": 40, "acc": [0.5, 0.5], "acceptance_length": 1.75}
    assert simulated_accept_length(train, 1) == 1.5
    assert simulated_accept_length(train, 3) == 1.875  # third position reuses the last acc
    assert simulated_accept_length({"acceptance_length": 2.5}, 7) == 2.5


def test_best_train_row_is_the_highest_simulated_acceptance(tmp_path):
    p = write_rows(
        tmp_path / "m.jsonl",
        [{"step": 1, "acceptance_length": 1.2}, {"step": 2, "acceptance_length": 1.9},
         {"step": 3, "acceptance_length": 1.7}],
    )  # fmt: skip
    assert best_train_row(p)["step"] == 2


def test_train_vs_bench_puts_simulated_beside_measured_for_each_chain():
    summary = build_summary(pd.DataFrame(synthetic_rows()))
    t = build_train_vs_bench(summary, {"step": 9, "acc": [0.5], "acceptance_length": 1.5})
    assert list(t["config"]) == ["3-1-4", "3-1-4"]
    assert list(t["simulated_accept_length"]) == [1.875, 1.875]
    assert list(t["accept_length"]) == [3.0, 1.0]


def test_a_set_added_by_config_shows_up_in_every_table(tmp_path):
    a = write_rows(tmp_path / "gsm8k.jsonl", synthetic_rows()[:4])
    b = write_rows(tmp_path / "mine.jsonl", synthetic_rows()[4:])
    tables = write_tables(rows=[a, b], out_dir=tmp_path / "tables")
    assert "my_prompts" in set(tables["bench"]["set"])
    for name in TABLES:
        for ext in ("csv", "md", "html"):
            assert (tmp_path / "tables" / f"{name}.{ext}").stat().st_size > 0
    md = (tmp_path / "tables" / "bench.md").read_text()
    assert "| my_prompts | 3-1-4 |" in md
    csv = pd.read_csv(tmp_path / "tables" / "bench.csv")
    assert set(csv["set"]) == {"gsm8k", "my_prompts"}


def test_rows_breaking_the_schema_fail_naming_the_file(tmp_path):
    bad = {k: v for k, v in synthetic_rows()[0].items() if k != "wall_s"}
    p = write_rows(tmp_path / "bad.jsonl", [bad])
    with pytest.raises(ValueError, match=r"bad\.jsonl: row 0: missing \['wall_s'\]"):
        read_rows([p])
    assert "wall_s" in ROW_KEYS


def test_markdown_table_right_aligns_numbers_and_blanks_missing_values():
    md = to_markdown(pd.DataFrame({"set": ["a|b"], "x": [1.23456], "y": [float("nan")]}))
    assert md.splitlines() == ["| set | x | y |", "|:---|---:|---:|", "| a\\|b | 1.235 |  |"]


def test_every_plot_is_written_as_a_png(tmp_path):
    p = write_rows(tmp_path / "rows.jsonl", synthetic_rows())
    write_plots(rows=[p], out_dir=tmp_path / "plots")
    for name in PLOTS:
        assert (tmp_path / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
    table = write_variants(
        metrics=metrics,
        changes={"long": {"epochs": 12, "init": "target_last_layer"}},
        table=tmp_path / "variants.md",
        plot=tmp_path / "variants.png",
    )
    assert list(table["variant"]) == ["base", "long"]
    assert list(table["best step"]) == [20, 10]  # each variant's own best row
    assert table.loc[1, "changes"] == 'epochs=12, init="target_last_layer"'
    assert table.loc[0, "changes"] == "(the train recipe)"
    assert table.loc[1, "acc 1"] == 0.6 and table.loc[1, "acc 2"] == 0.3
    assert (tmp_path / "variants.csv").exists() and (tmp_path / "variants.html").exists()
    assert (tmp_path / "variants.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
