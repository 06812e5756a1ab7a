"""One feature engine for the hidden jobs of a run (specbuild.engines.kept_model), with the real hf
backend on the real SmolLM2 target: the shard it writes is byte for byte the job's own, two
shards cost one load, and a keeper that dies or a request that cannot be read fails the job
with the cause and leaves no output."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from specbuild.eagle.target_info import read_target_info
from specbuild.engines.keepers import keeper_running, process_running
from specbuild.engines.kept_model import KeptModelError
from specbuild.engines.model import ModelSpec
from specbuild.engines.open import open_engine
from specbuild.engines.runtime import Runtime
from specbuild.hidden.core import ExtractRequest, ShardFiles
from specbuild.hidden.extract import extract_kept
from tests.unit.hidden.test_hidden import _extract, _write_tokenized, rows, tokenized  # noqa: F401

LOADED = "loaded feature backend hf"


@pytest.fixture(scope="module")
def unshared(tmp_path_factory, tokenized, target_dir) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("unshared") / "00000.safetensors"
    _extract(tokenized, target_dir, out)
    return out


def _keeper(registry: Path) -> Path:
    (folder,) = registry.iterdir()
    return folder


def test_a_shard_from_the_shared_engine_is_byte_identical_to_the_jobs_own(
    registry,
    tmp_path,
    tokenized,  # noqa: F811
    target_dir,
    unshared,
):
    out = tmp_path / "00000.safetensors"
    _extract(tokenized, target_dir, out, share_idle_s=30.0)
    assert out.read_bytes() == unshared.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000.safetensors", "keepers"]


def test_two_shards_through_one_keeper_load_the_model_once_and_it_stops_when_idle(
    registry,
    tmp_path,
    tokenized,  # noqa: F811
    target_dir,
    unshared,
):
    outs = [tmp_path / f"{i:05d}.safetensors" for i in range(2)]
    jobs = [
        threading.Thread(
            target=_extract, args=(tokenized, target_dir, out), kwargs={"share_idle_s": 2.0}
        )
        for out in outs
    ]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join()
    assert all(out.read_bytes() == unshared.read_bytes() for out in outs)
    folder = _keeper(registry)
    assert folder.name.startswith("features-")
    log = (folder / "keeper.log").read_text()
    assert log.count(LOADED) == 1, log
    assert log.count("request ") >= 2
    deadline = time.monotonic() + 30
    while keeper_running(folder) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not keeper_running(folder)  # idle for 2 s: stopped


def _spec(target_dir: Path, fingerprint: str | None = None) -> ModelSpec:
    fp = fingerprint or read_target_info(target_dir / "fingerprint.json").fingerprint
    return ModelSpec(
        backend="hf",
        folder=str(target_dir.resolve()),
        layer_ids=[1, 14, 26],
        dtype="float32",
        device="cpu",
        options={},
        target_fingerprint=fp,
    )


def _shared(tokens: Path, target_dir: Path, out: Path):
    """A shard run by the kept engine as it comes, without the job's own reading first."""
    files = ShardFiles(
        tokens, tokens.with_name("00000.meta.json"), target_dir / "fingerprint.json", out
    )
    request = ExtractRequest(files, [1, 14, 26], storage="bf16", batch_tokens=64, threads=1)
    with open_engine(_spec(target_dir), Runtime(idle_s=30.0), name="hidden") as engine:
        return extract_kept(engine, request)


def test_a_keeper_killed_mid_request_fails_the_job_with_its_log_and_leaves_no_output(
    registry,
    tmp_path,
    tokenized,  # noqa: F811
    target_dir,
):
    out = tmp_path / "00000.safetensors"

    def kill_once_requested() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:  # the keeper's folder is made before its log and pid files
                (folder,) = registry.glob("features-*")
                if "request " in (folder / "keeper.log").read_text():
                    os.kill(int((folder / "keeper.pid").read_text().split()[0]), signal.SIGKILL)
                    return
            except (ValueError, FileNotFoundError):
                pass
            time.sleep(0.01)

    killer = threading.Thread(target=kill_once_requested)
    killer.start()
    with pytest.raises(KeptModelError, match="stopped before the shard was done") as err:
        _shared(tokenized, target_dir, out)
    killer.join()
    assert "keeper.log" in str(err.value) and LOADED in str(err.value)  # its last lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keepers"]  # no shard, no part


def test_a_request_with_an_unreadable_input_fails_naming_the_file(
    registry,
    tmp_path,
    tokenized,  # noqa: F811
    target_dir,
):
    broken = tmp_path / "tok" / "00000.jsonl"
    broken.parent.mkdir()
    broken.write_text('{"id": "s0", "input_ids": [1, 2\n')
    (broken.parent / "00000.meta.json").write_bytes(
        tokenized.with_name("00000.meta.json").read_bytes()
    )
    out = tmp_path / "00000.safetensors"
    with pytest.raises(KeptModelError, match="failed the shard") as err:
        _shared(broken, target_dir, out)
    assert str(broken) in str(err.value)
    assert not out.exists()
    assert keeper_running(_keeper(registry))  # a bad shard does not stop the engine


def test_inside_a_slurm_job_the_job_opens_its_own_engine(
    registry,
    tmp_path,
    tokenized,  # noqa: F811
    target_dir,
    unshared,
    monkeypatch,
):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    out = tmp_path / "00000.safetensors"
    _extract(tokenized, target_dir, out, share_idle_s=30.0)
    assert out.read_bytes() == unshared.read_bytes() and not registry.exists()


def test_the_engine_key_names_the_model_and_not_the_shard(target_dir, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    spec, runtime = _spec(target_dir, "fp"), Runtime()
    same = spec.key(runtime)
    assert same == _spec(target_dir, "fp").key(Runtime(idle_s=5.0))
    assert same != _spec(target_dir, "another target").key(runtime)
    for change in ({"dtype": "bfloat16"}, {"layer_ids": [2, 14, 26]}, {"device": "cuda"}):
        assert same != ModelSpec(**{**spec.__dict__, **change}).key(runtime)
    assert same != spec.key(Runtime(mem_fraction_static=0.5))  # another KV pool
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert same != spec.key(runtime)
    assert process_running(os.getpid())


def test_align_on_the_kept_engine_reports_what_its_own_engine_does_without_a_second_load(
    registry,
    tmp_path,
    tokenized,  # noqa: F811
    target_dir,
    unshared,
):
    from specbuild.align import AlignSettings, check_alignment

    _extract(tokenized, target_dir, tmp_path / "00000.safetensors", share_idle_s=30.0)
    reports = {}
    for name, share_idle_s in (("own", 0.0), ("kept", 30.0)):
        reports[name] = tmp_path / f"{name}.json"
        check_alignment(
            shards=[unshared],
            target_dir=target_dir,
            report=reports[name],
            settings=AlignSettings(samples=2, device="cpu"),
            share_idle_s=share_idle_s,
        )
    own, kept = (json.loads(reports[n].read_text()) for n in ("own", "kept"))
    assert kept["ok"] and kept["serving_backend"] == own["serving_backend"] == "hf"
    assert kept["rows"] == own["rows"] and len(kept["layers"]) == 4
    for a, b in zip(kept["layers"], own["layers"], strict=True):
        assert a["cosine_mean"] == pytest.approx(b["cosine_mean"], abs=1e-6), (a, b)
        assert a["norm_ratio"] == pytest.approx(b["norm_ratio"], abs=1e-6), (a, b)
    folder = _keeper(registry)
    log = (folder / "keeper.log").read_text()
    assert log.count(LOADED) == 1 and "a batch of 2 rows" in log, log
    assert not list((folder / "requests").iterdir())  # the batch's file and answer cleared


def _pending(folder: Path, request: dict) -> str:
    """`request` written under a lease this test holds; its tag."""
    import fcntl

    from specbuild.infra.private_dirs import private_dir

    tag = f"{os.getpid()}-0badf00d"
    private_dir(folder / "leases")
    fd = os.open(folder / "leases" / tag, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # held until the test ends: the job is there
    private_dir(folder / "requests")
    (folder / "requests" / f"{tag}.json").write_text(json.dumps(request))
    return tag


@pytest.mark.parametrize("where", ["a file of yours", "through a link", "a batch elsewhere"])
def test_the_keeper_writes_and_removes_nothing_a_request_names_outside_its_shards_folder(
    tmp_path, where
):
    from specbuild.engines.kept_model import _serve
    from specbuild.infra.private_dirs import private_dir

    folder = private_dir(tmp_path / "keepers" / "features-0123")
    victim = tmp_path / "home" / ".bashrc"
    victim.parent.mkdir()
    victim.write_text("yours\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "shard-folder").symlink_to(elsewhere)
    tag = f"{os.getpid()}-0badf00d"
    linked = tmp_path / "shard-folder" / f".00000.safetensors.{tag}.part"
    out = {"a file of yours": victim, "through a link": linked, "a batch elsewhere": victim}
    shard = {"files": {"tokens": "t", "meta": "m", "fingerprint": "f", "out": str(out[where])}}
    run = "batch" if where == "a batch elsewhere" else "shard"
    request = {"run": run, "out": str(out[where]), "shard": shard, "batch": [], "threads": 0}
    assert _pending(folder, request) == tag
    _serve(folder, engine=None, spec=None)  # refused before the engine is asked anything
    error = (folder / "requests" / f"{tag}.error").read_text()
    assert error.startswith("refused: "), error
    assert victim.read_text() == "yours\n"
    assert list(elsewhere.iterdir()) == []
