"""The schema's front end (specbuild.config.schema): unknown keys, wrong types and values are
named by their dotted key with what was expected; scalars YAML reads as strings are read as the
schema's type; defaults are filled; and the schema is the one definition of every default that
a settings class repeats (the trainer's TrainConfig, each stage's settings)."""

import dataclasses
from collections.abc import Mapping

import pytest
import yaml
from config_cases import SCHEMA, default_config, faults, load_yaml, passes

from specbuild.align import AlignSettings
from specbuild.backends.base import SamplingParams
from specbuild.bench.run import BenchSettings
from specbuild.config.schema import VARIANT_FIXED, coerce_scalars, load_schema
from specbuild.drafter.config import ATTENTION, INITS, LOSS, DrafterConfig, TrainConfig
from specbuild.engines.server import ServerOptions
from specbuild.generate import GenerateSettings
from specbuild.hidden.extract import ExtractSettings
from specbuild.samples import SampleSettings
from specbuild.synthesize import PromptWriting
from specbuild.tuning import TuningSettings

# train keys the workflow reads and no trainer gets: which shards a recipe trains on (its
# inputs) and the other recipes
WORKFLOW_ONLY_TRAIN_KEYS = {"datasets", "variants"}


def test_unknown_key_is_named_with_its_path_and_the_likely_key():
    cfg = default_config()
    cfg["generate"]["temprature"] = 0.7
    assert faults(cfg) == ["generate.temprature: unknown key; did you mean 'temperature'?"]


def test_bad_enum_value_names_the_allowed_ones():
    cfg = default_config()
    cfg["tokenize"]["overlong"] = "wrap"
    assert faults(cfg) == ["tokenize.overlong: 'wrap' is not one of 'truncate', 'drop'"]


def test_schema_fills_defaults_for_omitted_sections():
    cfg = {"target": {"name": "t", "source": "gguf:pkg:f.gguf"}, "datasets": {"d": {"path": "x"}}}
    cfg["datasets"]["d"]["path"] = "resources/prompts/gsm8k_train.jsonl"
    passes(cfg)
    assert cfg["generate"]["temperature"] == 0.0 and cfg["tokenize"]["overlong"] == "truncate"
    assert cfg["datasets"]["d"]["shard_size"] == 64 and cfg["datasets"]["d"]["format"] == "auto"


def test_numbers_yaml_reads_as_strings_are_read_as_numbers():
    # YAML 1.1 (PyYAML) needs a dot for a float: `5e-4` and `1e3` come back as strings.
    cfg = default_config()
    cfg["train"].update(yaml.safe_load("lr: 5e-4\nepochs: 2e0\nfc_norm: 'yes'\n"))
    assert cfg["train"]["lr"] == "5e-4"
    passes(cfg)
    assert cfg["train"]["lr"] == 0.0005 and type(cfg["train"]["lr"]) is float
    assert cfg["train"]["epochs"] == 2 and type(cfg["train"]["epochs"]) is int
    assert cfg["train"]["fc_norm"] is True


def test_a_string_is_left_as_is_where_the_schema_allows_strings():
    schema = {"type": "object", "properties": {"eval_set": {"type": ["string", "null"]}}}
    assert coerce_scalars({"eval_set": "1e3"}, schema) == {"eval_set": "1e3"}


def test_a_string_that_is_no_number_is_named_with_the_type_expected():
    cfg = default_config()
    cfg["train"]["lr"] = "fast"
    cfg["datasets"]["gsm8k"]["limit"] = "2.5"
    assert faults(cfg) == [
        "datasets.gsm8k.limit: expected an integer or null, got string '2.5'",
        "train.lr: expected a number, got string 'fast'",
    ]


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

    walk(load_yaml(SCHEMA), "config")
    assert not missing, missing


def test_a_variant_changes_only_train_keys_each_checked_like_the_key_itself():
    cfg = default_config()
    cfg["train"]["variants"] = {
        "long": {"epochs": 12},
        "bad": {"lr": "fast", "eval_set": "gsm8k", "ephocs": 3},
    }
    got = faults(cfg)
    assert any(f.startswith("train.variants.bad.lr: ") for f in got)
    assert "train.variants.bad.eval_set: unknown key" in got  # shared: it decides the vocab
    assert any("ephocs" in f and "epochs" in f for f in got)  # unknown key, with a suggestion
    assert not any("long" in f for f in got)


def test_a_variants_schema_has_every_train_key_but_the_fixed_ones_and_no_defaults():
    train = load_schema(SCHEMA)["properties"]["train"]["properties"]
    variant = train["variants"]["additionalProperties"]["properties"]
    assert set(variant) == set(train) - set(VARIANT_FIXED)
    assert not any("default" in spec for spec in variant.values())


def _train_schema() -> dict:
    return load_yaml(SCHEMA)["properties"]["train"]["properties"]


# Every settings class built from a schema section's keys: the section's dotted path ("*":
# any dataset) and the class's own names for keys it names otherwise. A field of the section
# with a default must have the schema's; one without takes the job's param, always given.
# DrafterConfig repeats the train keys that shape the drafter (fc_norm), the rest are the
# target's; GenerateSettings reads generate's keys and a dataset's.
MIRRORS = [
    (TrainConfig, "train", {}),
    (DrafterConfig, "train", {}),
    (SampleSettings, "datasets.*", {"fmt": "format"}),
    (PromptWriting, "datasets.*.synthesize", {}),
    (SamplingParams, "generate", {}),
    (GenerateSettings, "generate", {}),
    (GenerateSettings, "datasets.*", {}),
    (GenerateSettings, "datasets.*.synthesize", {}),
    (ExtractSettings, "hidden", {}),
    (AlignSettings, "align", {}),
    (BenchSettings, "bench", {}),
    (TuningSettings, "sglang.tuning", {}),
    (ServerOptions, "sglang", {}),
]


def _section(path: str) -> dict:
    node = load_yaml(SCHEMA)
    for key in path.split("."):
        node = node["additionalProperties"] if key == "*" else node["properties"][key]
    return node["properties"]


def _same(ours, theirs) -> bool:
    """Equal and of one type, 1 and 1.0 being two params; a tuple stands for the schema's
    list (a frozen class holds no list) and any mapping for its object."""
    if isinstance(ours, tuple | list) and isinstance(theirs, list):
        return len(ours) == len(theirs) and all(map(_same, ours, theirs))
    if isinstance(ours, Mapping) and isinstance(theirs, dict):
        return ours.keys() == theirs.keys() and all(_same(ours[k], theirs[k]) for k in ours)
    return ours == theirs and type(ours) is type(theirs)


def _default(field: dataclasses.Field):
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


@pytest.mark.parametrize(
    "mirror, path, names", MIRRORS, ids=[f"{m.__name__}-{p}" for m, p, _ in MIRRORS]
)
def test_each_default_a_settings_class_repeats_is_the_schemas(mirror, path, names):
    # The workflow passes every key, so a differing default shows only where settings are
    # built without the workflow (tests, benchmarks): exactly where nobody would notice.
    schema = _section(path)
    fields = [f for f in dataclasses.fields(mirror) if names.get(f.name, f.name) in schema]
    assert fields, f"{mirror.__name__} names no key of {path}"
    differ = {}
    for field in fields:
        ours, theirs = _default(field), schema[names.get(field.name, field.name)].get("default")
        if ours is not dataclasses.MISSING and not _same(ours, theirs):
            differ[field.name] = (ours, theirs)
    assert not differ, f"{{field: ({mirror.__name__}'s, {path}'s)}}: {differ}"


def test_every_train_key_is_a_trainer_field_or_read_by_the_workflow_alone():
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    keys = set(_train_schema())
    assert keys - WORKFLOW_ONLY_TRAIN_KEYS == fields, {
        "schema keys no TrainConfig field takes": sorted(keys - WORKFLOW_ONLY_TRAIN_KEYS - fields),
        "TrainConfig fields the schema lacks": sorted(fields - keys),
    }
    assert not fields & WORKFLOW_ONLY_TRAIN_KEYS


def test_the_schemas_train_defaults_make_a_trainer_config_that_passes_its_checks():
    # the filled config, as the train rule's params pass it (train_hparams: no `datasets`)
    train = passes(default_config())["train"]
    params = {k: v for k, v in train.items() if k not in WORKFLOW_ONLY_TRAIN_KEYS}
    TrainConfig.from_params(params)  # raises naming any rejected combination


def test_the_trainers_choices_are_the_schemas():
    schema = _train_schema()
    assert set(schema["init"]["enum"]) == set(INITS)
    assert set(schema["attention"]["enum"]) == {"auto", *ATTENTION}
    assert set(schema["loss"]["enum"]) == {"auto", *LOSS}


def _name_at(cfg: dict, where: str, name: str) -> str:
    """Put `name` where a config name becomes a folder or file name; the dotted key faulted."""
    if where == "target.name":
        cfg["target"]["name"] = name
        return "target.name"
    if where == "bench.openai.drafter":
        cfg.setdefault("bench", {}).setdefault("openai", {})["drafter"] = name
        return "bench.openai.drafter"
    section, *rest = where.split(".")
    spec = {"datasets": {"path": "x.jsonl"}, "bench.sets": {"path": "x.jsonl"}}.get(where, {})
    node = cfg.setdefault(section, {})
    for key in rest:
        node = node.setdefault(key, {})
    node[name] = spec
    return where


# every config name that becomes a path component: results/target/<target.name>/,
# results/*/<dataset>/, results/{train,drafter}/<variant>/, results/bench/<engine>/<drafter>/,
# results/tuning/<point>.json; bench sets name rows and tables
PATH_NAMES = [
    "target.name",
    "datasets",
    "train.variants",
    "bench.drafters",
    "bench.sets",
    "bench.openai.drafter",
    "sglang.tuning.points",
]


@pytest.mark.parametrize("where", PATH_NAMES)
@pytest.mark.parametrize("name", ["..", ".", "", "a/../..", "/etc", "a\0b"])
def test_a_name_that_would_leave_its_folder_is_refused(where, name):
    cfg = default_config()
    key = _name_at(cfg, where, name)
    found = [f for f in faults(cfg) if f.startswith(key)]
    assert found, faults(cfg)
    assert " must match " in found[0] and "(" in found[0], found[0]


def test_dots_among_other_characters_still_make_a_name():
    cfg = default_config()
    cfg["target"]["name"] = "smollm2-135m.v2"
    assert passes(cfg)["target"]["name"] == "smollm2-135m.v2"


def test_every_env_name_key_has_the_pattern_serve_sh_exports_by():
    from specbuild.infra.shell import ENV_NAME

    schema = load_yaml(SCHEMA)
    sglang = schema["properties"]["sglang"]["properties"]
    point = sglang["tuning"]["properties"]["points"]["additionalProperties"]["properties"]
    openai = schema["properties"]["bench"]["properties"]["openai"]["properties"]
    patterns = [
        sglang["env"]["propertyNames"]["pattern"],
        point["env"]["propertyNames"]["pattern"],
        sglang["api_key_env"]["pattern"],
        sglang["serve_api_key_env"]["pattern"],
        openai["api_key_env"]["pattern"],
    ]
    assert patterns == [f"^{ENV_NAME.pattern}$"] * len(patterns)


@pytest.mark.parametrize("where", ["sglang", "point"])
def test_an_env_name_that_is_no_variable_name_is_refused_naming_it(where):
    cfg = default_config()
    env = {"X=1; touch f; Y": "v"}
    if where == "sglang":
        cfg.setdefault("sglang", {})["env"] = env
        key = "sglang.env"
    else:
        cfg.setdefault("sglang", {})["tuning"] = {"points": {"p": {"env": env}}}
        key = "sglang.tuning.points.p.env"
    assert faults(cfg) == [
        f"{key}: name 'X=1; touch f; Y' must match '^[A-Za-z_][A-Za-z0-9_]*$' (an environment "
        "variable's name is letters, digits and `_`, not starting with a digit)"
    ]


# Every count that multiplies work, one past its maximum: the config check refuses each one
# before a job grows it into gigabytes (answers of 10**9 reached MemoryError in generate).
WORK_BOUNDS = {
    "datasets.chat.synthesize.count": 10_000_000,
    "datasets.chat.synthesize.max_tokens": 32_768,
    "datasets.gsm8k.max_prompt_tokens": 1_048_576,
    "datasets.gsm8k.max_new_tokens": 131_072,
    "datasets.gsm8k.answers": 64,
    "datasets.gsm8k.shard_size": 100_000,
    "generate.max_new_tokens": 131_072,
    "generate.batch_size": 4096,
    "tokenize.max_length": 1_048_576,
    "hidden.batch_tokens": 16_777_216,
    "hidden.threads": 1024,
    "vocab.draft_size": 1_048_576,
    "sglang.max_concurrency": 4096,
    "sglang.tuning.prompts": 100_000,
    "sglang.tuning.max_new_tokens": 131_072,
    "sglang.tuning.concurrency[0]": 4096,
    "sglang.tuning.sweep_min_requests": 100_000,
    "train.ttt_steps": 64,
    "train.epochs": 1000,
    "train.token_budget": 16_777_216,
    "train.max_length": 1_048_576,
    "train.nproc": 1024,
    "align.samples": 100_000,
    "bench.max_new_tokens": 131_072,
    "bench.concurrency[0]": 4096,
    "bench.sweep_min_requests": 100_000,
    "bench.hf.threads": 1024,
}


def _set(config: dict, key: str, value) -> None:
    *parents, last = key.split(".")
    for part in parents:
        config = config.setdefault(part, {})
    if last.endswith("[0]"):
        config[last[:-3]] = [value]
    else:
        config[last] = value


@pytest.mark.parametrize(("key", "most"), WORK_BOUNDS.items(), ids=list(WORK_BOUNDS))
def test_a_count_that_multiplies_work_has_a_maximum(key, most):
    cfg = default_config()
    _set(cfg, key, most)
    if key == "datasets.gsm8k.answers":
        cfg["datasets"]["gsm8k"]["temperature"] = 0.7  # several answers need sampling
    passes(cfg)
    cfg = default_config()
    _set(cfg, key, most + 1)
    assert faults(cfg) == [f"{key}: {most + 1} is greater than the maximum of {most}"]


def test_a_shard_of_more_answers_than_one_job_holds_is_refused_naming_both_keys():
    cfg = default_config()
    cfg["datasets"]["gsm8k"] |= {"answers": 64, "shard_size": 20_000, "temperature": 0.7}
    assert faults(cfg) == [
        "datasets.gsm8k.answers: 64 answers to each of shard_size 20000 records is 1,280,000 "
        "samples in one generate job, more than 1,000,000; lower datasets.gsm8k.shard_size or "
        "answers"
    ]
