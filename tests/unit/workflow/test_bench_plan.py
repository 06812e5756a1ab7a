import pytest

from specbuild.workflow.bench_plan import (
    bench_concurrency,
    bench_drafter_files,
    bench_drafter_regex,
    bench_engines,
    bench_inputs,
    bench_options,
    bench_prompt_limit,
    bench_row_files,
    bench_runs,
    serve_rows,
    served_drafter,
    sweeps,
    variant_bench_rows,
)

VARIANTS = ("base",)


def test_an_engine_benches_the_baseline_then_each_drafter_at_every_chain(default_config):
    default_config["bench"]["chains"] = ["3-1-4", "5-1-6"]
    assert bench_runs(default_config, VARIANTS, "hf") == [
        ("none", "baseline"),
        ("base", "3-1-4"),
        ("base", "5-1-6"),
    ]
    default_config["bench"]["baseline"] = False
    assert bench_row_files(default_config, VARIANTS) == [
        "results/bench/hf/base/3-1-4.jsonl",
        "results/bench/hf/base/5-1-6.jsonl",
    ]


def test_an_existing_endpoint_is_benched_only_at_what_it_serves(default_config):
    default_config["bench"]["openai"].update(serves="3-1-4", drafter="theirs")
    assert bench_runs(default_config, VARIANTS, "openai") == [("theirs", "3-1-4")]
    default_config["bench"]["engines"] = ["hf", "openai"]
    assert bench_drafter_regex(default_config, VARIANTS) == "none|base|theirs"
    assert "results/bench/openai/theirs/3-1-4.jsonl" not in variant_bench_rows(
        default_config, VARIANTS
    )


def test_a_disabled_bench_has_no_engine(default_config):
    default_config["bench"]["enabled"] = False
    assert bench_engines(default_config) == [] and bench_row_files(default_config, VARIANTS) == []


def test_a_baseline_row_file_with_a_drafter_is_refused(default_config):
    with pytest.raises(ValueError, match="the baseline is none/baseline.jsonl"):
        bench_inputs(default_config, VARIANTS, "hf", "base", "baseline")


def test_a_chain_reads_its_drafters_folder_and_the_baseline_none(default_config):
    chain = bench_inputs(default_config, VARIANTS, "hf", "base", "3-1-4")
    assert chain["drafter"] == bench_drafter_files(default_config, VARIANTS, "base")
    assert "drafter" not in bench_inputs(default_config, VARIANTS, "hf", "none", "baseline")
    assert len(chain["sets"]) == len(default_config["bench"]["sets"])


def test_a_drafter_built_elsewhere_is_benched_from_its_own_folder(default_config):
    default_config["bench"]["drafters"] = {"theirs": "some/where/"}
    assert bench_drafter_files(default_config, VARIANTS, "theirs") == [
        "some/where/config.json",
        "some/where/model.safetensors",
    ]


def test_only_served_engines_sweep_concurrency(default_config):
    default_config["bench"]["sweep_drafters"] = []
    assert not sweeps(default_config, "hf", "none")
    assert sweeps(default_config, "sglang", "none")
    assert not sweeps(default_config, "sglang", "base")  # not in sweep_drafters
    assert bench_concurrency(default_config, "sglang", "base") == []


def test_each_engine_gets_its_own_options(default_config):
    server = {"host": "127.0.0.1"}
    assert bench_options(default_config, server, "sglang") == {"server": server}
    assert set(bench_options(default_config, server, "hf")) == {
        "dtype",
        "device",
        "threads",
        "workers",
    }
    assert bench_prompt_limit(default_config, "sglang") is None


def test_serve_picks_from_the_sglang_rows_of_the_first_benched_drafter(default_config):
    assert served_drafter(default_config, VARIANTS) == "base"
    assert serve_rows(default_config, VARIANTS) == []  # no sglang engine
    default_config["bench"]["engines"] = ["sglang"]
    assert serve_rows(default_config, VARIANTS) == ["results/bench/sglang/base/3-1-4.jsonl"]
