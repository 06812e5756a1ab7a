"""Report stage: every table and plot, from synthetic files whose numbers check by hand."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from bench_cases import row, write_rows

from specbuild.infra.io import write_json
from specbuild.report import pipeline, plots
from specbuild.report.bench import write_bench_report
from specbuild.report.tables import (
    best_train_row,
    build_bench,
    build_latency,
    build_peers,
    build_positions,
    build_sweep,
    build_train_vs_bench,
    read_rows,
    simulated_accept_length,
    to_markdown,
)
from specbuild.report.tuning import write_tuning_report


def synthetic_rows() -> list[dict]:
    # gsm8k: baseline 32+32 tokens in 4 s = 16 tok/s; chain 3-1-4 the same in 2 s = 32 tok/s
    return [
        row("gsm8k", "baseline", 32, None, prompt="a"),
        row("gsm8k", "baseline", 32, None, prompt="b"),
        row("gsm8k", "3-1-4", 32, 16, wall=1.0, prompt="a", accepted=[10, 5, 1]),
        row("gsm8k", "3-1-4", 32, 8, wall=1.0, prompt="b", accepted=[8, 8, 8]),
        row("my_prompts", "baseline", 32, None, wall=4.0),
        row("my_prompts", "3-1-4", 32, 31, wall=4.0, accepted=[0, 0, 0]),
    ]


def test_bench_table_has_sglangs_acceptance_and_speedup_over_the_same_engines_baseline():
    t = build_bench(pd.DataFrame(synthetic_rows())).set_index(["set", "chain"])
    chain = t.loc[("gsm8k", "3-1-4")]
    assert chain["accept_length"] == 64 / 24  # Σ completion / Σ verify
    assert (chain["tokens_per_s"], chain["speedup"]) == (32.0, 2.0)
    assert t.loc[("gsm8k", "baseline"), "accept_length"] == 1.0
    assert t.loc[("gsm8k", "baseline"), "speedup"] == 1.0
    assert [chain["accept_pos1"], chain["accept_pos2"], chain["accept_pos3"]] == [
        18 / 24,
        13 / 24,
        9 / 24,
    ]
    assert pd.isna(chain["accept_length_lo"])  # 2 requests: no interval


def test_bench_table_has_each_steps_cost_and_the_break_even_acceptance():
    # decode = wall - TTFT: the baseline 2 x 1.5 s for 2 x 31 tokens after the first, the
    # chain 2 x 0.5 s for 16 + 8 verify cycles
    t = build_bench(pd.DataFrame(synthetic_rows())).set_index(["set", "chain"])
    base, chain = t.loc[("gsm8k", "baseline")], t.loc[("gsm8k", "3-1-4")]
    assert base["step_ms"] == pytest.approx(3000 / 62) and base["break_even"] == 1.0
    assert chain["step_ms"] == pytest.approx(1000 / 24)
    assert chain["break_even"] == pytest.approx((1000 / 24) / (3000 / 62))
    # my_prompts: one 3.5 s decode for 31 cycles against 31 tokens: a cycle costs a step
    assert t.loc[("my_prompts", "3-1-4"), "break_even"] == pytest.approx(1.0)


def test_lines_follow_the_configured_engines_sets_and_chains():
    rows = synthetic_rows() + [
        {**r, "engine": "sglang", "accepted_per_position": []} for r in synthetic_rows()
    ]
    t = build_bench(pd.DataFrame(rows), set_order=["my_prompts", "gsm8k"])
    assert list(zip(t["engine"], t["set"], t["chain"], strict=True))[:4] == [
        ("hf", "my_prompts", "baseline"),
        ("hf", "my_prompts", "3-1-4"),
        ("hf", "gsm8k", "baseline"),
        ("hf", "gsm8k", "3-1-4"),
    ]
    sglang = t[t["engine"] == "sglang"].set_index(["set", "chain"])
    assert sglang.loc[("gsm8k", "3-1-4"), "speedup"] == 2.0
    long = build_positions(t)
    assert set(long["engine"]) == {"hf"} and list(long["position"][:3]) == [1, 2, 3]


def test_an_interval_appears_from_five_requests_and_stays_above_one():
    rows = [row("s", "3-1-4", 20, 10 if i else 2, prompt=str(i)) for i in range(5)]
    t = build_bench(pd.DataFrame(rows)).iloc[0]
    assert 1.0 <= t["accept_length_lo"] < t["accept_length"] < t["accept_length_hi"]


def test_latency_and_sweep_tables_read_their_numbers_from_the_rows():
    lat = build_latency(pd.DataFrame(synthetic_rows())).set_index(["set", "chain"])
    assert lat.loc[("gsm8k", "3-1-4"), "ttft_s_p50"] == 0.5
    assert lat.loc[("gsm8k", "3-1-4"), "itl_s_mean"] == pytest.approx(0.5 / 31)
    sweep = [
        row("gsm8k", "baseline", 10, None, phase="sweep", concurrency=2, start_s=s, wall=2.0)
        for s in (0.0, 1.0)
    ]
    t = build_sweep(pd.DataFrame(synthetic_rows() + sweep))
    assert (t.iloc[0]["concurrency"], t.iloc[0]["requests"]) == (2, 2)
    assert t.iloc[0]["output_tokens_per_s"] == 20 / 3.0  # from 0 s to 3 s


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
    bench = build_bench(pd.DataFrame(synthetic_rows()))
    t = build_train_vs_bench(bench, {"step": 9, "acc": [0.5], "acceptance_length": 1.5})
    assert list(t["chain"]) == ["3-1-4", "3-1-4"]
    assert list(t["simulated_accept_length"]) == [1.875, 1.875]
    assert list(t["accept_length"]) == [64 / 24, 32 / 31]


def test_rows_breaking_the_schema_fail_naming_the_file(tmp_path):
    bad = {k: v for k, v in synthetic_rows()[0].items() if k != "wall_s"}
    p = write_rows(tmp_path / "bad.jsonl", [bad])
    with pytest.raises(ValueError, match=r"bad\.jsonl: row 0: missing \['wall_s'\]"):
        read_rows([p])


def test_markdown_table_right_aligns_numbers_and_blanks_missing_values():
    md = to_markdown(pd.DataFrame({"set": ["a|b"], "x": [1.23456], "y": [float("nan")]}))
    assert md.splitlines() == ["| set | x | y |", "|:---|---:|---:|", "| a\\|b | 1.235 |  |"]


def test_bench_report_writes_every_table_and_plot_and_the_sweep_only_with_sweep_rows(tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", synthetic_rows())
    metrics = write_rows(
        tmp_path / "m.jsonl", [{"step": 3, "acc": [0.5], "acceptance_length": 1.5}]
    )
    names = ("bench", "latency", "positions", "train_vs_bench")
    outputs = [tmp_path / "t" / f"{name}.{ext}" for name in names for ext in ("html", "csv", "md")]
    outputs += [tmp_path / "p" / f"{name}.png" for name in ("acceptance", "positions", "speedup")]
    out = write_bench_report(
        rows=[rows], set_order=["gsm8k", "my_prompts"], outputs=outputs, train_metrics=metrics
    )
    assert set(out) == set(names)
    for name in out:
        for ext in ("csv", "md", "html"):
            assert (tmp_path / "t" / f"{name}.{ext}").stat().st_size > 0
    assert "| hf | my_prompts | 3-1-4 |" in (tmp_path / "t" / "bench.md").read_text()
    for name in ("acceptance", "positions", "speedup"):
        assert (tmp_path / "p" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "p" / "sweep.png").exists()
    with pytest.raises(RuntimeError, match="sweep.png"):  # declared, but no sweep rows
        write_bench_report(rows=[rows], set_order=[], outputs=[*outputs, tmp_path / "p/sweep.png"])


def test_per_position_acceptance_is_written_only_where_the_rule_declares_it(tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", synthetic_rows())
    outputs = [tmp_path / "t" / f"{n}.{e}" for n in ("bench", "latency") for e in ("html", "csv")]
    outputs += [tmp_path / "p" / f"{name}.png" for name in ("acceptance", "speedup")]
    out = write_bench_report(rows=[rows], set_order=[], outputs=outputs)
    assert set(out) == {"bench", "latency"}
    assert not (tmp_path / "p" / "positions.png").exists()


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plot functions draw, kept open instead of saved."""
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig))
    yield figures
    plt.close("all")


def test_acceptance_plot_has_the_reference_line_request_counts_and_the_device(drawn):
    bench = build_bench(pd.DataFrame(synthetic_rows()), set_order=["my_prompts", "gsm8k"])
    plots.plot_acceptance(bench, "unused.png")
    (ax,) = drawn[0].axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["my_prompts", "gsm8k"]
    assert any(list(line.get_ydata()) == [1.0, 1.0] for line in ax.get_lines())
    assert {t.get_text() for t in ax.texts} == {"n=1", "n=2"}
    assert ax.get_title() == "hf on cpu"


def test_a_chain_keeps_its_colour_in_every_engine_panel_under_one_legend(drawn):
    served = [row("gsm8k", c, 32, 8, engine="sglang", device="cuda (H200)") for c in ("7-1-8",)]
    bench = build_bench(pd.DataFrame(synthetic_rows() + served))
    plots.plot_acceptance(bench, "unused.png")
    hf, sglang = drawn[0].axes
    assert (hf.get_title(), sglang.get_title()) == ("hf on cpu", "sglang on cuda (H200)")
    # one palette over all panels: each panel's first chain is not simply the first colour
    colour = {
        b.get_label(): b.patches[0].get_facecolor() for ax in drawn[0].axes for b in ax.containers
    }
    assert colour["3-1-4"] != colour["7-1-8"]
    assert hf.get_legend() is None
    assert [t.get_text() for t in sglang.get_legend().get_texts()] == ["3-1-4", "7-1-8"]


def test_sweep_and_tuning_plots_name_the_device_they_ran_on(drawn):
    sweep = [
        row("gsm8k", "baseline", 10, None, phase="sweep", concurrency=c, device="cuda (H200)")
        for c in (1, 4)
    ]
    plots.plot_sweep(build_sweep(pd.DataFrame(sweep)), "unused.png")
    assert "hf on cuda (H200)" in drawn[0]._suptitle.get_text()
    point = {"point": "a", "status": "ok", "device": "cuda (H200)", "peak_concurrency": 4}
    point |= {"single_stream_tokens_per_s": 10.0, "peak_output_tokens_per_s": 80.0}
    plots.plot_tuning([point], "unused.png")
    assert drawn[1]._suptitle.get_text() == "Server tuning points on cuda (H200)"
    assert [t.get_text() for t in drawn[1].axes[1].texts] == ["c=4"]


def test_positions_plot_ticks_whole_positions(drawn):
    bench = build_bench(pd.DataFrame(synthetic_rows()))
    plots.plot_positions(build_positions(bench), bench, "unused.png")
    ax = drawn[0].axes[0]
    drawn[0].canvas.draw()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)


# --- the pipeline's tables -------------------------------------------------------------------


def test_data_table_counts_kept_and_rejected_records_per_stage(tmp_path):
    def counts(path, **values):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, values)
        return path

    s = counts(tmp_path / "samples/d/00000.counts.json", **{"in": 10, "kept": 9, "rejected": 1})
    g = counts(tmp_path / "generated/d/00000.counts.json", **{"in": 9, "kept": 8, "rejected": 1})
    # 7 records kept as 9 rows (one split a row per assistant turn)
    meta = {"in": 8, "kept": 7, "rows": 9, "rejected": 1, "truncated": 2, "turns_dropped": 4}
    meta |= {"tokens": 700, "response_tokens": 300, "reasoning_tokens": 120}
    t = counts(tmp_path / "tokenized/d/00000.meta.json", **meta)
    table = pipeline.build_data(["d"], samples=[s], generated=[g], tokenized=[t])
    assert table[["stage", "in", "kept", "rejected"]].values.tolist() == [
        ["samples", 10, 9, 1],
        ["generate", 9, 8, 1],
        ["tokenize", 8, 7, 1],
    ]
    assert table.iloc[2]["response_tokens"] == 300 and table.iloc[0]["rejected_share"] == 0.1
    assert table.iloc[2][["rows", "turns_dropped", "reasoning_tokens"]].tolist() == [9, 4, 120]
    assert pd.isna(table.iloc[0]["tokens"]) and pd.isna(table.iloc[0]["reasoning_tokens"])


def test_train_table_and_curves_read_metrics_and_tensorboard_events(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb"))
    for step, loss in ((5, 4.0), (10, 3.0)):
        writer.add_scalar("train/loss", loss, step)
    writer.close()
    metrics = write_rows(
        tmp_path / "m.jsonl",
        [{"step": 10, "epoch": 0, "tokens": 99, "eval_loss": 3.1, "acc": [0.5, 0.25],
          "acceptance_length": 1.625}],
    )  # fmt: skip
    t = pipeline.build_train(metrics)
    assert list(t.columns) == [
        "step", "epoch", "tokens", "eval_loss", "acc_1", "acc_2", "acceptance_length"
    ]  # fmt: skip
    loss = pipeline.read_train_loss(tmp_path / "tb")
    assert loss.values.tolist() == [[5, 4.0], [10, 3.0]]
    assert pipeline.read_train_loss(tmp_path / "none").empty


def test_vocab_align_and_disk_tables(tmp_path, monkeypatch):
    stats = tmp_path / "vocab_stats.json"
    write_json(
        stats,
        {"draft_vocab_size": 4, "masked_tokens": 10, "coverage": 0.9, "filler_ids": 1,
         "coverage_at": {"2": 0.5}},
    )  # fmt: skip
    v = pipeline.build_vocab(stats).set_index("quantity")["value"]
    assert (v["coverage"], v["filler_ids"], v["coverage_top_2"]) == ("0.9", "1", "0.5")
    report = tmp_path / "align.json"
    layer = {"layer": "low", "layer_id": 1, "tokens": 5, "cosine_mean": 1.0, "status": "ok"}
    write_json(report, {"shard_backends": ["sglang"], "serving_backend": "hf", "layers": [layer]})
    a = pipeline.build_align(report)
    assert a.iloc[0][["training_features", "serving_engine", "layer"]].tolist() == [
        "sglang",
        "hf",
        "low",
    ]
    monkeypatch.chdir(tmp_path)
    shard = tmp_path / "results/hidden/d/00000.safetensors"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(b"x" * 400)
    d = pipeline.build_disk(["results/hidden/d/00000.safetensors"], tokens=100)
    assert d.iloc[0][["folder", "files", "bytes", "bytes_per_token"]].tolist() == [
        "results/hidden",
        1,
        400,
        4.0,
    ]


def test_tuning_report_keeps_every_point_with_its_status(tmp_path):
    from specbuild.tuning import TUNING_KEYS

    points = []
    for name, status in (("a", "ok"), ("b", "rejected")):
        r = dict.fromkeys(TUNING_KEYS) | {"point": name, "status": status}
        r["single_stream_tokens_per_s"] = 10.0 if status == "ok" else None
        write_json(tmp_path / f"{name}.json", r)
        points.append(tmp_path / f"{name}.json")
    outputs = [tmp_path / "t" / f"tuning.{ext}" for ext in ("html", "csv", "md")]
    rows = write_tuning_report(points, outputs=[*outputs, tmp_path / "p" / "tuning.png"])
    assert [(r["point"], r["status"]) for r in rows] == [("a", "ok"), ("b", "rejected")]
    header = (tmp_path / "t" / "tuning.csv").read_text().splitlines()[0]
    assert header.split(",") == list(TUNING_KEYS)
    assert (tmp_path / "p" / "tuning.png").stat().st_size > 1000


def test_each_drafter_at_a_chain_is_its_own_line_and_train_vs_bench_keeps_the_trained_one():
    rows = synthetic_rows() + [
        row("gsm8k", "3-1-4", 30, 10, wall=1.0, prompt="a", drafter="d2"),
        row("gsm8k", "3-1-4", 30, 20, wall=1.0, prompt="b", drafter="d2"),
    ]
    bench = build_bench(pd.DataFrame(rows))
    lines = bench[bench["set"] == "gsm8k"][["chain", "drafter", "accept_length"]]
    assert lines.values.tolist() == [
        ["baseline", "none", 1.0],
        ["3-1-4", "d1", 64 / 24],
        ["3-1-4", "d2", 60 / 30],  # not pooled with d1's requests
    ]
    t = build_train_vs_bench(bench, {"step": 9, "acc": [0.5], "acceptance_length": 1.5}, "d2")
    assert list(t["drafter"]) == ["d2"] and list(t["accept_length"]) == [2.0]


def test_with_several_drafters_each_chain_bar_is_labelled_with_its_drafter(drawn):
    rows = synthetic_rows() + [row("gsm8k", "3-1-4", 30, 10, drafter="d2")]
    plots.plot_acceptance(build_bench(pd.DataFrame(rows)), "unused.png")
    labels = drawn[0].axes[-1].get_legend_handles_labels()[1] or [
        t.get_text() for t in drawn[0].axes[-1].get_legend().get_texts()
    ]
    assert labels == ["3-1-4 d1", "3-1-4 d2"]


def test_peers_table_pairs_each_of_ours_with_each_drafter_built_elsewhere_per_request(tmp_path):
    # ours: 12 tokens in 4 verify steps (3.0) on prompts a-f; theirs: 12 in 6 (2.0) on a-e,
    # and one request theirs alone served (g): left out, the pairs are what both served
    ours = [row("mt", "3-1-4", 12, 4, prompt=p) for p in "abcdef"]
    theirs = [row("mt", "3-1-4", 12, 6, prompt=p, drafter="sf") for p in "abcdeg"]
    base = [row("mt", "baseline", 12, None, prompt=p) for p in "abcdef"]
    df = read_rows([write_rows(tmp_path / "rows.jsonl", ours + theirs + base)])
    table = build_peers(df, ["sf"])
    (line,) = table.to_dict("records")
    assert (line["drafter"], line["peer"], line["requests"]) == ("d1", "sf", 5)
    assert (line["accept_length"], line["peer_accept_length"]) == (3.0, 2.0)
    assert line["ours_over_peer"] == pytest.approx(1.5)
    assert line["ratio_lo"] == pytest.approx(1.5) and line["ratio_hi"] == pytest.approx(1.5)
    assert build_peers(df, ["not_benched"]).empty
    outputs = [
        tmp_path / "t" / f"{n}.{e}"
        for n in ("bench", "latency", "peers")
        for e in ("md", "csv", "html")
    ]
    outputs += [tmp_path / "p" / f"{n}.png" for n in ("acceptance", "speedup")]
    write_bench_report(
        rows=[tmp_path / "rows.jsonl"], set_order=["mt"], outputs=outputs, peers=["sf"]
    )
    assert (
        "| hf | mt | 3-1-4 | d1 | sf | 5 | 3 | 2 | 1.5 |" in (tmp_path / "t/peers.md").read_text()
    )
