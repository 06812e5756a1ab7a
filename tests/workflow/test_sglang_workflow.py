"""The sglang stages wired through the real Snakefile, with the loopback stub as the server:
generate with backend sglang, the bench's sglang engine (baseline) and its openai engine (an
endpoint already running), the tuning sweep and their report tables. The stub
computes fake numbers, so this proves the wiring (params, scripts, server lifecycle, row
formats), not SGLang itself: that is the GPU run's job (benchmarks/h200/run.sh). Hidden states with
SGLang run its model runner in process, which needs a GPU: tests/unit/hidden/test_sglang.py
(a fake runner on CPU, the real one on the device)."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from specbuild.hidden.shards import read_shard
from specbuild.infra.io import read_json, read_jsonl

pytestmark = pytest.mark.workflow


def test_sglang_stages_run_end_to_end_against_the_stub(tmp_path, target_dir):
    from workflow_helpers import REPO, make_workdir, snakemake, tiny_config, write_config

    launcher = [sys.executable, str(REPO / "tests" / "stubs" / "sglang_stub.py")]
    wd = make_workdir(tmp_path / "wf", target_dir)
    if not (wd / "envs").exists():  # rules name envs/ for --sdm conda; metadata records it
        shutil.copytree(REPO / "envs", wd / "envs")
    config = tiny_config(
        generate={"backend": "sglang", "max_new_tokens": 6},
    )
    mt = {"path": "resources/bench/mt_bench.jsonl", "format": "turns", "id_key": "question_id"}
    config["bench"] = {
        "engines": ["sglang"],
        "chains": [],
        "sets": {"mt": {**mt, "limit": 1}},
        "max_new_tokens": 8,
        "concurrency": [1, 2],
        "sweep_min_requests": 2,
    }
    config["report"] = {"train_metrics": None}  # the bench's tables without training first
    config["hidden"]["share_idle_s"] = 600  # one engine for both shards
    config["sglang"] = {
        "launcher": launcher,
        "startup_timeout_s": 30,
        "server_args": {"attention_backend": "triton"},
        "share_idle_s": 600,  # kept until the run ends, however slow this machine is
        "tuning": {
            "enabled": True,
            "prompts": 1,
            "max_new_tokens": 8,
            "concurrency": [1],
            "sweep_min_requests": 1,
            "points": {
                "base": {},
                "typo": {"server_args": {"cuda_graph_max_bz": 4}},
            },
        },
    }
    write_config(wd, config)
    outputs = [
        "results/hidden/tiny/00000.safetensors",
        "results/hidden/tiny/00001.safetensors",
        "results/tables/sweep.md",
        "results/tables/tuning.md",
    ]
    # one core: the jobs run one at a time in the workflow's priority order, as the GPU jobs
    # of a one-GPU run do
    proc = snakemake(wd, "--cores", "1", *outputs)

    generated = list(read_jsonl(wd / "results/generated/tiny/00000.jsonl"))
    assert generated and all(g["finish_reason"] in ("stop", "length") for g in generated)
    tensors, meta = read_shard(wd / "results/hidden/tiny/00000.safetensors")
    assert meta["backend"] == "hf" and tensors["aux"].shape[1] == 3 * 576
    assert tensors["last"].shape[0] == tensors["input_ids"].shape[0]

    rows = list(read_jsonl(wd / "results/bench/sglang/none/baseline.jsonl"))
    assert {(r["chain"], r["accept_length"]) for r in rows} == {("baseline", 1.0)}
    assert {r["phase"] for r in rows} == {"bench", "sweep"}
    assert "| sglang | baseline | none | 2 |" in (wd / "results/tables/sweep.md").read_text()
    rows = {r["point"]: r for r in (read_json(p) for p in (wd / "results/tuning").glob("*.json"))}
    assert rows["base"]["status"] == "ok" and rows["typo"]["status"] == "rejected"
    assert json.loads(rows["base"]["server_args"]) == {"attention_backend": "triton"}
    # generation, the baseline's bench and the point without flags of its own: one server
    # start, and it was stopped with the run (no stub is left answering)
    (server,) = (wd / ".specbuild" / "keepers").glob("server-*")
    assert (server / "keeper.log").read_text().count("starting sglang-shared-") == 1
    assert not (server / "keeper.pid").exists()
    for log in ("generate/tiny/00000.log", "bench/sglang/none/baseline.log", "tuning/base.log"):
        assert str(server) in (wd / "logs" / log).read_text()
    # the stage order that keeps it so on one GPU: every job on generation's server before
    # the first hidden job, whose engine would release it; then one engine for the hidden jobs
    started = re.findall(r"^(?:local)?rule (\w+):", proc.stdout + proc.stderr, re.M)
    on_server = [i for i, r in enumerate(started) if r in ("generate", "bench", "tuning")]
    assert started.count("hidden") == 2 and max(on_server) < started.index("hidden"), started
    (features,) = (wd / ".specbuild" / "keepers").glob("features-*")
    assert (features / "keeper.log").read_text().count("loaded feature backend") == 1


def test_openai_endpoint_key_never_reaches_params_metadata_or_logs(
    tmp_path, target_dir, monkeypatch
):
    from workflow_helpers import REPO, make_workdir, snakemake, tiny_config, write_config

    from specbuild.engines.server import ServerSpec, SGLangServer

    secret = "sk-never-in-metadata-0123456789"
    monkeypatch.setenv("SPECBUILD_WF_KEY", secret)
    stub = (sys.executable, str(REPO / "tests" / "stubs" / "sglang_stub.py"), "--api-key", secret)
    wd = make_workdir(tmp_path / "wf", target_dir)
    if not (wd / "envs").exists():
        shutil.copytree(REPO / "envs", wd / "envs")
    with SGLangServer(
        ServerSpec(model_path=str(target_dir), launcher=stub, startup_timeout_s=30)
    ) as srv:
        config = tiny_config(generate={"backend": "openai", "max_new_tokens": 5})
        config["sglang"] = {"endpoint": srv.base_url + "/v1", "api_key_env": "SPECBUILD_WF_KEY"}
        # the bench's openai engine on the same endpoint, as vLLM would be measured
        endpoint = {"endpoint": srv.base_url + "/v1", "api_key_env": "SPECBUILD_WF_KEY"}
        config["bench"].update(engines=["openai"], openai={**endpoint, "name": "vllm"})
        config["bench"].update(concurrency=[2], sweep_min_requests=2)
        config["report"] = {"train_metrics": None}
        write_config(wd, config)
        outputs = ["results/generated/tiny/00000.jsonl", "results/tables/sweep.md"]
        snakemake(wd, "--cores", "1", *outputs)
    rows = list(read_jsonl(wd / "results/generated/tiny/00000.jsonl"))
    assert rows and all(r["finish_reason"] in ("stop", "length") for r in rows)
    assert "| vllm | baseline | none | 2 |" in (wd / "results/tables/sweep.md").read_text()
    leaks = [
        p
        for p in wd.rglob("*")
        if p.is_file() and not p.is_symlink() and secret.encode() in p.read_bytes()
    ]
    assert leaks == []
    meta = "".join(
        p.read_text(errors="replace") for p in (wd / ".snakemake").rglob("*") if p.is_file()
    )
    assert "SPECBUILD_WF_KEY" in meta  # the variable's name is a param; its value is not


def _generating_workdir(tmp_path, target_dir):
    """A workdir whose generate jobs use the stub as their SGLang server, and its config."""
    from workflow_helpers import REPO, make_workdir, tiny_config, write_config

    wd = make_workdir(tmp_path / "wf", target_dir)
    config = tiny_config(generate={"backend": "sglang", "max_new_tokens": 4})
    config["sglang"] = {
        "launcher": [sys.executable, str(REPO / "tests" / "stubs" / "sglang_stub.py")],
        "startup_timeout_s": 30,
    }
    write_config(wd, config)
    return wd, config


def test_gpu_jobs_pin_distinct_devices_and_their_servers_see_only_those(
    tmp_path, target_dir, monkeypatch
):
    """Two generate shards on `--resources gpu=2`: each job pins one id of the two visible
    ones and the server it starts inherits it. Ids are CUDA_VISIBLE_DEVICES tokens, so the
    stub runs without a GPU."""
    from workflow_helpers import snakemake

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    monkeypatch.setenv("SPECBUILD_GPU_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    wd, config = _generating_workdir(tmp_path, target_dir)
    shards = ["00000", "00001"]
    targets = [f"results/generated/tiny/{s}.jsonl" for s in shards]
    # targets first: --resources takes every word after it
    snakemake(wd, *targets, "--cores", "4", "--resources", "gpu=2")

    kept = set()
    for shard in shards:
        text = (wd / "logs" / "generate" / "tiny" / f"{shard}.log").read_text()
        pinned = re.search(r"pinned to GPU\(s\) (\S+) \(of the 2 here: 5,6\)", text)
        assert pinned and pinned.group(1) in ("5", "6"), text[-2000:]
        # the server it shares (sglang.share_idle_s) was started on its GPU and inherited it
        folder = re.search(r"engine, kept in (\S+)|the engine kept in (\S+)", text)
        assert folder, text[-2000:]
        kept.add(folder.group(1) or folder.group(2))
        server_log = Path(folder.group(1) or folder.group(2), "keeper.log").read_text()
        assert f"(CUDA_VISIBLE_DEVICES={pinned.group(1)})" in server_log
    assert len(kept) == len(shards)  # one server a GPU: jobs on other GPUs share none


def served_bench_workdir(tmp_path, target_dir, random_drafter, drafters, **bench):
    """A workdir and config benching random drafters (`drafters`: their names, one folder) with
    the sglang engine on one MT-Bench question, sweeping at concurrency 2; `bench` overrides."""
    from workflow_helpers import make_workdir, tiny_config

    wd = make_workdir(tmp_path / "wf", target_dir)
    folder = random_drafter(tmp_path / "theirs", read_json(target_dir / "config.json"), [1, 14, 26])
    config = tiny_config()
    mt = {"path": "resources/bench/mt_bench.jsonl", "format": "turns", "id_key": "question_id"}
    config["bench"] = {
        "engines": ["sglang"],
        "chains": ["3-1-4"],
        "variants": [],  # none of ours: nothing to train first
        "drafters": {name: str(folder) for name in drafters},
        "sets": {"mt": {**mt, "limit": 1}},
        "concurrency": [2],
        **bench,
    }
    config["report"] = {"train_metrics": None}
    return wd, config


def test_each_drafter_is_served_by_its_own_server_and_only_the_named_ones_sweep(
    tmp_path, target_dir, random_drafter
):
    from workflow_helpers import REPO, snakemake, write_config

    launcher = [sys.executable, str(REPO / "tests" / "stubs" / "sglang_stub.py")]
    wd, config = served_bench_workdir(
        tmp_path,
        target_dir,
        random_drafter,
        ["theirs", "again"],
        sweep_drafters=["theirs"],
        max_new_tokens=8,
        sweep_min_requests=2,
    )
    if not (wd / "envs").exists():
        shutil.copytree(REPO / "envs", wd / "envs")
    config["sglang"] = {"launcher": launcher, "startup_timeout_s": 30}
    write_config(wd, config)
    snakemake(wd, "--cores", "2", "results/tables/sweep.md")

    phases = {
        run: {
            (r["drafter"], r["phase"]) for r in read_jsonl(wd / f"results/bench/sglang/{run}.jsonl")
        }
        for run in ("none/baseline", "theirs/3-1-4", "again/3-1-4")
    }
    assert phases == {
        "none/baseline": {("none", "bench"), ("none", "sweep")},
        "theirs/3-1-4": {("theirs", "bench"), ("theirs", "sweep")},
        "again/3-1-4": {("again", "bench")},  # not in sweep_drafters: single stream only
    }
    bench = (wd / "results/tables/bench.md").read_text()
    assert (
        "| sglang | mt | 3-1-4 | theirs |" in bench and "| sglang | mt | 3-1-4 | again |" in bench
    )


def test_a_served_bench_that_sweeps_nothing_declares_no_sweep_table(
    tmp_path, target_dir, random_drafter
):
    """No baseline and no drafter in sweep_drafters: no job writes sweep rows, so the report
    must not promise a sweep table (the fp8 pair's bf16 run failed its report on exactly this)."""
    from workflow_helpers import planned_jobs, snakemake, write_config

    wd, config = served_bench_workdir(
        tmp_path, target_dir, random_drafter, ["theirs"], baseline=False, sweep_drafters=[]
    )
    write_config(wd, config)
    assert ("report_bench", "") in planned_jobs(wd, "results/tables/bench.md")
    missing = snakemake(wd, "--dry-run", "results/tables/sweep.md", check=False)
    assert missing.returncode != 0
    assert "MissingRuleException" in missing.stdout + missing.stderr, missing.stdout[-2000:]

    config["bench"]["sweep_drafters"] = None  # all: now `theirs` sweeps
    write_config(wd, config)
    assert ("report_bench", "") in planned_jobs(wd, "results/tables/sweep.md")


def test_engine_memory_reaches_feature_jobs_as_a_resource_not_a_param(tmp_path, target_dir):
    """sglang.hidden.mem_fraction_static sizes the runner's KV pool and changes no shard: it
    reaches hidden and align as the `engine_memory` resource (Snakemake reruns a job whose
    params changed, never one whose resources did), and the server flags in their params go
    without it."""
    from workflow_helpers import make_workdir, snakemake, tiny_config, write_config

    wd = make_workdir(tmp_path / "wf", target_dir)
    config = tiny_config(hidden={"backend": "sglang"}, align={"backend": "sglang"})
    config["sglang"] = {
        "server_args": {"mem_fraction_static": 0.8, "attention_backend": "triton"},
        "hidden": {"mem_fraction_static": 0.35},
    }
    write_config(wd, config)
    dry = snakemake(wd, "-n", "--cores", "1", "results/align/report.json").stdout
    jobs = re.split(r"\n(?=(?:local)?rule )", dry)
    for rule in ("hidden", "align"):
        job = next(j for j in jobs if re.match(rf"(?:local)?rule {rule}:", j))
        assert "engine_memory=0.35" in job


def test_the_generate_jobs_of_a_run_share_one_server_stopped_with_the_run(tmp_path, target_dir):
    """Two generate shards, one server start (sglang.share_idle_s), no server left once
    Snakemake is done; a changed share_idle_s reruns nothing."""
    from workflow_helpers import snakemake, write_config

    wd, config = _generating_workdir(tmp_path, target_dir)
    targets = [f"results/generated/tiny/{s}.jsonl" for s in ("00000", "00001")]
    snakemake(wd, *targets, "--cores", "2")

    (folder,) = (wd / ".specbuild" / "keepers").iterdir()
    assert (folder / "keeper.log").read_text().count("starting sglang-shared-") == 1
    for shard in ("00000", "00001"):
        assert str(folder) in (wd / "logs" / "generate" / "tiny" / f"{shard}.log").read_text()
    assert not (folder / "keeper.pid").exists()  # the run's end stopped it
    assert "the run ended" in (folder / "stop").read_text()

    config["sglang"]["share_idle_s"] = 0  # a server a job from now on: no output changes
    write_config(wd, config)
    proc = snakemake(wd, *targets, "--cores", "2", "--dry-run")
    assert "Nothing to be done" in proc.stdout + proc.stderr
