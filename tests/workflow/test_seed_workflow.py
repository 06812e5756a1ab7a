"""A data seed (specbuild/seed.py) carried from a built workflow into a fresh one: the fresh
build schedules no samples or generate job, starts at tokenize, and tokenizes the carried rows
to the same files the first build wrote."""

from __future__ import annotations

import pytest
from workflow_helpers import (
    SNAKEMAKE,
    make_workdir,
    planned_jobs,
    same_result,
    snakemake,
)

from specbuild.seed import pack, plant

pytestmark = pytest.mark.workflow

DATA_RULES = {"samples", "synthesize", "generate"}


def test_a_planted_seed_starts_the_build_at_tokenize(built_workflow, tmp_path, target_dir):
    built = built_workflow.workdir
    seed = tmp_path / "data.tar.gz"
    shards = pack(seed, built)
    generated = (built / "results/generated").glob("*/*.jsonl")
    assert shards == sorted(str(p.relative_to(built)) for p in generated if p.stem.isdigit())
    assert shards and not any(rule in DATA_RULES for rule, _ in planned_jobs(built))

    fresh = make_workdir(tmp_path / "fresh", target_dir)
    assert {rule for rule, _ in planned_jobs(fresh)} >= DATA_RULES - {"synthesize"}
    command = [str(SNAKEMAKE), "--snakefile", "Snakefile", "--cores", "1"]
    assert plant(seed, command, fresh) == shards
    jobs = planned_jobs(fresh)
    assert not [job for job in jobs if job[0] in DATA_RULES]
    tokenize = [wildcards for rule, wildcards in jobs if rule == "tokenize"]
    assert len(tokenize) == len(shards)

    # the carried rows tokenize to what the first build made of them
    targets = [s.replace("generated", "tokenized") for s in shards]
    snakemake(fresh, "--cores", "2", *targets)
    made = sorted(p.relative_to(fresh) for p in (fresh / "results/tokenized").rglob("*.*"))
    assert made == sorted(p.relative_to(built) for p in (built / "results/tokenized").rglob("*.*"))
    assert all(same_result(fresh / p, built / p) for p in made)

    # a second plant would replace shards Snakemake now knows: refused, nothing touched
    with pytest.raises(FileExistsError, match="already has results/generated/"):
        plant(seed, command, fresh)
