"""`check_config`, the package's front door: every shipped config validates and dry-runs; a
faulty config gets one short error that names every faulty key and what was expected, never the
schema dump, through Snakemake as well; and checking a config loads no stage of the workflow."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from config_cases import REPO, SCHEMA, default_config, faults, load_yaml
from snakemake.utils import validate

from specbuild.config import ConfigError, check_config
from specbuild.config.schema import MAX_LISTED

CONFIGS = sorted([REPO / "config" / "config.yaml", *(REPO / "config" / "examples").glob("*.yaml")])
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
MAX_ERROR_LINES = 15  # all of what snakemake prints for a faulty config
# What checking a config may import of specbuild: the package, and the neutral modules that
# define what it checks (a chain's name, a drafter folder's fit to the target, its file names,
# whether a server's host is loopback, a safetensors header, what a credential looks like).
NEUTRAL = {
    "specbuild",
    "specbuild.eagle",
    "specbuild.eagle.chain",
    "specbuild.eagle.drafter_fit",
    "specbuild.eagle.drafter_tensors",
    "specbuild.eagle.layers",
    "specbuild.infra",
    "specbuild.infra.credential_patterns",
    "specbuild.infra.formats",
    "specbuild.infra.hosts",
    "specbuild.infra.safetensors_header",
    "specbuild.infra.server_flags",
    "specbuild.infra.shell",
}


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
    check_config(load_yaml(path), schema=SCHEMA, source=str(path), workdir=REPO)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_defaults_are_filled_exactly_as_snakemakes_validate_filled_them(path):
    # Params come from the filled config: any difference would rerun jobs of finished builds.
    ours, theirs = load_yaml(path), load_yaml(path)
    check_config(ours, schema=SCHEMA, source=str(path), workdir=REPO)
    validate(theirs, schema=str(SCHEMA))
    assert ours == theirs


def test_checking_a_config_imports_no_stage_module_and_no_torch():
    code = (
        "import sys; from specbuild.config import check_config; "
        f"check_config({default_config()!r}, schema={str(SCHEMA)!r}, source='t', "
        f"workdir={str(REPO)!r}); "
        "print(' '.join(m for m in sys.modules if m.startswith(('specbuild', 'torch'))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(proc.stdout.split())
    assert "specbuild.config.checks" in loaded
    others = {m for m in loaded if not m.startswith("specbuild.config")} - NEUTRAL
    assert not others, sorted(others)


def test_every_fault_is_listed_once_and_long_lists_are_cut():
    cfg = default_config()
    cfg["datasets"]["chat"]["path"] = "x.jsonl"  # both path and synthesize
    cfg["generate"]["backend"] = "openai"  # without sglang.endpoint
    cfg["bench"]["chains"] = [341]  # a type fault: the chain check leaves it to the schema
    del cfg["target"]["source"]
    assert faults(cfg) == [
        "bench.chains[0]: expected a string, got integer 341",
        "datasets.chat: give exactly one of path or synthesize (found path and synthesize)",
        "target.source: missing (required)",
        "sglang.endpoint: generate.backend openai needs the server's base URL here "
        "(e.g. http://host:30000/v1)",
    ]
    many = copy.deepcopy(default_config())
    many["train"].update({f"typo{i}": 1 for i in range(MAX_LISTED + 3)})
    with pytest.raises(ConfigError) as err:
        check_config(many, schema=SCHEMA, source="test.yaml", workdir=REPO)
    assert len(err.value.faults) == MAX_LISTED + 3
    assert len(str(err.value).splitlines()) == 1 + MAX_LISTED + 1
    assert str(err.value).endswith("... and 3 more")


def test_a_key_faulted_by_the_schema_is_not_faulted_again_across_keys():
    cfg = default_config()
    cfg["train"].update(init="warm", init_from="results/drafter")  # no init choice; and both
    assert faults(cfg) == [
        "train.init: 'warm' is not one of 'random', 'target_last_layer'",
    ]


@pytest.mark.slow  # starts Snakemake
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_dry_runs_in_a_scratch_directory(path, tmp_path):
    # Its own directory: results of `make run` in the repo must not make tokenize look done.
    work = scratch_dir(tmp_path)
    proc = run_snakemake(work, "--quiet", "rules", "--configfile", str(path))
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "tokenize" in proc.stdout
    assert (work / ".snakemake").is_dir()  # the dry-run's metadata went here, not to the repo


@pytest.mark.slow  # starts Snakemake
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
        (
            lambda c: c["datasets"]["gsm8k"].update(answers=2),
            "datasets.gsm8k.answers: 2 answers per prompt need a temperature > 0",
        ),
    ],
    ids=["top-level-typo", "missing-file", "chain-0-1-1", "chain-3-1-9", "greedy-answers"],
)
def test_snakemake_prints_a_short_error_naming_the_key(edit, named, tmp_path):
    work = scratch_dir(tmp_path)
    cfg = default_config()
    edit(cfg)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = run_snakemake(work, "--configfile", str(tmp_path / "bad.yaml"))
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert named in output, output[-3000:]
    assert len(output.splitlines()) <= MAX_ERROR_LINES, output[-3000:]


@pytest.mark.slow  # starts Snakemake
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
    cfg = default_config()
    cfg["datasets"]["gsm8k"]["path"] = "prompts.json"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = run_snakemake(work, "--configfile", str(tmp_path / "bad.yaml"))
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and named in output, output[-3000:]
    assert len(output.splitlines()) <= MAX_ERROR_LINES, output[-3000:]


@pytest.mark.slow  # starts Snakemake
def test_a_float_written_1e_3_in_a_config_file_is_accepted_by_snakemake(tmp_path):
    work = scratch_dir(tmp_path)
    text = (REPO / "config" / "config.yaml").read_text().replace("lr: 0.001", "lr: 1e-3")
    assert "lr: 1e-3" in text
    (tmp_path / "e.yaml").write_text(text)
    proc = run_snakemake(work, "--quiet", "rules", "--configfile", str(tmp_path / "e.yaml"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.slow  # starts Snakemake
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
