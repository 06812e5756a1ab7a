"""What the schema cannot say (specbuild.config.checks): files that must exist, chains the
engines run, names that must not clash, keys that need or exclude each other; each fault one
line naming the dotted key."""

import pytest
from config_cases import default_config, faults, passes


def test_a_missing_dataset_file_names_its_key():
    cfg = default_config()
    cfg["datasets"]["gsm8k"]["path"] = "resources/prompts/gsm8k.jsonl"
    (fault,) = faults(cfg)
    assert fault.startswith("datasets.gsm8k.path: no such file 'resources/prompts/gsm8k.jsonl'")


@pytest.mark.parametrize(
    ("chain", "why"),
    [
        ("0-1-1", "steps must be >= 1"),
        ("3-1-9", "draft tokens must be steps + 1 = 4"),
        ("3-2-4", "the hf engine drafts chains only (topk 1)"),
    ],
)
def test_a_chain_the_engine_cannot_run_names_its_key(chain, why):
    cfg = default_config()
    cfg["bench"]["chains"] = ["3-1-4", chain]
    (fault,) = faults(cfg)
    assert fault.startswith(f"bench.chains[1]: chain '{chain}': ") and why in fault


def test_a_tree_is_a_chain_sglang_may_bench():
    cfg = default_config()
    cfg["bench"].update(engines=["sglang"], chains=["3-2-4"])
    passes(cfg)


@pytest.mark.parametrize(
    ("chain", "why"),
    [("3-1-4x", "expected 'steps-topk-draft_tokens'"), ("3-1-9", "steps + 1 = 4")],
)
def test_the_tuning_chain_is_checked_like_a_bench_chain_once(chain, why):
    cfg = default_config()
    cfg["sglang"]["tuning"] = {"chain": chain}
    (fault,) = faults(cfg)
    assert fault.startswith(f"sglang.tuning.chain: chain '{chain}': ") and why in fault
    cfg["sglang"]["tuning"] = {"chain": "3-2-4"}  # a tree: the server it tunes is SGLang
    passes(cfg)


def test_the_openai_engine_needs_its_endpoint():
    cfg = default_config()
    cfg["bench"]["engines"] = ["hf", "openai"]
    (fault,) = faults(cfg)
    assert fault.startswith("bench.openai.endpoint: bench.engines has openai")


@pytest.mark.parametrize(
    ("generate", "why"),
    [
        ({"temperature": 0.0}, "need a temperature > 0, and generate.temperature is 0"),
        ({"temperature": 0.8, "mode": "keep"}, "need generate.mode regenerate"),
    ],
)
def test_several_answers_per_prompt_need_sampling_and_regenerate(generate, why):
    cfg = default_config()
    cfg["datasets"]["gsm8k"]["answers"] = 2
    cfg["generate"].update(generate)
    (fault,) = faults(cfg)
    assert fault.startswith("datasets.gsm8k.answers: 2 answers per prompt ") and why in fault
    cfg["generate"].update(temperature=0.8, mode="regenerate")
    passes(cfg)
    cfg["generate"].update(generate)
    cfg["datasets"]["gsm8k"]["answers"] = 1  # one answer: greedy and keep are fine
    passes(cfg)


def test_a_datasets_own_temperature_samples_its_answers_while_the_others_stay_greedy():
    cfg = default_config()
    cfg["generate"]["temperature"] = 0.0
    cfg["datasets"]["chat"]["answers"] = 3
    cfg["datasets"]["chat"]["temperature"] = 0.8
    passes(cfg)
    cfg["datasets"]["chat"]["temperature"] = 0.0  # its own 0 is named, not generate's
    (fault,) = faults(cfg)
    assert fault.startswith("datasets.chat.answers: 3 answers per prompt need a temperature")
    assert "datasets.chat.temperature is 0" in fault


@pytest.mark.parametrize(
    ("eval_set", "fraction", "fault"),
    [
        ("mt_bench", 0.0, "train.eval_set: 'mt_bench' is no dataset (datasets: gsm8k, chat)"),
        ("chat", 0.05, "train.eval_fraction: must be 0 with train.eval_set 'chat'"),
    ],
)
def test_an_eval_set_must_be_a_dataset_held_out_instead_of_a_fraction(eval_set, fraction, fault):
    cfg = default_config()
    cfg["train"].update(eval_set=eval_set, eval_fraction=fraction)
    (got,) = faults(cfg)
    assert got.startswith(fault)
    cfg["train"]["eval_fraction"] = 0.0
    cfg["train"]["eval_set"] = "chat"
    passes(cfg)


def test_a_target_layer_init_with_a_warm_start_is_refused():
    cfg = default_config()
    cfg["train"].update(init="target_last_layer", init_from="results/drafter")
    (fault,) = faults(cfg)
    assert fault.startswith("train.init: 'target_last_layer' with train.init_from")


def test_a_variant_may_not_be_named_base_nor_like_the_no_drafter_run():
    cfg = default_config()
    cfg["train"]["variants"] = {"base": {"epochs": 2}, "baseline": {"epochs": 3}}
    got = faults(cfg)
    assert got[0].startswith("train.variants.base: `base` is the recipe of `train` itself")
    assert got[1].startswith("train.variants.baseline: the name is the bench's no-drafter run")


def test_the_bench_picks_variants_by_name_and_others_drafters_by_folder_never_clashing():
    cfg = default_config()
    cfg["train"]["variants"] = {"long": {"epochs": 12}, "none": {"lr": 1e-3}}
    cfg["bench"] |= {
        "variants": ["base", "lnog"],
        "drafters": {"long": "elsewhere/drafter", "theirs": "elsewhere/other"},
        "sweep_drafters": ["theirs", "warm"],
    }
    got = faults(cfg)
    assert any(f.startswith("train.variants.none: the name is the bench's no-drafter") for f in got)
    assert (
        "bench.variants[1]: 'lnog' is no variant (variants: base, long, none); did you mean 'long'?"
        in got
    )
    assert "bench.drafters.long: the name is a variant's; give this drafter another" in got
    assert any(f.startswith("bench.sweep_drafters[1]: 'warm' is not benched") for f in got)
    assert not any(f.startswith("bench.drafters.theirs: the name") for f in got)


def test_a_recipe_trains_only_on_datasets_of_the_config_and_never_on_the_held_out_one():
    cfg = default_config()
    cfg["train"] |= {"eval_set": "chat", "eval_fraction": 0}
    cfg["train"]["variants"] = {
        "mt": {"datasets": ["gsm8k", "chat"]},
        "typo": {"datasets": ["gms8k"]},
    }
    assert faults(cfg) == [
        "train.variants.mt.datasets: 'chat' is train.eval_set, held out: never trained on",
        "train.variants.typo.datasets: 'gms8k' is no dataset (datasets: gsm8k, chat); did you "
        "mean 'gsm8k'?",
    ]


def test_trust_remote_code_in_the_server_args_is_refused_naming_the_target_key():
    cfg = default_config()
    cfg["sglang"]["server_args"]["trust_remote_code"] = True
    (fault,) = faults(cfg)
    assert fault.startswith("sglang.server_args.trust_remote_code: set target.trust_remote_code")


@pytest.mark.parametrize(
    ("key", "flag", "instead"),
    [
        ("hos", "--host", "sglang.host"),
        ("po", "--port", "sglang.serve_port"),
        ("model-pa", "--model-path", "target.name and target.source"),
        ("conf", "--config", "each flag under sglang.server_args"),
        ("trust_remote", "--trust-remote-code", "target.trust_remote_code"),
        ("speculative_num_s", "--speculative-num-steps", "bench.chains"),
        ("speculative-draft-attention", "--speculative-draft-attention-backend", "sglang.draft"),
    ],
)
def test_a_server_flag_abbreviating_one_specbuild_sets_is_refused_naming_the_key(
    key, flag, instead
):
    cfg = default_config()
    cfg["sglang"]["server_args"][key] = "0.0.0.0"
    cfg["sglang"]["tuning"] = {"points": {"p": {"server_args": {key: "0.0.0.0"}}}}
    shown = "--" + key.replace("_", "-")
    assert [f.split("; set ")[0] for f in faults(cfg)] == [
        f"sglang.server_args.{key}: {shown} abbreviates {flag}, which specbuild sets itself "
        "(SGLang takes a unique prefix of a flag and keeps the last value given)",
        f"sglang.tuning.points.p.server_args.{key}: {shown} abbreviates {flag}, which "
        "specbuild sets itself (SGLang takes a unique prefix of a flag and keeps the last value "
        "given)",
    ]
    assert all(f.split("; set ")[1].startswith(instead) for f in faults(cfg))


@pytest.mark.parametrize("key", ["host", "port", "model_path", "speculative_algorithm", "config"])
def test_a_flag_specbuild_sets_itself_is_refused_naming_the_key_that_sets_it(key):
    cfg = default_config()
    cfg["sglang"]["server_args"][key] = "x"
    (fault,) = faults(cfg)
    flag = "--" + key.replace("_", "-")
    assert fault.startswith(f"sglang.server_args.{key}: set ")
    assert fault.endswith(f", not this flag: specbuild sets {flag} itself")


def test_a_value_or_a_launcher_word_that_sets_a_flag_is_refused_naming_its_key():
    cfg = default_config()
    cfg["sglang"]["server_args"]["cuda_graph_bs"] = [1, "--host", "0.0.0.0"]
    cfg["sglang"]["server_args"]["chunked_prefill_size"] = -1  # a number: not a flag
    cfg["sglang"]["launcher"] = ["python", "-m", "sglang.launch_server", "--hos=0.0.0.0"]
    assert faults(cfg) == [
        "sglang.server_args.cuda_graph_bs: a value starting with '-' reads as a flag on "
        "SGLang's command line; give each flag under its own key",
        "sglang.launcher[3]: --hos is or abbreviates --host, which specbuild sets itself; set "
        "sglang.host",
    ]


def test_server_flags_specbuild_sets_itself_are_allowed_their_real_neighbours():
    cfg = default_config()
    args = {"attention_backend": "triton", "hostname_override": 1, "speculative_token_map": "m"}
    cfg["sglang"]["server_args"] |= args | {"tp_size": 1, "disable_radix_cache": True}
    passes(cfg)


@pytest.mark.parametrize("tp", [0, "two", True])
def test_a_tensor_parallel_size_must_be_a_whole_number_of_gpus(tp):
    cfg = default_config()
    cfg["sglang"]["server_args"]["tp_size"] = tp
    assert faults(cfg) == [
        f"sglang.server_args.tp_size: expected an integer >= 1 (GPUs per server), got {tp!r}"
    ]


@pytest.mark.parametrize("section", ["generate", "train"])
def test_a_seed_beyond_what_samplers_take_is_refused_naming_its_key(section):
    cfg = default_config()
    cfg[section]["seed"] = 2**64  # torch.manual_seed overflowed on it at the job's start
    (fault,) = faults(cfg)
    assert fault == f"{section}.seed: {2**64} is greater than the maximum of 2147483647"
    cfg[section]["seed"] = 2**31 - 1
    passes(cfg)
