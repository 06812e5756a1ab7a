from specbuild.workflow.tuning_plan import (
    HELP_FILE,
    tuning_inputs,
    tuning_point_args,
    tuning_point_env,
    tuning_points,
    tuning_prompt_set,
)


def _tuning(config, **keys):
    config["sglang"]["tuning"].update(
        enabled=True, points={"fast": {"server_args": {"cuda_graph_max_bs": 8}, "env": {"N": 1}}}
    )
    config["sglang"]["tuning"].update(keys)
    return config


def test_a_disabled_sweep_has_no_points(default_config):
    assert tuning_points(default_config) == []
    assert tuning_points(_tuning(default_config)) == ["fast"]


def test_a_point_passes_its_flags_and_env_as_strings(default_config):
    _tuning(default_config)
    assert tuning_point_args(default_config, "fast") == {"cuda_graph_max_bs": 8}
    assert tuning_point_env(default_config, "fast") == {"N": "1"}


def test_a_chain_sweep_reads_the_served_drafter_and_a_baseline_sweep_none(default_config):
    assert tuning_inputs(_tuning(default_config), ("base",))["help"] == HELP_FILE
    assert "drafter" not in tuning_inputs(default_config, ("base",))
    default_config["sglang"]["tuning"]["chain"] = "3-1-4"
    assert tuning_inputs(default_config, ("base",))["drafter"][0] == (
        "results/drafter/base/config.json"
    )


def test_the_tuning_prompts_come_from_the_first_bench_set(default_config):
    assert tuning_prompt_set(default_config)["path"] == "resources/bench/mt_bench.jsonl"
