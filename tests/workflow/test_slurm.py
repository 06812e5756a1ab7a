"""The tiny workflow on a real single-node SLURM, through `--profile profiles/slurm-test`.

tests/slurm/start_slurm.sh installs (as root, via apt-get, when missing) and starts munge,
slurmctld and slurmd. Every job of the run must be an sbatch job that SLURM reports
COMPLETED, each engine-bound stage's shards one job (a group) that loads its engine once,
and the results must equal a local run's, file for file. A bad shard fails alone inside its
group (the other shard is published, a rerun runs only the bad one), and a group SLURM
cancels leaves only whole shards and no engine. Skipped only where SLURM is absent and this
process cannot be root to install it. The daemons the tests started are stopped after the last
test that used them (tests/slurm/cluster.py); a cluster found running is left running.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from workflow_helpers import (
    REPO,
    make_workdir,
    planned_jobs,
    results_files,
    same_result,
    snakemake,
    tiny_config,
    write_config,
)

from benchmarks.engine_loads import count_loads
from specbuild.hidden.shards import read_shard
from specbuild.infra.run_lock import process_start
from tests.slurm.cluster import LEASE, STARTED, ClusterLease, stop_process

pytestmark = [pytest.mark.workflow, pytest.mark.slurm]

START_SLURM = REPO / "tests" / "slurm" / "start_slurm.sh"
# the plugin's status checks at most 2 s apart (its own wait grows by 10 s a check)
SLURM_SNAKEMAKE = (sys.executable, str(REPO / "tests" / "slurm" / "fast_poll.py"))
SLURM_TOOLS = ("sbatch", "squeue", "srun", "sinfo", "slurmctld", "slurmd", "munged")
_SUBMITTED = re.compile(r"Job (\S+) has been submitted with SLURM jobid (\d+) \(log: (.+?)\)")
# Rules with `localrule: True` beside `all`: the rejected-row checks (a JSON read each), the
# tables and plots and serve.sh run where Snakemake runs, the login node, never as SLURM jobs.
LOCAL_RULES = {"rejects_check", "rejects", "report_bench", "report_pipeline", "variants", "serve"}
# profiles/slurm-test's groups: each stage's shards in one cluster job
GROUPED = {"generate", "hidden"}


def start_slurm(listed: Path) -> str:
    """Run START_SLURM, which lists in `listed` the daemons it started; `sinfo`'s node line."""
    env = os.environ | {"SPECBUILD_SLURM_STARTED": str(listed)}
    proc = subprocess.run(
        ["bash", str(START_SLURM)], capture_output=True, text=True, timeout=900, env=env
    )
    if proc.returncode != 0:
        pytest.fail(f"{START_SLURM} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout.strip()


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[str]:
    """A running one-node SLURM (started here if needed); yields `sinfo`'s node line. What was
    started for the tests stops once no pytest process uses it any more (tests/slurm/cluster.py):
    each of make test's workers holds a lease until its session ends."""
    have_slurm = all(shutil.which(t) for t in SLURM_TOOLS)
    if os.geteuid() != 0:
        up = have_slurm and subprocess.run(["sinfo", "-h"], capture_output=True).returncode == 0
        if not up:
            pytest.skip(
                "no running SLURM here, and installing/starting one needs root "
                f"(run {START_SLURM} as root, then rerun this test)"
            )
        yield "existing cluster"  # started by someone else: theirs to stop
        return
    lease = ClusterLease()
    yield lease.acquire(start_slurm)
    lease.release()


def slurm_states(job_ids: list[str]) -> dict[str, str]:
    """SLURM's state of each job (squeue lists finished jobs for MinJobAge seconds)."""
    proc = subprocess.run(
        ["squeue", "--states=all", "--noheader", "--format=%i|%T", f"--jobs={','.join(job_ids)}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(line.split("|") for line in proc.stdout.split())


def test_slurm_profile_sends_gpu_rules_to_the_gpu_partition(tmp_path, target_dir):
    # Dry-run only (no cluster needed): the profile parses and its placeholders reach the jobs.
    workdir = make_workdir(tmp_path / "wf", target_dir)
    proc = snakemake(workdir, "--profile", "profiles/slurm", "--dry-run")
    text = proc.stdout + proc.stderr
    blocks = re.findall(r"rule (\w+):\n((?:    .*\n)+)", text)
    assert blocks, text[-3000:]
    gpu_rules = {"generate", "hidden", "align", "train", "bench"}
    for rule, body in blocks:
        if rule in LOCAL_RULES:
            continue
        resources = body.split("resources:", 1)[1]
        want = "CHANGE_ME_gpu_partition" if rule in gpu_rules else "CHANGE_ME_cpu_partition"
        assert f"slurm_partition={want}" in resources, f"{rule}: {resources}"
        assert "slurm_account=CHANGE_ME_account" in resources, f"{rule}: {resources}"


def test_slurm_test_profile_names_only_existing_plugin_settings():
    # A misspelt key would be an unknown command-line option: list them against the plugin.
    from snakemake_executor_plugin_slurm import ExecutorSettings

    known = {f"slurm-{name.replace('_', '-')}" for name in ExecutorSettings.__dataclass_fields__}
    for profile in ("slurm", "slurm-test"):
        keys = yaml.safe_load((REPO / "profiles" / profile / "config.yaml").read_text())
        plugin_keys = {k for k in keys if k.startswith("slurm-")}
        assert plugin_keys <= known, f"profiles/{profile}: {sorted(plugin_keys - known)}"


def test_workflow_runs_through_slurm_and_matches_the_local_run(
    slurm_cluster, built_workflow, tmp_path, target_dir
):
    workdir = make_workdir(tmp_path / "wf", target_dir)
    jobs = planned_jobs(workdir)
    assert jobs == built_workflow.jobs

    proc = snakemake(
        workdir, "--profile", "profiles/slurm-test", timeout=1500, launcher=SLURM_SNAKEMAKE
    )
    submitted = _SUBMITTED.findall(proc.stdout + proc.stderr)
    # Every job but the local rules' went through sbatch: a grouped stage's shards as one
    # SLURM job, every other job as its own.
    remote = [job for job in jobs if job[0] not in LOCAL_RULES]
    alone = [job for job in remote if job[0] not in GROUPED]
    groups = {job[0] for job in remote} & GROUPED
    assert groups == GROUPED and len(submitted) == len(alone) + len(groups), proc.stderr[-5000:]
    slurm_ids = [slurm_id for _, slurm_id, _ in submitted]
    assert len(set(slurm_ids)) == len(slurm_ids)
    for _, slurm_id, log in submitted:  # SLURM's own log of each job, named by its job id
        assert Path(log).name == f"{slurm_id}.log" and Path(log).is_file()
        assert Path(log).is_relative_to(workdir / "logs" / "slurm")
    for rule in GROUPED:
        assert len(list((workdir / "logs" / "slurm" / f"group_{rule}_{rule}").glob("*.log"))) == 1
    # the hidden group's two shards on one engine: the first started it, the second shared it
    loads = {row.stage: row for row in count_loads(workdir / "logs")}
    hidden = loads["hidden"]
    assert (hidden.jobs, hidden.loads, hidden.kept_joins) == (2, 1, 1), hidden
    assert set(slurm_states(slurm_ids).values()) == {"COMPLETED"}

    assert planned_jobs(workdir) == []
    local = results_files(built_workflow.workdir)
    assert sorted(results_files(workdir)) == sorted(local)
    for rel in local:
        assert same_result(built_workflow.workdir / rel, workdir / rel), f"{rel} differs"


def test_a_stages_group_loads_its_engine_once_fails_a_bad_shard_alone_and_ends_when_cancelled(
    slurm_cluster, tmp_path, target_dir
):
    # generate on an SGLang server (the loopback stub: no GPU here) and hidden with
    # transformers, each stage's two shards sharing one kept engine inside their group's job
    config = tiny_config(generate={"backend": "sglang", "max_new_tokens": 6})
    config["hidden"]["share_idle_s"] = 600
    config["sglang"] = {
        "launcher": [sys.executable, str(REPO / "tests" / "stubs" / "sglang_stub.py")],
        "startup_timeout_s": 60,
        "server_args": {"attention_backend": "triton"},
        "share_idle_s": 600,
    }
    workdir = make_workdir(tmp_path / "wf", target_dir)
    write_config(workdir, config)
    args = ("--profile", "profiles/slurm-test", "--until", "hidden")
    snakemake(workdir, *args, launcher=SLURM_SNAKEMAKE)

    loads = {row.stage: row for row in count_loads(workdir / "logs")}
    assert (loads["generate"].kept_starts, loads["generate"].kept_joins) == (1, 1)
    for stage in ("generate", "hidden"):
        assert (loads[stage].jobs, loads[stage].loads) == (2, 1), loads[stage]
        assert len(list((workdir / "logs/slurm").glob(f"group_{stage}_*/*.log"))) == 1
    # (the full build's results equal a local run's: the test above)

    # A bad shard fails alone: a broken last line, the mtime kept (tokenize is not rerun)
    hidden = workdir / "results" / "hidden" / "tiny"
    for shard in hidden.glob("*.safetensors"):
        shard.unlink()
    bad = workdir / "results" / "tokenized" / "tiny" / "00000.jsonl"
    good, stat = bad.read_bytes(), bad.stat()
    bad.write_bytes(good + b'{"broken": \n')
    os.utime(bad, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    proc = snakemake(workdir, *args, check=False, timeout=900, launcher=SLURM_SNAKEMAKE)
    assert proc.returncode != 0
    assert len(_SUBMITTED.findall(proc.stdout + proc.stderr)) == 1  # both shards, one job
    # the group's other shard ran and was kept; the bad one left nothing that looks finished
    assert (hidden / "00001.safetensors").is_file()
    assert not (hidden / "00000.safetensors").exists() and not list(hidden.glob(".*"))
    assert f"{bad.relative_to(workdir)}:" in (workdir / "logs/hidden/tiny/00000.log").read_text()

    bad.write_bytes(good)
    os.utime(bad, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert planned_jobs(workdir, "--until", "hidden") == [("hidden", "dataset=tiny, shard=00000")]
    rerun = snakemake(workdir, *args, timeout=900, launcher=SLURM_SNAKEMAKE)
    out = rerun.stdout + rerun.stderr
    assert "shard=00000" in out and "shard=00001" not in out
    assert (hidden / "00000.safetensors").is_file()

    # SLURM cancels the group (a time limit, a preemption) once a shard's job has begun: what
    # it leaves is whole, no engine outlives it, and a rerun finishes the stage
    for shard in hidden.glob("*.safetensors"):
        shard.unlink()
    logs = workdir / "logs" / "slurm" / "group_hidden_hidden"
    before, start = set(logs.glob("*.log")), time.time()
    with subprocess.Popen(
        [*SLURM_SNAKEMAKE, "--snakefile", "Snakefile", *args],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    ) as run:
        job_logs = workdir / "logs" / "hidden" / "tiny"
        assert _until(lambda: any(p.stat().st_mtime > start for p in job_logs.glob("*.log")))
        (new,) = set(logs.glob("*.log")) - before
        subprocess.run(["scancel", new.stem], check=True)
        assert run.wait(timeout=600) != 0
    whole = sorted(p.stem for p in hidden.glob("*.safetensors"))
    for stem in whole:
        read_shard(hidden / f"{stem}.safetensors")  # whole, or not there
    keepers = f"specbuild-keepers-{os.getuid()}-{new.stem}"
    assert _until(lambda: subprocess.run(["pgrep", "-f", keepers]).returncode == 1)
    # the next run does every shard the cancel left without a whole file, and only those
    if len(whole) < 2:
        planned = planned_jobs(workdir, "--until", "hidden")
        missing = [s for s in ("00000", "00001") if s not in whole]
        assert planned == [("hidden", f"dataset=tiny, shard={s}") for s in missing]


def _until(condition, timeout_s: float = 300.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_result_comparison_ignores_timings_but_not_results(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"accept_length": 2.5, "tokens_per_s": 9.7, "wall_s": 0.8}\n')
    b.write_text('{"accept_length": 2.5, "tokens_per_s": 11.5, "wall_s": 0.7}\n')
    assert same_result(a, b)
    b.write_text('{"accept_length": 2.4, "tokens_per_s": 9.7, "wall_s": 0.8}\n')
    assert not same_result(a, b)


def test_drafter_comparison_ignores_the_training_speed_in_its_metadata(tmp_path):
    import torch
    from safetensors.torch import save_file

    def drafter(name: str, acc: float, tokens_per_s: float):
        row = {"acc": [acc], "tokens_per_s": tokens_per_s}
        save_file({"w": torch.ones(2)}, tmp_path / name, metadata={"metrics": json.dumps(row)})
        return tmp_path / name

    assert same_result(drafter("a.safetensors", 0.5, 90.0), drafter("b.safetensors", 0.5, 120.0))
    assert not same_result(tmp_path / "a.safetensors", drafter("c.safetensors", 0.4, 90.0))


def _daemon(listed: Path, name: str) -> subprocess.Popen:
    """A stand-in daemon, listed as start_slurm.sh lists one it started."""
    proc = subprocess.Popen(["sleep", "300"])
    with open(listed, "a") as fh:
        fh.write(f"{name} {proc.pid}\n")
    return proc


def _gone(proc: subprocess.Popen) -> bool:
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_the_last_lease_stops_what_the_tests_started_and_leaves_what_was_running(tmp_path):
    state = tmp_path / "state"
    found = subprocess.Popen(["sleep", "300"])  # a daemon running before: never listed
    worker = subprocess.Popen(["sleep", "300"])  # another pytest process using the cluster
    started: list[subprocess.Popen] = []

    def first_start(listed: Path) -> str:
        started.extend(_daemon(listed, d) for d in ("slurmctld", "slurmd"))
        return "node idle"

    try:
        assert ClusterLease(state).acquire(first_start) == "node idle"
        assert ClusterLease(state, pid=worker.pid).acquire(lambda listed: "node idle")
        assert sorted(p.name for p in state.glob(LEASE + "*")) == sorted(
            f"{LEASE}{pid}" for pid in (os.getpid(), worker.pid)
        )
        assert ClusterLease(state).release() == []  # the other worker still runs tests
        assert all(p.poll() is None for p in started)
        assert ClusterLease(state, pid=worker.pid).release() == ["slurmd", "slurmctld"]
        assert all(_gone(p) for p in started) and found.poll() is None
        assert not (state / STARTED).exists()
    finally:
        for p in (found, worker, *started):
            p.kill()
            p.wait()


def test_a_dead_processes_lease_does_not_keep_the_cluster_running(tmp_path):
    state = tmp_path / "state"
    killed = subprocess.Popen(["sleep", "300"])  # a pytest killed before its teardown
    started: list[subprocess.Popen] = []
    try:
        ClusterLease(state).acquire(lambda listed: started.append(_daemon(listed, "slurmd")) or "")
        ClusterLease(state, pid=killed.pid).acquire(lambda listed: "")
        killed.kill()
        killed.wait()
        assert ClusterLease(state).release() == ["slurmd"] and _gone(started[0])
        assert not list(state.glob(LEASE + "*"))
    finally:
        for p in (killed, *started):
            p.kill()
            p.wait()


def test_a_failed_start_stops_what_it_started_and_holds_no_lease(tmp_path):
    state = tmp_path / "state"
    started: list[subprocess.Popen] = []

    def failing(listed: Path) -> str:
        started.append(_daemon(listed, "munged"))
        raise RuntimeError("node did not become idle")

    try:
        with pytest.raises(RuntimeError, match="did not become idle"):
            ClusterLease(state).acquire(failing)
        assert _gone(started[0]) and not list(state.glob(LEASE + "*"))
    finally:
        for p in started:
            p.kill()
            p.wait()


def test_a_recorded_pid_now_of_another_process_is_not_signalled():
    proc = subprocess.Popen(["sleep", "300"])
    try:
        start = process_start(proc.pid)
        assert not stop_process(proc.pid, start + 1)  # the pid, another start: not ours
        assert proc.poll() is None
        assert stop_process(proc.pid, start) and _gone(proc)
    finally:
        proc.kill()
        proc.wait()
