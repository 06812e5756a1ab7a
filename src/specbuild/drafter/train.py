"""Stage `train`: an EAGLE-3 drafter from hidden-state shards, with training-time test.

Alignment of one sample (tokens x, target features g = aux, target final state last):

    index t           0        1        2      ...   t
    feature           g0       g1       g2           g[t]   (target at t has read x0..x[t])
    step 0 input      x1       x2       x3           embed(x[t+1]) at position t
    step 0 predicts   x2       x3       x4           teacher softmax(lm_head(last[t+1]))
    step 1 input      x2       x3       x4           embed(x[t+2]) + step-0 hidden at t, pos t+1
    step 1 predicts   x3       x4       x5           teacher lm_head(last[t+2])
    step i            input x[t+1+i] at position t+i, predicts x[t+2+i], teacher last[t+1+i]

Why: g[t] is what the target computed while producing x[t+1], and serving hands the drafter
exactly that pair (the token the target just emitted, the features it came from) at the
target's position t. A position counts in the loss when the predicted token x[t+2+i] is a
response token (loss_mask) and the target's argmax there is in the draft vocabulary.
In step i, query t attends to step-0 keys 0..t plus its own keys of steps 1..i
(`model.ttt_attention`): what a KV cache holds when the drafter chains i drafts.

Loss: sum_i decay**i * soft cross-entropy(teacher restricted to the draft vocab, drafter);
the teacher at `teacher_temperature` (0: its argmax as a hard label).
Hyper-parameters and the config combinations rejected up front: `config.TrainConfig`.
Beside this loop: `build` (the drafter, its start, its objective and optimizer), `data` (the
shards verified and split, each epoch's batches, the next batch read ahead), `launch` (one
process or torchrun's workers), `progress` (the plan, log lines, curves, speed windows), `state`
(checkpoints, resume, what a saved drafter carries), `observer` (the hooks benchmarks and tests
watch a run through).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.profiler import record_function

from specbuild import __version__
from specbuild.config.views import TRAIN_CADENCE
from specbuild.drafter.build import (
    attention_kind,
    build_drafter,
    build_objective,
    build_optimizer,
    init_weights,
    loss_kind,
    to_device,
    warm_start,
)
from specbuild.drafter.config import TrainConfig
from specbuild.drafter.data import (
    Batch,
    SampleRef,
    ShardSet,
    batches_ahead,
    plan_epochs,
    read_training_data,
    split_samples,
    steps_from,
)
from specbuild.drafter.launch import (
    Ranks,
    data_parallel,
    launch_torchrun,
    needs_launch,
    setup_ranks,
)
from specbuild.drafter.objective import evaluate
from specbuild.drafter.observer import Observer, TrainRun
from specbuild.drafter.progress import Progress, RunPlan, log_plan
from specbuild.drafter.state import (
    BEST,
    TrainState,
    clear_state,
    drafter_meta,
    ensure_state_space,
    job_key,
    resume,
    save_checkpoint,
    save_drafter,
    source_digest,
    write_outputs,
)
from specbuild.eagle.target_info import read_target_info
from specbuild.infra.io import setup_logging, write_jsonl

__all__ = [
    "TrainConfig",
    "TrainFiles",
    "TrainingDiverged",
    "evaluate_drafter",
    "lr_at",
    "train_drafter",
]

log = logging.getLogger("specbuild")


class TrainingDiverged(RuntimeError):
    """A non-finite loss or gradient: the step is not applied, and nothing after it is saved."""


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to 0 at the last step."""
    warm = max(1, int(cfg.warmup_fraction * total))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, total - warm))
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


class FiniteSteps:
    """Stops the run at the first step whose loss or gradient norm is not finite, that step
    not applied: a NaN model would later win "best" and export.

    With a fused AdamW (CUDA) the host does not wait for the flag: it reaches the optimizer as
    `found_inf`, which skips the step on the device, and the host reads the flags at `settle`
    (each log line, eval and checkpoint, where it waits for the GPU anyway), before anything
    is saved. A wait every step would leave the GPU idle while the host queues the next one.
    Elsewhere each step is checked as it is taken.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, ranks: Ranks, data: ShardSet) -> None:
        self.optimizer, self.ranks, self.data = optimizer, ranks, data
        self.deferred = bool(optimizer.defaults.get("fused"))
        self.pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, str, list]] = []

    def check(self, loss: torch.Tensor, grad_norm: torch.Tensor, where: str, refs: list) -> None:
        """Before `optimizer.step()`: the flag of this step, on every rank at once."""
        finite = (torch.isfinite(loss.detach()) & torch.isfinite(grad_norm)).to(torch.int32)
        finite = self.ranks.min(finite)  # every rank skips and stops at the same step
        if self.deferred:
            self.optimizer.found_inf = (1 - finite).float()
            self.pending.append((finite, loss.detach(), grad_norm, where, refs))
        elif not bool(finite):
            self._stop(loss, grad_norm, where, refs)

    def settle(self) -> None:
        """Raise TrainingDiverged for the first non-finite step since the last settle."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        flags = torch.stack([p[0] for p in pending]).tolist()
        for flag, (_, loss, grad_norm, where, refs) in zip(flags, pending, strict=True):
            if not flag:
                self._stop(loss, grad_norm, where, refs)

    def _stop(self, loss: torch.Tensor, grad_norm: torch.Tensor, where: str, refs: list) -> None:
        shards = sorted({str(self.data.paths[r.shard]) for r in refs})
        raise TrainingDiverged(
            f"{where}: loss {loss.item()}, gradient norm {grad_norm.item()}; the step was not "
            f"applied and nothing after the last checkpoint is saved. The batch's samples come "
            f"from {', '.join(shards)}. Every shard passed verification (finite features), so "
            "the training diverged: lower train.lr or raise train.warmup_fraction (or use "
            "precision float32), then rerun."
        )


def _job_key(cfg: TrainConfig, shards: list[str], vocab: str, fingerprint: str, world: int) -> str:
    code = f"specbuild {__version__} {source_digest()} torch {torch.__version__}"
    return job_key(
        config={k: v for k, v in asdict(cfg).items() if k not in TRAIN_CADENCE},
        inputs=[*shards, vocab],
        fingerprint=fingerprint,
        world_size=world,
        code=code,
    )


def _evaluate(
    objective: nn.Module, data: ShardSet, refs: list[SampleRef], cfg: TrainConfig, ranks: Ranks
) -> dict:
    return evaluate(
        objective,
        data,
        refs,
        token_budget=cfg.token_budget,
        max_length=cfg.max_length,
        rank=ranks.rank,
        world_size=ranks.world,
        device=ranks.device,
    )


@dataclass(frozen=True)
class TrainFiles:
    """What a training job reads and writes."""

    shards: Sequence[str]  # hidden-state shards trained on
    vocab: str  # the draft vocabulary (d2t, t2d)
    target_fingerprint: str  # in the target's folder
    best_out: str  # the best drafter's weights
    metrics_out: str  # the eval rows
    # resumable checkpoints: not an output (a failed job's outputs are deleted)
    state_dir: str
    eval_shards: Sequence[str] = ()  # the held-out `train.eval_set` (none: a split of shards)
    tensorboard_dir: str | None = None  # training curves, kept across a resume


def train_drafter(
    *,
    files: TrainFiles,
    config: TrainConfig,
    log_path: str | None = None,
    threads: int | None = None,
    observer: Observer | None = None,
) -> dict:
    """Train and write the best drafter to `files.best_out` and the eval rows to
    `files.metrics_out`. Returns the best eval row.

    Eval samples, whose simulated acceptance length picks the best checkpoint: every sample of
    `files.eval_shards` (the held-out `train.eval_set`, never trained on) when given, else the
    `eval_fraction` split of `files.shards`.

    Before any step every shard is read whole once and verified (`data.verify_for_training`:
    checksums, NaN/Inf, shapes, offsets); one broken shard stops the job, listing all of them.
    A step whose loss or gradient norm is NaN/Inf is not applied: TrainingDiverged names the
    step and the shards of its batch.

    Resume or fresh start: Snakemake cannot tell the job whether it was forced, so the state
    folder says what the last run of this job did. Every checkpoint carries the job key
    (`state.job_key`: hyper-parameters but TRAIN_CADENCE, each input's path, size and mtime,
    target fingerprint,
    world size, and the code: specbuild's version, a digest of its sources, torch's version).
    The last thing a finished run does is mark `latest.json` complete. So:

        state of this job, not complete   an interrupted run (killed, preempted): resume it
        state of this job, complete       a finished job run again: `--forcerun train`, or its
                                          outputs deleted: clear the folder, train from step 0
        state of this job, complete as    a run that finished after its snakemake was killed
          an orphan                       (no run recorded its outputs): resume at its last
                                          checkpoint, write the outputs again, no step trained
        state of another key              other inputs, hyper-parameters or code: clear, step 0
        no state                          step 0

    A kill between the outputs and the completion mark leaves the run resumable: it resumes
    at its last step and writes the outputs again.

    `observer` (`drafter.observer`; benchmarks and tests) watches the steps of each process;
    it needs the run's processes started by torchrun when `train.nproc` > 1.
    """
    cfg, f = config, files
    if needs_launch(cfg):  # torchrun's workers each call this function with these arguments
        spec = dict(files=asdict(f), log_path=log_path, threads=threads, config=asdict(cfg))
        return launch_torchrun(spec, nproc=cfg.nproc, observer=observer)
    state_dir, target_fingerprint, vocab = f.state_dir, f.target_fingerprint, f.vocab
    observer = observer or Observer()
    ranks = setup_ranks(cfg)
    device = ranks.device
    if ranks.rank == 0:  # append: the job's script (or torchrun's launcher) started this log
        setup_logging(log_path, append=True)
    if threads:
        torch.set_num_threads(threads)
    shards, held_out = [str(s) for s in f.shards], [str(s) for s in f.eval_shards]
    info = read_target_info(target_fingerprint)
    target_dir = Path(target_fingerprint).parent
    data, train_refs, eval_refs = read_training_data(cfg, shards, held_out, info, ranks)
    model, teacher = build_drafter(cfg, target_dir, vocab, info.vocab_size)
    params = [p for p in model.parameters() if p.requires_grad]
    if ranks.rank == 0:  # before the first step: a checkpoint that fills the disk loses the steps
        ensure_state_space(model, state_dir)
    amp = to_device(model, teacher, cfg, device)
    plans = plan_epochs(cfg, train_refs, ranks)
    total = sum(len(p) for p in plans)
    optimizer = build_optimizer(params, cfg, device)
    job = _job_key(cfg, shards + held_out, vocab, info.fingerprint, ranks.world)
    state = resume(state_dir, job=job, model=model, optimizer=optimizer)
    if state is None:  # a fresh start
        state = TrainState()
        init_weights(model, cfg, target_dir)
        if ranks.rank == 0:
            clear_state(state_dir)
    ranks.barrier()
    attention, loss_path = attention_kind(cfg, device), loss_kind(cfg, device)
    objective = build_objective(cfg, model, teacher, amp=amp, attention=attention, loss=loss_path)
    step_fn = data_parallel(objective, ranks)
    meta = drafter_meta(model, data, info.fingerprint, target_dir) | {"family": cfg.family}
    kinds = f"{attention} attention; {loss_path} loss; {'bf16 autocast' if amp else 'float32'}"
    plan = RunPlan(
        trainable=sum(p.numel() for p in params),
        train_samples=len(train_refs),
        eval_samples=len(eval_refs),
        held_out=bool(held_out),
        skipped=data.skipped,
        steps=total,
        kinds=kinds,
    )
    log_plan(plan, cfg=cfg, ranks=ranks)
    progress = Progress(ranks, f.tensorboard_dir, start_step=state.step, total=total)
    order = steps_from(plans, state.epoch, state.batch)

    def load(e: int, b: int) -> Batch:
        pinned = device.type == "cuda"  # then the copy to the device does not block the host
        return data.batch([train_refs[i] for i in plans[e][b]], cfg.max_length, pin_memory=pinned)

    batches, best_path = batches_ahead(load, order), Path(state_dir) / BEST
    run = TrainRun(cfg, ranks, objective, state, total, progress.speed, attention, loss_path)
    observer.on_start(run)
    finite = FiniteSteps(optimizer, ranks, data)
    for epoch, b in order:
        with record_function("specbuild::data"):  # the wait for the loader, then the copy
            batch = next(batches).to(device)  # pinned on CUDA: the copy does not block the host
        for group in optimizer.param_groups:
            group["lr"] = lr_at(state.step, total, cfg)
        loss = step_fn(batch)
        with record_function("specbuild::optimizer"):
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        with record_function("specbuild::optimizer"):
            grad_norm = nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            where = f"step {state.step + 1} (epoch {epoch}, batch {b})"
            finite.check(loss, grad_norm, where, batch.refs)
            optimizer.step()
        state.step, state.epoch, state.batch = state.step + 1, epoch, b + 1
        progress.add(batch.num_tokens, objective.flops(), loss)
        end_of_epoch = b + 1 == len(plans[epoch])
        eval_due = end_of_epoch or (cfg.eval_interval and state.step % cfg.eval_interval == 0)
        save_due = state.step % cfg.save_interval == 0 or state.step == total
        line_due = eval_due or save_due or state.step % cfg.log_interval == 0
        if line_due:  # evals and checkpoints come with a line
            finite.settle()
            state.tokens += progress.line(state.step, epoch, lr_at(state.step - 1, total, cfg))
        if eval_due:
            row = {"step": state.step, "epoch": epoch, "tokens": state.tokens}
            row["tokens_per_s"] = progress.tokens_per_s()
            row |= _evaluate(objective, data, eval_refs, cfg, ranks)
            state.metrics.append(row)
            best = row["acceptance_length"] > state.best
            progress.eval(state.step, row, best=best)
            if ranks.rank == 0 and best:
                saved = meta | {"step": state.step, "metrics": row}
                save_drafter(best_path, model.export_state(), saved)
            if ranks.rank == 0:
                write_jsonl(Path(state_dir) / "metrics.jsonl", state.metrics)
            state.best = max(state.best, row["acceptance_length"])
        if end_of_epoch:
            state.epoch, state.batch = epoch + 1, 0
        if ranks.rank == 0 and save_due:
            save_checkpoint(
                state_dir, job=job, state=state, model=model.export_state(), optimizer=optimizer
            )
        ranks.barrier()
        observer.on_step(run)
        if line_due:  # the next window's clock starts after this one's eval and checkpoint
            progress.restart()
    finite.settle()
    progress.close()
    observer.on_end(run)
    best_row = state.best_row()
    if ranks.rank == 0:
        write_outputs(state_dir, state, job=job, best_out=f.best_out, metrics_out=f.metrics_out)
    ranks.barrier()
    return best_row


def evaluate_drafter(
    *,
    drafter: str | os.PathLike,
    shards: list[str],
    vocab: str,
    target_fingerprint: str,
    config: TrainConfig,
) -> dict:
    """The eval row of an exported drafter (its folder) on the `eval_fraction` split of
    `shards` (the samples training held out: the split hashes sample keys, not shard bytes),
    against these shards' own teacher. So drafters trained on different shards of the same
    tokens meet one teacher (benchmarks.fp8: fp8-trained drafters judged by bf16 `last`)."""
    cfg = config
    info = read_target_info(target_fingerprint)
    data = ShardSet(shards, hidden_size=info.hidden_size, target_fingerprint=info.fingerprint)
    model, teacher = build_drafter(cfg, Path(target_fingerprint).parent, vocab, info.vocab_size)
    warm_start(model, drafter)
    _, eval_idx = split_samples([data.key(r) for r in data.refs], cfg.eval_fraction)
    objective = build_objective(
        cfg, model, teacher, amp=False, attention=attention_kind(cfg, torch.device("cpu"))
    )
    refs = [data.refs[i] for i in eval_idx]
    return evaluate(objective, data, refs, token_budget=cfg.token_budget, max_length=cfg.max_length)


def main(argv: list[str] | None = None) -> None:
    """`python -m specbuild.drafter.train spec.json` (also each torchrun worker)."""
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    spec["config"] = TrainConfig.from_params(spec["config"])
    spec["files"] = TrainFiles(**spec["files"])
    train_drafter(**spec)


if __name__ == "__main__":
    main()
