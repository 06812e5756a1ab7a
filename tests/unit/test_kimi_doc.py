"""docs/kimi-k2.5.md works as written: each YAML block, merged over the Kimi example, passes the
config check; each snakemake command dry-runs (`-n`) in a scratch directory; and the numbers it
computes (job counts, bytes, the disk check's verdict) are what the code computes."""

from __future__ import annotations

import copy
import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specbuild.config import check_config
from specbuild.hidden.shards import shard_nbytes

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "kimi-k2.5.md"
EXAMPLE = REPO / "config" / "examples" / "kimi-k2.5-sglang-8xh200.yaml"
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
TEXT = DOC.read_text()
BLOCKS = [(m.group(1), m.group(2)) for m in FENCE.finditer(TEXT)]
YAML = [body for lang, body in BLOCKS if lang == "yaml"]
COMMANDS = [line for lang, body in BLOCKS if lang == "sh" for line in body.splitlines() if line]


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def test_the_page_has_yaml_and_commands_and_nothing_else():
    assert YAML and COMMANDS
    assert {lang for lang, _ in BLOCKS} == {"yaml", "sh"}


@pytest.mark.parametrize("block", YAML)
def test_each_yaml_block_passes_the_config_check_over_the_kimi_example(block):
    config = _merge(yaml.safe_load(EXAMPLE.read_text()), yaml.safe_load(block))
    check_config(config, schema=REPO / "config" / "config.schema.yaml", source="doc", workdir=REPO)
    assert config["target"]["trust_remote_code"] is True


@functools.cache  # the cost table reads the first command's dry-run: one Snakemake run for both
def _dry_run(command: str, workdir: Path) -> str:
    args = shlex.split(command)
    assert args[0] == "snakemake", command
    args = [str(SNAKEMAKE), *args[1:], "--snakefile", str(REPO / "Snakefile")]
    if "-n" not in args:
        args.append("-n")
    proc = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("kimi-doc")
    for name in ("resources", "config"):
        (work / name).symlink_to(REPO / name)
    return work


@pytest.mark.slow  # a Snakemake parse of the Kimi example each
@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_dry_runs(command, scratch):
    _dry_run(command, scratch)
    assert not (scratch / "results").exists()  # a dry run writes nothing


@pytest.mark.slow
def test_the_cost_table_counts_the_jobs_of_the_dry_run(scratch):
    out = _dry_run(COMMANDS[0], scratch)
    stats = out[out.index("Job stats") :]
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.M)}
    jobs = {"generate": 2, "hidden": 2, "align": 1, "bench": 3, "tuning": 11}
    assert {k: counts[k] for k in jobs} == jobs
    # run locally the generate jobs share one server (sglang.share_idle_s), the hidden jobs
    # one engine (hidden.share_idle_s) and align's sample runs on it; through profiles/slurm
    # each of those stages' shards share one in their group's cluster job, align has its own
    loads = {**jobs, "generate": 1, "hidden": 1, "align": 0}
    assert f"In all, {sum(loads.values())} loads" in TEXT
    slurm = {**loads, "align": 1}
    assert f"{sum(slurm.values())} through the SLURM profile" in TEXT


def test_the_bytes_and_the_disk_checks_verdict_are_what_the_code_computes():
    per_token = shard_nbytes(tokens=10**6, samples=1, hidden_size=7168, storage="fp8") // 10**6
    assert f"{per_token:,}".replace(",", " ") + " B/token" in TEXT
    total = shard_nbytes(tokens=15_000 * 5_000, samples=15_000, hidden_size=7168, storage="fp8")
    bf16 = shard_nbytes(tokens=15_000 * 5_000, samples=15_000, hidden_size=7168, storage="bf16")
    assert f"{total / 1e12:.2f} TB for 15K" in TEXT and f"{bf16 / 1e12:.2f} TB" in TEXT
    for samples, size, free in ((4096, "588 GB", "617 GB"), (512, "73.5 GB", "77.1 GB")):
        n = shard_nbytes(tokens=samples * 5_000, samples=samples, hidden_size=7168, storage="fp8")
        assert (f"{n / 1e9:.3g} GB", f"{n * 1.05 / 1e9:.3g} GB") == (size, free)
        assert size in TEXT and free in TEXT
    assert f"{163840 * 7168 * 2 / 1e9:.2f} GB each in bf16" in TEXT
