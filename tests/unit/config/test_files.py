"""Config files are read as plain data before Snakemake loads them (specbuild.config.files):
YTE switches, Python tags, alias bombs, repeated keys and keys YAML reads as no string are faults
naming file, line and key; a file that is no mapping of sections, or missing, is named alone; a
loaded config holding a Python object, a key that is no string, or too many or too deep values,
is refused by check_config before any other check."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from specbuild.config import ConfigError, check_config
from specbuild.config.files import (
    MAX_DEPTH,
    MAX_VALUES,
    ConfigFileError,
    check_configfiles,
    config_value_faults,
    config_values_of,
    configfile_faults,
    configfiles_of,
    refuse_unsafe_configfiles,
    value_faults,
)

REPO = Path(__file__).resolve().parents[3]
SCHEMA = REPO / "config" / "config.schema.yaml"

# ten anchors of ten aliases each: 10**6 values once expanded, 11 lines written
BOMB = "".join(
    f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" if i else "    l0: &l0 [1, 1]\n"
    for i in range(7)
)


def write(tmp_path: Path, text: str, name: str = "my.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_every_config_the_project_ships_is_plain_data():
    shipped = [*sorted((REPO / "config").rglob("*.yaml")), *(REPO / "profiles").glob("*/*.yaml")]
    shipped = [p for p in shipped if p.parent.name != "default"]  # the profile runs the check
    assert len(shipped) >= 5
    assert {str(p): configfile_faults(p) for p in shipped} == {str(p): [] for p in shipped}


def test_a_yte_switch_is_refused_naming_the_file_and_line(tmp_path):
    path = write(tmp_path, "target: {name: t, source: s}\n__use_yte__: true\n")
    (fault,) = configfile_faults(path)
    assert fault.startswith(f"{path}, line 2: __use_yte__: YTE templates run Python")


# Each brings a YTE keyword or expression where YTE reads it, past a look at the top-level keys
YTE_CARRIED = {
    "merge": (
        "target: {name: t, source: s}\n<<: {__use_yte__: true}\nx: ?open('ran', 'w')\n",
        [
            "line 2: <<.__use_yte__: YTE templates run Python",
            "line 3: x: the value '?open(''ran'', ''w'')' starts with `?`",
        ],
    ),
    "anchor": (
        "defaults: &d {__use_yte__: true}\n<<: *d\n",
        ["line 1: defaults.__use_yte__: YTE templates run Python"],
    ),
    "alias-key": (
        "target: {name: &k __use_yte__, source: s}\n*k : true\n",
        ["line 1: target.name: the value __use_yte__ is a YTE keyword"],
    ),
    "merged-list": (
        "x:\n  - &a {__definitions__: ['print(1)']}\n<<: [*a]\n",
        ["line 2: x[0].__definitions__: YTE templates run Python"],
    ),
    "nested": (
        "sglang:\n  env:\n    __variables__: {a: 1}\n    '?if True': {A: 1}\n",
        [
            "line 3: sglang.env.__variables__: YTE templates run Python",
            "line 4: sglang.env.?if True: the key '?if True' starts with `?`",
        ],
    ),
}


@pytest.mark.parametrize("text, faults", YTE_CARRIED.values(), ids=list(YTE_CARRIED))
def test_a_yte_keyword_or_expression_is_refused_wherever_yaml_puts_it(tmp_path, text, faults):
    path = write(tmp_path, text)
    found = configfile_faults(path)
    assert len(found) == len(faults), found
    for line, fault in zip(found, faults, strict=True):
        assert line.startswith(f"{path}, {fault}"), line


def test_a_merge_key_switches_yte_on_for_snakemakes_loader(tmp_path):
    """Why every scalar is checked: YTE looks for its switch in the loaded mapping, after the
    merge, so a file whose top-level keys hold no switch still runs its expressions."""
    import yte

    ran = tmp_path / "ran.txt"
    text = f"<<: {{__use_yte__: true}}\nx: ?open({str(ran)!r}, 'w').write('ran')\n"
    yte.process_yaml(text, require_use_yte=True)
    assert ran.read_text() == "ran"
    assert "x: the value" in configfile_faults(write(tmp_path, text))[1]


def test_a_python_tag_is_refused_with_its_key_not_as_a_tab_fault(tmp_path):
    path = write(tmp_path, "sglang:\n  env:\n    X: !!python/name:os.system\n")
    (fault,) = configfile_faults(path)
    assert fault.startswith(f"{path}, line 3: sglang.env.X: tag !!python/name:os.system builds")
    assert "tab" not in fault


def test_a_custom_tag_and_a_syntax_error_name_their_lines(tmp_path):
    tagged = write(tmp_path, "train:\n  lr: !float 1e-4\n", "tagged.yaml")
    assert configfile_faults(tagged)[0].startswith(f"{tagged}, line 2: train.lr: tag !float")
    broken = write(tmp_path, "train:\n\tlr: 1\n", "broken.yaml")
    assert configfile_faults(broken) == [
        f"{broken}, line 2: not valid YAML: found character '\\t' that cannot start any token"
    ]


def test_an_alias_bomb_in_a_free_form_key_is_refused_at_its_key(tmp_path):
    path = write(tmp_path, "sglang:\n  server_args:\n" + BOMB)
    (fault,) = configfile_faults(path)
    assert "sglang.server_args.l5[" in fault
    assert f"more than {MAX_VALUES:,} values with its aliases expanded" in fault


def test_a_self_referring_alias_and_deep_nesting_are_refused(tmp_path):
    cyclic = write(tmp_path, "sglang:\n  server_args:\n    a: &a [1, *a]\n", "cyclic.yaml")
    assert "sglang.server_args.a[1]: alias *a refers to itself" in configfile_faults(cyclic)[0]
    deep = write(tmp_path, "x: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "deep.yaml")
    assert f"nested deeper than {MAX_DEPTH} levels" in configfile_faults(deep)[0]


def test_a_json_config_is_bounded_like_yaml(tmp_path):
    path = write(tmp_path, '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}", "deep.json")
    assert "nested deeper" in configfile_faults(path)[0]
    fine = write(tmp_path, '{"train": {"lr": 0.001}}', "fine.json")
    assert configfile_faults(fine) == []


def test_the_command_line_files_are_found_in_every_spelling():
    argv = ["-n", "--config", "a=1", "--configfile", "a.yaml", "b.yaml", "--cores", "1"]
    argv += ["--configf=c.yaml", "--configfiles", "d.yaml", "--", "e.yaml"]
    assert configfiles_of(argv) == ["a.yaml", "b.yaml", "c.yaml", "d.yaml"]


def test_refusing_exits_with_every_fault_and_passes_clean_files(tmp_path):
    good = write(tmp_path, "train: {lr: 0.001}\n", "good.yaml")
    bad = write(tmp_path, "__use_yte__: true\nx: !!python/name:os.system\n", "bad.yaml")
    refuse_unsafe_configfiles(["--configfile", str(good)])
    with pytest.raises(SystemExit) as exit_:
        refuse_unsafe_configfiles(["--configfile", str(good), str(bad)])
    message = str(exit_.value.code)
    assert message.startswith("2 config problems: a config is data, never code")
    assert f"{bad}, line 1: __use_yte__" in message and f"{bad}, line 2: x: tag" in message
    with pytest.raises(ConfigFileError):
        check_configfiles([bad])


def _config() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))


def test_a_python_object_in_a_loaded_config_never_reaches_a_param():
    config = _config()
    config["sglang"] = {"env": {"X": os.system}}
    with pytest.raises(ConfigError) as err:
        check_config(config, schema=SCHEMA, source="my.yaml", workdir=REPO)
    assert err.value.faults == [
        "sglang.env.X: a Python builtin_function_or_method, not a value; a config holds "
        "strings, numbers, booleans, lists and mappings only"
    ]


def test_a_loaded_alias_bomb_is_refused_before_the_schema_walks_it():
    layer: list = [1, 1]
    for _ in range(30):  # 2**30 values reached, 60 objects in memory
        layer = [layer, layer]
    config = _config()
    config["sglang"] = {"server_args": {"x": layer}}
    assert value_faults(config)[0].startswith("sglang.server_args.x")
    with pytest.raises(ConfigError) as err:
        check_config(config, schema=SCHEMA, source="my.yaml", workdir=REPO)
    assert "nested deeper than 16 levels" in err.value.faults[0]
    wide = {f"k{i}": [0] * 1000 for i in range(200)}
    assert value_faults({"sglang": {"server_args": wide}})[0].startswith("sglang.server_args.k")


@pytest.mark.parametrize(
    ("key", "text", "shown"),
    [("align", "{min_cosine: .nan}", "nan"), ("train", "{lr: .inf}", "inf")],
)
def test_a_number_that_is_not_finite_is_refused_naming_its_key(key, text, shown):
    """NaN compares false with every bound, so `.nan` would pass the schema and turn a
    threshold into no check at all."""
    config = _config()
    config[key] = yaml.safe_load(text)
    with pytest.raises(ConfigError) as err:
        check_config(config, schema=SCHEMA, source="my.yaml", workdir=REPO)
    (name,) = config[key]
    assert err.value.faults == [f"{key}.{name}: {shown} is not a finite number"]


def test_config_values_on_the_command_line_are_bounded_like_files():
    argv = ["-n", "--config", "a=1", "train={lr: 1}", "--cores", "1", "-C", "b=2"]
    assert config_values_of(argv) == ["a=1", "train={lr: 1}", "b=2"]
    assert config_value_faults("train={lr: 5e-4, epochs: 2}") == []
    levels = ", ".join(
        f"m{i}: &m{i} {{{', '.join(f'k{j}: *m{i - 1}' for j in range(10))}}}"
        if i
        else "m0: &m0 {x: 1}"
        for i in range(7)
    )
    (fault,) = config_value_faults(f"sglang={{server_args: {{{levels}}}}}")
    assert fault.startswith("--config, line 1: sglang.server_args.m5.k")
    assert f"more than {MAX_VALUES:,} values" in fault


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        (
            "datasets:\n  no: {path: a.jsonl}\n",
            "line 2: datasets.no: a key must be a string, and YAML reads `no` as false "
            "(a boolean); quote it: 'no'",
        ),
        (
            "datasets:\n  On: {path: a.jsonl}\n",
            "line 2: datasets.On: a key must be a string, and YAML reads `On` as true "
            "(a boolean); quote it: 'On'",
        ),
        (
            "datasets:\n  2024: {path: a.jsonl}\n",
            "line 2: datasets.2024: a key must be a string, and YAML reads `2024` as an "
            "integer; quote it: '2024'",
        ),
        (
            "datasets:\n  ~: {path: a.jsonl}\n",
            "line 2: datasets.~: a key must be a string, and YAML reads `~` as null; quote it: '~'",
        ),
        (
            "train:\n  lr: 0.001\n  variants:\n    7: {epochs: 2}\n",
            "line 4: train.variants.7: a key must be a string, and YAML reads `7` as an "
            "integer; quote it: '7'",
        ),
        (
            "5: x\n",
            "line 1: 5: a key must be a string, and YAML reads `5` as an integer; quote it: '5'",
        ),
        (
            "datasets:\n  2024-01-31: {path: a.jsonl}\n",
            "line 2: datasets.2024-01-31: a key must be a string, and YAML reads `2024-01-31` "
            "as a date; quote it: '2024-01-31'",
        ),
        (
            "datasets:\n  ? [a, b]\n  : {path: a.jsonl}\n",
            "line 2: datasets.?: a key must be a string, not a collection",
        ),
    ],
    ids=["no", "On", "year", "tilde", "variant-7", "top-level-5", "date", "list-key"],
)
def test_a_key_yaml_reads_as_no_string_is_named_as_written(tmp_path, text, fault):
    path = write(tmp_path, text)
    assert configfile_faults(path) == [f"{path}, {fault}"]


def test_a_quoted_key_that_looks_like_a_boolean_or_a_number_is_a_string(tmp_path):
    path = write(tmp_path, "datasets:\n  'no': {path: a.jsonl}\n  \"2024\": {path: b.jsonl}\n")
    assert configfile_faults(path) == []


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        (
            "train:\n  lr: 0.0001\n  epochs: 2\n  lr: 0.5\n",
            "line 4: train.lr: repeated (first at line 2)",
        ),
        (
            "target:\n  name: t\n  source: s\ntrain: {lr: 0.1}\ntarget:\n  name: other\n",
            "line 5: target: repeated (first at line 1)",
        ),
        (
            "sglang:\n  env: {A: 1, B: 2, A: 3}\n",
            "line 2: sglang.env.A: repeated (first at line 2)",
        ),
        ("train:\n  lr: 0.1\n  'lr': 0.2\n", "line 3: train.lr: repeated (first at line 2)"),
    ],
    ids=["leaf", "section", "flow-mapping", "quoted-twin"],
)
def test_a_repeated_key_is_named_with_both_lines(tmp_path, text, fault):
    path = write(tmp_path, text)
    assert configfile_faults(path) == [
        f"{path}, {fault}; give each key once in a mapping (YAML keeps the last and drops the "
        "first)"
    ]


def test_the_same_key_in_two_mappings_and_a_merge_override_are_not_repeats(tmp_path):
    text = "base: &b {lr: 0.1, epochs: 2}\ntrain:\n  <<: *b\n  lr: 0.2\nalign: {lr: 0.1}\n"
    assert configfile_faults(write(tmp_path, text)) == []


def test_a_repeated_key_in_a_json_config_is_named_with_its_line(tmp_path):
    path = write(tmp_path, '{"train": {"lr": 0.1,\n  "lr": 0.2}}', "dup.json")
    assert configfile_faults(path) == [
        f"{path}, line 2: train.lr: repeated (first at line 1); give each key once in a "
        "mapping (YAML keeps the last and drops the first)"
    ]


@pytest.mark.parametrize(
    ("name", "text", "holds"),
    [
        ("empty.yaml", "", "this file is empty"),
        ("comments.yaml", "# train:\n#   lr: 0.1\n", "this file is empty"),
        ("dash.yaml", "---\n", "this file holds nothing"),
        ("list.yaml", "- train\n- datasets\n", "this file holds a list"),
        ("word.yaml", "train\n", "this file holds a string"),
        ("number.yaml", "42\n", "this file holds an integer"),
        ("list.json", "[1, 2]", "this file holds a list"),
        ("null.json", "null", "this file holds null"),
    ],
)
def test_a_file_that_is_no_mapping_of_sections_is_named(tmp_path, name, text, holds):
    path = write(tmp_path, text, name)
    assert configfile_faults(path) == [
        f"{path}: a config is a mapping of sections at top level (target:, datasets:, ...); {holds}"
    ]


def test_a_second_yaml_document_is_named_at_its_line(tmp_path):
    path = write(tmp_path, "train: {lr: 0.1}\n---\ntrain: {lr: 0.2}\n")
    assert configfile_faults(path) == [
        f"{path}, line 2: a second YAML document (---); a config file holds one"
    ]


def test_a_missing_config_file_is_one_line_naming_it(tmp_path):
    missing = tmp_path / "missing.yaml"
    assert configfile_faults(missing) == [f"{missing}: no such config file (--configfile)"]
    with pytest.raises(SystemExit) as exit_:
        refuse_unsafe_configfiles(["-n", "--configfile", str(missing)])
    lines = str(exit_.value.code).splitlines()
    assert lines[1:] == [f"  {missing}: no such config file (--configfile)"]
    assert "Traceback" not in str(exit_.value.code)


def test_a_loaded_key_that_is_no_string_is_refused_before_any_other_check(tmp_path):
    """The config as Snakemake loads it (PyYAML's types): the schema and the rules never see
    a key they would join or match as a string."""
    text = (REPO / "config" / "config.yaml").read_text(encoding="utf-8")
    config = yaml.safe_load(text.replace("\n  gsm8k:\n", "\n  no:\n", 1))
    config["sglang"]["env"] = yaml.safe_load("{7: x}")
    config["train"]["variants"] = yaml.safe_load("{2024: {epochs: 2}, ~: {epochs: 3}}")
    with pytest.raises(ConfigError) as err:
        check_config(config, schema=SCHEMA, source="my.yaml", workdir=tmp_path)
    assert err.value.faults == [  # in the config's order: datasets, sglang, train
        "datasets.False: a key must be a string, and this one is the boolean false (YAML reads "
        "unquoted yes, no, on, off, true and false as booleans); quote it",
        "sglang.env.7: a key must be a string, and this one is the number 7 (YAML reads "
        "unquoted numbers as numbers); quote it",
        "train.variants.2024: a key must be a string, and this one is the number 2024 (YAML "
        "reads unquoted numbers as numbers); quote it",
        "train.variants.None: a key must be a string, and this one is null (YAML reads "
        "unquoted ~, null and an empty key as null); quote it",
    ]
