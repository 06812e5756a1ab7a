"""What a careful new user's data and machine do to a real Snakemake run: a config error, a
drafter folder built elsewhere, a gzipped spreadsheet export, results/ on another disk (a
symlink), and that disk full. Each says what is wrong in a few lines, without a traceback."""

from __future__ import annotations

import codecs
import gzip
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from workflow_helpers import (
    DATASET,
    PROMPTS,
    TARGET_NAME,
    link_target,
    make_workdir,
    planned_jobs,
    snakemake,
    tiny_config,
    write_config,
)

from specbuild.eagle.drafter_tensors import tensor_names
from specbuild.infra.io import read_json
from specbuild.infra.run_lock import LOCK_DIR, is_locked, process_start, this_run, write_lock_file

pytestmark = pytest.mark.workflow


def _messages(proc: subprocess.CompletedProcess) -> list[str]:
    """Snakemake's stderr without its profile notice."""
    return [
        line
        for line in proc.stderr.splitlines()
        if line.strip() and not line.startswith("Using workflow specific profile")
    ]


def test_a_config_error_prints_its_message_and_nothing_else(tmp_path, target_dir):
    wd = make_workdir(tmp_path / "wf", target_dir)
    write_config(wd, tiny_config(generate={"temprature": 0.5}))
    proc = snakemake(wd, "-n", "--cores", "1", check=False)
    assert proc.returncode == 1
    assert _messages(proc) == [
        "config/config.yaml: 1 problem (keys and allowed values: config/config.schema.yaml)",
        "  generate.temprature: unknown key; did you mean 'temperature'?",
    ]


def _drafter_folder(path: Path, **changes) -> Path:
    """An EAGLE-3 folder shaped for SmolLM2-135M (576 wide, 30 layers, 49,152 tokens)."""
    path.mkdir(parents=True)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": 576,
        "target_hidden_size": 576,
        "vocab_size": 49152,
        "draft_vocab_size": 512,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]},
        **changes,
    }
    (path / "config.json").write_text(json.dumps(config))
    # the parse reads its header (every tensor's name, one element each: a config.json without
    # every size decides no shape), never its data
    tensors = {name: np.zeros(1, np.float32) for name in tensor_names()}
    save_file(tensors, str(path / "model.safetensors"))
    return path


def test_drafters_built_elsewhere_are_checked_against_the_target_when_the_dag_is_built(
    tmp_path, target_dir
):
    wd = make_workdir(tmp_path / "wf", target_dir)
    _drafter_folder(wd / "theirs" / "fits")
    _drafter_folder(
        wd / "theirs" / "wide",
        target_hidden_size=4096,
        vocab_size=32000,
        eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 14, 99]},
    )
    (wd / "theirs" / "empty").mkdir()
    bench = {"variants": [], "baseline": False}
    drafters = {"fits": "theirs/fits", "wide": "theirs/wide", "empty": "theirs/empty"}
    write_config(wd, tiny_config(bench={**bench, "drafters": {**drafters, "gone": "theirs/no"}}))
    proc = snakemake(wd, "-n", "--cores", "1", check=False)
    assert proc.returncode == 1
    lines = _messages(proc)
    assert lines[0].startswith("config/config.yaml: 3 problems")
    fix = "point it at an EAGLE-3 drafter trained for this target, or remove the entry"
    target_cfg = f"results/target/{TARGET_NAME}/config.json"
    assert lines[1] == (
        f"  bench.drafters.wide: theirs/wide does not fit the target (config.json of "
        f"{target_cfg}): aux layer ids [1, 14, 99] outside the target's 30 layers (SGLang "
        "would capture layer outputs [1, 14, 99]); target_hidden_size is 4096, the target "
        f"has 576; vocab_size is 32000, the target has 49152; {fix} (a folder built "
        "elsewhere is not rebuilt by this workflow)"
    )
    assert lines[2].startswith(
        "  bench.drafters.empty: 'theirs/empty' has no config.json or model.safetensors"
    )
    assert lines[3].startswith(f"  bench.drafters.gone: no such folder 'theirs/no' (in {wd}")
    assert len(lines) == 4
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text and "MissingInput" not in text and "forcerun" not in text

    write_config(wd, tiny_config(bench={**bench, "drafters": {"fits": "theirs/fits"}}))
    jobs = planned_jobs(wd)
    assert ("bench", "engine=hf, drafter=fits, chain=2-1-3") in jobs


def test_a_gzipped_spreadsheet_export_with_a_bom_is_read_record_for_record(tmp_path, target_dir):
    wd = make_workdir(tmp_path / "wf", target_dir)
    text = "\r\n".join(json.dumps({"prompt": p}, ensure_ascii=False) for p in PROMPTS[:6])
    raw = wd / "raw" / f"{DATASET}.jsonl.gz"
    raw.write_bytes(gzip.compress(codecs.BOM_UTF8 + text.encode()))
    config = tiny_config()
    config["datasets"][DATASET]["path"] = f"raw/{DATASET}.jsonl.gz"
    write_config(wd, config)
    shards = [f"results/samples/{DATASET}/{s}.jsonl" for s in ("00000", "00001")]
    snakemake(wd, "--cores", "1", *shards)
    counts = [read_json(wd / s.replace(".jsonl", ".counts.json")) for s in shards]
    assert [(c["in"], c["kept"], c["rejected"]) for c in counts] == [(4, 4, 0), (2, 2, 0)]
    first = json.loads((wd / shards[0]).read_text().splitlines()[0])
    assert first["messages"][0]["content"] == PROMPTS[0] and first["source"]["line"] == 1


def test_results_as_a_symlink_to_another_disk_survives_a_failed_run(tmp_path, target_dir):
    # Snakemake removes the empty folders of missing outputs after a failed run; results/
    # itself is one when the first job fails, and rmdir refuses a symlink
    wd = make_workdir(tmp_path / "wf", target_dir)
    shutil.rmtree(wd / "results")
    (tmp_path / "big-disk").mkdir()
    (wd / "results").symlink_to(tmp_path / "big-disk")
    config = tiny_config()
    config["target"] = {"name": "other", "source": "gguf:/nonexistent/model.gguf"}
    write_config(wd, config)
    proc = snakemake(wd, "--cores", "1", f"results/samples/{DATASET}/00000.jsonl", check=False)
    assert proc.returncode == 1
    assert "NotADirectoryError" not in proc.stderr
    assert "GGUF file /nonexistent/model.gguf does not exist" in proc.stderr
    assert (wd / "results").is_symlink()


@pytest.fixture
def small_disk(mount_tmpfs):
    """A real 1 MB filesystem (tmpfs): root only."""
    return mount_tmpfs("1m")


def _fill(folder: Path) -> Path:
    """Write zeros into `folder` until its filesystem is full."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass  # full
    finally:
        os.close(fd)
    return filler


@pytest.mark.root
def test_a_full_disk_fails_the_job_in_a_few_lines_and_the_rerun_is_byte_identical(
    tmp_path, target_dir, small_disk
):
    shard = f"results/samples/{DATASET}/00000.jsonl"
    plain = make_workdir(tmp_path / "plain", target_dir)
    snakemake(plain, "--cores", "1", shard)

    wd = make_workdir(tmp_path / "wf", target_dir)
    shutil.rmtree(wd / "results")
    (wd / "results").symlink_to(small_disk)
    link_target(wd, target_dir)
    filler = _fill(small_disk)
    proc = snakemake(wd, "--cores", "1", shard, check=False)
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "NotADirectoryError" not in out
    assert f"{shard}: no space left on device while writing it" in proc.stderr
    on = f"results/samples/{DATASET} (on {small_disk}/samples/{DATASET}) has 0.00 MB free"
    assert on in proc.stderr
    assert not (wd / shard).exists()
    left = [p.name for p in (small_disk / "samples").rglob("*") if p.is_file()]
    assert left == []  # no temp file either

    filler.unlink()
    snakemake(wd, "--cores", "1", shard)
    for name in ("00000.jsonl", "00000.rejected.jsonl", "00000.counts.json"):
        rel = f"results/samples/{DATASET}/{name}"
        assert (wd / rel).read_bytes() == (plain / rel).read_bytes()


def test_the_locks_of_a_killed_run_are_removed_by_the_next_run_which_says_so(tmp_path, target_dir):
    wd = make_workdir(tmp_path / "wf", target_dir)
    shard = f"results/samples/{DATASET}/00000.jsonl"
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    owner = replace(this_run([shard]), pid=killed.pid, start=process_start(killed.pid))
    killed.kill()
    killed.wait()
    write_lock_file(wd, "output", [shard], owner)  # a killed run's, same output
    (wd / LOCK_DIR / "1.output.lock").write_text(f"{shard}\n")  # one naming no run
    proc = snakemake(wd, "--cores", "1", shard)
    assert (
        f"specbuild: removed the locks of a run that is no longer live (a lock that names no "
        f"run; pid {killed.pid} (started "
    ) in proc.stderr
    assert "Directory cannot be locked" not in proc.stderr and (wd / shard).exists()
    assert not is_locked(wd)
