"""Training: alignment, batching and split, overfitting, and bit-exact resume on CPU.

Data is the synthetic workspace (the real shard, vocab and target-folder contracts, tiny
shapes) so every run takes seconds.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from benchmarks.synthetic import SyntheticSpec, make_workspace, train_outputs
from specbuild.drafter.build import build_drafter
from specbuild.drafter.data import (
    BatchOrder,
    ShardSet,
    plan_batches,
    split_held_out_shards,
    split_samples,
)
from specbuild.drafter.launch import Ranks
from specbuild.drafter.objective import LossForm, TTTObjective, loss_rows, step_loss
from specbuild.drafter.observer import Observer
from specbuild.drafter.state import (
    TrainState,
    job_key,
    mark_complete,
    resume_status,
    save_checkpoint,
    source_digest,
)
from specbuild.drafter.train import (
    FiniteSteps,
    TrainConfig,
    TrainFiles,
    TrainingDiverged,
    lr_at,
    train_drafter,
)
from specbuild.eagle.target_info import read_target_info
from specbuild.hidden.shards import ShardError, read_shard, write_shard
from specbuild.infra.devices import cpu_bf16_supported
from specbuild.infra.run_lock import RUN_ENV, process_start, this_run


class Killed(RuntimeError):
    """The process dies here, as if killed."""


class KillAfter(Observer):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step(self, run) -> None:
        if run.state.step >= self.step:
            raise Killed(f"killed after step {run.state.step}")


def run(ws, out, stop_after=None, log_path=None, tensorboard_dir=None, **cfg):
    base = dict(
        epochs=2,
        token_budget=96,
        max_length=24,
        eval_fraction=0,
        ttt_steps=3,
        lr=3e-3,
        log_interval=100,
    )
    return train_drafter(
        files=TrainFiles(
            shards=ws["shards"],
            vocab=ws["vocab"],
            target_fingerprint=ws["target_fingerprint"],
            **train_outputs(out),
            tensorboard_dir=tensorboard_dir,
        ),
        config=TrainConfig(**(base | cfg)),
        threads=1,
        observer=KillAfter(stop_after) if stop_after else None,
        log_path=log_path,
    )


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("ws"), SyntheticSpec(samples=16, seq_len=24))


def test_batch_aligns_next_token_feature_teacher_and_mask(ws):
    data = ShardSet(ws["shards"], hidden_size=64)
    ref = data.refs[0]
    tensors, _ = read_shard(ws["shards"][0])
    x = tensors["input_ids"][ref.start : ref.end].long()
    batch = data.batch([ref], max_length=100)
    assert batch.input_ids[0].tolist() == x[1:].tolist()  # index t holds x[t+1]
    assert torch.equal(batch.aux[0], tensors["aux"][ref.start : ref.end - 1].float())  # g[t]
    assert torch.equal(batch.last_next[0], tensors["last"][ref.start + 1 : ref.end].float())
    mask = tensors["loss_mask"][ref.start : ref.end].bool()
    assert batch.valid[0].tolist() == mask[2:].tolist() + [False]  # x[t+2] is a response token
    assert batch.position_ids[0].tolist() == list(range(23))


def test_max_length_keeps_the_first_tokens(ws):
    data = ShardSet(ws["shards"], hidden_size=64)
    full, cut = data.batch(data.refs[:1], 100), data.batch(data.refs[:1], 10)
    assert cut.input_ids.shape == (1, 9)
    assert torch.equal(cut.input_ids, full.input_ids[:, :9])


def test_batches_respect_the_token_budget_and_ranks_step_together():
    lengths = [5, 9, 3, 12, 7, 7, 2, 11, 4]
    kw = dict(token_budget=24, max_length=12)
    first = BatchOrder(seed=1, epoch=0)
    for rank in (0, 1):
        plan = plan_batches(lengths, **kw, order=first, rank=rank, world_size=2)
        assert all(len(b) * max(lengths[i] for i in b) <= 24 for b in plan)
    r0 = plan_batches(lengths, **kw, order=first, world_size=2)
    r1 = plan_batches(lengths, **kw, order=first, rank=1, world_size=2)
    assert len(r0) == len(r1) and not {i for b in r0 for i in b} & {i for b in r1 for i in b}
    again = plan_batches(lengths, **kw, order=BatchOrder(seed=1, epoch=1))
    assert again != plan_batches(lengths, **kw, order=first)


def test_length_grouped_batches_pad_less_and_keep_every_sample_once():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 200, (3000,), generator=g).tolist()
    kw = dict(token_budget=800, max_length=150)

    def padding(plan):  # padded positions over all positions the batches hold
        held = sum(len(b) * max(min(lengths[i], 150) for i in b) for b in plan)
        return 1 - sum(min(lengths[i], 150) for b in plan for i in b) / held

    plain = plan_batches(lengths, order=BatchOrder(seed=3, epoch=0), **kw)
    grouped = plan_batches(lengths, order=BatchOrder(3, 0, group_by_length=True), **kw)
    assert all(len(b) * max(min(lengths[i], 150) for i in b) <= 800 for b in grouped)
    assert sorted(i for b in grouped for i in b) == list(range(3000))  # each sample, once
    assert padding(grouped) < 0.1 < 0.3 < padding(plain)
    assert len(grouped) < len(plain)  # more real tokens a step: fewer steps an epoch
    # the batches' order is shuffled (not longest first) and differs between epochs
    longest = [max(lengths[i] for i in b) for b in grouped]
    assert longest != sorted(longest, reverse=True)
    assert grouped != plan_batches(lengths, order=BatchOrder(3, 1, group_by_length=True), **kw)
    assert grouped == plan_batches(lengths, order=BatchOrder(3, 0, group_by_length=True), **kw)


def test_held_out_split_stays_put_when_shards_are_appended():
    keys = [f"d/{s:05d}:{i}" for s in range(4) for i in range(50)]
    _, held = split_samples(keys[:100], 0.1)
    _, held_more = split_samples(keys, 0.1)
    assert held and set(held) <= set(held_more)


def test_a_set_too_small_for_the_fraction_holds_out_one_sample(caplog):
    keys = ["mine/00000:0", "mine/00000:1", "mine/00000:2"]  # README's quick start
    train, held = split_samples(keys, 0.05)
    assert len(held) == 1 and sorted(train + held) == [0, 1, 2]
    assert "holding out the one lowest-hashing sample" in caplog.text
    assert split_samples(keys, 0.05) == (train, held)  # the same sample every run
    with pytest.raises(ValueError, match="at least 2"):
        split_samples(keys[:1], 0.05)


def test_shards_from_different_extractions_fail_listing_each_fault(ws, tmp_path):
    tensors, meta = read_shard(ws["shards"][1])
    odd = tmp_path / "d" / "00001.safetensors"
    write_shard(odd, tensors, dict(meta, layer_ids="[2, 3, 4]", target_fingerprint="other"))
    with pytest.raises(ValueError) as err:
        ShardSet(
            [ws["shards"][0], odd], hidden_size=64, target_fingerprint=meta["target_fingerprint"]
        )
    assert "layer_ids" in str(err.value) and "target_fingerprint 'other'" in str(err.value)
    with pytest.raises(ValueError, match="hidden size is 32"):
        ShardSet(ws["shards"], hidden_size=32)


def test_config_rejects_unknown_keys_and_impossible_combinations():
    with pytest.raises(ValueError, match="unknown key"):
        TrainConfig.from_params({"learning_rate": 1e-4})
    with pytest.raises(ValueError, match="max_length 4096 > token_budget 1024"):
        TrainConfig.from_params({"max_length": 4096, "token_budget": 1024})
    with pytest.raises(ValueError, match="teacher_temperature must be >= 0"):
        TrainConfig.from_params({"teacher_temperature": -1})
    with pytest.raises(ValueError, match=r"acceptance_weight 1.5 must lie in \[0, 1\]"):
        TrainConfig.from_params({"acceptance_weight": 1.5})


@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.0])
def test_teacher_temperature_sharpens_toward_the_argmax(temperature):
    logits = torch.tensor([[2.0, 1.0, -1.0], [0.0, 3.0, 2.5]])
    form = LossForm(teacher_temperature=temperature)
    objective = TTTObjective(None, None, steps=1, decay=1.0, amp=False, form=form)
    probs = objective._soft_targets(logits)
    if temperature == 0:  # hard label: one-hot at the argmax
        assert probs.tolist() == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    else:
        assert torch.allclose(probs, (logits / temperature).softmax(-1))
    assert torch.allclose(probs.sum(-1), torch.ones(2))


def test_hard_label_run_overfits_like_the_soft_one(ws, tmp_path):
    assert run(ws, tmp_path, epochs=12, teacher_temperature=0.0)["acc"][0] > 0.9


def test_the_acceptance_loss_is_minus_log_of_the_mass_both_distributions_share():
    p = torch.tensor([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]])
    q = torch.tensor([[0.2, 0.3, 0.5], [0.6, 0.3, 0.1]])
    log_q = q.log().requires_grad_()
    ce = -(p * q.log()).sum()
    assert step_loss(p, log_q).item() == pytest.approx(ce.item())  # weight 0: cross-entropy
    shared = torch.tensor([0.2 + 0.3 + 0.2, 0.6])  # sum_v min(p_v, q_v) per row
    lk = -shared.log().sum()
    assert step_loss(p, log_q, 1.0).item() == pytest.approx(lk.item())
    mixed = step_loss(p, log_q, 0.25)
    assert mixed.item() == pytest.approx(0.75 * ce.item() + 0.25 * lk.item())
    mixed.backward()
    assert log_q.grad.abs().sum() > 0
    # a hard label: the shared mass is q at the label, so both terms are -log q there
    assert step_loss(p[1:], q[1:].log(), 1.0).item() == pytest.approx(-math.log(0.6))


def test_an_acceptance_weighted_run_overfits_like_the_cross_entropy_one(ws, tmp_path):
    assert run(ws, tmp_path, epochs=12, acceptance_weight=0.5)["acc"][0] > 0.9


def test_lr_warms_up_then_decays_to_zero():
    cfg = TrainConfig(lr=1.0, warmup_fraction=0.1)
    lrs = [lr_at(s, 100, cfg) for s in range(101)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[100] == pytest.approx(0.0) and all(
        a >= b for a, b in zip(lrs[9:], lrs[10:], strict=False)
    )


def test_tiny_overfit_run_reaches_acc0_above_0_9(ws, tmp_path):
    best = run(ws, tmp_path, epochs=12)
    assert best["acc"][0] > 0.9
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and rows[-1]["acceptance_length"] > rows[0]["acceptance_length"]
    assert max(r["acceptance_length"] for r in rows) == best["acceptance_length"]
    assert {"acc", "expected_acceptance", "acceptance_length"} <= rows[0].keys()


def test_resume_after_a_kill_equals_the_uninterrupted_run_bit_for_bit(ws, tmp_path):
    run(ws, tmp_path / "whole", epochs=3, save_interval=2)
    with pytest.raises(Killed):
        run(ws, tmp_path / "cut", epochs=3, save_interval=2, stop_after=5)  # last save: step 4
    assert not (tmp_path / "cut" / "best.safetensors").exists()
    run(ws, tmp_path / "cut", epochs=3, save_interval=2)
    whole, cut = (load_file(str(tmp_path / d / "best.safetensors")) for d in ("whole", "cut"))
    assert whole.keys() == cut.keys() and all(torch.equal(whole[k], cut[k]) for k in whole)
    rows = [
        [json.loads(line) for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
        for d in ("whole", "cut")
    ]
    for row in rows[0] + rows[1]:
        row.pop("tokens_per_s")  # a timing of that run, not a result
    assert rows[0] == rows[1] and len(rows[0]) == 3


def test_a_resume_at_another_save_and_log_interval_equals_the_uninterrupted_run(ws, tmp_path):
    run(ws, tmp_path / "whole", epochs=3, save_interval=2)
    with pytest.raises(Killed):
        run(ws, tmp_path / "cut", epochs=3, save_interval=2, stop_after=5)  # last save: step 4
    log = tmp_path / "resumed.log"
    run(ws, tmp_path / "cut", epochs=3, save_interval=3, log_interval=1, log_path=log)
    assert "resuming at step 4" in log.read_text() and "starting fresh" not in log.read_text()
    whole, cut = (load_file(str(tmp_path / d / "best.safetensors")) for d in ("whole", "cut"))
    assert whole.keys() == cut.keys() and all(torch.equal(whole[k], cut[k]) for k in whole)


def _scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_curves_in_tensorboard_match_metrics_and_a_resume_draws_no_step_twice(ws, tmp_path):
    tb = tmp_path / "tb"
    with pytest.raises(Killed):
        run(ws, tmp_path, stop_after=5, tensorboard_dir=tb, log_interval=1, save_interval=2)
    run(ws, tmp_path, tensorboard_dir=tb, log_interval=1, save_interval=2)
    curves = _scalars(tb)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    got = curves["eval/acceptance_length"]
    assert [s for s, _ in got] == [r["step"] for r in rows]
    assert [v for _, v in got] == pytest.approx([r["acceptance_length"] for r in rows])
    assert {"train/loss", "train/lr", "train/tokens_per_s", "eval/acc_3"} <= set(curves)
    steps = [s for s, _ in curves["train/loss"]]
    # step 5 was drawn before the kill and again after resuming at the step-4 checkpoint: the
    # purge keeps one point per step
    assert steps == sorted(set(steps)) and steps[-1] == rows[-1]["step"]


def _export(model, target_dir, out):
    """`model` as an EAGLE-3 folder (the layout stage export writes)."""
    from specbuild.export import hf_config

    out.mkdir(parents=True)
    save_file(
        {k: v.contiguous() for k, v in model.export_state().items()}, out / "model.safetensors"
    )
    target = json.loads((target_dir / "config.json").read_text())
    config = hf_config(model.config, layer_ids=[1, 3, 4], target_config=target, dtype="float32")
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_warm_start_loads_every_weight_and_reuses_an_identical_vocab_map(ws, tmp_path):
    from pathlib import Path

    from specbuild.drafter.build import build_drafter, warm_start

    target_dir = Path(ws["target_fingerprint"]).parent
    cfg = TrainConfig()
    donor, _ = build_drafter(cfg, target_dir, ws["vocab"], 256)
    torch.manual_seed(7)
    for p in donor.parameters():
        p.data.normal_()
    folder = _export(donor, target_dir, tmp_path / "donor")
    model, _ = build_drafter(cfg, target_dir, ws["vocab"], 256)
    embed = model.embed_tokens.weight.clone()
    assert "reused" in warm_start(model, folder)
    for k, v in donor.state_dict().items():
        if k != "embed_tokens.weight":  # the target's, frozen, never exported
            assert torch.equal(model.state_dict()[k], v), k
    assert torch.equal(model.embed_tokens.weight, embed)


def test_warm_start_from_another_vocab_carries_each_tokens_row_over(ws, tmp_path):
    from pathlib import Path

    from specbuild.drafter.build import build_drafter, warm_start

    target_dir = Path(ws["target_fingerprint"]).parent
    donor, _ = build_drafter(TrainConfig(), target_dir, ws["vocab"], 256)
    donor.lm_head.weight.data = torch.randn_like(donor.lm_head.weight)
    # the donor drafts target ids 0, 2, 4, ... (ours) shifted by one draft slot: other map
    donor.d2t.data = torch.roll(donor.d2t + torch.arange(128), 1) - torch.arange(128)
    folder = _export(donor, target_dir, tmp_path / "donor")
    model, _ = build_drafter(TrainConfig(), target_dir, ws["vocab"], 256)
    said = warm_start(model, folder)
    assert "rebuilt: 128 of 128 draft tokens carried over" in said
    # our draft id j drafts target 2j; the donor held target 2j at draft slot j + 1
    assert torch.equal(model.lm_head.weight[5], donor.lm_head.weight[6])


def test_warm_start_from_a_drafter_of_another_shape_is_refused(ws, tmp_path):
    from pathlib import Path

    from specbuild.drafter.build import build_drafter, warm_start

    other = make_workspace(tmp_path / "other", SyntheticSpec(intermediate_size=96))
    other_dir = Path(other["target_fingerprint"]).parent
    donor, _ = build_drafter(TrainConfig(), other_dir, other["vocab"], 256)
    folder = _export(donor, other_dir, tmp_path / "donor")
    model, _ = build_drafter(TrainConfig(), Path(ws["target_fingerprint"]).parent, ws["vocab"], 256)
    with pytest.raises(ValueError, match=r"(?s)not a drafter of this target's shape.*\(96, 64\)"):
        warm_start(model, folder)


def test_a_run_with_init_from_says_it_warm_started(ws, tmp_path):
    first = tmp_path / "first"
    run(ws, first, epochs=1)
    from pathlib import Path

    from specbuild.drafter.build import build_drafter

    model, _ = build_drafter(TrainConfig(), Path(ws["target_fingerprint"]).parent, ws["vocab"], 256)
    model.load_state_dict(
        {**load_file(first / "best.safetensors"), "embed_tokens.weight": model.embed_tokens.weight}
    )
    folder = _export(model, Path(ws["target_fingerprint"]).parent, tmp_path / "donor")
    log = tmp_path / "train.log"
    run(ws, tmp_path / "second", epochs=1, init_from=str(folder), log_path=str(log))
    assert "warm start from" in log.read_text() and "reused" in log.read_text()


def test_an_exported_drafter_evaluates_on_other_shards_of_the_same_tokens(ws, tmp_path):
    """evaluate_drafter (benchmarks.fp8's one-teacher comparison): the drafter trained on fp8
    shards, judged on the bf16 shards of the same tokens, scores near the trainer's own eval
    (bf16-exported weights, another teacher) and far above an untrained drafter's."""
    from pathlib import Path

    from specbuild.drafter.build import build_drafter
    from specbuild.drafter.train import evaluate_drafter

    ws8 = make_workspace(tmp_path / "ws8", SyntheticSpec(samples=16, seq_len=24, aux_dtype="fp8"))
    best = run(ws8, tmp_path / "fp8", epochs=2)
    target = Path(ws["target_fingerprint"]).parent
    model, _ = build_drafter(TrainConfig(), target, ws["vocab"], 256)
    fresh = _export(model, target, tmp_path / "fresh")
    model.load_state_dict(
        {
            **load_file(tmp_path / "fp8" / "best.safetensors"),
            "embed_tokens.weight": model.embed_tokens.weight,
        }
    )
    trained = _export(model, target, tmp_path / "trained")
    cfg = TrainConfig(token_budget=96, max_length=24, eval_fraction=0, ttt_steps=3)
    common = dict(
        shards=ws["shards"], vocab=ws["vocab"], target_fingerprint=ws["target_fingerprint"]
    )
    got = evaluate_drafter(drafter=trained, config=cfg, **common)
    assert got["acceptance_length"] == pytest.approx(best["acceptance_length"], abs=0.1)
    assert evaluate_drafter(drafter=fresh, config=cfg, **common)["acceptance_length"] < (
        got["acceptance_length"] - 0.2
    )


def test_state_of_another_job_is_not_resumed(ws, tmp_path):
    run(ws, tmp_path, epochs=1, save_interval=1)
    steps = json.loads((tmp_path / "state" / "latest.json").read_text())
    run(ws, tmp_path, epochs=1, save_interval=1, lr=1e-3)  # different job: fresh start
    again = json.loads((tmp_path / "state" / "latest.json").read_text())
    assert steps["job"] != again["job"]


def test_a_state_folder_linked_to_another_disk_is_cleared_through_the_link(ws, tmp_path):
    run(ws, tmp_path, epochs=1, save_interval=1)
    disk = tmp_path / "big-disk" / "state"
    disk.parent.mkdir()
    shutil.move(tmp_path / "state", disk)
    (tmp_path / "state").symlink_to(disk)
    outside = tmp_path / "keep-me"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "file").write_text("not the state's")
    (disk / "linked").symlink_to(outside)  # a link in the state: goes, what it points to stays
    first = json.loads((disk / "latest.json").read_text())["job"]
    run(ws, tmp_path, epochs=1, save_interval=1, lr=1e-3)  # a train key changed: fresh start
    assert (tmp_path / "state").is_symlink() and (tmp_path / "state").resolve() == disk
    latest = json.loads((disk / "latest.json").read_text())
    assert latest["complete"] is True and latest["job"] != first
    assert not (disk / "linked").exists()
    assert (outside / "sub" / "file").read_text() == "not the state's"


def _trained_tokens(log) -> int:
    (line,) = [x for x in log.read_text().splitlines() if " trained " in x]
    return int(line.split(" trained ")[1].split()[0])


def test_a_finished_job_run_again_trains_from_scratch_as_forcerun_means(ws, tmp_path):
    first = run(ws, tmp_path, epochs=2, log_path=tmp_path / "first.log")
    assert json.loads((tmp_path / "state" / "latest.json").read_text())["complete"] is True
    again = run(ws, tmp_path, epochs=2, log_path=tmp_path / "again.log")  # same job, forced
    log = (tmp_path / "again.log").read_text()
    assert "starting fresh" in log and "a finished run of this job" in log
    assert "resuming" not in log
    assert _trained_tokens(tmp_path / "again.log") == _trained_tokens(tmp_path / "first.log") > 0
    again.pop("tokens_per_s"), first.pop("tokens_per_s")  # timings of each run
    assert again == first  # seeded: the same run again


def test_a_run_that_finished_as_an_orphan_is_written_again_not_retrained(ws, tmp_path, monkeypatch):
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    run_id = this_run().run_id.rsplit(":", 2)[0] + f":{killed.pid}:{process_start(killed.pid)}"
    killed.kill()
    killed.wait()
    monkeypatch.setenv(RUN_ENV, run_id)  # the snakemake that started the job was killed
    first = run(ws, tmp_path, epochs=2, log_path=tmp_path / "first.log")
    assert json.loads((tmp_path / "state" / "latest.json").read_text())["orphan"] is True
    weights = (tmp_path / "best.safetensors").read_bytes()
    (tmp_path / "best.safetensors").unlink()  # the rerun's Snakemake removes its outputs
    monkeypatch.setenv(RUN_ENV, this_run().run_id)  # the next run, live
    again = run(ws, tmp_path, epochs=2, log_path=tmp_path / "again.log")
    log = (tmp_path / "again.log").read_text()
    assert "finished after its snakemake ended" in log and "starting fresh" not in log
    assert _trained_tokens(tmp_path / "again.log") == 0 < _trained_tokens(tmp_path / "first.log")
    assert (tmp_path / "best.safetensors").read_bytes() == weights and again == first
    assert json.loads((tmp_path / "state" / "latest.json").read_text())["orphan"] is False


def test_an_interrupted_run_resumes_only_under_the_same_code(ws, tmp_path, monkeypatch):
    with pytest.raises(Killed):
        run(ws, tmp_path, epochs=2, save_interval=1, stop_after=3)
    monkeypatch.setattr("specbuild.drafter.train.source_digest", lambda: "edited sources")
    run(ws, tmp_path, epochs=2, log_path=tmp_path / "edited.log")
    log = (tmp_path / "edited.log").read_text()
    assert "starting fresh" in log and "other inputs, hyper-parameters or code" in log
    assert "resuming" not in log


def test_resume_status_resumes_only_an_interrupted_run_of_the_same_job(tmp_path):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    assert resume_status(tmp_path, job="a") == "none"
    save_checkpoint(
        tmp_path, job="a", state=TrainState(step=3), model=model.state_dict(), optimizer=opt
    )
    assert resume_status(tmp_path, job="a") == "resumable"
    assert resume_status(tmp_path, job="b") == "other-job"
    mark_complete(tmp_path, job="a")
    assert resume_status(tmp_path, job="a") == "complete"
    with pytest.raises(ValueError, match="another job"):
        mark_complete(tmp_path, job="b")
    save_checkpoint(
        tmp_path, job="a", state=TrainState(step=1), model=model.state_dict(), optimizer=opt
    )
    assert resume_status(tmp_path, job="a") == "resumable"  # a new run of it, interrupted


def test_the_job_key_changes_with_params_inputs_and_code(tmp_path):
    shard = tmp_path / "00000.safetensors"
    shard.write_bytes(b"x" * 10)
    base = dict(config={"lr": 1e-4}, inputs=[str(shard)], fingerprint="f", world_size=1, code="c")
    key = job_key(**base)
    assert job_key(**base) == key
    assert job_key(**base | {"config": {"lr": 2e-4}}) != key
    assert job_key(**base | {"code": "c2"}) != key
    assert job_key(**base | {"world_size": 2}) != key
    os.utime(shard, ns=(1, 1))  # re-extracted: same path and size, another mtime
    assert job_key(**base) != key


def test_the_source_digest_changes_when_any_source_file_does(tmp_path):
    (tmp_path / "drafter").mkdir()
    (tmp_path / "drafter" / "data.py").write_text("A = 1\n")
    (tmp_path / "notes.txt").write_text("not code")
    before = source_digest.__wrapped__(tmp_path)
    (tmp_path / "notes.txt").write_text("still not code")
    assert source_digest.__wrapped__(tmp_path) == before
    (tmp_path / "drafter" / "data.py").write_text("A = 2\n")
    assert source_digest.__wrapped__(tmp_path) != before
    assert len(source_digest()) == 64


def test_fp8_shards_train_like_bf16_ones(tmp_path):
    ws8 = make_workspace(tmp_path / "ws", SyntheticSpec(samples=8, seq_len=16, aux_dtype="fp8"))
    best = run(ws8, tmp_path / "out", epochs=1)
    assert best["eval_positions"][0] > 0 and best["step"] >= 1


def test_two_gloo_processes_train_with_ddp_through_torchrun(ws, tmp_path):
    best = run(ws, tmp_path, epochs=1, nproc=2)  # relaunches itself as 2 torchrun workers
    assert (tmp_path / "best.safetensors").exists() and best["step"] == 2  # 4 batches / 2 ranks
    state = json.loads((tmp_path / "state" / "latest.json").read_text())
    assert state["checkpoint"] == "step-00000002"


def _copy_shards(ws, folder):
    """The workspace with its shards copied under `folder` (so a test may damage them)."""
    folder.mkdir(parents=True)
    shards = [shutil.copy2(p, folder / os.path.basename(p)) for p in ws["shards"]]
    return ws | {"shards": [str(p) for p in shards]}


def test_a_shard_changed_on_disk_stops_training_before_any_step_naming_it(ws, tmp_path):
    bad = _copy_shards(ws, tmp_path / "hidden" / "synthetic")
    path = bad["shards"][1]
    stat, raw = os.stat(path), bytearray(open(path, "rb").read())
    n = int.from_bytes(raw[:8], "little")
    begin = 8 + n + json.loads(raw[8 : 8 + n])["aux"]["data_offsets"][0]
    for i in range(begin, begin + 4096, 2):  # 4 KB, lowest mantissa bit: every value finite
        raw[i] ^= 1
    open(path, "wb").write(bytes(raw))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # mtime kept, as a bad disk does
    with pytest.raises(ShardError) as err:
        run(bad, tmp_path / "out", epochs=1)
    msg = str(err.value)
    assert msg.startswith("1 of 2 hidden-state shard(s) failed verification; training did not")
    assert f"{path}:\n    - aux: checksum mismatch" in msg
    assert msg.endswith(f"snakemake --forcerun {path}")
    assert not (tmp_path / "out" / "best.safetensors").exists()
    assert not (tmp_path / "out" / "state").exists()  # not a single step, not a checkpoint


def test_shards_without_checksums_train_after_every_other_check_with_a_warning(ws, tmp_path):
    old = _copy_shards(ws, tmp_path / "hidden" / "synthetic")
    tensors, meta = read_shard(old["shards"][0])
    meta.pop("checksums")
    save_file(tensors, old["shards"][0], metadata=meta)  # as specbuild wrote shards before
    run(old, tmp_path / "out", epochs=1, log_path=tmp_path / "train.log")
    log = (tmp_path / "train.log").read_text()
    assert (
        f"1 of 2 shard(s) carry no checksums (written before specbuild recorded them), "
        f"first {old['shards'][0]}" in log
    )
    assert f"snakemake --forcerun {old['shards'][0]}" in log


def test_a_non_finite_loss_stops_training_at_that_step_naming_the_batch_shards(ws, tmp_path):
    # finite features so large that the drafter's fc overflows: every shard verifies
    huge = _copy_shards(ws, tmp_path / "hidden" / "synthetic")
    for path in huge["shards"]:
        tensors, meta = read_shard(path)
        tensors["aux"] = torch.full_like(tensors["aux"], torch.finfo(torch.bfloat16).max)
        write_shard(path, tensors, meta)
    with pytest.raises(TrainingDiverged) as err:
        run(huge, tmp_path / "out", epochs=1, save_interval=1)
    msg = str(err.value)
    # the loss is still finite at this step, its gradient is not: both are checked
    assert msg.startswith("step 1 (epoch 0, batch 0): loss ") and "gradient norm nan" in msg
    assert "was not applied" in msg
    assert any(p in msg for p in huge["shards"]) and "lower train.lr" in msg
    assert not (tmp_path / "out" / "best.safetensors").exists()
    assert not list((tmp_path / "out" / "state").glob("step-*"))


def test_loss_rows_pick_what_boolean_masks_pick():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(5, 11, generator=g) > 0.4  # shape: [B,L]
    last = torch.randn(5, 11, 3, generator=g)
    picks = loss_rows(mask, 4, torch.device("cpu"))
    assert torch.equal(last.flatten(0, 1)[picks.taught], last[mask])
    row = torch.full(mask.shape, -1, dtype=torch.int64)
    row[mask] = torch.arange(int(mask.sum()))
    for i, (at, r) in enumerate(picks.steps):
        h = torch.randn(5, 11 - i, 3, generator=g)  # step i's hidden over indices 0 .. L-1-i
        assert torch.equal(h.flatten(0, 1)[at], h[mask[:, i:]])
        assert torch.equal(r, row[:, i:][mask[:, i:]])


def test_positions_whose_target_argmax_cannot_be_drafted_carry_no_loss(ws):
    """The in-draft mask, worked out for a batch's new samples at once, equals each sample's own."""
    info = read_target_info(ws["target_fingerprint"])
    target = Path(ws["target_fingerprint"]).parent
    model, teacher = build_drafter(TrainConfig(), target, ws["vocab"], info.vocab_size)
    teacher.t2d = torch.rand(info.vocab_size, generator=torch.Generator().manual_seed(0)) > 0.5
    objective = TTTObjective(model, teacher, steps=1, decay=1.0, amp=False)
    data = ShardSet(ws["shards"], hidden_size=model.config.hidden_size)

    def expected(batch):
        want = batch.valid.clone()
        for b in range(len(batch.refs)):
            top = (batch.last_next[b].float() @ teacher.full.float().T).argmax(-1)
            want[b] &= teacher.t2d[top]
        return want

    first = data.batch(data.refs[:3], 24)
    mask, rows = objective._mask(first)
    assert torch.equal(mask, expected(first)) and rows == int(first.valid.sum())
    assert 0 < int(mask.sum()) < int(first.valid.sum())  # some positions masked, not all
    mixed = data.batch(data.refs[1:5], 24)  # two samples seen, two new
    mask, rows = objective._mask(mixed)
    assert torch.equal(mask, expected(mixed))
    assert rows == int(mixed.valid[2:].sum())  # only the new samples ran the full vocabulary


def test_a_fused_optimizer_skips_a_non_finite_step_on_the_device_and_stops_at_the_next_line(ws):
    # the CUDA path (fused AdamW, flags read back at log lines), here on the CPU's fused kernel
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weight], lr=0.1, fused=True)
    data = ShardSet(ws["shards"], hidden_size=64)
    finite = FiniteSteps(optimizer, Ranks(0, 1, torch.device("cpu")), data)
    assert finite.deferred
    losses = [torch.tensor(1.0), torch.tensor(float("nan")), torch.tensor(1.0)]
    seen = []
    for step, loss in enumerate(losses, 1):
        weight.grad = torch.full((3,), loss.item())
        finite.check(loss, weight.grad.norm(), f"step {step}", data.refs[step : step + 1])
        optimizer.step()  # no host read of the flag before it
        seen.append(weight.detach().clone())
    assert not torch.equal(seen[0], torch.ones(3))  # step 1 applied
    assert torch.equal(seen[1], seen[0])  # step 2 skipped on the device, no NaN reached it
    assert torch.isfinite(seen[2]).all() and not torch.equal(seen[2], seen[1])
    assert optimizer.state[weight]["step"].item() == 2
    with pytest.raises(TrainingDiverged) as err:
        finite.settle()
    assert str(err.value).startswith("step 2: loss nan") and "was not applied" in str(err.value)
    assert data.paths[data.refs[2].shard].name in str(err.value)
    finite.settle()  # settled: nothing pending


@pytest.mark.skipif(not cpu_bf16_supported(), reason="CPU without native bf16")
def test_cpu_bf16_autocast_run_overfits_like_the_float32_one(ws, tmp_path, caplog):
    best = run(ws, tmp_path, epochs=12, device="cpu", precision="bfloat16")
    assert best["acc"][0] > 0.9
    # autocast really ran: the objective saw bf16 logits before widening them
    objective_amp = []
    orig = TTTObjective.__init__

    def spy(self, *a, **kw):
        orig(self, *a, **kw)
        objective_amp.append(self.amp)

    TTTObjective.__init__ = spy
    try:
        run(ws, tmp_path / "again", epochs=1, device="cpu", precision="bfloat16")
        run(ws, tmp_path / "fp32", epochs=1, device="cpu")
    finally:
        TTTObjective.__init__ = orig
    assert objective_amp == [True, False]


@pytest.mark.gpu
def test_cuda_bf16_autocast_run_overfits_like_the_cpu_one(ws, tmp_path):
    best = run(ws, tmp_path, epochs=12, device="cuda")
    assert best["acc"][0] > 0.9


def test_an_eval_set_picks_the_best_epoch_and_is_never_trained_on(ws, tmp_path):
    train_shard, held_shard = ws["shards"]
    best = train_drafter(
        files=TrainFiles(
            shards=[train_shard],
            eval_shards=[held_shard],
            vocab=ws["vocab"],
            target_fingerprint=ws["target_fingerprint"],
            best_out=str(tmp_path / "best.safetensors"),
            metrics_out=str(tmp_path / "metrics.jsonl"),
            state_dir=str(tmp_path / "state"),
        ),
        config=TrainConfig(
            epochs=3, token_budget=96, max_length=24, eval_fraction=0, eval_set="held", lr=3e-3
        ),
        threads=1,
    )
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # trained tokens: the 8 samples of the training shard only (23 inputs each, 3 epochs)
    assert rows[-1]["tokens"] == 3 * 8 * 23
    # evaluated: every sample of the held-out shard, and nothing else
    held = ShardSet([held_shard], hidden_size=64)
    assert rows[0]["eval_positions"][0] == sum(
        int(held.batch([r], 24).valid.sum()) for r in held.refs
    )
    assert best["acceptance_length"] == max(r["acceptance_length"] for r in rows)
    assert split_held_out_shards([0, 0, 1, 1, 0], {1}, "held") == ([0, 1, 4], [2, 3])
    with pytest.raises(ValueError, match="eval set 'held' leaves 3 training and 0 held-out"):
        split_held_out_shards([0, 0, 0], {1}, "held")
    with pytest.raises(ValueError, match="eval_set 'held' is held out for evaluation"):
        TrainConfig(eval_set="held", eval_fraction=0.05).check()


def _target_with_layers(ws, folder, *, drop=None, seed=1):
    """The workspace's target folder plus every decoder layer's weights (Llama names)."""
    from benchmarks.synthetic import SyntheticSpec, target_config

    src = os.path.dirname(ws["target_fingerprint"])
    shutil.copytree(src, folder)
    cfg = target_config(SyntheticSpec())
    H, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes = {
        "input_layernorm.weight": [H],
        "self_attn.q_proj.weight": [q, H],
        "self_attn.k_proj.weight": [kv, H],
        "self_attn.v_proj.weight": [kv, H],
        "self_attn.o_proj.weight": [H, q],
        "post_attention_layernorm.weight": [H],
        "mlp.gate_proj.weight": [inter, H],
        "mlp.up_proj.weight": [inter, H],
        "mlp.down_proj.weight": [H, inter],
    }
    g = torch.Generator().manual_seed(seed)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    for layer in range(cfg["num_hidden_layers"]):
        for name, shape in shapes.items():
            if name != drop:
                tensors[f"model.layers.{layer}.{name}"] = torch.randn(shape, generator=g)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_target_last_layer_init_copies_the_last_layer_and_the_embedding_half_only(ws, tmp_path):
    from specbuild.drafter.build import build_drafter
    from specbuild.drafter.target_init import init_from_target_layer

    target = _target_with_layers(ws, tmp_path / "target")
    model, _ = build_drafter(TrainConfig(), target, ws["vocab"], 256)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lines = init_from_target_layer(model, target)
    theirs = load_file(target / "model.safetensors")
    mid = model.midlayer
    H = 64
    assert torch.equal(
        mid.self_attn.q_proj.weight[:, :H], theirs["model.layers.7.self_attn.q_proj.weight"]
    )
    assert torch.equal(mid.mlp.down_proj.weight, theirs["model.layers.7.mlp.down_proj.weight"])
    assert torch.equal(mid.input_layernorm.weight, theirs["model.layers.7.input_layernorm.weight"])
    after = model.state_dict()
    # the hidden half, its norm, fc and the head are untouched
    for k in ("midlayer.hidden_norm.weight", "fc.weight", "lm_head.weight", "norm.weight"):
        assert torch.equal(after[k], before[k]), k
    assert torch.equal(
        mid.self_attn.k_proj.weight[:, H:], before["midlayer.self_attn.k_proj.weight"][:, H:]
    )
    assert len(lines) == 9 and lines[1] == (
        "midlayer.self_attn.q_proj.weight[:, :H] <- model.layers.7.self_attn.q_proj.weight [64, 64]"
    )


def test_target_last_layer_init_refuses_a_layer_it_cannot_fully_copy(ws, tmp_path):
    from specbuild.drafter.build import build_drafter
    from specbuild.drafter.target_init import init_from_target_layer

    target = _target_with_layers(ws, tmp_path / "target", drop="mlp.up_proj.weight")
    model, _ = build_drafter(TrainConfig(), target, ws["vocab"], 256)
    with pytest.raises(ValueError, match=r"lack \['model.layers.7.mlp.up_proj.weight'\]"):
        init_from_target_layer(model, target)
    with pytest.raises(ValueError, match="a warm start replaces every weight"):
        TrainConfig(init="target_last_layer", init_from="x").check()


def test_a_run_with_target_last_layer_init_logs_what_it_copied(ws, tmp_path):
    target = _target_with_layers(ws, tmp_path / "target")
    log = tmp_path / "train.log"
    spec = dict(ws, target_fingerprint=str(target / "fingerprint.json"))
    run(spec, tmp_path, epochs=1, init="target_last_layer", log_path=str(log))
    text = log.read_text()
    assert "init from the target's last decoder layer" in text
    assert "midlayer.mlp.gate_proj.weight <- model.layers.7.mlp.gate_proj.weight [128, 64]" in text


def test_target_last_layer_init_reads_smollm2s_own_weights(target_dir):
    from specbuild.drafter.config import DrafterConfig
    from specbuild.drafter.model import Eagle3Drafter
    from specbuild.drafter.target_init import init_from_target_layer
    from specbuild.drafter.teacher import read_target_weights

    cfg = json.loads((target_dir / "config.json").read_text())
    model = Eagle3Drafter(DrafterConfig.from_target(cfg, draft_vocab_size=32))
    lines = init_from_target_layer(model, target_dir)
    last = cfg["num_hidden_layers"] - 1
    name = f"model.layers.{last}.self_attn.v_proj.weight"
    (v,) = read_target_weights(target_dir, [name]).values()
    assert len(lines) == 9
    assert torch.equal(model.midlayer.self_attn.v_proj.weight[:, : cfg["hidden_size"]], v.float())
