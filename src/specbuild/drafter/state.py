"""Resumable training state on disk: safetensors for tensors, JSON for the rest, no pickle.

Layout of the state directory:

    latest.json              {"checkpoint": "step-00000120", "job": <job key>,
                              "complete": true once the run finished,
                              "orphan": true when its snakemake had ended by then}  (written last)
    step-00000120/           model.safetensors, optimizer.safetensors (+ RNG), state.json
    best.safetensors         best drafter so far (weights + config in the metadata)
    metrics.jsonl            eval rows so far

A checkpoint directory is filled under a temporary name and renamed into place, then
latest.json is replaced atomically, so a kill at any moment leaves the previous checkpoint
intact. The LR schedule is a pure function of the step and each epoch's batch plan of
(seed, epoch), so step + (epoch, batch) are their whole state.

Which state is resumed (`resume_status`, `resume`): only an interrupted run of the same job. The job
key (`job_key`) covers the hyper-parameters, each input's path, size and mtime, the target
fingerprint, the world size, and the code (specbuild's version and a digest of its sources,
torch's version); a finished run marks latest.json complete, so running a finished job again
(`--forcerun train`, or its outputs deleted) trains from scratch. Unless that run finished as
an orphan (its snakemake killed while it trained): no run recorded its outputs, so the next
run reruns the job (`--rerun-incomplete`); it resumes at the finished run's last checkpoint
and writes the same outputs again, no step retrained (`resume_status` "orphan").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from specbuild.infra.disk import ensure_free_space, train_need
from specbuild.infra.io import atomic_path, read_json, write_json, write_jsonl
from specbuild.infra.run_lock import run_ended
from specbuild.infra.safetensors_file import save_tensors

if TYPE_CHECKING:  # annotations only
    from specbuild.drafter.data import ShardSet
    from specbuild.drafter.model import Eagle3Drafter

__all__ = [
    "TrainState",
    "source_digest",
    "job_key",
    "resume_status",
    "resume",
    "save_checkpoint",
    "mark_complete",
    "load_checkpoint",
    "clear_state",
    "save_drafter",
    "read_drafter",
    "drafter_meta",
    "ensure_state_space",
    "write_outputs",
]

log = logging.getLogger("specbuild")

LATEST = "latest.json"
BEST = "best.safetensors"
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # src/specbuild


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done
    epoch: int = 0  # epoch of the next batch
    batch: int = 0  # index of the next batch inside that epoch's plan
    tokens: int = 0  # training tokens seen (all ranks)
    best: float = -1.0  # best simulated acceptance length so far
    metrics: list[dict] = field(default_factory=list)  # eval rows so far

    def best_row(self) -> dict:
        """The eval row of the highest acceptance length (the first of equals)."""
        return max(self.metrics, key=lambda r: r["acceptance_length"])


@cache
def source_digest(root: str | os.PathLike = PACKAGE_DIR) -> str:
    """sha256 of every .py file under `root` (relative path and bytes), in path order.

    The whole package, not the drafter modules alone: data loading, the shard readers and fp8
    dequantization shape what a step computes as much as the model does.
    """
    root = Path(root)
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def job_key(
    *, config: dict, inputs: list[str], fingerprint: str, world_size: int, code: str
) -> str:
    """The identity of one training job: state is resumed only under the same key.

    `inputs` by path, size and mtime (a re-extracted shard is another input); `code`: specbuild
    version + source digest + torch version (another trainer must not continue this one's run).
    """
    files = [(str(p), os.path.getsize(p), os.stat(p).st_mtime_ns) for p in inputs]
    blob = json.dumps([config, files, fingerprint, world_size, code], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def resume_status(state_dir: str | os.PathLike, *, job: str) -> str:
    """What `state_dir` holds for this job: "none", "other-job" (other inputs, hyper-parameters
    or code), "complete" (a finished run of this job), "orphan" (one that finished after its
    snakemake ended, its outputs never recorded) or "resumable" (an interrupted one)."""
    latest = Path(state_dir) / LATEST
    if not latest.exists():
        return "none"
    entry = read_json(latest)
    if entry.get("job") != job:
        return "other-job"
    if entry.get("complete"):
        return "orphan" if entry.get("orphan") else "complete"
    return "resumable"


def _optimizer_flat(opt: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict]:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for idx, entry in sd["state"].items():
        for key, value in entry.items():
            if isinstance(value, Tensor):
                tensors[f"state.{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{idx}.{key}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _optimizer_unflat(tensors: dict[str, Tensor], meta: dict) -> dict:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        if name.startswith("state."):
            _, idx, key = name.split(".", 2)
            state.setdefault(int(idx), {})[key] = value
    for name, value in meta["scalars"].items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else g for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def _rng_tensors() -> dict[str, Tensor]:
    rng = {"rng.cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["rng.cuda"] = torch.cuda.get_rng_state()
    return rng


def save_checkpoint(
    state_dir: str | os.PathLike,
    *,
    job: str,
    state: TrainState,
    model: dict[str, Tensor],
    optimizer: torch.optim.Optimizer,
    keep: int = 1,
) -> Path:
    """Write one checkpoint atomically and point latest.json at it; keep the newest `keep`.

    One is enough: a checkpoint gets its name only once whole and latest.json moves after it,
    so a kill never leaves the latest unreadable, and resuming never reads an older one. An
    older one kept would cost a drafter's weights and moments again (12 GB at Kimi's width)."""
    state_dir = Path(state_dir)
    name = f"step-{state.step:08d}"
    final, tmp = state_dir / name, state_dir / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with atomic_path(tmp / "model.safetensors") as path:
        save_tensors({k: v.detach().cpu().contiguous() for k, v in model.items()}, path)
    opt_tensors, opt_meta = _optimizer_flat(optimizer)
    with atomic_path(tmp / "optimizer.safetensors") as path:
        save_tensors(opt_tensors | _rng_tensors(), path)
    write_json(tmp / "state.json", {"state": asdict(state), "optimizer": opt_meta, "job": job})
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    write_json(state_dir / LATEST, {"checkpoint": name, "job": job})
    old = sorted(p for p in state_dir.glob("step-*") if p.is_dir() and p.name != name)
    for p in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return final


def mark_complete(state_dir: str | os.PathLike, *, job: str, orphan: bool = False) -> None:
    """Record that this job's run finished: its state is never resumed again, unless it
    finished as an `orphan` (its snakemake ended first: no run recorded its outputs)."""
    latest = read_json(Path(state_dir) / LATEST)
    if latest.get("job") != job:
        raise ValueError(f"{state_dir}: {LATEST} belongs to another job; not marking it complete")
    write_json(Path(state_dir) / LATEST, latest | {"complete": True, "orphan": orphan})


def load_checkpoint(
    state_dir: str | os.PathLike, *, job: str
) -> tuple[TrainState, dict[str, Tensor], dict] | None:
    """(state, model tensors, optimizer state_dict) of this job's interrupted run.

    Restores the RNG state as a side effect. None unless `resume_status` is "resumable" or
    "orphan".
    """
    state_dir = Path(state_dir)
    if resume_status(state_dir, job=job) not in ("resumable", "orphan"):
        return None
    latest = read_json(state_dir / LATEST)
    ckpt = state_dir / latest["checkpoint"]
    meta = json.loads((ckpt / "state.json").read_text())
    tensors = load_file(str(ckpt / "optimizer.safetensors"))
    torch.set_rng_state(tensors["rng.cpu"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"])
    model = load_file(str(ckpt / "model.safetensors"))
    return TrainState(**meta["state"]), model, _optimizer_unflat(tensors, meta["optimizer"])


_NOT_RESUMED = {
    "complete": "a finished run of this job (a forced rerun trains from scratch)",
    "other-job": "the state of other inputs, hyper-parameters or code",
}


def resume(
    state_dir: str | os.PathLike, *, job: str, model: nn.Module, optimizer: torch.optim.Optimizer
) -> TrainState | None:
    """The state of an interrupted run of `job`, its weights and optimizer state loaded into
    `model` (all but the frozen `embed_tokens`) and `optimizer`; None, and the reason logged,
    where the run starts fresh."""
    status = resume_status(state_dir, job=job)
    if status in _NOT_RESUMED:
        log.info("starting fresh: %s holds %s", state_dir, _NOT_RESUMED[status])
    if status == "orphan":
        log.info(
            "%s holds a run of this job that finished after its snakemake ended (killed), so "
            "no run recorded its outputs: they are written again from its last checkpoint",
            state_dir,
        )
    loaded = load_checkpoint(state_dir, job=job) if status in ("resumable", "orphan") else None
    if loaded is None:
        return None
    state, weights, opt_state = loaded
    missing, extra = model.load_state_dict(weights, strict=False)
    if missing != ["embed_tokens.weight"] or extra:
        raise ValueError(f"{state_dir}: checkpoint keys differ ({missing=}, {extra=})")
    optimizer.load_state_dict(opt_state)
    log.info("resuming at step %d (epoch %d, batch %d)", state.step, state.epoch, state.batch)
    return state


def clear_state(state_dir: str | os.PathLike) -> None:
    """Forget state of another job (its checkpoints, best and metrics). A state folder that is
    a link (to a larger disk) stays one: what is in the folder it points to goes, through the
    link; a link in it goes as a link, never what it points to."""
    state_dir = Path(state_dir)
    if not state_dir.is_symlink():
        if state_dir.exists():
            shutil.rmtree(state_dir)
        state_dir.mkdir(parents=True)
        return
    if not state_dir.is_dir():  # creating it would write beside a disk that is not there
        raise FileNotFoundError(
            f"{state_dir} is a link to {os.readlink(state_dir)}, which is no folder (a disk not "
            f"mounted?): mount it, or remove the link and rerun to keep the state in place"
        )
    for entry in state_dir.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def save_drafter(path: str | os.PathLike, tensors: dict[str, Tensor], meta: dict) -> None:
    """A trained drafter (export_state tensors) with JSON-able facts in the metadata."""
    with atomic_path(path) as tmp:
        tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        save_tensors(tensors, tmp, metadata={k: json.dumps(v) for k, v in meta.items()})


def read_drafter(path: str | os.PathLike) -> tuple[dict[str, Tensor], dict]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = {k: json.loads(v) for k, v in (f.metadata() or {}).items()}
        return {k: f.get_tensor(k) for k in f.keys()}, meta  # noqa: SIM118


def drafter_meta(model: Eagle3Drafter, data: ShardSet, fingerprint: str, target_dir: Path) -> dict:
    """What a saved drafter carries besides its weights (stage export reads it)."""
    return {
        "drafter_config": model.config.to_dict(),
        "layer_ids": data.layer_ids,
        "eagle_layer_ids": data.eagle_layer_ids,
        "target_fingerprint": fingerprint,
        "target_config": read_json(target_dir / "config.json"),
    }


def ensure_state_space(model: Eagle3Drafter, state_dir: str | os.PathLike) -> None:
    """Fail before the first step when `state_dir`'s disk cannot hold the checkpoints and the
    best drafter: a checkpoint that fills the disk loses the steps since the last one."""
    need = train_need(
        parameters=sum(t.numel() for t in model.export_state().values()),  # what is saved
        trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
    )
    ensure_free_space(Path(state_dir) / LATEST, need, "training checkpoints and the best drafter")


def write_outputs(
    state_dir: str | os.PathLike,
    state: TrainState,
    *,
    job: str,
    best_out: str | os.PathLike,
    metrics_out: str | os.PathLike,
) -> None:
    """A finished run's outputs: the best drafter to `best_out`, the eval rows to `metrics_out`;
    then the job marked complete, last, so that a kill before the mark leaves the run resumable
    (it writes the outputs again); marked an orphan when the run that started it has ended."""
    with atomic_path(best_out) as tmp:
        tmp.write_bytes((Path(state_dir) / BEST).read_bytes())
    write_jsonl(metrics_out, state.metrics)
    mark_complete(state_dir, job=job, orphan=run_ended())
    best = state.best_row()
    log.info(
        "best: step %d accept_len %.3f -> %s", best["step"], best["acceptance_length"], best_out
    )
