"""The views of a checked config (specbuild.config.views) that rules and checks share: the
variants and what each trains on, the drafters the bench runs, every SGLang server's flags."""

from config_cases import REPO, default_config, load_yaml, passes

from specbuild.config.views import (
    BASE_VARIANT,
    bench_drafter_names,
    sglang_server_args,
    train_datasets,
    train_variants,
)
from specbuild.engines.server import build_server_args


def test_variants_keep_the_base_recipe_and_change_only_their_keys():
    cfg = passes(default_config())
    cfg["train"]["variants"] = {"long": {"epochs": 12}}
    variants = train_variants(cfg)
    assert list(variants) == [BASE_VARIANT, "long"]
    assert variants["long"] == {**variants["base"], "epochs": 12}
    assert "variants" not in variants["base"]


def test_a_recipe_trains_on_its_datasets_else_on_all_but_the_held_out_one():
    cfg = default_config()
    cfg["train"] |= {"eval_set": "chat", "eval_fraction": 0}
    cfg["train"]["variants"] = {"mt": {"datasets": ["gsm8k"]}}
    variants = train_variants(passes(cfg))
    assert train_datasets(cfg, variants["base"]) == ["gsm8k"]  # all but the held-out chat
    assert train_datasets(cfg, variants["mt"]) == ["gsm8k"]
    cfg["train"]["eval_set"] = None
    assert train_datasets(cfg, train_variants(cfg)["base"]) == ["gsm8k", "chat"]


def test_the_bench_runs_every_variant_base_first_then_the_drafters_built_elsewhere():
    cfg = passes(default_config())
    cfg["train"]["variants"] = {"long": {"epochs": 12}}
    cfg["bench"]["drafters"] = {"theirs": "elsewhere/drafter"}
    assert bench_drafter_names(cfg) == ["base", "long", "theirs"]
    cfg["bench"]["variants"] = ["long"]
    assert bench_drafter_names(cfg) == ["long", "theirs"]
    cfg["bench"]["variants"] = []
    assert bench_drafter_names(cfg) == ["theirs"]


def test_sglang_jobs_get_trust_remote_code_from_the_target_key_alone():
    kimi = passes(load_yaml(REPO / "config" / "examples" / "kimi-k2.5-sglang-8xh200.yaml"))
    assert kimi["target"]["trust_remote_code"] is True
    assert "trust_remote_code" not in kimi["sglang"]["server_args"]
    assert sglang_server_args(kimi)["trust_remote_code"] is True
    assert build_server_args(sglang_server_args(kimi)).count("--trust-remote-code") == 1
    cfg = passes(default_config())
    assert cfg["target"]["trust_remote_code"] is False  # the schema's default
    assert "trust_remote_code" not in sglang_server_args(cfg)
