"""Every shipped config validates and dry-runs; the schema rejects typos with the key's name."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "config" / "config.schema.yaml"
CONFIGS = sorted([REPO / "config" / "config.yaml", *(REPO / "config" / "examples").glob("*.yaml")])
SNAKEMAKE = Path(sys.executable).with_name("snakemake")


def _load(path):
    return yaml.safe_load(path.read_text())


def test_there_are_example_configs_for_gpu_targets():
    assert len(CONFIGS) >= 3, [c.name for c in CONFIGS]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_passes_the_schema(path):
    validate(_load(path), schema=str(SCHEMA))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_dry_runs(path, tmp_path):
    # --directory keeps the dry-run's .snakemake/ metadata out of the repo; it sees no results.
    proc = subprocess.run(
        [
            str(SNAKEMAKE),
            "-n",
            "--quiet",
            "rules",
            "--cores",
            "1",
            "--configfile",
            str(path),
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tokenize" in proc.stdout


def test_unknown_key_is_rejected_naming_it():
    cfg = _load(REPO / "config" / "config.yaml")
    cfg["generate"]["temprature"] = 0.7
    with pytest.raises(WorkflowError, match="temprature"):
        validate(cfg, schema=str(SCHEMA))


def test_bad_enum_value_names_the_allowed_ones():
    cfg = copy.deepcopy(_load(REPO / "config" / "config.yaml"))
    cfg["tokenize"]["overlong"] = "wrap"
    with pytest.raises(WorkflowError, match="'wrap' is not one of \\['truncate', 'drop'\\]"):
        validate(cfg, schema=str(SCHEMA))


def test_schema_fills_defaults_for_omitted_sections():
    cfg = {"target": {"name": "t", "source": "gguf:pkg:f.gguf"}, "datasets": {"d": {"path": "x"}}}
    validate(cfg, schema=str(SCHEMA))
    assert cfg["generate"]["temperature"] == 0.0 and cfg["tokenize"]["overlong"] == "truncate"
    assert cfg["datasets"]["d"]["shard_size"] == 64 and cfg["datasets"]["d"]["format"] == "auto"


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
