"""Model loads per stage of a run, read from its job logs: SGLang servers started by a job for
itself, engines started by a keeper for the jobs that share them (a server or a feature
runner, `sglang.share_idle_s` / `hidden.share_idle_s`), SGLang model runners a job loads
itself (align, an unshared hidden job) and transformers loads in a job (the hf backends of
generate, hidden, align and bench). At Kimi-K2.5's size a load is the unit of cost.

    python -m benchmarks.engine_loads [logs]    # a markdown table on stdout
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["StageLoads", "count_loads", "loads_table"]

# the lines specbuild writes (engines.server, engines.keepers, engines.runner,
# engines.transformers); a keeper's own lines reach a job's log as "keeper: <time> ...", never
# as these
OWN_SERVER = re.compile(r" INFO starting sglang-(?!shared-)\S+: ")
KEPT_START = re.compile(r" INFO \S+: starting a shared engine, kept in ")
KEPT_JOIN = re.compile(r" INFO \S+: sharing the engine kept in ")
OWN_RUNNER = re.compile(r" INFO SGLang model runner: \S+, tp \d+")
OWN_HF = re.compile(r" INFO loaded the target's text model with transformers ")


@dataclass
class StageLoads:
    stage: str
    jobs: int = 0
    own_servers: int = 0  # a server a job started for itself
    kept_starts: int = 0  # an engine a keeper started for the jobs sharing it
    kept_joins: int = 0  # jobs that used an engine a keeper already held
    own_runners: int = 0  # an SGLang model runner loaded inside a job
    own_hf: int = 0  # the target loaded with transformers inside a job

    @property
    def loads(self) -> int:
        return self.own_servers + self.kept_starts + self.own_runners + self.own_hf


def count_loads(logs: str | Path) -> list[StageLoads]:
    """One row per stage (the first folder under `logs`) that has a job log."""
    stages: dict[str, StageLoads] = {}
    for path in sorted(Path(logs).rglob("*.log")):
        stage = path.relative_to(logs).parts[0]
        if stage == path.name:  # a log of the whole run, not a job's
            continue
        if stage == "slurm":  # SLURM's copy of its cluster jobs' output (profiles/slurm)
            continue
        row = stages.setdefault(stage, StageLoads(stage))
        row.jobs += 1
        for line in path.read_text(errors="replace").splitlines():
            row.own_servers += bool(OWN_SERVER.search(line))
            row.kept_starts += bool(KEPT_START.search(line))
            row.kept_joins += bool(KEPT_JOIN.search(line))
            row.own_runners += bool(OWN_RUNNER.search(line))
            row.own_hf += bool(OWN_HF.search(line))
    return list(stages.values())


def loads_table(rows: Iterable[StageLoads]) -> str:
    """The stages that loaded a model, and the total."""
    rows = [r for r in rows if r.loads or r.kept_joins]
    head = (
        "| stage | jobs | own servers | shared engines started | jobs on a kept engine "
        "| runners in a job | transformers in a job | loads |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r.stage} | {r.jobs} | {r.own_servers} | {r.kept_starts} | {r.kept_joins} "
            f"| {r.own_runners} | {r.own_hf} | {r.loads} |"
        )
    total = sum(r.loads for r in rows)
    lines.append(f"| all | {sum(r.jobs for r in rows)} | | | | | | {total} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(loads_table(count_loads(sys.argv[1] if len(sys.argv) > 1 else "logs")))
