"""The observer hooks of `train_drafter`: when each is called and what it sees, on CPU.

The synthetic workspace (tiny shapes): a run of 8 steps takes seconds.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.synthetic import SyntheticSpec, make_workspace, train_outputs
from specbuild.drafter.observer import Observer, TrainRun
from specbuild.drafter.train import TrainConfig, TrainFiles, train_drafter


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("ws"), SyntheticSpec(samples=16, seq_len=24))


class Stop(Exception):
    pass


class Recorder(Observer):
    def __init__(self, stop_at: int | None = None) -> None:
        self.calls: list[tuple[str, int]] = []
        self.stop_at = stop_at

    def on_start(self, run: TrainRun) -> None:
        self.calls.append(("start", run.state.step))
        self.total = run.total_steps

    def on_step(self, run: TrainRun) -> None:
        self.calls.append(("step", run.state.step))
        self.windows = len(run.speed.windows)
        if run.state.step == self.stop_at:
            raise Stop

    def on_end(self, run: TrainRun) -> None:
        self.calls.append(("end", run.state.step))
        self.evals = len(run.state.metrics)


def _run(ws, out, observer, **cfg):
    base = dict(epochs=2, token_budget=96, max_length=24, eval_fraction=0, ttt_steps=2)
    return train_drafter(
        files=TrainFiles(
            shards=ws["shards"],
            vocab=ws["vocab"],
            target_fingerprint=ws["target_fingerprint"],
            **train_outputs(out),
        ),
        config=TrainConfig(**(base | cfg), log_interval=2),
        threads=1,
        observer=observer,
    )


def test_hooks_see_the_start_every_step_after_its_line_and_eval_and_the_end(ws, tmp_path):
    seen = Recorder()
    _run(ws, tmp_path, seen)
    assert seen.calls == [("start", 0), *(("step", k) for k in range(1, 9)), ("end", 8)]
    assert seen.total == 8 and seen.evals == 2  # one eval an epoch, both done before on_end
    assert seen.windows == 4  # a progress line every 2 steps, closed before on_step


def test_an_exception_in_on_step_stops_the_run_and_a_rerun_resumes_at_the_checkpoint(ws, tmp_path):
    with pytest.raises(Stop):
        _run(ws, tmp_path, Recorder(stop_at=5), save_interval=4)
    assert not (tmp_path / "metrics.jsonl").exists()  # the outputs are written at the end only
    again = Recorder()
    _run(ws, tmp_path, again, save_interval=4)
    assert again.calls[0] == ("start", 4) and again.calls[-1] == ("end", 8)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [4, 8]


def test_an_observer_of_several_processes_is_refused_outside_torchrun(ws, tmp_path):
    with pytest.raises(
        ValueError, match="nproc 2 with an observer: start the 2 processes with torchrun"
    ):
        _run(ws, tmp_path, Recorder(), nproc=2)
    assert not (tmp_path / "state").exists()
