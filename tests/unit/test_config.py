"""Every shipped config validates and dry-runs; a faulty config gets one short error that names
every faulty key and what was expected (specbuild.config_check), never the schema dump."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from specbuild.config_check import MAX_LISTED, ConfigError, check_config

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "config" / "config.schema.yaml"
CONFIGS = sorted([REPO / "config" / "config.yaml", *(REPO / "config" / "examples").glob("*.yaml")])
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
MAX_ERROR_LINES = 15  # all of what snakemake prints for a faulty config


def _load(path):
    return yaml.safe_load(path.read_text())


def _default():
    return _load(REPO / "config" / "config.yaml")


def _faults(cfg, workdir=REPO) -> list[str]:
    with pytest.raises(ConfigError) as err:
        check_config(cfg, schema=SCHEMA, source="test.yaml", workdir=workdir)
    assert str(err.value).startswith("test.yaml: ")
    return err.value.faults


def scratch_dir(tmp_path: Path) -> Path:
    """A working directory of its own (never the repo's results/, logs/ or .snakemake/) that
    sees the repo's prompt files and default config."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("resources", "config"):
        (work / name).symlink_to(REPO / name)
    return work


def run_snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SNAKEMAKE), "-n", "--cores", "1", "--snakefile", str(REPO / "Snakefile"), *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_there_are_example_configs_for_gpu_targets():
    assert len(CONFIGS) >= 3, [c.name for c in CONFIGS]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_passes_every_check(path):
    check_config(_load(path), schema=SCHEMA, source=str(path), workdir=REPO)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_defaults_are_filled_exactly_as_snakemakes_validate_filled_them(path):
    # Params come from the filled config: any difference would rerun jobs of finished builds.
    ours, theirs = _load(path), _load(path)
    check_config(ours, schema=SCHEMA, source=str(path), workdir=REPO)
    validate(theirs, schema=str(SCHEMA))
    assert ours == theirs


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_dry_runs_in_a_scratch_directory(path, tmp_path):
    # Its own directory: results of `make run` in the repo must not make tokenize look done.
    work = scratch_dir(tmp_path)
    proc = run_snakemake(work, "--quiet", "rules", "--configfile", str(path))
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "tokenize" in proc.stdout
    assert (work / ".snakemake").is_dir()  # the dry-run's metadata went here, not to the repo


def test_unknown_key_is_named_with_its_path_and_the_likely_key():
    cfg = _default()
    cfg["generate"]["temprature"] = 0.7
    assert _faults(cfg) == ["generate.temprature: unknown key; did you mean 'temperature'?"]


def test_bad_enum_value_names_the_allowed_ones():
    cfg = _default()
    cfg["tokenize"]["overlong"] = "wrap"
    assert _faults(cfg) == ["tokenize.overlong: 'wrap' is not one of 'truncate', 'drop'"]


def test_schema_fills_defaults_for_omitted_sections():
    cfg = {"target": {"name": "t", "source": "gguf:pkg:f.gguf"}, "datasets": {"d": {"path": "x"}}}
    cfg["datasets"]["d"]["path"] = "resources/prompts/gsm8k_train.jsonl"
    check_config(cfg, schema=SCHEMA, source="test.yaml", workdir=REPO)
    assert cfg["generate"]["temperature"] == 0.0 and cfg["tokenize"]["overlong"] == "truncate"
    assert cfg["datasets"]["d"]["shard_size"] == 64 and cfg["datasets"]["d"]["format"] == "auto"


def test_numbers_yaml_reads_as_strings_are_read_as_numbers():
    # YAML 1.1 (PyYAML) needs a dot for a float: `5e-4` and `1e3` come back as strings.
    cfg = _default()
    cfg["train"].update(yaml.safe_load("lr: 5e-4\nepochs: 2e0\nfc_norm: 'yes'\n"))
    assert cfg["train"]["lr"] == "5e-4"
    check_config(cfg, schema=SCHEMA, source="test.yaml", workdir=REPO)
    assert cfg["train"]["lr"] == 0.0005 and type(cfg["train"]["lr"]) is float
    assert cfg["train"]["epochs"] == 2 and type(cfg["train"]["epochs"]) is int
    assert cfg["train"]["fc_norm"] is True


def test_a_string_that_is_no_number_is_named_with_the_type_expected():
    cfg = _default()
    cfg["train"]["lr"] = "fast"
    cfg["datasets"]["gsm8k"]["limit"] = "2.5"
    assert _faults(cfg) == [
        "datasets.gsm8k.limit: expected an integer or null, got string '2.5'",
        "train.lr: expected a number, got string 'fast'",
    ]


def test_a_missing_dataset_file_names_its_key(tmp_path):
    cfg = _default()
    cfg["datasets"]["gsm8k"]["path"] = "resources/prompts/gsm8k.jsonl"
    (fault,) = _faults(cfg)
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
    cfg = _default()
    cfg["bench"]["chains"] = ["3-1-4", chain]
    (fault,) = _faults(cfg)
    assert fault.startswith(f"bench.chains[1]: chain '{chain}': ") and why in fault


def test_a_tree_is_a_chain_sglang_may_bench():
    cfg = _default()
    cfg["bench"].update(engines=["sglang"], chains=["3-2-4"])
    check_config(cfg, schema=SCHEMA, source="test.yaml", workdir=REPO)


def test_keys_of_the_old_serving_bench_are_named_with_the_keys_that_replace_them():
    cfg = _default()
    cfg["sglang"]["bench"] = {"enabled": True, "chains": ["3-1-4"], "concurrency": [1, 8]}
    cfg["bench"]["device"] = "cuda"
    assert _faults(cfg) == [
        "sglang.bench: moved to bench (one stage for every engine): enabled -> add sglang to "
        "bench.engines; chains -> bench.chains; concurrency -> bench.concurrency",
        "bench.device: moved to bench.hf.device",
    ]


def test_the_openai_engine_needs_its_endpoint():
    cfg = _default()
    cfg["bench"]["engines"] = ["hf", "openai"]
    (fault,) = _faults(cfg)
    assert fault.startswith("bench.openai.endpoint: bench.engines has openai")


@pytest.mark.parametrize(
    ("eval_set", "fraction", "fault"),
    [
        ("mt_bench", 0.0, "train.eval_set: 'mt_bench' is no dataset (datasets: gsm8k, chat)"),
        ("chat", 0.05, "train.eval_fraction: must be 0 with train.eval_set 'chat'"),
    ],
)
def test_an_eval_set_must_be_a_dataset_held_out_instead_of_a_fraction(eval_set, fraction, fault):
    cfg = _default()
    cfg["train"].update(eval_set=eval_set, eval_fraction=fraction)
    (got,) = _faults(cfg)
    assert got.startswith(fault)
    cfg["train"]["eval_fraction"] = 0.0
    cfg["train"]["eval_set"] = "chat"
    check_config(cfg, schema=SCHEMA, source="test.yaml", workdir=REPO)  # passes


def test_a_target_layer_init_with_a_warm_start_is_refused():
    cfg = _default()
    cfg["train"].update(init="target_last_layer", init_from="results/drafter")
    (fault,) = _faults(cfg)
    assert fault.startswith("train.init: 'target_last_layer' with train.init_from")


def test_every_fault_is_listed_once_and_long_lists_are_cut():
    cfg = _default()
    cfg["datasets"]["chat"]["path"] = "x.jsonl"  # both path and synthesize
    cfg["generate"]["backend"] = "openai"  # without sglang.endpoint
    cfg["bench"]["chains"] = [341]  # a schema fault and a chain fault: one line
    del cfg["target"]["source"]
    assert _faults(cfg) == [
        "bench.chains[0]: expected a string, got integer 341",
        "datasets.chat: give exactly one of path or synthesize (found path and synthesize)",
        "target.source: missing (required)",
        "sglang.endpoint: generate.backend openai needs the server's base URL here "
        "(e.g. http://host:30000/v1)",
    ]
    many = copy.deepcopy(_default())
    many["train"].update({f"typo{i}": 1 for i in range(MAX_LISTED + 3)})
    with pytest.raises(ConfigError) as err:
        check_config(many, schema=SCHEMA, source="test.yaml", workdir=REPO)
    assert len(err.value.faults) == MAX_LISTED + 3
    assert len(str(err.value).splitlines()) == 1 + MAX_LISTED + 1
    assert str(err.value).endswith("... and 3 more")


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda c: c.update(trainn=c.pop("train")), "trainn: unknown key; did you mean 'train'?"),
        (
            lambda c: c["datasets"]["gsm8k"].update(path="resources/prompts/nope.jsonl"),
            "datasets.gsm8k.path: no such file 'resources/prompts/nope.jsonl'",
        ),
        (lambda c: c["bench"].update(chains=["0-1-1"]), "bench.chains[0]: chain '0-1-1'"),
        (lambda c: c["bench"].update(chains=["3-1-9"]), "bench.chains[0]: chain '3-1-9'"),
    ],
    ids=["top-level-typo", "missing-file", "chain-0-1-1", "chain-3-1-9"],
)
def test_snakemake_prints_a_short_error_naming_the_key(edit, named, tmp_path):
    work = scratch_dir(tmp_path)
    cfg = _default()
    edit(cfg)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = run_snakemake(work, "--configfile", str(tmp_path / "bad.yaml"))
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert named in output, output[-3000:]
    assert len(output.splitlines()) <= MAX_ERROR_LINES, output[-3000:]


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("", "datasets.gsm8k.path: prompts.json:1: not valid JSON"),
        ('[{"question": "1+1?"},', "datasets.gsm8k.path: prompts.json:1: not valid JSON"),
    ],
    ids=["empty", "broken-json"],
)
def test_a_dataset_file_snakemake_cannot_read_is_named_by_its_key(content, named, tmp_path):
    work = scratch_dir(tmp_path)
    (work / "prompts.json").write_text(content)
    cfg = _default()
    cfg["datasets"]["gsm8k"]["path"] = "prompts.json"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = run_snakemake(work, "--configfile", str(tmp_path / "bad.yaml"))
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and named in output, output[-3000:]
    assert len(output.splitlines()) <= MAX_ERROR_LINES, output[-3000:]


def test_a_float_written_1e_3_in_a_config_file_is_accepted_by_snakemake(tmp_path):
    work = scratch_dir(tmp_path)
    text = (REPO / "config" / "config.yaml").read_text().replace("lr: 0.001", "lr: 1e-3")
    assert "lr: 1e-3" in text
    (tmp_path / "e.yaml").write_text(text)
    proc = run_snakemake(work, "--quiet", "rules", "--configfile", str(tmp_path / "e.yaml"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_config_overrides_without_a_configfile_apply_to_the_default(tmp_path):
    work = scratch_dir(tmp_path)
    proc = run_snakemake(work, "--quiet", "rules")
    assert proc.returncode == 0 and "bench " in proc.stdout, proc.stdout[-3000:]
    proc = run_snakemake(
        work, "--quiet", "rules", "--config", "bench={enabled: false}", "train={lr: 5e-4}"
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tokenize" in proc.stdout and "bench " not in proc.stdout
    proc = run_snakemake(work, "--config", "generate={temprature: 0.5}")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "generate.temprature: unknown key" in output
    assert len(output.splitlines()) <= MAX_ERROR_LINES, output[-3000:]


def test_every_schema_key_has_a_description():
    missing = []

    def walk(node, where):
        if isinstance(node, dict):
            for key, sub in node.get("properties", {}).items():
                if "description" not in sub:
                    missing.append(f"{where}.{key}")
                walk(sub, f"{where}.{key}")
            if isinstance(node.get("additionalProperties"), dict):
                walk(node["additionalProperties"], f"{where}.*")

    walk(_load(SCHEMA), "config")
    assert not missing, missing


def test_a_variant_changes_only_train_keys_each_checked_like_the_key_itself():
    cfg = _default()
    cfg["train"]["variants"] = {
        "long": {"epochs": 12},
        "bad": {"lr": "fast", "eval_set": "gsm8k", "ephocs": 3},
        "base": {"epochs": 2},
    }
    faults = _faults(cfg)
    assert any(f.startswith("train.variants.bad.lr: ") for f in faults)
    assert "train.variants.bad.eval_set: unknown key" in faults  # shared: it decides the vocab
    assert any("ephocs" in f and "epochs" in f for f in faults)  # unknown key, with a suggestion
    assert any(f.startswith("train.variants.base: `base` is the recipe") for f in faults)
    assert not any("long" in f for f in faults)


def test_variants_keep_the_base_recipe_and_change_only_their_keys():
    from specbuild.config_check import train_variants

    cfg = _default()
    cfg["train"]["variants"] = {"long": {"epochs": 12}}
    variants = train_variants(cfg)
    assert list(variants) == ["base", "long"]
    assert variants["long"] == {**variants["base"], "epochs": 12}
    assert "variants" not in variants["base"]


def test_the_bench_picks_variants_by_name_and_others_drafters_by_folder_never_clashing():
    cfg = _default()
    cfg["train"]["variants"] = {"long": {"epochs": 12}, "none": {"lr": 1e-3}}
    cfg["bench"] |= {
        "variants": ["base", "lnog"],
        "drafters": {"long": "elsewhere/drafter", "theirs": "elsewhere/other"},
        "sweep_drafters": ["theirs", "warm"],
    }
    faults = _faults(cfg)
    assert any(
        f.startswith("train.variants.none: the name is the bench's no-drafter") for f in faults
    )
    assert (
        "bench.variants[1]: 'lnog' is no variant (variants: base, long, none); did you mean 'long'?"
        in faults
    )
    assert "bench.drafters.long: the name is a variant's; give this drafter another" in faults
    assert any(f.startswith("bench.sweep_drafters[1]: 'warm' is not benched") for f in faults)
    assert not any(f.startswith("bench.drafters.theirs: the name") for f in faults)


def test_the_single_bench_drafter_keys_are_refused_naming_their_successors():
    cfg = _default()
    cfg["bench"] |= {"drafter": "results/drafter/base", "drafter_name": "mine"}
    faults = _faults(cfg)
    assert len(faults) == 2
    assert faults[0].startswith("bench.drafter: moved to bench.variants (which of ours")
    assert "bench.drafters (name: folder" in faults[0]
    assert faults[1].startswith("bench.drafter_name: moved to the rows' `drafter`")


def test_a_recipe_trains_only_on_datasets_of_the_config_and_never_on_the_held_out_one():
    from specbuild.config_check import train_datasets, train_variants

    cfg = _default()
    cfg["train"] |= {"eval_set": "chat", "eval_fraction": 0}
    cfg["train"]["variants"] = {
        "mt": {"datasets": ["gsm8k", "chat"]},
        "typo": {"datasets": ["gms8k"]},
    }
    faults = _faults(cfg)
    assert faults == [
        "train.variants.mt.datasets: 'chat' is train.eval_set, held out: never trained on",
        "train.variants.typo.datasets: 'gms8k' is no dataset (datasets: gsm8k, chat); did you "
        "mean 'gsm8k'?",
    ]
    cfg["train"]["variants"] = {"mt": {"datasets": ["gsm8k"]}}
    check_config(cfg, schema=SCHEMA, source="test.yaml", workdir=REPO)
    variants = train_variants(cfg)
    assert train_datasets(cfg, variants["base"]) == ["gsm8k"]  # all but the held-out chat
    assert train_datasets(cfg, variants["mt"]) == ["gsm8k"]


def test_sglang_jobs_get_trust_remote_code_from_the_target_key_alone():
    from specbuild.config_check import sglang_server_args

    kimi = _load(REPO / "config" / "examples" / "kimi-k2.5-sglang-8xh200.yaml")
    check_config(kimi, schema=SCHEMA, source="kimi.yaml", workdir=REPO)
    assert kimi["target"]["trust_remote_code"] is True
    assert "trust_remote_code" not in kimi["sglang"]["server_args"]
    assert sglang_server_args(kimi)["trust_remote_code"] is True
    from specbuild.backends.server import build_server_args

    assert build_server_args(sglang_server_args(kimi)).count("--trust-remote-code") == 1
    cfg = _default()
    check_config(cfg, schema=SCHEMA, source="test.yaml", workdir=REPO)
    assert cfg["target"]["trust_remote_code"] is False  # the schema's default
    assert "trust_remote_code" not in sglang_server_args(cfg)


def test_trust_remote_code_in_the_server_args_is_refused_naming_the_target_key():
    cfg = _default()
    cfg["sglang"]["server_args"]["trust_remote_code"] = True
    (fault,) = _faults(cfg)
    assert fault.startswith("sglang.server_args.trust_remote_code: set target.trust_remote_code")
