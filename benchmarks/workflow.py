"""Benchmark of the workflow itself (a benchmark, not a test): what Snakemake spends on our DAG
against a bare Snakefile of the same shape, on a dataset grown to ~2,000 shards.

    python -m benchmarks.workflow [--shards 2000] [--repeats 3] [--out FILE]
        [--compare OTHER_CHECKOUT] [--cprofile DIR]

Copies of the workflow go into a scratch folder (never the repo's results/): the project
(Snakefile, rules, scripts, schema, resources, profiles, envs, report) with config/config.yaml
whose first file dataset (GSM8K in the default) is its own records cycled into shards of 4, so
that all datasets together hold `--shards` shards; and two generated bare Snakefiles of the same
job count, with literal paths, `shell: touch` and no config, params, resources, conda or
scripts. `bare`, the goal's yardstick: four per-shard rules (samples, generate, tokenize,
hidden) and the vocab and train fan-ins, `extra` jobs with no input making up the rest (our
reject checks among them). `matched`: the project's files and edges as well (each job's outputs,
logs and inputs, the reject checks and the fan-ins reading them), so that project / matched is
what our rules add beyond the DAG's shape (config validation, digests, input and params
functions, resources, conda, scripts) and matched / bare what the shape itself costs Snakemake.
`--compare` adds another checkout (the commit before a change, say) as `baseline`, measured in
the same run.

Each workflow is measured in two states, each in its own folder:
  dry-run  `snakemake -n` with nothing built (every job planned and printed)
  no-op    `snakemake --cores 1` with everything built and nothing to do
The built state comes from `snakemake --touch --forceall`, which records Snakemake's metadata of
every job (params, code, input set) without running any, so the no-op run does all its checks.
Snakemake's touch executor sleeps 0.1 s a job to space mtimes; the wrapper here sets that to 0
(outputs are touched in DAG order, so no output is older than its inputs) and creates each
missing output first. The no-op runs must then print "Nothing to be done" and no "missing
metadata" warning, and the dry-runs must plan every job, or the benchmark stops: it would
measure something else.

Runs are interleaved (project, [baseline,] bare, project, ...) and the best of `--repeats`
counts, for wall time and for the CPU time of the snakemake process (user + sys, from wait4): on
a shared machine wall time measures the neighbours too, CPU time the work. The ratio project /
bare per state is the overhead (goal <= 1.2, judged on CPU time). `--cprofile DIR` also runs
each workflow once per state under cProfile and writes the stats there (`python -m pstats`).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from functools import partial
from pathlib import Path

import yaml

from benchmarks import PERF
from specbuild.infra.io import write_json

__all__ = [
    "Shape",
    "bare_snakefile",
    "make_project",
    "make_bare",
    "job_counts",
    "build_all",
    "time_snakemake",
    "run_workflow_bench",
    "main",
]

GOAL = 1.2  # the goal: project / bare, for `snakemake -n` and the no-op rerun
SHARD_SIZE = 4  # records per shard of the grown dataset: small, so ~2,000 shards stay cheap
# Workflow files a run needs (results, logs and .snakemake are the run's own); the workflow
# tests copy the same set. envs: rules name their conda env (--sdm conda), metadata records it;
# report: captions of report() outputs.
WORKFLOW_FILES = (
    "Snakefile",
    "rules",
    "scripts",
    "config/config.schema.yaml",
    "resources",
    "profiles",
    "envs",
    "report",
)
STATES = ("dry-run", "no-op")
# `snakemake --touch` in a process whose touch executor does not sleep and creates missing
# outputs (Snakemake's own only touches existing files, 0.1 s apart).
_TOUCH_WRAPPER = """
import os, sys
import snakemake.executors.touch as touch
touch.Executor.SLEEPING_TIME = 0
_run_job = touch.Executor.run_job
def run_job(self, job):
    for f in job.output:
        os.makedirs(os.path.dirname(f) or ".", exist_ok=True)
        open(f, "a").close()
    return _run_job(self, job)
touch.Executor.run_job = run_job
from snakemake.cli import main
sys.argv = ["snakemake", *sys.argv[1:]]
main()
"""
_PROFILE_WRAPPER = """
import cProfile, sys
from snakemake.cli import main
out, sys.argv = sys.argv[1], ["snakemake", *sys.argv[2:]]
prof = cProfile.Profile()
try:
    prof.runcall(main)
except SystemExit:
    pass
finally:
    prof.dump_stats(out)
"""


@dataclass(frozen=True)
class Shape:
    """The DAG both workflows build: per-shard jobs of four stages plus one-off jobs."""

    shards: int  # every dataset's shards together
    jobs: int  # every job of `all`, per-shard and one-off


def _snakemake(*args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", *args]


def _env(workdir: Path) -> dict[str, str]:
    """The environment of a snakemake in `workdir`: a project's own src/ first on the path."""
    if not (workdir / "src").is_dir():
        return dict(os.environ)
    path = [str(workdir / "src"), os.environ.get("PYTHONPATH", "")]
    return os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, path))}


def grow_dataset(path: Path, source: Path, n_records: int) -> None:
    """`n_records` JSONL lines: the source's records cycled (real sizes, distinct shards)."""
    lines = [line for line in source.read_text().splitlines() if line.strip()]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for i in range(n_records):
            fh.write(lines[i % len(lines)] + "\n")


def _shard_count(repo: Path, dataset: dict) -> int:
    """Shards of a dataset config entry as given (shard_size as the config states it)."""
    if "synthesize" in dataset:
        records = dataset["synthesize"]["count"]
    else:
        path = repo / dataset["path"]
        records = sum(1 for line in path.read_text().splitlines() if line.strip())
        if dataset.get("limit") is not None:
            records = min(records, dataset["limit"])
    return -(-records // dataset["shard_size"])


def make_project(repo: Path, workdir: Path, shards: int) -> Path:
    """The project's workflow in `workdir`, its file dataset grown so all datasets hold `shards`."""
    workdir.mkdir(parents=True)
    for name in WORKFLOW_FILES:
        src, dst = repo / name, workdir / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst)
    config = yaml.safe_load((repo / "config" / "config.yaml").read_text())
    datasets = config["datasets"]
    # The first file dataset grows; the others keep their shards, which count towards `shards`.
    grown = next(n for n, d in datasets.items() if "path" in d)
    others = sum(_shard_count(repo, d) for n, d in datasets.items() if n != grown)
    grow_dataset(
        workdir / "raw" / "grown.jsonl",
        repo / datasets[grown]["path"],
        (shards - others) * SHARD_SIZE,
    )
    datasets[grown] = {
        **{k: v for k, v in datasets[grown].items() if k != "limit"},
        "path": "raw/grown.jsonl",
        "shard_size": SHARD_SIZE,
    }
    (workdir / "config").mkdir(exist_ok=True)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    # the checkout's own package, which its workflow imports (`_env`): a --compare checkout is
    # measured with its specbuild, not with the one installed
    (workdir / "src").symlink_to(repo / "src", target_is_directory=True)
    return workdir


def _rule(name: str, output: list[str], *, input: list[str] = (), log: str | None = None) -> str:
    """One rule of a bare twin: its items are Snakefile source ("key=expression"), its job
    `touch`es the outputs."""
    lines = [f"rule {name}:"]
    for directive, items in (("input", input), ("output", output), ("log", [log] if log else [])):
        if items:
            lines += [f"    {directive}:", *(f"        {item}," for item in items)]
    return "\n".join([*lines, "    shell:", '        "touch {output}"', "", ""])


def _shard_files(folder: str, *names: str) -> list[str]:
    """`name="results/<folder>/{dataset}/{shard}<suffix>"` for each output name of a stage."""
    suffix = {"rejected": ".rejected.jsonl", "counts": ".counts.json", "meta": ".meta.json"}
    return [f'{n}="results/{folder}/{{dataset}}/{{shard}}{suffix.get(n, ".jsonl")}"' for n in names]


def bare_snakefile(shape: Shape, *, matched: bool = False) -> str:
    """A Snakefile of `shape` with nothing but literal paths, `touch` jobs and no config,
    params, resources, conda or scripts: the floor of what Snakemake spends on such a DAG.

    `matched=False` (the goal's yardstick): the four per-shard rules (samples 2 outputs,
    generate 2, tokenize 3, hidden 1) and the vocab and train fan-ins, `extra` jobs without
    inputs standing in for the rest of the project's jobs (its reject checks among them).
    `matched=True`: the project's files and edges too: per shard the seven jobs of rules/ with
    their outputs, logs and inputs (the reject check of the samples, generated and tokenized
    shard that each next stage waits for), and the fan-ins reading what ours read (vocab:
    tokens, metas and checks; train and `all`: hidden shards; the reject table: every counts
    file; the pipeline report: counts, metas and hidden shards; align: the first hidden shard).
    What the project spends beyond it is what its rules add to the DAG's shape.
    """
    per_shard, one_off = (7, 7) if matched else (4, 4)  # one-off: target vocab train all (+3)
    n_extra = shape.jobs - per_shard * shape.shards - one_off
    if n_extra < 0:
        raise ValueError(f"{shape}: fewer jobs than {per_shard} per shard plus {one_off}")
    counts = ["counts"] if matched else []

    def each(path: str) -> str:
        return f'expand("{path}", shard=SHARDS)'

    def checked(stage: str) -> list[str]:
        return [f'checked="results/checks/{stage}/{{dataset}}/{{shard}}.json"'] if matched else []

    def log(stage: str) -> str:
        return f'"logs/{stage}/{{dataset}}/{{shard}}.log"'

    rules = [
        _rule("target", ["FP"], log='"logs/target/t.log"'),
        _rule(
            "samples",
            _shard_files("samples", "samples", "rejected", *counts),
            input=['raw=ancient("raw/d.jsonl")', "fp=FP"] if matched else ['raw="raw/d.jsonl"'],
            log=log("samples"),
        ),
        _rule(
            "generate",
            _shard_files("generated", "generated", "rejected", *counts),
            input=[*_shard_files("samples", "samples"), "fp=FP", *checked("samples")],
            log=log("generate"),
        ),
        _rule(
            "tokenize",
            _shard_files("tokenized", "tokens", "meta", "rejected", *counts),
            input=[*_shard_files("generated", "generated"), "fp=FP", *checked("generated")],
            log=log("tokenize"),
        ),
        _rule(
            "hidden",
            ['"results/hidden/{dataset}/{shard}.safetensors"'],
            input=[*_shard_files("tokenized", "tokens", "meta"), "fp=FP", *checked("tokenized")],
            log=log("hidden"),
        ),
        _rule(
            "vocab",
            ['vocab="results/vocab/vocab.safetensors"', 'stats="results/vocab/vocab_stats.json"'],
            input=[
                "tokens=" + each("results/tokenized/d/{shard}.jsonl"),
                "metas=" + each("results/tokenized/d/{shard}.meta.json"),
                "fp=FP",
            ]
            + (["checked=" + each("results/checks/tokenized/d/{shard}.json")] if matched else []),
            log='"logs/vocab/vocab.log"',
        ),
        _rule(
            "train",
            ['best="results/train/best.safetensors"']
            + (['metrics="results/train/metrics.jsonl"'] if matched else []),
            input=[
                "shards=" + each("results/hidden/d/{shard}.safetensors"),
                'vocab="results/vocab/vocab.safetensors"',
                "fp=FP",
            ]
            + (['align="results/align/report.json"'] if matched else []),
            log='"logs/train/train.log"',
        ),
        _rule("extra", ['"results/extra/{i}.txt"']),
    ]
    targets = [
        each("results/hidden/d/{shard}.safetensors"),
        '"results/train/best.safetensors"',
        f'expand("results/extra/{{i}}.txt", i=range({n_extra}))',
    ]
    if matched:
        rules += [
            _rule(
                "rejects_check",
                ['"results/checks/{stage}/{dataset}/{shard}.json"'],
                input=['counts="results/{stage}/{dataset}/{shard}.counts.json"'],
                log='"logs/checks/{stage}/{dataset}/{shard}.log"',
            ),
            _rule(
                "rejects",
                ['csv="results/tables/rejects.csv"', 'md="results/tables/rejects.md"'],
                input=[
                    each(f"results/{stage}/d/{{shard}}.counts.json")
                    for stage in ("samples", "generated", "tokenized")
                ],
                log='"logs/report/rejects.log"',
            ),
            _rule(
                "align",
                ['"results/align/report.json"'],
                input=['shards="results/hidden/d/00000.safetensors"', "fp=FP"],
                log='"logs/align/align.log"',
            ),
            _rule(
                "report_pipeline",
                ['"results/tables/data.md"'],
                input=[
                    "samples=" + each("results/samples/d/{shard}.counts.json"),
                    "generated=" + each("results/generated/d/{shard}.counts.json"),
                    "tokenized=" + each("results/tokenized/d/{shard}.meta.json"),
                    "hidden=" + each("results/hidden/d/{shard}.safetensors"),
                    'vocab="results/vocab/vocab_stats.json"',
                    'align="results/align/report.json"',
                ],
                log='"logs/report/pipeline.log"',
            ),
        ]
        targets += [f'"results/{f}"' for f in ("vocab/vocab.safetensors", "tables/rejects.md")]
        targets += ['"results/tables/data.md"']
    stage = ',\n    stage="samples|generated|tokenized"' if matched else ""
    return (
        f"# Bare twin (matched={matched}) of the specbuild DAG, written by"
        f" benchmarks.workflow:\n# {shape.shards} shards, {shape.jobs} jobs; literal paths,"
        " no config, params, resources, conda or scripts.\n\n"
        f'SHARDS = [f"{{i:05d}}" for i in range({shape.shards})]\n'
        'FP = "results/target/t/fingerprint.json"\n\n\n'
        "wildcard_constraints:\n"
        f'    dataset="[A-Za-z0-9_]+",\n    shard="[0-9]{{5}}"{stage},\n\n\n'
        + "rule all:\n    input:\n"
        + "".join(f"        {t},\n" for t in targets)
        + "\n\n"
        + "".join(rules)
    )


# The bare twins, by name: `bare` is the yardstick of the goal (GOAL); `matched` has the
# project's files and edges too, so project / matched is what our rules add beyond the shape.
TWINS = {
    "bare": partial(bare_snakefile, matched=False),
    "matched": partial(bare_snakefile, matched=True),
}


def make_bare(workdir: Path, shape: Shape, raw: Path, twin: str = "bare") -> Path:
    """A bare twin (`TWINS`) in `workdir`, reading the same raw file as the project."""
    workdir.mkdir(parents=True)
    (workdir / "Snakefile").write_text(TWINS[twin](shape))
    (workdir / "raw").mkdir()
    shutil.copy2(raw, workdir / "raw" / "d.jsonl")
    return workdir


def job_counts(log: str) -> dict[str, int]:
    """Jobs per rule from the "Job stats" table Snakemake prints before it runs anything."""
    counts: dict[str, int] = {}
    lines = log.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Job stats:")), None)
    if start is None:
        raise RuntimeError("no job table in the log")
    for line in lines[start + 3 :]:  # header, column names, dashes
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        counts[parts[0]] = int(parts[1])
    return counts


def shape_of(counts: dict[str, int]) -> Shape:
    """Shards and jobs of a job table; every shard must reach `hidden`."""
    shards = counts.get("samples", 0) + counts.get("synthesize", 0)
    if shards != counts.get("hidden"):
        raise RuntimeError(f"samples + synthesize != hidden jobs: {counts}")
    return Shape(shards=shards, jobs=counts["total"])


def build_all(workdir: Path) -> Shape:
    """Mark every output of `workdir` as built, with Snakemake's metadata, without running jobs;
    return the shape of the DAG it built."""
    proc = subprocess.run(
        [sys.executable, "-c", _TOUCH_WRAPPER, "all", "--touch", "--forceall", "--cores"]
        + ["100000", "--scheduler", "greedy", "--max-jobs-per-timespan", "1000000/1s"],
        cwd=workdir,
        env=_env(workdir),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"--touch in {workdir} failed:\n{proc.stderr[-3000:]}")
    return shape_of(job_counts(proc.stdout + proc.stderr))


@dataclass
class Run:
    workflow: str  # project | bare
    state: str  # dry-run | no-op
    wall_s: float
    cpu_s: float  # user + sys of the snakemake process and its children


def _command(state: str) -> list[str]:
    return ["-n"] if state == "dry-run" else ["--cores", "1"]


def time_snakemake(workdir: Path, state: str, log: Path, shape: Shape) -> tuple[float, float]:
    """Wall and CPU seconds of one `snakemake` in `workdir`; its output goes to `log`. A dry-run
    must plan every job of `shape`, a no-op run none (with every job's metadata read)."""
    with open(log, "w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(
            _snakemake(*_command(state)),
            cwd=workdir,
            env=_env(workdir),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = log.read_text()
    if proc.returncode != 0:
        raise RuntimeError(f"snakemake {state} in {workdir} failed (log {log}):\n{text[-3000:]}")
    if state == "no-op" and (
        "Nothing to be done" not in text or "missing provenance/metadata" in text
    ):
        raise RuntimeError(f"{workdir} is not a complete build with metadata (log {log})")
    if state == "dry-run" and shape_of(job_counts(text)) != shape:
        raise RuntimeError(f"the dry-run in {workdir} does not plan {shape} (log {log})")
    return wall, usage.ru_utime + usage.ru_stime


def cprofile(workdir: Path, state: str, out: Path) -> None:
    """One run of `state` in `workdir` under cProfile, stats written to `out`."""
    subprocess.run(
        [sys.executable, "-c", _PROFILE_WRAPPER, str(out), *_command(state)],
        cwd=workdir,
        env=_env(workdir),
        capture_output=True,
        check=True,
    )


def _best(runs: list[Run], workflow: str, state: str) -> dict:
    mine = [r for r in runs if r.workflow == workflow and r.state == state]
    return {"wall_s": min(r.wall_s for r in mine), "cpu_s": min(r.cpu_s for r in mine)}


def _commit(repo: Path) -> str | None:
    proc = subprocess.run(
        ["git", "-C", str(repo), "describe", "--always", "--dirty"], capture_output=True, text=True
    )
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def run_workflow_bench(
    *,
    repo: Path,
    shards: int,
    repeats: int,
    scratch: Path,
    compare: Path | None = None,
    profile_dir: Path | None = None,
) -> dict:
    """Set up every workflow in both states under `scratch`, time them interleaved, summarize.

    `compare`: another checkout (say, the commit before a change) measured as `baseline` in the
    same run, so before and after share the machine's load.
    """
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    repos = {"project": repo} | ({"baseline": compare} if compare is not None else {})
    commits = {w: _commit(r) for w, r in repos.items()}  # as copied, before any runs
    dirs: dict[tuple[str, str], Path] = {}
    shape = None
    # The projects are built first: their job table gives the shape the bare twins copy.
    workflows = [*repos, *TWINS]
    for workflow in workflows:
        fresh = scratch / f"{workflow}-fresh"
        if workflow in TWINS:
            raw = dirs["project", "dry-run"] / "raw" / "grown.jsonl"
            make_bare(fresh, shape, raw, twin=workflow)
        else:
            make_project(repos[workflow], fresh, shards)
        built = scratch / f"{workflow}-built"
        shutil.copytree(fresh, built, symlinks=True)
        built_shape = build_all(built)
        if shape is not None and built_shape != shape:
            raise RuntimeError(f"{workflow} built {built_shape}, the project {shape}")
        shape = built_shape
        dirs[workflow, "dry-run"], dirs[workflow, "no-op"] = fresh, built
        print(
            f"  {workflow:8} built: {shape.jobs} jobs ({time.perf_counter() - t0:.0f} s so far)",
            flush=True,
        )
    setup_s = time.perf_counter() - t0

    runs: list[Run] = []
    logs = scratch / "logs"
    logs.mkdir()
    for i in range(repeats):
        for state in STATES:
            for workflow in workflows:
                log = logs / f"{workflow}-{state}-{i}.log"
                wall, cpu = time_snakemake(dirs[workflow, state], state, log, shape)
                runs.append(Run(workflow, state, wall, cpu))
                print(
                    f"  {workflow:8} {state:7} #{i}: {wall:6.2f} s wall, {cpu:6.2f} s CPU",
                    flush=True,
                )
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
        for (workflow, state), workdir in dirs.items():
            cprofile(workdir, state, profile_dir / f"{workflow}-{state}.prof")

    best = {state: {w: _best(runs, w, state) for w in workflows} for state in STATES}
    # project / twin per state, checkout and twin: ratio[state][workflow] vs bare, and
    # ratio[state][f"{workflow} / matched"] vs the shape-matched twin
    ratio = {
        state: {
            w + ("" if twin == "bare" else f" / {twin}"): {
                k: best[state][w][k] / best[state][twin][k] for k in ("wall_s", "cpu_s")
            }
            for w in repos
            for twin in TWINS
        }
        for state in STATES
    }
    import snakemake

    return {
        "date": datetime.now().isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_start": list(load_start),
        "load_end": list(os.getloadavg()),
        "snakemake": snakemake.__version__,
        "repos": {w: {"path": str(r), "commit": commits[w]} for w, r in repos.items()},
        "shards": shape.shards,
        "jobs": shape.jobs,
        "repeats": repeats,
        "setup_s": setup_s,
        "runs": [asdict(r) for r in runs],
        "best": best,
        "ratio": ratio,
        "goal": GOAL,
        "goal_met": all(r["project"]["cpu_s"] <= GOAL for r in ratio.values()),
    }


def markdown(result: dict) -> str:
    """The table BENCHMARKS.md shows: best wall and CPU seconds per workflow and state, and the
    ratio of each project checkout to the bare twin and (CPU) to the shape-matched one."""
    rows = [
        "| state | workflow | wall s | CPU s | wall / bare | CPU / bare | CPU / matched |",
        "|---|---|---|---|---|---|---|",
    ]
    for state, best in result["best"].items():
        for workflow, b in best.items():
            r = result["ratio"][state].get(workflow)
            m = result["ratio"][state].get(f"{workflow} / matched")
            ratios = f"{r['wall_s']:.2f}x | {r['cpu_s']:.2f}x | {m['cpu_s']:.2f}x" if r else "| |"
            rows.append(
                f"| {state} | {workflow} | {b['wall_s']:.2f} | {b['cpu_s']:.2f} | {ratios} |"
            )
    load = "/".join(f"{x:.1f}" for x in result["load_start"])
    head = (
        f"{result['shards']} shards, {result['jobs']} jobs, Snakemake {result['snakemake']}, "
        f"best of {result['repeats']}, {result['cpus']} CPUs, load {load} at start; "
        + ", ".join(f"{w} {r['commit'] or r['path']}" for w, r in result["repos"].items())
    )
    return head + "\n\n" + "\n".join(rows)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=2000, help="shards of all datasets together")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--repo", default=".", help="the specbuild checkout to measure")
    ap.add_argument("--compare", help="another checkout measured alongside, as `baseline`")
    ap.add_argument("--out", default=str(PERF / "workflow" / "workflow.json"))
    ap.add_argument("--scratch", help="folder for the workdirs (default: a new temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch workdirs")
    ap.add_argument("--cprofile", help="also write cProfile stats of each workflow here")
    args = ap.parse_args(argv)
    repo = Path(args.repo).resolve()
    compare = Path(args.compare).resolve() if args.compare else None
    for checkout in filter(None, [repo, compare]):
        if not (checkout / "Snakefile").is_file():
            ap.error(f"{checkout} holds no Snakefile: pass a specbuild checkout")
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="specbuild-bench-workflow-"))
    if args.scratch:
        scratch.mkdir(parents=True, exist_ok=False)
    try:
        result = run_workflow_bench(
            repo=repo,
            shards=args.shards,
            repeats=args.repeats,
            scratch=scratch,
            compare=compare,
            profile_dir=Path(args.cprofile) if args.cprofile else None,
        )
    finally:
        if not args.keep:  # rm -rf: some 100,000 files, a minute for shutil.rmtree under load
            subprocess.run(["rm", "-rf", "--", str(scratch)], check=False)
    write_json(args.out, result)
    print(markdown(result))
    verdict = "met" if result["goal_met"] else "NOT met"
    print(f"goal: project / bare <= {GOAL}x in CPU time, both states: {verdict}; {args.out}")
    return result


if __name__ == "__main__":
    main()
