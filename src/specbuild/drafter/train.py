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
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from specbuild import __version__
from specbuild.disk import ensure_free_space, train_need
from specbuild.drafter import fused_attention
from specbuild.drafter.config import DrafterConfig, TrainConfig, cpu_bf16_supported
from specbuild.drafter.curves import Curves
from specbuild.drafter.data import (
    Batch,
    ShardSet,
    plan_batches,
    split_held_out_shards,
    split_samples,
    verify_for_training,
)
from specbuild.drafter.flops import device_name, peak_tflops, step_flops
from specbuild.drafter.model import Eagle3Drafter
from specbuild.drafter.objective import TTTObjective, evaluate
from specbuild.drafter.profile import StepProfiler
from specbuild.drafter.state import (
    TrainState,
    clear_state,
    job_key,
    load_checkpoint,
    mark_complete,
    resume_status,
    save_checkpoint,
    save_drafter,
    source_digest,
)
from specbuild.drafter.target_init import init_from_target_layer
from specbuild.drafter.teacher import Teacher, read_target_weights, read_vocab
from specbuild.drafter.throughput import Throughput, Window, benchmarks_row, format_mfu
from specbuild.io import atomic_path, read_json, setup_logging, write_json, write_jsonl
from specbuild.onednn_linear import use_onednn_training_linears
from specbuild.target import read_target_info

__all__ = [
    "TrainConfig",
    "TrainingDiverged",
    "TrainingInterrupted",
    "evaluate_drafter",
    "lr_at",
    "train_drafter",
]

log = logging.getLogger("specbuild")


_NOT_RESUMED = {
    "complete": "a finished run of this job (a forced rerun trains from scratch)",
    "other-job": "the state of other inputs, hyper-parameters or code",
}


class TrainingInterrupted(RuntimeError):
    """Raised by `stop_after` (tests): the process dies here as if killed."""


class TrainingDiverged(RuntimeError):
    """A non-finite loss or gradient: the step is not applied, and nothing after it is saved."""


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to 0 at the last step."""
    warm = max(1, int(cfg.warmup_fraction * total))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, total - warm))
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def _setup(cfg: TrainConfig) -> tuple[int, int, torch.device]:
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return rank, world, torch.device("cuda", local)
    return rank, world, torch.device("cpu")


def _sum_ranks(values: list[int], device: torch.device, world: int) -> list[int]:
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def _batches_ahead(
    load: Callable[[int, int], Batch], order: Sequence[tuple[int, int]]
) -> Iterator[Batch]:
    """Yield load(epoch, b) for each (epoch, b) of `order`, the next one loading in a thread
    while the caller trains on this one: reading shards and padding a batch takes the host
    long enough that the GPU would otherwise wait for it at every step."""

    def load_labelled(epoch: int, b: int) -> Batch:
        with record_function("specbuild::prefetch"):  # `drafter.profile` leaves it out
            return load(epoch, b)

    pool = ThreadPoolExecutor(1, thread_name_prefix="batches")
    try:
        ahead = pool.submit(load_labelled, *order[0]) if order else None
        for k in range(len(order)):
            batch = ahead.result()
            ahead = pool.submit(load_labelled, *order[k + 1]) if k + 1 < len(order) else None
            yield batch
    finally:  # also when the caller stops early (an exception): one batch at most to wait for
        pool.shutdown(wait=True, cancel_futures=True)


def _check_finite(
    loss: torch.Tensor, grad_norm: torch.Tensor, world: int, where: str, shards: list[str]
) -> None:
    """Stop before a non-finite step is applied: a NaN model would later win "best" and export."""
    finite = (torch.isfinite(loss.detach()) & torch.isfinite(grad_norm)).to(torch.int32)
    if world > 1:  # every rank stops at the same step
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    if bool(finite):
        return
    raise TrainingDiverged(
        f"{where}: loss {loss.item()}, gradient norm {grad_norm.item()}; the step was not "
        f"applied and nothing after the last checkpoint is saved. The batch's samples come "
        f"from {', '.join(shards)}. Every shard passed verification (finite features), so the "
        "training diverged: lower train.lr or raise train.warmup_fraction (or use precision "
        "float32), then rerun."
    )


def _attention(cfg: TrainConfig, device: torch.device) -> str:
    """train.attention resolved: `auto` is the fused kernel on CUDA, the reference elsewhere."""
    if cfg.attention != "auto":
        return cfg.attention
    return "flex" if device.type == "cuda" and fused_attention.available() else "reference"


def _autocast(cfg: TrainConfig, device: torch.device) -> bool:
    """bf16 autocast: on CUDA unless float32 is asked for; on CPU when bfloat16 is asked for
    and the CPU has native bf16 (elsewhere oneDNN emulates it, slower than float32)."""
    if device.type == "cuda":
        return cfg.precision != "float32"
    if cfg.precision != "bfloat16":
        return False
    if cpu_bf16_supported():
        return True
    log.warning(
        "train.precision bfloat16: this CPU has no native bf16 (AVX512-BF16 or AMX), "
        "training in float32"
    )
    return False


def _loss(cfg: TrainConfig, device: torch.device) -> str:
    """train.loss resolved: `auto` is the fused loss on CUDA (on CPU the matmuls bound it: no
    gain measured), the reference elsewhere."""
    if cfg.loss != "auto":
        return cfg.loss
    return "fused" if device.type == "cuda" else "reference"


def _objective(
    cfg: TrainConfig,
    model: nn.Module,
    teacher: Teacher,
    *,
    amp: bool,
    attention: str,
    loss: str = "reference",
) -> TTTObjective:
    """The training-time-test loss of `cfg` (training and `evaluate_drafter` alike)."""
    return TTTObjective(
        model,
        teacher,
        steps=cfg.ttt_steps,
        decay=cfg.loss_decay,
        temperature=cfg.teacher_temperature,
        amp=amp,
        attention=attention,
        fused_loss=loss == "fused",
    )


def _job_key(cfg: TrainConfig, shards: list[str], vocab: str, fingerprint: str, world: int) -> str:
    code = f"specbuild {__version__} {source_digest()} torch {torch.__version__}"
    return job_key(
        config=asdict(cfg),
        inputs=[*shards, vocab],
        fingerprint=fingerprint,
        world_size=world,
        code=code,
    )


def _build(cfg: TrainConfig, target_dir: Path, vocab: str, vocab_size: int):
    d2t, t2d = read_vocab(vocab, vocab_size=vocab_size)
    weights = read_target_weights(
        target_dir, ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
    )
    mcfg = DrafterConfig.from_target(
        read_json(target_dir / "config.json"), draft_vocab_size=d2t.shape[0], fc_norm=cfg.fc_norm
    )
    torch.manual_seed(cfg.seed)
    model = Eagle3Drafter(mcfg)
    teacher = Teacher(weights["lm_head.weight"], d2t, t2d)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(weights["model.embed_tokens.weight"])
        # Start from the target's head and final norm: norm(h) then learns to look like `last`.
        model.lm_head.weight.copy_(teacher.draft)
        model.norm.weight.copy_(weights["model.norm.weight"])
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
    return model, teacher


def warm_start(model: Eagle3Drafter, folder: str | os.PathLike) -> str:
    """Load the drafter in `folder` into `model` (every shape checked first) and say what
    happened to the draft vocabulary: lm_head rows are draft-vocabulary rows, so they are
    reused as they are only when both maps agree; otherwise each of our draft tokens takes the
    folder's row for the same target token where it has one, and keeps the target's head row
    (`_build`'s start) where it has none."""
    embed = model.embed_tokens.weight.detach()
    theirs = Eagle3Drafter.from_pretrained(
        folder, embed_tokens_weight=embed, dtype=torch.float32, device=embed.device
    )
    ours, src = model.state_dict(), theirs.state_dict()
    vocab_keys = {"lm_head.weight", "d2t", "t2d"}
    faults = [
        f"{k}: {tuple(src[k].shape)} there, {tuple(v.shape)} here"
        for k, v in ours.items()
        if k not in vocab_keys and k in src and src[k].shape != v.shape
    ]
    if faults:
        raise ValueError(
            f"train.init_from {folder}: not a drafter of this target's shape:\n  "
            + "\n  ".join(faults)
        )
    with torch.no_grad():
        for k, v in ours.items():
            if k not in vocab_keys and k != "embed_tokens.weight":
                v.copy_(src[k])
        if torch.equal(theirs.d2t, model.d2t) and torch.equal(theirs.t2d, model.t2d):
            model.lm_head.weight.copy_(src["lm_head.weight"])
            return "draft vocabulary map reused (identical to this build's)"
        targets = (torch.arange(len(theirs.d2t)) + theirs.d2t).tolist()
        row_of = {t: i for i, t in enumerate(targets)}
        ours_targets = (torch.arange(len(model.d2t)) + model.d2t).tolist()
        pairs = [(j, row_of[t]) for j, t in enumerate(ours_targets) if t in row_of]
        if pairs:
            dst, rows = zip(*pairs, strict=True)
            model.lm_head.weight[list(dst)] = src["lm_head.weight"][list(rows)]
    return (
        f"draft vocabulary map rebuilt: {len(pairs)} of {len(ours_targets)} draft tokens carried "
        f"over from {folder}, the rest start from the target's head"
    )


def train_drafter(
    *,
    shards: list[str],
    vocab: str,
    target_fingerprint: str,
    best_out: str,
    metrics_out: str,
    state_dir: str,
    config: TrainConfig,
    log_path: str | None = None,
    threads: int | None = None,
    stop_after: int | None = None,
    tensorboard_dir: str | None = None,
    bench_out: str | None = None,
    profile_out: str | None = None,
    eval_shards: list[str] | None = None,
) -> dict:
    """Train and write the best drafter to `best_out` and the eval rows to `metrics_out`.
    Returns the best eval row.

    Eval samples, whose simulated acceptance length picks the best checkpoint: every sample of
    `eval_shards` (the held-out `train.eval_set`, never trained on) when given, else the
    `eval_fraction` split of `shards`.

    Speed (`make bench-train`): `bench_out` gets the run's tokens/s, TFLOP/s and MFU as JSON
    (`throughput.Throughput.result`); `profile_out` the time shares of a few steps after
    warm-up (`profile.StepProfiler`, rank 0).

    Before any step every shard is read whole once and verified (`data.verify_for_training`:
    checksums, NaN/Inf, shapes, offsets); one broken shard stops the job, listing all of them.
    A step whose loss or gradient norm is NaN/Inf is not applied: TrainingDiverged names the
    step and the shards of its batch.

    Resume or fresh start: Snakemake cannot tell the job whether it was forced, so the state
    folder says what the last run of this job did. Every checkpoint carries the job key
    (`state.job_key`: hyper-parameters, each input's path, size and mtime, target fingerprint,
    world size, and the code: specbuild's version, a digest of its sources, torch's version).
    The last thing a finished run does is mark `latest.json` complete. So:

        state of this job, not complete   an interrupted run (killed, preempted): resume it
        state of this job, complete       a finished job run again: `--forcerun train`, or its
                                          outputs deleted: clear the folder, train from step 0
        state of another key              other inputs, hyper-parameters or code: clear, step 0
        no state                          step 0

    A kill between the outputs and the completion mark leaves the run resumable: it resumes
    at its last step and writes the outputs again.
    """
    cfg = config
    if cfg.nproc > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return _launch_torchrun(
            dict(
                shards=[str(s) for s in shards],
                eval_shards=[str(s) for s in eval_shards or []],
                vocab=str(vocab),
                config=asdict(cfg),
                target_fingerprint=str(target_fingerprint),
                best_out=str(best_out),
                metrics_out=str(metrics_out),
                state_dir=str(state_dir),
                log_path=log_path,
                threads=threads,
                tensorboard_dir=tensorboard_dir,
                bench_out=bench_out,
                profile_out=profile_out,
            ),
            nproc=cfg.nproc,
        )
    rank, world, device = _setup(cfg)
    if rank == 0:  # append: the job's script (or torchrun's launcher) started this log
        setup_logging(log_path, append=True)
    if threads:
        torch.set_num_threads(threads)
    shards = [str(s) for s in shards]
    held_out = [str(s) for s in eval_shards or []]
    info = read_target_info(target_fingerprint)
    verify_for_training(
        shards + held_out,
        hidden_size=info.hidden_size,
        rank=rank,
        world_size=world,
        workers=torch.get_num_threads(),
    )
    data = ShardSet(
        shards + held_out, hidden_size=info.hidden_size, target_fingerprint=info.fingerprint
    )
    model, teacher = _build(cfg, Path(target_fingerprint).parent, vocab, info.vocab_size)
    if rank == 0:  # before the first step: a checkpoint that fills the disk loses the steps
        ensure_free_space(
            Path(state_dir) / "latest.json",
            train_need(
                parameters=sum(p.numel() for p in model.parameters()),
                trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
            ),
            "training checkpoints and the best drafter",
        )
    amp = _autocast(cfg, device)
    teacher.to(device, torch.bfloat16 if amp else torch.float32)
    model.to(device)
    if device.type == "cpu" and not amp:  # MKL's generic path on AMD: 1.15x a step (BENCHMARKS)
        use_onednn_training_linears(model)
    if held_out:  # train.eval_set: its shards follow the training shards in `data`
        train_idx, eval_idx = split_held_out_shards(
            [r.shard for r in data.refs], set(range(len(shards), len(data.paths))), cfg.eval_set
        )
    else:
        train_idx, eval_idx = split_samples([data.key(r) for r in data.refs], cfg.eval_fraction)
    train_refs, eval_refs = [data.refs[i] for i in train_idx], [data.refs[i] for i in eval_idx]
    lengths = [r.length for r in train_refs]
    plans = [
        plan_batches(
            lengths,
            token_budget=cfg.token_budget,
            max_length=cfg.max_length,
            seed=cfg.seed,
            epoch=e,
            rank=rank,
            world_size=world,
            group_by_length=cfg.group_by_length,
        )
        for e in range(cfg.epochs)
    ]
    total = sum(len(p) for p in plans)
    if total == 0:
        raise ValueError(f"{len(train_refs)} training samples make no batch for {world} rank(s)")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        weight_decay=cfg.weight_decay,
        # one kernel for all parameters instead of a few per tensor list; same update rule,
        # same state keys (the checkpoint format does not change); CPU keeps the default
        fused=True if device.type == "cuda" else None,
    )
    job = _job_key(cfg, shards + held_out, vocab, info.fingerprint, world)
    state = TrainState()
    status = resume_status(state_dir, job=job)
    loaded = load_checkpoint(state_dir, job=job) if status == "resumable" else None
    if status in _NOT_RESUMED:
        log.info("starting fresh: %s holds %s", state_dir, _NOT_RESUMED[status])
    if loaded is not None:
        state, weights, opt_state = loaded
        missing, extra = model.load_state_dict(weights, strict=False)
        if missing != ["embed_tokens.weight"] or extra:
            raise ValueError(f"{state_dir}: checkpoint keys differ ({missing=}, {extra=})")
        optimizer.load_state_dict(opt_state)
        log.info("resuming at step %d (epoch %d, batch %d)", state.step, state.epoch, state.batch)
    else:
        if cfg.init_from:
            log.info("warm start from %s: %s", cfg.init_from, warm_start(model, cfg.init_from))
        elif cfg.init == "target_last_layer":
            copied = init_from_target_layer(model, Path(target_fingerprint).parent)
            log.info("init from the target's last decoder layer:\n  %s", "\n  ".join(copied))
        if rank == 0:
            clear_state(state_dir)
    if world > 1:
        dist.barrier()
    attention, loss_path = _attention(cfg, device), _loss(cfg, device)
    objective = _objective(cfg, model, teacher, amp=amp, attention=attention, loss=loss_path)
    step_fn = objective
    if world > 1:
        # gradients live in DDP's all-reduce buckets: no copy in and out of them each step
        step_fn = nn.parallel.DistributedDataParallel(objective, gradient_as_bucket_view=True)
    meta = {
        "drafter_config": model.config.to_dict(),
        "layer_ids": data.layer_ids,
        "eagle_layer_ids": data.eagle_layer_ids,
        "target_fingerprint": info.fingerprint,
        "target_config": read_json(Path(target_fingerprint).parent / "config.json"),
    }
    log.info(
        "drafter %.1fM trainable params; %d train / %d eval samples%s (%d skipped); %d steps "
        "of <= %d tokens x %d rank(s) on %s; %s attention; %s loss; %s",
        sum(p.numel() for p in params) / 1e6,
        len(train_refs),
        len(eval_refs),
        f" of eval set {cfg.eval_set!r}" if held_out else "",
        data.skipped,
        total,
        cfg.token_budget,
        world,
        device,
        attention,
        loss_path,
        "bf16 autocast" if amp else "float32",
    )
    curves = Curves(tensorboard_dir if rank == 0 else None, start_step=state.step)
    name = device_name(device)
    speed = Throughput(name, world, peak_tflops(name))
    profiler = None
    if profile_out and rank == 0:
        profiler = StepProfiler(profile_out, objective, device, total_steps=total - state.step)
    order = [
        (e, b)
        for e in range(state.epoch, cfg.epochs)
        for b in range(state.batch if e == state.epoch else 0, len(plans[e]))
    ]
    batches = _batches_ahead(
        lambda e, b: data.batch(
            [train_refs[i] for i in plans[e][b]], cfg.max_length, pin_memory=device.type == "cuda"
        ),
        order,
    )
    # tokens/s over the steps since the last progress line (eval and checkpoint time excluded)
    clock, window, window_flops, first, losses = time.perf_counter(), 0, 0, state.step + 1, []
    graphs = fused_attention.compiled_graphs()  # torch.compile graphs when the window opened
    for epoch, b in order:
        plan = plans[epoch]
        if profiler:
            profiler.begin()
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
            _check_finite(
                loss,
                grad_norm,
                world,
                f"step {state.step + 1} (epoch {epoch}, batch {b})",
                sorted({str(data.paths[r.shard]) for r in batch.refs}),
            )
            optimizer.step()
        if profiler:
            profiler.end()
        state.step, state.epoch, state.batch = state.step + 1, epoch, b + 1
        window += batch.num_tokens
        window_flops += sum(step_flops(model.config, objective.work).values())
        losses.append(loss.detach())  # no .item() here: the host runs on to the next batch
        end_of_epoch = b + 1 == len(plan)
        eval_due = end_of_epoch or (cfg.eval_interval and state.step % cfg.eval_interval == 0)
        save_due = state.step % cfg.save_interval == 0 or state.step == total
        if eval_due or save_due or state.step % cfg.log_interval == 0:
            if device.type == "cuda":  # the window's queued work belongs to its time
                torch.cuda.synchronize(device)
            tokens, flops = _sum_ranks([window, window_flops], device, world)
            elapsed = time.perf_counter() - clock
            state.tokens += tokens
            compiled = fused_attention.compiled_graphs() - graphs
            speed.windows.append(Window(epoch, first, state.step, tokens, flops, elapsed, compiled))
            rates = speed.rates(speed.windows[-1:])
            progress = {
                "loss": sum(torch.stack(losses).tolist()) / len(losses),  # = the .item() sum
                "lr": lr_at(state.step - 1, total, cfg),
                "tokens_per_s": rates["tokens_per_s"],
            }
            log.info(
                "step %d/%d epoch %d loss %.4f lr %.2e %.0f tokens/s %.2f TFLOP/s MFU %s",
                state.step,
                total,
                epoch,
                *progress.values(),
                rates["tflops_per_s"],
                format_mfu(rates["mfu"]),
            )
            if compiled:  # the first window compiles; a later one should not (see the bench)
                log.info(
                    "%d torch.compile graph(s) compiled in steps %d-%d", compiled, first, state.step
                )
            curves.train(state.step, **progress)
            window, window_flops, first, losses = 0, 0, state.step + 1, []
        if eval_due:
            row = {
                "step": state.step,
                "epoch": epoch,
                "tokens": state.tokens,
                # training speed of this run so far (a timing: compare variants, not runs)
                "tokens_per_s": speed.rates(speed.windows)["tokens_per_s"]
                if speed.windows
                else None,
                **evaluate(
                    objective,
                    data,
                    eval_refs,
                    token_budget=cfg.token_budget,
                    max_length=cfg.max_length,
                    rank=rank,
                    world_size=world,
                    device=device,
                ),
            }
            state.metrics.append(row)
            curves.eval(state.step, row)
            best = row["acceptance_length"] > state.best
            log.info(
                "eval step %d: acc %s accept_len %.3f%s",
                state.step,
                row["acc"],
                row["acceptance_length"],
                " (best)" if best else "",
            )
            if rank == 0:
                if best:
                    save_drafter(
                        Path(state_dir) / "best.safetensors",
                        model.export_state(),
                        meta | {"step": state.step, "metrics": row},
                    )
                write_jsonl(Path(state_dir) / "metrics.jsonl", state.metrics)
            state.best = max(state.best, row["acceptance_length"])
        if end_of_epoch:
            state.epoch, state.batch = epoch + 1, 0
        if rank == 0 and save_due:
            save_checkpoint(
                state_dir, job=job, state=state, model=model.export_state(), optimizer=optimizer
            )
        if world > 1:
            dist.barrier()
        if stop_after is not None and state.step >= stop_after:
            raise TrainingInterrupted(f"stopped after step {state.step}")
        if window == 0:  # a progress line was just written: restart its clock
            clock, graphs = time.perf_counter(), fused_attention.compiled_graphs()
    curves.close()
    if profiler:
        profiler.close()  # a run shorter than the profile window
    done = speed.rates()
    log.info(
        "trained %d tokens in %.1f s of steps: %.0f tokens/s, %.2f TFLOP/s, MFU %s on %s "
        "(%d rank(s))",
        done["tokens"],
        done["seconds"],
        done["tokens_per_s"],
        done["tflops_per_s"],
        format_mfu(done["mfu"]),
        name,
        world,
    )
    if bench_out and rank == 0:
        result = speed.result(
            drafter=model.config.to_dict(),
            ttt_steps=cfg.ttt_steps,
            max_length=cfg.max_length,
            token_budget=cfg.token_budget,
            torch=torch.__version__,
            attention=attention,
            loss=loss_path,
        )
        write_json(bench_out, result)
        log.info("bench -> %s; BENCHMARKS.md row (steady, first window left out):", bench_out)
        log.info("%s", benchmarks_row(result))
    best_row = max(state.metrics, key=lambda r: r["acceptance_length"])
    if rank == 0:
        with atomic_path(best_out) as tmp:
            tmp.write_bytes((Path(state_dir) / "best.safetensors").read_bytes())
        write_jsonl(metrics_out, state.metrics)
        mark_complete(state_dir, job=job)  # last: a kill before it leaves the run resumable
        log.info(
            "best: step %d accept_len %.3f -> %s",
            best_row["step"],
            best_row["acceptance_length"],
            best_out,
        )
    if world > 1:
        dist.barrier()
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
    model, teacher = _build(cfg, Path(target_fingerprint).parent, vocab, info.vocab_size)
    warm_start(model, drafter)
    _, eval_idx = split_samples([data.key(r) for r in data.refs], cfg.eval_fraction)
    objective = _objective(
        cfg, model, teacher, amp=False, attention=_attention(cfg, torch.device("cpu"))
    )
    refs = [data.refs[i] for i in eval_idx]
    return evaluate(objective, data, refs, token_budget=cfg.token_budget, max_length=cfg.max_length)


def _launch_torchrun(spec: dict, nproc: int) -> dict:
    """Run this same job as `torchrun --nproc_per_node N` workers (DDP); wait for them."""
    spec_path = Path(spec["state_dir"]).parent / f".{Path(spec['state_dir']).name}.launch.json"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps(spec, indent=2))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "specbuild.drafter.train",
        str(spec_path),
    ]
    log.info("launching %s", " ".join(cmd))
    subprocess.run(cmd, check=True)
    rows = [json.loads(line) for line in open(spec["metrics_out"], encoding="utf-8")]
    return max(rows, key=lambda r: r["acceptance_length"])


def main(argv: list[str] | None = None) -> None:
    """`python -m specbuild.drafter.train spec.json` (also each torchrun worker)."""
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    spec["config"] = TrainConfig.from_params(spec["config"])
    train_drafter(**spec)


if __name__ == "__main__":
    main()
