from specbuild.workflow.report_plan import (
    bench_report_files,
    pipeline_report_files,
    report_paths,
    train_curves_dir,
    train_metrics_variant,
    tuning_report_files,
)


def _paths(files):
    return [f.path for f in files]


def test_each_table_comes_in_three_formats_and_only_its_html_is_shown(default_config):
    files = pipeline_report_files(default_config)
    data = [f for f in files if f.path.startswith("results/tables/data.")]
    assert [f.path.rsplit(".", 1)[1] for f in data] == ["html", "csv", "md"]
    assert [f.caption for f in data] == ["../report/data_table.rst", None, None]


def test_a_bench_of_no_engine_has_no_bench_tables(default_config):
    default_config["bench"]["enabled"] = False
    assert bench_report_files(default_config, ("base",)) == []


def test_sweep_tables_exist_only_where_a_job_sweeps(default_config):
    assert "results/tables/sweep.md" not in _paths(bench_report_files(default_config, ("base",)))
    default_config["bench"]["engines"] = ["hf", "sglang"]
    assert "results/tables/sweep.md" in _paths(bench_report_files(default_config, ("base",)))


def test_the_peers_table_exists_only_where_a_drafter_built_elsewhere_is_benched(default_config):
    assert "results/tables/peers.md" not in _paths(bench_report_files(default_config, ("base",)))
    default_config["bench"]["drafters"] = {"theirs": "elsewhere/drafter"}
    files = bench_report_files(default_config, ("base",))
    assert [f.caption for f in files if f.path.startswith("results/tables/peers.")] == [
        "../report/peers_table.rst",
        None,
        None,
    ]


def test_training_curves_follow_report_train_metrics(default_config):
    assert train_metrics_variant(default_config, ("base",)) == "base"
    assert train_curves_dir(default_config) == "results/train/base/tensorboard"
    default_config["report"]["train_metrics"] = None
    assert train_metrics_variant(default_config, ("base",)) is None
    assert "results/tables/train.md" not in _paths(pipeline_report_files(default_config))


def test_the_report_lists_plain_paths_of_every_table_and_plot(default_config):
    paths = report_paths(default_config, ("base",))
    assert all(isinstance(p, str) for p in paths)
    assert tuning_report_files(default_config) == []
    assert "results/plots/acceptance.png" in paths and "results/tables/disk.csv" in paths
