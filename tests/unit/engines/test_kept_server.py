"""One SGLang server shared by the generation jobs of a run (specbuild.engines.kept_server),
with the loopback stub as the server: one start for several jobs, its stop when idle, when
another engine needs the GPU and at the run's end, and a clear error when it dies mid-job."""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path

import pytest

from specbuild.backends import GenerationRequest, SamplingParams, make_backend
from specbuild.engines.keepers import release_idle, stop_all
from specbuild.engines.server import ServerStartError

STUB = Path(__file__).resolve().parents[2] / "stubs" / "sglang_stub.py"
ASK = [GenerationRequest(id="q", messages=[{"role": "user", "content": "Name a colour."}])]
GREEDY = SamplingParams(max_new_tokens=4, temperature=0.0)


def _backend(target_dir, idle_s: float = 30.0, env: dict | None = None):
    return make_backend(
        "sglang",
        target_dir=str(target_dir),
        launcher=(sys.executable, str(STUB)),
        env=env or {},
        startup_timeout_s=30,
        share_idle_s=idle_s,
    )


def _keeper(registry: Path) -> Path:
    (folder,) = registry.iterdir()
    return folder


def _gone(folder: Path, timeout_s: float = 30.0) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if not (folder / "keeper.pid").exists() and not (folder / "endpoint.json").exists():
            return True
        time.sleep(0.2)
    return False


def _answers(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=2):
            return True
    except OSError:
        return False


def test_jobs_that_start_the_same_server_share_one_which_stops_once_idle(registry, target_dir):
    one = _backend(target_dir, idle_s=1.0)
    two = _backend(target_dir, idle_s=1.0)
    try:
        assert one.client.base_url == two.client.base_url
        assert one.generate(ASK, GREEDY)[0].content and two.generate(ASK, GREEDY)[0].content
    finally:
        one.close()
        two.close()
    folder = _keeper(registry)
    log = (folder / "keeper.log").read_text()
    assert log.count("starting sglang-shared-") == 1  # one server for both
    assert (folder / "spec.json").stat().st_mode & 0o077 == 0  # its API key: owner only
    assert _gone(folder), log[-2000:]  # no lease for idle_s: stopped
    assert not _answers(one.client.base_url)
    three = _backend(target_dir, idle_s=1.0)  # a later job starts it again
    try:
        assert three.generate(ASK, GREEDY)[0].content
    finally:
        three.close()
    assert (folder / "keeper.log").read_text().count("starting sglang-shared-") == 2


def test_another_jobs_engine_releases_an_idle_server_and_the_run_end_stops_a_busy_one(
    registry, target_dir
):
    busy = _backend(target_dir)
    folder = _keeper(registry)
    release_idle()  # a lease is held: it stays
    assert (folder / "endpoint.json").exists() and busy.generate(ASK, GREEDY)
    busy.close()
    release_idle()  # idle now: stopped at once, not after 30 s
    assert _gone(folder, timeout_s=5)
    busy = _backend(target_dir)
    busy.close()
    stop_all()
    assert _gone(_keeper(registry), timeout_s=5)


def test_a_server_that_dies_under_a_job_fails_it_with_the_cause(registry, target_dir):
    job = _backend(target_dir, env={"SGLANG_STUB_DIE_AFTER": "0"})
    try:
        with pytest.raises(ServerStartError, match="shared SGLang server stopped.*code 3"):
            job.generate(ASK, GREEDY)
    finally:
        job.close()
    folder = _keeper(registry)
    assert "exited with code 3 while serving" in (folder / "failed.txt").read_text()
    assert not (folder / "endpoint.json").exists()
    again = _backend(target_dir)  # the next job starts a fresh server
    try:
        assert again.generate(ASK, GREEDY)[0].content
    finally:
        again.close()


def test_inside_a_slurm_job_each_job_starts_its_own_server(registry, target_dir, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    job = _backend(target_dir)
    try:
        assert not job.shared and job.generate(ASK, GREEDY)[0].content
    finally:
        job.close()
    assert not registry.exists() or not any(registry.iterdir())


def test_the_key_ignores_the_api_key_but_not_the_flags_or_the_gpus(monkeypatch, target_dir):
    from specbuild.engines.server import ServerOptions

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    options = ServerOptions(launcher=(sys.executable, str(STUB)))
    a, b = options.spec(target_dir), options.spec(target_dir)
    assert a.api_key != b.api_key and a.key() == b.key()
    assert a.key() != options.spec(target_dir, extra_args={"tp_size": 2}).key()
    on_gpu0 = a.key()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # a job pinned to another GPU
    assert a.key() != on_gpu0


def test_the_baseline_bench_measures_on_generations_server_and_alone(registry, target_dir):
    import threading

    from specbuild.bench.served import open_sglang
    from specbuild.eagle.chain import BASELINE
    from specbuild.engines.kept_server import kept_server
    from specbuild.engines.server import ServerOptions

    gen = _backend(target_dir)
    try:
        assert gen.generate(ASK, GREEDY)[0].content
    finally:
        gen.close()
    folder = _keeper(registry)
    server = {"launcher": (sys.executable, str(STUB)), "env": {}, "startup_timeout_s": 30}
    options = {"server": server, "share_idle_s": 30.0}
    spec = ServerOptions(**server).spec(target_dir)
    used = threading.Event()

    def generation_job() -> None:
        with kept_server(spec, name="sglang-generate", idle_s=30.0):
            used.set()

    with open_sglang(
        target_dir=target_dir,
        chain=BASELINE,
        drafter_dir=None,
        drafter_name="none",
        options=options,
    ) as engine:
        assert engine.complete([1, 2, 3], 4).completion_tokens == 4
        job = threading.Thread(target=generation_job)
        job.start()
        assert not used.wait(1.5)  # a generation job waits while the bench measures
    assert used.wait(10)  # and goes on once it is done
    job.join()
    assert len(list(registry.iterdir())) == 1  # the bench started no server of its own
    assert (folder / "keeper.log").read_text().count("starting sglang-shared-") == 1
    stop_all()
